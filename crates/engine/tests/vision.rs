//! K3 with an image, end to end against references this project did not write
//! (`fixtures/golden/tiny-k3-vision`, `tools/golden/kimi_k3_vision.py`): the checkpoint converted
//! with its tower, the picture decoded, resized, patched and embedded (SGLang's MoonViT3d and
//! projector) and the prompt's logits with the image in place (WARP's PyTorch K3 oracle, which
//! reproduces the text golden to 3.3e-6). Tolerance: relative L2 1e-4, as for the text golden.

mod common;
use common::rel_l2;
use std::path::{Path, PathBuf};

use k3_engine::{Engine, Inserted, Seq};
use k3_format::Model;
use k3_vision::{DecodeLimits, decode};

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/tiny-k3-vision")
}

fn f32s(name: &str) -> Vec<f32> {
    let b = std::fs::read(golden().join("golden").join(name)).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn converted(dir: &Path) -> Model {
    let opts = k3_convert::ConvertOptions::new(golden(), dir.join("m"));
    let report = k3_convert::convert(&opts, &mut |_| {}).unwrap();
    assert!(report.ignored.is_empty(), "the tower is kept: {:?}", report.ignored);
    Model::open(dir.join("m")).unwrap()
}

/// The prompt rows of `pic`, `[positions, hidden]`: the tower run whole.
fn image_rows(engine: &Engine<'_>, pic: &k3_vision::Picture) -> Vec<f32> {
    engine.finish_image(engine.start_image(pic, 0).unwrap()).rows
}

#[test]
fn an_image_prompt_matches_the_references() {
    let dir = tempfile::tempdir().unwrap();
    let model = converted(dir.path());
    let engine = Engine::load(&model).unwrap();
    assert!(engine.sees());
    let pic = decode(&std::fs::read(golden().join("golden/picture.png")).unwrap(), &DecodeLimits::default()).unwrap();
    let layout = k3_vision::Layout::of(pic.width, pic.height, engine.image_processor().unwrap()).unwrap();
    assert_eq!(layout.positions, 20);
    let rows = image_rows(&engine, &pic);
    let e = rel_l2(&rows, &f32s("embeds.f32"));
    let ids: Vec<u32> = std::fs::read_to_string(golden().join("golden/ids.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let placeholder = engine.image_placeholder().unwrap();
    let at = ids.iter().position(|&t| t == placeholder).unwrap();
    let images = [Inserted { at, rows }];
    let mut session = engine.session();
    let mut seqs = [Seq::new(&mut session, &ids, k3_engine::Logits::All).with_images(&images, 0)];
    let logits = engine.forward_batch(&mut seqs).unwrap().pop().unwrap();
    let l = rel_l2(&logits, &f32s("logits.f32"));
    eprintln!("image rows relative L2 {e:.3e} (SGLang), logits {l:.3e} (WARP's oracle)");
    assert!(e < 1e-4, "image rows relative L2 {e}");
    assert!(l < 1e-4, "logits relative L2 {l}");
    // In chunks of 5 rows the image is split four ways: the last position's logits are the
    // reference's all the same.
    let mut split = engine.session();
    let mut last = Vec::new();
    for (i, c) in ids.chunks(5).enumerate() {
        last = engine.forward_last_with_images(&mut split, c, &images, i * 5).unwrap();
    }
    let want_last = &f32s("logits.f32")[(ids.len() - 1) * 512..];
    let s = rel_l2(&last, want_last);
    assert!(s < 1e-4, "chunked logits relative L2 {s}");
    // Without the image the logits move: the test can fail.
    let plain = engine.forward(&mut engine.session(), &ids, None).unwrap();
    assert!(rel_l2(&plain, &f32s("logits.f32")) > 1e-2);
}

/// What the CLI and server run: the trunk's batches, and so the tower's products, on bf16
/// activations (8 significant bits, a relative rounding of at most 2^-9 = 2e-3 per value): the
/// rows stay within 1e-2 of the f32 reference, and the logits with them.
#[test]
fn bf16_activations_stay_close() {
    let dir = tempfile::tempdir().unwrap();
    let model = converted(dir.path());
    let opts = k3_engine::EngineOptions {
        activations: k3_engine::ActivationPrecision::Bf16Trunk,
        ..k3_engine::EngineOptions::default()
    };
    let engine = Engine::load_with(&model, opts).unwrap();
    let pic = decode(&std::fs::read(golden().join("golden/picture.png")).unwrap(), &DecodeLimits::default()).unwrap();
    let rows = image_rows(&engine, &pic);
    let e = rel_l2(&rows, &f32s("embeds.f32"));
    eprintln!("bf16 activations: image rows relative L2 {e:.3e}");
    assert!(e < 1e-2, "{e}");
    // Not the f32 tower's bits where the CPU has bf16 products (elsewhere they stay exact).
    if k3_quant::bf16dot::available_at(k3_quant::cpu::level()) {
        assert!(e > 1e-5, "{e}");
    }
}

#[test]
fn misplaced_image_rows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = converted(dir.path());
    let engine = Engine::load(&model).unwrap();
    let d = 256;
    let ids = [5u32, 500, 500, 7];
    let bad = [
        (Inserted { at: 0, rows: vec![0.0; 2 * d] }, "instead of the image placeholder"),
        (Inserted { at: 1, rows: vec![0.0; 4 * d] }, "position 3 of an image carries token 7"),
        (Inserted { at: 1, rows: vec![0.0; d + 1] }, "whole"),
    ];
    let overlapping = [Inserted { at: 1, rows: vec![0.0; 2 * d] }, Inserted { at: 2, rows: vec![0.0; d] }];
    let mut session = engine.session();
    let mut seqs = [Seq::new(&mut session, &ids, k3_engine::Logits::All).with_images(&overlapping, 0)];
    let e = engine.forward_batch(&mut seqs).unwrap_err().to_string();
    assert!(e.contains("overlaps"), "{e}");
    for (img, want) in bad {
        let images = [img];
        let mut session = engine.session();
        let mut seqs = [Seq::new(&mut session, &ids, k3_engine::Logits::All).with_images(&images, 0)];
        let e = engine.forward_batch(&mut seqs).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
