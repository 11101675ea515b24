//! The router lookahead: guessing the next layer's experts from this layer's state, prefetching
//! the best guesses while the drive would idle, and keeping score of every predictor.

use k3_io::{Priority, Status};
use k3_quant::vecops::rms_norm;
use k3_router::Routing;
use k3_router::lookahead::{Predictor, predict};

use super::Engine;
use super::attnres::mix;
use super::expert_io::ExpertIo;
use super::layers::{Ffn, Moe};
use super::session::{RoutedToken, Session};
use crate::EngineError;

/// Tokens over which a layer's lookahead is tried before its precision decides whether it continues.
pub(crate) const WARMUP_TOKENS: u64 = 8;

/// How many guesses a layer's prefetch reads at most: half of top-k (the drive's idle gap holds
/// only a few records; docs/EFFICIENCY.md: caps 4 / 8 / 16 in single, noisy runs).
pub(crate) fn prefetch_cap(moe: &Moe<'_>) -> usize {
    (moe.router.top_k / 2).max(1)
}

/// What the predictors said about the next layer, per token of the chunk.
pub(crate) type Guesses = [Option<Vec<u32>>; 2];

impl Engine<'_> {
    /// Layer `li + 1`'s router applied to `v` (normed with that layer's post-attention norm):
    /// the experts it would pick, `top_k + margin` of them. `None` when the next layer is dense.
    ///
    /// With AttnRes (K3) the next router sees the next layer's mix of the finished blocks and the
    /// running partial sum, not the partial sum alone (which lacks the embedding and every earlier
    /// block): the guess mixes `blocks` and `v` with the next layer's MLP weights, the next
    /// layer's own attention output (not computed yet) left out.
    ///
    /// A model routed by a synthetic process (`row` given) is predicted by the process's model of
    /// K3's lookahead instead (its recall, from the row's tokens).
    pub(crate) fn predict_next(
        &self,
        li: usize,
        blocks: &[Vec<f32>],
        v: &[f32],
        row: Option<&k3_router::synthetic::RowContext>,
    ) -> Option<Vec<u32>> {
        let next = self.layers.get(li + 1)?;
        let Ffn::Moe(moe) = &next.ffn else { return None };
        if let (Some(p), Some(row)) = (&moe.synthetic, row) {
            return Some(p.predict(&moe.router, next.index, row, self.lookahead_margin));
        }
        let mixed;
        let v = match &next.mlp_res {
            Some(w) => {
                mixed = mix(blocks, v, w, self.eps());
                &mixed
            }
            None => v,
        };
        let mut x = vec![0f32; v.len()];
        rms_norm(v, &next.post_norm, self.eps(), &mut x);
        let mut logits = vec![0f32; moe.router.experts];
        moe.gate.matvec(&x, &mut logits);
        Some(predict(&moe.router, &logits, &moe.bias, self.lookahead_margin))
    }

    /// Whether layer `li + 1`'s prefetch still earns its reads: during its warm-up (to measure it),
    /// then only while at least `lookahead_min_precision` of what it would read is used (a wrong
    /// guess costs a full read of drive bandwidth, which an I/O-bound step pays in time).
    pub(crate) fn prefetch_earns(&self, session: &Session, li: usize) -> bool {
        let c = session.lookahead.counts(Predictor::AfterAttention, li + 1);
        let (guessed, right) = session.prefetch_guesses.get(li + 1).copied().unwrap_or((0, 0));
        c.tokens < WARMUP_TOKENS || right as f64 >= self.opts.lookahead_min_precision * guessed as f64
    }

    /// Scores what the predictors guessed for layer `li` against what it chose, and records the
    /// choices (usage history, previous-token predictor, the routing trace — held back with a
    /// chunk of drafts until `accept_drafts` says which rows happened).
    pub(crate) fn record_routing(
        &self,
        session: &mut Session,
        li: usize,
        moe: &Moe<'_>,
        routings: &[Routing],
        guesses: &mut [Guesses],
    ) {
        for (t, r) in routings.iter().enumerate() {
            let [a, m] = std::mem::take(&mut guesses[t]);
            if let Some(a) = a {
                session.lookahead.record(Predictor::AfterAttention, li, &a, &r.experts);
                let best = &a[..a.len().min(prefetch_cap(moe))];
                let g = &mut session.prefetch_guesses[li];
                g.0 += best.len() as u64;
                g.1 += best.iter().filter(|e| r.experts.contains(e)).count() as u64;
            }
            if let Some(m) = m {
                session.lookahead.record(Predictor::AfterMoe, li, &m, &r.experts);
            }
            if self.opts.lookahead_stats {
                if !session.prev_routing[li].is_empty() {
                    session.lookahead.record(Predictor::PreviousToken, li, &session.prev_routing[li], &r.experts);
                }
                session.prev_routing[li].clone_from(&r.experts);
            }
            for &e in &r.experts {
                session.usage.record((li as u32, e));
            }
            if let Some(tr) = session.routing_trace.as_mut() {
                let routed = RoutedToken {
                    position: session.ids.len() + t,
                    layer: li as u32,
                    experts: r.experts.clone(),
                    weights: r.weights.clone(),
                };
                match session.pending.as_mut() {
                    Some(p) => p.routes.push(routed),
                    None => tr.push(routed),
                }
            }
        }
    }
}

/// Reads the next layer's predicted experts at low priority once this layer's own reads have all
/// landed: the drive would idle through the last experts' arithmetic and the next layer's
/// attention, so the guesses cost no demand read any bandwidth. Best guesses first (every token's
/// first choice, then second, ...), at most half of top-k: a wasted guess costs a whole record of
/// bandwidth, and the drive's idle gap holds only a few records.
pub(crate) fn prefetch(
    engine: &Engine<'_>,
    io: &mut ExpertIo,
    moe: &Moe<'_>,
    next: u32,
    predicted: &[Vec<u32>],
) -> Result<(), EngineError> {
    if !engine.layers.get(next as usize).is_some_and(|l| matches!(l.ffn, Ffn::Moe(_))) {
        return Ok(());
    }
    let mut want: Vec<u32> = Vec::new();
    let longest = predicted.iter().map(Vec::len).max().unwrap_or(0);
    for rank in 0..longest {
        for e in predicted.iter().filter_map(|p| p.get(rank)) {
            if !want.contains(e) {
                want.push(*e);
            }
        }
    }
    want.truncate(prefetch_cap(moe));
    for e in want {
        if io.cache.available() == 0 {
            break;
        }
        if !io.cache.contains((next, e)) {
            let loc = io.location(engine.model, (next, e))?;
            let _: Status = io.cache.request((next, e), loc, Priority::Prefetch { layer: next })?;
        }
    }
    Ok(())
}
