//! `--image FILE` and `/image FILE`: image files read and turned into prompt rows by the engine,
//! each error naming the file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_engine::Engine;
use k3_engine::media::{DecodeLimits, PromptImage};
use k3_engine::tokenizer::Tokenizer;

/// Reads and embeds one image file, for a model whose tokenizer can frame it.
pub fn read(engine: &Engine<'_>, tok: &Tokenizer, path: &Path) -> Result<PromptImage> {
    engine.check_sees()?;
    k3_engine::media::check_tokenizer(tok)?;
    let limits = DecodeLimits::default();
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        meta.len() <= limits.max_bytes as u64,
        "{}: {} bytes is larger than the limit ({limits})",
        path.display(),
        meta.len()
    );
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    engine.prompt_image(&bytes, &limits).with_context(|| path.display().to_string())
}

/// Every file of `paths`, in order.
pub fn read_all(engine: &Engine<'_>, tok: &Tokenizer, paths: &[PathBuf]) -> Result<Vec<PromptImage>> {
    paths.iter().map(|p| read(engine, tok, p)).collect()
}
