//! The scheduler's events as Ollama answers: newline-delimited JSON objects while streaming (the
//! default), else one object; the last says `done: true` with Ollama's counts and durations (in
//! nanoseconds).

use std::convert::Infallible;
use std::time::Instant;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k3_generate::Finish;
use k3_text::toolcall::Piece;
use serde_json::{Value, json};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::answer::{Reply, Submitted, finish_reason};
use crate::error::ApiError;
use crate::job::Event;

/// Which endpoint's shape: `/api/chat` (`message`) or `/api/generate` (`response`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Generate,
}

/// What every object of one answer repeats, and the clock its durations read.
struct Shape {
    endpoint: Endpoint,
    model: String,
    started: Instant,
    first: Option<Instant>,
}

impl Shape {
    /// One object with `text`, `thinking` and `calls` (each left out when empty).
    fn piece(&self, text: &str, thinking: &str, calls: &[Value]) -> Value {
        let mut v = json!({"model": self.model, "created_at": super::now_rfc3339()});
        match self.endpoint {
            Endpoint::Chat => {
                let mut m = json!({"role": "assistant", "content": text});
                if !thinking.is_empty() {
                    m["thinking"] = json!(thinking);
                }
                if !calls.is_empty() {
                    m["tool_calls"] = json!(calls);
                }
                v["message"] = m;
            }
            Endpoint::Generate => {
                v["response"] = json!(text);
                if !thinking.is_empty() {
                    v["thinking"] = json!(thinking);
                }
            }
        }
        v["done"] = json!(false);
        v
    }

    /// `v` made the last object: why it ended, the counts and durations.
    fn done(&self, mut v: Value, reason: &str, prompt: usize, completion: u64) -> Value {
        let ns = |d: std::time::Duration| d.as_nanos() as u64;
        let first = self.first.unwrap_or_else(Instant::now);
        v["done"] = json!(true);
        v["done_reason"] = json!(reason);
        v["total_duration"] = json!(ns(self.started.elapsed()));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(prompt);
        v["prompt_eval_duration"] = json!(ns(first.duration_since(self.started)));
        v["eval_count"] = json!(completion);
        v["eval_duration"] = json!(ns(first.elapsed()));
        v
    }
}

/// A call in Ollama's shape: the arguments as an object where they parse as one.
fn call_json(c: &k3_text::toolcall::ToolCall) -> Value {
    let arguments = serde_json::from_str::<Value>(&c.arguments).unwrap_or_else(|_| json!(c.arguments));
    json!({"function": {"name": c.name, "arguments": arguments}})
}

/// Ollama's `done_reason`: a turn ended by itself is `stop` (calls or not), a cut one `length`.
fn reason(f: Finish) -> &'static str {
    finish_reason(f)
}

/// Text and calls of `pieces`.
fn split(pieces: Vec<Piece>, reply: &mut Reply) -> (String, Vec<Value>) {
    let (mut text, mut calls) = (String::new(), Vec::new());
    for p in pieces {
        match p {
            Piece::Text(t) => text.push_str(&t),
            Piece::Call(c) => {
                calls.push(call_json(&c));
                reply.made.push(c);
            }
        }
    }
    (text, calls)
}

/// Answers a submitted request, streamed as NDJSON or as one object.
pub async fn answer(sub: Submitted, endpoint: Endpoint, stream: bool) -> Result<Response, ApiError> {
    let Submitted { mut rx, mut reply, model, seed, .. } = sub;
    let mut shape = Shape { endpoint, model, started: Instant::now(), first: None };
    if !stream {
        let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
        while let Some(e) = rx.recv().await {
            match e {
                Event::Delta { text: t, reasoning, token, .. } => {
                    reply.log.token();
                    shape.first.get_or_insert_with(Instant::now);
                    thinking.push_str(&reasoning);
                    let (t, c) = split(reply.feed(token, &t), &mut reply);
                    text.push_str(&t);
                    calls.extend(c);
                }
                // Progress is asked for only on OpenAI's chat route.
                Event::Progress(_) => {}
                Event::Failed(msg) => {
                    reply.log.done("failed", 0, 0, 0);
                    return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg));
                }
                Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, .. } => {
                    let (t, c) = split(reply.finish(), &mut reply);
                    text.push_str(&t);
                    calls.extend(c);
                    reply.log.done(reply.reason(finish), prompt_tokens, cached_tokens, completion_tokens);
                    let v = shape.done(
                        shape.piece(&text, &thinking, &calls),
                        reason(finish),
                        prompt_tokens,
                        completion_tokens,
                    );
                    return Ok(with_seed(axum::Json(v).into_response(), seed));
                }
            }
        }
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the scheduler stopped before the request ended"));
    }
    let (out, lines) = tmpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let send = |v: Value| out.send(format!("{v}\n")).is_ok();
        while let Some(e) = rx.recv().await {
            let alive = match e {
                Event::Delta { text, reasoning, token, .. } => {
                    reply.log.token();
                    shape.first.get_or_insert_with(Instant::now);
                    let (t, calls) = split(reply.feed(token, &text), &mut reply);
                    (t.is_empty() && reasoning.is_empty() && calls.is_empty())
                        || send(shape.piece(&t, &reasoning, &calls))
                }
                // Progress is asked for only on OpenAI's chat route.
                Event::Progress(_) => true,
                Event::Failed(msg) => {
                    reply.log.done("failed", 0, 0, 0);
                    send(json!({"error": msg}));
                    break;
                }
                Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, .. } => {
                    let (t, calls) = split(reply.finish(), &mut reply);
                    reply.log.done(reply.reason(finish), prompt_tokens, cached_tokens, completion_tokens);
                    send(shape.done(shape.piece(&t, "", &calls), reason(finish), prompt_tokens, completion_tokens));
                    break;
                }
            };
            // The client left: dropping the events' receiver cancels the sequence.
            if !alive {
                return;
            }
        }
    });
    let body = Body::from_stream(UnboundedReceiverStream::new(lines).map(Ok::<_, Infallible>));
    let r = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    Ok(with_seed(r, seed))
}

/// The seed the answer was sampled with, as the OpenAI routes give it.
fn with_seed(mut r: Response, seed: u64) -> Response {
    r.headers_mut().insert("x-k3-seed", axum::http::HeaderValue::from(seed));
    r
}
