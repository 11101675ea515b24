//! The routes llama-server users expect beside the OpenAI ones, and the errors of the routes that
//! do not exist: `/tokenize` and `/detokenize` against the model's tokenizer (the engine's own,
//! checked by its tests against the reference tokenizer), 404 and 405 in OpenAI's shape, and a
//! model id given at start (`--alias`).

use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use k3_engine::Model;
use k3_server::ServerOptions;
use k3_text::tokenizer::Tokenizer;
use serde_json::json;

mod common;
use common::{json_call, post, server};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

fn tokenizer() -> Tokenizer {
    k3_generate::model_tokenizer(&Model::open(default_model()).unwrap()).unwrap().unwrap()
}

#[tokio::test]
async fn tokenize_and_detokenize_as_llama_server_does() {
    let router = server(ServerOptions::new(default_model())).await;
    let text = "In the beginning God created the heaven";
    let want = tokenizer().encode_with_specials(text);
    let (s, v) = json_call(&router, post("/tokenize", &json!({"content": text}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, want);
    let (s, v) = json_call(&router, post("/tokenize", &json!({"content": text, "with_pieces": true}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let pieces = v["tokens"].as_array().unwrap();
    assert_eq!(pieces.iter().map(|p| p["id"].as_u64().unwrap() as u32).collect::<Vec<_>>(), want);
    assert_eq!(pieces.iter().map(|p| p["piece"].as_str().unwrap()).collect::<String>(), text);
    let (s, v) = json_call(&router, post("/detokenize", &json!({"tokens": want}))).await;
    assert_eq!((s, v["content"].as_str()), (StatusCode::OK, Some(text)));
    // Bad input is named: an id past the vocabulary, an unknown field, add_special.
    let (s, v) = json_call(&router, post("/detokenize", &json!({"tokens": [1, 999999]}))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tokens")), "{v}");
    let (s, v) = json_call(&router, post("/tokenize", &json!({"content": "x", "add_bos": true}))).await;
    assert!(s == StatusCode::BAD_REQUEST && v["error"]["message"].as_str().unwrap().contains("add_bos"), "{v}");
    let (s, v) = json_call(&router, post("/tokenize", &json!({"content": "x", "add_special": true}))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("add_special")), "{v}");
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_in_openais_shape() {
    let router = server(ServerOptions::new(default_model())).await;
    let (s, v) = json_call(&router, Request::get("/v1/embeddings").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], 404);
    assert!(v["error"]["message"].as_str().unwrap().contains("/v1/embeddings"), "{v}");
    let (s, v) = json_call(&router, Request::get("/v1/chat/completions").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(v["error"]["code"], 405);
    assert!(v["error"]["message"].as_str().unwrap().contains("GET"), "{v}");
}

#[tokio::test]
async fn the_model_id_given_at_start_is_the_apis() {
    let opts = ServerOptions { model_id: Some("kimi-k3-local".into()), ..ServerOptions::new(default_model()) };
    let router = server(opts).await;
    let (_, v) = json_call(&router, Request::get("/v1/models").body(Body::empty()).unwrap()).await;
    assert_eq!(v["data"][0]["id"], "kimi-k3-local");
    let body = json!({"model": "kimi-k3-local", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let (s, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
    assert_eq!((s, v["model"].as_str()), (StatusCode::OK, Some("kimi-k3-local")), "{v}");
}
