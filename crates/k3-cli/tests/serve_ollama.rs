//! Ollama's API on `k3-cli serve` as raw HTTP: NDJSON streaming (the default), the same text as
//! the OpenAI route, and errors in Ollama's shape on every status. (The `ollama` Python client is
//! run against it by `tools/server/ollama_client_test.py` in CI.)

mod common;

use common::server::Server;
use serde_json::{Value, json};

#[test]
fn chat_streams_ndjson_and_says_what_the_openai_route_says() {
    let s = Server::start(&[]);
    let messages = json!([{"role": "user", "content": "In the beginning"}]);
    let r = s.post(
        "/api/chat",
        &[],
        &json!({"model": "default", "messages": messages,
        "options": {"temperature": 0, "num_predict": 8}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = r.body.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (last, pieces) = lines.split_last().unwrap();
    assert!(pieces.iter().all(|p| p["done"] == false && p["message"]["role"] == "assistant"), "{}", r.body);
    assert_eq!(last["done"], true);
    assert_eq!(last["eval_count"], 8, "{last}");
    let text: String = lines.iter().filter_map(|l| l["message"]["content"].as_str()).collect();
    let openai = s.post("/v1/chat/completions", &[], &json!({"messages": messages, "temperature": 0, "max_tokens": 8}));
    assert_eq!(openai.json()["choices"][0]["message"]["content"], json!(text));
    // stream: false is one object.
    let one = s.post(
        "/api/generate",
        &[],
        &json!({"prompt": "In the beginning", "raw": true, "stream": false,
        "options": {"temperature": 0, "num_predict": 3}}),
    );
    let v = one.json();
    assert_eq!((v["done"].as_bool(), v["eval_count"].as_u64()), (Some(true), Some(3)), "{v}");
    assert!(!v["response"].as_str().unwrap().is_empty());
}

#[test]
fn errors_come_in_ollamas_shape() {
    let s = Server::start(&["--api-key", "k"]);
    let auth = ["Authorization: Bearer k"];
    let unauthorized = s.post("/api/chat", &[], &json!({"messages": []}));
    assert_eq!(unauthorized.status, 401);
    assert!(unauthorized.json()["error"].as_str().unwrap().contains("API key"), "{}", unauthorized.body);
    let r =
        s.post("/api/chat", &auth, &json!({"messages": [{"role": "user", "content": "x"}], "options": {"top_p": 7}}));
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().starts_with("options.top_p: "), "{}", r.body);
    let r = s.request("GET", "/api/nothing", &auth, "");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_string(), "{}", r.body);
    let r = s.request("GET", "/api/chat", &auth, "");
    assert_eq!(r.status, 405);
    assert!(r.json()["error"].is_string(), "{}", r.body);
    // The OpenAI routes keep OpenAI's shape.
    let r = s.request("GET", "/v1/nothing", &auth, "");
    assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
}
