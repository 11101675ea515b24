//! Kimi K3.1 Pro's config (model type `kimi_k31`, reported as K3's architecture post-trained)
//! runs as K3: the tiny K3 checkpoint relabelled as K3.1 converts and matches the K3 reference
//! this project did not write (fixtures/golden/tiny-k3, the independent numpy K3; tolerance as in
//! golden.rs, relative L2 1e-4); a K3.1 config with a field K3's lacks is refused by name.

mod common;
use common::rel_l2;
use std::path::{Path, PathBuf};

use k3_engine::Engine;
use k3_format::Model;

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/tiny-k3")
}

/// The tiny K3 checkpoint in `dir`, its config changed by `edit`.
fn relabelled(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let ck = dir.join("ck");
    std::fs::create_dir(&ck).unwrap();
    for name in ["model-00001-of-00001.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(golden().join(name), ck.join(name)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden().join("config.json")).unwrap()).unwrap();
    cfg["model_type"] = "kimi_k31".into();
    edit(&mut cfg);
    std::fs::write(ck.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    ck
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn k31_runs_as_k3_and_matches_the_k3_reference() {
    let dir = tempfile::tempdir().unwrap();
    let ck = relabelled(dir.path(), |_| {});
    let opts =
        k3_convert::ConvertOptions { copy_experts: true, ..k3_convert::ConvertOptions::new(&ck, dir.path().join("m")) };
    k3_convert::convert(&opts, &mut |_| {}).unwrap();
    let model = Model::open(dir.path().join("m")).unwrap();
    let engine = Engine::load(&model).unwrap();
    assert_eq!(engine.config().family, k3_engine::config::Family::KimiK3);
    let ids: Vec<u32> = std::fs::read_to_string(golden().join("golden/ids.txt"))
        .unwrap()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let logits = engine.forward(&mut engine.session(), &ids, None).unwrap();
    let e = rel_l2(&logits, &f32s(&golden().join("golden/logits.f32")));
    eprintln!("K3.1 as K3: logits relative L2 error {e:.3e}");
    assert!(e < 1e-4, "logits relative L2 error {e}");
}

#[test]
fn a_k31_field_k3_lacks_is_refused_by_name() {
    for (at, edit) in [
        (
            "text_config.attn_sink_size",
            (|c: &mut serde_json::Value| c["text_config"]["attn_sink_size"] = 4.into()) as fn(&mut serde_json::Value),
        ),
        ("mtp_config", |c: &mut serde_json::Value| c["mtp_config"] = serde_json::json!({})),
        ("text_config.linear_attn_config.chunk_size", |c: &mut serde_json::Value| {
            c["text_config"]["linear_attn_config"]["chunk_size"] = 64.into()
        }),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ck = relabelled(dir.path(), edit);
        let opts = k3_convert::ConvertOptions::new(&ck, dir.path().join("m"));
        let err = k3_convert::convert(&opts, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains(&format!("has `{at}`, which K3's does not")), "{err}");
        assert!(!dir.path().join("m").join("header.waste").exists());
    }
}
