//! What `convert` says as a person watches it: how to go on after Ctrl-C, and what a rerun resumes.

mod common;

use std::process::Stdio;

use common::{bin, fixture};

/// Ctrl-C in the middle of a conversion says how to go on and ends as the signal would.
#[test]
fn ctrl_c_says_how_to_resume() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let src = fixture("default.waste");
    let args = ["convert", "--from", src.to_str().unwrap(), "--out", out.to_str().unwrap(), "--experts", "vq3"];
    let mut child = bin().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The journal exists once writing has begun (the handler is in place before that).
    let start = std::time::Instant::now();
    while !out.join("waste.journal").exists() {
        assert!(start.elapsed().as_secs() < 60, "the conversion never started writing");
        assert!(child.try_wait().unwrap().is_none(), "the conversion ended before it could be interrupted");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: kill(2) on our own child, which is running.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(128 + libc::SIGINT), "{err}");
    assert!(err.contains("interrupted; run the same command to resume"), "{err}");
}

/// A rerun after an interruption says what it resumes (and counts only its own work in the bar),
/// and finishes the model; sizes in one unit system (decimal bytes).
#[test]
fn the_rerun_says_what_it_resumes() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let src = fixture("default.waste");
    // Stopped half way through the experts, a second after progress was journaled.
    let opts = k3_convert::ConvertOptions::new(&src, &out);
    let mut slept = false;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        k3_convert::convert(&opts, &mut |p| {
            if p.phase == "experts" && p.done * 4 > p.total && !slept {
                std::thread::sleep(std::time::Duration::from_millis(1100));
                slept = true;
            }
            if p.phase == "experts" && p.done * 2 > p.total {
                panic!("interrupted");
            }
        })
    }));
    assert!(r.is_err());
    let o = bin().args(["convert", "--from", src.to_str().unwrap(), "--out", out.to_str().unwrap()]).output().unwrap();
    let (stdout, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("resuming experts: ") && err.contains(" MB already written"), "{err}");
    assert!(stdout.contains("resumed: kept"), "{stdout}");
    assert!(stdout.contains(" MB") && !stdout.contains("MiB"), "{stdout}");
    let m = k3_format::Model::open(&out).unwrap();
    assert!(m.verify(&mut |_| {}).is_empty());
}

/// Where standard error is not a terminal (a log, a pipe), each phase says a line as it starts
/// and one as it ends (with lines every few seconds between for a long one); `--quiet` says none.
#[test]
fn progress_on_a_pipe_is_lines_and_quiet_is_quiet() {
    let d = tempfile::tempdir().unwrap();
    let src = fixture("default.waste");
    let run = |out: &str, quiet: bool| {
        let out = d.path().join(out);
        let mut args = vec!["convert", "--from", src.to_str().unwrap(), "--out", out.to_str().unwrap()];
        if quiet {
            args.push("--quiet");
        }
        let o = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        err
    };
    let err = run("a", false);
    for phase in ["trunk", "experts", "verify"] {
        let starts = err.lines().any(|l| l.starts_with(&format!("{phase}: 0 B/")) && l.ends_with("(0.0%)"));
        let ends = err.lines().any(|l| l.starts_with(&format!("{phase}: done, ")) && l.ends_with("/s)"));
        assert!(starts && ends, "{phase}:\n{err}");
    }
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "no terminal controls in a log:\n{err}");
    assert_eq!(run("b", true), "");
}
