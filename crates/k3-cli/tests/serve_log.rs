//! What `k3-cli serve` says on standard error: a ready line once the model is loaded, and one line
//! per request with its id, tokens, time to first token, rate and finish reason, as text or JSON.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use common::server::Server;
use serde_json::{Value, json};

/// The next line the server prints that contains `what`, within a minute.
fn line_with(s: &Server, what: &str) -> String {
    loop {
        let line = s.stderr.recv_timeout(Duration::from_secs(60)).expect("the server printed the line");
        if line.contains(what) {
            return line;
        }
    }
}

#[test]
fn a_ready_line_and_a_json_line_per_request() {
    let s = Server::start(&["--log-format", "json"]);
    let ready: Value = serde_json::from_str(&line_with(&s, "\"ready\"")).unwrap();
    assert_eq!((ready["model"].as_str(), ready["layers"].as_u64()), (Some("default"), Some(4)), "{ready}");
    // No --context: the model's own longest context (its config's 1,048,576), which a machine
    // with ~11 GB available holds for the default model's eight batched sequences (320 bytes a
    // token each); on a smaller one, what memory leaves, and the ready line says so.
    let context = ready["context"].as_u64().unwrap();
    match ready["context_wanted"].as_u64() {
        None => assert_eq!(context, 1 << 20, "{ready}"),
        Some(wanted) => assert!(wanted == 1 << 20 && (4096..1 << 20).contains(&context), "{ready}"),
    }
    let body =
        json!({"messages": [{"role": "user", "content": "In the beginning"}], "max_tokens": 5, "temperature": 0});
    let r = s.post("/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json();
    let line: Value = serde_json::from_str(&line_with(&s, "\"request\"")).unwrap();
    assert_eq!(line["id"], answer["id"]);
    assert_eq!(line["prompt_tokens"], answer["usage"]["prompt_tokens"]);
    assert_eq!(line["completion_tokens"], answer["usage"]["completion_tokens"]);
    assert_eq!(line["finish_reason"], answer["choices"][0]["finish_reason"]);
    let (ttft, total) = (line["ttft_s"].as_f64().unwrap(), line["total_s"].as_f64().unwrap());
    assert!(ttft > 0.0 && ttft <= total, "{line}");
}

/// A budget that cannot hold the model's longest context for every batched conversation: the
/// context is what it leaves (half of the room beside the trunk, activations, prompt cache and
/// overhead goes to the state when every expert fits in the other half), said on the ready line.
#[test]
fn the_context_is_fitted_to_the_budget_and_said() {
    let s = Server::start(&["--mem", "600M", "--prompt-cache-ram", "64M", "--log-format", "json"]);
    let ready: Value = serde_json::from_str(&line_with(&s, "\"ready\"")).unwrap();
    let context = ready["context"].as_u64().unwrap();
    assert_eq!(ready["context_wanted"].as_u64(), Some(1 << 20), "{ready}");
    // ~380 MB of room for 8 sequences x 320 bytes a token.
    assert!((100_000..200_000).contains(&context), "{ready}");
    let r = s.post("/api/show", &[], &json!({"model": "default"}));
    assert_eq!(r.json()["model_info"]["kimi_linear.context_length"].as_u64(), Some(context), "{}", r.body);
}

#[test]
fn text_lines_for_a_person() {
    let s = Server::start(&[]);
    assert!(line_with(&s, "ready: ").contains("loaded in"));
    let body = json!({"prompt": "In the beginning", "max_tokens": 4, "temperature": 0});
    let r = s.post("/v1/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let line = line_with(&s, &id);
    assert!(line.contains("prompt ") && line.contains("cached") && line.contains("first token"), "{line}");
    assert!(line.ends_with("length") || line.ends_with("stop"), "{line}");
}

/// `k3_NAME`'s value in a Prometheus exposition.
fn metric(text: &str, name: &str) -> f64 {
    let prefix = format!("k3_{name} ");
    let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

#[test]
fn metrics_time_requests_and_the_rate_is_of_the_last_seconds() {
    let s = Server::start(&[]);
    let mut tokens = 0.0;
    for _ in 0..2 {
        let body = json!({"prompt": "In the beginning", "max_tokens": 6, "temperature": 0});
        let r = s.post("/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        tokens += r.json()["usage"]["completion_tokens"].as_f64().unwrap();
    }
    // The running second is left out of the rate: wait for it to pass.
    std::thread::sleep(Duration::from_millis(1100));
    let (status, m) = s.get("/metrics");
    assert_eq!(status, 200);
    assert_eq!(metric(&m, "time_to_first_token_seconds_count"), 2.0, "{m}");
    assert_eq!(metric(&m, "request_seconds_count"), 2.0, "{m}");
    assert_eq!(metric(&m, "inter_token_seconds_count"), tokens - 2.0, "{m}");
    assert_eq!(metric(&m, "time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 2.0, "{m}");
    let ttft = metric(&m, "time_to_first_token_seconds_sum");
    assert!(ttft > 0.0 && ttft <= metric(&m, "request_seconds_sum"), "{m}");
    // All the tokens fell within the window: the rate is their count over the seconds since start
    // (at most 10), where the since-start mean divides by the whole uptime.
    let recent = metric(&m, "completion_tokens_per_second");
    assert!(recent > 0.0 && recent <= tokens, "{m}");
    assert!(metric(&m, "completion_tokens_per_second_since_start") > 0.0, "{m}");
}

/// A request that does not reach its end is logged with its true counts: the prompt it
/// prefilled and the tokens it was given, not "prompt 0 tokens".
#[test]
fn a_cancelled_request_is_logged_with_its_prompt_and_its_tokens() {
    let s = Server::start(&["--log-format", "json"]);
    let messages = json!([{"role": "user", "content": "In the beginning God created the heaven and the earth."}]);
    // The same prompt answered whole: its prompt's length.
    let r = s.post("/v1/chat/completions", &[], &json!({"messages": messages, "max_tokens": 1, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    let prompt = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 5);
    let _ = line_with(&s, "\"request\"");
    // Streamed, and left after three tokens.
    let body = json!({"messages": messages, "max_tokens": 400, "temperature": 0, "stream": true}).to_string();
    let mut c = s.connect();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(c.try_clone().unwrap());
    let mut seen = 0;
    let mut line = String::new();
    while seen < 3 {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended early");
        if line.contains("\"content\"") && !line.contains("\"content\":\"\"") {
            seen += 1;
        }
    }
    drop(reader);
    c.shutdown(std::net::Shutdown::Both).unwrap();
    drop(c);
    let logged: Value = serde_json::from_str(&line_with(&s, "\"request\"")).unwrap();
    assert_eq!(logged["finish_reason"], "cancelled", "{logged}");
    assert_eq!(logged["prompt_tokens"].as_u64(), Some(prompt), "{logged}");
    let tokens = logged["completion_tokens"].as_u64().unwrap();
    assert!((3..400).contains(&tokens), "{logged}");
}
