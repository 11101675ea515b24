//! The embedded default model (`fixtures/default.waste`, a small Kimi-Linear trained by
//! `tools/train/train_kimi_linear.py`) scored by the engine against the trainer's own numbers:
//! stock `transformers` KimiLinearForCausalLM loading the BF16 checkpoint in f32
//! (`fixtures/default-model/metrics.json`, written by the trainer, not by this project's engine).
//!
//! Tolerance: each window's summed NLL within 1e-5 relative. The two sides differ only in f32
//! summation order (measured agreement ~1e-9 relative per window); a real defect — a dropped
//! routed scaling factor, a wrong gate, an off-by-one in the window — moves a window's NLL by
//! percents.

use std::path::{Path, PathBuf};

use k3_engine::Engine;
use k3_format::Model;
use k3_generate::eval;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn metrics() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(fixtures().join("default-model/metrics.json")).unwrap()).unwrap()
}

fn held_out_ids(model: &Model) -> Vec<u32> {
    let tok = k3_generate::model_tokenizer(model).expect("the default model embeds its tokenizer").unwrap();
    tok.encode(&std::fs::read_to_string(fixtures().join("default-model/heldout.txt")).unwrap())
}

#[test]
fn held_out_windows_score_as_the_trainer_scored_them() {
    let m = metrics();
    let model = Model::open(fixtures().join("default.waste")).unwrap();
    let ids = held_out_ids(&model);
    // The tokenizer (Rust `tokenizers` over the embedded tokenizer.json) splits the text as the
    // trainer's Python `tokenizers` did.
    assert_eq!(ids.len() as u64, m["heldout_tokens"].as_u64().unwrap());
    let window = m["eval_window"].as_u64().unwrap() as usize;
    let want: Vec<f64> = m["window_nll"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let engine = Engine::load(&model).unwrap();
    // The first 6 windows (1,530 scored tokens) keep the test quick in the dev profile; the
    // whole file is `k3-cli perplexity` (fixtures/default-model/README.md).
    let n = 6;
    let r = eval::perplexity(&engine, &ids[..n * window], window, 64, &mut |_| {}).unwrap();
    assert_eq!(r.windows.len(), n);
    for (i, (got, want)) in r.windows.iter().zip(&want).enumerate() {
        assert_eq!(got.scored, window - 1);
        let rel = (got.nll - want).abs() / want.abs();
        assert!(rel < 1e-5, "window {i}: engine NLL {} vs trainer {want} (relative {rel:.2e})", got.nll);
    }
    // And the model is trained: far below the uniform guess over its vocabulary.
    let uniform = (engine.vocab() as f64).ln();
    assert!(r.mean_nll() < 0.6 * uniform, "mean NLL {} vs uniform {uniform}", r.mean_nll());
}

#[test]
fn too_short_a_text_or_window_is_refused() {
    let model = Model::open(fixtures().join("default.waste")).unwrap();
    let engine = Engine::load(&model).unwrap();
    let e = eval::perplexity(&engine, &[5], 256, 64, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("at least 2 tokens"), "{e}");
    let e = eval::perplexity(&engine, &[5, 6, 7], 1, 64, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("window"), "{e}");
}

/// Rounded activations on the trained default model, converted as it runs fast (MXFP4 experts,
/// int8 trunk): against the same model with exact activations over the held-out text, the
/// issue's bar for a default, mean KL <= 1e-4 nats and top-1 agreement >= 0.995. Measured over
/// all 24,861 positions: int8 experts KL 3.1e-5, top-1 0.998; with the trunk's batches on bf16
/// (the default of generate, chat and serve) KL 8.4e-5, top-1 0.997. Here the first 40 windows.
#[test]
fn rounded_activations_keep_the_default_models_predictions() {
    use k3_engine::{ActivationPrecision, EngineOptions};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("mxfp4-int8");
    let opts = k3_convert::ConvertOptions {
        experts: k3_convert::ExpertFormat::Mxfp4,
        trunk: k3_convert::TrunkFormat::Int8,
        ..k3_convert::ConvertOptions::new(fixtures().join("default.waste"), &out)
    };
    k3_convert::convert(&opts, &mut |_| {}).unwrap();
    let model = Model::open(&out).unwrap();
    let ids = held_out_ids(&model);
    let ids = &ids[..40 * 256];
    let load =
        |activations| Engine::load_with(&model, EngineOptions { activations, ..EngineOptions::default() }).unwrap();
    let exact = load(ActivationPrecision::Exact);
    let mut kl = Vec::new();
    for act in [ActivationPrecision::Experts, ActivationPrecision::Bf16Trunk] {
        let g = eval::agreement(&load(act), &exact, ids, 256, 256, &mut |_| {}).unwrap();
        eprintln!("{}: mean KL {:.2e} nats, top-1 agreement {:.4}", act.name(), g.mean_kl(), g.top1_rate());
        assert!(g.mean_kl() <= 1e-4, "{}: mean KL {}", act.name(), g.mean_kl());
        assert!(g.top1_rate() >= 0.995, "{}: top-1 agreement {}", act.name(), g.top1_rate());
        kl.push(g.mean_kl());
    }
    if k3_quant::q8::available() {
        assert!(kl[0] > 0.0, "the int8 kernels did not run");
    }
    if k3_quant::bf16dot::takes(256) {
        assert!(kl[1] != kl[0], "the bf16 kernels did not run");
    }
}
