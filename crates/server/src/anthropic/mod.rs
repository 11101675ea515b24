//! Anthropic's Messages API over the same scheduler as the OpenAI one: `POST /v1/messages`
//! (whole or streamed as Anthropic's SSE) and `POST /v1/messages/count_tokens`, for the clients
//! that speak only Anthropic's API (Claude Code, the `anthropic` SDKs). A body is translated
//! into the `/v1/chat/completions` body ([`request`]) and checked and tokenized by the same
//! rules; errors come in Anthropic's shape, naming the field as the client wrote it.

mod blocks;
mod fields;
mod reply;
pub mod request;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Json;
use axum::extract::{Extension, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use serde_json::value::RawValue;

use crate::answer::{self, Kind};
use crate::api::ChatRequest;
use crate::error::{ApiError, Shape};
use crate::job::ModelInfo;
use crate::request::{Prepared, prepared};
use crate::state::AppState;
use k3_generate::cache::Scope;
use k3_text::tokenizer::Tokenizer;
use request::{Route, Thinking, Translated};

/// The answer, or the error as Anthropic's clients read it.
fn either(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| e.shaped(Shape::Anthropic))
}

/// `POST /v1/messages`.
pub async fn messages(State(s): State<AppState>, Extension(scope): Extension<Scope>, req: Request) -> Response {
    let (stop_bytes, beginnings) = (s.stop_bytes, s.beginnings.clone());
    either(
        async {
            let omit = Arc::new(AtomicBool::new(false));
            let omitted = omit.clone();
            let p = prepared(&s, req, move |raw: Box<RawValue>, info, tok| {
                let tok = tok.ok_or_else(|| ApiError::bad("messages", "this model embeds no tokenizer"))?;
                let t = request::translate(raw.get(), Route::Messages, info.about.thinking)?;
                omitted.store(t.omit_thinking, Ordering::Relaxed);
                let mut p = prepare(&t, tok, info, stop_bytes, &beginnings)?;
                if let Thinking::Budget(b) = t.thinking {
                    // Anthropic's budget: at most `b` tokens of thinking, within max_tokens.
                    p.params.max_thinking = Some(b);
                    p.params.max_tokens_counts_thinking = true;
                }
                Ok(p)
            })
            .await?;
            let how =
                reply::Answer { stream: p.stream, prompt: p.prompt.len(), omit_thinking: omit.load(Ordering::Relaxed) };
            reply::answer(answer::submit(&s, p, Kind::Chat, scope)?, how).await
        }
        .await,
    )
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would run it, each
/// image at the positions it takes.
pub async fn count_tokens(State(s): State<AppState>, req: Request) -> Response {
    let (stop_bytes, beginnings) = (s.stop_bytes, s.beginnings.clone());
    let processor = s.image_processor.clone();
    either(
        async {
            let tok_cell = s.tok.clone();
            let p = prepared(&s, req, move |raw: Box<RawValue>, info, tok| {
                let tok = tok.ok_or_else(|| ApiError::bad("messages", "this model embeds no tokenizer"))?;
                let t = request::translate(raw.get(), Route::CountTokens, info.about.thinking)?;
                prepare(&t, tok, info, stop_bytes, &beginnings)
            })
            .await?;
            let tok = tok_cell.get().ok_or_else(|| ApiError::bad("messages", "this model embeds no tokenizer"))?;
            let mut n = p.prompt.len();
            for img in &p.images {
                n += image_extra(tok, processor.get(), img.header.width, img.header.height, &img.field)?;
            }
            Ok(Json(json!({"input_tokens": n})).into_response())
        }
        .await,
    )
}

/// The tokens an image adds beyond its placeholder, framed as `k3_generate::media::expand`
/// frames it: `<|media_begin|>image WxH<|media_content|>`, one position per merged patch
/// group, `<|media_end|>`.
fn image_extra(
    tok: &Tokenizer,
    processor: Option<&k3_vision::ProcessorConfig>,
    width: u32,
    height: u32,
    field: &str,
) -> Result<usize, ApiError> {
    let p = processor.ok_or_else(|| ApiError::bad(field, "this model reads no images"))?;
    let layout = k3_vision::Layout::of(width, height, p).map_err(|e| ApiError::bad(field, e.to_string()))?;
    let begin = tok.encode_with_specials(&format!("<|media_begin|>image {width}x{height}<|media_content|>"));
    Ok(begin.len() + layout.positions)
}

/// The translated body checked and tokenized as `/v1/chat/completions` would, its errors naming
/// the Anthropic fields.
fn prepare(
    t: &Translated,
    tok: &Tokenizer,
    info: &ModelInfo,
    stop_bytes: usize,
    beginnings: &crate::resume_points::Beginnings,
) -> Result<Prepared, ApiError> {
    let r: ChatRequest = serde_json::from_str(&t.body)
        .map_err(|e| ApiError::bad("body", format!("the request is not a valid request: {e}")))?;
    r.prepare(tok, info, stop_bytes, beginnings).map_err(|e| too_long(t.renames.rename(e), info))
}

/// A prompt the context cannot hold, in the words Anthropic's API uses (Claude Code compacts the
/// conversation on `prompt is too long: N tokens > M maximum`); M is the longest prompt that
/// leaves a token of room.
fn too_long(e: ApiError, info: &ModelInfo) -> ApiError {
    let first_number =
        |m: &str| m.split(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).and_then(|w| w.parse::<u64>().ok());
    let most = info.context.saturating_sub(1);
    let tokens = if e.code == Some("context_length_exceeded") {
        first_number(&e.message)
    } else if e.param.as_deref() == Some("messages") && e.message.contains("bytes of text") {
        // Refused before tokenizing: at least this many tokens.
        first_number(&e.message).map(|bytes| bytes.div_ceil(info.max_token_bytes.max(1) as u64))
    } else {
        None
    };
    match tokens {
        // No field before it: the message starts as Anthropic's does.
        Some(n) => ApiError::new(StatusCode::BAD_REQUEST, format!("prompt is too long: {n} tokens > {most} maximum")),
        None => e,
    }
}
