//! A checkpoint is untrusted input. Its `config.json` is checked whole before anything is
//! written: each field a family uses, broken one at a time in the golden checkpoints, is refused
//! by its name in the file (`n_group`, not k3's `num_expert_group`) — never a panic, a model that converts and then fails in the router, or NaN logits.
//! Its files must be regular files: a FIFO given as a shard is refused, not waited on. Its chat
//! template must render a probe conversation within its limits.

use std::path::{Path, PathBuf};

use k3_convert::{ConvertOptions, convert};
use serde_json::{Value, json};

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden").join(name)
}

/// Converts checkpoint `name` with `config.json` changed at `pointer` to `value`; the error.
fn convert_broken(name: &str, pointer: &str, value: Value) -> String {
    let hf = golden(name);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hf");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(&hf).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
        }
    }
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    *cfg.pointer_mut(pointer).unwrap_or_else(|| panic!("{name} has no {pointer}")) = value.clone();
    std::fs::write(src.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let out = dir.path().join("out");
    let r = convert(&ConvertOptions::new(&src, &out), &mut |_| {});
    let err = match r {
        Ok(_) => panic!("{name}: {pointer} = {value} converted"),
        Err(e) => e.to_string(),
    };
    assert!(!out.exists(), "{name}: {pointer} = {value}: something was written before the refusal");
    err
}

#[test]
fn every_broken_field_is_refused_by_name_before_anything_is_written() {
    let k3 = |f: &str| format!("/text_config/{f}");
    let cases: Vec<(&str, String, Value, &str)> = vec![
        ("tiny-k3", k3("rms_norm_eps"), json!(-1.0), "rms_norm_eps"),
        ("tiny-k3", k3("rms_norm_eps"), json!(0.0), "rms_norm_eps"),
        ("tiny-k3", k3("num_expert_group"), json!(3), "num_expert_group"),
        ("tiny-k3", k3("num_expert_group"), json!(0), "num_expert_group"),
        ("tiny-k3", k3("topk_group"), json!(2), "topk_group"),
        ("tiny-k3", k3("num_experts_per_token"), json!(0), "num_experts_per_token"),
        ("tiny-k3", k3("num_experts_per_token"), json!(33), "num_experts_per_token"),
        ("tiny-k3", k3("hidden_size"), json!(0), "hidden_size"),
        ("tiny-k3", k3("num_hidden_layers"), json!(0), "num_hidden_layers"),
        ("tiny-k3", k3("vocab_size"), json!(0), "vocab_size"),
        ("tiny-k3", k3("linear_attn_config/kda_layers"), json!([0, 2]), "kda_layers"),
        ("tiny-k3", k3("linear_attn_config/kda_layers"), json!([1, 7]), "kda_layers"),
        ("tiny-k3", k3("linear_attn_config/kda_layers"), json!([1, 1]), "kda_layers"),
        ("tiny-k3", k3("linear_attn_config/num_heads"), json!(0), "num_heads"),
        ("tiny-k3", k3("linear_attn_config/short_conv_kernel_size"), json!(0), "short_conv_kernel_size"),
        ("tiny-k3", k3("moe_layer_freq"), json!(0), "moe_layer_freq"),
        ("tiny-k3", k3("first_k_dense_replace"), json!(9), "first_k_dense_replace"),
        ("tiny-k3", k3("attn_res_block_size"), json!(0), "attn_res_block_size"),
        ("tiny-k3", k3("activation_situ_beta"), json!(0.0), "activation_situ_beta"),
        ("tiny-k3", k3("routed_scaling_factor"), json!(-1.0), "routed_scaling_factor"),
        ("tiny-k3", k3("moe_intermediate_size"), json!(0), "moe_intermediate_size"),
        ("tiny-k3", k3("routed_expert_hidden_size"), json!(0), "routed_expert_hidden_size"),
        ("tiny-k3", k3("num_attention_heads"), json!(0), "num_attention_heads"),
        ("tiny-k3", k3("kv_lora_rank"), json!(0), "kv_lora_rank"),
        ("tiny-k3", k3("v_head_dim"), json!(0), "v_head_dim"),
        ("tiny-k3", "/eos_token_id".into(), json!(9999), "eos_token_id"),
        ("tiny-kimi-linear", "/num_experts_per_token".into(), json!(17), "num_experts_per_token"),
        ("tiny-kimi-linear", "/model_max_length".into(), json!(0), "`model_max_length`"),
        ("deepseek-v3/bf16", "/n_group".into(), json!(3), "`n_group`"),
        ("deepseek-v3/bf16", "/topk_group".into(), json!(5), "topk_group"),
        // Four groups of four experts, two groups kept: at most eight reachable.
        ("deepseek-v3/bf16", "/num_experts_per_tok".into(), json!(9), "`num_experts_per_tok`"),
        ("deepseek-v3/bf16", "/rope_theta".into(), json!(-5.0), "rope_theta"),
        ("deepseek-v3/bf16", "/rope_scaling/factor".into(), json!(0.0), "rope_scaling.factor"),
        ("deepseek-v3/bf16", "/rope_scaling/original_max_position_embeddings".into(), json!(0), "original_max"),
        ("deepseek-v3/bf16", "/qk_rope_head_dim".into(), json!(7), "qk_rope_head_dim"),
    ];
    for (name, pointer, value, field) in cases {
        let err = convert_broken(name, &pointer, value.clone());
        assert!(err.contains(field), "{name}: {pointer} = {value}: the error does not name `{field}`: {err}");
        assert!(err.contains("config.json"), "{name}: {pointer}: the error does not name the file: {err}");
    }
}

#[test]
fn a_fifo_given_as_a_shard_is_refused_not_waited_on() {
    let hf = golden("tiny-kimi-linear");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hf");
    std::fs::create_dir(&src).unwrap();
    for f in ["config.json", "model.safetensors.index.json"] {
        std::fs::copy(hf.join(f), src.join(f)).unwrap();
    }
    assert!(std::process::Command::new("mkfifo").arg(src.join("model.safetensors")).status().unwrap().success());
    let (tx, rx) = std::sync::mpsc::channel();
    let out = dir.path().join("out");
    let (s, o) = (src.clone(), out.clone());
    std::thread::spawn(move || {
        let _ = tx.send(convert(&ConvertOptions::new(&s, &o), &mut |_| {}).map(|_| ()).map_err(|e| e.to_string()));
    });
    let err = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("convert hung on a FIFO").unwrap_err();
    assert!(err.contains("model.safetensors") && err.contains("not a regular file"), "{err}");
}

#[test]
fn conversion_refuses_a_checkpoint_whose_template_does_not_end() {
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/deepseek-v3/bf16");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("hf");
    std::fs::create_dir(&src).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(hf.join(f), src.join(f)).unwrap();
    }
    let ranks = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer/o200k_base.tiktoken");
    std::fs::copy(ranks, src.join("tiktoken.model")).unwrap();
    let hang = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    std::fs::write(src.join("tokenizer_config.json"), serde_json::json!({"chat_template": hang}).to_string()).unwrap();
    let out = dir.path().join("out");
    let err = convert(&ConvertOptions::new(&src, &out), &mut |_| {}).expect_err("converted").to_string();
    assert!(err.contains("tokenizer_config.json") && err.contains("instructions"), "{err}");
    assert!(!out.exists(), "written before the refusal");
}
