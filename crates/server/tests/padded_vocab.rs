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

/// The tokens of a chat answer as its log-probabilities name them: an id the tokenizer cannot
/// decode is named by its number.
fn tokens(v: &Value) -> Vec<String> {
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap_or_else(|| panic!("{v}"));
    content.iter().map(|e| e["token"].as_str().unwrap().to_string()).collect()
}

/// Sampled answers (about half of the model's probability is on the padded rows) hold only ids
/// the tokenizer decodes: its 256 bytes and its specials, never a number past them.
#[tokio::test]
async fn a_padded_vocabulary_never_yields_an_undecodable_id() {
    let router = server(ServerOptions::new(padded_model())).await;
    let mut seen = 0;
    for seed in 1..=4 {
        let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "temperature": 1.0,
            "seed": seed, "logprobs": true});
        let (s, v) = json_call(&router, post("/v1/chat/completions", &chat)).await;
        assert_eq!(s, StatusCode::OK, "seed {seed}: {v}");
        for t in tokens(&v) {
            // A byte's token is one byte; a padded id's is its number, of two or three digits.
            let id = t.parse::<u32>().ok().filter(|_| t.len() > 1);
            assert!(id.is_none(), "seed {seed}: an undecodable id {t} was sampled: {v}");
            seen += 1;
        }
    }
    assert!(seen >= 20, "the answers were too short to tell: {seen} tokens");
}
