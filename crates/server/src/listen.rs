//! Connections, as a server left running must treat them: headers within a time, bodies within
//! a time (in [`routes`](crate::routes)), idle keep-alive connections closed, at most so many
//! open at once (the next one is answered 503 and closed), and an orderly end on SIGINT, SIGTERM
//! or SIGHUP: no new requests (503), the answers under way run on for a bounded drain and then
//! end with their finish chunk and `[DONE]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::state::AppState;

/// How long connections may take and how many there may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request's headers must arrive within this (also how long an idle keep-alive connection
    /// is kept).
    pub header_timeout: Duration,
    /// A request's body must arrive within this.
    pub body_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// How long answers under way may run on after a stop signal before they are ended.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            drain: Duration::from_secs(10),
        }
    }
}

/// Why serving ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    ModelFailed(String),
    #[error("waiting for signals: {0}")]
    Signals(std::io::Error),
}

/// Open connections, counted down when each one's task ends.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves `router` on `listener` until a stop signal (then drains, see the module comment) or
/// until the model fails to load (an error naming why).
pub async fn serve(listener: TcpListener, router: Router, state: AppState, limits: Limits) -> Result<(), ServeError> {
    let mut stop = Stop::new().map_err(ServeError::Signals)?;
    let graceful = GracefulShutdown::new();
    let open = Arc::new(AtomicUsize::new(0));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_headers(128);
    let failed = state.handle.status.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    // Out of file descriptors or a connection reset before accept: go on.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if open.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
                    open.fetch_sub(1, Ordering::SeqCst);
                    tokio::spawn(refuse(stream));
                    continue;
                }
                let guard = Open(open.clone());
                let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    let _guard = guard;
                    let _ = conn.await;
                });
            }
            () = stop.next() => break,
            why = model_failed(&failed) => return Err(ServeError::ModelFailed(why)),
        }
    }
    drop(listener);
    let status = &state.handle.status;
    status.draining.store(true, Ordering::SeqCst);
    eprintln!("stopping: no new requests; answers under way may run {} s more", limits.drain.as_secs());
    let drained = async {
        graceful.shutdown().await;
    };
    tokio::select! {
        () = drained => {}
        () = tokio::time::sleep(limits.drain) => {
            // Answers still running end now, each with its finish chunk and [DONE].
            status.cut.store(true, Ordering::SeqCst);
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                while open.load(Ordering::SeqCst) > 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
        }
        () = stop.next() => eprintln!("stopping now (a second signal)"),
    }
    Ok(())
}

/// Waits until the model's load has failed, with the reason.
async fn model_failed(status: &crate::status::Status) -> String {
    loop {
        if let Some(why) = status.failed.lock().ok().and_then(|f| f.clone()) {
            return why;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A 503 for a connection past the cap, written without reading the request.
async fn refuse(mut stream: TcpStream) {
    let body = r#"{"error":{"message":"the server has too many open connections, retry later","type":"unavailable_error","param":null,"code":503}}"#;
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// SIGINT, SIGTERM and SIGHUP, each a request to stop.
struct Stop {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Stop {
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
