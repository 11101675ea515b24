//! Log-probabilities in OpenAI's two shapes: chat's `{"content": [{"token", "logprob", "bytes",
//! "top_logprobs": [...]}]}` and completions' `{"tokens", "token_logprobs", "top_logprobs",
//! "text_offset"}`. The numbers are the model's own (log-softmax of its logits, before any
//! sampling setting), as OpenAI and vLLM report them.

use k3_text::tokenizer::Tokenizer;
use serde_json::{Map, Value, json};

use crate::job::TokenLogprob;

/// A token's text and bytes (its id when the model has no tokenizer).
fn piece(tok: Option<&Tokenizer>, id: u32) -> (String, Vec<u8>) {
    match tok.and_then(|t| t.decode_bytes(&[id]).ok()) {
        Some(b) => (String::from_utf8_lossy(&b).into_owned(), b),
        None => {
            let s = id.to_string();
            let b = s.clone().into_bytes();
            (s, b)
        }
    }
}

/// One token's entry in chat's `logprobs.content`.
pub fn chat_entry(tok: Option<&Tokenizer>, lp: &TokenLogprob) -> Value {
    let one = |id: u32, logprob: f32| {
        let (token, bytes) = piece(tok, id);
        json!({"token": token, "logprob": logprob, "bytes": bytes})
    };
    let mut e = one(lp.id, lp.logprob);
    e["top_logprobs"] = Value::Array(lp.top.iter().map(|&(i, l)| one(i, l)).collect());
    e
}

/// Chat's `logprobs` object for `tokens`.
pub fn chat(tok: Option<&Tokenizer>, tokens: &[TokenLogprob]) -> Value {
    json!({"content": tokens.iter().map(|t| chat_entry(tok, t)).collect::<Vec<_>>()})
}

/// Completions' `logprobs` object for `tokens`, whose text starts at byte `offset` of the answer.
pub fn completion(tok: Option<&Tokenizer>, tokens: &[TokenLogprob], mut offset: usize) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in tokens {
        let (text, _) = piece(tok, t.id);
        offsets.push(offset);
        offset += text.len();
        texts.push(text);
        lps.push(t.logprob);
        let top: Map<String, Value> = t.top.iter().map(|&(i, l)| (piece(tok, i).0, json!(l))).collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
