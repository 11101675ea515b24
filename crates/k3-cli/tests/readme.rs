//! The README's commands run as written: every ```sh block (the ones that work on the default
//! model; blocks that need a real checkpoint are ```bash) runs as one bash script from a fresh
//! directory that sees the repository's fixtures, with `k3-cli` meaning this build's binary, and
//! must exit 0 having printed something.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Blocks not run here, each with the reason; every one must still be in the README.
const NOT_RUN: &[(&str, &str)] = &[("cargo test --workspace", "the test command itself: it runs this test")];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The README's ```sh blocks, in order.
fn sh_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(b), "```") => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "README.md ends inside a code block");
    blocks
}

/// Runs `script` with bash in `dir`, within `limit`; returns (exit success, stdout, stderr).
fn run(script: &str, dir: &Path, path: &str, data: &Path, limit: Duration) -> (bool, String, String) {
    let full = format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}");
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(full)
        .current_dir(dir)
        .env("PATH", path)
        .env("K3_DATA_DIR", data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let ok = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.success();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (ok, out_reader.join().unwrap(), err_reader.join().unwrap())
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn every_sh_block_of_the_readme_runs_on_the_default_model() {
    let root = repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = sh_blocks(&readme);
    for (skipped, why) in NOT_RUN {
        assert!(
            blocks.iter().any(|b| b.trim() == *skipped),
            "NOT_RUN lists `{skipped}` ({why}), no longer in the README"
        );
    }

    // A fresh directory: the repository's fixtures and docs visible, outputs land here, not in the tree.
    let work = std::env::temp_dir().join(format!("k3-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_k3-cli"), bin.join("k3-cli")).unwrap();
    std::os::unix::fs::symlink(root.join("fixtures"), work.join("fixtures")).unwrap();
    // The README's pictures (an image example reads the chat page's screenshot).
    std::os::unix::fs::symlink(root.join("docs"), work.join("docs")).unwrap();
    let data = work.join("data");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

    let mut ran = 0;
    for block in &blocks {
        if NOT_RUN.iter().any(|(s, _)| block.trim() == *s) {
            continue;
        }
        // The set-up command builds the release binary: here it is this build's.
        let script = block.replace("cargo run --release -p k3-cli --", "k3-cli");
        if script.contains("curl") && !have("curl") {
            eprintln!("not run (curl is not installed):\n{block}");
            continue;
        }
        let (ok, out, err) = run(&script, &work, &path, &data, Duration::from_secs(600));
        assert!(ok, "this README block failed:\n{block}\n--- stdout\n{out}\n--- stderr\n{err}");
        assert!(!out.trim().is_empty(), "this README block printed nothing:\n{block}\n--- stderr\n{err}");
        ran += 1;
    }
    // The quick start's set-up command, its examples, the server, conversion.
    assert!(ran >= 4, "only {ran} README blocks ran");
    let _ = std::fs::remove_dir_all(&work);
}
