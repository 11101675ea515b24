//! Rotary position embedding of MLA's rope dims as DeepSeek-V3 / Kimi K2 use it: interleaved
//! pairs `(2i, 2i+1)` turned by `pos * inv_freq[i]` (transformers de-interleaves first and rotates
//! halves: the same dot products), with YaRN's blend of interpolated and extrapolated frequencies,
//! its attention factor on cos/sin and `mscale(factor, mscale_all_dim)^2` on the softmax scale,
//! all as transformers 5.24 computes them (in f64 here).

/// Rotary embedding of the rope dims (interleaved pairs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub yarn: Option<Yarn>,
}

/// YaRN context extension, as `rope_scaling` spells it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub original_max_positions: u64,
}

/// `0.1 m ln(scale) + 1` above scale 1.
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 }
}

/// A rope's tables: per pair its inverse frequency, the factor on cos/sin, and the factor on
/// the softmax scale.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RopeTable {
    inv_freq: Vec<f64>,
    attention_factor: f64,
    pub(crate) softmax_factor: f64,
}

impl RopeTable {
    /// As transformers' `_compute_yarn_parameters` (truncated correction range) and
    /// `DeepseekV3Attention` (the softmax factor) compute them, in f64.
    pub(crate) fn new(rope: &Rope, dim: usize) -> Self {
        let d = dim as f64;
        let pos_freqs: Vec<f64> = (0..dim / 2).map(|i| rope.theta.powf((2 * i) as f64 / d)).collect();
        let Some(y) = rope.yarn else {
            return RopeTable {
                inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
                attention_factor: 1.0,
                softmax_factor: 1.0,
            };
        };
        let correction = |rotations: f64| {
            d * (y.original_max_positions as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * rope.theta.ln())
        };
        let low = correction(y.beta_fast).floor().max(0.0);
        let mut high = correction(y.beta_slow).ceil().min(d - 1.0);
        if low == high {
            high += 0.001;
        }
        let inv_freq = pos_freqs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let extrapolate = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                (1.0 / (y.factor * p)) * (1.0 - extrapolate) + (1.0 / p) * extrapolate
            })
            .collect();
        let attention_factor = match (y.mscale.filter(|m| *m != 0.0), y.mscale_all_dim.filter(|m| *m != 0.0)) {
            (Some(m), Some(all)) => yarn_mscale(y.factor, m) / yarn_mscale(y.factor, all),
            _ => yarn_mscale(y.factor, 1.0),
        };
        let softmax_factor = match y.mscale_all_dim.filter(|m| *m != 0.0) {
            Some(all) => yarn_mscale(y.factor, all).powi(2),
            None => 1.0,
        };
        RopeTable { inv_freq, attention_factor, softmax_factor }
    }

    /// Each pair's `(cos, sin)` at position `pos`, scaled by the attention factor, appended to
    /// `out`: computed once per position for its key and every head's query.
    pub(crate) fn turns(&self, pos: usize, out: &mut Vec<(f32, f32)>) {
        out.extend(self.inv_freq.iter().map(|f| {
            let (sin, cos) = (pos as f64 * f).sin_cos();
            ((cos * self.attention_factor) as f32, (sin * self.attention_factor) as f32)
        }));
    }
}

/// Turns interleaved pairs of `v` by `turns` (from [`RopeTable::turns`]).
pub(crate) fn rotate(v: &mut [f32], turns: &[(f32, f32)]) {
    for (pair, &(c, s)) in v.chunks_exact_mut(2).zip(turns) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = b * c + a * s;
    }
}
