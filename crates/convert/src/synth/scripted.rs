//! A Kimi-Linear checkpoint whose weights make it say a script: answer any chat turn with a
//! thought between `<think>` tokens (as K2-Thinking does), a sentence and a call of the tool
//! `get_weather` in Kimi's tool-call markup, then end the turn.
//! It is how a tool-call round trip is tested end to end (server, reply parser, the `openai`
//! client) without a trained model that knows the markers.
//!
//! How: every layer's weights are zero, so the residual stream at the last layer is the token's
//! embedding; the script's tokens have one-hot embeddings in distinct dimensions and `lm_head`
//! maps each one to its successor, so greedy decoding follows the chain. The shapes come from a
//! real checkpoint (`base`: fixtures/golden/tiny-kimi-linear), the tokenizer is written here: the
//! 256 bytes, the script's three text tokens, and Kimi's special tokens.

use std::path::Path;

use half::bf16;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::ConvertError;

/// What the model reasons, between `<think>` and `</think>`, first.
pub const REASONING: &str = "The user wants the weather.";
/// What the model says before calling.
pub const REPLY: &str = "Let me check the weather.";
/// The call's id as Kimi's markup writes it.
pub const CALL_ID: &str = "functions.get_weather:0";
/// The call's arguments.
pub const ARGUMENTS: &str = "{\"city\": \"Paris\"}";

/// Kimi's `im_` chat and tool-call special tokens (and `[BOS]`, `[EOS]`).
pub const SPECIALS: [&str; 14] = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
];

/// Writes a byte-level tokenizer into checkpoint directory `dir` (`tiktoken.model`,
/// `tokenizer_config.json`): ids 0-255 the bytes, then `words` as whole tokens, then `specials`,
/// and the chat template if given: enough for text in and out of a tiny test model.
pub fn byte_tokenizer(
    dir: &Path,
    words: &[&str],
    specials: &[&str],
    chat_template: Option<&str>,
) -> Result<(), ConvertError> {
    use base64::Engine as _;
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(name), bytes).map_err(|e| ConvertError::io(&dir.join(name), e))
    };
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut ranks: Vec<String> = (0..=255u8).map(|b| format!("{} {b}", b64(&[b]))).collect();
    ranks.extend(words.iter().enumerate().map(|(i, w)| format!("{} {}", b64(w.as_bytes()), 256 + i)));
    write("tiktoken.model", (ranks.join("\n") + "\n").as_bytes())?;
    let first = 256 + words.len();
    let added: serde_json::Map<String, serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| ((first + i).to_string(), serde_json::json!({"content": s, "special": true})))
        .collect();
    let mut cfg = serde_json::json!({"added_tokens_decoder": added});
    if let Some(t) = chat_template {
        cfg["chat_template"] = t.into();
    }
    write("tokenizer_config.json", cfg.to_string().as_bytes())
}

/// Writes the checkpoint (config.json, model.safetensors, tiktoken.model,
/// tokenizer_config.json) into `out`, from the Kimi-Linear checkpoint `base`.
pub fn tool_caller(base: &Path, out: &Path) -> Result<(), ConvertError> {
    let words = [REASONING, REPLY, CALL_ID, ARGUMENTS];
    let id_of = |s: &str| -> u32 {
        match words.iter().position(|w| *w == s) {
            Some(i) => 256 + i as u32,
            None => 256 + words.len() as u32 + SPECIALS.iter().position(|x| *x == s).expect("a special") as u32,
        }
    };
    let chain: Vec<u32> = [
        "<|im_middle|>",
        "<think>",
        REASONING,
        "</think>",
        REPLY,
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        CALL_ID,
        "<|tool_call_argument_begin|>",
        ARGUMENTS,
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
        "<|im_end|>",
    ]
    .into_iter()
    .map(id_of)
    .collect();
    std::fs::create_dir_all(out).map_err(|e| ConvertError::io(out, e))?;
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(out.join(name), bytes).map_err(|e| ConvertError::io(&out.join(name), e))
    };

    byte_tokenizer(out, &words, &SPECIALS, None)?;

    let bad = |reason: String| ConvertError::Source { path: base.to_path_buf(), reason };
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("config.json")).map_err(|e| ConvertError::io(base, e))?)
            .map_err(|e| bad(format!("config.json: {e}")))?;
    config["bos_token_id"] = id_of("[BOS]").into();
    config["eos_token_id"] = id_of("[EOS]").into();
    config["pad_token_id"] = 0.into();
    write("config.json", config.to_string().as_bytes())?;

    let path = base.join("model.safetensors");
    let bytes = std::fs::read(&path).map_err(|e| ConvertError::io(&path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("model.safetensors: {e}")))?;
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let shape = view.shape().to_vec();
        let n: usize = shape.iter().product();
        let data = if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            let hidden = shape[1];
            if chain.len() > hidden || shape[0] <= *chain.iter().max().expect("a chain") as usize {
                return Err(bad(format!("{name} is {shape:?}: too small for the script")));
            }
            let mut w = vec![0f32; n];
            for (slot, pair) in chain.windows(2).enumerate() {
                // The embedding of a token is its slot; lm_head's row for its successor reads it.
                let row = if name == "lm_head.weight" { pair[1] } else { pair[0] };
                w[row as usize * hidden + slot] = 1.0;
            }
            w.into_iter().flat_map(|x| bf16::from_f32(x).to_le_bytes()).collect()
        } else if name.ends_with("norm.weight") {
            match view.dtype() {
                Dtype::BF16 => bf16::ONE.to_le_bytes().repeat(n),
                Dtype::F32 => 1f32.to_le_bytes().repeat(n),
                other => return Err(bad(format!("{name}: dtype {other:?}"))),
            }
        } else {
            vec![0u8; view.data().len()]
        };
        let dtype =
            if name.ends_with("embed_tokens.weight") || name == "lm_head.weight" { Dtype::BF16 } else { view.dtype() };
        tensors.push((name, dtype, shape, data));
    }
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| bad(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors"))
        .map_err(|e| bad(format!("writing model.safetensors: {e}")))
}
