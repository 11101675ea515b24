//! Kept states on disk: a directory of [state files](Engine::state_file), an LRU over a byte
//! budget, found again after a restart — the prompt cache's second tier (the server's
//! `--prompt-cache-dir`, the CLI's `--prompt-cache`).
//!
//! - The directory is private (0700, made so if it was open to others; another user's is
//!   refused) and its files 0600: they hold conversations' token ids.
//! - A file is named by keyed hashes of its scope (whose requests may resume it) and of its tokens
//!   ([`owner`]: no name tells anything of an API key or a conversation without the directory's
//!   key), so the same state kept again replaces its file. It is written on a thread of its own,
//!   through a temporary synced and renamed over the name: a reader sees a whole file or none,
//!   and the caller's step does not wait on the drive. [`settle`](DiskTier::settle) waits for
//!   the writes queued (a stop calls it), and dropping the store finishes them.
//! - Only regular files of this user's are read, replaced or removed ([`files`]): a symbolic link,
//!   FIFO, socket, device or directory under a state's name is skipped with a warning and left as
//!   it is, never followed, opened to block, or deleted. A temporary left by a process that is
//!   gone is removed at open.
//! - At open, each file's head (format version, model fingerprint, token ids) is read into the
//!   index once its length is the one the head implies ([`k3_engine::StateFileLayout`]): a file with a
//!   tail (sparse or not) is refused without reading it. Another model's or another version's
//!   files are left alone and not counted.
//! - A restore reads the whole file with O_DIRECT ([`k3_io::whole`]) from the descriptor it
//!   checked (still the length indexed), checks all of it ([`Engine::read_state_file`]) and that
//!   its tokens are the index's. A file that fails is dropped from the index with a warning
//!   (removed if it is this model's and damaged) and the caller recomputes: a bad file costs
//!   time, never an answer.

mod files;
pub mod owner;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use k3_io::whole::{WholeRead, kind, read_open};

use self::files::Unread;
use self::owner::NameKey;
use self::writer::{QUEUE, Work, Written};
use k3_engine::{Engine, SavedState, Session, StateFileError, StateFileLayout};

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DiskTierError {
    #[error("prompt cache directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("prompt cache directory {0}: is not a directory")]
    NotDir(PathBuf),
    #[error("prompt cache directory {path}: owned by user {uid}, not this one; give a directory of your own")]
    NotMine { path: PathBuf, uid: u32 },
    #[error("prompt cache directory {0}: is shared with other users (sticky, as /tmp is); give a directory of its own")]
    Shared(PathBuf),
    #[error("prompt cache directory: its naming key: {0}")]
    Key(String),
    #[error("prompt cache: cannot start its writer thread: {0}")]
    Thread(std::io::Error),
}

/// What the store has done since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DiskStats {
    /// States this model's files hold now, and their bytes.
    pub entries: usize,
    pub bytes: u64,
    pub hits: u64,
    pub tokens_restored: u64,
    pub bytes_read: u64,
    /// Seconds spent reading and checking restored files.
    pub read_seconds: f64,
    pub writes: u64,
    pub bytes_written: u64,
    /// Files found bad (at open or at a restore) and ignored.
    pub refused: u64,
    /// States not written: the writer was still busy with the one before, or the state is
    /// larger than the whole budget, or the write failed.
    pub skipped: u64,
}

#[derive(Debug)]
struct Entry {
    path: PathBuf,
    /// The keyed hash of its scope ([`NameKey::owner`]).
    owner: u64,
    ids: Vec<u32>,
    logits: bool,
    bytes: u64,
    /// Nanoseconds since the epoch of its last use (its file's mtime after a restart).
    last_use: u128,
}

/// The directory's index and its writer.
#[derive(Debug)]
pub struct DiskTier {
    dir: PathBuf,
    budget: u64,
    fingerprint: u64,
    layout: StateFileLayout,
    key: NameKey,
    entries: Vec<Entry>,
    /// Files queued for writing, not yet in the index.
    queued: Vec<PathBuf>,
    writer: Option<(SyncSender<Work>, JoinHandle<()>)>,
    written: Receiver<Written>,
    stats: DiskStats,
    warnings: Vec<String>,
}

fn now_nanos() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

impl DiskTier {
    /// Opens (creating, private to this user) `dir` for `engine`'s states within `budget` bytes,
    /// indexing the files already there; the oldest beyond the budget are removed.
    pub fn open(dir: &Path, budget: u64, engine: &Engine<'_>) -> Result<DiskTier, DiskTierError> {
        let made_private = files::make_private(dir)?;
        let key = NameKey::of_dir(dir).map_err(DiskTierError::Key)?;
        let (work_tx, thread, done_rx) = writer::spawn().map_err(DiskTierError::Thread)?;
        let mut store = DiskTier {
            dir: dir.to_path_buf(),
            budget,
            fingerprint: engine.fingerprint(),
            layout: engine.state_file_layout(),
            key,
            entries: Vec::new(),
            queued: Vec::new(),
            writer: Some((work_tx, thread)),
            written: done_rx,
            stats: DiskStats::default(),
            warnings: made_private.into_iter().collect(),
        };
        store.scan().map_err(|source| DiskTierError::Dir { path: dir.to_path_buf(), source })?;
        store.evict();
        Ok(store)
    }

    fn scan(&mut self) -> std::io::Result<()> {
        let mut foreign = 0;
        for item in std::fs::read_dir(&self.dir)? {
            let item = item?;
            let path = item.path();
            // Not followed: the entry itself.
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            let Some(owner) = files::parse_name(&path) else {
                files::remove_dead_temporary(&path, &meta);
                continue;
            };
            if !meta.is_file() {
                self.warnings.push(format!("{}: is {}, not a state file; left as it is", path.display(), kind(&meta)));
                continue;
            }
            match files::index_file(&path, self.fingerprint, &self.layout, self.budget) {
                Ok((h, bytes)) => {
                    let last_use = meta.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
                    let last_use = last_use.map_or(0, |d| d.as_nanos());
                    self.entries.push(Entry { path, owner, ids: h.ids, logits: h.logits, bytes, last_use });
                }
                Err(Unread::Foreign) => foreign += 1,
                Err(Unread::NotOurs(why) | Unread::TooLarge(why)) => {
                    self.stats.refused += 1;
                    self.warnings.push(format!("{why}; left as it is"));
                }
                Err(Unread::Damaged(e)) => {
                    self.stats.refused += 1;
                    self.warnings.push(format!("{}: {e}; removed", path.display()));
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        if foreign > 0 {
            self.warnings.push(format!(
                "{}: {foreign} state files of another model or format version are left as they are",
                self.dir.display()
            ));
        }
        Ok(())
    }

    /// What the store has done; [`poll`](Self::poll) first for the latest.
    pub fn stats(&self) -> DiskStats {
        DiskStats { entries: self.entries.len(), bytes: self.entries.iter().map(|e| e.bytes).sum(), ..self.stats }
    }

    /// Warnings for people (files ignored, writes failed) since the last call.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes in the writes the writer has finished (and evicts beyond the budget).
    pub fn poll(&mut self) {
        let mut any = false;
        while let Ok(w) = self.written.try_recv() {
            self.queued.retain(|p| *p != w.path);
            match w.result {
                Ok(bytes) => {
                    self.entries.retain(|e| e.path != w.path);
                    self.stats.writes += 1;
                    self.stats.bytes_written += bytes;
                    let (path, owner, ids, logits) = (w.path, w.owner, w.ids, w.logits);
                    self.entries.push(Entry { path, owner, ids, logits, bytes, last_use: now_nanos() });
                    any = true;
                }
                Err(e) => {
                    self.stats.skipped += 1;
                    self.warnings.push(format!("a prompt state was not written: {e}"));
                }
            }
        }
        if any {
            self.evict();
        }
    }

    /// Waits for the writes queued so far (at most `timeout`), then [`poll`](Self::poll)s.
    pub fn settle(&mut self, timeout: Duration) {
        let until = Instant::now() + timeout;
        while !self.queued.is_empty() && Instant::now() < until {
            self.poll();
            std::thread::sleep(Duration::from_millis(2));
        }
        self.poll();
    }

    /// States queued and not yet written.
    pub fn pending(&self) -> usize {
        self.queued.len()
    }

    fn evict(&mut self) {
        let mut used: u64 = self.entries.iter().map(|e| e.bytes).sum();
        while used > self.budget {
            let Some(i) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_use).map(|(i, _)| i) else {
                break;
            };
            let e = self.entries.swap_remove(i);
            used -= e.bytes;
            // Only what is still a regular file (a name swapped for anything else is left).
            if std::fs::symlink_metadata(&e.path).is_ok_and(|m| m.is_file()) {
                let _ = std::fs::remove_file(&e.path);
            }
        }
    }

    /// Tokens of the longest state in `scope` that `prompt` can resume from (its tokens begin
    /// the prompt and leave one to run, or are all of it with their logits); 0 for none.
    pub fn best(&self, scope: u64, prompt: &[u32]) -> usize {
        self.find(scope, prompt).map_or(0, |i| self.entries[i].ids.len())
    }

    fn find(&self, scope: u64, prompt: &[u32]) -> Option<usize> {
        let owner = self.key.owner(scope);
        let usable = |e: &Entry| {
            let n = e.ids.len();
            e.owner == owner && (n < prompt.len() || (n == prompt.len() && e.logits)) && prompt.starts_with(&e.ids)
        };
        (0..self.entries.len()).filter(|&i| usable(&self.entries[i])).max_by_key(|&i| self.entries[i].ids.len())
    }

    /// The longest state `prompt` can resume from, read and checked; `None` when there is none
    /// or the file fails its checks (then it is dropped, with a warning).
    pub fn restore(&mut self, engine: &Engine<'_>, scope: u64, prompt: &[u32]) -> Option<SavedState> {
        self.poll();
        let i = self.find(scope, prompt)?;
        let t0 = Instant::now();
        match self.read_entry(engine, i) {
            Ok((saved, file)) => {
                self.stats.read_seconds += t0.elapsed().as_secs_f64();
                self.stats.hits += 1;
                self.stats.tokens_restored += saved.session.tokens() as u64;
                let e = &mut self.entries[i];
                self.stats.bytes_read += e.bytes;
                e.last_use = now_nanos();
                // Best effort, on the file read (never what the name gives by now): the order
                // survives a restart.
                let _ = file.set_modified(SystemTime::now());
                Some(saved)
            }
            Err(why) => {
                let e = self.entries.swap_remove(i);
                self.stats.refused += 1;
                self.warnings.push(format!("{}: {why}; ignored, the prompt is computed", e.path.display()));
                None
            }
        }
    }

    /// Entry `i`'s state and its open file: opened only if it is still a regular file of this
    /// user's of the length indexed, then read whole and checked.
    fn read_entry(&self, engine: &Engine<'_>, i: usize) -> Result<(SavedState, std::fs::File), String> {
        let e = &self.entries[i];
        let (file, meta) = files::open_own(&e.path)?;
        if meta.len() != e.bytes {
            return Err(format!("{} bytes, {} when it was indexed: changed since", meta.len(), e.bytes));
        }
        let len = usize::try_from(e.bytes).map_err(|_| "too large to read".to_string())?;
        let bytes = read_open(&file, &e.path, len, WholeRead::Direct).map_err(|e| e.to_string())?;
        match engine.read_state_file(&bytes) {
            Ok(s) if s.session.ids() == e.ids => Ok((s, file)),
            Ok(_) => Err("its tokens are not the ones its head gave at startup".into()),
            Err(err) => {
                if damaged(&err) {
                    let _ = std::fs::remove_file(&e.path);
                }
                Err(err.to_string())
            }
        }
    }

    /// Whether `ids` are kept in `scope` (with logits, if `logits`), or queued to be.
    pub fn holds(&self, scope: u64, ids: &[u32], logits: bool) -> bool {
        let path = self.path(scope, ids);
        self.queued.contains(&path) || self.entries.iter().any(|e| e.path == path && (e.logits || !logits))
    }

    fn path(&self, scope: u64, ids: &[u32]) -> PathBuf {
        self.dir.join(files::name(self.key.owner(scope), self.key.tokens(ids)))
    }

    /// Keeps `session`'s state (with `logits` after its last token, if given) in `scope`: queued
    /// for the writer unless it is kept already, the writer is busy, or it exceeds the budget.
    /// Whether it is kept or queued now.
    pub fn save(&mut self, engine: &Engine<'_>, scope: u64, session: &Session, logits: Option<&[f32]>) -> bool {
        self.save_until(engine, scope, session, logits, None)
    }

    /// As [`save`](Self::save), waiting (until `until`, when given) for the writer to have room
    /// rather than skipping: a stop writing what RAM holds.
    pub fn save_until(
        &mut self,
        engine: &Engine<'_>,
        scope: u64,
        session: &Session,
        logits: Option<&[f32]>,
        until: Option<Instant>,
    ) -> bool {
        self.poll();
        if session.tokens() == 0 {
            return false;
        }
        if self.holds(scope, session.ids(), logits.is_some()) {
            return true;
        }
        if session.state_bytes() as u64 > self.budget {
            self.stats.skipped += 1;
            return false;
        }
        // One state being written and one waiting at most (the channel's bound): past that the
        // state is not even serialized, so a busy drive costs the caller nothing.
        while self.queued.len() >= QUEUE && until.is_some_and(|t| Instant::now() < t) {
            std::thread::sleep(Duration::from_millis(2));
            self.poll();
        }
        if self.queued.len() >= QUEUE {
            self.stats.skipped += 1;
            return false;
        }
        let path = self.path(scope, session.ids());
        let bytes = engine.state_file(session, logits);
        let Some((tx, _)) = &self.writer else { return false };
        let work = Work {
            path: path.clone(),
            bytes,
            owner: self.key.owner(scope),
            ids: session.ids().to_vec(),
            logits: logits.is_some(),
        };
        match tx.try_send(work) {
            Ok(()) => {
                self.queued.push(path);
                true
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.skipped += 1;
                false
            }
        }
    }
}

impl Drop for DiskTier {
    /// Finishes the writes queued: a state kept before a stop is there after it.
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.writer.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

/// Whether a refused file is this model's own and damaged (removed), rather than another's.
fn damaged(e: &StateFileError) -> bool {
    !matches!(e, StateFileError::Model { .. } | StateFileError::Version { .. })
}
