//! The CLI on the converted golden fixtures, as a user runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

fn k3(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_k3-cli")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn copy_model(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

#[test]
fn inspect_describes_the_k3_fixture() {
    let (ok, out, err) = k3(&["inspect", fixture("tiny-k3.waste").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("kimi_k3: 6 layers, hidden 256, vocab 512"), "{out}");
    assert!(out.contains("32 per layer, 4 active per token, 5 MoE layers (1..=5): 160 records"), "{out}");
    assert!(out.contains("w1 mxfp4 [64, 128], w2 mxfp4 [128, 64], w3 mxfp4 [64, 128]"), "{out}");
}

#[test]
fn inspect_json_is_one_object_a_program_can_read() {
    let (ok, out, err) = k3(&["inspect", "--json", fixture("tiny-kimi-linear.waste").to_str().unwrap()]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["architecture"]["name"], "kimi_linear");
    assert_eq!(v["architecture"]["moe_layers"], serde_json::json!([1, 2, 3, 4]));
    assert_eq!(v["expert_records"], 64);
    // BF16 experts: w1 [64, 256] + w2 [256, 64] + w3 [64, 256] = 3 x 32 KiB, plus header, padded to 4 KiB.
    assert_eq!(v["expert_layouts"][0]["record_bytes"], 102400);
    assert_eq!(v["routed_bytes_per_token_cold"], 4 * 4 * 102400);
}

#[test]
fn verify_passes_a_good_model() {
    let (ok, out, err) = k3(&["verify", fixture("tiny-k3.waste").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("160 expert records verified"), "{out}");
}

#[test]
fn verify_names_a_flipped_byte_in_a_record_and_in_a_tensor() {
    let d = copy_model("tiny-k3.waste");
    let m = k3_format::Model::open(d.path()).unwrap();
    let rec = m.expert(3, 17).unwrap().entry;
    let t = m.manifest().trunk_tensor("model.layers.2.self_attn.q_proj.weight").unwrap().clone();
    drop(m);
    let shard = d.path().join("experts-00000.waste");
    let mut b = std::fs::read(&shard).unwrap();
    b[(rec.offset + rec.length / 2) as usize] ^= 4;
    std::fs::write(&shard, b).unwrap();
    let trunk = d.path().join("trunk.waste");
    let mut b = std::fs::read(&trunk).unwrap();
    b[(t.offset + 1) as usize] ^= 1;
    std::fs::write(&trunk, b).unwrap();

    let (ok, _, err) = k3(&["verify", d.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("BAD expert record (layer 3, expert 17)"), "{err}");
    assert!(err.contains("BAD tensor `model.layers.2.self_attn.q_proj.weight`"), "{err}");
    assert!(err.contains("2 problem(s)"), "{err}");
}

#[test]
fn a_directory_that_is_not_a_model_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let (ok, _, err) = k3(&["inspect", d.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("not a WASTE model directory"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
