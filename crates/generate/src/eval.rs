//! Held-out perplexity: how well the model predicts a text, the number a trainer reports.
//!
//! The text's tokens are cut into non-overlapping windows, each run from an empty state; every
//! token of a window but its first is scored (natural-log likelihood in f64). This is the
//! definition `tools/train/train_kimi_linear.py` uses, so the two numbers are comparable.

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

/// Scores `ids` in windows of `window` tokens, prefilling `chunk` tokens at a time; `progress` is
/// called with the number of windows done.
pub fn perplexity(
    engine: &Engine<'_>,
    ids: &[u32],
    window: usize,
    chunk: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<Perplexity, GenerateError> {
    check_window(window)?;
    let v = engine.vocab();
    let mut out = Perplexity::default();
    for (i, w) in ids.chunks(window).filter(|w| w.len() >= 2).enumerate() {
        let mut session = engine.session();
        // Each chunk's logits are scored as they come (a window's whole logits could be larger
        // than the model): position p predicts token p + 1.
        let mut nll = 0.0;
        for (ci, c) in w.chunks(chunk.max(1)).enumerate() {
            let logits = engine.forward(&mut session, c, None)?;
            let first = ci * chunk.max(1);
            nll -= logits
                .chunks_exact(v)
                .zip(w.iter().skip(first + 1))
                .map(|(row, &next)| log_softmax_at(row, next as usize))
                .sum::<f64>();
        }
        out.windows.push(WindowNll { nll, scored: w.len() - 1 });
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
    window: usize,
    chunk: usize,
    progress: &mut dyn FnMut(usize),
) -> Result<Agreement, GenerateError> {
    check_window(window)?;
    let v = model.vocab();
    if reference.vocab() != v {
        return Err(GenerateError::Input(format!(
            "the reference model has a vocabulary of {}, this one {v}: not comparable",
            reference.vocab()
        )));
    }
    let mut out = Agreement::default();
    for (i, w) in ids.chunks(window).filter(|w| w.len() >= 2).enumerate() {
        let (mut sm, mut sr) = (model.session(), reference.session());
        for (ci, c) in w.chunks(chunk.max(1)).enumerate() {
            let (lm, lr) = (model.forward(&mut sm, c, None)?, reference.forward(&mut sr, c, None)?);
            let first = ci * chunk.max(1);
            // The window's last position predicts past it: not scored.
            let rows = c.len().min(w.len() - 1 - first.min(w.len() - 1));
            for (q, p) in lm.chunks_exact(v).zip(lr.chunks_exact(v)).take(rows) {
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

fn check_window(window: usize) -> Result<(), GenerateError> {
    if window < 2 {
        return Err(GenerateError::Input(format!("a scoring window needs at least 2 tokens, not {window}")));
    }
    Ok(())
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
