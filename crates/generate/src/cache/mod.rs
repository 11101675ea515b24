//! The prompt cache: states after prompts (and after finished answers) kept within a byte budget,
//! least recently used out first. A request whose prompt extends a kept state's tokens starts
//! from a fork of it and prefills only the rest — a conversation's next turn costs its new tokens,
//! not the whole history. A recurrent state can only be resumed where it was kept, so states are
//! kept where a later request meets them:
//! - the end of a prompt, with the logits of its last token: the same request again (a
//!   front-end's Regenerate) starts sampling at once, from the very logits a fresh prefill gives;
//! - the end of an answer: the conversation's next turn, which quotes the answer back;
//! - the resume points the scheduler stops a prefill at (the server's scheduler; `k3-cli chat`'s turns):
//!   after the system turn and tool declarations (a new conversation with the same ones), and
//!   after the message before the last (the last message edited and sent again).
//!
//! Entries belong to a [`Scope`] (the API key that made them): a request sees only its own
//! scope's, so `cached_tokens` cannot tell one client what another one asked. A kept state is a
//! compact copy ([`Engine::keep`]), counted by what it holds in memory ([`Session::held_bytes`]).
//!
//! With a disk tier ([`DiskTier`], `--prompt-cache-dir`), states kept at a resume point or at a
//! prompt's end are also written to disk as they are kept, and the others (answers' ends) when
//! RAM drops them; a lookup takes the longer of the two tiers' matches, and a state restored from
//! disk is kept in RAM again. Files outlive the server: a restarted one resumes from them.

pub mod disk;

use self::disk::{DiskStats, DiskTier};
use k3_engine::{Engine, Session};

/// Whose entries a request may see and make: a hash of the API key it came with (0 when keys
/// are shared or there are none) — the same after a restart, so files on disk keep their owner.
/// It is never written as it is: the disk tier names files by a keyed hash of it
/// ([`disk`]), so a file name is no oracle for guessing keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scope(pub u64);

impl Scope {
    pub fn of_key(key: &str) -> Scope {
        Scope(xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), 0x6b33_5f73_636f_7065) | 1)
    }
}

/// Why a state is kept, which decides when it goes to disk.
#[derive(Debug, Clone, Copy)]
pub enum Kept<'l> {
    /// Where later prompts part from this one (a chat template's boundary): to disk at once.
    ResumePoint,
    /// A prompt's end, with the logits of its last token: to disk at once.
    PromptEnd(&'l [f32]),
    /// An answer's end: to disk when RAM drops it.
    AnswerEnd,
}

/// Which tier a hit came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Ram,
    Disk,
}

#[derive(Debug)]
struct Entry {
    scope: Scope,
    session: Session,
    /// The logits after the state's last token, where they were kept (the end of a prompt).
    logits: Option<Vec<f32>>,
    bytes: usize,
    last_use: u64,
    /// A file holds it (with its logits, if it has them).
    on_disk: bool,
}

/// What a hit starts from: a fork of the kept state, and the logits after its last token when
/// the state holds the whole prompt (nothing left to run).
#[derive(Debug)]
pub struct Resumed {
    pub session: Session,
    pub logits: Option<Vec<f32>>,
    pub tier: Tier,
}

/// Kept states, keyed by the tokens they hold.
#[derive(Debug, Default)]
pub struct PromptCache {
    budget: usize,
    used: usize,
    clock: u64,
    entries: Vec<Entry>,
    disk: Option<DiskTier>,
    pub lookups: u64,
    /// Hits from either tier, and from RAM.
    pub hits: u64,
    pub ram_hits: u64,
    /// Prompt tokens that were not prefilled thanks to a hit.
    pub tokens_saved: u64,
}

impl PromptCache {
    /// A cache of at most `budget` bytes of state (0: off).
    pub fn new(budget: usize) -> Self {
        PromptCache { budget, ..PromptCache::default() }
    }

    /// The same with `disk` as its second tier.
    pub fn with_disk(budget: usize, disk: DiskTier) -> Self {
        PromptCache { budget, disk: Some(disk), ..PromptCache::default() }
    }

    fn on(&self) -> bool {
        self.budget > 0 || self.disk.is_some()
    }

    /// The disk tier's counters, when there is one.
    pub fn disk_stats(&mut self) -> Option<DiskStats> {
        self.disk.as_mut().map(|d| {
            d.poll();
            d.stats()
        })
    }

    /// Warnings of the disk tier for the server's log.
    pub fn take_warnings(&mut self) -> Vec<String> {
        self.disk.as_mut().map(DiskTier::take_warnings).unwrap_or_default()
    }

    /// A fresh session holding the longest kept state whose tokens begin `prompt` and either
    /// leave at least one of its tokens to run or are the whole prompt with its last logits;
    /// `None` when nothing kept fits.
    pub fn lookup(&mut self, engine: &Engine<'_>, scope: Scope, prompt: &[u32]) -> Option<Resumed> {
        if !self.on() {
            return None;
        }
        self.lookups += 1;
        self.clock += 1;
        let usable = |e: &Entry| {
            let n = e.session.tokens();
            e.scope == scope && (n < prompt.len() || (n == prompt.len() && e.logits.is_some()))
        };
        let best = (0..self.entries.len())
            .filter(|&i| usable(&self.entries[i]) && prompt.starts_with(self.entries[i].session.ids()))
            .max_by_key(|&i| self.entries[i].session.tokens());
        let in_ram = best.map_or(0, |i| self.entries[i].session.tokens());
        if let Some(disk) = self.disk.as_mut()
            && disk.best(scope.0, prompt) > in_ram
            && let Some(saved) = disk.restore(engine, scope.0, prompt)
        {
            let n = saved.session.tokens();
            let logits = if n == prompt.len() { saved.logits } else { None };
            self.keep_in_ram(engine, scope, &saved.session, logits.as_deref(), true);
            self.hits += 1;
            self.tokens_saved += n as u64;
            return Some(Resumed { session: saved.session, logits, tier: Tier::Disk });
        }
        let best = &mut self.entries[best?];
        best.last_use = self.clock;
        let session = engine.fork(&best.session).ok()?;
        let logits = if session.tokens() == prompt.len() { best.logits.clone() } else { None };
        self.hits += 1;
        self.ram_hits += 1;
        self.tokens_saved += session.tokens() as u64;
        Some(Resumed { session, logits, tier: Tier::Ram })
    }

    /// Keeps `session`'s state (a fork of it) for `why`: in RAM, dropping the least recently
    /// used to make room (each written to disk first, if it is not there), and on disk at once
    /// for a boundary or a prompt's end; a state larger than the RAM budget goes to disk only.
    pub fn insert(&mut self, engine: &Engine<'_>, scope: Scope, session: &Session, why: Kept<'_>) {
        if !self.on() || session.tokens() == 0 {
            return;
        }
        let logits = match why {
            Kept::PromptEnd(l) => Some(l),
            Kept::ResumePoint | Kept::AnswerEnd => None,
        };
        let now = !matches!(why, Kept::AnswerEnd);
        // On disk only if it was queued: one the writer had no room for is written when RAM
        // drops it, or at the stop.
        let on_disk = now && self.disk.as_mut().is_some_and(|disk| disk.save(engine, scope.0, session, logits));
        if !self.keep_in_ram(engine, scope, session, logits, on_disk)
            && let Some(disk) = self.disk.as_mut()
            && !on_disk
        {
            disk.save(engine, scope.0, session, logits);
        }
    }

    /// At a stop: writes to disk every state RAM holds that no file holds (the most recently used
    /// first), waiting for the writer rather than skipping, and waits for the writes; all within
    /// `timeout`. The states left unwritten when it runs out, if any.
    pub fn flush(&mut self, engine: &Engine<'_>, timeout: std::time::Duration) -> usize {
        let until = std::time::Instant::now() + timeout;
        let Some(disk) = self.disk.as_mut() else { return 0 };
        self.entries.sort_by_key(|e| std::cmp::Reverse(e.last_use));
        let mut left = 0;
        for e in self.entries.iter_mut().filter(|e| !e.on_disk) {
            e.on_disk = disk.save_until(engine, e.scope.0, &e.session, e.logits.as_deref(), Some(until));
            left += usize::from(!e.on_disk);
        }
        disk.settle(until.saturating_duration_since(std::time::Instant::now()));
        left + disk.pending()
    }

    /// Keeps a fork of `session` in RAM (`on_disk`: a file holds it already); false when it is
    /// not kept there (no RAM budget, or larger than it).
    fn keep_in_ram(
        &mut self,
        engine: &Engine<'_>,
        scope: Scope,
        session: &Session,
        logits: Option<&[f32]>,
        on_disk: bool,
    ) -> bool {
        if self.budget == 0 {
            return false;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.scope == scope && e.session.ids() == session.ids()) {
            e.last_use = self.clock;
            if let (None, Some(l)) = (&e.logits, logits) {
                let more = size_of_val(l);
                if self.used + more <= self.budget {
                    e.logits = Some(l.to_vec());
                    e.bytes += more;
                    self.used += more;
                    e.on_disk = on_disk;
                }
            }
            return true;
        }
        let Ok(kept) = engine.keep(session) else { return false };
        let bytes = kept.held_bytes() + logits.map_or(0, size_of_val);
        if bytes > self.budget {
            return false;
        }
        while self.used + bytes > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_use).map(|(i, _)| i) else {
                break;
            };
            let out = self.entries.swap_remove(oldest);
            self.used -= out.bytes;
            if let (Some(disk), false) = (self.disk.as_mut(), out.on_disk) {
                disk.save(engine, out.scope.0, &out.session, out.logits.as_deref());
            }
        }
        self.used += bytes;
        self.entries.push(Entry {
            scope,
            session: kept,
            logits: logits.map(<[f32]>::to_vec),
            bytes,
            last_use: self.clock,
            on_disk,
        });
        true
    }

    /// Bytes of state kept.
    pub fn used(&self) -> usize {
        self.used
    }
}
