//! The HTTP side: handlers that read and check a request and hand it to [`answer`], which
//! submits it and turns the scheduler's events into the response.

use axum::Json;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::answer::{self, Kind};
use crate::api::{ChatRequest, CompletionRequest};
use crate::error::ApiError;
use crate::job::ModelInfo;
use crate::request::prepared;
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
        // Whether image parts are read (the chat page offers image upload only then).
        "vision": i.sees,
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
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {} {}: this server answers /v1/chat/completions, /v1/completions, /v1/models, \
             Anthropic's /v1/messages and /v1/messages/count_tokens, OpenAI's /v1/responses (and \
             /v1/responses/ID), /tokenize, /detokenize, /health, /metrics, the chat page at /, and Ollama's \
             /api/chat, /api/generate, /api/tags, /api/show, /api/ps and /api/version",
            req.method(),
            req.uri().path()
        ),
    )
    .shaped(crate::error::Shape::of_path(req.uri().path()))
}

/// A served path with the wrong method: a 405 in OpenAI's shape.
pub async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {} requests", req.uri().path(), req.method()),
    )
    .shaped(crate::error::Shape::of_path(req.uri().path()))
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(s): State<AppState>) -> Response {
    let cache = s.handle.status.cache.lock().ok().and_then(|c| *c);
    let body = s.metrics.render(&s.handle.status, cache);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    State(s): State<AppState>,
    Extension(scope): Extension<Scope>,
    req: Request,
) -> Result<Response, ApiError> {
    let (stop_bytes, beginnings) = (s.stop_bytes, s.beginnings.clone());
    let p = prepared(&s, req, move |r: ChatRequest, info, tok| {
        let tok = tok.ok_or_else(|| {
            ApiError::bad("messages", "this model embeds no tokenizer: send token ids to /v1/completions")
        })?;
        r.prepare(tok, info, stop_bytes, &beginnings)
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
