//! The prefix cache: states after prompts (and after finished answers) kept within a byte budget,
//! least recently used out first. A request whose prompt extends a kept state's tokens starts
//! from a fork of it and prefills only the rest — a conversation's next turn costs its new tokens,
//! not the whole history. A recurrent state can only be resumed where it was kept, so states are
//! kept where a later request meets them:
//! - the end of a prompt, with the logits of its last token: the same request again (a
//!   front-end's Regenerate) starts sampling at once, from the very logits a fresh prefill gives;
//! - the end of an answer: the conversation's next turn, which quotes the answer back;
//! - the boundaries the scheduler stops a prefill at ([`crate::scheduler::Job::checkpoints`]):
//!   after the system turn and tool declarations (a new conversation with the same ones), and
//!   after the message before the last (the last message edited and sent again).
//!
//! Entries belong to a [`Scope`] (the API key that made them): a request sees only its own
//! scope's, so `cached_tokens` cannot tell one client what another one asked. A kept state is a
//! compact copy ([`Engine::keep`]), counted by what it holds in memory ([`Session::held_bytes`]).

use k3_engine::{Engine, Session};

/// Whose entries a request may see and make: the API key it came with (0 when keys are shared
/// or there are none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scope(pub u32);

#[derive(Debug)]
struct Entry {
    scope: Scope,
    session: Session,
    /// The logits after the state's last token, where they were kept (the end of a prompt).
    logits: Option<Vec<f32>>,
    bytes: usize,
    last_use: u64,
}

/// What a hit starts from: a fork of the kept state, and the logits after its last token when
/// the state holds the whole prompt (nothing left to run).
#[derive(Debug)]
pub struct Resumed {
    pub session: Session,
    pub logits: Option<Vec<f32>>,
}

/// Kept states, keyed by the tokens they hold.
#[derive(Debug, Default)]
pub struct PrefixCache {
    budget: usize,
    used: usize,
    clock: u64,
    entries: Vec<Entry>,
    pub lookups: u64,
    pub hits: u64,
    /// Prompt tokens that were not prefilled thanks to a hit.
    pub tokens_saved: u64,
}

impl PrefixCache {
    /// A cache of at most `budget` bytes of state (0: off).
    pub fn new(budget: usize) -> Self {
        PrefixCache { budget, ..PrefixCache::default() }
    }

    /// A fresh session holding the longest kept state whose tokens begin `prompt` and either
    /// leave at least one of its tokens to run or are the whole prompt with its last logits;
    /// `None` when nothing kept fits.
    pub fn lookup(&mut self, engine: &Engine<'_>, scope: Scope, prompt: &[u32]) -> Option<Resumed> {
        if self.budget == 0 {
            return None;
        }
        self.lookups += 1;
        self.clock += 1;
        let usable = |e: &Entry| {
            let n = e.session.tokens();
            e.scope == scope && (n < prompt.len() || (n == prompt.len() && e.logits.is_some()))
        };
        let best = self
            .entries
            .iter_mut()
            .filter(|e| usable(e) && prompt.starts_with(e.session.ids()))
            .max_by_key(|e| e.session.tokens())?;
        best.last_use = self.clock;
        let session = engine.fork(&best.session).ok()?;
        let logits = if session.tokens() == prompt.len() { best.logits.clone() } else { None };
        self.hits += 1;
        self.tokens_saved += session.tokens() as u64;
        Some(Resumed { session, logits })
    }

    /// Keeps `session`'s state (a fork of it), and `logits` after its last token if given,
    /// dropping the least recently used to make room; a state larger than the whole budget, or
    /// one already kept (then only given logits are added), is not.
    pub fn insert(&mut self, engine: &Engine<'_>, scope: Scope, session: &Session, logits: Option<&[f32]>) {
        if self.budget == 0 || session.tokens() == 0 {
            return;
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
                }
            }
            return;
        }
        let Ok(kept) = engine.keep(session) else { return };
        let bytes = kept.held_bytes() + logits.map_or(0, size_of_val);
        if bytes > self.budget {
            return;
        }
        while self.used + bytes > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.last_use).map(|(i, _)| i) else {
                break;
            };
            self.used -= self.entries.swap_remove(oldest).bytes;
        }
        self.used += bytes;
        self.entries.push(Entry {
            scope,
            session: kept,
            logits: logits.map(<[f32]>::to_vec),
            bytes,
            last_use: self.clock,
        });
    }

    /// Bytes of state kept.
    pub fn used(&self) -> usize {
        self.used
    }
}
