//! Whole files read through the expert [`Reader`]: O_DIRECT chunks, many in flight, so a large
//! file (a kept prompt state of hundreds of megabytes) comes off the drive at its ceiling rather
//! than at the page cache's readahead, and does not push the expert records out of the page
//! cache on its way.
//!
//! Files are opened with [`open_regular`]: a symbolic link is not followed, and a FIFO, socket
//! or device is refused without blocking and without a byte read, so a directory k3 reads from
//! cannot make it hang or read something else than the file its name gave.

use std::fs::{File, Metadata};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::arena::ALIGN;
use crate::{IoError, Priority, ReadRequest, Reader, ReaderOptions};

/// Bytes of one read in flight.
pub const CHUNK: usize = 4 << 20;
/// Reads in flight at once.
pub const DEPTH: usize = 8;

/// How [`read_file`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WholeRead {
    /// O_DIRECT through the reader (buffered where the filesystem refuses O_DIRECT).
    Direct,
    /// Buffered reads of the file.
    Buffered,
}

/// `path` opened for reading if it is a regular file, with its metadata (of the file opened, not
/// of whatever the name gives later). The open neither follows a symbolic link (O_NOFOLLOW) nor
/// blocks on a FIFO or a device (O_NONBLOCK); anything but a regular file is an error saying
/// what it is.
pub fn open_regular(path: &Path) -> Result<(File, Metadata), IoError> {
    let open_err = |source| IoError::Open { path: path.to_path_buf(), source };
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).map_err(
            |e| match e.raw_os_error() {
                Some(libc::ELOOP) => open_err(std::io::Error::other("is a symbolic link, which is not followed")),
                _ => open_err(e),
            },
        )?;
    let meta = file.metadata().map_err(open_err)?;
    if !meta.is_file() {
        let what = kind(&meta);
        return Err(open_err(std::io::Error::other(format!("is {what}, not a regular file"))));
    }
    Ok((file, meta))
}

/// What a file that is not a regular one is, for messages.
pub fn kind(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    match () {
        _ if t.is_file() => "a regular file",
        _ if t.is_dir() => "a directory",
        _ if t.is_symlink() => "a symbolic link",
        _ if t.is_fifo() => "a FIFO",
        _ if t.is_socket() => "a socket",
        _ if t.is_block_device() || t.is_char_device() => "a device",
        _ => "not a regular file",
    }
}

/// Whether this process's effective user owns the file `meta` describes.
pub fn is_mine(meta: &Metadata) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    meta.uid() == unsafe { libc::geteuid() }
}

/// The whole of `path`, a regular file ([`open_regular`]); see [`read_open`].
pub fn read_file(path: &Path, how: WholeRead) -> Result<Vec<u8>, IoError> {
    let (file, meta) = open_regular(path)?;
    let len = usize::try_from(meta.len())
        .map_err(|_| IoError::Request(format!("{} is too large to read into memory", path.display())))?;
    read_open(&file, path, len, how)
}

/// The first `len` bytes of `file` (opened as `path`; a file shorter than that is an error), read
/// from the file opened, never from what `path` names by now. Its 4 KiB-aligned part is read in
/// [`CHUNK`]s, [`DEPTH`] in flight, and copied out as each arrives; the tail past the last whole
/// 4 KiB is read buffered (O_DIRECT reads whole blocks only). The caller bounds `len`: nothing
/// is allocated before it is asked for.
pub fn read_open(file: &File, path: &Path, len: usize, how: WholeRead) -> Result<Vec<u8>, IoError> {
    let read_err = |offset: usize, len: usize, source| IoError::Read {
        path: path.to_path_buf(),
        offset: offset as u64,
        len,
        source,
    };
    let mut out = vec![0u8; len];
    // O_DIRECT through a reopening of this very file (/proc's link to the descriptor), so the
    // name is not looked up again; without /proc, buffered.
    let again = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file)));
    let aligned = match how {
        WholeRead::Direct if again.exists() => len / ALIGN * ALIGN,
        _ => 0,
    };
    if aligned > 0 {
        direct(&again, &mut out[..aligned]).map_err(|e| match e {
            IoError::Open { source, .. } => IoError::Open { path: path.to_path_buf(), source },
            IoError::Read { offset, len, source, .. } => {
                IoError::Read { path: path.to_path_buf(), offset, len, source }
            }
            IoError::Eof { offset, got, len, .. } => IoError::Eof { path: path.to_path_buf(), offset, got, len },
            e => e,
        })?;
    }
    file.read_exact_at(&mut out[aligned..], aligned as u64).map_err(|e| read_err(aligned, len - aligned, e))?;
    Ok(out)
}

/// Fills `out` (a multiple of 4 KiB long) from the start of `path` with O_DIRECT reads.
fn direct(path: &Path, out: &mut [u8]) -> Result<(), IoError> {
    let total = out.len();
    let chunks = total.div_ceil(CHUNK);
    let depth = DEPTH.min(chunks);
    let mut opts = ReaderOptions::new(CHUNK.min(total), depth);
    opts.queue_depth = depth;
    opts.verify = false;
    let mut reader = Reader::new(opts)?;
    let file = reader.open(path)?;
    let slot_bytes = reader.arena().slot_bytes();
    let request = |chunk: usize, slot: usize| {
        let offset = chunk * slot_bytes;
        ReadRequest {
            file,
            offset: offset as u64,
            len: slot_bytes.min(total - offset),
            slot,
            xxh3: None,
            priority: Priority::Demand,
            tag: chunk as u64,
        }
    };
    let mut next = 0;
    while next < depth {
        reader.submit(request(next, next))?;
        touch(out, next * slot_bytes, slot_bytes);
        next += 1;
    }
    for _ in 0..chunks {
        let Some(c) = reader.next_completion() else { return Err(IoError::Closed) };
        c.result?;
        let offset = c.tag as usize * slot_bytes;
        let data = reader.data(c.slot, c.len).ok_or(IoError::Closed)?;
        out[offset..offset + c.len].copy_from_slice(data);
        if next < chunks {
            reader.submit(request(next, c.slot))?;
            touch(out, next * slot_bytes, slot_bytes);
            next += 1;
        }
    }
    Ok(())
}

/// Faults in the pages of `out[at..at + len]` while their read is in flight, so the copy that
/// follows does not take a page fault every 4 KiB (a fresh allocation's pages are mapped on
/// first write: ~10% of a large read's time, measured).
fn touch(out: &mut [u8], at: usize, len: usize) {
    let end = (at + len).min(out.len());
    for i in (at..end).step_by(ALIGN) {
        out[i] = 0;
    }
}
