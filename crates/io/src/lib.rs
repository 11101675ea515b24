//! # k3-io: reading expert records as fast as the drive allows
//!
//! - [`Arena`]: one page-aligned allocation cut into equal slots. It is the only memory the
//!   kernel writes into (O_DIRECT, io_uring registered buffers), and the expert cache's memory:
//!   a record read into a slot is computed on in place.
//! - [`Reader`]: an I/O thread that reads records into slots with O_DIRECT through io_uring (or a
//!   pread thread pool where io_uring is unavailable or not wanted), many in flight, demand reads
//!   before prefetches, stale prefetches dropped, checksums verified on arrival, every fault
//!   reported for its record with file and offset.
//!
//! - [`whole::read_file`]: a whole file through the reader, O_DIRECT chunks in flight (kept
//!   prompt states).
//!
//! Slot ownership is the safety protocol: a slot submitted for reading belongs to the I/O thread
//! until its completion is delivered; only then can its bytes be borrowed.

mod arena;
mod backend;
pub mod cache;
pub mod reader;
pub mod whole;

pub use arena::{Arena, Lease};
pub use cache::{CacheStats, ExpertCache, Key, Location, Policy, Status};
pub use reader::{BackendChoice, Completion, FileId, Priority, ReadRequest, Reader, ReaderOptions};

use std::path::PathBuf;

/// What went wrong with a read, naming the file and the byte offset.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: read of {len} bytes at offset {offset} failed: {source}")]
    Read {
        path: PathBuf,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the file ends inside the record at offset {offset} ({got} of {len} bytes read); it is truncated")]
    Eof { path: PathBuf, offset: u64, got: usize, len: usize },
    #[error("{path}: record at offset {offset} ({len} bytes) has checksum {computed:#018x}, expected {stored:#018x}")]
    Checksum { path: PathBuf, offset: u64, len: usize, stored: u64, computed: u64 },
    #[error("prefetch dropped: its layer has passed")]
    Stale,
    #[error("bad request: {0}")]
    Request(String),
    #[error("could not set up reading: {0}")]
    Setup(String),
    #[error("the I/O thread has stopped")]
    Closed,
}
