//! `list`, `rm` and `ps`: the model store and a running server's loaded model, as Ollama's users
//! read them (a table for people, `--json` for programs).

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::DecimalBytes;
use k3_cli::store;

/// `k3-cli list`.
pub fn list(json: bool) -> Result<ExitCode> {
    let stored = store::list()?;
    if json {
        let models: Vec<_> = stored
            .iter()
            .map(|m| serde_json::json!({"name": m.name, "path": m.dir, "bytes": m.bytes, "modified": m.modified}))
            .collect();
        println!("{}", serde_json::json!({"store": store::models_dir()?, "models": models}));
        return Ok(ExitCode::SUCCESS);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    println!("{:<32} {:>10}  {:<16} PATH", "NAME", "SIZE", "MODIFIED");
    for m in &stored {
        println!(
            "{:<32} {:>10}  {:<16} {}",
            m.name,
            DecimalBytes(m.bytes).to_string(),
            ago(now.saturating_sub(m.modified)),
            m.dir.display()
        );
    }
    println!("{:<32} {:>10}  {:<16} (built into k3-cli)", store::DEFAULT_NAME, "", "");
    if stored.is_empty() {
        eprintln!(
            "no stored models in {}: `k3-cli convert --hf DIR --name NAME` keeps one there",
            store::models_dir()?.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Seconds as Ollama's `MODIFIED` column says them.
fn ago(secs: u64) -> String {
    let (n, unit) = match secs {
        0..60 => return "just now".into(),
        60..3600 => (secs / 60, "minute"),
        3600..86_400 => (secs / 3600, "hour"),
        86_400..2_592_000 => (secs / 86_400, "day"),
        _ => (secs / 2_592_000, "month"),
    };
    format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
}

/// `k3-cli rm NAME...`: every name is checked before any is removed.
pub fn rm(names: &[String]) -> Result<ExitCode> {
    // Each model once, however it is spelled (`a`, `a:latest`).
    let mut names = names.to_vec();
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(store::untagged(n).to_string()));
    for n in &names {
        if store::find(n)?.is_none() {
            store::remove(n)?; // says why: the built-in model, or no such name
        }
    }
    for n in &names {
        let dir = store::remove(n)?;
        println!("deleted '{n}' ({})", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a running `k3-cli serve` listens, and its key.
#[derive(clap::Args)]
pub struct Server {
    /// The server's address.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The server's port.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The API key, if the server asks for one [default: $K3_API_KEY, else none].
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
}

impl Server {
    fn key(&self) -> Option<String> {
        self.api_key.clone().or_else(|| std::env::var("K3_API_KEY").ok().filter(|k| !k.is_empty()))
    }
}

/// `k3-cli stop NAME`: the server lets the model go (Ollama's `keep_alive: 0`), once the answers
/// under way on it have finished.
pub fn stop(name: &str, at: &Server) -> Result<ExitCode> {
    let body = serde_json::json!({"model": name, "keep_alive": 0}).to_string();
    let key = at.key();
    let answer = call(&at.host, at.port, "POST", "/api/generate", key.as_deref(), Some(&body))?;
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap_or_default();
    if v["done_reason"] != "unload" {
        bail!("the server at {}:{} runs one model (`serve --model`): it does not unload it", at.host, at.port);
    }
    println!("stopped '{name}'");
    Ok(ExitCode::SUCCESS)
}

/// `k3-cli ps`: what a running server has loaded (its `/api/ps`).
pub fn ps(at: &Server, json: bool) -> Result<ExitCode> {
    let (host, port, key) = (at.host.as_str(), at.port, at.key());
    let body = call(host, port, "GET", "/api/ps", key.as_deref(), None)?;
    let v: serde_json::Value =
        serde_json::from_str(&body).with_context(|| format!("{host}:{port}/api/ps did not answer JSON"))?;
    if json {
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    // A model stays loaded until a request names another (or the server stops).
    println!("{:<32} {:>10}  {:<10} PROCESSOR", "NAME", "SIZE", "STATE");
    for m in v["models"].as_array().into_iter().flatten() {
        let size = m["size"].as_u64().map_or_else(String::new, |b| DecimalBytes(b).to_string());
        println!("{:<32} {:>10}  {:<10} 100% CPU", m["name"].as_str().unwrap_or("?"), size, "loaded");
    }
    for name in v["loading"].as_array().into_iter().flatten().filter_map(|n| n.as_str()) {
        println!("{name:<32} {:>10}  {:<10} 100% CPU", "", "loading");
    }
    if let Some(f) = v["failed"].as_object() {
        let name = f.get("model").and_then(|m| m.as_str()).unwrap_or("?");
        let why = f.get("reason").and_then(|r| r.as_str()).unwrap_or("");
        println!("{name:<32} {:>10}  {:<10} {why}", "", "failed");
    }
    Ok(ExitCode::SUCCESS)
}

/// A request to a local server, over one HTTP/1.1 connection; the body of a 200.
fn call(host: &str, port: u16, method: &str, path: &str, key: Option<&str>, body: Option<&str>) -> Result<String> {
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut s = std::net::TcpStream::connect(&addr)
        .with_context(|| format!("no k3 server at {addr} (start one with `k3-cli serve`)"))?;
    // An unload waits for the answers under way on the model: a while, on a large one.
    s.set_read_timeout(Some(Duration::from_secs(if method == "GET" { 10 } else { 600 })))?;
    let auth = key.map_or_else(String::new, |k| format!("Authorization: Bearer {k}\r\n"));
    let sent = body.map_or_else(String::new, |b| {
        format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len())
    });
    let sent = if sent.is_empty() { "\r\n".to_string() } else { sent };
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n{sent}")?;
    let mut raw = Vec::new();
    s.take(16 << 20).read_to_end(&mut raw).with_context(|| format!("reading {addr}{path}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("the server's answer has no body")?;
    let status = head.split_whitespace().nth(1).unwrap_or("?");
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.into() };
    if status != "200" {
        bail!("{addr}{path} answered {status}: {}", body.trim());
    }
    Ok(body)
}

/// A chunked body's data.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        let (Some(data), Some(next)) = (rest.get(..n), rest.get(n..)) else { break };
        if n == 0 {
            break;
        }
        out.push_str(data);
        body = next.trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_read_as_ollama_says_them() {
        assert_eq!(super::ago(5), "just now");
        assert_eq!(super::ago(60), "1 minute ago");
        assert_eq!(super::ago(7200), "2 hours ago");
        assert_eq!(super::ago(86_400 * 3), "3 days ago");
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(super::dechunk("4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"), "Wikipedia");
    }
}
