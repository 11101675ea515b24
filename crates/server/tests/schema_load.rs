//! A costly schema slows only its own request: its masks are computed off the scheduler's
//! thread, and while one is not ready its sequence sits out the steps the others take. An answer
//! no token can continue is reported cut short (`length`), never `stop`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::http::StatusCode;
use http_body_util::BodyExt;
use k3_server::ServerOptions;
use k3_text::json_schema::{JsonSchema, SchemaLimits};
use serde_json::{Value, json};
use tower::ServiceExt;

mod common;
use common::{ask, json_call, post, server};

fn default_model() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

/// An `anyOf` of 64 objects whose strings differ only in their longest length: every way of
/// reading the answer stays alive (64 paths), and inside a string every token of the
/// vocabulary is a candidate, so each mask checks every token against 64 paths.
fn costly_schema() -> Value {
    let alts: Vec<Value> = (0..64)
        .map(|a| {
            let props: serde_json::Map<String, Value> =
                (0..8).map(|p| (format!("s{p}"), json!({"type": "string", "maxLength": 400 + a}))).collect();
            let required: Vec<String> = (0..8).map(|p| format!("s{p}")).collect();
            json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
        })
        .collect();
    json!({"anyOf": alts})
}

fn schema_format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "costly", "strict": true, "schema": schema}})
}

/// The content deltas of a streamed chat answer, counted as they arrive, and its text and
/// finish reason once it ends.
async fn read_stream(body: axum::body::Body, count: Arc<AtomicUsize>) -> (String, String) {
    let (mut text, mut finish, mut buf) = (String::new(), String::new(), String::new());
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.unwrap().into_data() else { continue };
        buf.push_str(std::str::from_utf8(&data).unwrap());
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
            let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
            let choice = &v["choices"][0];
            if let Some(t) = choice["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                text.push_str(t);
                count.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (text, finish)
}

/// While a costly schema's request runs, a simple request beside it gets its tokens at the
/// batch's pace: it finishes before the schema's request has written half as many. (Before, the
/// scheduler computed each mask between steps, so both got one token per step: the schema's
/// request wrote as many tokens as the simple one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_costly_schema_slows_only_its_own_request() {
    let router = server(ServerOptions { max_batch: 2, ..ServerOptions::new(default_model()) }).await;
    let schema = costly_schema();
    let costly = json!({"messages": [{"role": "user", "content": "Describe the garden."}],
        "response_format": schema_format(&schema), "max_tokens": 120, "temperature": 0, "stream": true});
    let r = router.clone().oneshot(post("/v1/chat/completions", &costly)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let count = Arc::new(AtomicUsize::new(0));
    let reading = tokio::spawn(read_stream(r.into_body(), count.clone()));
    // The schema's request is decoding before the simple one comes.
    while count.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let before = count.load(Ordering::SeqCst);
    let simple = json!({"prompt": "And God said", "max_tokens": 48, "temperature": 0});
    let (s, v) = json_call(&router, post("/v1/completions", &simple)).await;
    let during = count.load(Ordering::SeqCst) - before;
    assert_eq!(s, StatusCode::OK, "{v}");
    let simple_tokens = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!((simple_tokens, v["choices"][0]["finish_reason"].as_str()), (48, Some("length")), "{v}");
    assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty(), "{v}");
    assert!(
        during < simple_tokens / 2,
        "the schema's request wrote {during} tokens while the simple one wrote {simple_tokens}"
    );
    eprintln!("beside {simple_tokens} simple tokens, the schema's request wrote {during}");
    // The schema's answer is right too: a value of the schema in the making, cut at max_tokens.
    let (text, finish) = reading.await.unwrap();
    eprintln!("the schema's answer ({finish}): {text}");
    let compiled = Arc::new(JsonSchema::compile(&schema, &SchemaLimits::new(1 << 17, 16)).unwrap());
    let mut prefix = compiled.prefix();
    assert!(prefix.push_str(&text), "not a prefix of an allowed value: {text}");
    match finish.as_str() {
        "stop" => assert!(prefix.complete(), "{text}"),
        other => assert_eq!(other, "length", "{text}"),
    }
}

/// A client that leaves while its sequence waits for its mask stops it; the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_its_mask_can_be_cancelled() {
    let router = server(ServerOptions { max_batch: 2, ..ServerOptions::new(default_model()) }).await;
    let costly = json!({"messages": [{"role": "user", "content": "Describe the garden."}],
        "response_format": schema_format(&costly_schema()), "max_tokens": 400, "temperature": 0, "stream": true});
    let r = router.clone().oneshot(post("/v1/chat/completions", &costly)).await.unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let reading = tokio::spawn(read_stream(r.into_body(), count.clone()));
    while count.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    reading.abort();
    let simple = json!({"prompt": "And God said", "max_tokens": 8, "temperature": 0});
    let v = {
        let (s, v) = json_call(&router, post("/v1/completions", &simple)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    };
    assert_eq!(v["usage"]["completion_tokens"], 8, "{v}");
    // The scheduler noticed the client left: the batch holds only what runs.
    for _ in 0..500 {
        let (_, m) = common::call(&router, common::get("/metrics")).await;
        if m.lines().any(|l| l == "k3_requests_cancelled_total 1") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the request was not cancelled");
}

/// A schema the default model's vocabulary cannot write (its characters are in no token): the
/// answer stops where no token continues it, and says it was cut short.
#[tokio::test]
async fn an_answer_no_token_continues_is_cut_short_not_stopped() {
    let router = server(ServerOptions::new(default_model())).await;
    let schema = json!({"type": "object", "properties": {"name": {"enum": ["\u{6f22}\u{5b57}"]}},
        "required": ["name"], "additionalProperties": false});
    let body = json!({"messages": [{"role": "user", "content": "Name?"}],
        "response_format": schema_format(&schema), "max_tokens": 64, "temperature": 0});
    let v = ask(&router, &body).await;
    let text = common::content(&v);
    assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 64, "{v}");
}
