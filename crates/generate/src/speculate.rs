//! Speculative decoding's two small parts: drafts from the context (prompt lookup: the longest
//! recent n-gram that ends the text seen so far, and what followed its last earlier occurrence;
//! no draft model), and the governor that turns speculation off while it does not pay.
//!
//! Verification and acceptance live in [`crate::Generator`]: the drafts are run as one tentative
//! chunk, each row's token is sampled exactly as plain decoding would sample it, and a draft is
//! accepted when it is the token sampled. For a deterministic draft that is the standard
//! speculative rule (accept with probability p(d), else draw from p with d removed), and it
//! draws the same random numbers in the same order as plain decoding, so the output is the same
//! tokens at any temperature and seed.

/// The longest n-gram tried first; a shorter one only when no longer one matches.
pub const MAX_NGRAM: usize = 3;

/// Up to `k` drafted tokens following the most recent earlier occurrence of the longest n-gram
/// (`MAX_NGRAM` down to 1) that ends `history`. Empty when nothing matches.
pub fn draft(history: &[u32], k: usize) -> Vec<u32> {
    let len = history.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (1..=MAX_NGRAM.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Most recent first: recent text is the likelier to be repeated (an edit of what was just
        // quoted, a list being continued).
        if let Some(at) = (0..len - n).rev().find(|&i| &history[i..i + n] == tail) {
            let from = at + n;
            return history[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// Steps a governor lets speculation be off before trying it again, at first; doubled each
/// time it is switched off again without having paid in between (up to `MAX_BACKOFF`).
const MIN_BACKOFF: u64 = 32;
/// Drafts in a trial's first verify step: a failed trial costs little, and two more are added
/// after each step that keeps all of its drafts.
const FIRST_LEN: usize = 2;
const MAX_BACKOFF: u64 = 512;
/// Verify steps measured before a verdict; fewer once drafting has been switched off (text that
/// stopped repeating seldom starts again).
const TRIAL: u32 = 4;
const RETRIAL: u32 = 2;
/// Plain steps between re-measurements of a plain step's time while speculating.
const PLAIN_EVERY: u64 = 32;
/// Weight of the newest measurement in the moving averages.
const ALPHA: f64 = 0.25;

/// Decides, step by step, whether to draft and how many: speculation pays when a verify step
/// yields more tokens per second than a plain step. Both are measured as the run goes (a plain
/// step now and then while speculating), so the verdict follows the machine: a compute-bound
/// model pays for every drafted row, an I/O-bound one mostly for the extra experts the drafts
/// route to. The draft length follows acceptance: one more than the drafts last kept after a
/// rejection, two more after a full acceptance (up to the caller's maximum), so text that stops
/// repeating costs short verify steps until the verdict.
#[derive(Debug, Clone)]
pub struct Governor {
    /// Drafts to verify next time (before the caller's cap).
    len: usize,
    /// Seconds per plain step (moving average), once measured.
    plain: Option<f64>,
    /// Tokens per second of verify steps relative to plain steps (moving average).
    gain: f64,
    verifies: u32,
    since_plain: u64,
    /// Steps left with speculation off.
    off: u64,
    backoff: u64,
    /// Times it switched speculation off.
    pub switched_off: u64,
}

impl Default for Governor {
    fn default() -> Self {
        Governor {
            len: FIRST_LEN,
            plain: None,
            gain: 1.0,
            verifies: 0,
            since_plain: 0,
            off: 0,
            backoff: MIN_BACKOFF,
            switched_off: 0,
        }
    }
}

impl Governor {
    /// How many drafts the next step may verify, at most `max` (0: a plain step).
    pub fn draft_len(&mut self, max: usize) -> usize {
        if self.off > 0 {
            self.off -= 1;
            return 0;
        }
        // A plain step first, and now and then, to know what a verify step competes with.
        if self.plain.is_none() || self.since_plain >= PLAIN_EVERY {
            return 0;
        }
        self.len.min(max)
    }

    /// A plain step (one token) took `seconds`.
    pub fn plain_step(&mut self, seconds: f64) {
        self.plain = Some(self.plain.map_or(seconds, |p| p + ALPHA * (seconds - p)));
        self.since_plain = 0;
    }

    /// A verify step of `drafted` drafts took `seconds` and kept `accepted` of them.
    pub fn verify_step(&mut self, seconds: f64, drafted: usize, accepted: usize) {
        self.len = if accepted == drafted { drafted.saturating_add(2) } else { accepted + 1 };
        // The token fed and the drafts kept, against a plain step's one.
        let tokens = accepted + 1;
        self.since_plain += 1;
        let Some(plain) = self.plain else { return };
        let gain = tokens as f64 * plain / seconds.max(1e-9);
        self.gain += ALPHA * (gain - self.gain);
        self.verifies += 1;
        if self.verifies < if self.switched_off > 0 { RETRIAL } else { TRIAL } {
            return;
        }
        if self.gain < 1.0 {
            self.off = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            self.switched_off += 1;
            self.reset_trial();
        } else {
            self.backoff = MIN_BACKOFF;
        }
    }

    fn reset_trial(&mut self) {
        self.gain = 1.0;
        self.verifies = 0;
        self.len = FIRST_LEN;
    }
}

/// What speculation did over a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Verify steps run.
    pub verifies: u64,
    /// Tokens drafted into them.
    pub drafted: u64,
    /// Drafted tokens that were the token sampled (and so were kept).
    pub accepted: u64,
    /// Times the governor switched speculation off.
    pub switched_off: u64,
}

impl SpecStats {
    /// Adds a later turn's counts.
    pub fn add(&mut self, later: &SpecStats) {
        self.verifies += later.verifies;
        self.drafted += later.drafted;
        self.accepted += later.accepted;
        self.switched_off += later.switched_off;
    }

    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_continue_the_longest_latest_match() {
        // "1 2 3 4 5 ... 1 2 3" continues with "4 5".
        assert_eq!(draft(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 2), vec![4, 5]);
        // The trigram 7 2 3 never occurred: the bigram 2 3 did, most recently before 6.
        assert_eq!(draft(&[2, 3, 4, 2, 3, 6, 7, 2, 3], 3), vec![6, 7, 2]);
        // Only a unigram matches; the draft stops at the end of the history.
        assert_eq!(draft(&[5, 8, 1, 5], 4), vec![8, 1, 5]);
        assert!(draft(&[1, 2, 3], 4).is_empty(), "nothing repeats");
        assert!(draft(&[1], 4).is_empty());
        assert!(draft(&[1, 1], 0).is_empty());
    }

    #[test]
    fn the_governor_switches_off_what_does_not_pay_and_tries_again_later() {
        let mut g = Governor::default();
        assert_eq!(g.draft_len(4), 0, "a plain step is measured first");
        g.plain_step(1.0);
        // Verify steps of 2 s that keep no draft: half the plain speed.
        for _ in 0..TRIAL {
            assert!(g.draft_len(4) > 0);
            g.verify_step(2.0, 4, 0);
        }
        assert_eq!(g.switched_off, 1);
        let off = (0..100).take_while(|_| g.draft_len(4) == 0).count() as u64;
        assert_eq!(off, MIN_BACKOFF);
        // Verify steps of 1.2 s that keep two drafts: kept on.
        let mut g = Governor::default();
        g.plain_step(1.0);
        for _ in 0..20 {
            assert!(g.draft_len(4) > 0);
            g.verify_step(1.2, 4, 2);
        }
        assert_eq!(g.switched_off, 0);
    }

    #[test]
    fn the_governor_re_measures_plain_steps_now_and_then() {
        let mut g = Governor::default();
        g.plain_step(1.0);
        for _ in 0..PLAIN_EVERY {
            assert!(g.draft_len(4) > 0);
            g.verify_step(0.5, 1, 1);
        }
        assert_eq!(g.draft_len(4), 0, "a plain step is due");
        g.plain_step(1.0);
        assert!(g.draft_len(4) > 0);
    }

    #[test]
    fn the_draft_length_follows_acceptance() {
        let mut g = Governor::default();
        g.plain_step(1.0);
        assert_eq!(g.draft_len(8), FIRST_LEN, "a short draft first");
        g.verify_step(0.1, 2, 2);
        assert_eq!(g.draft_len(8), 4);
        g.verify_step(0.1, 4, 4);
        assert_eq!(g.draft_len(8), 6);
        g.verify_step(0.1, 6, 4);
        assert_eq!(g.draft_len(8), 5);
        g.verify_step(0.1, 5, 4);
        assert_eq!(g.draft_len(8), 5);
        assert_eq!(g.draft_len(3), 3, "never more than the caller's maximum");
        g.verify_step(0.1, 8, 2);
        assert_eq!(g.draft_len(8), 3, "one more than were kept");
        g.verify_step(0.1, 3, 0);
        assert_eq!(g.draft_len(8), 1);
        g.verify_step(0.1, 1, 1);
        assert_eq!(g.draft_len(8), 3, "two more after all were kept");
        g.verify_step(0.1, 3, 3);
        assert_eq!(g.draft_len(8), 5);
    }
}
