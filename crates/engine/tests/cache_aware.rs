//! Cache-aware routing (`EngineOptions::cache_aware`): a token's light experts the cache does not
//! hold are swapped for cached runners-up. Its result depends on what the cache holds, so no
//! reference computes it; these tests hold it to its purpose (fewer reads) and to its refusals. `k3_router::prefer_cached` has the unit test of the swap.

use std::path::{Path, PathBuf};

use k3_engine::{Engine, EngineOptions};
use k3_format::Model;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// 48 tokens: the golden prompt four times.
fn ids() -> Vec<u32> {
    let text = std::fs::read_to_string(fixtures().join("golden/tiny-kimi-linear/golden/ids.txt")).unwrap();
    let ids: Vec<u32> = text.split_whitespace().map(|t| t.parse().unwrap()).collect();
    ids.iter().cycle().take(48).copied().collect()
}

/// Decodes `ids` one at a time with a cache of a quarter of the experts: (bytes read, experts
/// swapped, the last logits).
fn decode(cache_aware: Option<usize>) -> (u64, u64, Vec<f32>) {
    let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
    let plan = *Engine::load(&model).unwrap().plan();
    let opts = EngineOptions {
        mem_budget: Some(plan.fixed_bytes() + 16 * plan.slot_bytes),
        lookahead: false,
        cache_aware,
        ..EngineOptions::default()
    };
    let engine = Engine::load_with(&model, opts).unwrap();
    let mut s = engine.session();
    let mut last = Vec::new();
    for &t in &ids() {
        last = engine.forward(&mut s, &[t], None).unwrap();
    }
    (s.stats.cache.bytes_read, s.stats.experts_rerouted, last)
}

#[test]
fn cached_runners_up_save_reads() {
    let (exact_bytes, none, exact_logits) = decode(None);
    assert_eq!(none, 0);
    let (bytes, swapped, logits) = decode(Some(2));
    eprintln!("cache-aware: {swapped} experts swapped, bytes read {bytes} against {exact_bytes}");
    assert!(swapped > 0, "nothing was swapped with a quarter of the experts cached");
    assert!(bytes < exact_bytes, "{bytes} bytes read, not fewer than {exact_bytes}");
    assert!(logits.iter().all(|v| v.is_finite()) && logits != exact_logits);
}

#[test]
fn cache_aware_routing_the_model_cannot_take_is_refused() {
    let model = Model::open(fixtures().join("tiny-kimi-linear.waste")).unwrap();
    let e = Engine::load_with(&model, EngineOptions { cache_aware: Some(4), ..EngineOptions::default() })
        .unwrap_err()
        .to_string();
    assert!(e.contains("cache-aware experts 4: each token uses 4 routed experts here; give 1 to 3"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let p = k3_convert::synth::preset("k3-routing-tiny").unwrap();
    k3_convert::synth::synth(&p, p.experts_default, dir.path(), &mut |_| {}).unwrap();
    let synthetic = Model::open(dir.path()).unwrap();
    let e = Engine::load_with(&synthetic, EngineOptions { cache_aware: Some(2), ..EngineOptions::default() })
        .unwrap_err()
        .to_string();
    assert!(e.contains("synthetic routing has none"), "{e}");
}
