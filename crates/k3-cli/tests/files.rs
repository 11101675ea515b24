//! The files k3 reads and writes, as a user's system has them: outputs with the user's umask, the
//! binary's own default model repaired when its copy is damaged, FIFOs and directories where a
//! model file belongs refused at once (never a hang), a Hugging Face directory given as a model
//! pointed to conversion, and statistics written when generation ends on SIGTERM or SIGHUP.

mod common;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, copy_model, fixture, k3, names};

fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    u32::from_str_radix(status.lines().find_map(|l| l.strip_prefix("Umask:")).unwrap().trim(), 8).unwrap()
}

/// Runs `k3-cli args`, failing the test if it has not ended within a minute (a hang).
fn k3_bounded(args: &[&str]) -> (bool, String) {
    let mut child = bin().args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status.success(), err);
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("k3-cli {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn outputs_take_the_users_umask() {
    let d = tempfile::tempdir().unwrap();
    let stats = d.path().join("stats.json");
    let (ok, _, err) = k3(&["generate", "In", "--max-tokens", "1", "--stats-json", stats.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::metadata(&stats).unwrap().permissions().mode() & 0o777, 0o666 & !umask());
}

#[test]
fn a_damaged_copy_of_the_default_model_is_replaced() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let run = || {
        let out = bin()
            .env("K3_DATA_DIR", &data)
            .args(["generate", "In the beginning", "--max-tokens", "2"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = run();
    assert!(ok, "{err}");
    let copy = data.join(&names(&data)[0]);
    // A flipped byte in the experts, and a truncated trunk.
    let experts = copy.join("experts-00000.waste");
    let mut b = std::fs::read(&experts).unwrap();
    b[5000] ^= 0x40;
    std::fs::write(&experts, b).unwrap();
    let trunk = copy.join("trunk.waste");
    let len = std::fs::metadata(&trunk).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&trunk).unwrap().set_len(len / 2).unwrap();
    let (ok, err) = run();
    assert!(ok, "{err}");
    assert!(err.contains("damaged; written again"), "{err}");
    assert_eq!(std::fs::read(&experts).unwrap(), std::fs::read(fixture("default.waste/experts-00000.waste")).unwrap());
    assert_eq!(names(&data).len(), 1, "nothing left beside it: {:?}", names(&data));
}

#[test]
fn a_fifo_where_a_model_file_belongs_is_refused_not_waited_on() {
    for file in ["experts-00000.waste", "header.waste", "trunk.waste"] {
        let d = copy_model("default.waste");
        let p = d.path().join(file);
        std::fs::remove_file(&p).unwrap();
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        let (ok, err) = k3_bounded(&["generate", "--model", d.path().to_str().unwrap(), "In", "--max-tokens", "1"]);
        assert!(!ok);
        assert!(err.contains(file) && err.contains("not a regular file"), "{file}: {err}");
    }
}

#[test]
fn a_hugging_face_directory_given_as_a_model_points_to_conversion() {
    let (ok, err) = k3_bounded(&["generate", "--model", fixture("golden/tiny-k3").to_str().unwrap(), "--ids", "1"]);
    assert!(!ok);
    assert!(err.contains("Hugging Face checkpoint") && err.contains("convert"), "{err}");
}

#[test]
fn generation_ended_by_sigterm_or_sighup_still_writes_its_statistics() {
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        let d = tempfile::tempdir().unwrap();
        let stats = d.path().join("stats.json");
        let mut child = bin()
            .args(["generate", "In the beginning", "--max-tokens", "100000", "--ignore-eos"])
            .args(["--stats-json", stats.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 16];
        let _ = child.stdout.as_mut().unwrap().read(&mut first).unwrap();
        // SAFETY: kill(2) on our child, which is running (it just wrote).
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("[interrupted]"), "signal {sig}: {err}");
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert!(v["tokens"].as_u64().unwrap() > 0, "{v}");
    }
}

#[test]
fn an_os_error_is_said_once() {
    // /proc takes no new files: the temporary beside the target cannot be made.
    let (ok, _, err) = k3(&["generate", "In", "--max-tokens", "1", "--stats-json", "/proc/k3-stats.json"]);
    assert!(!ok);
    assert_eq!(err.matches("(os error").count(), 1, "{err}");
    let (ok, _, err) = k3(&["generate", "--model", "/nonexistent/model", "In"]);
    assert!(!ok);
    assert_eq!(err.matches("/nonexistent/model").count(), 1, "the path said once: {err}");
}

#[test]
fn the_installed_binary_converts_a_checkpoint_it_then_runs() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m.waste");
    let (ok, said, err) =
        k3(&["convert", "--hf", fixture("golden/tiny-kimi-linear").to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(said.contains("verified"), "{said}");
    // The experts are read in place from the checkpoint, said so; nothing of them is written.
    assert!(said.contains("experts: read in place from 1 checkpoint file(s)"), "{said}");
    assert!(!out.join("experts-00000.waste").exists());
    // Copied, the same tensors and records as the repository's own conversion of that checkpoint
    // (the header differs only in the source path its provenance names).
    let copied = d.path().join("c.waste");
    let (ok, _, err) = k3(&[
        "convert",
        "--hf",
        fixture("golden/tiny-kimi-linear").to_str().unwrap(),
        "--out",
        copied.to_str().unwrap(),
        "--copy-experts",
    ]);
    assert!(ok, "{err}");
    for (dir, f) in [(&out, "trunk.waste"), (&copied, "trunk.waste"), (&copied, "experts-00000.waste")] {
        let ours = std::fs::read(dir.join(f)).unwrap();
        assert!(ours == std::fs::read(fixture("tiny-kimi-linear.waste").join(f)).unwrap(), "{f} differs");
    }
    for m in [&out, &copied] {
        let (ok, _, err) = k3(&["generate", "--model", m.to_str().unwrap(), "--ids", "1 2", "--max-tokens", "2"]);
        assert!(ok, "{err}");
    }
}
