//! Models by name, as an Ollama user meets them: `convert --name`, `list`, `show`, `run NAME`,
//! `--model NAME`, `rm`, and `serve` offering every stored model, loading the one a request
//! names (queued, not refused, while it loads), with `/api/ps` and `k3-cli ps` saying which is
//! loaded. Each test keeps its store in its own data directory.

mod common;

use std::path::Path;
use std::process::Stdio;

use common::server::Server;
use serde_json::json;

/// `k3-cli ARGS` with the store in `data`: (success, stdout, stderr).
fn k3_in(data: &Path, args: &[&str]) -> (bool, String, String) {
    common::text(&common::bin().env("K3_DATA_DIR", data).args(args).stdin(Stdio::null()).output().unwrap())
}

/// A store holding the tiny K3 (read in place from its fixture) as `tiny-k3` and the default
/// model's files re-encoded as stored as `small:q`.
fn two_models() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let k3 = common::fixture("golden/tiny-k3-vision");
    let small = common::fixture("default.waste");
    for (from, name) in [(&k3, "tiny-k3"), (&small, "small:q")] {
        let (ok, _, err) = k3_in(data.path(), &["convert", "-q", "--hf", from.to_str().unwrap(), "--name", name]);
        assert!(ok, "{err}");
    }
    data
}

#[test]
fn stored_models_are_listed_shown_run_and_removed_by_name() {
    let data = two_models();
    let d = data.path();
    let (ok, out, _) = k3_in(d, &["list"]);
    assert!(ok);
    let rows: Vec<&str> = out.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(rows, ["small:q", "tiny-k3", "default"], "{out}");
    let (_, out, _) = k3_in(d, &["list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["models"][1]["path"].as_str().unwrap(), d.join("models/tiny-k3").to_str().unwrap());

    let (ok, out, err) = k3_in(d, &["show", "tiny-k3"]);
    assert!(ok && out.contains("kimi_k3: 6 layers"), "{out}{err}");

    // A name stands for its directory wherever a model is taken: the same text as by path.
    let generate = |model: &str| k3_in(d, &["generate", "-m", model, "And God said", "-n", "8", "--seed", "3"]);
    let (by_name, by_path) = (generate("small:q"), generate(common::fixture("default.waste").to_str().unwrap()));
    assert!(by_name.0 && !by_name.1.is_empty(), "{}", by_name.2);
    assert_eq!(by_name.1, by_path.1);
    let run = k3_in(d, &["run", "small:q", "Who made the light?", "-n", "6", "--seed", "3"]);
    let chat = common::text(
        &common::bin()
            .env("K3_DATA_DIR", d)
            .args(["chat", "-m", common::fixture("default.waste").to_str().unwrap(), "-n", "6", "--seed", "3"])
            .stdin(std::fs::File::open(write_line(d, "Who made the light?")).unwrap())
            .output()
            .unwrap(),
    );
    assert!(run.0 && !run.1.trim().is_empty(), "{}", run.2);
    assert_eq!(run.1.trim(), chat.1.trim());

    let (ok, _, err) = k3_in(d, &["generate", "-m", "nope", "x"]);
    assert!(!ok && err.contains("`nope` is neither a model directory nor a stored model"), "{err}");
    let (ok, _, err) = k3_in(d, &["rm", "default"]);
    assert!(!ok && err.contains("built into k3-cli"), "{err}");
    let (ok, _, err) = k3_in(d, &["rm", "tiny-k3", "nope"]);
    assert!(!ok && err.contains("no stored model is named `nope`"), "{err}");
    assert!(d.join("models/tiny-k3").is_dir(), "nothing removed when one name is wrong");
    let checkpoint = common::names(&common::fixture("golden/tiny-k3-vision"));
    let (ok, out, _) = k3_in(d, &["rm", "tiny-k3:latest"]);
    assert!(ok && out.contains("deleted 'tiny-k3:latest'"), "{out}");
    assert!(!d.join("models/tiny-k3").exists());
    // The checkpoint its experts were read from in place is not ours: still there.
    assert_eq!(common::names(&common::fixture("golden/tiny-k3-vision")), checkpoint);
    let (_, out, _) = k3_in(d, &["list"]);
    assert!(!out.contains("tiny-k3") && out.contains("small:q"), "{out}");
}

fn write_line(dir: &Path, line: &str) -> std::path::PathBuf {
    let p = dir.join("line.txt");
    std::fs::write(&p, format!("{line}\n")).unwrap();
    p
}

#[test]
fn names_the_store_refuses() {
    let data = tempfile::tempdir().unwrap();
    let hf = common::fixture("golden/tiny-k3-vision");
    for bad in ["default", "../x", ".hidden", "a/b"] {
        let (ok, _, err) = k3_in(data.path(), &["convert", "--hf", hf.to_str().unwrap(), "--name", bad]);
        assert!(!ok && err.contains("--name"), "{bad}: {err}");
    }
    let (ok, _, err) = k3_in(data.path(), &["convert", "--hf", "x", "--name", "a", "--out", "y"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    assert!(!data.path().join("models").exists(), "nothing written");
}

fn ps_names(s: &Server) -> Vec<String> {
    let (code, body) = s.get("/api/ps");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap().to_string()).collect()
}

fn chat(s: &Server, model: &str) -> common::server::Response {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": false,
                      "options": {"num_predict": 3}});
    s.post("/api/chat", &[], &body)
}

/// A chat request on its own connection: the status line's code.
fn status_of_chat(addr: std::net::SocketAddr, model: &str) -> u16 {
    use std::io::{Read, Write};
    let body = json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": false,
                      "options": {"num_predict": 3}})
    .to_string();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "POST /api/chat HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn serve_offers_every_stored_model_and_loads_the_one_asked_for() {
    let data = two_models();
    let s = Server::start_in(data.path(), &[]);
    let (code, body) = s.get("/api/tags");
    assert_eq!(code, 200);
    let tags: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = tags["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["small:q", "tiny-k3:latest", "default:latest"]);
    assert_eq!(tags["models"][1]["details"]["family"], "kimi_k3");
    let (_, body) = s.get("/v1/models");
    assert!(body.contains("\"small:q\"") && body.contains("\"tiny-k3\"") && body.contains("\"default\""), "{body}");
    assert!(ps_names(&s).is_empty(), "nothing loaded before a request names a model");
    // Details come from the files: asking for them loads nothing.
    let r = s.post("/api/show", &[], &json!({"model": "tiny-k3:latest"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let show = r.json();
    assert_eq!(show["model_info"]["kimi_k3.block_count"], 6, "{show}");
    let caps: Vec<&str> = show["capabilities"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert!(caps.contains(&"vision") && caps.contains(&"thinking"), "{caps:?}");
    assert!(ps_names(&s).is_empty(), "/api/show loaded nothing");
    assert_eq!(s.post("/api/show", &[], &json!({"model": "nope"})).status, 404);

    let r = chat(&s, "tiny-k3");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["model"], "tiny-k3");
    assert_eq!(ps_names(&s), ["tiny-k3:latest"]);

    // Two requests for the other model at once: both wait while it loads, neither is refused.
    let addr = s.addr;
    let answers: Vec<u16> = std::thread::scope(|sc| {
        let h: Vec<_> = (0..2).map(|_| sc.spawn(move || status_of_chat(addr, "small:q"))).collect();
        h.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(answers, [200, 200]);
    assert_eq!(ps_names(&s), ["small:q"]);
    let port = s.addr.port().to_string();
    let (ok, out, err) = k3_in(data.path(), &["ps", "--port", &port]);
    assert!(ok && out.lines().nth(1).is_some_and(|l| l.starts_with("small:q") && l.contains("loaded")), "{out}{err}");

    // `k3-cli stop` (Ollama's keep_alive 0): the model goes, and ps says so.
    let (ok, out, err) = k3_in(data.path(), &["stop", "small:q", "--port", &port]);
    assert!(ok && out.contains("stopped 'small:q'"), "{out}{err}");
    assert!(ps_names(&s).is_empty());
    let unload = json!({"model": "tiny-k3", "keep_alive": 0});
    let r = s.post("/api/generate", &[], &unload);
    assert_eq!((r.status, r.json()["done_reason"].as_str()), (200, Some("unload")), "{}", r.body);

    let r = chat(&s, "nope");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("model 'nope' not found; this server offers: small:q, tiny-k3, default"), "{}", r.body);
    let lines: Vec<String> = s.stderr.try_iter().collect();
    assert!(lines.iter().any(|l| l == "unloading tiny-k3 to load small:q"), "{lines:?}");
    assert!(lines.iter().any(|l| l == "unloading small:q: asked to"), "{lines:?}");
}

#[test]
fn a_model_that_cannot_load_fails_its_requests_not_the_server() {
    let data = two_models();
    // The tiny K3's trunk damaged after it was stored: its header still describes it.
    let trunk = data.path().join("models/tiny-k3/trunk.waste");
    let mut bytes = std::fs::read(&trunk).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&trunk, bytes).unwrap();
    let s = Server::start_in(data.path(), &[]);
    // Nothing loaded: a request naming no model loads none; Ollama's version answers.
    let r = s.post("/v1/chat/completions", &[], &json!({"messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("no model is loaded"), "{}", r.body);
    assert_eq!(s.get("/api/version").0, 200);
    assert!(ps_names(&s).is_empty());

    let r = chat(&s, "tiny-k3");
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("did not load"), "{}", r.body);
    let (_, health) = s.get("/health");
    let h: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!((h["failed"]["model"].as_str(), h["loading"].as_str()), (Some("tiny-k3"), None), "{h}");
    let (_, ps) = s.get("/api/ps");
    assert!(ps.contains("\"failed\":{") && ps.contains("tiny-k3"), "{ps}");
    // The server goes on: the other model loads and answers.
    assert_eq!(chat(&s, "small:q").status, 200);
    assert_eq!(ps_names(&s), ["small:q"]);
    // On the OpenAI routes a name is the id as listed: `:latest` is Ollama's, and not found here.
    let r = s.post("/v1/chat/completions", &[], &json!({"model": "small:q:latest", "messages": []}));
    assert_eq!(r.status, 404, "{}", r.body);
}

#[test]
fn stop_on_a_one_model_server_says_it_unloads_nothing() {
    let model = common::fixture("default.waste");
    let s = Server::start(&["--model", model.to_str().unwrap()]);
    let port = s.addr.port().to_string();
    let (ok, _, err) = common::k3(&["stop", "default", "--port", &port]);
    assert!(!ok && err.contains("runs one model"), "{err}");
    assert_eq!(ps_names(&s), ["default:latest"]);
}
