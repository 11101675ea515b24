//! Texts a command reads whole (a corpus to score or tokenize, a calibration text), bounded.

use std::path::Path;

use anyhow::{Context, Result};

/// The most a command reads whole as text: WikiText-103's whole training split is 540 MB (its
/// test split, what is usually scored, 1.3 MB).
pub const TEXT_LIMIT: u64 = 1 << 30;

/// The text file `path`, within [`TEXT_LIMIT`] (a FIFO or a device refused at once, see
/// `k3_format::read_input`); `what` says whose bound it is ("perplexity reads").
pub fn read_text(path: &Path, what: &str) -> Result<String> {
    let bytes = k3_format::read_input(path, what, TEXT_LIMIT)?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}
