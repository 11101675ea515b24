//! The files a user hands the CLI as input (prompt files, `--image`, chat's `/image` and
//! `/load`, perplexity's text, a tokenizer file), and standard input: a FIFO or a device is refused at once by kind (never a hang, never
//! read until memory runs out), a file past its bound is refused before any work, naming the
//! path and the limit; `-n 0` is refused; a conversation saved with images and tool calls loads
//! back whole; an answer that fails keeps the conversation; a signal ends a CLI waiting for input.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{bin, fixture};

/// Generous: a refusal takes well under a second; a hang never ends.
const HANG: Duration = Duration::from_secs(60);

/// A tiny K3 that sees (the golden vision checkpoint), converted once per test binary.
fn vision_model() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("input-files-vision");
        let _ = std::fs::remove_dir_all(&dir);
        let opts = k3_convert::ConvertOptions::new(fixture("golden/tiny-k3-vision"), dir.join("m.waste"));
        k3_convert::convert(&opts, &mut |_| {}).unwrap();
        dir.join("m.waste")
    })
}

/// The scripted tool caller (`k3_convert::synth::scripted`), converted once per test binary.
fn tool_caller() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("input-files-toolcaller");
        let _ = std::fs::remove_dir_all(&dir);
        k3_convert::synth::scripted::tool_caller(&fixture("golden/tiny-kimi-linear"), &dir.join("hf")).unwrap();
        k3_convert::convert(&k3_convert::ConvertOptions::new(dir.join("hf"), dir.join("m.waste")), &mut |_| {})
            .unwrap();
        dir.join("m.waste")
    })
}

fn picture() -> PathBuf {
    fixture("golden/tiny-k3-vision/golden/picture.png")
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// Waits for `child`, killing it and failing the test past [`HANG`]: (exit code, stderr).
fn bounded(mut child: Child, what: &str) -> (Option<i32>, String) {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status.code(), err);
        }
        if t.elapsed() > HANG {
            let _ = child.kill();
            panic!("{what} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `k3-cli args` with `input` on standard input (then closed), its output thrown away.
fn run(args: &[&str], input: &str) -> (Option<i32>, String) {
    let mut child =
        bin().args(args).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    bounded(child, &format!("k3-cli {args:?}"))
}

#[test]
fn fifos_and_devices_are_refused_at_once_by_kind() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    mkfifo(&fifo);
    let f = fifo.to_str().unwrap();
    let m = vision_model().to_str().unwrap();
    for (file, kind) in
        [(f, "is a FIFO"), ("/dev/zero", "is a character device"), ("/dev/urandom", "is a character device")]
    {
        let (code, err) = run(&["generate", "-m", m, "-f", file, "-n", "1"], "");
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&format!("{file} {kind}, not a regular file")), "-f {file}: {err}");
        let (code, err) = run(&["generate", "-m", m, "What?", "-n", "1", "--image", file], "");
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&format!("{file} {kind}, not a regular file")), "--image {file}: {err}");
        let (code, err) = run(&["chat", "-m", m, "-n", "1"], &format!("/image {file}\n/load {file}\n"));
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains(&format!("[no image: {file} {kind}, not a regular file]")), "/image {file}: {err}");
        assert!(err.contains(&format!("[not loaded: {file} {kind}, not a regular file]")), "/load {file}: {err}");
        let out = d.path().join(format!("calibrated-{}", file.rsplit('/').next().unwrap_or("x")));
        let out = out.to_str().unwrap();
        let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/golden/tiny-k3");
        for args in [
            &["perplexity", file][..],
            &["tokenize", "--tokenizer", file],
            &["convert", "--hf", tiny, "--out", out, "--experts", "vq3", "--calibrate-ids", file],
        ] {
            let (code, err) = run(args, "In the beginning");
            assert_eq!(code, Some(1), "{err}");
            assert!(err.contains(&format!("{file} {kind}, not a regular file")), "{args:?}: {err}");
        }
    }
}

#[test]
fn an_oversized_prompt_or_conversation_is_refused_before_any_work() {
    let d = tempfile::tempdir().unwrap();
    // Sparse: 50 MiB on paper, nothing on disk; read whole, it would be 50 M tokens of NULs.
    let big = d.path().join("big.txt");
    std::fs::File::create(&big).unwrap().set_len(50 << 20).unwrap();
    let (code, err) = run(&["generate", "-f", big.to_str().unwrap(), "-n", "1"], "");
    assert_eq!(code, Some(1), "a refusal, not an abort: {err}");
    assert!(err.contains("big.txt is 50.0 MiB; a prompt for a context of") && err.contains("holds at most"), "{err}");
    // Within the bytes but past the model's context in tokens: refused once tokenized, not
    // planned (a context of 1.1 M tokens) and prefilled for hours.
    let many = d.path().join("many.txt");
    std::fs::write(&many, " a".repeat(1_100_000)).unwrap();
    let (code, err) = run(&["generate", "-f", many.to_str().unwrap(), "-n", "1"], "");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("the prompt is 1100000 tokens, which leaves no room in a context of 1048576"), "{err}");
    // Standard input is bounded the same way, by the context asked for.
    let (code, err) = run(&["generate", "-", "-n", "1", "--context", "64"], &"x".repeat(100_000));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("standard input holds more than") && err.contains("a context of 64 tokens"), "{err}");
    let saved = d.path().join("big.json");
    std::fs::File::create(&saved).unwrap().set_len(133 << 20).unwrap();
    let (code, err) = run(&["chat", "-n", "1"], &format!("/load {}\n", saved.display()));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("big.json is 133.0 MiB; /load reads at most 128.0 MiB"), "{err}");
}

/// A prompt whose text fits but whose image's positions do not is refused, by what the image
/// adds, once the image is read; a model without eyes says so before any image file is read.
#[test]
fn images_are_checked_against_the_context_and_the_model() {
    let (m, pic) = (vision_model().to_str().unwrap(), picture());
    let pic = pic.to_str().unwrap();
    let (code, err) = run(&["generate", "-m", m, "What?", "-n", "1", "--context", "16", "--image", pic], "");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("the prompt with its images is")
            && err.contains("leaves no room in a context of 16: raise --context"),
        "{err}"
    );
    // The default model reads no images: said before the device is looked at.
    let (code, err) = run(&["generate", "What?", "-n", "1", "--image", "/dev/zero"], "");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--image: this model reads no images"), "{err}");
}

#[test]
fn zero_max_tokens_is_refused() {
    for args in [
        &["generate", "In the beginning", "-n", "0"][..],
        &["generate", "--max-tokens", "0", "In"],
        &["chat", "-n", "0"],
    ] {
        let (code, err) = run(args, "Hi\n");
        assert_ne!(code, Some(0), "{args:?}");
        assert!(err.contains("0 generates nothing: give at least 1"), "{args:?}: {err}");
    }
}

/// A conversation with an image (K3 vision) and one with a tool call (the scripted caller),
/// saved, loaded and saved again: the same file both times; the image is the picture's bytes as
/// a data URL where the user put it, the call a structured `tool_calls` entry, not text.
#[test]
fn save_and_load_keep_images_and_tool_calls() {
    let d = tempfile::tempdir().unwrap();
    let (first, again) = (d.path().join("first.json"), d.path().join("again.json"));
    let script = format!(
        "/image {}\nWhat is this?\n/save {}\n/load {}\n/save {}\n",
        picture().display(),
        first.display(),
        first.display(),
        again.display()
    );
    let (code, err) = run(&["chat", "-m", vision_model().to_str().unwrap(), "-n", "2", "--temp", "0"], &script);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("[loaded 2 messages and 1 image from"), "{err}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
    let url = saved[0]["content"][0]["image_url"]["url"].as_str().expect("the image as a part");
    let b64 = url.strip_prefix("data:image/png;base64,").expect("a PNG data URL");
    let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).unwrap();
    assert!(bytes == std::fs::read(picture()).unwrap(), "the picture's own bytes");
    assert_eq!(saved[0]["content"][1], serde_json::json!({"type": "text", "text": "What is this?"}));
    assert_eq!(std::fs::read(&first).unwrap(), std::fs::read(&again).unwrap(), "loaded back whole");

    let (first, again) = (d.path().join("call.json"), d.path().join("call-again.json"));
    let script = format!("Weather?\n/save {}\n/load {}\n/save {}\n", first.display(), first.display(), again.display());
    let (code, err) = run(&["chat", "-m", tool_caller().to_str().unwrap(), "--temp", "0"], &script);
    assert_eq!(code, Some(0), "{err}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
    let answer = &saved[1];
    assert_eq!(answer["tool_calls"][0]["function"]["name"], "get_weather", "{saved}");
    assert_eq!(answer["tool_calls"][0]["type"], "function", "{saved}");
    assert!(answer["tool_calls"][0]["id"].is_string(), "{saved}");
    let args = answer["tool_calls"][0]["function"]["arguments"].as_str().expect("a JSON text");
    assert!(serde_json::from_str::<serde_json::Value>(args).is_ok(), "{args}");
    assert!(!answer["content"].as_str().unwrap().contains("[tool call]"), "not flattened into the text: {saved}");
    assert_eq!(std::fs::read(&first).unwrap(), std::fs::read(&again).unwrap(), "loaded back whole");
}

/// Every answer fails (standard output is a full disk; then the engine, on damaged experts): each
/// failure is said, the conversation keeps the user's turns and what was said, the chat goes on
/// and `/save` writes it all.
#[test]
fn a_failed_answer_keeps_the_conversation() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("c.json");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let mut child = bin()
        .args(["chat", "-n", "4", "--temp", "0"])
        .stdin(Stdio::piped())
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = format!("In the beginning\nAnd then?\n/save {}\n", file.display());
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let (code, err) = bounded(child, "chat to /dev/full");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err.matches("[the answer failed: ").count(), 2, "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let users: Vec<&str> = saved
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["In the beginning", "And then?"], "{saved}");
    assert!(saved.as_array().unwrap().iter().any(|m| m["role"] == "assistant"), "what was said stays: {saved}");

    // The engine fails (every expert record damaged): each turn says so and is kept.
    let model = common::copy_model("default.waste");
    let shard = model.path().join("experts-00000.waste");
    let mut b = std::fs::read(&shard).unwrap();
    for e in &k3_format::Model::open(model.path()).unwrap().header().index {
        b[(e.offset + e.length / 2) as usize] ^= 0x40;
    }
    std::fs::write(&shard, b).unwrap();
    let file = d.path().join("damaged.json");
    let script = format!("In the beginning\nAnd then?\n/save {}\n", file.display());
    let (code, err) = run(&["chat", "-m", model.path().to_str().unwrap(), "-n", "4", "--temp", "0"], &script);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err.matches("[the answer failed: expert record (layer ").count(), 2, "{err}");
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(saved[0]["content"], "In the beginning", "{saved}");
    assert_eq!(saved[1]["content"], "And then?", "{saved}");
}

/// A chat waiting for a line on a pipe that never closes ends on Ctrl-C (SIGINT); so does
/// `generate -` waiting for its prompt.
#[test]
fn a_signal_ends_a_cli_waiting_for_input() {
    for args in [&["chat", "-n", "1"][..], &["generate", "-", "-n", "1"]] {
        let mut cmd = bin();
        // A shell without job control starts background commands with SIGINT ignored, and a child
        // inherits that (a Unix tool keeps it so): the default action is what is tested here.
        // SAFETY: between fork and exec only signal(2), which is async-signal-safe, is called.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child =
            cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        if args[0] == "chat" {
            // The prompt shows once the model is loaded: chat is waiting for a line.
            let mut seen = Vec::new();
            let mut byte = [0u8; 1];
            while !seen.ends_with(b"> ") && stderr.read(&mut byte).unwrap() == 1 {
                seen.push(byte[0]);
            }
        } else {
            std::thread::sleep(Duration::from_millis(500));
        }
        // SAFETY: kill(2) on our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
        let stdin = child.stdin.take();
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > HANG {
                let _ = child.kill();
                panic!("{args:?} went on waiting after SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(stdin);
        assert!(!status.success(), "{args:?}");
    }
}
