//! The server's edges: a damaged shard fails only the requests that read it (and is read again
//! once its bytes are back), `/tokenize` bounded and off the async workers.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{get, json_call, post, server};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

/// A copy of the default model in a temporary directory (its shards can be damaged there).
fn model_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("default.waste");
    std::fs::create_dir(&to).unwrap();
    for e in std::fs::read_dir(default_model()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    (dir, to)
}

fn chat(user: &str) -> Value {
    json!({"messages": [{"role": "user", "content": user}], "max_tokens": 4, "temperature": 0})
}

#[tokio::test]
async fn a_truncated_shard_fails_its_requests_and_is_read_again_once_restored() {
    let (_dir, model) = model_copy();
    let mut opts = ServerOptions::new(model.clone());
    // No kept states: every request runs the experts again.
    opts.prefix_cache = 0;
    let router = server(opts).await;
    let shard = model.join("experts-00000.waste");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(4096).unwrap();
    let (s, v) = json_call(&router, post("/v1/chat/completions", &chat("Once upon a time"))).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("experts-00000.waste") && message.contains("truncated"), "{message}");
    // The model itself can still serve: the next request reads the records again.
    assert_eq!(json_call(&router, get("/health")).await.0, StatusCode::OK);
    std::fs::write(&shard, &bytes).unwrap();
    let (s, v) = json_call(&router, post("/v1/chat/completions", &chat("Once upon a time"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = json_call(&router, post("/v1/chat/completions", &chat("In the beginning"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// A scheduler that stopped after the model loaded (here: its prompt-cache directory is a file)
/// makes `/health` say so, 503 with the reason, not 200 while every request fails.
#[tokio::test]
async fn health_says_when_the_model_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("cache");
    std::fs::write(&not_a_dir, b"a file").unwrap();
    let mut opts = ServerOptions::new(default_model());
    opts.prompt_cache_dir = Some(not_a_dir);
    let (router, _) = k3_server::app(opts);
    let mut last = None;
    for _ in 0..600 {
        let (s, v) = json_call(&router, get("/health")).await;
        let message = v["error"]["message"].as_str().unwrap_or_default().to_string();
        if s != StatusCode::SERVICE_UNAVAILABLE || message != "Loading model" {
            last = Some((s, v));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (s, v) = last.expect("the load ended");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("cache"), "{v}");
    let (s, _) = json_call(&router, post("/v1/chat/completions", &chat("Once upon a time"))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
}
