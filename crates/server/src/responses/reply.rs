//! The scheduler's events as a Responses answer: output items (`reasoning`, `message`,
//! `function_call`) built from the reply's text, reasoning and calls, returned whole or streamed
//! as the typed SSE events OpenAI's SDKs and Codex read (`response.created`, item and part
//! events, deltas, `response.completed` / `response.incomplete`, `error` and `response.failed`),
//! each with its `sequence_number`; the finished response kept when the request stores it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use k3_generate::Finish;
use k3_text::toolcall::{Piece, ToolCall};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::answer::{Reply, Submitted, finish_reason};
use crate::boundary::Caller;
use crate::error::ApiError;
use crate::job::Event;
use crate::response_store::{Store, Stored};

/// What the response says besides its output: its id, time, model and the request's settings.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created_at: u64,
    pub echo: Map<String, Value>,
    /// Declared names of namespaced functions to their namespace and name.
    pub namespaced: std::collections::HashMap<String, (String, String)>,
}

/// Where a finished response is kept (`store: true`): the conversation before its output.
#[derive(Debug)]
pub struct Keep {
    pub store: Arc<Store>,
    pub owner: Caller,
    pub conversation: Vec<Value>,
}

/// The item being written.
#[derive(Debug)]
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

/// The output items of one answer as they are written, and the events that say so.
#[derive(Debug)]
struct Output {
    resp: String,
    items: Vec<Value>,
    open: Option<Open>,
    /// Events not yet sent: their type and data.
    events: Vec<(&'static str, Value)>,
    seq: u64,
    made: usize,
    reasoning_tokens: u64,
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

impl Output {
    fn new(resp: &str) -> Output {
        let resp = resp.strip_prefix("resp_").unwrap_or(resp).to_string();
        Output { resp, items: Vec::new(), open: None, events: Vec::new(), seq: 0, made: 0, reasoning_tokens: 0 }
    }

    fn event(&mut self, kind: &'static str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.events.push((kind, data));
    }

    fn item_id(&mut self, prefix: &str) -> String {
        self.made += 1;
        format!("{prefix}_{}_{}", self.resp, self.made)
    }

    /// Opens an item at the next output index: `output_item.added` and its part's `added`.
    fn begin(&mut self, open: Open) {
        let index = self.items.len();
        let (item, part, id) = match &open {
            Open::Reasoning { id, .. } => (
                json!({"id": id, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}),
                json!({"type": "reasoning_text", "text": ""}),
                id.clone(),
            ),
            Open::Message { id, .. } => (
                json!({"id": id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}),
                text_part(""),
                id.clone(),
            ),
        };
        self.event("response.output_item.added", json!({"output_index": index, "item": item}));
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        self.open = Some(open);
    }

    /// Closes the open item: its part's and its own `done` events; it joins the output.
    fn close(&mut self, status: &str) {
        let Some(open) = self.open.take() else { return };
        let index = self.items.len();
        let (done, part, item, id) = match open {
            Open::Reasoning { id, text } => (
                ("response.reasoning_text.done", json!({"text": text})),
                json!({"type": "reasoning_text", "text": text}),
                json!({"id": id, "type": "reasoning", "summary": [],
                       "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}),
                id,
            ),
            Open::Message { id, text } => (
                ("response.output_text.done", json!({"text": text, "logprobs": []})),
                text_part(&text),
                json!({"id": id, "type": "message", "role": "assistant", "status": status, "content": [text_part(&text)]}),
                id,
            ),
        };
        let (kind, mut data) = done;
        data["item_id"] = json!(id);
        data["output_index"] = json!(index);
        data["content_index"] = json!(0);
        self.event(kind, data);
        self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        self.event("response.output_item.done", json!({"output_index": index, "item": item}));
        self.items.push(item);
    }

    fn reasoning(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.reasoning_tokens += 1;
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close("completed");
            let id = self.item_id("rs");
            self.begin(Open::Reasoning { id, text: String::new() });
        }
        let index = self.items.len();
        if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
            all.push_str(text);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text});
            self.event("response.reasoning_text.delta", data);
        }
    }

    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close("completed");
            let id = self.item_id("msg");
            self.begin(Open::Message { id, text: String::new() });
        }
        let index = self.items.len();
        if let Some(Open::Message { id, text: all }) = &mut self.open {
            all.push_str(text);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []});
            self.event("response.output_text.delta", data);
        }
    }

    /// A finished call: added, its arguments in one delta, done.
    fn call(&mut self, c: &ToolCall, number: usize, namespace: Option<&(String, String)>) {
        self.close("completed");
        let index = self.items.len();
        let id = self.item_id("fc");
        let call_id = if c.id.is_empty() { format!("call_{}_{number}", self.resp) } else { c.id.clone() };
        let name = namespace.map_or(&c.name, |(_, n)| n);
        let item = |arguments: &str, status: &str| {
            let mut v = json!({"id": id, "type": "function_call", "call_id": call_id, "name": name,
                   "arguments": arguments, "status": status});
            if let Some((ns, _)) = namespace {
                v["namespace"] = json!(ns);
            }
            v
        };
        self.event("response.output_item.added", json!({"output_index": index, "item": item("", "in_progress")}));
        let at = json!({"item_id": id, "output_index": index});
        let mut delta = at.clone();
        delta["delta"] = json!(c.arguments);
        self.event("response.function_call_arguments.delta", delta);
        let mut done = at;
        done["arguments"] = json!(c.arguments);
        done["name"] = json!(name);
        self.event("response.function_call_arguments.done", done);
        let item = item(&c.arguments, "completed");
        self.event("response.output_item.done", json!({"output_index": index, "item": item}));
        self.items.push(item);
    }

    /// Reply pieces into items.
    fn pieces(&mut self, pieces: Vec<Piece>, reply: &mut Reply, meta: &Meta) {
        for p in pieces {
            match p {
                Piece::Text(t) => self.text(&t),
                Piece::Call(c) => {
                    self.call(&c, reply.made.len(), meta.namespaced.get(&c.name));
                    reply.made.push(c);
                }
            }
        }
    }
}

/// The response object: `status`, the output so far, usage; the request's settings echoed.
fn response(meta: &Meta, model: &str, status: &str, output: &[Value], extra: Map<String, Value>) -> Value {
    let mut v = json!({
        "id": meta.id, "object": "response", "created_at": meta.created_at, "status": status, "model": model,
        "output": output, "usage": null, "error": null, "incomplete_details": null,
        "background": false, "service_tier": "default", "truncation": "disabled",
    });
    for (k, x) in meta.echo.iter().chain(&extra) {
        v[k] = x.clone();
    }
    v
}

/// How the answer ended, as the response says it.
fn ending(
    out: &Output,
    reply: &Reply,
    finish: Finish,
    counts: (usize, usize, u64),
) -> (&'static str, Map<String, Value>) {
    let (prompt, cached, completion) = counts;
    let cut = finish_reason(finish) == "length" && !reply.ended_by_calls(finish);
    let mut extra = Map::new();
    extra.insert(
        "usage".into(),
        json!({
            "input_tokens": prompt,
            // The prompt's tokens prefilled (not resumed): the prompt cache keeps states of them.
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": prompt - cached.min(prompt)},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": out.reasoning_tokens.min(completion)},
            "total_tokens": prompt as u64 + completion,
        }),
    );
    if cut {
        extra.insert("incomplete_details".into(), json!({"reason": "max_output_tokens"}));
        ("incomplete", extra)
    } else {
        extra.insert("completed_at".into(), json!(unix_now()));
        ("completed", extra)
    }
}

/// Now in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Answers a submitted request, streamed or whole.
pub async fn answer(sub: Submitted, meta: Meta, keep: Option<Keep>, stream: bool) -> Result<Response, ApiError> {
    let seed = sub.seed;
    let mut r = if stream { streamed(sub, meta, keep) } else { whole(sub, meta, keep).await? };
    r.headers_mut().insert("x-k3-seed", HeaderValue::from(seed));
    Ok(r)
}

/// One event of the scheduler into `out`; the finished response at the end.
enum Step {
    Going,
    Done(Value),
    Failed(String),
}

fn step(e: Event, out: &mut Output, reply: &mut Reply, meta: &Meta, model: &str, keep: &mut Option<Keep>) -> Step {
    match e {
        Event::Delta { text, reasoning, token, .. } => {
            reply.log.token();
            out.reasoning(&reasoning);
            let pieces = reply.feed(token, &text);
            out.pieces(pieces, reply, meta);
            Step::Going
        }
        // Progress is asked for only on OpenAI's chat route.
        Event::Progress(_) => Step::Going,
        Event::Failed(msg) => {
            reply.log.done("failed", 0, 0, 0);
            Step::Failed(msg)
        }
        Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, .. } => {
            let pieces = reply.finish();
            out.pieces(pieces, reply, meta);
            reply.log.done(reply.reason(finish), prompt_tokens, cached_tokens, completion_tokens);
            let (status, extra) = ending(out, reply, finish, (prompt_tokens, cached_tokens, completion_tokens));
            out.close(if status == "incomplete" { "incomplete" } else { "completed" });
            let v = response(meta, model, status, &out.items, extra);
            if let Some(k) = keep.take() {
                let mut conversation = k.conversation;
                let inputs = conversation.len();
                conversation.extend(out.items.iter().cloned());
                // A response too large to keep is still answered; a later previous_response_id
                // naming it is told it is not kept.
                let _ = k.store.put(&meta.id, Stored::new(k.owner, v.clone(), conversation, inputs));
            }
            Step::Done(v)
        }
    }
}

async fn whole(sub: Submitted, meta: Meta, mut keep: Option<Keep>) -> Result<Response, ApiError> {
    let Submitted { mut rx, mut reply, model, .. } = sub;
    let mut out = Output::new(&meta.id);
    while let Some(e) = rx.recv().await {
        let s = step(e, &mut out, &mut reply, &meta, &model, &mut keep);
        out.events.clear();
        match s {
            Step::Going => {}
            Step::Done(v) => return Ok(Json(v).into_response()),
            Step::Failed(msg) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg)),
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the scheduler stopped before the request ended"))
}

/// Streams the events; dropping the stream (the client left) drops the scheduler's receiver,
/// which cancels the sequence at its next step.
fn streamed(sub: Submitted, meta: Meta, mut keep: Option<Keep>) -> Response {
    let Submitted { mut rx, mut reply, model, .. } = sub;
    let (tx, events) = tmpsc::unbounded_channel::<Sse>();
    tokio::spawn(async move {
        let mut out = Output::new(&meta.id);
        let send = |out: &mut Output| {
            out.events.drain(..).all(|(kind, data)| tx.send(Sse::default().event(kind).data(data.to_string())).is_ok())
        };
        let begun = response(&meta, &model, "in_progress", &[], Map::new());
        out.event("response.created", json!({"response": begun}));
        out.event("response.in_progress", json!({"response": begun}));
        if !send(&mut out) {
            return;
        }
        while let Some(e) = rx.recv().await {
            match step(e, &mut out, &mut reply, &meta, &model, &mut keep) {
                Step::Going => {}
                Step::Done(v) => {
                    let kind = if v["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
                    out.event(kind, json!({"response": v}));
                    send(&mut out);
                    return;
                }
                Step::Failed(msg) => {
                    out.event("error", json!({"code": "server_error", "message": msg, "param": null}));
                    let mut extra = Map::new();
                    extra.insert("error".into(), json!({"code": "server_error", "message": msg}));
                    out.event(
                        "response.failed",
                        json!({"response": response(&meta, &model, "failed", &out.items, extra)}),
                    );
                    send(&mut out);
                    return;
                }
            }
            if !send(&mut out) {
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

    /// Items open and close in order, each event numbered; a namespaced function's call comes
    /// back under its namespace and own name, a call the markup leaves unnamed with an id.
    #[test]
    fn items_and_their_events() {
        let mut out = Output::new("resp_abc");
        out.reasoning("Think.");
        out.text("Hi");
        out.text(" there");
        let call = ToolCall { id: String::new(), name: "crm__find".into(), arguments: "{}".into() };
        out.call(&call, 0, Some(&("crm".to_string(), "find".to_string())));
        out.close("completed");
        let kinds: Vec<&str> = out.items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(out.items[1]["content"][0]["text"], "Hi there");
        let fc = &out.items[2];
        assert_eq!(
            (&fc["name"], &fc["namespace"], &fc["call_id"]),
            (&json!("find"), &json!("crm"), &json!("call_abc_0"))
        );
        let seq: Vec<u64> = out.events.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(seq, (0..out.events.len() as u64).collect::<Vec<_>>());
        let names: Vec<&str> = out.events.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names[..5],
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done"
            ]
        );
        assert_eq!(out.reasoning_tokens, 1);
    }
}
