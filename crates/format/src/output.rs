//! Writing a file a user named, safely: the bytes go to a temporary with a unique name in the
//! target's directory (never a name a user could own), which is removed if anything fails and
//! renamed over the target only once complete and on disk. The target's directory is checked when
//! the file is created, so a command can refuse a bad `--out` before a long run, not after it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{FormatError, Result};

/// An output file being written. Dropping it without [`commit`](Self::commit) leaves the target
/// untouched and removes the temporary.
#[derive(Debug)]
pub struct OutputFile {
    target: PathBuf,
    tmp: tempfile::NamedTempFile,
    /// The mode the target gets.
    mode: u32,
}

impl OutputFile {
    /// Checks that `target` can be written (it is not a directory; its directory exists and takes
    /// new files) and creates the temporary that will replace it.
    pub fn create(target: impl AsRef<Path>) -> Result<OutputFile> {
        let target = target.as_ref().to_path_buf();
        let invalid = |reason: String| FormatError::Output { path: target.clone(), reason };
        if target.as_os_str().is_empty() {
            return Err(invalid("an empty path".into()));
        }
        if target.is_dir() {
            return Err(invalid("is a directory; give a file name".into()));
        }
        let name = target.file_name().ok_or_else(|| invalid("names no file".into()))?.to_string_lossy().into_owned();
        let dir = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(invalid(format!("its directory {} does not exist", dir.display())));
        }
        // As any other program's new file: 0666 less the umask (tempfile's own default is
        // 0600, which would hide a shared model from its other users); a file replaced keeps
        // its mode.
        let mode = std::fs::metadata(&target).map_or(0o666, |m| m.permissions().mode() & 0o7777);
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".k3tmp")
            .permissions(std::fs::Permissions::from_mode(mode))
            .tempfile_in(&dir)
            .map_err(|e| FormatError::io(&dir, e))?;
        // What the umask made of it, to restore if a writer replaces the temporary (safetensors
        // renames its own 0600 temporary over the path it is given).
        let mode = tmp.as_file().metadata().map_err(|e| FormatError::io(tmp.path(), e))?.permissions().mode() & 0o7777;
        Ok(OutputFile { target, tmp, mode })
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The temporary's path, for writers that open a path themselves.
    pub fn temp_path(&self) -> &Path {
        self.tmp.path()
    }

    /// The temporary, for writing in pieces.
    pub fn file(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// Writes `bytes`, makes them durable and renames the temporary over the target.
    pub fn commit(mut self, bytes: &[u8]) -> Result<()> {
        let tmp = self.tmp.path().to_path_buf();
        self.tmp.as_file_mut().write_all(bytes).map_err(|e| FormatError::io(&tmp, e))?;
        self.finish()
    }

    /// Makes what was written through [`file`](Self::file) durable and renames it over the target.
    pub fn finish(self) -> Result<()> {
        let OutputFile { target, tmp, mode } = self;
        let now = std::fs::metadata(tmp.path()).map_err(|e| FormatError::io(tmp.path(), e))?;
        if now.permissions().mode() & 0o7777 != mode {
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
                .map_err(|e| FormatError::io(tmp.path(), e))?;
        }
        let file = File::open(tmp.path()).map_err(|e| FormatError::io(tmp.path(), e))?;
        file.sync_all().map_err(|e| FormatError::io(tmp.path(), e))?;
        tmp.persist(&target).map_err(|e| FormatError::io(&target, e.error))?;
        if let Some(dir) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
            // The rename is durable once the directory is; a failure here loses nothing.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

/// Writes `bytes` to `target` atomically (see [`OutputFile`]).
pub fn write_atomic(target: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    OutputFile::create(target)?.commit(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's umask, as the kernel reports it (reading it with umask(2) would change it).
    fn umask() -> u32 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let mask = status.lines().find_map(|l| l.strip_prefix("Umask:")).unwrap().trim();
        u32::from_str_radix(mask, 8).unwrap()
    }

    #[test]
    fn a_new_file_takes_the_umask_and_a_replaced_one_keeps_its_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out.json");
        write_atomic(&p, b"1").unwrap();
        let mask = umask();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o666 & !mask);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"2").unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_writer_that_renames_its_own_temporary_over_ours_still_gives_the_umask_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("model.safetensors");
        let o = OutputFile::create(&p).unwrap();
        let theirs = d.path().join("theirs");
        std::fs::write(&theirs, b"tensors").unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::rename(&theirs, o.temp_path()).unwrap();
        o.finish().unwrap();
        let mask = umask();
        assert_eq!(std::fs::read(&p).unwrap(), b"tensors");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o666 & !mask);
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_target_and_leaves_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("run.f32");
        // Files a user could own next to the target, with the names older versions used.
        std::fs::write(d.path().join("run.partial"), b"mine").unwrap();
        std::fs::write(d.path().join("run.tmp"), b"mine too").unwrap();
        write_atomic(&out, b"first").unwrap();
        write_atomic(&out, b"second").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"second");
        assert_eq!(names(d.path()), ["run.f32", "run.partial", "run.tmp"]);
        assert_eq!(std::fs::read(d.path().join("run.partial")).unwrap(), b"mine");
    }

    #[test]
    fn an_abandoned_output_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let mut f = OutputFile::create(d.path().join("x.json")).unwrap();
        f.file().write_all(b"half").unwrap();
        assert_eq!(names(d.path()).len(), 1, "the temporary exists while writing");
        drop(f);
        assert!(names(d.path()).is_empty());
    }

    #[test]
    fn bad_targets_are_refused_before_any_work() {
        let d = tempfile::tempdir().unwrap();
        let e = OutputFile::create(d.path()).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let e = OutputFile::create(d.path().join("missing/x.f32")).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        assert!(names(d.path()).is_empty());
    }
}
