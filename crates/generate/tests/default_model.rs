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
    let r = eval::perplexity(&engine, &ids[..n * window], &eval::Windows::new(window, 64), &mut |_| {}).unwrap();
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
    let e = eval::perplexity(&engine, &[5], &eval::Windows::new(256, 64), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("at least 2 tokens"), "{e}");
    let e = eval::perplexity(&engine, &[5, 6, 7], &eval::Windows::new(1, 64), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("window"), "{e}");
}

/// `--activations auto` on the trained default model, encoded the ways its rule tells apart: the
/// precision it picks adds at most a tenth of the KL the encoding's weights cost against the
/// unquantized model, and never more than 1e-3 nats (issue #57's rule). Measured over all 24,861
/// positions (`tools/quality/activation-rule.sh`, docs/EFFICIENCY.md "The quality rule"): an int4
/// trunk's weights cost 5.3e-3 and int8 everywhere adds 2.9e-4; MXFP4 experts with an int8 trunk
/// cost 1.2e-3 and bf16-trunk adds 8.3e-5; int4 experts with an int8 trunk cost 6.8e-4 and int8
/// experts add 3.5e-5 (bf16-trunk would add 9.9e-5: too much); an int8 trunk with bf16 experts
/// costs 3.2e-4 and runs exact (bf16-trunk would add a fifth). Here the first 32 windows. On a CPU without the int8 or bf16 kernels those products run exact: the
/// bound still holds, with nothing added. The MLA cache is the rule's too (`--kv-cache auto`:
/// int8 wherever products round, attended in integers; here in the absorbed form at every
/// position, so every score and weighted sum goes through them): what it adds is in `added`.
#[test]
fn auto_activations_add_at_most_a_tenth_of_what_the_weights_cost() {
    use k3_convert::{ExpertFormat, TrunkFormat};
    use k3_engine::{ActivationPrecision, EngineOptions};
    let source = Model::open(fixtures().join("default.waste")).unwrap();
    let ids = held_out_ids(&source);
    let ids = &ids[..32 * 256];
    let cut = eval::Windows::new(256, 256);
    fn load(model: &Model, activations: ActivationPrecision) -> Engine<'_> {
        Engine::load_with(model, EngineOptions { activations, ..EngineOptions::default() }).unwrap()
    }
    let reference = load(&source, ActivationPrecision::Exact);
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (ExpertFormat::Keep, TrunkFormat::Int4, ActivationPrecision::All),
        (ExpertFormat::Mxfp4, TrunkFormat::Int8, ActivationPrecision::Bf16Trunk),
        (ExpertFormat::Int4, TrunkFormat::Int8, ActivationPrecision::Experts),
        (ExpertFormat::Keep, TrunkFormat::Int8, ActivationPrecision::Exact),
    ];
    for (i, (experts, trunk, picks)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("m{i}"));
        let opts = k3_convert::ConvertOptions {
            experts,
            trunk,
            ..k3_convert::ConvertOptions::new(fixtures().join("default.waste"), &out)
        };
        k3_convert::convert(&opts, &mut |_| {}).unwrap();
        let model = Model::open(&out).unwrap();
        let exact = load(&model, ActivationPrecision::Exact);
        let auto = Engine::load_with(
            &model,
            EngineOptions {
                activations: ActivationPrecision::Auto,
                kv_cache: None,
                mla_form: k3_engine::MlaForm::Absorbed,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let weights = eval::agreement(&exact, &reference, ids, &cut, &mut |_| {}).unwrap().mean_kl();
        let added = eval::agreement(&auto, &exact, ids, &cut, &mut |_| {}).unwrap().mean_kl();
        eprintln!(
            "{experts:?} experts, {trunk:?} trunk: weights {weights:.2e} nats, {} adds {added:.2e}",
            picks.name()
        );
        assert!(
            added <= (weights / 10.0).min(1e-3),
            "{}: adds {added:.2e} to the weights' {weights:.2e}",
            picks.name()
        );
        if picks != ActivationPrecision::Exact && k3_quant::q8::available() {
            assert!(added > 0.0, "{}: the rounded kernels did not run", picks.name());
        }
        // The most rounding precision the rule allows, as measured over the whole text.
        assert_eq!(auto.activations(), picks, "{experts:?} experts, {trunk:?} trunk");
        let integers = k3_quant::cpu::level() != k3_quant::cpu::Level::Scalar;
        let cache = if picks == ActivationPrecision::Exact || !integers {
            k3_engine::KvCacheType::F32
        } else {
            k3_engine::KvCacheType::Int8
        };
        assert_eq!(auto.kv_cache(), cache, "{experts:?} experts, {trunk:?} trunk");
    }
}
