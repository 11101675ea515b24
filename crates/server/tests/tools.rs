//! A tool-call round trip over HTTP in Kimi's `im_` markup, on a model whose weights make it call
//! a tool (`k3_convert::synth::scripted`: every answer is a thought between `<think>` tokens, a
//! sentence and a `get_weather` call): the thought comes back as `reasoning_content`,
//! the call comes back as OpenAI `tool_calls`, whole and streamed, with `finish_reason:
//! tool_calls`; the client's next request (the call and its result in the history) is rendered as
//! an extension of the first prompt, so the prompt cache resumes it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::http::StatusCode;
use k3_convert::synth::scripted::{ARGUMENTS, CALL_ID, REASONING, REPLY, tool_caller};
use k3_convert::{ConvertOptions, convert};
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{call, json_call, post, server, sse_data};

/// The scripted model, converted once per test binary.
fn model() -> PathBuf {
    // Built afresh once per run in cargo's per-target scratch directory, not in a `TempDir` held
    // by a static: statics are never dropped, so that leaked a model into /tmp on every run.
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-tool-caller");
        let _ = std::fs::remove_dir_all(&dir);
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/tiny-kimi-linear");
        tool_caller(&base, &dir.join("hf")).unwrap();
        convert(&ConvertOptions::new(dir.join("hf"), dir.join("tool-caller")), &mut |_| {}).unwrap();
        dir
    });
    dir.join("tool-caller")
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

fn request(messages: Value, stream: bool) -> Value {
    json!({"messages": messages, "tools": weather_tool(), "max_tokens": 32, "temperature": 0, "stream": stream})
}

#[tokio::test]
async fn a_tool_call_round_trip_in_kimis_markup() {
    let router = server(ServerOptions::new(model())).await;
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let (s, v) = json_call(&router, post("/v1/chat/completions", &request(user.clone(), false))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], REPLY, "{v}");
    // The thought between `<think>` tokens is the reasoning, apart from the answer.
    assert_eq!(choice["message"]["reasoning_content"], REASONING, "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(
        (&calls[0]["id"], &calls[0]["type"], &calls[0]["function"]["name"], &calls[0]["function"]["arguments"]),
        (&json!(CALL_ID), &json!("function"), &json!("get_weather"), &json!(ARGUMENTS))
    );
    let first_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();

    // Streamed: the text as content deltas, the call whole in one tool_calls delta.
    let (s, body) = call(&router, post("/v1/chat/completions", &request(user.clone(), true))).await;
    assert_eq!(s, StatusCode::OK);
    let chunks: Vec<Value> =
        sse_data(&body).iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, REPLY);
    let reasoning: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str()).collect();
    assert_eq!(reasoning, REASONING);
    let streamed: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert_eq!(streamed, [&calls[0]], "{body}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");

    // The client runs the tool and sends the result back.
    let mut history = user.as_array().unwrap().clone();
    history.push(json!({"role": "assistant", "content": REPLY, "tool_calls": calls}));
    history.push(json!({"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": "18 C, clear"}));
    let (s, v) = json_call(&router, post("/v1/chat/completions", &request(json!(history), false))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > first_prompt, "{v}");
    // The first prompt is a prefix of the second, token for token: its kept state is resumed.
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(first_prompt), "{v}");
    assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather", "{v}");
}

#[tokio::test]
async fn malformed_declarations_and_undeclared_choices_are_refused() {
    let router = server(ServerOptions::new(model())).await;
    let mut body = request(json!([{"role": "user", "content": "Weather?"}]), false);
    for (tools, choice, param) in [
        (json!({"a": 1}), json!("auto"), "tools"),
        (
            json!([{"type": "function", "function": {"description": "no name"}}]),
            json!("auto"),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
            json!("auto"),
            "tools[0].function.parameters",
        ),
        (weather_tool(), json!({"type": "function", "function": {"name": "get_time"}}), "tool_choice"),
    ] {
        body["tools"] = tools.clone();
        body["tool_choice"] = choice;
        let (s, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
        assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(param)), "{tools}: {v}");
    }
}

#[tokio::test]
async fn tool_choice_none_reads_no_calls() {
    let router = server(ServerOptions::new(model())).await;
    let mut body = request(json!([{"role": "user", "content": "Weather?"}]), false);
    body["tool_choice"] = json!("none");
    let (s, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none(), "{v}");
    // The call the scripted model makes anyway comes back as it wrote it, markers and all.
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        text.contains("<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"),
        "the call is glued: {text}"
    );
    body["tool_choice"] = json!("sometimes");
    let (s, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tool_choice")), "{v}");
}

/// A new task under the same system prompt and tools, on a server restarted since another task
/// ran: it resumes the state kept on disk after the system turn and the tool declarations, and
/// answers (the call included) as a server without any cache.
#[tokio::test]
async fn a_restarted_server_resumes_the_system_turn_and_tools() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let with_dir = |ram: usize| ServerOptions {
        prompt_cache_ram: ram,
        prompt_cache_dir: Some(dir.path().to_path_buf()),
        ..ServerOptions::new(model())
    };
    let task = |city: &str| {
        request(
            json!([{"role": "system", "content": "You are a weather assistant. Call a tool for every city."},
                   {"role": "user", "content": format!("Weather in {city}?")}]),
            false,
        )
    };
    let first = server(with_dir(1 << 30)).await;
    let (s, v) = json_call(&first, post("/v1/chat/completions", &task("Paris"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let files = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "k3state"))
            .count()
    };
    for _ in 0..1000 {
        if files() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(files() >= 2, "the boundary and the prompt's end were written");
    let restarted = server(with_dir(0)).await;
    let fresh = server(ServerOptions { prompt_cache_ram: 0, ..ServerOptions::new(model()) }).await;
    let (_, v) = json_call(&restarted, post("/v1/chat/completions", &task("Rome"))).await;
    let (_, reference) = json_call(&fresh, post("/v1/chat/completions", &task("Rome"))).await;
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // The system turn and the tool declarations are most of the prompt; the question is computed.
    assert!(cached > prompt / 2 && cached < prompt, "the system turn and the tools: {}", v["usage"]);
    assert_eq!(v["choices"], reference["choices"]);
}

/// A strict tool: the call's arguments are held to the function's schema as they are written.
/// The scripted model would write `{"city": "Paris"}`; with `city` limited to `["Oslo"]` the
/// arguments it is let write are `{"city":"Oslo"}` (byte by byte: every other token is masked),
/// and the call ends there. Without `strict`, the same schema changes nothing.
#[tokio::test]
async fn a_strict_tools_arguments_are_held_to_its_schema() {
    let router = server(ServerOptions::new(model())).await;
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let tool = |strict: bool| {
        json!([{"type": "function", "function": {"name": "get_weather", "strict": strict, "parameters":
            {"type": "object", "properties": {"city": {"enum": ["Oslo"]}}, "required": ["city"],
             "additionalProperties": false}}}])
    };
    let mut body = request(user.clone(), false);
    body["max_tokens"] = json!(64);
    for (strict, want) in [(true, json!({"city": "Oslo"})), (false, json!({"city": "Paris"}))] {
        body["tools"] = tool(strict);
        let (s, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert_eq!((args, v["choices"][0]["finish_reason"].as_str()), (want, Some("tool_calls")), "{v}");
    }
    // A strict schema the server cannot honour is refused, naming where.
    body["tools"][0]["function"]["strict"] = json!(true);
    body["tools"][0]["function"]["parameters"]["properties"]["city"] = json!({"type": "string", "pattern": "^O"});
    let (s, v) = json_call(&router, post("/v1/chat/completions", &body)).await;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (StatusCode::BAD_REQUEST, Some("tools[0].function.parameters")),
        "{v}"
    );
    assert!(v["error"]["message"].as_str().unwrap().contains("pattern"), "{v}");
}

/// `parallel_tool_calls: false`: the turn ends at its first call, and says `tool_calls`. The
/// sequence is cancelled when the reply reads the call, which takes effect at the engine's next
/// step: on an idle machine before the markup that closes the call section is written (fewer
/// tokens), on a loaded one (CI's, once) possibly not; greedy decoding makes it never more.
#[tokio::test]
async fn one_call_at_most_ends_the_turn_at_the_call() {
    let router = server(ServerOptions::new(model())).await;
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let all = ask_ok(&router, &request(user.clone(), false)).await;
    let mut body = request(user, false);
    body["parallel_tool_calls"] = json!(false);
    let one = ask_ok(&router, &body).await;
    let tokens = |v: &Value| v["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(one["choices"][0]["finish_reason"], "tool_calls", "{one}");
    assert_eq!(one["choices"][0]["message"]["tool_calls"], all["choices"][0]["message"]["tool_calls"]);
    assert!(tokens(&one) <= tokens(&all), "{one} vs {all}");
}

async fn ask_ok(router: &axum::Router, body: &Value) -> Value {
    let (s, v) = json_call(router, post("/v1/chat/completions", body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}
