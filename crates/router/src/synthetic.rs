//! K3-like routing for synthetic models (issue #37): a seeded process, independent of the
//! model's weights, whose statistics match the published K3 figures, so caching, prefetch and
//! batching can be judged on a model whose routing reuses experts as K3's does (a random router
//! reuses ~2% of them).
//!
//! Each token's `k` experts at a layer come from four sources, in this order, duplicates
//! skipped:
//! - its own: the first `a0` of a fixed list of experts for (layer, token id);
//! - the two tokens before it: the first `a1` and `a2` of their lists (so consecutive tokens
//!   share experts, as K3's next-token reuse of 29.5% says they do);
//! - the topic: `b` of a pool of `m` experts fixed for a segment of 64 positions (keyed by the
//!   token that starts it), which makes 32 consecutive tokens use few distinct experts (K3's
//!   union factor 0.37) while usage stays flat over a long text.
//!
//! Every list is drawn uniformly, so usage is flat. The routing is a function of the token ids
//! and positions alone: a prefix routes the same wherever it is run (batch, cache, resume).
//! Weights follow K3's mean weight by rank (0.149 for the heaviest down to 0.032 for the
//! sixteenth, interpolated in log-rank), with noise, in an order drawn per token.
//! The proportions (for k = 16: 5, 2, 1, 8 from a pool of 36) were fitted by simulation against
//! next-token reuse 0.295, the union of 4 tokens (between 0.658 decode and 0.763 prefill) and
//! of 32 tokens 0.37; `cargo xtask bench routing` measures them on a model.

use crate::route::{RouterConfig, Routing};

/// The tokens around a row that its routing depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowContext {
    /// The row's position in its sequence.
    pub position: u64,
    /// Its token id and the two before it (`None` before the start).
    pub ids: [Option<u32>; 3],
    /// The token id at the start of its topic segment, for each of the layers' phases (where
    /// [`K3Like::segment_start`] puts it).
    pub segment_ids: [u32; SEGMENT_PHASES],
}

impl RowContext {
    /// The context of position `position` of a sequence whose token at position `p` is `id(p)`
    /// (defined for every position up to `position`).
    pub fn at(position: usize, id: impl Fn(usize) -> u32) -> RowContext {
        let back = |n: usize| position.checked_sub(n).map(&id);
        let segment_ids =
            std::array::from_fn(|phase| id(K3Like::segment_start(phase as u32, position as u64) as usize));
        RowContext { position: position as u64, ids: [back(0), back(1), back(2)], segment_ids }
    }
}

/// The share of a layer's experts the router lookahead (the next layer's router on this layer's
/// state) recalls in K3 (WARP's measurement).
pub const LOOKAHEAD_RECALL: f64 = 0.59;

/// Positions a topic lasts.
pub const SEGMENT: u64 = 64;
/// Layers' segment boundaries are staggered over this many phases.
pub const SEGMENT_PHASES: usize = 4;

/// K3's mean renormalized weight at ranks 1, 2, 4, 8, 12, 16 (WARP's measurements).
const RANK_WEIGHTS: [(f64, f64); 6] =
    [(1.0, 0.149), (2.0, 0.108), (4.0, 0.077), (8.0, 0.055), (12.0, 0.043), (16.0, 0.032)];

/// The process's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct K3Like {
    pub seed: u64,
    experts: u32,
    k: usize,
    a: [usize; 3],
    b: usize,
    m: usize,
    profile: Vec<f32>,
}

/// splitmix64: a well-mixed hash of a running state.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn key(parts: &[u64]) -> u64 {
    parts.iter().fold(0x6A09_E667_F3BC_C908, |h, &p| mix(h ^ p))
}

impl K3Like {
    /// The process for `cfg`'s experts and top-k; `seed` picks the lists.
    pub fn new(cfg: &RouterConfig, seed: u64) -> K3Like {
        let k = cfg.top_k.max(1);
        let part = |x: usize| (x * k + 8) / 16;
        let a = [part(5).max(1), part(2), part(1)];
        let b = k.saturating_sub(a.iter().sum());
        // Log-rank interpolation of K3's profile, stretched over k ranks.
        let profile = (1..=k)
            .map(|r| {
                let x = (r as f64 * 16.0 / k as f64).max(1.0).ln();
                let w = RANK_WEIGHTS.windows(2).find(|w| x <= w[1].0.ln()).map_or(RANK_WEIGHTS[5].1, |w| {
                    let (x0, x1) = (w[0].0.ln(), w[1].0.ln());
                    w[0].1 + (w[1].1 - w[0].1) * (x - x0) / (x1 - x0)
                });
                w as f32
            })
            .collect();
        K3Like { seed, experts: cfg.experts as u32, k, a, b, m: (9 * k / 4).max(b).min(cfg.experts), profile }
    }

    /// Position where the segment of `position` starts at `layer` (segments are staggered).
    pub fn segment_start(layer: u32, position: u64) -> u64 {
        let phase = (u64::from(layer) % SEGMENT_PHASES as u64) * SEGMENT / SEGMENT_PHASES as u64;
        ((position + phase) / SEGMENT * SEGMENT).saturating_sub(phase)
    }

    /// The first `n` experts of the list keyed by `k` (distinct, drawn uniformly) that are not
    /// in `out` yet, appended to it.
    fn draw(&self, k: u64, n: usize, out: &mut Vec<u32>) {
        let (mut state, mut taken) = (k, 0usize);
        let mut list: Vec<u32> = Vec::new();
        while taken < n && list.len() < self.experts as usize {
            state = mix(state);
            let e = (state % u64::from(self.experts)) as u32;
            if list.contains(&e) {
                continue;
            }
            list.push(e);
            if !out.contains(&e) {
                out.push(e);
                taken += 1;
            }
        }
    }

    /// What a lookahead predicts for the row at `layer`: `top_k + margin` experts, best first,
    /// whose first `top_k` hold each of the layer's true experts with probability
    /// [`LOOKAHEAD_RECALL`] (drawn per row) in a random order, the rest other experts: the
    /// predictor's recall (and so its precision at `top_k` guesses) as K3's router lookahead
    /// measured it.
    pub fn predict(&self, cfg: &RouterConfig, layer: u32, row: &RowContext, margin: usize) -> Vec<u32> {
        let mut truth = Routing::default();
        self.route(cfg, layer, row, &mut truth);
        let mut state = key(&[self.seed, u64::from(layer), row.position, u64::from(row.ids[0].unwrap_or(0)), 6]);
        let mut out: Vec<u32> = Vec::with_capacity(self.k + margin);
        for &e in &truth.experts {
            state = mix(state);
            if ((state >> 11) as f64 / (1u64 << 53) as f64) < LOOKAHEAD_RECALL {
                out.push(e);
            }
        }
        // Wrong guesses fill the rest: experts the row does not use.
        let mut wrong = truth.experts.clone();
        while out.len() < (self.k + margin).min(self.experts as usize) && wrong.len() < self.experts as usize {
            state = mix(state);
            let e = (state % u64::from(self.experts)) as u32;
            if !wrong.contains(&e) {
                wrong.push(e);
                out.push(e);
            }
        }
        // Ranked as K3's lookahead ranks them: its top k hold the recalled experts (a precision of
        // 0.59 there, as measured), in no particular order; the margin after them is wrong.
        let head = self.k.min(out.len());
        for i in (1..head).rev() {
            state = mix(state);
            out.swap(i, (state % (i as u64 + 1)) as usize);
        }
        out
    }

    /// The row's experts and weights at `layer`, into `out` (weights sum to the config's scale),
    /// trimmed by the config's `keep` and `top_p` as [`crate::route`] trims a gate's.
    pub fn route(&self, cfg: &RouterConfig, layer: u32, row: &RowContext, out: &mut Routing) {
        let l = u64::from(layer);
        let mut chosen: Vec<u32> = Vec::with_capacity(self.k);
        for (i, id) in row.ids.iter().enumerate() {
            if let Some(id) = id {
                // A token's list is the same whether it is the row's own or an earlier one's.
                self.draw(key(&[self.seed, l, u64::from(*id), 1]), self.a[i], &mut chosen);
            }
        }
        // The topic's pool, then this row's picks from it.
        let seg_id = row.segment_ids[layer as usize % SEGMENT_PHASES];
        let segment = K3Like::segment_start(layer, row.position) / SEGMENT;
        let pool_key = key(&[self.seed, l, segment, u64::from(seg_id), 2]);
        let mut pool = Vec::with_capacity(self.m);
        self.draw(pool_key, self.m, &mut pool);
        let mut pick = key(&[self.seed, l, row.position, u64::from(row.ids[0].unwrap_or(0)), 3]);
        let (mut taken, mut tries) = (0, 0);
        while taken < self.b && !pool.is_empty() && tries < 64 * pool.len() {
            pick = mix(pick);
            let e = pool[(pick % pool.len() as u64) as usize];
            if !chosen.contains(&e) {
                chosen.push(e);
                taken += 1;
            }
            tries += 1;
        }
        // Anything still missing (a tiny pool) from the row's own list, further down.
        if chosen.len() < self.k {
            let id = u64::from(row.ids[0].unwrap_or(0));
            self.draw(key(&[self.seed, l, id, 1]), self.k - chosen.len(), &mut chosen);
        }
        chosen.truncate(self.k);
        // Weights: the rank profile with noise, handed out in an order drawn for the row.
        let mut w: Vec<f32> = self
            .profile
            .iter()
            .enumerate()
            .map(|(r, &p)| {
                let u = (mix(key(&[pick, r as u64, 4])) >> 11) as f64 / (1u64 << 53) as f64;
                p * (0.3 * (u - 0.5)).exp() as f32
            })
            .collect();
        let mut order: Vec<(u64, usize)> = (0..self.k).map(|i| (mix(key(&[pick, i as u64, 5])), i)).collect();
        order.sort_unstable();
        let total: f32 = w.iter().sum();
        let scale = if cfg.renormalize { cfg.scaling / total } else { cfg.scaling };
        w.iter_mut().for_each(|x| *x *= scale);
        out.experts.clear();
        out.weights.clear();
        for (_, i) in order {
            if let Some(&e) = chosen.get(i) {
                out.experts.push(e);
                out.weights.push(w[i]);
            }
        }
        // The run-time knobs (top-k reduction, top-p) apply as they do to a gate's routing.
        crate::route::trim(cfg, out);
    }
}

/// The trace of the token ids `ids` through `layers` layers routed by `p`: per layer, each
/// position's experts and weights.
pub fn trace(p: &K3Like, cfg: &RouterConfig, ids: &[u32], layers: u32) -> crate::trace_stats::Trace {
    (0..layers)
        .map(|layer| {
            (0..ids.len())
                .map(|t| {
                    let mut r = Routing::default();
                    p.route(cfg, layer, &RowContext::at(t, |i| ids[i]), &mut r);
                    crate::trace_stats::TokenRoute { experts: r.experts, weights: r.weights }
                })
                .collect()
        })
        .collect()
}

/// `n` token ids drawn uniformly below `vocab` by `seed` (text for the process to route).
pub fn random_ids(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
    (0..n as u64).map(|i| (mix(key(&[seed, i])) % u64::from(vocab.max(1))) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace_stats::{TokenRoute, TraceStats};

    /// A trace of `n` random token ids through `layers` layers of K3's shape.
    fn trace(n: usize, layers: u32, seed: u64) -> Vec<Vec<TokenRoute>> {
        let cfg = RouterConfig::new(896, 16);
        super::trace(&K3Like::new(&cfg, 7), &cfg, &random_ids(n, 160_000, seed), layers)
    }

    /// The process's statistics against the published K3 figures, each within 10%.
    #[test]
    fn the_statistics_are_k3s() {
        let t = trace(512, 4, 1);
        for layer in &t {
            for r in layer {
                let mut e = r.experts.clone();
                e.sort_unstable();
                e.dedup();
                assert_eq!(e.len(), 16, "16 distinct experts a token");
                assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            }
        }
        let s = TraceStats::of(&t, 896, &[4, 32]);
        let near = |got: f64, want: f64| (got / want - 1.0).abs() <= 0.10;
        assert!(near(s.next_token_reuse, 0.295), "reuse {s:?}");
        let u4 = s.union[0].1;
        assert!(near(u4, 0.658) && near(u4, 0.763), "union of 4 between decode's and prefill's: {s:?}");
        assert!(near(s.union[1].1, 0.37), "union of 32 {s:?}");
        for (rank, want) in [(1, 0.149), (2, 0.108), (4, 0.077), (8, 0.055), (12, 0.043), (16, 0.032)] {
            assert!(near(s.weight_by_rank[rank - 1], want), "rank {rank}: {:?}", s.weight_by_rank);
        }
        assert!(near(s.lower_half_mass, 0.33), "{s:?}");
    }

    /// Usage is flat over many texts (hits come from reuse in time, not from a hot set): over 256
    /// texts the most used tenth of the experts takes close to a tenth of the activations.
    #[test]
    fn usage_is_flat_over_many_texts() {
        let mut counts = vec![0u64; 896];
        for seed in 0..256 {
            for r in &trace(128, 1, 100 + seed)[0] {
                r.experts.iter().for_each(|&e| counts[e as usize] += 1);
            }
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let share = counts[..90].iter().sum::<u64>() as f64 / counts.iter().sum::<u64>() as f64;
        // A uniform draw of 524,288 activations puts ~0.107 on its top tenth.
        assert!(share < 0.13, "top tenth share {share}");
    }

    /// The lookahead model recalls K3's share of the next layer's experts, and guesses no more
    /// than `top_k + margin`.
    #[test]
    fn the_lookahead_recalls_what_k3s_does() {
        let cfg = RouterConfig::new(896, 16);
        let p = K3Like::new(&cfg, 7);
        let (mut hit, mut total) = (0usize, 0usize);
        for t in 0..2000u64 {
            let row =
                RowContext { position: t, ids: [Some(t as u32 * 31), Some(3), None], segment_ids: [0; SEGMENT_PHASES] };
            let guess = p.predict(&cfg, 2, &row, 8);
            assert_eq!(guess.len(), 24);
            let mut truth = Routing::default();
            p.route(&cfg, 2, &row, &mut truth);
            hit += truth.experts.iter().filter(|e| guess.contains(e)).count();
            total += 16;
        }
        let recall = hit as f64 / total as f64;
        assert!((recall - LOOKAHEAD_RECALL).abs() < 0.02, "{recall}");
    }

    #[test]
    fn a_prefix_routes_the_same_and_another_text_differently() {
        let (a, b) = (trace(80, 2, 1), trace(80, 2, 2));
        assert_eq!(trace(80, 2, 1), a);
        assert_ne!(a[0][10].experts, b[0][10].experts);
    }
}
