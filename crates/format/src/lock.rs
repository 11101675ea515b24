//! One writer per model directory: an exclusive `flock` on the directory itself (no lock file to
//! leave behind or to collide with a user's), released when the writer is dropped or its process
//! dies. A second writer is refused, naming the process that holds the lock.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{FormatError, Result};

/// Held while a writer owns its directory.
#[derive(Debug)]
pub struct DirLock {
    _dir: File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        let f = File::open(dir).map_err(|e| FormatError::io(dir, e))?;
        match f.try_lock() {
            Ok(()) => Ok(DirLock { _dir: f }),
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = f.metadata().ok().and_then(|m| holder(&m)).unwrap_or_else(|| "another process".into());
                Err(FormatError::Writer {
                    dir: dir.to_path_buf(),
                    reason: format!(
                        "another conversion is writing into it ({holder}); wait for it to finish, or stop it \
                         and run the command again to resume"
                    ),
                })
            }
            Err(std::fs::TryLockError::Error(e)) => Err(FormatError::io(dir, e)),
        }
    }
}

/// Who holds the flock on the file `m` describes: "pid N: command line", from `/proc/locks`.
fn holder(m: &std::fs::Metadata) -> Option<String> {
    let (dev, ino) = (m.dev(), m.ino());
    let (major, minor) = (((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff), (dev & 0xff) | ((dev >> 12) & !0xff));
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid: u32 = locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == want).then(|| f[4].parse().ok()).flatten()
    })?;
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmd: Vec<String> =
        cmd.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    Some(if cmd.is_empty() { format!("pid {pid}") } else { format!("pid {pid}: {}", cmd.join(" ")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_naming_the_first() {
        let d = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(d.path()).unwrap();
        let e = DirLock::acquire(d.path()).unwrap_err().to_string();
        assert!(e.contains("another conversion is writing into it"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "names the holder: {e}");
        drop(first);
        DirLock::acquire(d.path()).unwrap();
    }
}
