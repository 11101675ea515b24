//! Shared by the engine's tests.

use std::path::Path;

use k3_engine::tokenizer::{KIMI_PATTERN, Tokenizer};

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

/// A synthetic preset written once per test binary into cargo's per-target scratch directory
/// (not a `TempDir` held by a static: statics are never dropped, so that leaked into /tmp), at
/// `cell`'s first use.
#[allow(dead_code)]
pub fn synthetic(cell: &'static std::sync::OnceLock<std::path::PathBuf>, name: &str) -> std::path::PathBuf {
    cell.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("synth-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        let p = k3_convert::synth::preset(name).unwrap();
        k3_convert::synth::synth(&p, p.experts_default, &dir, &mut |_| {}).unwrap();
        dir
    })
    .clone()
}

/// The relative L2 error of `a` against the reference `b` (the golden references' measure).
#[allow(dead_code)]
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}
