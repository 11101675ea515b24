//! Shared by k3-text's tests.

use std::path::Path;

use k3_text::tokenizer::{KIMI_PATTERN, Tokenizer};

/// o200k ranks with Kimi's chat markers (K3's XTML, the `im_` turns, the tool-call markers) as
/// special tokens: Kimi's tokenizer shape on a vocabulary the fixtures hold.
#[allow(dead_code)]
pub fn kimi_tokenizer() -> Tokenizer {
    let ranks =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer/o200k_base.tiktoken"))
            .unwrap();
    let names = [
        "[BOS]",
        "[EOS]",
        "<|end_of_msg|>",
        "<|open|>",
        "<|close|>",
        "<|sep|>",
        "<|im_user|>",
        "<|im_assistant|>",
        "<|im_system|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ];
    let added: serde_json::Map<String, serde_json::Value> =
        names.iter().enumerate().map(|(i, n)| ((200_000 + i).to_string(), serde_json::json!({"content": n}))).collect();
    let cfg = serde_json::to_vec(&serde_json::json!({"added_tokens_decoder": added})).unwrap();
    Tokenizer::from_tiktoken(&ranks, Some(&cfg), KIMI_PATTERN).unwrap()
}
