//! A submitted request's answer: the scheduler's events turned into OpenAI responses, one JSON
//! body or SSE chunks ending with `[DONE]`; text and tool calls read from the tokens, and each
//! token's log-probabilities when asked ([`crate::logprobs`]).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use k3_generate::Finish;
use k3_text::tokenizer::Tokenizer;
use k3_text::toolcall::{Piece, ToolCall, ToolCallReader};
use serde_json::{Value, json};
use tokio::sync::mpsc as tmpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::error::ApiError;
use crate::job::{Event, Job, Progress, Refused, Tally, TokenLogprob};
use crate::reqlog::{PrefillLog, RequestLog};
use crate::request::Prepared;
use crate::state::AppState;
use k3_generate::cache::Scope;

/// Which endpoint's shapes a response takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// OpenAI's `finish_reason` for how a turn ended.
pub fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop | Finish::StopString => "stop",
        // Cut short with the answer unfinished (a limit, a full context, JSON no token continues,
        // or the server's drain ending it): what OpenAI's clients read as an incomplete answer.
        Finish::Length | Finish::ContextFull | Finish::Unfinished | Finish::Cancelled => "length",
    }
}

/// Submits a prepared request and answers it, streamed or whole.
pub async fn run(s: &AppState, p: Prepared, kind: Kind, scope: Scope) -> Result<Response, ApiError> {
    let (stream, include_usage) = (p.stream, p.include_usage);
    let Submitted { rx, reply, id, model, seed } = submit(s, p, kind, scope)?;
    let shape = Shape { id, model, created: unix_now(), kind, seed };
    let mut r = if stream { streamed(shape, rx, reply, include_usage) } else { whole(shape, rx, reply).await? };
    // The seed the answer was sampled with (the request's, or a fresh one): resend it to repeat.
    r.headers_mut().insert("x-k3-seed", HeaderValue::from(seed));
    Ok(r)
}

/// A request in the scheduler's queue: its events, and what reads its tokens.
pub(crate) struct Submitted {
    pub rx: tmpsc::UnboundedReceiver<Event>,
    pub reply: Reply,
    pub id: String,
    /// The model's id in the API.
    pub model: String,
    pub seed: u64,
}

/// Hands a prepared request to the scheduler (429 when its queue is full).
pub(crate) fn submit(s: &AppState, mut p: Prepared, kind: Kind, scope: Scope) -> Result<Submitted, ApiError> {
    let (tx, rx) = tmpsc::unbounded_channel();
    let seed = p.params.sampler.seed;
    let family = s.info.get().map(|i| i.family);
    // Calls are read whether or not tools may be called: one made when they may not comes back
    // as the text the model wrote.
    let calls = match (s.tok.get(), family) {
        (Some(tok), Some(family)) => ToolCallReader::new(tok, k3_generate::dialect(family)),
        _ => None,
    };
    let calling = p.tools;
    // One call at most: the sequence is cancelled once it is read (ending at the next step).
    let ends_at_call = (p.single_call && calling).then(|| {
        let flag = Arc::new(AtomicBool::new(false));
        p.params.cancel = Some(flag.clone());
        flag
    });
    let logprobs = p.params.logprobs;
    let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, next_id());
    let tally = Arc::new(Tally::default());
    tally.prompt.store(p.prompt.len(), Ordering::Relaxed);
    match s.handle.submit(Job {
        prompt: p.prompt,
        params: p.params,
        events: tx,
        scope,
        resume_points: p.resume_points,
        images: p.images,
        tally: tally.clone(),
        log: PrefillLog::new(s.log_format, &id),
        progress: p.progress,
    }) {
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
    let model = s.info.get().map(|i| i.id.clone()).unwrap_or_default();
    let reply = Reply {
        calls,
        calling,
        raw: Vec::new(),
        as_text: false,
        made: Vec::new(),
        tok: s.tok.clone(),
        call_prefix: format!("call-{id}"),
        ends_at_call,
        want_logprobs: logprobs.is_some(),
        log: RequestLog::new(s.log_format, &id, Some(s.metrics.clone()), tally),
    };
    Ok(Submitted { rx, reply, id, model, seed })
}

/// A reply's tokens into text and, when tools were declared, tool calls.
#[derive(Debug)]
pub(crate) struct Reply {
    calls: Option<ToolCallReader>,
    /// Tools may be called (declared, and `tool_choice` is not `none`): calls read are
    /// `tool_calls`. Otherwise a call the model makes anyway is returned as the text it wrote.
    calling: bool,
    /// What the tokens since the last piece wrote, markup included: that text.
    /// The markup's bytes as the model wrote it, kept while a call may have to come back as text.
    raw: Vec<u8>,
    /// A call was returned as text: the markup that closes it is text too.
    as_text: bool,
    pub made: Vec<ToolCall>,
    tok: Arc<OnceLock<Tokenizer>>,
    /// Calls the markup leaves unnamed (K3's) are named this and their number.
    call_prefix: String,
    /// At most one call (`parallel_tool_calls: false`): set once it is read, which cancels the
    /// sequence; nothing after it is returned.
    ends_at_call: Option<Arc<AtomicBool>>,
    /// The request's line on standard error.
    pub log: RequestLog,
    /// The request asked for log-probabilities.
    want_logprobs: bool,
}

impl Reply {
    /// A token and the text the decoder shows for it, as text and finished calls.
    pub fn feed(&mut self, token: u32, text: &str) -> Vec<Piece> {
        if self.ended_at_call() {
            return Vec::new();
        }
        match (&mut self.calls, self.tok.get()) {
            // A flushed remainder (no token of its own) is text.
            (Some(r), Some(tok)) if token != u32::MAX => {
                let pieces = r.push(tok, token, text);
                if self.calling {
                    if let Some(flag) = &self.ends_at_call
                        && pieces.iter().any(|p| matches!(p, Piece::Call(_)))
                    {
                        flag.store(true, Ordering::SeqCst);
                    }
                    return pieces;
                }
                match tok.special_name(token) {
                    Some(marker) => self.raw.extend_from_slice(marker.as_bytes()),
                    None => self.raw.extend_from_slice(&written(tok, token)),
                }
                if pieces.iter().any(|p| matches!(p, Piece::Call(_))) {
                    self.as_text = true;
                    return vec![Piece::Text(take_text(&mut self.raw))];
                }
                if !pieces.is_empty() {
                    self.raw.clear();
                }
                pieces
            }
            _ if text.is_empty() => Vec::new(),
            _ => vec![Piece::Text(text.to_string())],
        }
    }

    /// `pieces` gathered for a whole answer: text onto `text`, calls into [`made`](Self::made).
    pub fn collect(&mut self, pieces: Vec<Piece>, text: &mut String) {
        for p in pieces {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => self.made.push(c),
            }
        }
    }

    /// The turn ended at its one call (`parallel_tool_calls: false`).
    fn ended_at_call(&self) -> bool {
        self.ends_at_call.as_ref().is_some_and(|f| f.load(Ordering::SeqCst))
    }

    /// What is left at the end.
    pub fn finish(&mut self) -> Vec<Piece> {
        if self.ended_at_call() {
            return Vec::new();
        }
        let pieces = self.calls.as_mut().map(ToolCallReader::finish).unwrap_or_default();
        if self.calling || !self.as_text {
            return pieces;
        }
        // The markup after a call returned as text (the calls' closing tags) is part of it.
        if self.raw.is_empty() { pieces } else { vec![Piece::Text(take_text(&mut self.raw))] }
    }

    /// OpenAI's `finish_reason`: `tool_calls` when the turn ended by itself after calling (or
    /// at its one call).
    pub fn reason(&self, f: Finish) -> &'static str {
        if self.ended_by_calls(f) { "tool_calls" } else { finish_reason(f) }
    }

    /// The turn ended because it called tools: by itself after calling, or at its one call.
    pub fn ended_by_calls(&self, f: Finish) -> bool {
        !self.made.is_empty() && (f == Finish::Stop || (f == Finish::Cancelled && self.ended_at_call()))
    }

    /// The logprobs object of `tokens` in this endpoint's shape (`offset`: where their text
    /// starts in the answer).
    fn logprobs(&self, kind: Kind, tokens: &[TokenLogprob], offset: usize) -> Value {
        let tok = self.tok.get();
        match kind {
            Kind::Chat => crate::logprobs::chat(tok, tokens),
            Kind::Completion => crate::logprobs::completion(tok, tokens, offset),
        }
    }

    fn call_json(&self, index: usize, c: &ToolCall) -> Value {
        let id = if c.id.is_empty() { format!("{}-{index}", self.call_prefix) } else { c.id.clone() };
        json!({"index": index, "id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
    }
}

/// What token `id` writes alone, as [`Reply::feed`] keeps it: its text from the tokenizer's
/// table of token texts (the one the decoder reads; built when the model loaded, for
/// [`ModelInfo::max_token_bytes`](crate::job::ModelInfo::max_token_bytes)), so a token is not
/// decoded again; only an id the table has no text for (bytes that are no whole UTF-8 text
/// alone) is decoded, lossily as before.
fn written(tok: &Tokenizer, id: u32) -> std::borrow::Cow<'_, [u8]> {
    match tok.token_texts().get(id as usize) {
        Some(Some(text)) => text.as_bytes().into(),
        _ => tok.decode_bytes(&[id]).unwrap_or_default().into(),
    }
}

/// The markup written so far as text: its bytes are joined before they are read as UTF-8, so a
/// character split across tokens comes back whole.
fn take_text(raw: &mut Vec<u8>) -> String {
    String::from_utf8_lossy(&std::mem::take(raw)).into_owned()
}

/// What every chunk and body of one response repeats.
#[derive(Debug, Clone)]
struct Shape {
    id: String,
    model: String,
    created: u64,
    kind: Kind,
    seed: u64,
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
        json!({
            "id": self.id, "object": self.object(streaming), "created": self.created, "model": self.model,
            "system_fingerprint": format!("k3-seed-{}", self.seed), "choices": choices,
        })
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
    let (mut text, mut reasoning, mut lps) = (String::new(), String::new(), Vec::new());
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta { text: t, reasoning: r, token, logprob } => {
                reply.log.token();
                reasoning.push_str(&r);
                lps.extend(logprob);
                let pieces = reply.feed(token, &t);
                reply.collect(pieces, &mut text);
            }
            Event::Failed(msg) => {
                reply.log.done("failed", 0, 0, 0);
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg));
            }
            // Only a streamed request asks for progress.
            Event::Progress(_) => {}
            Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, .. } => {
                let pieces = reply.finish();
                reply.collect(pieces, &mut text);
                let reason = reply.reason(finish);
                reply.log.done(reason, prompt_tokens, cached_tokens, completion_tokens);
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
                choice["logprobs"] =
                    if reply.want_logprobs { reply.logprobs(shape.kind, &lps, 0) } else { Value::Null };
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
        // Text as a content delta (the token's logprobs on its first), a finished call as a
        // tool_calls delta; a token whose text is held back still sends its logprobs.
        let mut offset = 0;
        let mut emit = |pieces: Vec<Piece>, reply: &mut Reply, lp: Option<TokenLogprob>| {
            let mut lp = lp.map(|l| reply.logprobs(shape.kind, &[l], offset));
            if lp.is_some() && !pieces.iter().any(|p| matches!(p, Piece::Text(_))) {
                let mut c = shape.chunk(Some(""), None);
                c["choices"][0]["logprobs"] = lp.take().unwrap_or_default();
                if !send(c) {
                    return false;
                }
            }
            pieces.into_iter().all(|p| match p {
                Piece::Text(t) => {
                    offset += t.len();
                    let mut c = shape.chunk(Some(&t), None);
                    if let Some(l) = lp.take() {
                        c["choices"][0]["logprobs"] = l;
                    }
                    send(c)
                }
                Piece::Call(c) => {
                    let delta = json!({"tool_calls": [reply.call_json(reply.made.len(), &c)]});
                    reply.made.push(c);
                    send(shape.envelope(true, json!([{"index": 0, "delta": delta, "finish_reason": null}])))
                }
            })
        };
        while let Some(e) = rx.recv().await {
            let alive = match e {
                Event::Progress(p) => send(progress_chunk(&shape, p)),
                Event::Delta { text, reasoning, token, logprob } => {
                    reply.log.token();
                    let thought = reasoning.is_empty()
                        || send(shape.envelope(
                            true,
                            json!([{"index": 0, "delta": {"reasoning_content": reasoning}, "finish_reason": null}]),
                        ));
                    let pieces = reply.feed(token, &text);
                    thought && emit(pieces, &mut reply, logprob)
                }
                Event::Failed(msg) => {
                    reply.log.done("failed", 0, 0, 0);
                    send(json!({"error": {"message": msg, "type": "server_error", "param": null, "code": 500}}));
                    break;
                }
                Event::Done { finish, prompt_tokens, cached_tokens, completion_tokens, .. } => {
                    let pieces = reply.finish();
                    emit(pieces, &mut reply, None);
                    reply.log.done(reply.reason(finish), prompt_tokens, cached_tokens, completion_tokens);
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

/// llama-server's progress chunk: no choices, and how far the prompt has been read.
fn progress_chunk(shape: &Shape, p: Progress) -> Value {
    let mut c = shape.envelope(true, json!([]));
    c["prompt_progress"] = json!({"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms});
    c
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_engine::config::Family;
    use k3_text::tokenizer::KIMI_PATTERN;

    /// o200k's ranks with K3's markup as special tokens.
    fn k3_tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let ranks = std::fs::read(dir.join("tokenizer/o200k_base.tiktoken")).unwrap();
        let names = ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"];
        let added: serde_json::Map<String, Value> =
            names.iter().enumerate().map(|(i, n)| ((200_000 + i).to_string(), json!({"content": n}))).collect();
        let cfg = serde_json::to_vec(&json!({"added_tokens_decoder": added})).unwrap();
        Tokenizer::from_tiktoken(&ranks, Some(&cfg), KIMI_PATTERN).unwrap()
    }

    /// A K3 reply (as K3's template writes calls) fed as the decoder shows it: the answer's text
    /// visible, its markup hidden.
    fn replied(calling: bool) -> (String, Vec<ToolCall>) {
        replied_with(calling, "Paris")
    }

    fn replied_with(calling: bool, city: &str) -> (String, Vec<ToolCall>) {
        let tok = k3_tokenizer();
        let text = "Checking.";
        let markup = format!(
            "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\
            <|open|>argument key=\"city\" type=\"string\"<|sep|>{city}<|close|>argument<|sep|><|close|>call<|sep|>\
            <|close|>tools<|sep|><|close|>message<|sep|>"
        );
        let cell = Arc::new(OnceLock::new());
        let calls = ToolCallReader::new(&tok, k3_generate::dialect(Family::KimiK3));
        let _ = cell.set(tok);
        let tok = cell.get().unwrap();
        let mut r = Reply {
            calls,
            calling,
            raw: Vec::new(),
            as_text: false,
            made: Vec::new(),
            tok: cell.clone(),
            call_prefix: "c".into(),
            ends_at_call: None,
            want_logprobs: false,
            log: RequestLog::new(crate::reqlog::LogFormat::Text, "test", None, Default::default()),
        };
        let mut out = String::new();
        let mut made = Vec::new();
        let shown = tok.encode(text).into_iter().map(|id| (id, true));
        let hidden = tok.encode_with_specials(&markup).into_iter().map(|id| (id, false));
        for (id, visible) in shown.chain(hidden) {
            let t = if visible { String::from_utf8(tok.decode_bytes(&[id]).unwrap()).unwrap() } else { String::new() };
            for p in r.feed(id, &t) {
                match p {
                    Piece::Text(t) => out.push_str(&t),
                    Piece::Call(c) => made.push(c),
                }
            }
        }
        for p in r.finish() {
            if let Piece::Text(t) = p {
                out.push_str(&t);
            }
        }
        (out, made)
    }

    /// Every id's text from the table is what decoding it alone gave (special tokens are their
    /// names in `feed`, never looked up here).
    #[test]
    fn a_token_written_from_the_table_is_its_decoded_text() {
        let tok = k3_tokenizer();
        for id in 0..tok.vocab() as u32 + 2 {
            if tok.special_name(id).is_none() {
                assert_eq!(*written(&tok, id), tok.decode_bytes(&[id]).unwrap_or_default(), "token {id}");
            }
        }
    }

    /// A call that comes back as text keeps a character its tokens split (the crab is four
    /// byte-level tokens of o200k): it used to come back as U+FFFD per piece.
    #[test]
    fn a_call_returned_as_text_keeps_characters_split_across_tokens() {
        let tok = k3_tokenizer();
        let crab = tok.encode("🦀");
        assert!(crab.iter().all(|&id| tok.token_texts()[id as usize].is_none()), "the crab's tokens are parts of it");
        let (text, made) = replied_with(false, "Zürich 🦀");
        assert!(made.is_empty());
        assert!(text.contains(">Zürich 🦀<"), "{text}");
    }

    #[test]
    fn a_k3_call_made_when_tools_may_not_be_called_comes_back_as_written() {
        let (text, made) = replied(true);
        assert_eq!((text.as_str(), made.len()), ("Checking.", 1), "with tools: text and a call");
        let (text, made) = replied(false);
        assert!(made.is_empty());
        assert!(
            text.starts_with("Checking.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\""),
            "{text}"
        );
        assert!(text.ends_with("<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"), "{text}");
    }
}
