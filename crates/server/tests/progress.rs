//! llama-server's `return_progress`: a streamed chat request that sets it gets chunks with no
//! choices and a `prompt_progress` object while its prompt is read; the answer is unchanged,
//! a whole (non-streamed) answer too, and a value that is not a boolean is a 400 naming it.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{call, json_call, post, server, sse_data};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

fn body(user: &str, extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}],
        "max_tokens": 8, "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
    });
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// The chunks of a streamed answer (`[DONE]` checked and dropped).
async fn chunks(router: &axum::Router, b: &Value) -> Vec<Value> {
    let (s, text) = call(router, post("/v1/chat/completions", b)).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

fn content(chunks: &[Value]) -> String {
    chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect()
}

fn progress(chunks: &[Value]) -> Vec<&Value> {
    chunks.iter().filter_map(|c| c.get("prompt_progress")).collect()
}

#[tokio::test]
async fn a_stream_that_asks_gets_the_prompts_progress_before_the_answer() {
    let router = server(ServerOptions::new(default_model())).await;
    let plain = chunks(&router, &body("In the beginning", json!({}))).await;
    assert!(progress(&plain).is_empty(), "no progress unasked");

    // Another prompt (nothing of it kept yet but what the template shares), asking.
    let asked = chunks(&router, &body("And God said", json!({"return_progress": true}))).await;
    let steps = progress(&asked);
    assert!(!steps.is_empty(), "{asked:?}");
    let usage = &asked.last().unwrap()["usage"];
    let total = usage["prompt_tokens"].as_u64().unwrap();
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let mut last = 0;
    for p in &steps {
        assert_eq!(p["total"].as_u64(), Some(total), "{p}");
        assert_eq!(p["cache"].as_u64(), Some(cached), "{p}");
        let processed = p["processed"].as_u64().unwrap();
        assert!(processed >= last && processed >= cached && processed <= total, "{steps:?}");
        assert!(p["time_ms"].is_u64(), "{p}");
        last = processed;
    }
    assert_eq!(last, total, "the last progress is the whole prompt: {steps:?}");
    // Progress chunks carry no choices and come before any text.
    let first_text =
        asked.iter().position(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()));
    for (i, c) in asked.iter().enumerate().filter(|(_, c)| c.get("prompt_progress").is_some()) {
        assert_eq!(c["choices"], json!([]), "{c}");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(first_text.is_none_or(|t| i < t), "progress after text: {asked:?}");
    }
    // The answer is the one the request gets without asking.
    let again = chunks(&router, &body("And God said", json!({}))).await;
    assert_eq!(content(&asked), content(&again));

    // A prompt held whole by a kept state still reports where it starts: all of it.
    let held = chunks(&router, &body("And God said", json!({"return_progress": true}))).await;
    let steps = progress(&held);
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!((steps[0]["processed"].as_u64(), steps[0]["cache"].as_u64()), (Some(total), Some(total)));
}

#[tokio::test]
async fn a_whole_answer_is_unchanged_and_a_non_boolean_is_refused() {
    let router = server(ServerOptions::new(default_model())).await;
    let whole = |extra: Value| {
        let mut b = body("Let there be light", extra);
        b["stream"] = json!(false);
        b.as_object_mut().unwrap().remove("stream_options");
        b
    };
    let (s, with) = json_call(&router, post("/v1/chat/completions", &whole(json!({"return_progress": true})))).await;
    assert_eq!(s, StatusCode::OK, "{with}");
    let (_, without) = json_call(&router, post("/v1/chat/completions", &whole(json!({})))).await;
    assert!(with.get("prompt_progress").is_none(), "{with}");
    assert_eq!(with["choices"], without["choices"]);

    for bad in [json!("yes"), json!(1), json!({})] {
        for stream in [true, false] {
            let mut b = body("Let there be light", json!({"return_progress": bad}));
            b["stream"] = json!(stream);
            let (s, v) = json_call(&router, post("/v1/chat/completions", &b)).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
            assert_eq!(v["error"]["param"], "return_progress", "{v}");
        }
    }
    // `false` asks nothing.
    let plain = chunks(&router, &body("Let there be light", json!({"return_progress": false}))).await;
    assert!(progress(&plain).is_empty());
}
