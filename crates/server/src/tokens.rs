//! llama-server's `/tokenize` and `/detokenize`: the model's own tokenizer over HTTP (for clients
//! that count or inspect tokens before they send a prompt).

use axum::Json;
use axum::extract::{Request, State};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::routes::{body, parse};
use crate::state::AppState;

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

/// The loaded model's tokenizer, or why there is none to use.
fn tokenizer(s: &AppState) -> Result<&k3_engine::tokenizer::Tokenizer, ApiError> {
    let (_, tok) = s.ready()?;
    tok.ok_or_else(|| ApiError::bad("content", "this model embeds no tokenizer: it is served token ids"))
}

/// `POST /tokenize`: `{"tokens": [ids]}`, or `[{"id", "piece"}]` with `with_pieces` (a piece
/// that is not whole UTF-8, part of a character, as its bytes).
pub async fn tokenize(State(s): State<AppState>, req: Request) -> Result<Json<Value>, ApiError> {
    let r: TokenizeRequest = parse(&body(&s, req).await?)?;
    if r.add_special {
        return Err(ApiError::bad(
            "add_special",
            "Kimi models take no special tokens around plain text (their chat template writes them): \
             send add_special false, or write the tokens in the content",
        ));
    }
    let tok = tokenizer(&s)?;
    let ids = if r.parse_special { tok.encode_with_specials(&r.content) } else { tok.encode(&r.content) };
    if !r.with_pieces {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let mut tokens = Vec::with_capacity(ids.len());
    for id in ids {
        let bytes = tok.decode_bytes(&[id]).map_err(|e| ApiError::bad("content", e.to_string()))?;
        let piece = match String::from_utf8(bytes) {
            Ok(text) => json!(text),
            Err(e) => json!(e.into_bytes()),
        };
        tokens.push(json!({"id": id, "piece": piece}));
    }
    Ok(Json(json!({ "tokens": tokens })))
}

/// `POST /detokenize`: `{"content": text}`; an id outside the vocabulary is a 400 naming it.
pub async fn detokenize(State(s): State<AppState>, req: Request) -> Result<Json<Value>, ApiError> {
    let r: DetokenizeRequest = parse(&body(&s, req).await?)?;
    let tok = tokenizer(&s)?;
    let bytes = tok.decode_bytes(&r.tokens).map_err(|e| ApiError::bad("tokens", e.to_string()))?;
    Ok(Json(json!({ "content": String::from_utf8_lossy(&bytes) })))
}
