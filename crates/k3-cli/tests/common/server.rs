//! `k3-cli serve` as a process on a free loopback port, and HTTP/1.1 spoken over raw sockets, so
//! the tests see exactly what a browser, a script or a hostile client would send and receive.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running server; killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    /// What it printed on standard error after its address line.
    pub stderr: std::sync::mpsc::Receiver<String>,
}

impl Server {
    /// `k3-cli serve --port 0 ARGS`, once `/health` answers 200.
    pub fn start(args: &[&str]) -> Server {
        Self::spawn(super::bin(), args)
    }

    /// As [`start`](Self::start), with its models' store in `data_dir`.
    pub fn start_in(data_dir: &std::path::Path, args: &[&str]) -> Server {
        let mut c = super::bin();
        c.env("K3_DATA_DIR", data_dir);
        Self::spawn(c, args)
    }

    /// As [`start`](Self::start), run through `wrapper` (e.g. `prlimit --nofile=256:`).
    pub fn wrapped(wrapper: &[&str], args: &[&str]) -> Server {
        let mut c = std::process::Command::new(wrapper[0]);
        c.args(&wrapper[1..]).arg(env!("CARGO_BIN_EXE_k3-cli")).env("K3_DATA_DIR", super::data_dir());
        Self::spawn(c, args)
    }

    fn spawn(mut command: std::process::Command, args: &[&str]) -> Server {
        let mut child = command
            .args(["serve", "--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut addr = None;
        while addr.is_none() {
            let line = rx.recv_timeout(Duration::from_secs(60)).expect("the server printed its address");
            addr = line.split("http://").nth(1).and_then(|a| a.split('/').next()).and_then(|a| a.parse().ok());
        }
        let s = Server { child, addr: addr.unwrap(), stderr: rx };
        let t = Instant::now();
        while s.get("/health").0 != 200 {
            assert!(t.elapsed() < Duration::from_secs(60), "the server did not become ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn connect(&self) -> TcpStream {
        let c = TcpStream::connect(self.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c
    }

    /// Sends `raw` as it is and reads the whole answer (the request should say
    /// `Connection: close`).
    pub fn raw(&self, raw: &str) -> Response {
        let mut c = self.connect();
        c.write_all(raw.as_bytes()).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        Response::parse(&out)
    }

    /// A request with the headers given (each `Name: value`), Host localhost unless given.
    pub fn request(&self, method: &str, path: &str, headers: &[&str], body: &str) -> Response {
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|h| h.to_ascii_lowercase().starts_with("host:")) {
            req.push_str("Host: localhost\r\n");
        }
        for h in headers {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()));
        self.raw(&req)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        let r = self.request("GET", path, &[], "");
        (r.status, r.body)
    }

    /// A JSON POST.
    pub fn post(&self, path: &str, headers: &[&str], body: &serde_json::Value) -> Response {
        let mut h = vec!["Content-Type: application/json"];
        h.extend_from_slice(headers);
        self.request("POST", path, &h, &body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    fn parse(raw: &[u8]) -> Response {
        let text = String::from_utf8_lossy(raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked { dechunk(body) } else { body.to_string() };
        Response { status, headers, body }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
