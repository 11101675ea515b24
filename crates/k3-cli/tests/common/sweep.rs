//! Running a binary's every subcommand the way careless users and broken pipes do: every option
//! that takes a value at 0 and at the largest integer, and standard output closed before the first
//! line. Shared by the `k3-cli` and `cargo xtask` tests (included by path).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A valid invocation: the subcommand path (`["bench", "io"]`), its arguments, its standard input.
pub struct Invocation {
    pub sub: Vec<String>,
    pub args: Vec<String>,
    pub input: &'static str,
}

pub struct Binary {
    pub path: PathBuf,
    pub env: Vec<(String, PathBuf)>,
}

impl Binary {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.path);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// The options of `sub` that take a value, from its `--help`.
    pub fn value_options(&self, sub: &[String]) -> Vec<String> {
        let out = self.command().args(sub).arg("--help").output().unwrap();
        assert!(out.status.success(), "{sub:?} --help");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.trim_start().strip_prefix("--")?.split_once(' ')?;
                rest.starts_with('<').then(|| format!("--{name}"))
            })
            .collect()
    }

    /// Runs to the end (at most `limit`, else it is a hang): the exit status and stderr.
    fn run(&self, args: &[String], input: &str, cwd: &Path, limit: Duration) -> (ExitStatus, String) {
        let mut child = self
            .command()
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
                return (status, err);
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                panic!("{args:?} still running after {limit:?}: a hang");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every value-taking option of every invocation at "0" and at u64::MAX, on two threads: each
    /// run ends in time, without a signal or a panic, exits 0, 1 or 2, and a failure says `error:`.
    /// Returns how many runs were made.
    pub fn sweep(&self, bases: &[Invocation], cwd: &Path, limit: Duration) -> usize {
        let mut cases = Vec::new();
        for b in bases {
            for opt in self.value_options(&b.sub) {
                for value in ["0", "18446744073709551615"] {
                    let mut rest = b.args.clone();
                    match rest.iter().position(|a| *a == opt) {
                        Some(i) => rest[i + 1] = value.to_string(),
                        None => rest.extend([opt.clone(), value.to_string()]),
                    }
                    cases.push(([b.sub.clone(), rest].concat(), b.input));
                }
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while let Some((args, input)) = cases.get(next.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) {
                        let (status, err) = self.run(args, input, cwd, limit);
                        assert!(status.signal().is_none(), "{args:?} killed by a signal: {err}");
                        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
                        let code = status.code().unwrap();
                        assert!(code <= 2, "{args:?} exited {code}: {err}");
                        if code != 0 {
                            assert!(err.contains("error:"), "{args:?}: an unclear failure: {err}");
                        }
                    }
                });
            }
        });
        cases.len()
    }

    /// Every invocation with its standard output closed before the first line: it ends quietly
    /// (success, or SIGPIPE as Unix tools do), never with a panic or a broken-pipe error.
    pub fn closed_stdout(&self, bases: &[Invocation], cwd: &Path) {
        for b in bases {
            let mut child = self
                .command()
                .args(&b.sub)
                .args(&b.args)
                .current_dir(cwd)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            drop(child.stdout.take());
            let _ = child.stdin.take().unwrap().write_all(b.input.as_bytes());
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!err.contains("panicked"), "{:?}: {err}", b.sub);
            // Quiet: done, or ended by SIGPIPE as Unix tools are, or an error of its own (a
            // missing input, say) that is not about the pipe.
            let own_error = out.status.code() == Some(1) && err.contains("error:") && !err.contains("Broken pipe");
            let quiet = out.status.success() || out.status.signal() == Some(libc::SIGPIPE) || own_error;
            assert!(quiet, "{:?}: {:?} {err}", b.sub, out.status);
        }
    }
}
