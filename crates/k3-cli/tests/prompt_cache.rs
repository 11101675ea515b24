//! `--prompt-cache DIR` from the command line on the default model: a second run of the same
//! prompt restores it instead of computing it, a longer prompt resumes the shorter one's state,
//! `chat` resumes a system prompt an earlier chat computed, and each output is a run without the
//! cache's (greedy).

mod common;
use common::{k3, k3_stdin};

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
