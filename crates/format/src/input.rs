//! Input files a user names (prompts, images, saved conversations), read safely: opened without
//! blocking (a FIFO with no writer would otherwise wait forever in `open`), checked on the opened
//! descriptor to be a regular file (a FIFO, a device such as `/dev/zero` or a directory is
//! refused by kind) no longer than the caller's bound, and read to at most the bound plus one
//! byte, so a file that grows while it is read is refused too rather than read without end.

use std::fs::{File, FileType};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why an input file was not read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is {}; {what} at most {}", size(*.bytes), size(*.limit))]
    TooLarge { path: PathBuf, what: String, bytes: u64, limit: u64 },
    #[error("{path} grew past {} while it was read; {what} at most that", size(*.limit))]
    Grew { path: PathBuf, what: String, limit: u64 },
}

/// The whole of the regular file `path`, at most `limit` bytes; `what` says whose bound it is in
/// the refusal (`/load reads`: "… is 133.0 MiB; /load reads at most 128.0 MiB").
pub fn read_input(path: &Path, what: &str, limit: u64) -> Result<Vec<u8>, InputError> {
    let io = |source| InputError::Io { path: path.to_path_buf(), source };
    // O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a writer; on
    // the regular file we go on to read, the flag has no effect.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(InputError::NotRegular { path: path.to_path_buf(), kind: kind(meta.file_type()) });
    }
    if meta.len() > limit {
        return Err(InputError::TooLarge { path: path.to_path_buf(), what: what.into(), bytes: meta.len(), limit });
    }
    read_bounded(file, path, what, limit, meta.len())
}

/// Reads `file` to its end, refusing more than `limit` bytes (a file that grew since `fstat`).
fn read_bounded(file: File, path: &Path, what: &str, limit: u64, expected: u64) -> Result<Vec<u8>, InputError> {
    let mut bytes = Vec::with_capacity(expected as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| InputError::Io { path: path.to_path_buf(), source })?;
    if bytes.len() as u64 > limit {
        return Err(InputError::Grew { path: path.to_path_buf(), what: what.into(), limit });
    }
    Ok(bytes)
}

/// What a file that is not a regular file is, as a user would name it.
fn kind(t: FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// A byte count as a person reads it: bytes, KiB or MiB.
fn size(b: u64) -> String {
    match b {
        0..1024 => format!("{b} bytes"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let d = tempfile::tempdir().unwrap();
        let ok = d.path().join("ok.txt");
        std::fs::write(&ok, b"hello").unwrap();
        assert_eq!(read_input(&ok, "a test", 5).unwrap(), b"hello");
        let e = read_input(&ok, "a test reads", 4).unwrap_err().to_string();
        assert!(e.contains("ok.txt is 5 bytes; a test reads at most 4 bytes"), "{e}");
        let e = read_input(d.path(), "a test", 5).unwrap_err().to_string();
        assert!(e.ends_with("is a directory, not a regular file"), "{e}");
        let e = read_input(Path::new("/dev/zero"), "a test", 5).unwrap_err().to_string();
        assert_eq!(e, "/dev/zero is a character device, not a regular file");
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_input(&fifo, "a test", 5).unwrap_err().to_string();
        assert!(e.ends_with("fifo is a FIFO, not a regular file"), "{e}");
        let e = read_input(&d.path().join("none"), "a test", 5).unwrap_err().to_string();
        assert!(e.contains("none: No such file"), "{e}");
    }

    #[test]
    fn a_file_longer_than_its_stat_is_cut_at_the_bound() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("grows");
        std::fs::write(&p, b"0123456789").unwrap();
        // As if it had been 4 bytes at fstat and grew to 10 before the read.
        let e = read_bounded(File::open(&p).unwrap(), &p, "a test", 4, 4).unwrap_err().to_string();
        assert!(e.contains("grew past 4 bytes"), "{e}");
    }

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(size(5), "5 bytes");
        assert_eq!(size(2048), "2.0 KiB");
        assert_eq!(size(133 << 20), "133.0 MiB");
    }
}
