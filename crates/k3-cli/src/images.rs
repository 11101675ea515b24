//! `--image FILE` and `/image FILE`: image files read (never blocking: a FIFO or a device is
//! refused, as is a file past the decoder's byte limit) and turned into prompt rows by the engine,
//! each error naming the file. Chat keeps each file's bytes, which `/save` writes as a data URL.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_engine::Engine;
use k3_generate::media::{DecodeLimits, PromptImage};
use k3_text::tokenizer::Tokenizer;

/// An image as read: its file's bytes and its prompt rows.
pub struct Image {
    pub bytes: Vec<u8>,
    pub prompt: PromptImage,
}

/// Reads and embeds one image file, for a model whose tokenizer can frame it.
pub fn read(engine: &Engine<'_>, tok: &Tokenizer, path: &Path) -> Result<Image> {
    engine.check_sees()?;
    Ok(read_files(engine, tok, &[path])?.remove(0))
}

/// Every file of `paths`, in order, the model's eyes checked once before any is read.
pub fn read_all(engine: &Engine<'_>, tok: &Tokenizer, paths: &[PathBuf]) -> Result<Vec<Image>> {
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    engine.check_sees()?;
    read_files(engine, tok, paths)
}

/// Every file of `paths`, in order, for a model the caller found sees ([`Engine::check_sees`]):
/// the tokenizer's framing checked once, then each file read and embedded.
pub fn read_files(engine: &Engine<'_>, tok: &Tokenizer, paths: &[impl AsRef<Path>]) -> Result<Vec<Image>> {
    k3_generate::media::check_tokenizer(tok)?;
    let limits = DecodeLimits::default();
    paths
        .iter()
        .map(|path| {
            let path = path.as_ref();
            let bytes = k3_format::read_input(path, "an image file is", limits.max_bytes as u64)?;
            let prompt = embed(engine, &bytes, &limits).with_context(|| path.display().to_string())?;
            Ok(Image { bytes, prompt })
        })
        .collect()
}

/// Embeds an image's bytes (from a file or a saved conversation) within the decoder's limits,
/// for a model the caller found sees.
pub fn embed(engine: &Engine<'_>, bytes: &[u8], limits: &DecodeLimits) -> Result<PromptImage> {
    Ok(k3_generate::media::prompt_image(engine, bytes, limits)?)
}
