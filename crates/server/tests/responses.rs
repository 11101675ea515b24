//! `/v1/responses` against `/v1/chat/completions` as the reference (that route is checked
//! against independent references elsewhere): the same conversation with the same seed gives
//! the same text, reasoning, calls and token counts, whole and streamed; a function-call round
//! trip and `previous_response_id` resuming from the prompt cache on the scripted tool-caller;
//! the store's bounds and keys; `text.format`; errors naming the field as the client wrote it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use k3_convert::synth::scripted::{ARGUMENTS, CALL_ID, REASONING, REPLY, tool_caller};
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use k3_server::response_store::StoreLimits;
use serde_json::{Value, json};

mod common;
use common::{ask, call, get, json_call, post, server, sse_events};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// A K3 (it thinks) with its vision tower, converted once per test binary.
fn k3_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-responses-k3");
        let _ = std::fs::remove_dir_all(&dir);
        convert(&ConvertOptions::new(fixture("golden/tiny-k3-vision"), dir.join("m")), &mut |_| {}).unwrap();
        dir
    });
    dir.join("m")
}

fn picture() -> String {
    use base64::Engine;
    let png = std::fs::read(fixture("golden/tiny-k3-vision/golden/picture.png")).unwrap();
    format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(png))
}

/// The scripted tool-caller (`k3_convert::synth::scripted`), converted once per test binary.
fn tool_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-responses-tool-caller");
        let _ = std::fs::remove_dir_all(&dir);
        tool_caller(&fixture("golden/tiny-kimi-linear"), &dir.join("hf")).unwrap();
        convert(&ConvertOptions::new(dir.join("hf"), dir.join("tool-caller")), &mut |_| {}).unwrap();
        dir
    });
    dir.join("tool-caller")
}

async fn respond(router: &Router, body: &Value) -> Value {
    let (s, v) = json_call(router, post("/v1/responses", body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// The text of a response's message items.
fn output_text(v: &Value) -> String {
    items(v, "message")
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

fn reasoning_text(v: &Value) -> String {
    items(v, "reasoning")
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

fn items<'v>(v: &'v Value, kind: &str) -> Vec<&'v Value> {
    v["output"].as_array().unwrap().iter().filter(|i| i["type"] == kind).collect()
}

/// The chat answer's (text, reasoning, prompt, cached, completion).
fn chat_facts(v: &Value) -> (String, String, u64, u64, u64) {
    let m = &v["choices"][0]["message"];
    let u = &v["usage"];
    (
        m["content"].as_str().unwrap_or("").to_string(),
        m["reasoning_content"].as_str().unwrap_or("").to_string(),
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    )
}

fn response_facts(v: &Value) -> (String, String, u64, u64, u64) {
    let u = &v["usage"];
    (
        output_text(v),
        reasoning_text(v),
        u["input_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        u["output_tokens"].as_u64().unwrap(),
    )
}

/// A streamed answer checked for order (typed events named as their `type`, sequence numbers
/// counting up from 0, every item added before its deltas and done after them) and reassembled
/// into the response it ends with, whose output the deltas must spell.
async fn streamed(router: &Router, body: &Value) -> (Vec<(String, Value)>, Value) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (s, text) = call(router, post("/v1/responses", &body)).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let ev = sse_events(&text);
    for (i, (name, data)) in ev.iter().enumerate() {
        assert_eq!((name.as_str(), data["sequence_number"].as_u64()), (data["type"].as_str().unwrap(), Some(i as u64)));
    }
    assert_eq!(ev[0].0, "response.created");
    assert_eq!(ev[1].0, "response.in_progress");
    let last = ev.last().unwrap();
    assert!(matches!(last.0.as_str(), "response.completed" | "response.incomplete"), "{text}");
    let done = last.1["response"].clone();
    let (mut texts, mut open): (Vec<String>, Vec<bool>) = (Vec::new(), Vec::new());
    for (name, d) in &ev {
        let index = d["output_index"].as_u64().map(|i| i as usize);
        match name.as_str() {
            "response.output_item.added" => {
                assert_eq!(index, Some(texts.len()), "items are added in order");
                texts.push(String::new());
                open.push(true);
            }
            "response.output_text.delta"
            | "response.reasoning_text.delta"
            | "response.function_call_arguments.delta" => {
                let i = index.unwrap();
                assert!(open[i], "a delta of a closed item: {d}");
                texts[i].push_str(d["delta"].as_str().unwrap());
            }
            "response.output_item.done" => {
                let i = index.unwrap();
                open[i] = false;
                assert_eq!(d["item"], done["output"][i], "the item done is the item in the response");
            }
            _ => {}
        }
    }
    assert!(open.iter().all(|o| !o), "every item is done");
    for (i, item) in done["output"].as_array().unwrap().iter().enumerate() {
        let whole = match item["type"].as_str().unwrap() {
            "function_call" => item["arguments"].as_str().unwrap().to_string(),
            _ => item["content"][0]["text"].as_str().unwrap().to_string(),
        };
        assert_eq!(texts[i], whole, "the deltas spell item {i}");
    }
    (ev, done)
}

#[tokio::test]
async fn a_conversation_answers_as_on_the_chat_route_whole_and_streamed() {
    let router = server(ServerOptions::new(fixture("default.waste"))).await;
    let chat = json!({"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ], "max_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 7});
    let reference = chat_facts(&ask(&router, &chat).await);
    let resp = json!({"instructions": "Answer briefly.", "input": [
        {"role": "user", "content": "Name a colour."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue.", "annotations": []}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Another one?"}]},
    ], "max_output_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 7, "store": false});
    let v = respond(&router, &resp).await;
    let mut got = response_facts(&v);
    // The same prompt again: the second is resumed from the first's kept state.
    got.3 = reference.3;
    assert_eq!(got, reference, "{v}");
    assert_eq!((v["object"].as_str(), v["model"].as_str()), (Some("response"), Some("default")));
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let status = if v["incomplete_details"].is_null() { "completed" } else { "incomplete" };
    assert_eq!(v["status"], status);
    let (_, done) = streamed(&router, &resp).await;
    assert_eq!(output_text(&done), reference.0);
    assert_eq!(done["usage"]["output_tokens"], json!(reference.4));
}

#[tokio::test]
async fn k3s_reasoning_comes_back_as_a_reasoning_item_and_images_are_read() {
    let router = server(ServerOptions::new(k3_model())).await;
    let chat = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": picture()}}]}],
        "max_tokens": 24, "temperature": 0.8, "seed": 3, "reasoning_effort": "high"});
    let reference = chat_facts(&ask(&router, &chat).await);
    assert!(!reference.1.is_empty(), "K3 thinks: {reference:?}");
    // OpenAI's names on the chat route too: medium renders as high (not the default, max): the
    // same prompt, whole from the cache, and the same answer.
    let mut medium = chat.clone();
    medium["reasoning_effort"] = json!("medium");
    let mut same = chat_facts(&ask(&router, &medium).await);
    assert_eq!(same.3, same.2, "the whole prompt is the high one's, kept: {same:?}");
    same.3 = reference.3;
    assert_eq!(same, reference);
    let resp = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": picture(), "detail": "auto"}]}],
        "max_output_tokens": 24, "temperature": 0.8, "seed": 3,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": false});
    let v = respond(&router, &resp).await;
    let mut got = response_facts(&v);
    got.3 = reference.3;
    assert_eq!(got, reference, "{v}");
    let r = v["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap();
    assert!(r > 0 && r <= reference.4, "{v}");
    assert_eq!(v["output"][0]["type"], "reasoning", "the thought comes first: {v}");
    let (ev, done) = streamed(&router, &resp).await;
    assert_eq!(reasoning_text(&done), reference.1);
    assert!(ev.iter().any(|(n, _)| n == "response.reasoning_text.delta"));
    // A follow-up by previous_response_id: the stored turn (its reasoning too) and the new one,
    // as the chat route renders the same history.
    let mut stored = resp.clone();
    stored["store"] = json!(true);
    let first = respond(&router, &stored).await;
    let next = json!({"previous_response_id": first["id"], "input": "And the sea?", "max_output_tokens": 24,
        "temperature": 0.8, "seed": 3, "reasoning": {"effort": "medium"}});
    let n = respond(&router, &next).await;
    let mut chat_next = chat.clone();
    let turn =
        json!({"role": "assistant", "content": output_text(&first), "reasoning_content": reasoning_text(&first)});
    chat_next["messages"].as_array_mut().unwrap().extend([turn, json!({"role": "user", "content": "And the sea?"})]);
    let c = chat_facts(&ask(&router, &chat_next).await);
    let got = response_facts(&n);
    assert_eq!((&got.0, &got.1, got.2, got.4), (&c.0, &c.1, c.2, c.4), "{n}");
    eprintln!(
        "K3 previous_response_id: first input {} tokens, follow-up {} with {} cached",
        first["usage"]["input_tokens"], got.2, got.3
    );
    // Effort none: no thinking, as reasoning_effort none on the chat route.
    let mut off = resp.clone();
    off["reasoning"] = json!({"effort": "none"});
    let mut chat_off = chat.clone();
    chat_off["reasoning_effort"] = json!("none");
    let (a, b) = (response_facts(&respond(&router, &off).await), chat_facts(&ask(&router, &chat_off).await));
    assert_eq!((a.0, a.1, a.2, a.4), (b.0, b.1, b.2, b.4));
}

fn weather() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true}])
}

fn chat_weather() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": true}}])
}

#[tokio::test]
async fn a_function_call_round_trip_resumes_from_the_cache() {
    let router = server(ServerOptions::new(tool_model())).await;
    let chat = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": chat_weather(),
        "max_tokens": 32, "temperature": 0});
    let c = ask(&router, &chat).await;
    let first = json!({"input": "Weather in Paris?", "tools": weather(), "max_output_tokens": 32, "temperature": 0});
    let v = respond(&router, &first).await;
    let kinds: Vec<&str> = v["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"], "{v}");
    assert_eq!((reasoning_text(&v), output_text(&v)), (REASONING.to_string(), REPLY.to_string()));
    let fc = items(&v, "function_call")[0];
    assert_eq!(
        (&fc["call_id"], &fc["name"], &fc["arguments"]),
        (&json!(CALL_ID), &json!("get_weather"), &json!(ARGUMENTS))
    );
    assert_eq!(v["status"], "completed");
    let first_input = v["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(first_input, c["usage"]["prompt_tokens"].as_u64().unwrap());
    assert_eq!(v["usage"]["output_tokens"], c["usage"]["completion_tokens"]);
    let (_, done) = streamed(&router, &first).await;
    assert_eq!(items(&done, "function_call")[0]["arguments"], json!(ARGUMENTS));
    // A streamed response is stored as it was answered.
    let (s, kept) = json_call(&router, get(&format!("/v1/responses/{}", done["id"].as_str().unwrap()))).await;
    assert_eq!((s, &kept), (StatusCode::OK, &done));

    // The result back by previous_response_id: the stored conversation and the new item.
    let result = json!({"type": "function_call_output", "call_id": CALL_ID, "output": "18 C, clear"});
    let next = json!({"previous_response_id": v["id"], "input": [result], "tools": weather(),
        "max_output_tokens": 32, "temperature": 0});
    let n = respond(&router, &next).await;
    let cached = n["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    eprintln!(
        "previous_response_id: first input {first_input} tokens, follow-up {} with {cached} cached",
        n["usage"]["input_tokens"]
    );
    assert!(cached >= first_input, "the follow-up resumes the first prompt's state: {cached} < {first_input}: {n}");
    // The same as resending the whole history (store false), and as the chat route's turn.
    let mut history = vec![json!({"role": "user", "content": "Weather in Paris?"})];
    history.extend(v["output"].as_array().unwrap().iter().cloned());
    history.push(result);
    let resent = respond(
        &router,
        &json!({"input": history, "tools": weather(), "max_output_tokens": 32,
        "temperature": 0, "store": false}),
    )
    .await;
    let chat_next = json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": REPLY, "reasoning_content": REASONING, "tool_calls": c["choices"][0]["message"]["tool_calls"]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "18 C, clear"},
    ], "tools": chat_weather(), "max_tokens": 32, "temperature": 0});
    let cn = ask(&router, &chat_next).await;
    let (a, b, r) = (response_facts(&n), response_facts(&resent), chat_facts(&cn));
    assert_eq!((&a.0, &a.1, a.2, a.4), (&b.0, &b.1, b.2, b.4));
    assert_eq!((&a.0, &a.1, a.2, a.4), (&r.0, &r.1, r.2, r.4));
    // Not stored with store false; the first is, until deleted.
    let (s, _) = json_call(&router, get(&format!("/v1/responses/{}", resent["id"].as_str().unwrap()))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let id = v["id"].as_str().unwrap();
    let (s, got) = json_call(&router, get(&format!("/v1/responses/{id}"))).await;
    assert_eq!((s, &got), (StatusCode::OK, &v));
    let (s, listed) =
        json_call(&router, get(&format!("/v1/responses/{}/input_items?order=asc", n["id"].as_str().unwrap()))).await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    let types: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["message", "reasoning", "message", "function_call", "function_call_output"], "{listed}");
    let del = Request::delete(format!("/v1/responses/{id}")).body(Body::empty()).unwrap();
    let (s, d) = json_call(&router, del).await;
    assert_eq!((s, d), (StatusCode::OK, json!({"id": id, "object": "response", "deleted": true})));
    let (s, e) = json_call(&router, post("/v1/responses", &next)).await;
    assert_eq!((s, e["error"]["param"].as_str()), (StatusCode::NOT_FOUND, Some("previous_response_id")), "{e}");
}

#[tokio::test]
async fn the_store_keeps_the_newest_within_its_bounds_and_apart_per_key() {
    let mut opts = ServerOptions::new(fixture("default.waste"));
    opts.responses = StoreLimits { count: 2, bytes: 1 << 20 };
    opts.boundary.api_keys = vec!["alice".into(), "bob".into()];
    let router = server(opts).await;
    let with_key = |req: Request<Body>, key: &str| {
        let (mut parts, body) = req.into_parts();
        parts.headers.insert("authorization", format!("Bearer {key}").parse().unwrap());
        Request::from_parts(parts, body)
    };
    let body = json!({"input": "Hello", "max_output_tokens": 2, "temperature": 0});
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, v) = json_call(&router, with_key(post("/v1/responses", &body), "alice")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let status = |id: &str, key: &'static str| {
        let router = router.clone();
        let uri = format!("/v1/responses/{id}");
        async move { json_call(&router, with_key(get(&uri), key)).await.0 }
    };
    assert_eq!(status(&ids[0], "alice").await, StatusCode::NOT_FOUND, "the oldest went");
    assert_eq!(status(&ids[2], "alice").await, StatusCode::OK);
    assert_eq!(status(&ids[2], "bob").await, StatusCode::NOT_FOUND, "another key reads nothing");
    let del = with_key(Request::delete(format!("/v1/responses/{}", ids[2])).body(Body::empty()).unwrap(), "bob");
    assert_eq!(json_call(&router, del).await.0, StatusCode::NOT_FOUND, "nor deletes");
    let next = json!({"input": "Again", "previous_response_id": ids[2], "max_output_tokens": 2});
    let (s, e) = json_call(&router, with_key(post("/v1/responses", &next), "bob")).await;
    assert_eq!((s, e["error"]["param"].as_str()), (StatusCode::NOT_FOUND, Some("previous_response_id")));
    assert_eq!(status(&ids[2], "alice").await, StatusCode::OK, "still alice's");

    // A byte bound smaller than one response keeps none.
    let mut opts = ServerOptions::new(fixture("default.waste"));
    opts.responses = StoreLimits { count: 10, bytes: 200 };
    let router = server(opts).await;
    let v = respond(&router, &body).await;
    let (s, _) = json_call(&router, get(&format!("/v1/responses/{}", v["id"].as_str().unwrap()))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn text_format_json_schema_is_the_chat_routes_response_format() {
    let router = server(ServerOptions::new(fixture("default.waste"))).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["n", "ok"], "additionalProperties": false});
    let chat = json!({"messages": [{"role": "user", "content": "A number?"}], "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}}});
    let reference = chat_facts(&ask(&router, &chat).await);
    let resp = json!({"input": "A number?", "max_output_tokens": 40, "temperature": 0, "store": false,
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}}});
    let v = respond(&router, &resp).await;
    assert_eq!(output_text(&v), reference.0);
    if v["status"] == "completed" {
        let parsed: Value = serde_json::from_str(&output_text(&v)).unwrap();
        assert!(parsed["n"].is_number() && parsed["ok"].is_boolean(), "{parsed}");
    }
    assert_eq!(v["text"]["format"]["name"], "answer");
}

#[tokio::test]
async fn a_cut_answer_is_incomplete() {
    let router = server(ServerOptions::new(fixture("default.waste"))).await;
    let body = json!({"input": "Tell me a long story.", "max_output_tokens": 3, "temperature": 0, "store": false});
    let v = respond(&router, &body).await;
    assert_eq!(
        (v["status"].as_str(), &v["incomplete_details"]),
        (Some("incomplete"), &json!({"reason": "max_output_tokens"}))
    );
    assert_eq!(v["usage"]["output_tokens"], 3);
    assert_eq!(items(&v, "message")[0]["status"], "incomplete");
    let (ev, _) = streamed(&router, &body).await;
    assert_eq!(ev.last().unwrap().0, "response.incomplete");
}

#[tokio::test]
async fn errors_name_the_field_as_the_client_wrote_it() {
    let router = server(ServerOptions::new(tool_model())).await;
    let png = "data:image/png;base64,iVBORw0KGgo=";
    for (body, status, field) in [
        (json!({"input": "x", "warp": 9}), 400, "warp"),
        (
            json!({"input": [{"role": "user", "content": "a"}, {"role": "user", "content": [
            {"type": "input_text", "text": "b"}, {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}),
            400,
            "input[1].content[1].image_url",
        ),
        // The chat route's own refusal, renamed: this model reads no images.
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": png}]}]}),
            400,
            "input[0].content[0]",
        ),
        (json!({"input": "x", "tools": [{"type": "web_search"}]}), 400, "tools[0].type"),
        (json!({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}), 400, "tools[0].name"),
        (json!({"input": "x", "max_output_tokens": 0}), 400, "max_output_tokens"),
        (json!({"input": "x", "temperature": -1}), 400, "temperature"),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}}),
            400,
            "text.format.schema",
        ),
        (
            json!({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": weather()}),
            400,
            "tool_choice",
        ),
        (json!({"input": "x", "previous_response_id": "resp_nope"}), 404, "previous_response_id"),
        (json!({"input": "x", "background": true}), 400, "background"),
        (json!({"input": "x", "include": ["message.output_text.logprobs"]}), 400, "include[0]"),
    ] {
        let (s, e) = json_call(&router, post("/v1/responses", &body)).await;
        assert_eq!((s.as_u16(), e["error"]["param"].as_str()), (status, Some(field)), "{body}: {e}");
        assert!(e["error"]["message"].is_string() && e["error"]["type"].is_string(), "OpenAI's shape: {e}");
    }
}
