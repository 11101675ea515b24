//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) checked against the
//! same conversation through `/v1/chat/completions` (itself checked against independent
//! references): the same seed gives the same text, reasoning, calls and token counts, on Kimi
//! Linear (`fixtures/default.waste`), the scripted tool caller (`tests/tools.rs`'s) and the tiny
//! K3 with its vision tower (`tests/images.rs`'s: a K3 that thinks and has a tokenizer;
//! `fixtures/tiny-k3.waste` has none, so no chat runs on it). Then the tool round trip resumed
//! from the prefix cache, the SSE stream's order and deltas, stop sequences, the thinking budget,
//! and errors in Anthropic's shape.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::Router;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use common::{call, json_call, post, server, sse_events};
use k3_convert::synth::scripted::{ARGUMENTS, CALL_ID, REASONING, REPLY, tool_caller};
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use serde_json::{Value, json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn default_model() -> PathBuf {
    fixtures().join("default.waste")
}

fn tool_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("messages-tool-caller");
        let _ = std::fs::remove_dir_all(&dir);
        tool_caller(&fixtures().join("golden/tiny-kimi-linear"), &dir.join("hf")).unwrap();
        convert(&ConvertOptions::new(dir.join("hf"), dir.join("tool-caller")), &mut |_| {}).unwrap();
        dir
    });
    dir.join("tool-caller")
}

fn vision_model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("messages-vision");
        let _ = std::fs::remove_dir_all(&dir);
        convert(&ConvertOptions::new(fixtures().join("golden/tiny-k3-vision"), dir.join("m")), &mut |_| {}).unwrap();
        dir.join("m")
    })
    .clone()
}

fn picture_b64() -> String {
    let png = std::fs::read(fixtures().join("golden/tiny-k3-vision/golden/picture.png")).unwrap();
    base64::engine::general_purpose::STANDARD.encode(png)
}

async fn messages(router: &Router, body: &Value) -> (StatusCode, Value) {
    json_call(router, post("/v1/messages", body)).await
}

async fn ok_messages(router: &Router, body: &Value) -> Value {
    let (s, v) = messages(router, body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

async fn chat(router: &Router, body: &Value) -> Value {
    let (s, v) = json_call(router, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

/// The blocks of type `kind`, their `field` joined.
fn joined(msg: &Value, kind: &str, field: &str) -> String {
    msg["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == kind)
        .map(|b| b[field].as_str().unwrap())
        .collect()
}

/// A message answer says what the chat answer says, in Anthropic's terms.
fn assert_same(chat: &Value, msg: &Value) {
    let m = &chat["choices"][0]["message"];
    assert_eq!(msg["type"], "message");
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"), "{msg}");
    assert_eq!(joined(msg, "text", "text"), m["content"].as_str().unwrap_or(""), "{chat}\n{msg}");
    assert_eq!(joined(msg, "thinking", "thinking"), m["reasoning_content"].as_str().unwrap_or(""), "{chat}\n{msg}");
    let uses: Vec<(Value, Value)> = msg["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| (b["name"].clone(), b["input"].clone()))
        .collect();
    let calls: Vec<(Value, Value)> = m["tool_calls"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
                    (c["function"]["name"].clone(), args)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(uses, calls, "{chat}\n{msg}");
    let (u, cu) = (&msg["usage"], &chat["usage"]);
    let input = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(input, cu["prompt_tokens"].as_u64().unwrap(), "{chat}\n{msg}");
    assert_eq!(u["output_tokens"], cu["completion_tokens"], "{chat}\n{msg}");
    let reason = match chat["choices"][0]["finish_reason"].as_str().unwrap() {
        "stop" => "end_turn",
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        other => panic!("{other}"),
    };
    assert_eq!(msg["stop_reason"], reason, "{msg}");
}

#[tokio::test]
async fn kimi_linear_answers_as_chat_completions_does() {
    let router = server(ServerOptions::new(default_model())).await;
    let anthropic = json!({"max_tokens": 12, "temperature": 0.9, "seed": 11, "top_k": 40, "top_p": 0.9,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "u1"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"}]});
    let openai = json!({"max_tokens": 12, "temperature": 0.9, "seed": 11, "top_k": 40, "top_p": 0.9,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
            {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"}]});
    let c = chat(&router, &openai).await;
    let m = ok_messages(&router, &anthropic).await;
    assert_same(&c, &m);
    // The chat request kept the prompt's state: the same prompt is read from the cache.
    assert!(m["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["usage"]["cache_creation_input_tokens"], 0);
    assert_eq!(m["model"], "default");
    // count_tokens: the prompt exactly as /v1/messages ran it.
    let mut count = anthropic.clone();
    for k in ["max_tokens", "temperature", "seed", "top_k", "top_p", "metadata"] {
        count.as_object_mut().unwrap().remove(k);
    }
    let (s, n) = json_call(&router, post("/v1/messages/count_tokens", &count)).await;
    assert_eq!(s, StatusCode::OK, "{n}");
    assert_eq!(n, json!({"input_tokens": c["usage"]["prompt_tokens"]}));
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])
}

fn openai_weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

#[tokio::test]
async fn a_tool_round_trip_resumes_from_the_prefix_cache() {
    let router = server(ServerOptions::new(tool_model())).await;
    let user = json!({"role": "user", "content": "Weather in Paris?"});
    let body = json!({"max_tokens": 32, "temperature": 0, "tools": weather_tools(), "messages": [user]});
    let c = chat(
        &router,
        &json!({"max_tokens": 32, "temperature": 0, "tools": openai_weather_tools(),
        "messages": [user]}),
    )
    .await;
    let first = ok_messages(&router, &body).await;
    assert_same(&c, &first);
    assert_eq!(first["stop_reason"], "tool_use");
    let content = first["content"].as_array().unwrap();
    assert_eq!(
        content.iter().map(|b| b["type"].as_str().unwrap()).collect::<Vec<_>>(),
        ["thinking", "text", "tool_use"]
    );
    assert_eq!((content[0]["thinking"].as_str(), content[1]["text"].as_str()), (Some(REASONING), Some(REPLY)));
    assert!(content[0]["signature"].as_str().is_some_and(|s| !s.is_empty()));
    let call: Value = serde_json::from_str(ARGUMENTS).unwrap();
    assert_eq!(
        (&content[2]["id"], &content[2]["name"], &content[2]["input"]),
        (&json!(CALL_ID), &json!("get_weather"), &call)
    );
    let first_prompt =
        first["usage"]["input_tokens"].as_u64().unwrap() + first["usage"]["cache_read_input_tokens"].as_u64().unwrap();

    // The client runs the tool and sends back the answer's blocks as they came, then the result.
    let mut next = body.clone();
    next["messages"] = json!([user, {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": "18 C, clear"}]}]);
    let second = ok_messages(&router, &next).await;
    let u = &second["usage"];
    assert!(u["cache_read_input_tokens"].as_u64().unwrap() >= first_prompt, "{first}\n{second}");
    assert!(u["input_tokens"].as_u64().unwrap() > 0, "the result is new: {second}");
    // The same history through the chat route: the same answer. The call's input comes back as
    // this client writes JSON (serde_json: no spaces), so the arguments are that text.
    let sent_arguments = content[2]["input"].to_string();
    let c2 = chat(
        &router,
        &json!({"max_tokens": 32, "temperature": 0, "tools": openai_weather_tools(), "messages": [
        user,
        {"role": "assistant", "content": REPLY, "reasoning_content": REASONING, "tool_calls": [{"id": CALL_ID,
            "type": "function", "function": {"name": "get_weather", "arguments": sent_arguments}}]},
        {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "18 C, clear"}]}),
    )
    .await;
    assert_same(&c2, &second);

    // disable_parallel_tool_use: the turn ends at its first call, as parallel_tool_calls false.
    let mut one = body.clone();
    one["tool_choice"] = json!({"type": "auto", "disable_parallel_tool_use": true});
    let m = ok_messages(&router, &one).await;
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    // tool_choice none: no call is read.
    one["tool_choice"] = json!({"type": "none"});
    let m = ok_messages(&router, &one).await;
    assert!(!m["content"].as_array().unwrap().iter().any(|b| b["type"] == "tool_use"), "{m}");
}

#[tokio::test]
async fn the_stream_opens_and_closes_blocks_in_order_and_adds_up_to_the_answer() {
    let router = server(ServerOptions::new(tool_model())).await;
    let mut body = json!({"max_tokens": 32, "temperature": 0, "tools": weather_tools(),
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let whole = ok_messages(&router, &body).await;
    body["stream"] = json!(true);
    let (s, text) = call(&router, post("/v1/messages", &body)).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let ev = sse_events(&text);
    for (name, data) in &ev {
        assert_eq!(data["type"], name.as_str(), "the event's name is its data's type");
    }
    let names: Vec<String> = ev
        .iter()
        .map(|(n, d)| match n.as_str() {
            "content_block_start" => format!("start {} {}", d["index"], d["content_block"]["type"].as_str().unwrap()),
            "content_block_delta" => format!("delta {} {}", d["index"], d["delta"]["type"].as_str().unwrap()),
            "content_block_stop" => format!("stop {}", d["index"]),
            other => other.to_string(),
        })
        .collect();
    let mut squeezed: Vec<&str> = names.iter().map(String::as_str).collect();
    squeezed.dedup();
    assert_eq!(
        squeezed,
        [
            "message_start",
            "ping",
            "start 0 thinking",
            "delta 0 thinking_delta",
            "delta 0 signature_delta",
            "stop 0",
            "start 1 text",
            "delta 1 text_delta",
            "stop 1",
            "start 2 tool_use",
            "delta 2 input_json_delta",
            "stop 2",
            "message_delta",
            "message_stop"
        ],
        "{text}"
    );
    // The deltas reassembled are the whole answer.
    let mut blocks: Vec<Value> = Vec::new();
    let mut json_parts = String::new();
    let mut last = Value::Null;
    for (name, d) in &ev {
        match name.as_str() {
            "content_block_start" => blocks.push(d["content_block"].clone()),
            "content_block_delta" => {
                let b = blocks.last_mut().unwrap();
                let delta = &d["delta"];
                match delta["type"].as_str().unwrap() {
                    "thinking_delta" => {
                        b["thinking"] =
                            json!(format!("{}{}", b["thinking"].as_str().unwrap(), delta["thinking"].as_str().unwrap()))
                    }
                    "signature_delta" => b["signature"] = delta["signature"].clone(),
                    "text_delta" => {
                        b["text"] = json!(format!("{}{}", b["text"].as_str().unwrap(), delta["text"].as_str().unwrap()))
                    }
                    "input_json_delta" => json_parts.push_str(delta["partial_json"].as_str().unwrap()),
                    other => panic!("{other}"),
                }
            }
            "content_block_stop" if blocks.last().unwrap()["type"] == "tool_use" => {
                blocks.last_mut().unwrap()["input"] = serde_json::from_str(&std::mem::take(&mut json_parts)).unwrap();
            }
            "message_delta" => last = d.clone(),
            _ => {}
        }
    }
    assert_eq!(json!(blocks), whole["content"], "{text}");
    assert_eq!(last["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(last["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    let start = &ev[0].1["message"];
    assert_eq!((start["role"].as_str(), start["content"].as_array().map(Vec::len)), (Some("assistant"), Some(0)));
}

#[tokio::test]
async fn a_stop_sequence_is_named_and_cuts_the_text() {
    let router = server(ServerOptions::new(default_model())).await;
    let mut body = json!({"max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "Count."}]});
    let free = ok_messages(&router, &body).await;
    let text = joined(&free, "text", "text");
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "{free}");
    let stop: String = chars[3..5].iter().collect();
    let before = &text[..text.find(&stop).unwrap()];
    body["stop_sequences"] = json!([stop]);
    let m = ok_messages(&router, &body).await;
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop.as_str())),
        "{m}"
    );
    assert_eq!(joined(&m, "text", "text"), before, "{m}");
    body["stream"] = json!(true);
    let (_, sse) = call(&router, post("/v1/messages", &body)).await;
    let delta = sse_events(&sse).into_iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(delta["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": stop}), "{sse}");
    // Without a stop string, no stop_sequence.
    assert_eq!(free["stop_sequence"], Value::Null);
}

/// The text before any character a cut left unfinished (U+FFFD).
fn whole_chars(t: &str) -> &str {
    t.trim_end_matches('\u{fffd}')
}

/// K3 (the tiny vision K3, random weights) thinks the same tokens with a budget as without,
/// until the budget is spent: each budget's thought is a prefix of the next one's and of the
/// unbounded thought, which is longer. (The scripted tool caller thinks its sentence as one
/// token: no budget can cut it.)
#[tokio::test]
async fn a_thinking_budget_cuts_the_thought() {
    let router = server(ServerOptions::new(vision_model())).await;
    let body = json!({"max_tokens": 40, "seed": 9, "messages": [{"role": "user", "content": "Think."}]});
    let free = ok_messages(&router, &body).await;
    let mut thoughts = Vec::new();
    for budget in [2, 6] {
        let mut b = body.clone();
        b["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
        let m = ok_messages(&router, &b).await;
        assert!(m["usage"]["output_tokens"].as_u64().unwrap() <= 40, "{m}");
        thoughts.push(joined(&m, "thinking", "thinking"));
    }
    let free_thought = joined(&free, "thinking", "thinking");
    let (short, long) = (whole_chars(&thoughts[0]), whole_chars(&thoughts[1]));
    assert!(long.starts_with(short) && short.len() < long.len(), "{thoughts:?}");
    assert!(free_thought.starts_with(long) && long.len() < free_thought.len(), "{thoughts:?} {free_thought:?}");
    // budget_tokens below max_tokens, as Anthropic requires.
    let mut over = body.clone();
    over["thinking"] = json!({"type": "enabled", "budget_tokens": 40});
    let (s, v) = messages(&router, &over).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("thinking.budget_tokens:"), "{v}");
}

#[tokio::test]
async fn k3_thinks_and_its_image_counts_as_chat_completions_counts_it() {
    let router = server(ServerOptions::new(vision_model())).await;
    let user = |image: Value| json!({"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image]});
    let anthropic = json!({"max_tokens": 24, "seed": 5, "messages": [user(json!({"type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": picture_b64()}}))]});
    let openai = json!({"max_tokens": 24, "seed": 5, "messages": [user(json!({"type": "image_url",
        "image_url": {"url": format!("data:image/png;base64,{}", picture_b64())}}))]});
    let c = chat(&router, &openai).await;
    let m = ok_messages(&router, &anthropic).await;
    assert_same(&c, &m);
    let free_thought = joined(&m, "thinking", "thinking");
    assert!(!free_thought.is_empty(), "K3 thinks by default: {m}");
    let mut count = anthropic.clone();
    count.as_object_mut().unwrap().retain(|k, _| k == "messages");
    let (s, n) = json_call(&router, post("/v1/messages/count_tokens", &count)).await;
    assert_eq!((s, &n["input_tokens"]), (StatusCode::OK, &c["usage"]["prompt_tokens"]), "{n}");

    // max_tokens bounds thinking and answer together.
    let mut b = anthropic.clone();
    b["thinking"] = json!({"type": "enabled", "budget_tokens": 3});
    b["max_tokens"] = json!(5);
    let m = ok_messages(&router, &b).await;
    assert!(m["usage"]["output_tokens"].as_u64().unwrap() <= 5, "{m}");
    // Disabled: no thinking, as reasoning_effort none.
    b["thinking"] = json!({"type": "disabled"});
    let m = ok_messages(&router, &b).await;
    assert_eq!(joined(&m, "thinking", "thinking"), "", "{m}");
}

/// An error in Anthropic's shape: its type and message.
fn anthropic_error(v: &Value) -> (&str, &str) {
    assert_eq!(v["type"], "error", "{v}");
    (v["error"]["type"].as_str().unwrap(), v["error"]["message"].as_str().unwrap())
}

#[tokio::test]
async fn errors_come_in_anthropics_shape_naming_the_field() {
    let mut opts = ServerOptions::new(default_model());
    opts.boundary.api_keys = vec!["sesame".into()];
    let router = server(opts).await;
    let send = |body: &Value, key: &str| {
        Request::post("/v1/messages")
            .header("content-type", "application/json")
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "interleaved-thinking-2025-05-14")
            .body(axum::body::Body::from(body.to_string()))
            .unwrap()
    };
    let ok = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    let (s, v) = json_call(&router, send(&ok, "sesame")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = json_call(&router, send(&ok, "wrong")).await;
    assert_eq!((s, anthropic_error(&v).0), (StatusCode::UNAUTHORIZED, "authentication_error"), "{v}");
    let mut bad_model = ok.clone();
    bad_model["model"] = json!("claude-nope");
    let (s, v) = json_call(&router, send(&bad_model, "sesame")).await;
    assert_eq!((s, anthropic_error(&v).0), (StatusCode::NOT_FOUND, "not_found_error"), "{v}");
    let image = |src: Value| {
        json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "source": src}]}]})
    };
    for (body, field) in [
        (json!({"max_tokens": 2, "messages": [], "service_tier": "auto"}), "service_tier"),
        (json!({"max_tokens": 2, "messages": [], "mcp_servers": []}), "mcp_servers"),
        (json!({"messages": [{"role": "user", "content": "hi"}]}), "max_tokens"),
        (image(json!({"type": "url", "url": "https://example.com/a.png"})), "messages[2].content[1].source.type"),
        (
            image(json!({"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"})),
            "messages[2].content[1]",
        ),
        (
            json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "bash_20250124", "name": "bash"}]}),
            "tools[0].type",
        ),
        (
            json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"name": "a b", "input_schema": {"type": "object"}}]}),
            "tools[0].name",
        ),
        (
            json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": [""]}),
            "stop_sequences",
        ),
    ] {
        let (s, v) = json_call(&router, send(&body, "sesame")).await;
        let (kind, message) = anthropic_error(&v);
        assert_eq!((s, kind), (StatusCode::BAD_REQUEST, "invalid_request_error"), "{body}: {v}");
        assert!(message.starts_with(&format!("{field}:")), "{field}: {v}");
    }
    // A model that does not think refuses a thinking budget, naming `thinking`.
    let think = json!({"max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 4}});
    let (s, v) = json_call(&router, send(&think, "sesame")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(anthropic_error(&v).1.starts_with("thinking:"), "{v}");

    // A prompt the context cannot hold: Anthropic's words, which Claude Code compacts on.
    let list = Request::get("/v1/models").header("x-api-key", "sesame").body(axum::body::Body::empty()).unwrap();
    let (_, models) = json_call(&router, list).await;
    let context = models["data"][0]["context_length"].as_u64().unwrap();
    let long =
        json!({"max_tokens": 2, "messages": [{"role": "user", "content": "tick ".repeat(context as usize + 8)}]});
    let (s, v) = json_call(&router, send(&long, "sesame")).await;
    let (kind, message) = anthropic_error(&v);
    assert_eq!((s, kind), (StatusCode::BAD_REQUEST, "invalid_request_error"), "{v}");
    let rest = message.strip_prefix("prompt is too long: ").unwrap_or_else(|| panic!("{v}"));
    let (n, m) = rest.split_once(" tokens > ").unwrap();
    assert_eq!(m, format!("{} maximum", context - 1), "{v}");
    assert!(n.parse::<u64>().unwrap() >= context, "{v}");
}

/// A second turn as Claude Code 2.1 sends it (its logged body, the prompts shortened): adaptive
/// thinking, an effort, a thinking edit that keeps all, cache_control on blocks, the thinking
/// block sent back with its signature, a tool_result marked as an error; `display: omitted`
/// sends thinking blocks without their text.
#[tokio::test]
async fn claude_codes_second_turn_is_answered() {
    let router = server(ServerOptions::new(tool_model())).await;
    let mut body = json!({
        "model": "tool-caller", "max_tokens": 32000, "stream": true,
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}, "thinking": {"type": "adaptive"},
        "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"},
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.644;"},
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Read", "description": "read files", "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"file_path": {"type": "string"}}, "required": ["file_path"], "additionalProperties": false}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>\nDate.\n</system-reminder>\n\n"},
                {"type": "text", "text": "What is the weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"signature": "k3-7ad31f9c4a0a2374", "thinking": REASONING, "type": "thinking"},
                {"text": REPLY, "type": "text"},
                {"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "is_error": true, "tool_use_id": CALL_ID,
                "content": "<tool_use_error>Error: No such tool available: get_weather</tool_use_error>",
                "cache_control": {"type": "ephemeral"}}]}]});
    let (s, text) = call(&router, post("/v1/messages", &body)).await;
    assert_eq!(s, StatusCode::OK, "{text}");
    let ev = sse_events(&text);
    let stop = ev.iter().find(|(n, _)| n == "message_delta").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(stop.1["delta"]["stop_reason"], "tool_use", "{text}");
    body["stream"] = json!(false);
    body["thinking"]["display"] = json!("omitted");
    let m = ok_messages(&router, &body).await;
    let thinking = &m["content"][0];
    assert_eq!((thinking["type"].as_str(), thinking["thinking"].as_str()), (Some("thinking"), Some("")), "{m}");
    assert!(thinking["signature"].as_str().is_some_and(|s| !s.is_empty()), "{m}");
}
