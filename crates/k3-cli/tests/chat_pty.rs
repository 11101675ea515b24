//! `k3-cli chat` on a terminal, as a person uses it: run under a pseudo-terminal (util-linux
//! `script`), lines typed one at a time after the prompt shows. The model is the scripted tool
//! caller (`k3_convert::synth::scripted`): it thinks between `<think>` tokens, says a sentence and
//! calls `get_weather`, so the thinking line, `--show-thinking`, `--max-thinking` and the tool
//! call's display are all seen. Piped, the same commands work and nothing is coloured.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::{data_dir, fixture, k3_stdin};

/// The scripted model, converted once per test binary.
fn model() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat-tool-caller");
        let _ = std::fs::remove_dir_all(&dir);
        k3_convert::synth::scripted::tool_caller(&fixture("golden/tiny-kimi-linear"), &dir.join("hf")).unwrap();
        k3_convert::convert(&k3_convert::ConvertOptions::new(dir.join("hf"), dir.join("toolcaller")), &mut |_| {})
            .unwrap();
        dir
    });
    dir.join("toolcaller")
}

/// `k3-cli chat ARGS` on a pseudo-terminal.
struct Pty {
    child: Child,
    input: ChildStdin,
    output: Receiver<Vec<u8>>,
    /// What it printed and no `expect` has passed yet.
    seen: String,
}

impl Pty {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Pty {
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        let cmd = format!("'{}' chat {}", env!("CARGO_BIN_EXE_k3-cli"), quoted.join(" "));
        let mut c = Command::new("script");
        c.args(["-qfec", &cmd, "/dev/null"]).env("K3_DATA_DIR", data_dir()).env_remove("NO_COLOR");
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        let input = child.stdin.take().unwrap();
        Pty { child, input, output: rx, seen: String::new() }
    }

    /// Waits (a minute at most) until the output shows `what`; returns everything up to and
    /// including it, and keeps what follows.
    fn expect(&mut self, what: &str) -> String {
        let t = Instant::now();
        loop {
            if let Some(at) = self.seen.find(what) {
                let upto = self.seen[..at + what.len()].to_string();
                self.seen.drain(..at + what.len());
                return upto;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no {what:?} in {:?}", self.seen);
            if let Ok(chunk) = self.output.recv_timeout(Duration::from_millis(100)) {
                self.seen.push_str(&String::from_utf8_lossy(&chunk));
            }
        }
    }

    /// Types `line` at the next prompt.
    fn send(&mut self, line: &str) {
        self.expect("> ");
        self.input.write_all(format!("{line}\r").as_bytes()).unwrap();
        self.input.flush().unwrap();
    }

    fn finish(mut self) -> bool {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            assert!(t.elapsed() < Duration::from_secs(30), "chat did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn a_session_on_a_terminal() {
    let m = model();
    let saved = tempfile::tempdir().unwrap();
    let file = saved.path().join("chat.json");
    let file = file.to_str().unwrap();
    let mut p = Pty::start(&["-m", m.to_str().unwrap(), "--temp", "0"], &[]);
    let banner = p.expect("/help");
    assert!(
        banner.contains("toolcaller") && banner.contains("context 1048576") && banner.contains("thinking on"),
        "{banner}"
    );
    p.send("Weather in Paris?");
    let answer = p.expect("[tool call] get_weather({\"city\": \"Paris\"})");
    assert!(answer.contains("thinking... "), "a counting thinking line: {answer:?}");
    assert!(answer.contains("Let me check the weather."), "{answer:?}");
    assert!(!answer.contains("The user wants"), "thinking is hidden: {answer:?}");
    assert!(answer.contains("\x1b[36m[tool call]"), "the call in colour on a terminal: {answer:?}");
    p.send("/frobnicate");
    p.expect("unknown command /frobnicate");
    p.send("/set temperature 0.25");
    p.expect("[set]");
    p.send("/set");
    p.expect("temperature 0.25");
    p.send(&format!("/save {file}"));
    p.expect("[saved 2 messages");
    p.send(&format!("/save {file}"));
    p.expect("exists");
    p.send("/clear");
    p.expect("[a new conversation]");
    p.send("/bye");
    assert!(p.finish(), "/bye ends the chat");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(saved[0]["role"], "user");
    assert_eq!(saved[1]["reasoning_content"], k3_convert::synth::scripted::REASONING, "{saved}");
}

#[test]
fn thinking_shown_apart_and_its_budget() {
    let m = model();
    let mut p = Pty::start(&["-m", m.to_str().unwrap(), "--temp", "0", "--show-thinking"], &[("NO_COLOR", "1")]);
    p.send("Weather?");
    let answer = p.expect("[tool call]").replace('\r', "");
    let thought = answer.find("thinking: The user wants the weather.").expect("the thinking, labelled");
    let said = answer.find("Let me check the weather.").expect("the answer");
    assert!(thought < said && answer[thought..said].contains("\n\n"), "apart: {answer:?}");
    let colours = ["\x1b[1m", "\x1b[2m", "\x1b[33m", "\x1b[36m"];
    assert!(!colours.iter().any(|c| answer.contains(c)), "NO_COLOR: no colour: {answer:?}");
    p.send("/bye");
    assert!(p.finish());

    // No thinking budget at all: the model is made to answer at once.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.json");
    let mut p = Pty::start(&["-m", m.to_str().unwrap(), "--temp", "0", "--max-thinking", "0"], &[]);
    p.send("Weather?");
    p.expect("[tool call]");
    p.send(&format!("/save {}", file.display()));
    p.expect("[saved");
    p.send("/exit");
    assert!(p.finish());
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(saved[1].get("reasoning_content").is_none(), "{saved}");
    assert!(saved[1]["content"].as_str().unwrap().starts_with("Let me check"), "{saved}");
}

#[test]
fn piped_commands_load_a_conversation_and_nothing_is_coloured() {
    let dir = tempfile::tempdir().unwrap();
    let conv = dir.path().join("conv.json");
    std::fs::write(
        &conv,
        r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "In the beginning"},
            {"role": "assistant", "content": "God created the heaven and the earth."}]"#,
    )
    .unwrap();
    let input = format!("/load {}\nAnd then?\n/help\n/bye\nnever read\n", conv.display());
    let (ok, out, err) = k3_stdin(&["chat", "-n", "6", "--temp", "0"], &input);
    assert!(ok, "{err}");
    assert!(err.contains("[loaded 3 messages"), "{err}");
    assert!(err.contains("/save FILE"), "/help lists the commands: {err}");
    assert!(!out.trim().is_empty(), "an answer after the loaded conversation");
    assert!(!out.contains('\x1b') && !err.contains('\x1b'), "piped: no escapes");
}
