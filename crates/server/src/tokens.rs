//! llama-server's `/tokenize` and `/detokenize`: the model's own tokenizer over HTTP (for clients
//! that count or inspect tokens before they send a prompt).
//!
//! Bounded like prompts: text of at most what a context can hold (the context times the longest
//! token's bytes), at most a context of tokens in or out. The work (parsing, tokenizing, writing
//! the answer) runs on a blocking thread, at most [`AT_ONCE`] such jobs together, so `/health`
//! and generation never wait behind it and all of them together hold a bounded amount of memory.
//! The answer is written straight from typed rows (an id and its piece each), never a JSON tree
//! per token: `json!({"id", "piece"})` per token cost about 750 bytes (a map node, two key
//! strings, the values), which made an 8 MB text with pieces take gigabytes.

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use k3_text::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::job::ModelInfo;
use crate::request::{body, parse};
use crate::state::AppState;

/// Tokenizer jobs running at once at most; more wait their turn (on no thread).
const AT_ONCE: usize = 2;

static RUNNING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(AT_ONCE);

/// `POST /tokenize` as llama-server takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    content: String,
    /// Add the model's special tokens around the text (llama-server's BOS).
    #[serde(default)]
    add_special: bool,
    /// Read special-token strings such as `<|im_end|>` in the text as those tokens (default).
    #[serde(default = "yes")]
    parse_special: bool,
    /// Each token with its text.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `{"tokens": [...]}`: ids, or ids with their pieces.
#[derive(Serialize)]
struct Tokens<T> {
    tokens: Vec<T>,
}

/// A token with its text (`with_pieces`).
#[derive(Serialize)]
struct Piece {
    id: u32,
    piece: PieceText,
}

/// A piece as text, or as its bytes when they are not whole UTF-8 (part of a character).
#[derive(Serialize)]
#[serde(untagged)]
enum PieceText {
    Text(String),
    Bytes(Vec<u8>),
}

/// Runs `work` on the request's body, the model's shape and its tokenizer, on a blocking thread
/// once one of the [`AT_ONCE`] turns is free; its JSON answer.
async fn off_workers<F>(s: &AppState, req: Request, work: F) -> Result<Response, ApiError>
where
    F: FnOnce(&[u8], &ModelInfo, &Tokenizer) -> Result<Vec<u8>, ApiError> + Send + 'static,
{
    let bytes = body(s, req).await?;
    s.ready()?;
    let turn = RUNNING.acquire().await.map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stopping"))?;
    let state = s.clone();
    let json = tokio::task::spawn_blocking(move || {
        // The turn is held by the work itself: a client that goes away does not free it early.
        let _turn = turn;
        let (info, tok) = state.ready()?;
        let tok =
            tok.ok_or_else(|| ApiError::bad("content", "this model embeds no tokenizer: it is served token ids"))?;
        work(&bytes, info, tok)
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "tokenizing failed"))??;
    Ok(([(header::CONTENT_TYPE, "application/json")], json).into_response())
}

/// `POST /tokenize`: `{"tokens": [ids]}`, or `[{"id", "piece"}]` with `with_pieces` (a piece
/// that is not whole UTF-8, part of a character, as its bytes).
pub async fn tokenize(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    off_workers(&s, req, |bytes, info, tok| {
        let r: TokenizeRequest = parse(bytes)?;
        if r.add_special {
            return Err(ApiError::bad(
                "add_special",
                "Kimi models take no special tokens around plain text (their chat template writes them): \
                 send add_special false, or write the tokens in the content",
            ));
        }
        let ids = encode(&r, info, tok)?;
        if !r.with_pieces {
            return to_json(&Tokens { tokens: ids });
        }
        let mut tokens = Vec::with_capacity(ids.len());
        for id in ids {
            let bytes = tok.decode_bytes(&[id]).map_err(|e| ApiError::bad("content", e.to_string()))?;
            let piece = String::from_utf8(bytes).map_or_else(|e| PieceText::Bytes(e.into_bytes()), PieceText::Text);
            tokens.push(Piece { id, piece });
        }
        to_json(&Tokens { tokens })
    })
    .await
}

/// The ids of `r.content`, refused (naming the limit) when the text or its tokens exceed what a
/// context holds.
fn encode(r: &TokenizeRequest, info: &ModelInfo, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let most = (info.context as usize).saturating_mul(info.max_token_bytes.max(1));
    if r.content.len() > most {
        return Err(ApiError::bad(
            "content",
            format!(
                "the content is {} bytes, more than /tokenize takes: {most} bytes (the context of {} tokens \
                 times the longest token's {} bytes)",
                r.content.len(),
                info.context,
                info.max_token_bytes
            ),
        ));
    }
    let ids = if r.parse_special { tok.encode_with_specials(&r.content) } else { tok.encode(&r.content) };
    if ids.len() as u64 > info.context {
        return Err(ApiError::bad(
            "content",
            format!("the content is {} tokens, more than the context of {} tokens", ids.len(), info.context),
        ));
    }
    Ok(ids)
}

/// `POST /detokenize`: `{"content": text}`; an id outside the vocabulary is a 400 naming it, more
/// ids than a context holds a 400 naming the limit.
pub async fn detokenize(State(s): State<AppState>, req: Request) -> Result<Response, ApiError> {
    off_workers(&s, req, |bytes, info, tok| {
        let r: DetokenizeRequest = parse(bytes)?;
        if r.tokens.len() as u64 > info.context {
            return Err(ApiError::bad(
                "tokens",
                format!("{} tokens are more than the context of {} tokens", r.tokens.len(), info.context),
            ));
        }
        let bytes = tok.decode_bytes(&r.tokens).map_err(|e| ApiError::bad("tokens", e.to_string()))?;
        to_json(&serde_json::json!({ "content": String::from_utf8_lossy(&bytes) }))
    })
    .await
}

fn to_json(v: &impl Serialize) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("writing the answer: {e}")))
}
