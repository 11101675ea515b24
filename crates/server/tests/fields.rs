//! Every sampling field a request sends is honoured or refused by name. What the server returns
//! is checked against a reference computed here from the engine's own logits, run alone: the
//! log-softmax for `logprobs`, and greedy decoding with the bias and penalties applied by their
//! definitions for `logit_bias`, `repeat_penalty`, `frequency_penalty` and `presence_penalty`.

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use k3_engine::{Engine, Model};
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{call, json_call, post, server, sse_data};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

const PROMPT: [u32; 6] = [300, 301, 302, 303, 304, 305];

/// Greedy decoding of `PROMPT` alone for `steps` tokens, `adjust(logits, sequence)` applied before
/// each argmax: each chosen id with the raw logits it was chosen from.
fn reference(steps: usize, adjust: impl Fn(&mut [f64], &[u32])) -> Vec<(u32, Vec<f32>)> {
    let model = Model::open(default_model()).unwrap();
    let engine = Engine::load(&model).unwrap();
    let mut s = engine.session();
    let mut logits = engine.forward_last(&mut s, &PROMPT).unwrap();
    let mut seq = PROMPT.to_vec();
    let mut out = Vec::new();
    for _ in 0..steps {
        let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        adjust(&mut l, &seq);
        let id = (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32;
        out.push((id, logits.clone()));
        seq.push(id);
        logits = engine.forward_last(&mut s, &[id]).unwrap();
    }
    out
}

fn log_softmax(l: &[f32], id: u32) -> f64 {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = l.iter().map(|&x| f64::from(x - m).exp()).sum();
    f64::from(l[id as usize] - m) - z.ln()
}

fn completion(extra: Value) -> Value {
    let mut b = json!({"prompt": PROMPT, "max_tokens": 5, "temperature": 0});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// The tokens a completion's logprobs name, against the reference's ids spelled out.
fn assert_tokens(v: &Value, want: &[(u32, Vec<f32>)]) {
    let model = Model::open(default_model()).unwrap();
    let tok = k3_generate::model_tokenizer(&model).unwrap().unwrap();
    let got = v["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    assert!(!got.is_empty(), "{v}");
    for (k, t) in got.iter().enumerate() {
        let text = String::from_utf8_lossy(&tok.decode_bytes(&[want[k].0]).unwrap()).into_owned();
        assert_eq!(t.as_str().unwrap(), text, "token {k}");
    }
}

#[tokio::test]
async fn logprobs_are_the_models_log_softmax_whole_and_streamed() {
    let router = server(ServerOptions::new(default_model())).await;
    let want = reference(5, |_, _| {});
    let (s, v) = json_call(&router, post("/v1/completions", &completion(json!({"logprobs": 3})))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let n = lp["token_logprobs"].as_array().unwrap().len();
    assert!((1..=5).contains(&n), "{lp}");
    for (k, (id, logits)) in want.iter().take(n).enumerate() {
        let got = lp["token_logprobs"][k].as_f64().unwrap();
        assert!((got - log_softmax(logits, *id)).abs() < 1e-5, "token {k}: {got} vs {}", log_softmax(logits, *id));
        let top = lp["top_logprobs"][k].as_object().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        let best = top.values().map(|x| x.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert!((best - got).abs() < 1e-6, "greedy took the most likely token");
    }
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0, "{offsets:?}");

    // Chat's shape, streamed: one entry per token, the same numbers as a whole answer.
    let chat = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0,
        "logprobs": true, "top_logprobs": 2});
    let (_, whole) = json_call(&router, post("/v1/chat/completions", &chat)).await;
    let content = whole["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert!(!content.is_empty() && content.iter().all(|e| e["top_logprobs"].as_array().unwrap().len() == 2), "{whole}");
    let text: String = content.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap(), "the tokens spell the answer");
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (_, body) = call(&router, post("/v1/chat/completions", &streamed)).await;
    let entries: Vec<Value> = sse_data(&body)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(entries, content, "streamed logprobs are the whole answer's");
}

#[tokio::test]
async fn logit_bias_and_the_penalties_change_greedy_as_their_definitions_say() {
    let router = server(ServerOptions::new(default_model())).await;
    let plain = reference(1, |_, _| {});
    let banned = plain[0].0;
    // -100 bans the greedy choice: the answer starts with the next most likely token.
    let want = reference(5, |l, _| l[banned as usize] = f64::NEG_INFINITY);
    let body = completion(json!({"logit_bias": {banned.to_string(): -100}, "logprobs": 0}));
    let (s, v) = json_call(&router, post("/v1/completions", &body)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let got: Vec<f64> =
        v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    for (k, g) in got.iter().enumerate() {
        let (id, logits) = &want[k];
        assert!((g - log_softmax(logits, *id)).abs() < 1e-5, "biased token {k}");
    }
    assert_tokens(&v, &want);

    // llama.cpp's repetition penalty and OpenAI's frequency / presence penalties, over the last
    // 64 tokens of prompt and answer.
    let (r, f, p) = (2.0, 1.0, 1.5);
    let want = reference(12, |l, seq| {
        let window = &seq[seq.len().saturating_sub(64)..];
        for (t, x) in l.iter_mut().enumerate() {
            let n = window.iter().filter(|&&s| s as usize == t).count() as f64;
            if n > 0.0 {
                *x = if *x <= 0.0 { *x * r } else { *x / r };
                *x -= n * f + p;
            }
        }
    });
    let plain = reference(12, |_, _| {});
    assert_ne!(
        want.iter().map(|w| w.0).collect::<Vec<_>>(),
        plain.iter().map(|w| w.0).collect::<Vec<_>>(),
        "the penalties must change this answer for the test to mean anything"
    );
    let body = completion(
        json!({"repeat_penalty": r, "frequency_penalty": f, "presence_penalty": p, "logprobs": 0, "max_tokens": 12}),
    );
    let (_, v) = json_call(&router, post("/v1/completions", &body)).await;
    assert_tokens(&v, &want);
    let lps = v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap();
    for (k, g) in lps.iter().enumerate() {
        let (id, logits) = &want[k];
        // The raw log-probability of the reference's penalized choice: the same token.
        assert!((g.as_f64().unwrap() - log_softmax(logits, *id)).abs() < 1e-5, "penalized token {k}");
    }
}

#[tokio::test]
async fn no_seed_means_a_fresh_one_reported_so_the_run_can_be_repeated() {
    let router = server(ServerOptions::new(default_model())).await;
    let body = json!({"prompt": "And God said", "max_tokens": 12, "temperature": 1.5});
    let seed_of = |v: &Value| v["system_fingerprint"].as_str().unwrap().trim_start_matches("k3-seed-").to_string();
    let (_, a) = json_call(&router, post("/v1/completions", &body)).await;
    let (_, b) = json_call(&router, post("/v1/completions", &body)).await;
    assert_ne!(seed_of(&a), seed_of(&b), "each request draws its own seed");
    let mut again = body.clone();
    again["seed"] = json!(seed_of(&a).parse::<u64>().unwrap());
    let (_, c) = json_call(&router, post("/v1/completions", &again)).await;
    assert_eq!(c["choices"][0]["text"], a["choices"][0]["text"], "the reported seed repeats the answer");
}

#[tokio::test]
async fn what_is_not_supported_is_refused_by_name() {
    let router = server(ServerOptions::new(default_model())).await;
    let cases = [
        (json!({"echo": true}), "echo"),
        (json!({"suffix": "}"}), "suffix"),
        (json!({"best_of": 3}), "best_of"),
        (json!({"logprobs": 9}), "logprobs"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"repeat_penalty": 0}), "repeat_penalty"),
        (json!({"frequency_penalty": 3}), "frequency_penalty"),
        (json!({"presence_penalty": -2.5}), "presence_penalty"),
        (json!({"repeat_last_n": -2}), "repeat_last_n"),
        (json!({"stop": ["x".repeat(5000)]}), "stop"),
    ];
    for (extra, field) in cases {
        let (s, v) = json_call(&router, post("/v1/completions", &completion(extra.clone()))).await;
        assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(field)), "{extra}: {v}");
    }
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    for (extra, field) in
        [(json!({"top_logprobs": 3}), "top_logprobs"), (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs")]
    {
        let (s, v) = json_call(&router, post("/v1/chat/completions", &chat(extra.clone()))).await;
        assert_eq!((s, v["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some(field)), "{extra}: {v}");
    }
}
