//! `k3-cli serve` against the clients a local server really meets: a web page the user opened
//! (cross-site simple requests, DNS rebinding), several users with their own keys, slow and idle
//! sockets, more connections than it should hold, and the signals that stop it.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::server::Server;
use serde_json::json;

fn chat(content: &str, max_tokens: u64) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

#[test]
fn a_web_page_cannot_post_without_json_nor_rebind_nor_read_cross_site() {
    let s = Server::start(&[]);
    let body = chat("Hello", 1).to_string();
    // The bodies a page may send cross-site without a preflight.
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let r = s.request("POST", "/v1/chat/completions", &[&format!("Content-Type: {ct}")], &body);
        assert_eq!(r.status, 415, "{ct}: {}", r.body);
        assert!(r.body.contains("application/json"), "{}", r.body);
    }
    assert_eq!(s.request("POST", "/v1/chat/completions", &[], &body).status, 415, "no Content-Type");
    let ok = s.request("POST", "/v1/chat/completions", &["Content-Type: Application/JSON; charset=utf-8"], &body);
    assert_eq!(ok.status, 200, "{}", ok.body);
    // Ollama's routes take `curl -d`'s form type from a client that is no browser, as Ollama
    // does; a page (which always sends Origin with a POST) still gets 415.
    let ollama = json!({"model": "default", "messages": [{"role": "user", "content": "Hello"}], "stream": false,
        "options": {"num_predict": 1}})
    .to_string();
    let form = "Content-Type: application/x-www-form-urlencoded";
    let r = s.request("POST", "/api/chat", &[form], &ollama);
    assert_eq!(r.status, 200, "{}", r.body);
    let (host, page) =
        (format!("Host: 127.0.0.1:{}", s.addr.port()), format!("Origin: http://127.0.0.1:{}", s.addr.port()));
    let r = s.request("POST", "/api/chat", &[form, &host, &page], &ollama);
    assert_eq!(r.status, 415, "{}", r.body);
    // DNS rebinding: the page's own name, now resolving to 127.0.0.1.
    let r = s.request("GET", "/v1/models", &["Host: attacker.example"], "");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("--allowed-host attacker.example"), "{}", r.body);
    for host in ["localhost", &format!("127.0.0.1:{}", s.addr.port()), "[::1]"] {
        assert_eq!(s.request("GET", "/v1/models", &[&format!("Host: {host}")], "").status, 200, "{host}");
    }
    // A foreign page's fetch (with an Origin) gets nothing, CORS headers least of all.
    let r = s.request("GET", "/v1/models", &["Origin: http://evil.example"], "");
    assert_eq!(r.status, 403);
    assert!(r.header("access-control-allow-origin").is_none());
    let r = s.request("OPTIONS", "/v1/chat/completions", &["Origin: http://evil.example"], "");
    assert!(r.status == 403 && r.header("access-control-allow-origin").is_none(), "{r:?}");
}

#[test]
fn cors_and_hosts_are_opened_only_as_asked() {
    let s = Server::start(&["--cors", "http://localhost:3000", "--allowed-host", "box.lan"]);
    let origin = "Origin: http://localhost:3000";
    let pre = s.request(
        "OPTIONS",
        "/v1/chat/completions",
        &[origin, "Access-Control-Request-Method: POST", "Access-Control-Request-Headers: content-type"],
        "",
    );
    assert_eq!(pre.status, 204, "{pre:?}");
    assert_eq!(pre.header("access-control-allow-origin"), Some("http://localhost:3000"));
    assert!(pre.header("access-control-allow-headers").is_some_and(|h| h.contains("content-type")));
    let r = s.post("/v1/chat/completions", &[origin], &chat("Hi", 1));
    assert_eq!((r.status, r.header("access-control-allow-origin")), (200, Some("http://localhost:3000")));
    assert_eq!(s.request("GET", "/v1/models", &["Origin: http://localhost:3001"], "").status, 403);
    assert_eq!(s.request("GET", "/v1/models", &["Host: box.lan:8000"], "").status, 200);
    assert_eq!(s.request("GET", "/v1/models", &["Host: other.lan"], "").status, 403);
}

#[test]
fn keys_are_checked_and_each_keys_prompt_cache_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "# one per app\nkey-b\n\n").unwrap();
    let s = Server::start(&["--api-key", "key-a", "--api-key-file", file.to_str().unwrap()]);
    let r = s.post("/v1/chat/completions", &[], &chat("Hi", 1));
    assert_eq!(r.status, 401);
    assert!(r.header("www-authenticate").is_some_and(|h| h.starts_with("Bearer")), "{r:?}");
    assert_eq!(s.post("/v1/chat/completions", &["Authorization: Bearer key-c"], &chat("Hi", 1)).status, 401);
    assert_eq!(s.get("/health").0, 200, "health needs no key");
    // The state after a prompt is kept for the conversation's next turn, which extends it.
    let secret = chat("The secret PIN is 4711", 1);
    let next = json!({"messages": [{"role": "user", "content": "The secret PIN is 4711"},
        {"role": "assistant", "content": "And"}, {"role": "user", "content": "Again"}], "max_tokens": 1});
    let cached = |key: &str, body: &serde_json::Value| {
        let r = s.post("/v1/chat/completions", &[&format!("Authorization: {key}")], body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    assert_eq!(cached("Bearer key-a", &secret), 0);
    assert_eq!(cached("bearer key-b", &next), 0, "key b must not see key a's prompt (scheme in any case)");
    assert!(cached("BEARER key-a", &next) > 0, "key a's own prompt is kept");

    let shared = Server::start(&["--api-key", "key-a", "--api-key", "key-b", "--prompt-cache-shared"]);
    let cached = |key: &str, body: &serde_json::Value| {
        let r = shared.post("/v1/chat/completions", &[&format!("Authorization: Bearer {key}")], body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    assert_eq!(cached("key-a", &secret), 0);
    assert!(cached("key-b", &next) > 0, "--prompt-cache-shared shares");
}

#[test]
fn slow_idle_and_oversized_clients_are_cut_off() {
    let s = Server::start(&["--header-timeout", "1", "--body-timeout", "1", "--max-connections", "3"]);
    // Idle: a connection that sends nothing is closed after the header timeout.
    let mut idle = s.connect();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    assert_eq!(idle.read(&mut buf).unwrap_or(0), 0);
    assert!(t.elapsed() < Duration::from_secs(5), "closed after {:?}", t.elapsed());
    // A slow body: headers, then half the declared bytes.
    let mut slow = s.connect();
    slow.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pr",
    )
    .unwrap();
    let mut out = String::new();
    let _ = slow.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    // A declared length over the limit is refused before anything is read.
    let mut big = s.connect();
    big.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n",
    )
    .unwrap();
    let mut head = [0u8; 32];
    let n = big.read(&mut head).unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 413"), "{}", String::from_utf8_lossy(&head[..n]));
    // Wait for the server's side of it to close, or it still counts against the cap below.
    let _ = big.read_to_end(&mut Vec::new());
}

/// A connection whose request is under way: its headers sent (asking for `100 Continue`) and
/// answered, so the server has taken the request; its body not yet sent. The body follows with
/// [`finish`].
fn under_way(s: &Server) -> (TcpStream, String) {
    let body = chat("Hi", 1).to_string();
    let mut c = s.connect();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    let mut head = [0u8; 25];
    c.read_exact(&mut head).unwrap();
    assert!(head.starts_with(b"HTTP/1.1 100 Continue"), "{}", String::from_utf8_lossy(&head));
    (c, body)
}

/// Sends the rest of an [`under_way`] request; its status line.
fn finish((mut c, body): (TcpStream, String)) -> String {
    c.write_all(body.as_bytes()).unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out.lines().next().unwrap_or_default().to_string()
}

/// A request over a connection of its own (read to its end); its status line.
fn health(s: &Server) -> String {
    let r = s.raw("GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    format!("HTTP/1.1 {}", r.status)
}

#[test]
fn the_connection_cap_refuses_only_when_every_connection_holds_a_request() {
    let s = Server::start(&["--header-timeout", "60", "--body-timeout", "60", "--max-connections", "3"]);
    let held: Vec<_> = (0..3).map(|_| under_way(&s)).collect();
    // Three requests under way: the fourth connection is told 503 and closed.
    assert_eq!(health(&s), "HTTP/1.1 503");
    for c in held {
        assert_eq!(finish(c), "HTTP/1.1 200 OK");
    }
}

/// `GET /health` on a new keep-alive connection: the connection (left open, idle) and the status
/// line.
fn health_kept_open(s: &Server) -> (TcpStream, String) {
    let mut c = s.connect();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    // The head and the short JSON body it announces.
    while !String::from_utf8_lossy(&got).contains("}") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    (c, text.lines().next().unwrap_or_default().to_string())
}

/// A slowloris (connections that trickle their headers and never finish them) filling the cap
/// turns nobody away: a new connection takes the place of the oldest one still sending its
/// headers (then of idle keep-alive ones); a request under way keeps its connection.
#[test]
fn connections_still_sending_headers_go_first_when_the_cap_is_reached() {
    let s = Server::start(&["--header-timeout", "120", "--body-timeout", "120", "--max-connections", "3"]);
    let request = under_way(&s);
    let mut slow: Vec<_> = (0..2).map(|_| s.connect()).collect();
    for c in &mut slow {
        c.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: a").unwrap();
    }
    // The cap is full: each new connection takes the place of the oldest half-sent one.
    let (_first, status) = health_kept_open(&s);
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (_second, status) = health_kept_open(&s);
    assert_eq!(status, "HTTP/1.1 200 OK");
    for mut c in slow {
        // Closed at once, not at the header timeout (120 s; 30 s here is only a bound for a
        // loaded machine): an evicted connection ends without an answer (a reset when the
        // server closed it before reading what it had sent).
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 64];
        let r = c.read(&mut buf);
        let closed = match &r {
            Ok(n) => *n == 0,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "the half-sent connection was not closed: {r:?}");
    }
    // Then an idle keep-alive connection gives its place; the request under way keeps its own.
    assert_eq!(health(&s), "HTTP/1.1 200");
    assert_eq!(finish(request), "HTTP/1.1 200 OK");
}

#[test]
fn sigterm_ends_streams_with_their_finish_and_the_server_cleanly() {
    let mut s = Server::start(&["--drain-timeout", "1"]);
    let mut c = s.connect();
    // The end of the turn banned: the answer is still running when the signal comes.
    let model = k3_engine::Model::open(common::fixture("default.waste")).unwrap();
    let tok = k3_generate::model_tokenizer(&model).unwrap().unwrap();
    let cfg =
        k3_engine::config::ModelConfig::parse(Path::new("config.json"), model.blob("config.json").unwrap()).unwrap();
    let mut banned = serde_json::Map::new();
    for id in cfg.eos.iter().copied().chain([tok.special("<|im_end|>").unwrap()]) {
        banned.insert(id.to_string(), json!(-100));
    }
    let body = json!({"messages": [{"role": "user", "content": "Tell"}], "max_tokens": 100000, "stream": true,
        "temperature": 0, "logit_bias": banned})
    .to_string();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 256];
    let _ = c.read(&mut first).unwrap();
    // SAFETY: kill(2) on the child's pid, which is alive (it just answered).
    assert_eq!(unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) }, 0);
    let t = Instant::now();
    let mut rest = String::new();
    let _ = c.read_to_string(&mut rest);
    assert!(t.elapsed() >= Duration::from_millis(900), "the answer ended before the drain did: {:?}", t.elapsed());
    assert!(
        // Cut short by the stop: an incomplete answer, never a finished one.
        rest.contains("\"finish_reason\":\"length\""),
        "no finish chunk saying the answer was cut: ...{}",
        &rest[rest.len().saturating_sub(300)..]
    );
    assert!(rest.contains("data: [DONE]"), "no [DONE]");
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "drained in {:?}", t.elapsed());
}

#[test]
fn a_model_that_cannot_load_ends_serve_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::bin()
        .args(["serve", "--port", "0", "--model"])
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("did not load"), "{err}");
    // Switches of single runs that serve would only ignore are not its switches.
    for flag in ["--stats", "--verbose"] {
        let out =
            common::bin().args(["serve", "--port", "0", flag]).stdin(std::process::Stdio::null()).output().unwrap();
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unexpected argument"));
    }
}

#[test]
fn the_open_files_limit_is_raised_to_its_maximum() {
    // A soft limit of 256, as a careful service manager might leave it.
    let s = Server::wrapped(&["prlimit", "--nofile=256:"], &[]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", s.child.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums[0], nums[1], "soft limit not raised: {line}");
    assert_ne!(nums[0], "256", "{line}");
}
