//! What a routing trace says about reuse, the figures caching, prefetch and batching decisions
//! rest on, defined as the published K3 measurements define them (issue #37):
//!
//! - next-token reuse: the share of a token's experts (per layer) also chosen for the token
//!   before;
//! - union factor over N consecutive tokens: distinct experts over activations (N x top-k), per
//!   layer, over non-overlapping windows;
//! - weight by rank: the mean renormalized routing weight of the r-th heaviest expert, and the
//!   mass the lower half of the ranks carries;
//! - usage flatness: the share of activations that go to the most used tenth of the experts (a
//!   flat router: 0.1 plus sampling noise);
//! - overlap of two unrelated texts: the share of the experts one uses (per layer) that the
//!   other uses too, averaged both ways.

use std::collections::HashSet;

/// One token's routing at one layer: experts in selection order and their weights.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRoute {
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

/// A trace: per MoE layer, the tokens' routings in position order.
pub type Trace = Vec<Vec<TokenRoute>>;

/// The statistics of one trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceStats {
    pub tokens: usize,
    pub next_token_reuse: f64,
    /// (window, union factor), for the windows asked.
    pub union: Vec<(usize, f64)>,
    /// Mean renormalized weight by rank (1 = the heaviest).
    pub weight_by_rank: Vec<f64>,
    /// The mass of ranks k/2+1..k.
    pub lower_half_mass: f64,
    /// Share of activations to the most used tenth of the experts, mean over layers.
    pub top_tenth_share: f64,
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (mut s, mut n) = (0.0, 0usize);
    for x in v {
        s += x;
        n += 1;
    }
    if n == 0 { f64::NAN } else { s / n as f64 }
}

impl TraceStats {
    /// The statistics of `trace` over `experts` experts a layer, unions over `windows` tokens.
    pub fn of(trace: &Trace, experts: usize, windows: &[usize]) -> TraceStats {
        let tokens = trace.iter().map(Vec::len).max().unwrap_or(0);
        let next_token_reuse = mean(trace.iter().flat_map(|layer| {
            layer.windows(2).map(|w| {
                let before: HashSet<u32> = w[0].experts.iter().copied().collect();
                let k = w[1].experts.len().max(1);
                w[1].experts.iter().filter(|e| before.contains(e)).count() as f64 / k as f64
            })
        }));
        let union = windows
            .iter()
            .map(|&n| {
                let u = mean(trace.iter().flat_map(|layer| {
                    layer.chunks_exact(n.max(1)).map(|c| {
                        let distinct: HashSet<u32> = c.iter().flat_map(|r| r.experts.iter().copied()).collect();
                        let activations: usize = c.iter().map(|r| r.experts.len()).sum();
                        distinct.len() as f64 / activations.max(1) as f64
                    })
                }));
                (n, u)
            })
            .collect();
        let k = trace.iter().flatten().map(|r| r.weights.len()).max().unwrap_or(0);
        let mut by_rank = vec![0.0f64; k];
        let mut counted = 0usize;
        for r in trace.iter().flatten().filter(|r| r.weights.len() == k) {
            let mut w: Vec<f64> = r.weights.iter().map(|&x| f64::from(x)).collect();
            let total: f64 = w.iter().sum();
            if total <= 0.0 {
                continue;
            }
            w.sort_by(|a, b| b.total_cmp(a));
            for (acc, x) in by_rank.iter_mut().zip(&w) {
                *acc += x / total;
            }
            counted += 1;
        }
        by_rank.iter_mut().for_each(|x| *x /= counted.max(1) as f64);
        let lower_half_mass = by_rank[k / 2..].iter().sum();
        let top_tenth_share = mean(trace.iter().filter(|l| !l.is_empty()).map(|layer| {
            let mut counts = vec![0u64; experts];
            for e in layer.iter().flat_map(|r| &r.experts) {
                if let Some(c) = counts.get_mut(*e as usize) {
                    *c += 1;
                }
            }
            counts.sort_unstable_by(|a, b| b.cmp(a));
            let total: u64 = counts.iter().sum();
            let top: u64 = counts[..experts.div_ceil(10)].iter().sum();
            top as f64 / total.max(1) as f64
        }));
        TraceStats { tokens, next_token_reuse, union, weight_by_rank: by_rank, lower_half_mass, top_tenth_share }
    }
}

/// The share of the experts each trace uses (per layer) that the other uses too, averaged over
/// layers and both ways.
pub fn overlap(a: &Trace, b: &Trace) -> f64 {
    let used =
        |layer: &Vec<TokenRoute>| -> HashSet<u32> { layer.iter().flat_map(|r| r.experts.iter().copied()).collect() };
    mean(a.iter().zip(b).filter(|(x, y)| !x.is_empty() && !y.is_empty()).map(|(x, y)| {
        let (ux, uy) = (used(x), used(y));
        let shared = ux.intersection(&uy).count() as f64;
        (shared / ux.len() as f64 + shared / uy.len() as f64) / 2.0
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(experts: &[u32], weights: &[f32]) -> TokenRoute {
        TokenRoute { experts: experts.to_vec(), weights: weights.to_vec() }
    }

    #[test]
    fn statistics_of_a_hand_made_trace() {
        // One layer, top-2 of 20 experts, four tokens.
        let layer =
            vec![r(&[0, 1], &[3.0, 1.0]), r(&[1, 2], &[1.0, 1.0]), r(&[3, 4], &[2.0, 2.0]), r(&[3, 0], &[1.0, 3.0])];
        let s = TraceStats::of(&vec![layer.clone()], 20, &[2, 4]);
        // Reuse: {1} of 2, none, {3} of 2 -> (0.5 + 0 + 0.5) / 3.
        assert!((s.next_token_reuse - 1.0 / 3.0).abs() < 1e-12, "{s:?}");
        // Windows of 2: {0,1,2} of 4 and {3,4,0} of 4; of 4: {0,1,2,3,4} of 8.
        assert_eq!(s.union, vec![(2, 0.75), (4, 5.0 / 8.0)]);
        // Ranks: (0.75 + 0.5 + 0.5 + 0.75) / 4 and the rest.
        assert!((s.weight_by_rank[0] - 0.625).abs() < 1e-12 && (s.lower_half_mass - 0.375).abs() < 1e-12, "{s:?}");
        // The most used tenth of 20 experts (2 of them: 0 and 1, or 0 and 3, 2 uses each) takes 4 of 8.
        assert!((s.top_tenth_share - 0.5).abs() < 1e-12, "{s:?}");
        let other = vec![vec![r(&[4, 9], &[1.0, 1.0])]];
        // The first uses {0..4} (5), the second {4, 9}: 1/5 and 1/2.
        assert!((overlap(&vec![layer], &other) - 0.35).abs() < 1e-12);
    }
}
