//! The HTTP side: handlers that read and check a request and hand it to [`answer`], which
//! submits it and turns the scheduler's events into the response.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k3_text::tokenizer::Tokenizer;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::answer::{self, Kind};
use crate::api::{ChatRequest, CompletionRequest, Prepared};
use crate::error::ApiError;
use crate::scheduler::ModelInfo;
use crate::state::AppState;
use k3_generate::cache::Scope;

/// `GET /health`: 503 while the model loads (or if it failed to), then 200.
pub async fn health(State(s): State<AppState>) -> Response {
    match s.ready() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

fn model_object(s: &AppState, i: &ModelInfo) -> Value {
    json!({
        "id": i.id, "object": "model", "created": s.created, "owned_by": "k3",
        "family": i.family.name(), "context_length": i.context, "vocab_size": i.vocab,
        "layers": i.layers, "hidden_size": i.hidden,
    })
}

/// `GET /v1/models`.
pub async fn models(State(s): State<AppState>) -> Result<Json<Value>, ApiError> {
    let (i, _) = s.ready()?;
    Ok(Json(json!({"object": "list", "data": [model_object(&s, i)]})))
}

/// `GET /v1/models/{id}`.
pub async fn model(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let (i, _) = s.ready()?;
    if id != i.id {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("the model `{id}` does not exist here")));
    }
    Ok(Json(model_object(&s, i)))
}

/// Any path this server does not serve: a 404 in OpenAI's shape, naming the routes it has.
pub async fn not_found(req: Request) -> Response {
    let ollama = crate::ollama::is_ollama(req.uri().path());
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {} {}: this server answers /v1/chat/completions, /v1/completions, /v1/models, \
             /tokenize, /detokenize, /health, /metrics, the chat page at /, and Ollama's /api/chat, /api/generate, \
             /api/tags, /api/show, /api/ps and /api/version",
            req.method(),
            req.uri().path()
        ),
    )
    .shaped(ollama)
}

/// A served path with the wrong method: a 405 in OpenAI's shape.
pub async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {} requests", req.uri().path(), req.method()),
    )
    .shaped(crate::ollama::is_ollama(req.uri().path()))
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(s): State<AppState>) -> Response {
    let cache = s.handle.status.cache.lock().ok().and_then(|c| *c);
    let body = s.metrics.render(&s.handle.status, cache);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// The body of `req`, read within the server's size and time limits: a declared length over the
/// limit is a 413 before anything is read, a body that does not arrive in time a 408.
pub(crate) async fn body(s: &AppState, req: Request) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than this server accepts ({} bytes)", s.body_limit),
        )
    };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.body_limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(s.body_timeout, axum::body::to_bytes(req.into_body(), s.body_limit)).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {} s", s.body_timeout.as_secs()),
        )),
        Ok(Err(e)) if is_length_limit(&e) => Err(too_large()),
        Ok(Err(e)) => Err(ApiError::new(StatusCode::BAD_REQUEST, format!("reading the request body: {e}"))),
        Ok(Ok(b)) => Ok(b),
    }
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// A JSON request body, with a 400 naming what is wrong.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad("body", format!("the request body is not a valid request: {e}")))
}

/// Reads, checks and tokenizes a request, and decodes its images within their budgets, on a
/// blocking thread (tokenizing a long prompt and decoding are CPU work that must not stall the
/// async workers serving everyone else).
pub(crate) async fn prepared<T, F>(s: &AppState, req: Request, prepare: F) -> Result<Prepared, ApiError>
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(T, &ModelInfo, Option<&Tokenizer>) -> Result<Prepared, ApiError> + Send + 'static,
{
    if s.handle.status.draining.load(Ordering::SeqCst) {
        return Err(draining());
    }
    let bytes = body(s, req).await?;
    prepared_bytes(s, bytes, prepare).await
}

fn draining() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down")
}

/// [`prepared`] for a body already read.
pub(crate) async fn prepared_bytes<T, F>(s: &AppState, bytes: Bytes, prepare: F) -> Result<Prepared, ApiError>
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(T, &ModelInfo, Option<&Tokenizer>) -> Result<Prepared, ApiError> + Send + 'static,
{
    if s.handle.status.draining.load(Ordering::SeqCst) {
        return Err(draining());
    }
    s.ready()?;
    let state = s.clone();
    tokio::task::spawn_blocking(move || {
        let r: T = parse(&bytes)?;
        let (info, tok) = state.ready()?;
        let mut p = prepare(r, info, tok)?;
        crate::api::images::admit(&mut p.images, &state.image_limits, &state.images_in_flight)?;
        Ok(p)
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "checking the request failed"))?
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(s): State<AppState>,
    Extension(scope): Extension<Scope>,
    req: Request,
) -> Result<Response, ApiError> {
    let stop_bytes = s.stop_bytes;
    let p = prepared(&s, req, move |r: ChatRequest, info, tok| {
        let tok = tok.ok_or_else(|| {
            ApiError::bad("messages", "this model embeds no tokenizer: send token ids to /v1/completions")
        })?;
        r.prepare(tok, info, stop_bytes)
    })
    .await?;
    answer::run(&s, p, Kind::Chat, scope).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(s): State<AppState>,
    Extension(scope): Extension<Scope>,
    req: Request,
) -> Result<Response, ApiError> {
    let stop_bytes = s.stop_bytes;
    let p = prepared(&s, req, move |r: CompletionRequest, info, tok| r.prepare(tok, info, stop_bytes)).await?;
    answer::run(&s, p, Kind::Completion, scope).await
}
