//! `thinking_budget` on `/v1/chat/completions`: at most that many tokens of thinking, then the
//! model answers, `max_tokens` still counting both (OpenAI's meaning). Checked on the tiny K3
//! with its vision tower (a K3 that thinks and has a tokenizer; random weights): the thought
//! under a budget of N is exactly the first N tokens' thought (what `max_tokens: N` alone cuts
//! it to), and an answer follows. Bad values, a model with no thinking and K3 with its thinking
//! off are 400s naming the field.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::Router;
use axum::http::StatusCode;
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{json_call, post, server};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn k3_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("thinking-budget-k3");
        let _ = std::fs::remove_dir_all(&dir);
        convert(&ConvertOptions::new(fixtures().join("golden/tiny-k3-vision"), dir.join("m")), &mut |_| {}).unwrap();
        dir.join("m")
    })
    .clone()
}

fn body(extra: Value) -> Value {
    let mut b = json!({"max_tokens": 40, "seed": 9, "messages": [{"role": "user", "content": "Think."}]});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

async fn chat(router: &Router, b: &Value) -> Value {
    let (s, v) = json_call(router, post("/v1/chat/completions", b)).await;
    assert_eq!(s, StatusCode::OK, "{b}: {v}");
    v
}

fn message(v: &Value, field: &str) -> String {
    v["choices"][0]["message"][field].as_str().unwrap_or("").to_string()
}

/// The text before any character a cut left unfinished (U+FFFD).
fn whole_chars(t: &str) -> &str {
    t.trim_end_matches('\u{fffd}')
}

#[tokio::test]
async fn a_budget_of_n_thinks_n_tokens_then_answers() {
    let router = server(ServerOptions::new(k3_model())).await;
    let free = chat(&router, &body(json!({}))).await;
    let free_thought = message(&free, "reasoning_content");
    for n in [2u64, 5] {
        // The first n tokens' thought: max_tokens alone cuts the turn there.
        let cut = chat(&router, &body(json!({"max_tokens": n}))).await;
        assert_eq!(cut["choices"][0]["finish_reason"], "length", "{cut}");
        assert_eq!(message(&cut, "content"), "", "the first {n} tokens are all thought: {cut}");
        let first_n = message(&cut, "reasoning_content");
        assert!(free_thought.starts_with(whole_chars(&first_n)), "{first_n:?} {free_thought:?}");

        let budgeted = chat(&router, &body(json!({"thinking_budget": n}))).await;
        let thought = message(&budgeted, "reasoning_content");
        assert_eq!(whole_chars(&thought), whole_chars(&first_n), "budget {n}: {budgeted}");
        assert!(whole_chars(&thought).len() < whole_chars(&free_thought).len(), "budget {n} cut nothing: {budgeted}");
        assert!(!message(&budgeted, "content").is_empty(), "budget {n}: no answer after the thought: {budgeted}");
        // max_tokens counts thinking and answer together.
        let used = budgeted["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(used > n && used <= 40, "{budgeted}");
    }
    // Streamed: the same thought.
    let b = body(json!({"thinking_budget": 2, "stream": true}));
    let (s, sse) = common::call(&router, post("/v1/chat/completions", &b)).await;
    assert_eq!(s, StatusCode::OK, "{sse}");
    let streamed: String = common::sse_data(&sse)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str().map(str::to_string))
        .collect();
    let whole = chat(&router, &body(json!({"thinking_budget": 2}))).await;
    assert_eq!(streamed, message(&whole, "reasoning_content"));
    // null is a budget left out.
    let unset = chat(&router, &body(json!({"thinking_budget": null}))).await;
    assert_eq!(message(&unset, "reasoning_content"), free_thought);
}

async fn refused(router: &Router, b: &Value, says: &str) {
    let (s, v) = json_call(router, post("/v1/chat/completions", b)).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("thinking_budget")), "{b}: {v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{b}: {v}");
}

#[tokio::test]
async fn bad_budgets_and_models_without_thinking_are_refused_by_name() {
    let router = server(ServerOptions::new(k3_model())).await;
    for bad in [json!(0), json!(-1), json!("x"), json!(1.5), json!("3"), json!(true)] {
        refused(&router, &body(json!({"thinking_budget": bad})), "at least 1").await;
    }
    // K3 with its thinking switched off has no thinking to budget.
    refused(&router, &body(json!({"thinking_budget": 4, "reasoning_effort": "none"})), "switched off").await;
    refused(&router, &body(json!({"thinking_budget": 4, "chat_template_kwargs": {"thinking": false}})), "switched off")
        .await;

    // Kimi-Linear has no thinking channel.
    let linear = server(ServerOptions::new(fixtures().join("default.waste"))).await;
    refused(&linear, &body(json!({"thinking_budget": 4})), "no thinking").await;
    let plain = chat(&linear, &body(json!({"max_tokens": 2}))).await;
    assert_eq!(plain["usage"]["completion_tokens"], 2, "{plain}");
}
