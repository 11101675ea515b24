//! `cargo xtask` as a user runs it: every task with its options at 0 and at the largest integer,
//! and with standard output closed early.

#[path = "../../crates/k3-cli/tests/common/sweep.rs"]
mod sweep;

use std::path::{Path, PathBuf};
use std::time::Duration;

use sweep::{Binary, Invocation};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name).to_str().unwrap().to_string()
}

fn xtask() -> Binary {
    Binary { path: PathBuf::from(env!("CARGO_BIN_EXE_xtask")), env: Vec::new() }
}

/// A quick, valid invocation of every task.
fn bases() -> Vec<Invocation> {
    let inv = |sub: &[&str], args: &[&str]| Invocation {
        sub: sub.iter().map(|s| s.to_string()).collect(),
        args: args.iter().map(|s| s.to_string()).collect(),
        input: "",
    };
    let (tiny, shard) = (fixture("tiny-k3.waste"), fixture("tiny-k3.waste/experts-00000.waste"));
    vec![
        inv(&["convert"], &["--hf", &fixture("golden/tiny-k3"), "--out", "converted"]),
        inv(&["synth"], &["--preset", "k3-tiny", "--out", "synth"]),
        inv(&["export"], &["--model", &tiny, "--out", "exported"]),
        inv(&["quality"], &["--data", "no-such-capture"]),
        inv(
            &["bench", "decode"],
            &["--model", &tiny, "--tokens", "2", "--prompt", "2", "--reps", "1", "--svg", "d.svg"],
        ),
        inv(&["bench", "io"], &["--file", &shard, "--record", "16384", "--reads", "4", "--reps", "1"]),
        inv(&["bench", "verify"], &["--reps", "1"]),
        inv(&["bench", "attn"], &["--reps", "1", "--context", "1k", "--chunk", "16"]),
        inv(&["bench", "kernels"], &["--reps", "1"]),
    ]
}

#[test]
fn every_option_at_zero_and_at_the_largest_integer_is_handled() {
    let cwd = tempfile::tempdir().unwrap();
    // The heavy benchmarks run only with valid repetitions (their only numeric option).
    let runs = xtask().sweep(&bases(), cwd.path(), Duration::from_secs(300));
    assert!(runs > 40, "{runs}");
}

#[test]
fn a_closed_standard_output_ends_every_task_quietly() {
    let cwd = tempfile::tempdir().unwrap();
    xtask().closed_stdout(&bases(), cwd.path());
}

#[test]
fn too_many_shards_are_refused_before_any_file_is_written() {
    let cwd = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["convert", "--hf", &fixture("golden/tiny-k3"), "--out", "m", "--shards", "500"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("500 expert shards for 160 expert records"), "{err}");
    assert!(!cwd.path().join("m").exists());
}
