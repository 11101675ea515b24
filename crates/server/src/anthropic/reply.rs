//! The scheduler's events as Anthropic's answer: one `message` object, or its SSE stream
//! (`message_start`, `ping`, each content block's `content_block_start` / `_delta` / `_stop` in
//! order as reasoning, text and calls arrive, `message_delta` with the stop reason and usage,
//! `message_stop`; an `error` event for a failure mid-stream).

use std::convert::Infallible;

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use k3_generate::Finish;
use k3_text::toolcall::{Piece, ToolCall};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::answer::{Reply, Submitted};
use crate::error::ApiError;
use crate::job::Event;

/// How often a stream waiting for its first token (or its next) sends a `ping`.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A content block of the answer.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Thinking { thinking: String, signature: String },
    Text { text: String },
    ToolUse { id: String, name: String, input: Box<RawValue> },
}

/// The answer's `message` object.
#[derive(Debug, Serialize)]
struct Message {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: String,
    content: Vec<Block>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: Value,
}

/// What marks a thinking block as k3's: a digest of its text (not a cryptographic signature;
/// one sent back is not checked).
fn signature(thinking: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    thinking.hash(&mut h);
    format!("k3-{:016x}", h.finish())
}

/// Anthropic's `stop_reason`: `tool_use` when the turn ended because it called tools.
fn stop_reason(reply: &Reply, f: Finish) -> &'static str {
    match f {
        _ if reply.ended_by_calls(f) => "tool_use",
        Finish::Stop => "end_turn",
        Finish::StopString => "stop_sequence",
        Finish::Length | Finish::ContextFull | Finish::Unfinished | Finish::Cancelled => "max_tokens",
    }
}

/// Anthropic's usage: `input_tokens` are the prompt's tokens not read from the prefix cache,
/// `cache_read_input_tokens` those that were; nothing is written to a cache on request
/// (`cache_creation_input_tokens` is 0: states are kept automatically, at no cost to report).
fn usage(prompt: usize, cached: usize, completion: u64) -> Value {
    json!({
        "input_tokens": prompt.saturating_sub(cached), "output_tokens": completion,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
    })
}

/// A call's id: the model's own, else one made from the message's.
fn call_id(c: &ToolCall, message: &str, n: usize) -> String {
    if c.id.is_empty() { format!("toolu_{}_{n}", message.trim_start_matches("msg_")) } else { c.id.clone() }
}

/// A call's arguments as its `input` object, as the model wrote them; arguments that are no JSON
/// object come whole as `{"arguments": "..."}`.
fn input(c: &ToolCall) -> Box<RawValue> {
    // Read once, as written (no re-serialization: the key order stays the model's).
    let raw = serde_json::from_str::<Box<RawValue>>(c.arguments.trim()).ok().filter(|r| r.get().starts_with('{'));
    raw.or_else(|| serde_json::value::to_raw_value(&json!({"arguments": c.arguments})).ok()).unwrap_or_default()
}

/// How to answer.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub stream: bool,
    /// The prompt's tokens as submitted (`message_start`'s count, before the prefix cache is
    /// looked at and images framed; `message_delta` carries the final usage).
    pub prompt: usize,
    /// Thinking blocks come back without their text (`thinking.display: "omitted"`).
    pub omit_thinking: bool,
}

/// Answers a submitted request, whole or streamed.
pub async fn answer(sub: Submitted, how: Answer) -> Result<Response, ApiError> {
    let Submitted { rx, reply, id, model, seed } = sub;
    let id = format!("msg_{}", id.trim_start_matches("chatcmpl-"));
    let mut r = if how.stream { streamed(id, model, rx, reply, how) } else { whole(id, model, rx, reply, how).await? };
    r.headers_mut().insert("x-k3-seed", HeaderValue::from(seed));
    Ok(r)
}

async fn whole(
    id: String,
    model: String,
    mut rx: tmpsc::UnboundedReceiver<Event>,
    mut reply: Reply,
    how: Answer,
) -> Result<Response, ApiError> {
    let (mut thinking, mut text) = (String::new(), String::new());
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta { text: t, reasoning, token, .. } => {
                reply.log.token();
                thinking.push_str(&reasoning);
                let pieces = reply.feed(token, &t);
                reply.collect(pieces, &mut text);
            }
            // Progress is asked for only on OpenAI's chat route.
            Event::Progress(_) => {}
            Event::Failed(msg) => {
                reply.log.done("failed", 0, 0, 0);
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg));
            }
            Event::Done { finish, stop_sequence, prompt_tokens, cached_tokens, completion_tokens } => {
                let pieces = reply.finish();
                reply.collect(pieces, &mut text);
                reply.log.done(reply.reason(finish), prompt_tokens, cached_tokens, completion_tokens);
                let mut content = Vec::new();
                if !thinking.is_empty() {
                    let signature = signature(&thinking);
                    let thinking = if how.omit_thinking { String::new() } else { thinking };
                    content.push(Block::Thinking { thinking, signature });
                }
                if !text.is_empty() {
                    content.push(Block::Text { text });
                }
                for (n, c) in reply.made.iter().enumerate() {
                    content.push(Block::ToolUse { id: call_id(c, &id, n), name: c.name.clone(), input: input(c) });
                }
                let reason = stop_reason(&reply, finish);
                return Ok(Json(Message {
                    id,
                    kind: "message",
                    role: "assistant",
                    model,
                    content,
                    stop_reason: Some(reason),
                    stop_sequence: stop_sequence.filter(|_| reason == "stop_sequence"),
                    usage: usage(prompt_tokens, cached_tokens, completion_tokens),
                })
                .into_response());
            }
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the scheduler stopped before the request ended"))
}

/// The block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
}

/// A stream's blocks: opened and closed in order, each with its index.
struct Blocks {
    out: tmpsc::UnboundedSender<Sse>,
    id: String,
    index: usize,
    open: Open,
    /// The open thinking block's text (its signature is sent before it stops).
    thought: String,
    calls: usize,
    /// Thinking blocks are sent without their text.
    omit_thinking: bool,
}

impl Blocks {
    /// Sends one event; false once the client is gone.
    fn send(&self, name: &str, v: Value) -> bool {
        self.out.send(Sse::default().event(name).data(v.to_string())).is_ok()
    }

    fn delta(&self, delta: Value) -> bool {
        self.send("content_block_delta", json!({"type": "content_block_delta", "index": self.index, "delta": delta}))
    }

    fn start(&mut self, block: Value, open: Open) -> bool {
        self.open = open;
        self.send(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        )
    }

    /// Closes the open block (a thinking block's signature first).
    fn close(&mut self) -> bool {
        let signed = match self.open {
            Open::None => return true,
            Open::Thinking => {
                let s = signature(&std::mem::take(&mut self.thought));
                self.delta(json!({"type": "signature_delta", "signature": s}))
            }
            Open::Text => true,
        };
        let stopped = self.send("content_block_stop", json!({"type": "content_block_stop", "index": self.index}));
        self.open = Open::None;
        self.index += 1;
        signed && stopped
    }

    fn thinking(&mut self, t: &str) -> bool {
        if t.is_empty() {
            return true;
        }
        if self.open != Open::Thinking
            && !(self.close()
                && self.start(json!({"type": "thinking", "thinking": "", "signature": ""}), Open::Thinking))
        {
            return false;
        }
        self.thought.push_str(t);
        self.omit_thinking || self.delta(json!({"type": "thinking_delta", "thinking": t}))
    }

    fn text(&mut self, t: &str) -> bool {
        if t.is_empty() {
            return true;
        }
        if self.open != Open::Text && !(self.close() && self.start(json!({"type": "text", "text": ""}), Open::Text)) {
            return false;
        }
        self.delta(json!({"type": "text_delta", "text": t}))
    }

    /// A call: its block whole (a call is read once it is complete).
    fn call(&mut self, c: &ToolCall) -> bool {
        let id = call_id(c, &self.id, self.calls);
        self.calls += 1;
        self.close()
            && self.start(json!({"type": "tool_use", "id": id, "name": c.name, "input": {}}), Open::None)
            && self.delta(json!({"type": "input_json_delta", "partial_json": input(c).get()}))
            && self.send("content_block_stop", json!({"type": "content_block_stop", "index": self.index}))
            && {
                self.index += 1;
                true
            }
    }

    fn pieces(&mut self, pieces: Vec<Piece>, reply: &mut Reply) -> bool {
        pieces.into_iter().all(|p| match p {
            Piece::Text(t) => self.text(&t),
            Piece::Call(c) => {
                let sent = self.call(&c);
                reply.made.push(c);
                sent
            }
        })
    }
}

/// Streams the events as Anthropic's SSE; the client leaving drops the events' receiver, which
/// cancels the sequence at the scheduler's next step.
fn streamed(
    id: String,
    model: String,
    mut rx: tmpsc::UnboundedReceiver<Event>,
    mut reply: Reply,
    how: Answer,
) -> Response {
    let (out, events) = tmpsc::unbounded_channel::<Sse>();
    tokio::spawn(async move {
        let mut b = Blocks {
            out,
            id: id.clone(),
            index: 0,
            open: Open::None,
            thought: String::new(),
            calls: 0,
            omit_thinking: how.omit_thinking,
        };
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(how.prompt, 0, 0)}});
        if !(b.send("message_start", start) && b.send("ping", json!({"type": "ping"}))) {
            return;
        }
        loop {
            // A long prefill sends no tokens for minutes: pings say the answer is under way
            // (Claude Code gives up on a stream with no event for 5 minutes).
            let e = match tokio::time::timeout(PING_EVERY, rx.recv()).await {
                Err(_) if b.send("ping", json!({"type": "ping"})) => continue,
                Err(_) => return,
                Ok(None) => {
                    let e = ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the scheduler stopped before the request ended",
                    );
                    b.send("error", e.anthropic_body());
                    return;
                }
                Ok(Some(e)) => e,
            };
            let alive = match e {
                Event::Delta { text, reasoning, token, .. } => {
                    reply.log.token();
                    let pieces = reply.feed(token, &text);
                    b.thinking(&reasoning) && b.pieces(pieces, &mut reply)
                }
                // Progress is asked for only on OpenAI's chat route.
                Event::Progress(_) => true,
                Event::Failed(msg) => {
                    reply.log.done("failed", 0, 0, 0);
                    let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg);
                    b.send("error", e.anthropic_body());
                    return;
                }
                Event::Done { finish, stop_sequence, prompt_tokens, cached_tokens, completion_tokens } => {
                    let pieces = reply.finish();
                    b.pieces(pieces, &mut reply);
                    b.close();
                    reply.log.done(reply.reason(finish), prompt_tokens, cached_tokens, completion_tokens);
                    let reason = stop_reason(&reply, finish);
                    let stop_sequence = stop_sequence.filter(|_| reason == "stop_sequence");
                    b.send(
                        "message_delta",
                        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
                               "usage": usage(prompt_tokens, cached_tokens, completion_tokens)}),
                    );
                    b.send("message_stop", json!({"type": "message_stop"}));
                    return;
                }
            };
            if !alive {
                return;
            }
        }
    });
    let stream = UnboundedReceiverStream::new(events).map(Ok::<_, Infallible>);
    axum::response::Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(arguments: &str) -> ToolCall {
        ToolCall { id: String::new(), name: "f".into(), arguments: arguments.into() }
    }

    /// A call's `input` is its arguments as written when they are an object (key order kept),
    /// else the text whole under `arguments`: always a JSON object, whatever the model wrote.
    #[test]
    fn a_calls_input_is_always_an_object() {
        assert_eq!(input(&call(r#" {"z": 1, "a": [2]} "#)).get(), r#"{"z": 1, "a": [2]}"#);
        for odd in ["[1, 2]", "\"text\"", "{\"unclosed\": ", "", "7"] {
            let v: Value = serde_json::from_str(input(&call(odd)).get()).unwrap();
            assert_eq!(v, json!({"arguments": odd}), "{odd:?}");
        }
    }
}
