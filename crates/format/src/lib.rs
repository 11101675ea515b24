//! # k3-format: the WASTE on-disk model layout
//!
//! A model is a directory holding a header (`header.waste`: manifest, expert index, embedded
//! config and tokenizer), a trunk file (`trunk.waste`: every non-expert tensor, mapped zero-copy)
//! and expert shards (`experts-NNNNN.waste`), which may live in other directories (one per drive).
//! Every routed expert is one record: one aligned, contiguous read. `docs/FORMAT.md` is the spec.
//!
//! This crate reads and writes bytes and checks them; it never computes with weights (that is
//! `k3-quant`) and never does asynchronous or O_DIRECT I/O (that is `k3-io`).

#[cfg(target_endian = "big")]
compile_error!("WASTE files are little-endian and k3 views them in place: big-endian targets are not supported");

mod encoding;
mod error;
mod header;
mod index;
mod input;
mod lock;
mod manifest;
mod output;
mod reader;
mod record;
mod spec_diff;
mod view;
mod writer;

pub use encoding::{CodebookSource, Dtype, Encoding, PartLayout};
pub use error::{FormatError, Place, Result};
pub use header::{Header, MAGIC, VERSION_MAJOR, VERSION_MINOR, seal};
pub use index::IndexEntry;
pub use input::{InputError, read_input};
pub use manifest::{
    Architecture, BlobInfo, ExpertLayout, Hex64, Manifest, PartEntry, ShardInfo, TensorEntry, TrunkTensor,
    check_alignment,
};
pub use output::{OutputFile, write_atomic};
pub use reader::{ExpertLocation, Model, OpenOptions, Problem, mtime_ns};
pub use record::parse_record;
pub use view::{Element, ExpertView, PartView, TensorView};
pub use writer::{ModelWriter, Opened, WriterSpec};

/// Bytes of the fixed header at the start of every expert record.
pub const RECORD_HEADER_LEN: u64 = 64;
/// Alignment of every part inside the trunk and inside a record (enough for any SIMD load).
pub const PART_ALIGN: u64 = 64;
/// Default alignment of expert records: the O_DIRECT unit. 2 MiB (huge pages) is also accepted.
pub const DEFAULT_ALIGNMENT: u64 = 4096;
/// Alignment of the reads of experts read in place from a checkpoint's files (the O_DIRECT unit).
pub const IN_PLACE_ALIGN: u64 = 4096;

pub const HEADER_FILE: &str = "header.waste";
pub const TRUNK_FILE: &str = "trunk.waste";
/// Present only while a conversion is in progress; lists what is written and verified.
pub const JOURNAL_FILE: &str = "waste.journal";

/// The file name of expert shard `i`.
pub fn shard_file_name(i: usize) -> String {
    format!("experts-{i:05}.waste")
}
