//! A synthetic model routed by the K3-like process (`synth` preset `k3-routing-tiny`): the engine
//! routes each row exactly as the process says for its tokens (checked against the process run
//! directly, not through the engine), whether the prompt is fed in one chunk, token by token, or
//! batched beside another sequence.

use std::path::PathBuf;

use k3_engine::{Engine, Model, Seq, Session};
use k3_router::RouterConfig;
use k3_router::synthetic::{K3Like, RowContext};

mod common;

fn model() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    common::synthetic(&DIR, "k3-routing-tiny")
}

/// The trace as (position, layer) -> experts, sorted.
fn routes(s: &Session) -> Vec<(usize, u32, Vec<u32>, Vec<f32>)> {
    let mut t: Vec<_> =
        s.routing_trace.clone().unwrap().into_iter().map(|r| (r.position, r.layer, r.experts, r.weights)).collect();
    t.sort_by_key(|r| (r.0, r.1));
    t
}

#[test]
fn the_engine_routes_as_the_process_does_however_the_rows_are_fed() {
    let model = Model::open(model()).unwrap();
    let engine = Engine::load(&model).unwrap();
    let ids: Vec<u32> = (0..150u32).map(|i| (i * 7919 + 13) % 512).collect();
    let fresh = || {
        let mut s = engine.session();
        s.routing_trace = Some(Vec::new());
        s
    };
    let mut whole = fresh();
    engine.forward(&mut whole, &ids, None).unwrap();
    let mut one_by_one = fresh();
    for &id in &ids {
        engine.forward(&mut one_by_one, &[id], None).unwrap();
    }
    let (mut a, mut b) = (fresh(), engine.session());
    let other: Vec<u32> = (0..40u32).map(|i| (i * 31 + 5) % 512).collect();
    engine
        .forward_batch(&mut [
            Seq::new(&mut a, &ids, k3_engine::Logits::Last),
            Seq::new(&mut b, &other, k3_engine::Logits::Last),
        ])
        .unwrap();
    let got = routes(&whole);
    assert_eq!(got.len(), ids.len() * 3, "every row of the 3 MoE layers");
    assert_eq!(routes(&one_by_one), got);
    assert_eq!(routes(&a), got);
    // The process itself, from the token ids alone.
    let process = K3Like::new(&RouterConfig::new(896, 16), 37);
    let cfg = RouterConfig::new(896, 16);
    for (position, layer, experts, weights) in &got {
        let id = |back: usize| position.checked_sub(back).map(|p| ids[p]);
        let segment_ids =
            std::array::from_fn(|phase| ids[K3Like::segment_start(phase as u32, *position as u64) as usize]);
        let row = RowContext { position: *position as u64, ids: [id(0), id(1), id(2)], segment_ids };
        let mut r = k3_router::Routing::default();
        process.route(&cfg, *layer, &row, &mut r);
        assert_eq!((&r.experts, &r.weights), (experts, weights), "position {position}, layer {layer}");
    }
}

/// Top-k reduction on the K3-like process: each row keeps the `n` heaviest of the experts the
/// process chose for it (the process run directly), at the same total weight; `n` equal to the
/// model's top-k changes nothing, and a larger `n` or 0 is refused by name.
#[test]
fn experts_per_token_keeps_the_heaviest_of_the_process_choice() {
    let model = Model::open(model()).unwrap();
    let cfg = Engine::load(&model).unwrap().config().clone();
    let k = cfg.experts_per_token as usize;
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 31 + 5) % 512).collect();
    let run = |n: Option<usize>| {
        let opts = k3_engine::EngineOptions { experts_per_token: n, ..Default::default() };
        let engine = Engine::load_with(&model, opts).unwrap();
        let mut s = engine.session();
        s.routing_trace = Some(Vec::new());
        let logits = engine.forward(&mut s, &ids, None).unwrap();
        (routes(&s), logits)
    };
    let (full, full_logits) = run(None);
    let (same, same_logits) = run(Some(k));
    assert_eq!(full, same);
    assert_eq!(full_logits, same_logits);
    let (half, half_logits) = run(Some(k / 2));
    assert_ne!(full_logits, half_logits);
    for ((_, _, e, w), (_, _, he, hw)) in full.iter().zip(&half) {
        let mut order: Vec<usize> = (0..e.len()).collect();
        order.sort_by(|&a, &b| w[b].total_cmp(&w[a]).then(e[a].cmp(&e[b])));
        let heaviest: Vec<u32> = order[..k / 2].iter().map(|&i| e[i]).collect();
        assert_eq!(he, &heaviest);
        let (total, kept): (f32, f32) = (w.iter().sum(), hw.iter().sum());
        assert!((total - kept).abs() < 1e-4 * total, "{total} vs {kept}");
    }
    for bad in [0, k + 1] {
        let opts = k3_engine::EngineOptions { experts_per_token: Some(bad), ..Default::default() };
        let Err(err) = Engine::load_with(&model, opts).map(|_| ()) else { panic!("{bad} experts per token accepted") };
        let err = err.to_string();
        assert!(
            err.contains(&format!("experts per token {bad}")) && err.contains(&format!("routes each token to {k}")),
            "{err}"
        );
    }
}
