//! Models by name: a server that offers several models (the CLI's model store) and keeps one
//! resident at a time, as Ollama does with one model in memory. A request names its model (the
//! `model` field, `name` for `/api/show`); one for the resident model goes straight to its
//! routes ([`crate::app`]'s, without the boundary, which this router checks once); one for another
//! model waits in a queue while the resident model's answers under way finish, its scheduler
//! ends (its prompt cache written out), and the asked model loads, then goes on to that model's
//! routes. Requests that name no model go to the resident one.
//!
//! `/v1/models` and `/api/tags` list every model offered, loaded or not; `/api/ps` the one that
//! is loaded (and, as `loading`, one being loaded).

mod switch;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::ServerOptions;
use crate::error::{ApiError, Shape};
use crate::status::Status;
pub use switch::Board;

/// One model offered by name.
#[derive(Debug, Clone)]
pub struct Offer {
    /// The name clients send (`NAME:latest` finds `NAME`).
    pub id: String,
    pub path: PathBuf,
}

/// The catalog's state, shared by its handlers.
#[derive(Debug, Clone)]
pub struct Catalog {
    board: Arc<Board>,
    body_limit: usize,
    body_timeout: std::time::Duration,
    created: u64,
}

/// The router offering `offers`, with `first` loading at once if given (the rest load when asked
/// for), the status the listener stops by, and the board [`serve`] needs.
pub fn app(opts: ServerOptions, offers: Vec<Offer>, first: Option<usize>) -> (Router, Arc<Status>, Arc<Board>) {
    let boundary = Arc::new(opts.boundary.clone());
    let (body_limit, body_timeout) = (opts.body_limit, opts.limits.body_timeout);
    let board = Board::new(opts, offers, first);
    let status = board.status();
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let c = Catalog { board: board.clone(), body_limit, body_timeout, created };
    let router = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/api/tags", get(tags))
        .route("/api/ps", get(ps))
        .route("/health", get(health))
        .route("/api/version", get(crate::ollama::version))
        .merge(crate::page::routes())
        .fallback(forward)
        .method_not_allowed_fallback(crate::routes::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(boundary, crate::boundary::check))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(c);
    (router, status, board)
}

/// The paths whose JSON body names the model that answers.
fn names_a_model(method: &Method, path: &str) -> bool {
    method == Method::POST
        && matches!(
            path,
            "/v1/chat/completions"
                | "/v1/completions"
                | "/v1/responses"
                | "/v1/messages"
                | "/v1/messages/count_tokens"
                | "/api/chat"
                | "/api/generate"
                | "/api/show"
        )
}

/// What the catalog reads of a body, in one pass that keeps nothing else (the model's routes
/// parse the body): the model it names (`model`, or Ollama's older `name`) and whether it is
/// Ollama's unload (`ollama stop`: `keep_alive` 0 with no prompt on `/api/generate`, or no
/// messages on `/api/chat`). A body that is not JSON asks for nothing: the model's routes answer
/// it with the usual 400.
#[derive(Debug, Default, PartialEq)]
struct Asked {
    model: Option<String>,
    unload: bool,
}

fn asked(path: &str, body: &[u8]) -> Asked {
    use serde::de::IgnoredAny;
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(default)]
        model: Option<Value>,
        #[serde(default)]
        name: Option<Value>,
        #[serde(default)]
        keep_alive: Option<Value>,
        #[serde(default)]
        prompt: Option<Value>,
    }
    // Ollama's chat with `keep_alive` 0 only: are its messages an empty list (or absent)?
    #[derive(serde::Deserialize)]
    struct Messages {
        #[serde(default)]
        messages: Option<Vec<IgnoredAny>>,
    }
    let Ok(n) = serde_json::from_slice::<Named>(body) else { return Asked::default() };
    let model = n.model.or(n.name).and_then(|m| m.as_str().filter(|s| !s.is_empty()).map(str::to_string));
    let zero = match &n.keep_alive {
        Some(Value::Number(k)) => k.as_f64() == Some(0.0),
        Some(Value::String(s)) => matches!(s.as_str(), "0" | "0s" | "0m" | "0h"),
        _ => false,
    };
    let unload = zero
        && match path {
            "/api/generate" => n.prompt.as_ref().is_none_or(|p| p.is_null() || p.as_str() == Some("")),
            "/api/chat" => {
                serde_json::from_slice::<Messages>(body).is_ok_and(|m| m.messages.is_none_or(|m| m.is_empty()))
            }
            _ => false,
        };
    Asked { model, unload }
}

/// A request's body: read (to find the model it names) or not.
enum Taken {
    Bytes(axum::body::Bytes),
    Stream(Body),
}

impl Taken {
    fn into_body(self) -> Body {
        match self {
            Taken::Bytes(b) => Body::from(b),
            Taken::Stream(b) => b,
        }
    }
}

/// `/api/show` from the model's files (or the loaded model's shape), in Ollama's shape.
async fn show(c: &Catalog, name: &str, body: &[u8]) -> Response {
    let checked = serde_json::from_slice::<Value>(body)
        .map_err(|e| ApiError::bad("body", format!("the request body is not a valid request: {e}")))
        .and_then(|v| crate::ollama::request::show(&v));
    if let Err(e) = checked {
        return e.shaped(Shape::Ollama);
    }
    let Some(i) = c.board.find(name, true) else { return c.board.unknown(name).shaped(Shape::Ollama) };
    let board = c.board.clone();
    match tokio::task::spawn_blocking(move || board.info(i)).await {
        Ok(Some(info)) => Json(crate::ollama::show_body(&info)).into_response(),
        _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the model '{name}' cannot be read"))
            .shaped(Shape::Ollama),
    }
}

/// Unloads the model `name` if it is the resident one, and answers as Ollama does.
async fn unload(c: &Catalog, name: &str, path: &str) -> Response {
    let Some(i) = c.board.find(name, true) else { return c.board.unknown(name).shaped(Shape::Ollama) };
    let id = c.board.offers()[i].id.clone();
    c.board.unload(&id).await;
    let now = crate::ollama::now_rfc3339();
    let mut v = json!({"model": name, "created_at": now, "done": true, "done_reason": "unload"});
    if path == "/api/chat" {
        v["message"] = json!({"role": "assistant", "content": ""});
    } else {
        v["response"] = json!("");
    }
    Json(v).into_response()
}

/// Every other route: to the model the request names (loaded first if need be), or to the
/// resident one.
async fn forward(State(c): State<Catalog>, req: Request) -> Response {
    let shape = Shape::of_path(req.uri().path());
    let (parts, body) = req.into_parts();
    let (name, body) = if names_a_model(&parts.method, parts.uri.path()) {
        let bytes =
            match crate::request::read_body(Request::from_parts(parts.clone(), body), c.body_limit, c.body_timeout)
                .await
            {
                Ok(b) => b,
                Err(e) => return e.shaped(shape),
            };
        (asked(parts.uri.path(), &bytes), Taken::Bytes(bytes))
    } else {
        (Asked::default(), Taken::Stream(body))
    };
    let Asked { model: name, unload: unloading } = name;
    if let (Some(n), Taken::Bytes(b)) = (&name, &body) {
        if unloading {
            return unload(&c, n, parts.uri.path()).await;
        }
        // A model's details are read from its files: asking for them loads nothing.
        if parts.uri.path() == "/api/show" {
            return show(&c, n, b).await;
        }
    }
    let body = body.into_body();
    let resident = match c.board.resident(name.as_deref(), shape == Shape::Ollama).await {
        Ok(r) => r,
        Err(e) => return e.shaped(shape),
    };
    match resident.router.clone().oneshot(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// The resident model's state: `(loaded, loading, failed)` ids, at most one of them set (a
/// failed one with its reason).
fn resident_state(c: &Catalog) -> (Option<String>, Option<String>, Option<Value>) {
    let Some(r) = c.board.loaded() else { return (None, None, None) };
    if let Some(why) = r.failure() {
        return (None, None, Some(json!({"model": r.id, "reason": why})));
    }
    match r.ready_info() {
        Some(i) => (Some(i.id), None, None),
        None => (None, Some(r.id.clone()), None),
    }
}

/// `GET /health`: the server is up (a request for any model offered is queued while it loads);
/// which model is loaded, loading, or failed to load.
async fn health(State(c): State<Catalog>) -> Json<Value> {
    let (loaded, loading, failed) = resident_state(&c);
    Json(json!({"status": "ok", "loaded": loaded, "loading": loading, "failed": failed}))
}

/// Serves the catalog's router as [`crate::listen::serve`] does; at a stop, waits (at most
/// [`crate::STOP_FLUSH`] and a little more) for the resident model's scheduler to end, its
/// prompt cache written out.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    status: Arc<Status>,
    board: Arc<Board>,
    limits: crate::Limits,
) -> Result<(), crate::ServeError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let signals = Arc::new(AtomicUsize::new(0));
    let counting = tokio::spawn(crate::count_signals(signals.clone()).map_err(crate::ServeError::Signals)?);
    let spreading = board.clone();
    let spread = tokio::spawn(async move { spreading.propagate().await });
    let served = crate::listen::serve(listener, router, status, limits).await;
    // A second stop signal during the wait means now, as it does for the drain.
    let again = async {
        while signals.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        stopped = board.stop(crate::STOP_FLUSH + std::time::Duration::from_secs(5)) => if !stopped {
            eprintln!("stopping: the prompt cache's states were not all written within {} s", crate::STOP_FLUSH.as_secs());
        },
        () = again => eprintln!("stopping now (another signal): the prompt cache's writes are cut short"),
    }
    counting.abort();
    spread.abort();
    served
}

/// `GET /v1/models`: every model offered (read from its files once, off the async workers);
/// the shape the model loaded with is only known for the resident one.
async fn models(State(c): State<Catalog>) -> Response {
    let board = c.board.clone();
    let created = c.created;
    match tokio::task::spawn_blocking(move || {
        (0..board.offers().len()).map(|i| board.model_object(i, created)).collect::<Vec<_>>()
    })
    .await
    {
        Ok(data) => Json(json!({"object": "list", "data": data})).into_response(),
        Err(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "listing the models failed").shaped(Shape::OpenAi),
    }
}

/// `GET /v1/models/{id}`.
async fn model(State(c): State<Catalog>, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    let Some(i) = c.board.find(&id, false) else { return c.board.unknown(&id).shaped(Shape::OpenAi) };
    let (board, created) = (c.board.clone(), c.created);
    match tokio::task::spawn_blocking(move || board.model_object(i, created)).await {
        Ok(v) => Json(v).into_response(),
        Err(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "describing the model failed").shaped(Shape::OpenAi),
    }
}

/// `GET /api/tags`: every model offered, described from its files (read once, off the async
/// workers: a model's header and tokenizer).
async fn tags(State(c): State<Catalog>) -> Response {
    let board = c.board.clone();
    match tokio::task::spawn_blocking(move || board.listings()).await {
        Ok(models) => Json(json!({"models": models})).into_response(),
        Err(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "listing the models failed").shaped(Shape::Ollama),
    }
}

/// `GET /api/ps`: the model loaded, if one is; one being loaded is named under `loading`, one
/// that failed to load under `failed` with the reason.
async fn ps(State(c): State<Catalog>) -> Response {
    let ready = c.board.loaded().and_then(|r| r.ready_info());
    let models: Vec<Value> = ready.iter().map(crate::ollama::ps_entry).collect();
    let (_, loading, failed) = resident_state(&c);
    Json(json!({"models": models, "loading": loading.into_iter().collect::<Vec<_>>(), "failed": failed}))
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_model_is_read_from_the_body() {
        let model = |b: &[u8]| super::asked("/v1/chat/completions", b).model;
        assert_eq!(model(br#"{"model": "k3", "messages": []}"#).as_deref(), Some("k3"));
        assert_eq!(model(br#"{"name": "k2:latest"}"#).as_deref(), Some("k2:latest"));
        assert_eq!(model(br#"{"model": ""}"#), None);
        assert_eq!(model(br#"{"model": 3}"#), None);
        assert_eq!(model(b"not json"), None);
    }

    #[test]
    fn an_unload_is_keep_alive_zero_with_nothing_to_answer() {
        let unload = |path: &str, b: &[u8]| super::asked(path, b).unload;
        assert!(unload("/api/generate", br#"{"model": "k3", "keep_alive": 0}"#));
        assert!(unload("/api/generate", br#"{"model": "k3", "keep_alive": "0s", "prompt": ""}"#));
        assert!(unload("/api/chat", br#"{"model": "k3", "keep_alive": 0, "messages": []}"#));
        assert!(!unload("/api/generate", br#"{"model": "k3", "keep_alive": 0, "prompt": "Hi"}"#));
        assert!(!unload("/api/chat", br#"{"model": "k3", "keep_alive": 0, "messages": [{"role": "user"}]}"#));
        assert!(!unload("/api/generate", br#"{"model": "k3", "keep_alive": "5m"}"#));
        assert!(!unload("/v1/chat/completions", br#"{"model": "k3", "keep_alive": 0}"#));
    }
}
