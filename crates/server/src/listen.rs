//! Connections, as a server left running must treat them: headers within a time, bodies within
//! a time (in [`routes`](crate::routes)), idle keep-alive connections closed, at most so many
//! open at once, and an orderly end on SIGINT, SIGTERM or SIGHUP: no new requests (503), the
//! answers under way run on for a bounded drain and then end with their finish chunk and `[DONE]`.
//!
//! At the cap, a new connection takes the place of the oldest one that holds no request (still
//! sending its headers, or idle between requests): a slowloris client trickling headers on many
//! sockets cannot turn others away. Only when every connection carries a request is the new one
//! answered 503 and closed.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::status::Status;

/// How long connections may take and how many there may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request's headers must arrive within this (also how long an idle keep-alive connection
    /// is kept).
    pub header_timeout: Duration,
    /// A request's body must arrive within this.
    pub body_timeout: Duration,
    /// Open connections at most: at the cap, a new one takes the place of the oldest holding no
    /// request (still sending its headers, or idle); only when all hold one is it answered 503.
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

/// A connection's share of the registry: how many of its requests are under way (from their
/// headers' arrival until their response's body is done), and the signal that closes it.
#[derive(Default)]
struct Conn {
    requests: AtomicUsize,
    evict: tokio::sync::Notify,
}

/// The open connections, by accept order (the oldest first).
#[derive(Default)]
struct Conns {
    open: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next: AtomicU64,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// A place for a new connection: free under `cap`, else the oldest connection holding no
    /// request is told to close and its place taken; `None` when every one holds a request.
    fn admit(self: &Arc<Self>, cap: usize) -> Option<Registered> {
        let mut open = self.lock();
        if open.len() >= cap {
            let idle = open.iter().find(|(_, c)| c.requests.load(Ordering::SeqCst) == 0).map(|(id, _)| *id)?;
            if let Some(c) = open.remove(&idle) {
                c.evict.notify_one();
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let conn = Arc::new(Conn::default());
        open.insert(id, conn.clone());
        Some(Registered { conns: self.clone(), id, conn })
    }
}

/// A connection in the registry, taken out when its task ends.
struct Registered {
    conns: Arc<Conns>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

/// A request under way on its connection (counted until dropped with its response's body).
struct UnderWay(Arc<Conn>);

impl UnderWay {
    fn start(conn: &Arc<Conn>) -> Self {
        conn.requests.fetch_add(1, Ordering::SeqCst);
        UnderWay(conn.clone())
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one accepted connection until it ends, or until it is evicted to make room.
fn connection(
    http: &hyper::server::conn::http1::Builder,
    graceful: &GracefulShutdown,
    stream: TcpStream,
    router: &Router,
    place: Registered,
) -> impl Future<Output = ()> + Send + 'static {
    let inner = TowerToHyperService::new(router.clone());
    let conn = place.conn.clone();
    // hyper calls the service once a request's headers are complete: from then until the
    // response's body is done (or dropped) the connection holds a request and is not evicted.
    let service = hyper::service::service_fn(move |req| {
        let under_way = UnderWay::start(&conn);
        let answer = hyper::service::Service::call(&inner, req);
        async move {
            let response = answer.await?;
            Ok::<_, Infallible>(response.map(|body| {
                body.map_frame(move |frame| {
                    let _held = &under_way;
                    frame
                })
            }))
        }
    });
    let served = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
    async move {
        tokio::select! {
            _ = served => {}
            () = place.conn.evict.notified() => {}
        }
        drop(place);
    }
}

/// Serves `router` on `listener` until a stop signal (then drains, see the module comment) or
/// until the model fails to load (an error naming why).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    status: Arc<Status>,
    limits: Limits,
) -> Result<(), ServeError> {
    let mut stop = Stop::new().map_err(ServeError::Signals)?;
    let graceful = GracefulShutdown::new();
    let conns = Arc::new(Conns::default());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).max_headers(128);
    let failed = status.clone();
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
                match conns.admit(limits.max_connections.max(1)) {
                    Some(place) => {
                        tokio::spawn(connection(&http, &graceful, stream, &router, place));
                    }
                    None => {
                        tokio::spawn(refuse(stream));
                    }
                }
            }
            () = stop.next() => break,
            why = model_failed(&failed) => return Err(ServeError::ModelFailed(why)),
        }
    }
    drop(listener);
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
                while conns.len() > 0 {
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
async fn model_failed(status: &Status) -> String {
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
