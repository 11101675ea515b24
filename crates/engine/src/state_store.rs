//! Kept states on disk: a directory of [state files](Engine::state_file), an LRU over a byte
//! budget, found again after a restart — the prefix cache's second tier (the server's
//! `--prompt-cache-dir`, the CLI's `--prompt-cache`).
//!
//! - A file is named by its scope (whose requests may resume it) and a hash of its tokens, so
//!   the same state kept again replaces its file. It is written on a thread of its own, through
//!   a temporary renamed over the name ([`crate::write_atomic`]): a reader sees a whole file or
//!   none, and the caller's step does not wait on the drive.
//! - At open, each file's head (format version, model fingerprint, token ids) is read into the
//!   index; another model's or another version's files are left alone and not counted.
//! - A restore reads the whole file with O_DIRECT ([`k3_io::whole`]) and checks all of it
//!   ([`Engine::read_state_file`]) and that its tokens are the index's. A file that fails is
//!   dropped from the index with a warning (removed if it is this model's and damaged) and the
//!   caller recomputes: a bad file costs time, never an answer.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use k3_io::whole::{WholeRead, read_file};
use xxhash_rust::xxh3::xxh3_64;

use crate::{Engine, SavedState, Session, StateFileError, read_state_header};

const EXT: &str = "k3state";

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("prompt cache directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("prompt cache directory {0}: is not a directory")]
    NotDir(PathBuf),
    #[error("prompt cache: cannot start its writer thread: {0}")]
    Thread(std::io::Error),
}

/// What the store has done since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreStats {
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
    scope: u64,
    ids: Vec<u32>,
    logits: bool,
    bytes: u64,
    /// Nanoseconds since the epoch of its last use (its file's mtime after a restart).
    last_use: u128,
}

/// A write the writer thread has finished.
struct Written {
    path: PathBuf,
    scope: u64,
    ids: Vec<u32>,
    logits: bool,
    result: Result<u64, String>,
}

type Work = (PathBuf, Vec<u8>, u64, Vec<u32>, bool);

/// The directory's index and its writer.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    budget: u64,
    fingerprint: u64,
    entries: Vec<Entry>,
    /// Files queued for writing, not yet in the index.
    queued: Vec<PathBuf>,
    writer: Option<(SyncSender<Work>, JoinHandle<()>)>,
    written: Receiver<Written>,
    stats: StoreStats,
    warnings: Vec<String>,
}

fn now_nanos() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

impl StateStore {
    /// Opens (creating, private to this user) `dir` for `engine`'s states within `budget` bytes,
    /// indexing the files already there; the oldest beyond the budget are removed.
    pub fn open(dir: &Path, budget: u64, engine: &Engine<'_>) -> Result<StateStore, StoreError> {
        let dir_err = |source| StoreError::Dir { path: dir.to_path_buf(), source };
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(dir_err)?;
        }
        if !dir.is_dir() {
            return Err(StoreError::NotDir(dir.to_path_buf()));
        }
        let (work_tx, work_rx) = sync_channel::<Work>(1);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("k3-state-writer".into())
            .spawn(move || {
                for (path, bytes, scope, ids, logits) in work_rx {
                    let result = crate::write_atomic(&path, &bytes).map(|()| bytes.len() as u64);
                    let result = result.map_err(|e| e.to_string());
                    if done_tx.send(Written { path, scope, ids, logits, result }).is_err() {
                        break;
                    }
                }
            })
            .map_err(StoreError::Thread)?;
        let mut store = StateStore {
            dir: dir.to_path_buf(),
            budget,
            fingerprint: engine.fingerprint(),
            entries: Vec::new(),
            queued: Vec::new(),
            writer: Some((work_tx, thread)),
            written: done_rx,
            stats: StoreStats::default(),
            warnings: Vec::new(),
        };
        store.scan().map_err(dir_err)?;
        store.evict();
        Ok(store)
    }

    fn scan(&mut self) -> std::io::Result<()> {
        let mut foreign = 0;
        for item in std::fs::read_dir(&self.dir)? {
            let path = item?.path();
            let Some(scope) = parse_name(&path) else {
                remove_stale_temporary(&path);
                continue;
            };
            match head(&path) {
                Ok(h) if h.fingerprint == self.fingerprint => {
                    let meta = std::fs::metadata(&path)?;
                    let last_use = meta.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
                    self.entries.push(Entry {
                        path,
                        scope,
                        ids: h.ids,
                        logits: h.logits,
                        bytes: meta.len(),
                        last_use: last_use.map_or(0, |d| d.as_nanos()),
                    });
                }
                Ok(_) | Err(StateFileError::Version { .. }) => foreign += 1,
                Err(e) => {
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
    pub fn stats(&self) -> StoreStats {
        StoreStats { entries: self.entries.len(), bytes: self.entries.iter().map(|e| e.bytes).sum(), ..self.stats }
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
                    let (path, scope, ids, logits) = (w.path, w.scope, w.ids, w.logits);
                    self.entries.push(Entry { path, scope, ids, logits, bytes, last_use: now_nanos() });
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

    fn evict(&mut self) {
        let mut used: u64 = self.entries.iter().map(|e| e.bytes).sum();
        while used > self.budget {
            let Some(i) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_use).map(|(i, _)| i) else {
                break;
            };
            let e = self.entries.swap_remove(i);
            used -= e.bytes;
            let _ = std::fs::remove_file(&e.path);
        }
    }

    /// Tokens of the longest state in `scope` that `prompt` can resume from (its tokens begin
    /// the prompt and leave one to run, or are all of it with their logits); 0 for none.
    pub fn best(&self, scope: u64, prompt: &[u32]) -> usize {
        self.find(scope, prompt).map_or(0, |i| self.entries[i].ids.len())
    }

    fn find(&self, scope: u64, prompt: &[u32]) -> Option<usize> {
        let usable = |e: &Entry| {
            let n = e.ids.len();
            e.scope == scope && (n < prompt.len() || (n == prompt.len() && e.logits)) && prompt.starts_with(&e.ids)
        };
        (0..self.entries.len()).filter(|&i| usable(&self.entries[i])).max_by_key(|&i| self.entries[i].ids.len())
    }

    /// The longest state `prompt` can resume from, read and checked; `None` when there is none
    /// or the file fails its checks (then it is dropped, with a warning).
    pub fn restore(&mut self, engine: &Engine<'_>, scope: u64, prompt: &[u32]) -> Option<SavedState> {
        self.poll();
        let i = self.find(scope, prompt)?;
        let t0 = Instant::now();
        let read = read_file(&self.entries[i].path, WholeRead::Direct);
        let checked = read.map_err(|e| e.to_string()).and_then(|bytes| {
            let n = bytes.len() as u64;
            let saved = engine.read_state_file(&bytes).map_err(|e| (e.to_string(), damaged(&e)));
            match saved {
                Ok(s) if s.session.ids() == self.entries[i].ids => Ok((s, n)),
                Ok(_) => Err("its tokens are not the ones its head gave at startup".into()),
                Err((why, bad)) => {
                    if bad {
                        let _ = std::fs::remove_file(&self.entries[i].path);
                    }
                    Err(why)
                }
            }
        });
        match checked {
            Ok((saved, n)) => {
                self.stats.read_seconds += t0.elapsed().as_secs_f64();
                self.stats.hits += 1;
                self.stats.tokens_restored += saved.session.tokens() as u64;
                self.stats.bytes_read += n;
                let e = &mut self.entries[i];
                e.last_use = now_nanos();
                // Best effort: the order survives a restart.
                let _ =
                    std::fs::File::options().write(true).open(&e.path).and_then(|f| f.set_modified(SystemTime::now()));
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

    /// Whether `ids` are kept in `scope` (with logits, if `logits`), or queued to be.
    pub fn holds(&self, scope: u64, ids: &[u32], logits: bool) -> bool {
        let path = self.path(scope, ids);
        self.queued.contains(&path) || self.entries.iter().any(|e| e.path == path && (e.logits || !logits))
    }

    fn path(&self, scope: u64, ids: &[u32]) -> PathBuf {
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        self.dir.join(format!("{scope:016x}-{:016x}.{EXT}", xxh3_64(&bytes)))
    }

    /// Keeps `session`'s state (with `logits` after its last token, if given) in `scope`: queued
    /// for the writer unless it is kept already, the writer is busy, or it exceeds the budget.
    pub fn save(&mut self, engine: &Engine<'_>, scope: u64, session: &Session, logits: Option<&[f32]>) {
        self.poll();
        if session.tokens() == 0 || self.holds(scope, session.ids(), logits.is_some()) {
            return;
        }
        if session.state_bytes() as u64 > self.budget {
            self.stats.skipped += 1;
            return;
        }
        // One state being written and one waiting at most (the channel's bound): past that the
        // state is not even serialized, so a busy drive costs the caller nothing.
        if self.queued.len() >= 2 {
            self.stats.skipped += 1;
            return;
        }
        let path = self.path(scope, session.ids());
        let bytes = engine.state_file(session, logits);
        let Some((tx, _)) = &self.writer else { return };
        match tx.try_send((path.clone(), bytes, scope, session.ids().to_vec(), logits.is_some())) {
            Ok(()) => self.queued.push(path),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.stats.skipped += 1,
        }
    }
}

impl Drop for StateStore {
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

/// The scope a store file's name gives (`{scope:016x}-{hash:016x}.k3state`).
fn parse_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?.strip_suffix(&format!(".{EXT}"))?;
    let (scope, hash) = name.split_once('-')?;
    let hex = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(scope) && hex(hash)).then(|| u64::from_str_radix(scope, 16).ok()).flatten()
}

/// A write's temporary left by a process that was killed (over an hour old).
fn remove_stale_temporary(path: &Path) {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with('.') && name.contains(&format!(".{EXT}.")) && name.ends_with(".k3tmp") {
        let old = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|a| a > Duration::from_secs(3600)));
        if old {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn head(path: &Path) -> Result<crate::StateHeader, StateFileError> {
    let mut f = std::fs::File::open(path).map_err(|e| StateFileError::Invalid(e.to_string()))?;
    read_state_header(|n| {
        let mut buf = Vec::with_capacity(n);
        (&mut f).take(n as u64).read_to_end(&mut buf)?;
        Ok(buf)
    })
}
