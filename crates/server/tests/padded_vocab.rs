//! A model whose embedding and `lm_head` have more rows than its tokenizer has ids, as real
//! checkpoints pad their vocabularies: the ids past the tokenizer's are never sampled (vLLM
//! masks them the same way), so an answer never holds a token the server cannot decode.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::http::StatusCode;
use k3_convert::synth::scripted::{SPECIALS, byte_tokenizer};
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{json_call, post, server};

/// The golden Kimi-Linear's weights (512 rows) with a byte-level tokenizer of 270 ids: 242
/// rows of random logits no id of the tokenizer names. Converted once per test binary.
fn padded_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-padded-vocab");
        let _ = std::fs::remove_dir_all(&dir);
        let (base, hf) =
            (Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/tiny-kimi-linear"), dir.join("hf"));
        std::fs::create_dir_all(&hf).unwrap();
        byte_tokenizer(&hf, &[], &SPECIALS, None).unwrap();
        let mut config: Value = serde_json::from_slice(&std::fs::read(base.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["vocab_size"], 512);
        // `[BOS]` and `[EOS]` are the first two specials, after the 256 bytes.
        (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) = (json!(256), json!(257), json!(0));
        std::fs::write(hf.join("config.json"), config.to_string()).unwrap();
        std::fs::copy(base.join("model.safetensors"), hf.join("model.safetensors")).unwrap();
        convert(&ConvertOptions::new(hf, dir.join("padded")), &mut |_| {}).unwrap();
        dir
    });
    dir.join("padded")
}

/// Sampled answers (most of the model's probability is on the padded rows) come back whole,
/// every token decoded: an undecodable id would have failed the request.
#[tokio::test]
async fn a_padded_vocabulary_never_yields_an_undecodable_id() {
    let router = server(ServerOptions::new(padded_model())).await;
    for seed in 1..=4 {
        let body = json!({"prompt": "hello", "max_tokens": 24, "temperature": 1.0, "seed": seed});
        let (s, v) = json_call(&router, post("/v1/completions", &body)).await;
        assert_eq!(s, StatusCode::OK, "seed {seed}: {v}");
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
        let tokens = v["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(finish == "stop" || (finish == "length" && tokens == 24), "{v}");
        let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "temperature": 1.0,
            "seed": seed});
        let (s, v) = json_call(&router, post("/v1/chat/completions", &chat)).await;
        assert_eq!(s, StatusCode::OK, "seed {seed}: {v}");
    }
}
