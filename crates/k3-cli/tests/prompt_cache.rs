//! `--prompt-cache DIR` from the command line on the default model: a second run of the same
//! prompt restores it instead of computing it, a longer prompt resumes the shorter one's state,
//! `chat` resumes a system prompt an earlier chat computed, and each output is a run without the
//! cache's (greedy).

mod common;
use common::{k3, k3_stdin, server};

const PROMPT: &str = "And God said, Let there be light: and there was light. And God saw the light, that it was good";

#[test]
fn a_second_run_restores_the_prompt_and_says_so() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let d = dir.path().to_str().unwrap();
    let args = |prompt: &'static str| ["generate", prompt, "--max-tokens", "12", "--temperature", "0", "--stats"];
    let run = |prompt: &'static str, cached: bool| {
        let mut a: Vec<&str> = args(prompt).to_vec();
        if cached {
            a.extend(["--prompt-cache", d]);
        }
        let (ok, out, err) = k3(&a);
        assert!(ok, "{err}");
        (out, err)
    };
    let (reference, _) = run(PROMPT, false);
    let (first, err) = run(PROMPT, true);
    assert!(err.contains("nothing kept"), "{err}");
    assert_eq!(first, reference);
    let (again, err) = run(PROMPT, true);
    assert!(err.contains("restored from"), "{err}");
    let line = err.lines().find(|l| l.contains("restored from")).unwrap();
    let n: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(n[2], n[4], "the whole prompt: {line}");
    assert_eq!(again, reference, "the same answer from the kept logits");
    // A longer prompt resumes the shorter one's state and says how much.
    const LONGER: &str = "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided";
    let (longer_ref, _) = run(LONGER, false);
    let (longer, err) = run(LONGER, true);
    assert!(err.contains("restored from"), "{err}");
    assert_eq!(longer, longer_ref);
}

#[test]
fn chat_resumes_a_system_prompt_computed_before() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let d = dir.path().to_str().unwrap();
    let system = "You are a careful storyteller. Every answer is one short paragraph in the style of an old chronicle.";
    let chat = |q: &str, cached: bool| {
        let mut a = vec!["chat", "--system", system, "--max-tokens", "8", "--temperature", "0", "--stats"];
        if cached {
            a.extend(["--prompt-cache", d]);
        }
        let (ok, out, err) = k3_stdin(&a, &format!("{q}\n"));
        assert!(ok, "{err}");
        (out, err)
    };
    let (_, err) = chat("Tell of the flood", true);
    assert!(err.contains("nothing kept"), "{err}");
    let (out, err) = chat("What came after the light?", true);
    assert!(err.contains("restored from"), "a new chat with the same system prompt: {err}");
    assert_eq!(out, chat("What came after the light?", false).0);
}

/// The state files in `dir`, and whether any temporary is left.
fn states(dir: &std::path::Path) -> (Vec<String>, bool) {
    let names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let tmp = names.iter().any(|n| n.ends_with(".k3tmp"));
    (names.into_iter().filter(|n| n.ends_with(".k3state")).collect(), tmp)
}

#[test]
fn sigterm_right_after_an_answer_keeps_its_states() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let d = dir.path().to_str().unwrap();
    let system = "You are a careful storyteller. Every answer is one short paragraph in the style of an old chronicle.";
    let ask = |s: &server::Server, q: &str| {
        let body = serde_json::json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 8, "temperature": 0});
        let r = s.post("/v1/chat/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let questions =
        ["Tell of the flood", "And then?", "Who built the ark?", "How long did it rain?", "Where did it rest?"];
    for (i, q) in questions.iter().enumerate() {
        let mut s = server::Server::start(&["--prompt-cache-dir", d]);
        ask(&s, q);
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) }, 0);
        let t = Instant::now();
        let status = loop {
            if let Some(st) = s.child.try_wait().unwrap() {
                break st;
            }
            assert!(t.elapsed() < Duration::from_secs(120), "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{status:?}");
        // Each question leaves its prompt's end and its answer's end; the system turn's end is
        // shared.
        let (files, tmp) = states(dir.path());
        assert_eq!(files.len(), 1 + 2 * (i + 1), "run {i}: {files:?}");
        assert!(!tmp, "run {i}: a temporary is left");
    }
    // All of them are read back as whole states of this model: the same request again resumes
    // its whole prompt from disk (the RAM tier is empty after a start).
    let s = server::Server::start(&["--prompt-cache-dir", d]);
    let v = ask(&s, questions[0]);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], v["usage"]["prompt_tokens"], "{}", v["usage"]);
    let m = s.get("/metrics").1;
    assert!(m.contains(&format!("k3_prompt_cache_disk_files {}", 1 + 2 * questions.len())), "{m}");
    assert!(m.contains("k3_prompt_cache_disk_refused_total 0"), "{m}");
}

#[test]
fn generate_stopped_by_sigterm_keeps_its_prompt_privately() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = dir.path().to_str().unwrap();
    for i in 0..3 {
        let prompt = format!("{PROMPT} and on the day {i}");
        let mut child = common::bin()
            .args(["generate", &prompt, "--max-tokens", "3000", "--temperature", "0", "--prompt-cache", d])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Once it answers, its prompt has been computed and kept.
        let mut first = [0u8; 1];
        std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(120), "generate did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        let (files, tmp) = states(dir.path());
        assert_eq!(files.len(), i + 1, "run {i}: {files:?}");
        assert!(!tmp, "run {i}: a temporary is left");
    }
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.path()), 0o700, "a directory that was 0755 is made private");
    for f in states(dir.path()).0 {
        assert_eq!(mode(&dir.path().join(&f)), 0o600, "{f}");
    }
    let prompt = format!("{PROMPT} and on the day 0");
    let (ok, _, err) =
        k3(&["generate", &prompt, "--max-tokens", "4", "--temperature", "0", "--stats", "--prompt-cache", d]);
    assert!(ok && err.contains("restored from"), "{err}");
}

/// `chat` keeps a turn's states on disk before it waits for the next line, so SIGTERM there (the
/// default action: the process ends at once) loses none and leaves no temporary.
#[test]
fn chat_stopped_by_sigterm_at_its_prompt_keeps_its_states() {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let d = dir.path().to_str().unwrap();
    for i in 0..5 {
        let system = format!("You are a chronicler, number {i}, who answers in one short paragraph.");
        let mut child = common::bin()
            .args(["chat", "--system", &system, "--max-tokens", "1", "--temperature", "0", "--prompt-cache", d])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let mut prompts = 0;
        let (mut seen, mut byte) = (Vec::new(), [0u8; 1]);
        while prompts < 2 {
            assert_eq!(stderr.read(&mut byte).unwrap(), 1, "chat ended: {}", String::from_utf8_lossy(&seen));
            seen.push(byte[0]);
            if seen.ends_with(b"> ") {
                prompts += 1;
                if prompts == 1 {
                    stdin.write_all(format!("{PROMPT}, day {i}\n").as_bytes()).unwrap();
                }
            }
        }
        // SAFETY: a signal to the child this test started, which waits for its next line.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let t = Instant::now();
        while child.try_wait().unwrap().is_none() {
            assert!(t.elapsed() < Duration::from_secs(60), "chat did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(stdin);
        let (files, tmp) = states(dir.path());
        // Each chat keeps its system turn's state and its first prompt's.
        assert_eq!(files.len(), 2 * (i + 1), "run {i}: {files:?}");
        assert!(!tmp, "run {i}: a temporary is left");
    }
}
