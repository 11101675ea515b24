//! `--prompt-cache DIR` for `generate` and `chat` (llama-cli's habit, a directory rather than one
//! file): the longest state kept in DIR that the prompt begins with is restored instead of
//! computed, and the state after the prompt is kept for the next run. The same files as
//! `serve --prompt-cache-dir` (the shared scope), so a server and the CLI resume each other's.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use k3_engine::{Engine, SavedState, Session};
use k3_generate::cache::disk::DiskTier;

#[derive(clap::Args, Debug, Clone)]
pub struct PromptCacheArgs {
    /// Keep prompt states in DIR and start from the longest one this prompt begins with: a long
    /// system prompt or document is computed once, then restored from disk. DIR is made private
    /// (0700, its files 0600; another user's is refused); only regular files k3 wrote are read
    /// or removed. Files of another model or version are left alone; a damaged one is removed
    /// and its prompt computed [default: off].
    #[arg(long, value_name = "DIR")]
    prompt_cache: Option<PathBuf>,
    /// The most bytes the files in --prompt-cache may take (the least recently used go first).
    #[arg(long, value_name = "SIZE", default_value = "10G", requires = "prompt_cache")]
    prompt_cache_size: String,
}

impl PromptCacheArgs {
    /// No `--prompt-cache` was given.
    pub fn is_off(&self) -> bool {
        self.prompt_cache.is_none()
    }
}

/// What a run restored: tokens, bytes, seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Restored {
    pub tokens: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// An open prompt cache.
pub struct PromptCache {
    store: DiskTier,
}

impl PromptCacheArgs {
    pub fn open(&self, engine: &Engine<'_>) -> Result<Option<PromptCache>> {
        let Some(dir) = &self.prompt_cache else { return Ok(None) };
        let size = k3_engine::budget::parse_size(&self.prompt_cache_size)
            .map_err(anyhow::Error::msg)
            .context("--prompt-cache-size")?;
        let mut store = DiskTier::open(dir, size, engine)?;
        warn(&mut store);
        Ok(Some(PromptCache { store }))
    }
}

fn warn(store: &mut DiskTier) {
    for w in store.take_warnings() {
        eprintln!("prompt cache: {w}");
    }
}

impl PromptCache {
    /// The longest kept state `prompt` begins with, in a fresh session, and the logits after it
    /// when it holds the whole prompt; what was read.
    pub fn restore(&mut self, engine: &Engine<'_>, prompt: &[u32]) -> (Option<SavedState>, Restored) {
        let before = self.store.stats();
        let saved = self.store.restore(engine, 0, prompt);
        warn(&mut self.store);
        let after = self.store.stats();
        let r = Restored {
            tokens: saved.as_ref().map_or(0, |s| s.session.tokens()),
            bytes: after.bytes_read - before.bytes_read,
            seconds: after.read_seconds - before.read_seconds,
        };
        (saved, r)
    }

    /// Keeps `session`'s state (with the logits after its last token) for later runs.
    pub fn keep(&mut self, engine: &Engine<'_>, session: &Session, logits: Option<&[f32]>) {
        self.store.save(engine, 0, session, logits);
        warn(&mut self.store);
    }

    /// Waits (at most 30 s) until every state kept so far is on disk: `chat` calls it before it
    /// waits for the next line, where a signal ends the process at once.
    pub fn settle(&mut self) {
        self.store.settle(Duration::from_secs(30));
        warn(&mut self.store);
    }

    /// The `--stats` line for a prompt of `prompt` tokens.
    pub fn describe(&self, r: Restored, prompt: usize) -> String {
        let dir = self.store.dir().display();
        if r.tokens == 0 {
            return format!("prompt cache: nothing kept in {dir} begins this prompt ({prompt} tokens computed)");
        }
        format!(
            "prompt cache: {} of {prompt} prompt tokens restored from {dir} ({:.1} MB in {:.1} ms, {:.2} GB/s)",
            r.tokens,
            r.bytes as f64 / 1e6,
            r.seconds * 1e3,
            r.bytes as f64 / r.seconds.max(1e-9) / 1e9
        )
    }
}

/// The session a prompt starts from: the longest kept state it begins with (and the logits
/// after it when it holds the whole prompt), or a fresh one; what was restored.
pub fn start(
    cache: Option<&mut PromptCache>,
    engine: &Engine<'_>,
    prompt: &[u32],
) -> (Session, Option<Vec<f32>>, Restored) {
    match cache.map(|c| c.restore(engine, prompt)) {
        Some((Some(saved), r)) => (saved.session, saved.logits, r),
        Some((None, r)) => (engine.session(), None, r),
        None => (engine.session(), None, Restored::default()),
    }
}

impl Drop for PromptCache {
    /// The states kept are on disk before the command ends.
    fn drop(&mut self) {
        self.store.settle(Duration::from_secs(120));
        warn(&mut self.store);
    }
}
