//! What `k3-cli serve` says on standard error: a ready line once the model is loaded, and one line
//! per request with its id, tokens, time to first token, rate and finish reason, as text or JSON.

mod common;

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
