//! Typed errors. Every variant names the file and, where there is one, the tensor, the expert record
//! `(layer, expert)` or the byte offset, so a user can tell what is wrong without a debugger.

use std::path::PathBuf;

/// Where in a model a problem sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The header file as a whole.
    Header,
    /// A trunk tensor, by name.
    Tensor(String),
    /// An expert record.
    Expert { layer: u32, expert: u32 },
    /// An embedded blob (config, tokenizer file), by name.
    Blob(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Header => write!(f, "header"),
            Place::Tensor(n) => write!(f, "tensor `{n}`"),
            Place::Expert { layer, expert } => write!(f, "expert record (layer {layer}, expert {expert})"),
            Place::Blob(n) => write!(f, "embedded file `{n}`"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a WASTE header (magic bytes {found:02x?}, expected {expected:02x?})")]
    BadMagic { path: PathBuf, found: Vec<u8>, expected: Vec<u8> },

    #[error(
        "{path}: WASTE format version {major}.{minor} is not supported (this k3 reads {supported}.x); \
         convert the model again or use a matching k3"
    )]
    UnsupportedVersion { path: PathBuf, major: u16, minor: u16, supported: u16 },

    #[error(
        "{path}: header checksum mismatch (stored {stored:#018x}, computed {computed:#018x}); the header is corrupted"
    )]
    HeaderChecksum { path: PathBuf, stored: u64, computed: u64 },

    #[error(
        "{path}: {place}: checksum mismatch at offset {offset} (+{len} bytes): stored {stored:#018x}, computed {computed:#018x}"
    )]
    Checksum { path: PathBuf, place: Place, offset: u64, len: u64, stored: u64, computed: u64 },

    #[error("{path}: file is {actual} bytes but the model needs {expected} bytes; it is truncated or was replaced")]
    FileSize { path: PathBuf, expected: u64, actual: u64 },

    #[error("{path}: {place}: bytes {offset}..{end} lie outside {what} of {limit} bytes")]
    OutOfBounds { path: PathBuf, place: Place, what: &'static str, offset: u64, end: u64, limit: u64 },

    #[error("{path}: {a} (bytes {a_start}..{a_end}) overlaps {b} (bytes {b_start}..{b_end})")]
    Overlap { path: PathBuf, a: Place, a_start: u64, a_end: u64, b: Place, b_start: u64, b_end: u64 },

    #[error("{path}: {place}: {reason}")]
    Invalid { path: PathBuf, place: Place, reason: String },

    #[error("{path}: manifest is not valid: {reason}")]
    Manifest { path: PathBuf, reason: String },

    #[error("no tensor named `{name}` in the trunk of {path}")]
    MissingTensor { path: PathBuf, name: String },

    #[error("no expert record (layer {layer}, expert {expert}) in {path}")]
    MissingExpert { path: PathBuf, layer: u32, expert: u32 },

    #[error("expert shard `{file}` not found; looked in: {searched}")]
    MissingShard { file: String, searched: String },

    #[error(
        "{path}: {reason} since the model was converted; its experts ({place} and others) are read from \
         it in place: restore the checkpoint as it was, or convert again"
    )]
    CheckpointChanged { path: PathBuf, place: Place, reason: String },

    #[error("{place}: part `{part}` is {dtype}, not {wanted}")]
    WrongDtype { place: Place, part: String, dtype: &'static str, wanted: &'static str },

    #[error("{place}: {reason}")]
    Shape { place: Place, reason: String },

    #[error("{dir}: {reason}")]
    Writer { dir: PathBuf, reason: String },

    #[error("cannot write {path}: {reason}")]
    Output { path: PathBuf, reason: String },
}

impl FormatError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io { path: path.into(), source }
    }
}

pub type Result<T, E = FormatError> = std::result::Result<T, E>;
