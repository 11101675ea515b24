//! The server's edges: a damaged shard fails only the requests that read it (and is read again
//! once its bytes are back), `/health` honest about a stopped scheduler, Ollama's fields typed
//! as Ollama types them, `/tokenize` and `/detokenize` bounded and off the async workers.

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
    opts.prompt_cache_ram = 0;
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

/// Ollama's routes take each field as Ollama's Go structs type it: a value of another JSON type
/// (`stream: "false"`, a number as `model` or `system`) is a 400 naming the field, in Ollama's
/// error shape; `null` is a field's zero value, as in Go.
#[tokio::test]
async fn ollama_fields_of_the_wrong_type_are_refused_by_name() {
    let router = server(ServerOptions::new(default_model())).await;
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        ("/api/chat", json!({"messages": user, "stream": "false"}), "stream"),
        ("/api/chat", json!({"messages": user, "stream": 0}), "stream"),
        ("/api/chat", json!({"model": 5, "messages": user}), "model"),
        ("/api/chat", json!({"messages": "hi"}), "messages"),
        ("/api/chat", json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
        ("/api/chat", json!({"messages": [{"role": 1, "content": "x"}]}), "messages[0].role"),
        ("/api/chat", json!({"messages": [{"role": "user", "content": "x", "thinking": 2}]}), "messages[0].thinking"),
        (
            "/api/chat",
            json!({"messages": [{"role": "tool", "content": "x", "tool_name": []}]}),
            "messages[0].tool_name",
        ),
        (
            "/api/chat",
            json!({"messages": [{"role": "user", "content": "x", "tool_calls": {}}]}),
            "messages[0].tool_calls",
        ),
        ("/api/chat", json!({"messages": user, "keep_alive": true}), "keep_alive"),
        ("/api/chat", json!({"messages": user, "tools": {}}), "tools"),
        ("/api/chat", json!({"messages": user, "options": [1]}), "options"),
        ("/api/generate", json!({"prompt": "hi", "system": 5}), "system"),
        ("/api/generate", json!({"prompt": "hi", "stream": "false"}), "stream"),
        ("/api/generate", json!({"prompt": "hi", "raw": "yes"}), "raw"),
        ("/api/generate", json!({"model": 5}), "model"),
        ("/api/generate", json!({"prompt": 5}), "prompt"),
        ("/api/generate", json!({"prompt": "hi", "images": "aGk="}), "images"),
        ("/api/generate", json!({"prompt": "hi", "suffix": 5}), "suffix"),
        ("/api/show", json!({"model": 5}), "model"),
        ("/api/show", json!({"model": "default", "verbose": "yes"}), "verbose"),
    ];
    for (path, body, field) in cases {
        let (s, v) = json_call(&router, post(path, &body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{path} {body}: not Ollama's error shape: {v}"));
        assert!(e.starts_with(&format!("{field}: ")), "{path} {body}: the error names not `{field}`: {e}");
    }
    // Nulls are fields left unset; the right types are taken.
    let body = json!({"model": null, "prompt": "hi", "system": null, "stream": false, "keep_alive": "5m",
                      "options": {"num_predict": 2}, "suffix": null, "images": null});
    let (s, v) = json_call(&router, post("/api/generate", &body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["done"], true, "{v}");
}

/// `/tokenize` and `/detokenize` are bounded like prompts: more text than a context can hold
/// (the context times the longest token's bytes), more tokens than a context, refused up front
/// with the limit named.
#[tokio::test]
async fn tokenize_and_detokenize_are_bounded_by_the_context() {
    let router = server(ServerOptions::new(default_model())).await;
    // The default model: a context of 4096 tokens, its longest token 15 bytes.
    let (s, v) =
        json_call(&router, post("/tokenize", &json!({"content": " ".repeat(61_441), "with_pieces": true}))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("content")), "{}", v["error"]);
    let e = v["error"]["message"].as_str().unwrap();
    assert!(e.contains("61441 bytes") && e.contains("61440 bytes") && e.contains("4096 tokens"), "{e}");
    // Within the bytes, but each letter a token of its own: more tokens than the context.
    let (s, v) = json_call(&router, post("/tokenize", &json!({"content": "a".repeat(5000)}))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("content")), "{}", v["error"]);
    assert!(v["error"]["message"].as_str().unwrap().contains("5000 tokens, more than the context of 4096"), "{v}");
    let (s, v) = json_call(&router, post("/detokenize", &json!({"tokens": vec![64; 4097]}))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tokens")), "{}", v["error"]);
    assert!(v["error"]["message"].as_str().unwrap().contains("4097 tokens are more than the context of 4096"), "{v}");
    // A context's worth is taken.
    let (s, v) = json_call(&router, post("/detokenize", &json!({"tokens": vec![64; 4096]}))).await;
    assert_eq!((s, v["content"].as_str().map(str::len)), (StatusCode::OK, Some(4096)), "{v}");
}

/// Tokenizing runs off the async workers: on a runtime with one worker, `/health` asked after
/// eight large (allowed) tokenize requests answers before any of them. The order is
/// deterministic, not a race: were tokenizing done on the worker, each request would run whole
/// before `/health` is polled (spawned tasks run in order); off it, every tokenize request waits
/// for its blocking work (or its turn) and its end is queued behind `/health`.
#[tokio::test]
async fn health_answers_before_tokenize_requests_asked_earlier() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let router = server(ServerOptions::new(default_model())).await;
    let text = "hello world ".repeat(1300);
    let finished = Arc::new(AtomicUsize::new(0));
    let mut tokenizing = Vec::new();
    for _ in 0..8 {
        let (router, finished, body) =
            (router.clone(), finished.clone(), json!({"content": text, "with_pieces": true}));
        tokenizing.push(tokio::spawn(async move {
            let (s, v) = json_call(&router, post("/tokenize", &body)).await;
            (s, v["tokens"].as_array().map_or(0, Vec::len), finished.fetch_add(1, Ordering::SeqCst))
        }));
    }
    let (r, f) = (router.clone(), finished.clone());
    let health = tokio::spawn(async move { (json_call(&r, get("/health")).await.0, f.fetch_add(1, Ordering::SeqCst)) });
    let (status, place) = health.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(place, 0, "/health answered after {place} tokenize requests");
    for t in tokenizing {
        let (s, tokens, _) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK);
        assert!((3000..=4096).contains(&tokens), "{tokens} tokens");
    }
}

/// A prompt the context cannot hold is a 400 with OpenAI's `context_length_exceeded` code, the
/// one clients recognise (and compact the conversation on), not only a sentence.
#[tokio::test]
async fn a_prompt_past_the_context_says_context_length_exceeded() {
    let router = server(ServerOptions::new(default_model())).await;
    let long = "word ".repeat(6000);
    let (s, v) = json_call(&router, post("/v1/chat/completions", &chat(&long))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("leaves no room"), "{v}");
    // Other errors keep the status as their code.
    let (s, v) = json_call(&router, post("/v1/chat/completions", &json!({"messages": []}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], 400, "{v}");
}

/// Ollama's routes say it in Ollama's words (what its clients match with `truncate: false`),
/// with the token count; a text too long to tokenize (over the context times the longest token)
/// says it too, without tokenizing it.
#[tokio::test]
async fn ollama_says_a_prompt_past_the_context_in_its_words() {
    let router = server(ServerOptions::new(default_model())).await;
    for words in [6000, 200_000] {
        let body = json!({"model": "default", "stream": false, "truncate": false,
                          "messages": [{"role": "user", "content": "word ".repeat(words)}]});
        let (s, v) = json_call(&router, post("/api/chat", &body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        let e = v["error"].as_str().unwrap();
        assert!(
            e.starts_with("request (") && e.contains("tokens) exceeds the available context size (4096 tokens)"),
            "{e}"
        );
    }
    let (s, v) = json_call(&router, post("/v1/chat/completions", &chat(&"word ".repeat(200_000)))).await;
    assert_eq!((s, v["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("context_length_exceeded")), "{v}");
}

/// `num_ctx` above the server's context is clamped, as Ollama clamps it: the request is
/// answered, and the header says the context it ran in.
#[tokio::test]
async fn ollama_num_ctx_above_the_context_is_clamped() {
    let router = server(ServerOptions::new(default_model())).await;
    let body = json!({"model": "default", "stream": false, "options": {"num_ctx": 131072, "num_predict": 2},
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = tower::ServiceExt::oneshot(router.clone(), post("/api/chat", &body)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers().get("x-k3-num-ctx").map(|h| h.to_str().unwrap()), Some("4096"));
    let within =
        json!({"model": "default", "stream": false, "prompt": "hi", "options": {"num_ctx": 2048, "num_predict": 2}});
    let r = tower::ServiceExt::oneshot(router.clone(), post("/api/generate", &within)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().get("x-k3-num-ctx").is_none());
    let over =
        json!({"model": "default", "stream": false, "prompt": "hi", "options": {"num_ctx": 9000, "num_predict": 2}});
    let r = tower::ServiceExt::oneshot(router, post("/api/generate", &over)).await.unwrap();
    assert_eq!(r.headers().get("x-k3-num-ctx").map(|h| h.to_str().unwrap()), Some("4096"));
}

/// `chat_template_kwargs` (vLLM's and SGLang's, how Moonshot's docs switch thinking off) is
/// honoured or refused by name, never ignored: on Kimi-Linear, which has no thinking channel,
/// thinking off is what it does anyway, thinking on is refused, and any other key is refused.
#[tokio::test]
async fn chat_template_kwargs_are_honoured_or_refused_by_name() {
    let router = server(ServerOptions::new(default_model())).await;
    let with = |kwargs: Value| {
        let mut b = chat("Once upon a time");
        b["chat_template_kwargs"] = kwargs;
        b
    };
    for off in [json!({"thinking": false}), json!({"enable_thinking": false})] {
        let (s, v) = json_call(&router, post("/v1/chat/completions", &with(off))).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let cases = [
        (json!({"thinking": true}), "chat_template_kwargs.thinking", "no thinking to switch on"),
        (json!({"enable_thinking": "no"}), "chat_template_kwargs.enable_thinking", "true or false"),
        (json!({"add_generation_prompt": false}), "chat_template_kwargs.add_generation_prompt", "not a switch"),
        (json!({"enable_thinking": true, "thinking": false}), "chat_template_kwargs.thinking", "disagrees"),
    ];
    for (kwargs, param, says) in cases {
        let (s, v) = json_call(&router, post("/v1/chat/completions", &with(kwargs.clone()))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{kwargs}: {v}");
        assert_eq!(v["error"]["param"], param, "{kwargs}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{kwargs}: {v}");
    }
}

/// The thinking switches are refused by name on `/v1/completions` (a raw prompt has no template
/// to switch), not ignored.
#[tokio::test]
async fn thinking_switches_on_a_raw_completion_are_refused_by_name() {
    let router = server(ServerOptions::new(default_model())).await;
    for (field, value) in [("reasoning_effort", json!("none")), ("chat_template_kwargs", json!({"thinking": false}))] {
        let mut body = json!({"prompt": "Once", "max_tokens": 2});
        body[field] = value;
        let (s, v) = json_call(&router, post("/v1/completions", &body)).await;
        assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(field)), "{v}");
    }
    let (s, v) = json_call(&router, post("/v1/completions", &json!({"prompt": "Once", "max_tokens": 2}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// `reasoning_effort` on a family with no effort to set: the efforts agent clients send are
/// taken (and change nothing: the same answer), anything else is refused by name.
#[tokio::test]
async fn an_effort_on_a_model_without_one() {
    let router = server(ServerOptions::new(default_model())).await;
    let ask = |effort: Option<&str>| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0});
        if let Some(e) = effort {
            body["reasoning_effort"] = json!(e);
        }
        body
    };
    let (_, plain) = json_call(&router, post("/v1/chat/completions", &ask(None))).await;
    for e in ["none", "minimal", "low", "medium", "high", "xhigh", "max"] {
        let (s, v) = json_call(&router, post("/v1/chat/completions", &ask(Some(e)))).await;
        assert_eq!(s, StatusCode::OK, "{e}: {v}");
        assert_eq!(v["choices"][0]["message"], plain["choices"][0]["message"], "{e}");
    }
    let (s, v) = json_call(&router, post("/v1/chat/completions", &ask(Some("extreme")))).await;
    assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("reasoning_effort")), "{v}");
}
