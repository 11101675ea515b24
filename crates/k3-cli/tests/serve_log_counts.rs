//! A request that does not reach its end is logged with its true counts: the prompt it
//! prefilled and the tokens it was given, not "prompt 0 tokens".

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
