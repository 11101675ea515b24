//! Nothing lost, on the real binary: a damaged model is never used silently, a user's
//! files are never touched, bad input is a clear error before any work, nothing panics, and what a
//! user reaches for (long prompts, Ctrl-C, line editing, a default model wherever the binary goes)
//! works.

mod common;
#[path = "common/sweep.rs"]
mod sweep;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{bin, copy_model, fixture, k3, k3_stdin, names, text};
use sweep::{Binary, Invocation};

const VERSE: &str = "And God said, Let there be light: and there was light.";

fn flip(path: &Path, offset: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[offset as usize] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

// 1. Silent corruption.

#[test]
fn a_damaged_trunk_is_refused_before_it_is_used() {
    let d = copy_model("default.waste");
    let m = d.path().to_str().unwrap();
    let t = k3_format::Model::open(d.path())
        .unwrap()
        .manifest()
        .trunk_tensor("model.layers.0.mlp.down_proj.weight")
        .unwrap()
        .clone();
    flip(&d.path().join("trunk.waste"), t.offset + t.len / 2);
    for args in
        [vec!["generate", "--model", m, "In the beginning", "--max-tokens", "8"], vec!["perplexity", "--model", m, "-"]]
    {
        let (ok, out, err) = k3_stdin(&args, VERSE);
        assert!(!ok, "{args:?} ran a damaged model: {out}");
        assert!(err.contains("model.layers.0.mlp.down_proj.weight") && err.contains("checksum"), "{err}");
        assert!(err.contains("the model is damaged") && err.contains("k3-cli verify"), "{err}");
        assert!(out.is_empty(), "nothing is generated from a damaged model: {out}");
    }
    // The explicit opt-out, for a model verified before: it runs (on damaged weights, as asked).
    let (ok, _, err) = k3(&["generate", "--model", m, "In the beginning", "--max-tokens", "4", "--no-verify"]);
    assert!(ok, "{err}");
}

#[test]
fn a_damaged_expert_is_named_by_layer_and_expert() {
    let d = copy_model("tiny-k3.waste");
    let model = k3_format::Model::open(d.path()).unwrap();
    let shard = d.path().join("experts-00000.waste");
    let mut b = std::fs::read(&shard).unwrap();
    for e in &model.header().index {
        b[(e.offset + e.length / 2) as usize] ^= 0x40;
    }
    std::fs::write(&shard, b).unwrap();
    let out = d.path().join("l.f32");
    let (ok, _, err) =
        k3(&["logits", "--model", d.path().to_str().unwrap(), "--ids", "1 2 3", "--out", out.to_str().unwrap()]);
    assert!(!ok);
    let named = err.split("expert record (layer ").nth(1).and_then(|r| r.split_once(", expert ")).is_some();
    assert!(named && err.contains("checksum"), "{err}");
    assert!(!out.exists());
}

// 2. A user's files.

fn logits_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let m = fixture("tiny-k3.waste").to_str().unwrap().to_string().leak();
    let mut v = vec!["logits", "--model", m, "--ids", "1 2 3 4 5 6 7 8", "--out", out];
    v.extend_from_slice(extra);
    v
}

#[test]
fn outputs_replace_only_their_target() {
    let d = tempfile::tempdir().unwrap();
    // Names an older k3 used for its temporaries, owned here by the user.
    for f in ["run.partial", "run.tmp", "s.tmp"] {
        std::fs::write(d.path().join(f), b"mine").unwrap();
    }
    let out = d.path().join("run.f32");
    let stats = d.path().join("s.json");
    let hist = d.path().join("u.txt");
    let extra = ["--stats-json", stats.to_str().unwrap(), "--usage-history", hist.to_str().unwrap()];
    let (ok, _, err) = k3(&logits_args(out.to_str().unwrap(), &extra));
    assert!(ok, "{err}");
    assert_eq!(names(d.path()), ["run.f32", "run.partial", "run.tmp", "s.json", "s.tmp", "u.txt"]);
    for f in ["run.partial", "run.tmp", "s.tmp"] {
        assert_eq!(std::fs::read(d.path().join(f)).unwrap(), b"mine", "{f}");
    }
}

#[test]
fn bad_output_paths_are_refused_before_the_run() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    let (ok, _, err) = k3(&logits_args(dir.to_str().unwrap(), &[]));
    assert!(!ok && err.contains("is a directory"), "{err}");
    let missing = d.path().join("no/such/dir/x.f32");
    let (ok, _, err) = k3(&logits_args(missing.to_str().unwrap(), &[]));
    assert!(!ok && err.contains("does not exist"), "{err}");
    let bad_stats = d.path().join("no/s.json");
    let out = d.path().join("x.f32");
    let (ok, _, err) = k3(&logits_args(out.to_str().unwrap(), &["--stats-json", bad_stats.to_str().unwrap()]));
    assert!(!ok && err.contains("does not exist"), "{err}");
    assert!(!out.exists(), "refused before the run, so nothing was written");
    assert_eq!(names(d.path()), ["out"]);
    assert!(names(&dir).is_empty());
}

/// Runs k3-cli with writes limited to `limit` bytes per file (RLIMIT_FSIZE; SIGXFSZ ignored so a
/// write past it fails with EFBIG, as on a full disk).
fn k3_with_file_limit(args: &[&str], limit: u64) -> (bool, String, String) {
    let mut c = bin();
    c.args(args).stdin(Stdio::null());
    // SAFETY: between fork and exec only async-signal-safe calls are made (setrlimit, signal).
    unsafe {
        c.pre_exec(move || {
            let r = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            libc::setrlimit(libc::RLIMIT_FSIZE, &r);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    text(&c.output().unwrap())
}

#[test]
fn a_full_disk_leaves_no_temporaries_and_no_half_files() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("run.partial"), b"mine").unwrap();
    let p = |f: &str| d.path().join(f).to_str().unwrap().to_string();
    let tiny = fixture("tiny-k3.waste").to_str().unwrap().to_string();
    let generate = |extra: &[String]| {
        let mut v: Vec<String> = ["generate", "--model", &tiny, "--ids", "1 2 3", "--max-tokens", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend_from_slice(extra);
        v
    };
    // The logits array (16 KB), the statistics, the usage history: each write fails part way.
    let runs: [(Vec<String>, u64); 3] = [
        (logits_args(&p("run.f32"), &[]).iter().map(|s| s.to_string()).collect(), 4096),
        (generate(&["--stats-json".into(), p("s.json")]), 100),
        (generate(&["--usage-history".into(), p("u.txt")]), 10),
    ];
    for (args, limit) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, err) = k3_with_file_limit(&args, limit);
        assert!(!ok, "{args:?}");
        assert!(err.starts_with("error:") && !err.contains("panicked"), "{err}");
        assert_eq!(names(d.path()), ["run.partial"], "{args:?}: {err}");
    }
    assert_eq!(std::fs::read(d.path().join("run.partial")).unwrap(), b"mine");
}

// 5. Panics: every subcommand with its standard output closed early, every option with a value
// at 0 and at the largest integer.

/// A valid invocation of every subcommand, and what it reads on standard input.
fn base_invocations() -> Vec<Invocation> {
    let f = |n: &str| fixture(n).to_str().unwrap().to_string();
    let tiny = f("tiny-k3.waste");
    let tok = f("tokenizer/minilm-tokenizer.json");
    let inv = |sub: &str, args: &[&str], input: &'static str| Invocation {
        sub: vec![sub.to_string()],
        args: args.iter().map(|x| x.to_string()).collect(),
        input,
    };
    vec![
        inv("inspect", &[&tiny, "--json"], ""),
        inv("verify", &[&tiny], ""),
        inv("logits", &["--model", &tiny, "--ids", "1 2 3", "--out", "o.f32"], ""),
        inv("trace", &["--model", &tiny, "--ids", "1 2 3", "--out", "o.f32"], ""),
        inv("generate", &["--model", &tiny, "--ids", "1 2 3", "--max-tokens", "3", "--context", "48"], ""),
        inv("chat", &["--max-tokens", "3", "--context", "256"], "Hi\n"),
        inv("tokenize", &["--tokenizer", &tok], "Hello world"),
        inv("detokenize", &["--tokenizer", &tok], "[7592, 2088]"),
        inv("perplexity", &["--window", "32", "--json"], VERSE),
        inv("lookahead", &["--model", &tiny, "--ids", "1 2 3 4", "--json"], ""),
    ]
}

fn k3_binary() -> Binary {
    Binary { path: env!("CARGO_BIN_EXE_k3-cli").into(), env: vec![("K3_DATA_DIR".into(), common::data_dir())] }
}

#[test]
fn every_option_at_zero_and_at_the_largest_integer_is_handled() {
    let cwd = tempfile::tempdir().unwrap();
    let runs = k3_binary().sweep(&base_invocations(), cwd.path(), Duration::from_secs(120));
    assert!(runs > 100, "the help lists the options: {runs}");
}

#[test]
fn a_closed_standard_output_ends_every_subcommand_quietly() {
    let cwd = tempfile::tempdir().unwrap();
    k3_binary().closed_stdout(&base_invocations(), cwd.path());
}

// 6. Inputs taken without a word.

#[test]
fn contradictory_or_impossible_settings_are_errors_before_any_work() {
    let tiny = fixture("tiny-k3.waste");
    let m = tiny.to_str().unwrap();
    let cases: [(Vec<&str>, &str); 9] = [
        (vec!["generate", "--model", m, "--ids", "1 2", "--mem", "1T"], "more than this machine has"),
        (vec!["generate", "--model", m, "--ids", "1 2", "--context", "18446744073709551615"], "--context"),
        (vec!["generate", "--model", m, "text", "--ids", "1 2"], "cannot be used with"),
        (vec!["chat", "--no-think", "--show-thinking"], "cannot be used with"),
        (vec!["generate", "--model", m, "--ids", "1", "--top-p", "2"], "not a top-p"),
        (vec!["generate", "--model", m, "--ids", "1", "--top-p", "0"], "not a top-p"),
        (vec!["generate", "--model", m, "--ids", "1", "--temperature", "NaN"], "not a temperature"),
        (vec!["generate", "--model", m, "--ids", "1", "--temperature=-1"], "not a temperature"),
        (vec!["perplexity", "--window", "30000", "--mem", "80M", "-"], "too small"),
    ];
    for (args, says) in cases {
        let (ok, out, err) = k3_stdin(&args, VERSE);
        assert!(!ok, "{args:?} ran: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: nothing generated: {out}");
    }
}

/// The memory plan covers what a run really uses: peak RSS stays within the plan plus a margin
/// for what the plan's fixed overhead does not hold (allocator slack, the tokenizer's tables, the
/// text itself: 16 MB, about a tenth of the smallest plan here).
#[test]
fn peak_memory_stays_within_the_plan() {
    const MARGIN: u64 = 16 << 20;
    let d = tempfile::tempdir().unwrap();
    let stats = d.path().join("s.json");
    // About 7,000 tokens of the held-out text.
    let text: String =
        std::fs::read_to_string(fixture("default-model/heldout.txt")).unwrap().chars().take(30_000).collect();
    let file = d.path().join("text.txt");
    std::fs::write(&file, text).unwrap();
    for (window, chunk, mem) in [("64", "16", None), ("2048", "256", Some("200M")), ("30000", "512", Some("300M"))] {
        let mut args = vec!["perplexity", file.to_str().unwrap(), "--window", window, "--chunk", chunk, "--json"];
        args.extend(["--stats-json", stats.to_str().unwrap()]);
        if let Some(m) = mem {
            args.extend(["--mem", m]);
        }
        let (ok, _, err) = k3(&args);
        assert!(ok, "{args:?}: {err}");
        let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        let (rss, plan) = (s["peak_rss_bytes"].as_u64().unwrap(), s["memory_plan_bytes"].as_u64().unwrap());
        assert!(rss <= plan + MARGIN, "window {window}, chunk {chunk}: peak RSS {rss} > plan {plan} + {MARGIN}");
        if let Some(m) = mem {
            assert!(plan <= k3_engine::budget::parse_size(m).unwrap(), "the plan keeps within --mem {m}");
        }
    }
}

// 7. What a user reaches for.

#[test]
fn long_prompts_come_from_a_file_or_standard_input() {
    let d = tempfile::tempdir().unwrap();
    // About 2,000 tokens of the held-out text: more than fits comfortably on a command line
    // for K3-sized prompts, and many prefill chunks.
    let long: String =
        std::fs::read_to_string(fixture("default-model/heldout.txt")).unwrap().chars().take(8000).collect();
    let file = d.path().join("prompt.txt");
    std::fs::write(&file, &long).unwrap();
    let stats = d.path().join("s.json");
    let (ok, out, err) = k3(&[
        "generate",
        "--prompt-file",
        file.to_str().unwrap(),
        "--max-tokens",
        "4",
        "--stats-json",
        stats.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(!out.trim().is_empty());
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let prompt_tokens = s["prefill"]["tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 1000, "{prompt_tokens}");
    let (ok, out2, err) = k3_stdin(&["generate", "-", "--max-tokens", "4"], &long);
    assert!(ok, "{err}");
    assert_eq!(out, out2, "the same prompt from standard input");
}

#[test]
fn generation_stops_at_the_context_limit_and_says_so() {
    let (ok, out, err) = k3(&["generate", "In the beginning", "--max-tokens", "1000", "--context", "24"]);
    assert!(ok, "{err}");
    assert!(err.contains("the context of 24 tokens is full"), "{err}");
    assert!(!out.is_empty());
    let (ok, _, err) = k3(&["generate", "In the beginning God created", "--context", "3"]);
    assert!(!ok && err.contains("raise --context"), "{err}");
}

#[test]
fn ctrl_c_stops_generation_and_keeps_the_statistics() {
    let d = tempfile::tempdir().unwrap();
    let stats = d.path().join("s.json");
    let mut child = bin()
        .args(["generate", "In the beginning", "--max-tokens", "1000000", "--context", "1000000"])
        .args(["--stats-json", stats.to_str().unwrap(), "--stats"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first generated bytes, then press Ctrl-C.
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?} {err}", out.status);
    assert!(err.contains("[interrupted]") && err.contains("tok/s"), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert!(s["decode"]["tokens"].as_u64().unwrap() >= 1, "{s}");
}

#[test]
fn a_chat_answer_cut_short_says_so() {
    let (ok, out, err) = k3_stdin(&["chat", "--max-tokens", "2", "--temperature", "0"], "Hello\n");
    assert!(ok, "{err}");
    assert!(err.contains("[answer cut at --max-tokens 2: "), "{err}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
}

/// On a terminal, chat edits lines: arrow keys move the cursor instead of reaching the model as
/// escape bytes. `script` gives k3-cli a pseudo-terminal; the turn's prompt-token count
/// (`--stats`) shows what the model was given.
#[test]
fn chat_edits_lines_on_a_terminal() {
    let turn_tokens = |typed: &str| -> String {
        let cmd = format!("{} chat --max-tokens 1 --temperature 0 --stats", env!("CARGO_BIN_EXE_k3-cli"));
        let mut child = std::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .env("K3_DATA_DIR", common::data_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("script (util-linux) runs the chat on a pseudo-terminal");
        let mut stdin = child.stdin.take().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        stdin.write_all(typed.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        // Ctrl-D ends the chat.
        stdin.write_all(b"\x04").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let all = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = all.lines().find(|l| l.contains("prompt tokens")).unwrap_or_else(|| panic!("no stats: {all:?}"));
        line.split("turn: ").nth(1).unwrap().split(' ').next().unwrap().to_string()
    };
    // "Helo", left arrow, "l", right arrow: "Hello" on a line editor, escape bytes without one.
    assert_eq!(turn_tokens("Helo\x1b[Dl\x1b[C\r"), turn_tokens("Hello\r"));
}

/// A long prompt shows its progress on a terminal (standard error through `script`'s pty).
#[test]
fn a_long_prefill_shows_progress_on_a_terminal() {
    let d = tempfile::tempdir().unwrap();
    let long: String =
        std::fs::read_to_string(fixture("default-model/heldout.txt")).unwrap().chars().take(10_000).collect();
    let file = d.path().join("prompt.txt");
    std::fs::write(&file, long).unwrap();
    let cmd =
        format!("{} generate --prompt-file {} --max-tokens 1 --chunk 8", env!("CARGO_BIN_EXE_k3-cli"), file.display());
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("K3_DATA_DIR", common::data_dir())
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) runs k3-cli on a pseudo-terminal");
    let all = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{all}");
    assert!(all.contains("prompt [") && all.contains(" tokens"), "no progress bar: {all:?}");
}

// 8. The default model wherever the binary goes.

#[test]
fn the_default_model_travels_with_the_binary() {
    let d = tempfile::tempdir().unwrap();
    let exe = d.path().join("k3-cli");
    std::fs::copy(env!("CARGO_BIN_EXE_k3-cli"), &exe).unwrap();
    let data = d.path().join("data");
    let out = std::process::Command::new(&exe)
        .args(["generate", "In the beginning", "--max-tokens", "4"])
        .env("K3_DATA_DIR", &data)
        .current_dir(d.path())
        .output()
        .unwrap();
    let (ok, said, err) = text(&out);
    assert!(ok && !said.trim().is_empty(), "{err}");
    let written = names(&data);
    assert!(written.len() == 1 && written[0].starts_with("default-"), "{written:?}");
}

// 9. Words: the README's commands and switches are checked against the parsers by
// `the_documents_agree_with_the_parsers` (src/main.rs), with SERVING.md's.
