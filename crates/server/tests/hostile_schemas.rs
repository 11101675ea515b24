//! Schemas a hostile client sends, over HTTP on the default model: a chain of 1,500 `$ref`s (the
//! audit's body that overflowed a worker's stack and aborted the server), a schema nothing can
//! satisfy, and counts no context can hold, as `response_format: json_schema`, as a strict tool's
//! `parameters` and as Ollama's `format`. Each is a 400 naming the JSON pointer and the limit,
//! and the server answers the next ordinary request.

use std::path::{Path, PathBuf};

use axum::Router;
use axum::http::StatusCode;
use k3_server::ServerOptions;
use serde_json::{Map, Value, json};

mod common;
use common::{ask, json_call, post, server};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

/// `$defs` `D0` .. `D{n-1}`, each an object whose required `next` is the following one (the last a
/// string): every `$ref` a hop deeper. 1,500 of them are a body of about 140 KB.
fn ref_chain(n: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let def = if i + 1 < n {
            json!({"type": "object", "description": format!("link {i} of the chain"),
                "properties": {"next": {"$ref": format!("#/$defs/D{}", i + 1)}}, "required": ["next"]})
        } else {
            json!({"type": "string"})
        };
        defs.insert(format!("D{i}"), def);
    }
    json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/D0"}}, "required": ["x"], "$defs": defs})
}

fn with_format(schema: &Value) -> Value {
    json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}}})
}

fn with_strict_tool(schema: &Value) -> Value {
    json!({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "f", "strict": true, "parameters": schema}}]})
}

/// An OpenAI route's 400: its `param` and message.
async fn refused(router: &Router, body: &Value) -> (String, String) {
    let (s, v) = json_call(router, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    (v["error"]["param"].as_str().unwrap_or_default().to_string(), v["error"]["message"].as_str().unwrap().to_string())
}

/// Ollama's `/api/chat` 400: its message.
async fn ollama_refused(router: &Router, schema: &Value) -> String {
    let body = json!({"model": "default", "stream": false, "options": {"num_predict": 4},
        "messages": [{"role": "user", "content": "hi"}], "format": schema});
    let (s, v) = json_call(router, post("/api/chat", &body)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    v["error"].as_str().unwrap().to_string()
}

/// An ordinary request is still answered.
async fn still_serves(router: &Router) {
    let v = ask(
        router,
        &json!({"model": "default", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2, "temperature": 0}),
    )
    .await;
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
}

#[tokio::test]
async fn a_chain_of_1500_refs_is_refused_at_the_depth_limit_and_the_server_lives() {
    let router = server(ServerOptions::new(default_model())).await;
    let schema = ref_chain(1500);
    assert!(schema.to_string().len() > 128 << 10, "the audit's body was 142 KB");
    let depth = |m: &str| m.contains("/$defs/D") && m.contains("levels") && m.contains("64");

    let (param, message) = refused(&router, &with_format(&schema)).await;
    assert_eq!(param, "response_format.json_schema.schema");
    assert!(depth(&message), "{message}");
    still_serves(&router).await;

    let (param, message) = refused(&router, &with_strict_tool(&schema)).await;
    assert_eq!(param, "tools[0].function.parameters");
    assert!(depth(&message), "{message}");
    still_serves(&router).await;

    let message = ollama_refused(&router, &schema).await;
    assert!(message.starts_with("response_format.json_schema.schema") && depth(&message), "{message}");
    still_serves(&router).await;
}

#[tokio::test]
async fn a_schema_nothing_satisfies_is_refused_naming_the_cycle() {
    let router = server(ServerOptions::new(default_model())).await;
    let self_ref = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/A"}}, "required": ["x"],
        "$defs": {"A": {"$ref": "#/$defs/A"}}});
    let (param, message) = refused(&router, &with_format(&self_ref)).await;
    assert_eq!(param, "response_format.json_schema.schema");
    assert!(message.contains("/$defs/A/$ref") && message.contains("refers to itself"), "{message}");
    let mutual = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/A"}}, "required": ["x"],
        "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
                  "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}}});
    let message = ollama_refused(&router, &mutual).await;
    assert!(message.contains("/$defs/B/properties/a/$ref") && message.contains("nothing that can end it"), "{message}");
    let (param, message) = refused(
        &router,
        &with_strict_tool(&json!({"type": "object",
        "properties": {"x": {"type": []}}, "required": ["x"]})),
    )
    .await;
    assert_eq!(param, "tools[0].function.parameters");
    assert!(message.contains("/properties/x/type") && message.contains("allows no value"), "{message}");
    still_serves(&router).await;
}

#[tokio::test]
async fn counts_no_context_can_hold_are_refused_up_front() {
    let router = server(ServerOptions::new(default_model())).await;
    let (_, models) = json_call(&router, common::get("/v1/models")).await;
    let context = models["data"][0]["context_length"].as_u64().unwrap();
    let huge = json!({"type": "object", "properties": {"a": {"type": "array", "minItems": 4_000_000_000u64}},
        "required": ["a"]});
    let (_, message) = refused(&router, &with_format(&huge)).await;
    assert!(message.contains("/properties/a/minItems") && message.contains(&context.to_string()), "{message}");
    // A string no longer than the context could ever be in bytes is allowed; one longer is not.
    let long = |n: u64| json!({"type": "object", "properties": {"s": {"type": "string", "minLength": n}}});
    let (_, message) = refused(&router, &with_format(&long(4_000_000_000))).await;
    assert!(message.contains("/properties/s/minLength"), "{message}");
    let (s, v) = json_call(&router, post("/v1/chat/completions", &with_format(&long(context / 2)))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    still_serves(&router).await;
}
