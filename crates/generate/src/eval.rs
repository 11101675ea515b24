//! Held-out perplexity: how well the model predicts a text, the number a trainer reports.
//!
//! The text's tokens are cut into non-overlapping windows, each run from an empty state; every
//! token of a window but its first is scored (natural-log likelihood in f64). This is the
//! definition `tools/train/train_kimi_linear.py` uses, so the two numbers are comparable.
//! [`Windows::skip`] leaves a window's first predictions unscored instead, as `llama-perplexity`
//! does (it scores the second half of each window), so a comparison with it counts the same
//! positions.

use crate::sample::argmax;
use k3_engine::{Engine, RunStats};

use crate::GenerateError;

/// The negative log-likelihood of the tokens one window scored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowNll {
    pub nll: f64,
    pub scored: usize,
}

/// The summed result over all windows, with the engine's run statistics.
#[derive(Debug, Clone, Default)]
pub struct Perplexity {
    pub windows: Vec<WindowNll>,
    pub stats: RunStats,
}

impl Perplexity {
    pub fn scored(&self) -> usize {
        self.windows.iter().map(|w| w.scored).sum()
    }

    pub fn mean_nll(&self) -> f64 {
        self.windows.iter().map(|w| w.nll).sum::<f64>() / self.scored().max(1) as f64
    }

    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }
}

/// How a text is cut and which positions count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// Tokens per window (each run from an empty state).
    pub window: usize,
    /// Tokens per forward call.
    pub chunk: usize,
    /// Predictions at the first `skip` positions of each window are not scored (0: all are).
    pub skip: usize,
}

impl Windows {
    /// Every prediction scored, as a trainer counts.
    pub fn new(window: usize, chunk: usize) -> Self {
        Windows { window, chunk: chunk.max(1), skip: 0 }
    }

    fn check(&self) -> Result<(), GenerateError> {
        if self.window < 2 {
            return Err(GenerateError::Input(format!("a scoring window needs at least 2 tokens, not {}", self.window)));
        }
        if self.chunk == 0 {
            return Err(GenerateError::Input("a forward call needs at least 1 token".into()));
        }
        if self.skip + 1 >= self.window {
            return Err(GenerateError::Input(format!(
                "skipping {} positions of a {}-token window leaves none to score",
                self.skip, self.window
            )));
        }
        Ok(())
    }

    /// The windows that score at least one position.
    fn of<'a>(&self, ids: &'a [u32]) -> impl Iterator<Item = &'a [u32]> {
        let skip = self.skip;
        ids.chunks(self.window).filter(move |w| w.len() >= skip + 2)
    }

    /// The positions of a chunk starting at `first` in a window of `len` tokens that are scored,
    /// as rows of the chunk's logits: those at or past `skip` and before the window's last.
    fn rows(&self, first: usize, chunk_len: usize, len: usize) -> std::ops::Range<usize> {
        let end = (first + chunk_len).min(len - 1);
        let start = self.skip.max(first).min(end);
        start - first..end - first
    }
}

/// Scores `ids` in windows, prefilling `chunk` tokens at a time; `progress` is called with the
/// number of windows done.
pub fn perplexity(
    engine: &Engine<'_>,
    ids: &[u32],
    cut: &Windows,
    progress: &mut dyn FnMut(usize),
) -> Result<Perplexity, GenerateError> {
    cut.check()?;
    let v = engine.vocab();
    let mut out = Perplexity::default();
    for (i, w) in cut.of(ids).enumerate() {
        let mut session = engine.session();
        // Each chunk's logits are scored as they come (a window's whole logits could be larger
        // than the model): position p predicts token p + 1.
        let mut nll = 0.0;
        for (ci, c) in w.chunks(cut.chunk).enumerate() {
            let logits = engine.forward(&mut session, c, None)?;
            let first = ci * cut.chunk;
            let rows = cut.rows(first, c.len(), w.len());
            nll -= rows
                .clone()
                .map(|r| log_softmax_at(&logits[r * v..(r + 1) * v], w[first + r + 1] as usize))
                .sum::<f64>();
        }
        out.windows.push(WindowNll { nll, scored: w.len() - 1 - cut.skip });
        out.stats.accumulate(&session.stats);
        progress(i + 1);
    }
    if out.windows.is_empty() {
        return Err(GenerateError::Input("the text is too short to score: it needs at least 2 tokens".into()));
    }
    Ok(out)
}

/// How closely a model's predictions follow a reference model's over a text.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Agreement {
    /// Positions compared (each window's, but its last).
    pub positions: usize,
    /// Positions where both models' most likely next token is the same.
    pub top1: usize,
    /// Summed `KL(reference || model)` of the next-token distributions, nats.
    pub kl: f64,
    /// Summed entropies of the model's and the reference's next-token distributions, nats: a
    /// quantized model that comes out flatter (or sharper) than its reference shows here.
    pub entropy: f64,
    pub reference_entropy: f64,
}

impl Agreement {
    pub fn top1_rate(&self) -> f64 {
        self.top1 as f64 / self.positions.max(1) as f64
    }

    pub fn mean_kl(&self) -> f64 {
        self.kl / self.positions.max(1) as f64
    }

    /// Mean entropies of (the model, the reference), nats.
    pub fn mean_entropies(&self) -> (f64, f64) {
        let n = self.positions.max(1) as f64;
        (self.entropy / n, self.reference_entropy / n)
    }
}

/// Runs `ids` through `model` and `reference` in the same windows as [`perplexity`] and compares
/// their next-token distributions at every scored position.
pub fn agreement(
    model: &Engine<'_>,
    reference: &Engine<'_>,
    ids: &[u32],
    cut: &Windows,
    progress: &mut dyn FnMut(usize),
) -> Result<Agreement, GenerateError> {
    cut.check()?;
    let v = model.vocab();
    if reference.vocab() != v {
        return Err(GenerateError::Input(format!(
            "the reference model has a vocabulary of {}, this one {v}: not comparable",
            reference.vocab()
        )));
    }
    let mut out = Agreement::default();
    for (i, w) in cut.of(ids).enumerate() {
        let (mut sm, mut sr) = (model.session(), reference.session());
        for (ci, c) in w.chunks(cut.chunk).enumerate() {
            let (lm, lr) = (model.forward(&mut sm, c, None)?, reference.forward(&mut sr, c, None)?);
            // The window's last position predicts past it, and the first `skip` are context only.
            let rows = cut.rows(ci * cut.chunk, c.len(), w.len());
            let (lm, lr) = (&lm[rows.start * v..rows.end * v], &lr[rows.start * v..rows.end * v]);
            for (q, p) in lm.chunks_exact(v).zip(lr.chunks_exact(v)) {
                let (lp, lq) = (log_softmax(p), log_softmax(q));
                out.kl += kl_divergence(&lp, &lq);
                out.entropy += entropy(&lq);
                out.reference_entropy += entropy(&lp);
                out.top1 += usize::from(argmax(q) == argmax(p));
                out.positions += 1;
            }
        }
        progress(i + 1);
    }
    Ok(out)
}

/// `KL(p || q)` in nats, from log-probabilities ([`log_softmax`]: each position's computed once
/// for the divergence and both entropies).
fn kl_divergence(lp: &[f64], lq: &[f64]) -> f64 {
    lp.iter().zip(lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// The entropy in nats, from log-probabilities.
fn entropy(lp: &[f64]) -> f64 {
    -lp.iter().map(|l| l.exp() * l).sum::<f64>()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(row);
    row.iter().map(|&x| f64::from(x) - lse).collect()
}

/// `log softmax(row)[i]` in f64 (the max subtracted first, so no overflow).
fn log_softmax_at(row: &[f32], i: usize) -> f64 {
    f64::from(row[i]) - log_sum_exp(row)
}

/// `ln sum exp(row)` in f64, the max subtracted first.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = f64::from(row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)));
    row.iter().map(|&x| (f64::from(x) - max).exp()).sum::<f64>().ln() + max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_positions_are_the_windows_first_predictions() {
        // A 6-token window in chunks of 4, its first 2 predictions skipped: positions 2, 3, 4
        // predict tokens 3, 4, 5; position 5 predicts past the window.
        let cut = Windows { window: 6, chunk: 4, skip: 2 };
        assert_eq!((cut.rows(0, 4, 6), cut.rows(4, 2, 6)), (2..4, 0..1));
        let all = Windows::new(6, 4);
        assert_eq!((all.rows(0, 4, 6), all.rows(4, 2, 6)), (0..4, 0..1));
        // A chunk wholly inside the skipped part scores nothing.
        assert!(Windows { window: 8, chunk: 2, skip: 5 }.rows(2, 2, 8).is_empty());
        // A last window too short to reach past the skip is left out.
        assert_eq!(cut.of(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).count(), 1);
        assert_eq!(cut.of(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).count(), 2);
        assert!(Windows { window: 4, chunk: 4, skip: 3 }.check().is_err());
        assert!(Windows { window: 4, chunk: 0, skip: 0 }.check().is_err());
    }

    #[test]
    fn kl_of_a_distribution_with_itself_is_zero_and_positive_otherwise() {
        let (p, q) = ([1.0f32, 2.0, 3.0], [3.0f32, 2.0, 1.0]);
        let kl = |p: &[f32], q: &[f32]| kl_divergence(&log_softmax(p), &log_softmax(q));
        assert!(kl(&p, &p).abs() < 1e-12);
        // By hand: p = softmax(1,2,3); KL(p || reverse(p)) = sum p_i (log p_i - log p_(2-i)).
        let z: f64 = [1f64, 2.0, 3.0].iter().map(|x| x.exp()).sum();
        let pr: Vec<f64> = [1f64, 2.0, 3.0].iter().map(|x| x.exp() / z).collect();
        let want: f64 = (0..3).map(|i| pr[i] * (pr[i].ln() - pr[2 - i].ln())).sum();
        assert!((kl(&p, &q) - want).abs() < 1e-12);
        assert_eq!((argmax(&p), argmax(&q)), (2, 0));
        // Equal logits: ln n; p's by hand.
        let entropy = |row: &[f32]| entropy(&log_softmax(row));
        assert!((entropy(&[0.5; 8]) - 8f64.ln()).abs() < 1e-12);
        assert!((entropy(&p) + pr.iter().map(|x| x * x.ln()).sum::<f64>()).abs() < 1e-12);
    }

    #[test]
    fn log_softmax_matches_the_definition() {
        let row = [1.0f32, 2.0, 3.0, -1.0];
        let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        for i in 0..row.len() {
            let want = (f64::from(row[i]).exp() / z).ln();
            assert!((log_softmax_at(&row, i) - want).abs() < 1e-12);
        }
        // Large logits do not overflow.
        assert!((log_softmax_at(&[1000.0, 1000.0], 0) - 0.5f64.ln()).abs() < 1e-12);
    }
}
