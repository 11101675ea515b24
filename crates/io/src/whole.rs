//! Whole files read through the expert [`Reader`]: O_DIRECT chunks, many in flight, so a large
//! file (a kept prompt state of hundreds of megabytes) comes off the drive at its ceiling rather
//! than at the page cache's readahead, and does not push the expert records out of the page
//! cache on its way.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
    /// One buffered `read` of the file.
    Buffered,
}

/// The whole of `path`. Its 4 KiB-aligned part is read in [`CHUNK`]s, [`DEPTH`] in flight, and
/// copied out as each arrives; the tail past the last whole 4 KiB is read buffered (O_DIRECT
/// reads whole blocks only).
pub fn read_file(path: &Path, how: WholeRead) -> Result<Vec<u8>, IoError> {
    let open_err = |source| IoError::Open { path: path.to_path_buf(), source };
    if how == WholeRead::Buffered {
        let mut out = Vec::new();
        std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut out)).map_err(open_err)?;
        return Ok(out);
    }
    let file = std::fs::File::open(path).map_err(open_err)?;
    let len = usize::try_from(file.metadata().map_err(open_err)?.len())
        .map_err(|_| IoError::Request(format!("{} is too large to read into memory", path.display())))?;
    let aligned = len / ALIGN * ALIGN;
    let mut out = vec![0u8; len];
    if aligned > 0 {
        direct(path, &mut out[..aligned])?;
    }
    file.read_exact_at(&mut out[aligned..], aligned as u64).map_err(|source| IoError::Read {
        path: path.to_path_buf(),
        offset: aligned as u64,
        len: len - aligned,
        source,
    })?;
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
