//! What the handlers of both dialects (OpenAI's routes and Ollama's) share before a request is
//! answered: its body read within the server's limits, parsed, and checked and tokenized into a
//! [`Prepared`] request on a blocking thread.

use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use k3_generate::GenerateParams;
use k3_text::tokenizer::Tokenizer;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::images::RequestImage;
use crate::job::ModelInfo;
use crate::state::AppState;

/// A request checked and tokenized: what the scheduler runs and how to answer.
#[derive(Debug)]
pub struct Prepared {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub stream: bool,
    pub include_usage: bool,
    /// Tools were declared: the reply is read for tool calls.
    pub tools: bool,
    /// At most one tool call: the turn ends at the first one read (`parallel_tool_calls: false`).
    pub single_call: bool,
    /// Where to keep the state while prefilling ([`crate::job::Job::resume_points`]).
    pub resume_points: Vec<usize>,
    /// The images, in prompt order (one placeholder each in `prompt`); decoded by
    /// [`crate::images::admit`] before the request is queued.
    pub images: Vec<RequestImage>,
    /// Stream the prefill's progress (`return_progress: true` on a streamed chat request).
    pub progress: bool,
}

/// The body of `req`, read within the server's size and time limits: a declared length over the
/// limit is a 413 before anything is read, a body that does not arrive in time a 408.
pub(crate) async fn body(s: &AppState, req: Request) -> Result<Bytes, ApiError> {
    read_body(req, s.body_limit, s.body_timeout).await
}

/// [`body`] within these limits.
pub(crate) async fn read_body(req: Request, limit: usize, timeout: std::time::Duration) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than this server accepts ({limit} bytes)"),
        )
    };
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(timeout, axum::body::to_bytes(req.into_body(), limit)).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {} s", timeout.as_secs()),
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
        crate::images::admit(&mut p.images, &state.image_limits, &state.images_in_flight)?;
        Ok(p)
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "checking the request failed"))?
}
