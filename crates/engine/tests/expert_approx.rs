//! The two measured approximations of the routed experts (HOBBIT's low-bit copies, Expert
//! Deferral) against transformers' Kimi-Linear patched to do the same
//! (`tools/golden/expert_approx.py`, fixtures/golden/tiny-kimi-linear-approx).
//!
//! Tolerance: relative L2 error below 1e-4, as for the unapproximated model (golden.rs). Each case
//! moves the logits 0.43-0.63 (relative L2) from the exact ones, so a wrong choice of experts,
//! bits or layer shows thousands of times over the tolerance.

mod common;
use common::rel_l2;
use std::path::{Path, PathBuf};

use k3_engine::{Engine, EngineOptions, ExpertApprox, RoundedCopies};
use k3_format::Model;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The logits, or the error's text.
fn logits(approx: ExpertApprox, ids: &[u32]) -> Result<Vec<f32>, String> {
    let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
    let engine =
        Engine::load_with(&model, EngineOptions { approx, ..EngineOptions::default() }).map_err(|e| e.to_string())?;
    engine.forward(&mut engine.session(), ids, None).map_err(|e| e.to_string())
}

#[test]
fn approximations_match_transformers_patched_alike() {
    let g = fixtures().join("golden/tiny-kimi-linear");
    let ids: Vec<u32> = std::fs::read_to_string(g.join("golden/ids.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let exact = f32s(&g.join("golden/logits.f32"));
    let low = |experts, bits| ExpertApprox { low_bit_copies: Some(RoundedCopies { experts, bits }), defer: 0 };
    let cases = [
        ("defer-1", ExpertApprox { low_bit_copies: None, defer: 1 }),
        ("defer-2", ExpertApprox { low_bit_copies: None, defer: 2 }),
        ("low-bit-2-bits-2", low(2, 2)),
        ("low-bit-3-bits-3", low(3, 3)),
    ];
    for (name, approx) in cases {
        let want = f32s(&fixtures().join(format!("golden/tiny-kimi-linear-approx/{name}.f32")));
        // Chunks of one token: deferral and copies act per token, whatever the chunk.
        for chunk in [ids.len(), 1] {
            let got: Vec<f32> = if chunk == 1 {
                let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
                let engine = Engine::load_with(&model, EngineOptions { approx, ..EngineOptions::default() }).unwrap();
                let mut s = engine.session();
                ids.iter().flat_map(|&t| engine.forward(&mut s, &[t], None).unwrap()).collect()
            } else {
                logits(approx, &ids).unwrap()
            };
            let e = rel_l2(&got, &want);
            eprintln!("{name}, chunks of {chunk}: relative L2 error {e:.3e} (from exact {:.3})", rel_l2(&got, &exact));
            assert!(e < 1e-4, "{name}: relative L2 error {e}");
            assert!(rel_l2(&got, &exact) > 0.1, "{name} changed nothing");
        }
    }
}

#[test]
fn approximations_the_model_cannot_take_are_refused() {
    let ids = [1u32, 2, 3];
    let refused = |approx: ExpertApprox, says: &str| {
        let e = logits(approx, &ids).unwrap_err();
        assert!(e.contains(says), "{e}");
    };
    // The model routes 4 experts a token: one stays exact and on time.
    refused(ExpertApprox { low_bit_copies: None, defer: 4 }, "deferred experts 4: each token uses 4 routed experts");
    refused(ExpertApprox { low_bit_copies: Some(RoundedCopies { experts: 4, bits: 2 }), defer: 0 }, "give 1 to 3");
    refused(
        ExpertApprox { low_bit_copies: Some(RoundedCopies { experts: 2, bits: 1 }), defer: 0 },
        "1 bits: give 2 to 8",
    );
    let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
    let opts = EngineOptions {
        experts_per_token: Some(2),
        approx: ExpertApprox { low_bit_copies: None, defer: 2 },
        ..EngineOptions::default()
    };
    let e = Engine::load_with(&model, opts).unwrap_err().to_string();
    assert!(e.contains("each token uses 2 routed experts"), "{e}");
}

/// The golden prompt.
fn golden_ids() -> Vec<u32> {
    std::fs::read_to_string(fixtures().join("golden/tiny-kimi-linear/golden/ids.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

/// The golden tiny Kimi-Linear converted with `--experts int2`, in `dir`.
fn int2_copies(dir: &Path) -> Model {
    let g = fixtures().join("golden/tiny-kimi-linear");
    let opts = k3_convert::ConvertOptions {
        experts: k3_convert::ExpertFormat::Int2,
        ..k3_convert::ConvertOptions::new(&g, dir.join("int2"))
    };
    k3_convert::convert(&opts, &mut |_| {}).unwrap();
    Model::open(dir.join("int2")).unwrap()
}

/// A model converted with `--experts int2` (HOBBIT's copies, as a whole model) runs on the int2
/// kernels and computes what transformers computes with every expert rounded alike.
#[test]
fn int2_experts_match_transformers_rounded_alike() {
    let dir = tempfile::tempdir().unwrap();
    let model = int2_copies(dir.path());
    assert_eq!(model.manifest().expert_layouts[0].matrices[0].encoding, k3_format::Encoding::Int2Group { group: 32 });
    let engine = Engine::load(&model).unwrap();
    let logits = engine.forward(&mut engine.session(), &golden_ids(), None).unwrap();
    let e = rel_l2(&logits, &f32s(&fixtures().join("golden/tiny-kimi-linear-approx/int2-experts.f32")));
    eprintln!("int2 experts: relative L2 error {e:.3e}");
    assert!(e < 1e-4, "relative L2 error {e}");
}

/// HOBBIT in the decode path: from a cold cache, one chunk reads an expert's int2 copy only when
/// it is among the 2 lightest of every token that chose it, as transformers computes with the
/// same rule (`hobbit-chunk-2`). The same prompt again finds those copies in the cache.
#[test]
fn low_bit_copies_are_read_for_light_misses_as_transformers_computes() {
    let dir = tempfile::tempdir().unwrap();
    let copies = std::sync::Arc::new(int2_copies(dir.path()));
    let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
    let opts = EngineOptions {
        low_bit_copies: Some(k3_engine::LowBitCopies { model: copies, experts: 2 }),
        lookahead: false,
        ..EngineOptions::default()
    };
    let engine = Engine::load_with(&model, opts).unwrap();
    let ids = golden_ids();
    let mut s = engine.session();
    let logits = engine.forward(&mut s, &ids, None).unwrap();
    let want = f32s(&fixtures().join("golden/tiny-kimi-linear-approx/hobbit-chunk-2.f32"));
    let e = rel_l2(&logits, &want);
    eprintln!(
        "HOBBIT, one chunk from cold: relative L2 error {e:.3e}, {} of {} experts low-bit",
        s.stats.experts_low_bit, s.stats.experts_computed
    );
    assert!(e < 1e-4, "relative L2 error {e}");
    assert!(s.stats.experts_low_bit > 0 && s.stats.experts_low_bit < s.stats.experts_computed);
    let mut again = engine.session();
    assert_eq!(engine.forward(&mut again, &ids, None).unwrap(), logits, "the cache holds the same records");
}

#[test]
fn copies_of_another_model_are_refused() {
    let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
    let other = std::sync::Arc::new(Model::open(fixtures().join("tiny-k3.waste")).unwrap());
    let opts = EngineOptions {
        low_bit_copies: Some(k3_engine::LowBitCopies { model: other, experts: 2 }),
        ..EngineOptions::default()
    };
    let e = Engine::load_with(&model, opts).unwrap_err().to_string();
    assert!(e.contains("low-bit copies: their") && e.contains("copies of another model"), "{e}");
}
