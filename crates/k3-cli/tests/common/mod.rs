//! What the CLI tests share: the real binary, run as a user runs it, with the default model
//! written to a data directory inside the build tree (not the user's home).

#![allow(dead_code)]

pub mod server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)
}

/// Where the tests' k3-cli writes the default model.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("k3-data")
}

/// `k3-cli` with the tests' data directory.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_k3-cli"));
    c.env("K3_DATA_DIR", data_dir());
    c
}

pub fn text(out: &Output) -> (bool, String, String) {
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Runs `k3-cli args`: (success, stdout, stderr).
pub fn k3(args: &[&str]) -> (bool, String, String) {
    text(&bin().args(args).stdin(Stdio::null()).output().unwrap())
}

/// Runs `k3-cli args` with `input` on standard input.
pub fn k3_stdin(args: &[&str], input: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child =
        bin().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // A command may finish (or fail) before reading all of its input.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    text(&child.wait_with_output().unwrap())
}

/// A writable copy of a fixture model.
pub fn copy_model(name: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    d
}

/// The names in a directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}
