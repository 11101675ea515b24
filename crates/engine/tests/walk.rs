//! The layer-at-a-time walk (calibration's pass) against the independent numpy K3
//! (fixtures/golden/tiny-k3): after every layer, every row's residual stream is the reference's,
//! for windows run side by side from empty states. Tolerance as in `golden.rs` (relative L2
//! 1e-4: float noise is ~1e-6, AttnRes amplifies summation-order differences through depth).

mod common;
use common::rel_l2;
use std::path::{Path, PathBuf};

use k3_engine::Engine;
use k3_format::Model;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

#[test]
fn each_layer_boundary_matches_the_reference() {
    let model = Model::open(fixtures().join("tiny-k3.waste")).unwrap();
    let engine = Engine::load(&model).unwrap();
    let g = fixtures().join("golden/tiny-k3/golden");
    let ids: Vec<u32> =
        std::fs::read_to_string(g.join("ids.txt")).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
    let trace: Vec<f32> = std::fs::read(g.join("trace.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let (n, hidden) = (ids.len(), model.manifest().architecture.hidden as usize);
    let layers = trace.len() / n / hidden;
    // The whole text, then its first five tokens as a second window (a causal model gives a
    // prefix the same states), and an empty window (dropped).
    let mut walk = engine.walk(vec![ids.clone(), ids[..5].to_vec(), Vec::new()]).unwrap();
    assert_eq!(walk.rows(), n + 5);
    for li in 0..layers {
        assert_eq!(engine.walk_layer(&mut walk).unwrap(), li);
        let want: Vec<f32> = (0..n).flat_map(|t| trace[(t * layers + li) * hidden..][..hidden].to_vec()).collect();
        let got = walk.hidden();
        let (whole, prefix) = (rel_l2(&got[..n * hidden], &want), rel_l2(&got[n * hidden..], &want[..5 * hidden]));
        assert!(whole < 1e-4 && prefix < 1e-4, "layer {li}: relative L2 error {whole:.3e}, prefix {prefix:.3e}");
    }
    assert!(walk.held_bytes() >= (4 * (n + 5) * hidden) as u64);
    let err = engine.walk_layer(&mut walk).unwrap_err().to_string();
    assert!(err.contains("has run all"), "{err}");
    let err = engine.walk(vec![vec![u32::MAX]]).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
}
