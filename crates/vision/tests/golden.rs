//! The tiny K3 vision tower against its references (`fixtures/golden/tiny-k3-vision`, made by
//! `tools/golden/kimi_k3_vision.py`): the processor's resize byte for byte against Pillow 13,
//! the patches, the merged tower output and the projected rows against SGLang's
//! `KimiK3VisionTower` / `KimiK3MultiModalProjector` in f32. Tolerance: relative L2 1e-4 (the
//! issue's; float reordering gives ~1e-6).

use std::path::PathBuf;

use half::bf16;
use k3_quant::Matrix;
use k3_vision::tower::{BlockWeights, TowerWeights, tensors};
use k3_vision::{DecodeLimits, Layout, ProcessorConfig, Tower, VisionConfig, decode, patch_image};
use safetensors::SafeTensors;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/tiny-k3-vision")
}

fn f32s(name: &str) -> Vec<f32> {
    let b = std::fs::read(dir().join("golden").join(name)).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2)).sum();
    let den: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
    (num / den).sqrt()
}

fn configs() -> (VisionConfig, ProcessorConfig) {
    let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(dir().join("config.json")).unwrap()).unwrap();
    let v = VisionConfig::parse(&cfg["vision_config"], 256).unwrap();
    let p = ProcessorConfig::parse(&std::fs::read(dir().join("preprocessor_config.json")).unwrap(), &v).unwrap();
    (v, p)
}

#[test]
fn the_processor_resizes_as_pillow_and_patches_as_sglang() {
    let (_, p) = configs();
    let pic = decode(&std::fs::read(dir().join("golden/picture.png")).unwrap(), &DecodeLimits::default()).unwrap();
    let layout = Layout::of(pic.width, pic.height, &p).unwrap();
    assert_eq!(
        (layout.new_width, layout.new_height, layout.grid_h, layout.grid_w, layout.positions),
        (135, 101, 8, 10, 20)
    );
    let resized = k3_vision::resize::bicubic_resize(&pic, layout.new_width, layout.new_height);
    let want = std::fs::read(dir().join("golden/resized.u8")).unwrap();
    let differ = resized.rgb.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!((resized.rgb.len(), differ), (want.len(), 0), "bytes that differ from Pillow's resize");
    let got = patch_image(&pic, &p).unwrap();
    let err = rel_l2(&got.values, &f32s("pixels.f32"));
    assert!(err < 1e-6, "patches rel-L2 {err:e}");
}

/// Owned bf16 tensors of the tower's shard, by name.
fn load() -> std::collections::HashMap<String, (Vec<bf16>, Vec<usize>)> {
    let bytes = std::fs::read(dir().join("model-00002-of-00002.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| {
            let v = t.data().chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]])).collect();
            (n, (v, t.shape().to_vec()))
        })
        .collect()
}

#[test]
fn the_tower_and_projector_match_sglang() {
    let (cfg, p) = configs();
    let t = load();
    // Every tensor the config implies is in the shard with that shape, and nothing else is.
    let expected = tensors(&cfg);
    assert_eq!(expected.len(), t.len());
    for (name, shape, _) in &expected {
        let got: Vec<u64> = t[name].1.iter().map(|&s| s as u64).collect();
        assert_eq!(&got, shape, "{name}");
    }
    let mat = |n: &str| {
        let (v, s) = &t[n];
        let rows = s[0];
        Matrix::bf16(v, rows, v.len() / rows).unwrap()
    };
    let vals = |n: &str| t[n].0.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    let blocks = (0..cfg.vt_num_hidden_layers)
        .map(|i| {
            let n = |s: &str| format!("vision_tower.encoder.blocks.{i}.{s}");
            BlockWeights {
                norm0: vals(&n("norm0.weight")),
                norm1: vals(&n("norm1.weight")),
                wqkv: mat(&n("wqkv.weight")),
                wo: mat(&n("wo.weight")),
                fc0: mat(&n("mlp.fc0.weight")),
                fc1: mat(&n("mlp.fc1.weight")),
            }
        })
        .collect();
    let w = TowerWeights {
        patch_embed: mat("vision_tower.patch_embed.proj.weight"),
        pos_emb: vals("vision_tower.patch_embed.pos_emb.weight"),
        blocks,
        final_norm: vals("vision_tower.encoder.final_layernorm.weight"),
        proj0: mat("mm_projector.proj.0.weight"),
        proj2: mat("mm_projector.proj.2.weight"),
        post_norm: vals("mm_projector.post_norm.weight"),
    };
    let tower = Tower::new(cfg, w).unwrap();
    let pic = decode(&std::fs::read(dir().join("golden/picture.png")).unwrap(), &DecodeLimits::default()).unwrap();
    let mut x = patch_image(&pic, &p).unwrap();
    // The reference's own patches, so the tower is measured alone.
    x.values = f32s("pixels.f32");
    let merged = tower.merged(&x).unwrap();
    let err = rel_l2(&merged, &f32s("tower.f32"));
    assert!(err < 1e-4, "merged tower output rel-L2 {err:e}");
    let embeds = tower.project(&merged);
    let err = rel_l2(&embeds, &f32s("embeds.f32"));
    eprintln!("tower rel-L2 {:e}, embeddings rel-L2 {err:e}", rel_l2(&merged, &f32s("tower.f32")));
    assert!(err < 1e-4, "projected rows rel-L2 {err:e}");
}

/// JPEG and lossless WebP decode as Pillow decodes them: WebP exactly; JPEG within the IDCT's
/// and chroma upsampling (libjpeg-turbo against the `image` crate: measured 4 levels at most,
/// 0.39 on average; bounded at twice that, as the decoders' SIMD paths differ by CPU).
#[test]
fn jpeg_and_webp_decode_as_pillow_does() {
    for (file, max_diff, max_mean) in [("picture.webp", 0u8, 0.0f64), ("picture.jpg", 8, 1.0)] {
        let pic = decode(&std::fs::read(dir().join("golden").join(file)).unwrap(), &DecodeLimits::default()).unwrap();
        let want = std::fs::read(dir().join("golden").join(file.replace('.', "-") + ".rgb")).unwrap();
        assert_eq!((pic.width, pic.height, pic.rgb.len()), (200, 150, want.len()), "{file}");
        let diffs: Vec<u8> = pic.rgb.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
        let max = diffs.iter().copied().max().unwrap_or(0);
        let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
        eprintln!("{file}: largest difference from Pillow {max}, mean {mean:.3}");
        assert!(max <= max_diff && mean <= max_mean, "{file}: max {max}, mean {mean}");
    }
}
