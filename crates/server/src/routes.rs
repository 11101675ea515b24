//! The HTTP side: handlers that check a request, hand it to the scheduler and turn its events
//! into OpenAI responses (one JSON body, or SSE chunks ending with `[DONE]`).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use k3_engine::generate::Finish;
use k3_engine::tokenizer::Tokenizer;
use k3_engine::toolcall::{Piece, ToolCall, ToolCallReader};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{ChatRequest, CompletionRequest, Prepared, finish_reason};
use crate::boundary::Scope;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::{Event, Handle, Job, ModelInfo, Refused};

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub handle: Handle,
    /// Set by the loader once the model is ready.
    pub info: Arc<OnceLock<ModelInfo>>,
    pub tok: Arc<OnceLock<Tokenizer>>,
    pub metrics: Arc<Metrics>,
    pub boundary: Arc<crate::boundary::Boundary>,
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// A request's body must arrive within this.
    pub body_timeout: std::time::Duration,
    /// Total bytes of a request's stop strings at most.
    pub stop_bytes: usize,
    /// Unix seconds at start (the models' `created`).
    pub created: u64,
}

impl AppState {
    /// The model's shape and its tokenizer (`None`: the model is served token ids).
    fn ready(&self) -> Result<(&ModelInfo, Option<&Tokenizer>), ApiError> {
        match self.info.get() {
            Some(i) if self.handle.status.ready.load(Ordering::SeqCst) => Ok((i, self.tok.get())),
            _ => Err(self.unavailable()),
        }
    }

    fn unavailable(&self) -> ApiError {
        let failed = self.handle.status.failed.lock().ok().and_then(|f| f.clone());
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, failed.unwrap_or_else(|| "Loading model".into()))
    }
}

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

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(s): State<AppState>) -> Response {
    let cache = s.handle.status.cache.lock().ok().and_then(|c| *c);
    let body = s.metrics.render(&s.handle.status, cache);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// The body of `req`, read within the server's size and time limits: a declared length over the
/// limit is a 413 before anything is read, a body that does not arrive in time a 408.
async fn body(s: &AppState, req: Request) -> Result<Bytes, ApiError> {
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
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad("body", format!("the request body is not a valid request: {e}")))
}

/// Which endpoint's shapes a response takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// Reads, checks and tokenizes a request on a blocking thread (tokenizing a long prompt is
/// CPU work that must not stall the async workers serving everyone else).
async fn prepared<T, F>(s: &AppState, req: Request, prepare: F) -> Result<Prepared, ApiError>
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(T, &ModelInfo, Option<&Tokenizer>) -> Result<Prepared, ApiError> + Send + 'static,
{
    if s.handle.status.draining.load(Ordering::SeqCst) {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
    }
    let bytes = body(s, req).await?;
    s.ready()?;
    let state = s.clone();
    tokio::task::spawn_blocking(move || {
        let r: T = parse(&bytes)?;
        let (info, tok) = state.ready()?;
        prepare(r, info, tok)
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
    run(&s, p, Kind::Chat, scope).await
}

/// `POST /v1/completions`.
pub async fn completions(
    State(s): State<AppState>,
    Extension(scope): Extension<Scope>,
    req: Request,
) -> Result<Response, ApiError> {
    let stop_bytes = s.stop_bytes;
    let p = prepared(&s, req, move |r: CompletionRequest, info, tok| r.prepare(tok, info, stop_bytes)).await?;
    run(&s, p, Kind::Completion, scope).await
}

/// Submits a prepared request and answers it, streamed or whole.
async fn run(s: &AppState, p: Prepared, kind: Kind, scope: Scope) -> Result<Response, ApiError> {
    let (tx, rx) = tmpsc::unbounded_channel();
    let (stream, include_usage) = (p.stream, p.include_usage);
    let family = s.info.get().map(|i| i.family);
    let calls = match (p.tools, s.tok.get(), family) {
        (true, Some(tok), Some(family)) => ToolCallReader::new(tok, family),
        _ => None,
    };
    match s.handle.submit(Job { prompt: p.prompt, params: p.params, events: tx, scope }) {
        Ok(()) => s.metrics.requests.fetch_add(1, Ordering::Relaxed),
        Err(Refused::Busy) => {
            s.metrics.requests_refused.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "the server is busy: its queue is full, retry later",
            ));
        }
        Err(Refused::Gone) => return Err(s.unavailable()),
    };
    let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, next_id());
    let model = s.info.get().map(|i| i.id.clone()).unwrap_or_default();
    let reply = Reply { calls, made: Vec::new(), tok: s.tok.clone(), call_prefix: format!("call-{id}") };
    let shape = Shape { id, model, created: unix_now(), kind };
    if stream { Ok(streamed(shape, rx, reply, include_usage)) } else { whole(shape, rx, reply).await }
}

/// A reply's tokens into text and, when tools were declared, tool calls.
#[derive(Debug)]
struct Reply {
    calls: Option<ToolCallReader>,
    made: Vec<ToolCall>,
    tok: Arc<OnceLock<Tokenizer>>,
    /// Calls the markup leaves unnamed (K3's) are named this and their number.
    call_prefix: String,
}

impl Reply {
    fn feed(&mut self, token: u32, text: &str) -> Vec<Piece> {
        match (&mut self.calls, self.tok.get()) {
            // A flushed remainder (no token of its own) is text.
            (Some(r), Some(tok)) if token != u32::MAX => r.push(tok, token, text),
            _ if text.is_empty() => Vec::new(),
            _ => vec![Piece::Text(text.to_string())],
        }
    }

    fn finish(&mut self) -> Vec<Piece> {
        self.calls.as_mut().map(ToolCallReader::finish).unwrap_or_default()
    }

    /// OpenAI's `finish_reason`: `tool_calls` when the turn ended by itself after calling.
    fn reason(&self, f: Finish) -> &'static str {
        if !self.made.is_empty() && matches!(f, Finish::Stop) { "tool_calls" } else { finish_reason(f) }
    }

    fn call_json(&self, index: usize, c: &ToolCall) -> Value {
        let id = if c.id.is_empty() { format!("{}-{index}", self.call_prefix) } else { c.id.clone() };
        json!({"index": index, "id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
    }
}

/// What every chunk and body of one response repeats.
#[derive(Debug, Clone)]
struct Shape {
    id: String,
    model: String,
    created: u64,
    kind: Kind,
}

impl Shape {
    fn object(&self, streaming: bool) -> &'static str {
        match (self.kind, streaming) {
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, streaming: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(streaming), "created": self.created, "model": self.model, "choices": choices})
    }

    /// One streamed piece of text, or the last chunk (`finish` set).
    fn chunk(&self, text: Option<&str>, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                    None => json!({}),
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
            }
        };
        self.envelope(true, json!([choice]))
    }
}

fn usage(prompt: usize, cached: usize, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt as u64 + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Collects every event into one response body.
async fn whole(shape: Shape, mut rx: tmpsc::UnboundedReceiver<Event>, mut reply: Reply) -> Result<Response, ApiError> {
    let (mut text, mut reasoning) = (String::new(), String::new());
    let take = |pieces: Vec<Piece>, text: &mut String, reply: &mut Reply| {
        for p in pieces {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => reply.made.push(c),
            }
        }
    };
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta { text: t, reasoning: r, token } => {
                reasoning.push_str(&r);
                let pieces = reply.feed(token, &t);
                take(pieces, &mut text, &mut reply);
            }
            Event::Failed(msg) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg)),
            Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens } => {
                let pieces = reply.finish();
                take(pieces, &mut text, &mut reply);
                let reason = reply.reason(finish);
                let mut choice = match shape.kind {
                    Kind::Chat if !reply.made.is_empty() => {
                        let calls: Vec<Value> =
                            reply.made.iter().enumerate().map(|(i, c)| reply.call_json(i, c)).collect();
                        let content = if text.is_empty() { Value::Null } else { json!(text) };
                        json!({"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": calls}, "finish_reason": reason})
                    }
                    Kind::Chat => {
                        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason})
                    }
                    Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason}),
                };
                if !reasoning.is_empty() && shape.kind == Kind::Chat {
                    choice["message"]["reasoning_content"] = json!(reasoning);
                }
                let mut body = shape.envelope(false, json!([choice]));
                body["usage"] = usage(prompt_tokens, cached_tokens, completion_tokens);
                return Ok(Json(body).into_response());
            }
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the scheduler stopped before the request ended"))
}

/// Streams the events as SSE chunks; dropping the stream (the client left) drops the events'
/// receiver, which cancels the sequence at the scheduler's next step.
fn streamed(shape: Shape, mut rx: tmpsc::UnboundedReceiver<Event>, mut reply: Reply, include_usage: bool) -> Response {
    let (out, chunks) = tmpsc::unbounded_channel::<Sse>();
    tokio::spawn(async move {
        let send = |v: Value| out.send(Sse::default().data(v.to_string())).is_ok();
        if shape.kind == Kind::Chat && !send(shape.chunk(None, None)) {
            return;
        }
        // Text as a content delta, a finished call as a tool_calls delta.
        let emit = |pieces: Vec<Piece>, reply: &mut Reply| {
            pieces.into_iter().all(|p| match p {
                Piece::Text(t) => send(shape.chunk(Some(&t), None)),
                Piece::Call(c) => {
                    let delta = json!({"tool_calls": [reply.call_json(reply.made.len(), &c)]});
                    reply.made.push(c);
                    send(shape.envelope(true, json!([{"index": 0, "delta": delta, "finish_reason": null}])))
                }
            })
        };
        while let Some(e) = rx.recv().await {
            let alive = match e {
                Event::Delta { text, reasoning, token } => {
                    let thought = reasoning.is_empty()
                        || send(shape.envelope(
                            true,
                            json!([{"index": 0, "delta": {"reasoning_content": reasoning}, "finish_reason": null}]),
                        ));
                    let pieces = reply.feed(token, &text);
                    thought && emit(pieces, &mut reply)
                }
                Event::Failed(msg) => {
                    send(json!({"error": {"message": msg, "type": "server_error", "param": null, "code": 500}}));
                    break;
                }
                Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens } => {
                    let pieces = reply.finish();
                    emit(pieces, &mut reply);
                    send(shape.chunk(None, Some(reply.reason(finish))));
                    if include_usage {
                        let mut u = shape.envelope(true, json!([]));
                        u["usage"] = usage(prompt_tokens, cached_tokens, completion_tokens);
                        send(u);
                    }
                    break;
                }
            };
            if !alive {
                return;
            }
        }
        let _ = out.send(Sse::default().data("[DONE]"));
    });
    let stream = UnboundedReceiverStream::new(chunks).map(Ok::<_, Infallible>);
    axum::response::Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
