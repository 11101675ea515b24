//! Two approximations of the routed experts that k3 measures but does not offer for generation
//! (issue #37): HOBBIT's low-bit copies (a token's light experts computed from a rounded copy,
//! which a cache miss would read instead of the record) and KTransformers' Expert Deferral (a
//! token's light experts added one layer late, so their reads could overlap the next layer's
//! attention). Both change results. Here they change only the arithmetic, not what is read or
//! when, so `k3-cli perplexity` can say what each costs in quality; docs/EFFICIENCY.md has the
//! numbers and why neither is a switch of the decode path.

use std::sync::Arc;

use k3_format::Model;
use k3_quant::Matrix;
use k3_router::Routing;

use crate::EngineError;
use crate::config::ModelConfig;

/// HOBBIT's low-bit copies made in memory, for measuring: each token's `experts` lightest routed
/// experts computed from their matrices rounded to `bits`-bit integers (groups of 32 along a
/// row, f16 scales). [`LowBitCopies`] are the ones a converted model holds, read on misses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundedCopies {
    pub experts: usize,
    pub bits: u32,
}

/// What the routed experts' arithmetic approximates; nothing by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExpertApprox {
    pub low_bit_copies: Option<RoundedCopies>,
    /// Expert Deferral: each token's `defer` lightest routed experts' sum is added to the
    /// residual stream at the end of the next layer (the last layer defers nothing).
    pub defer: usize,
}

impl ExpertApprox {
    pub fn is_none(&self) -> bool {
        self.low_bit_copies.is_none() && self.defer == 0
    }

    /// Refuses values the model cannot take: at least one expert a token stays exact and on
    /// time, and a copy has 2 to 8 bits.
    pub(crate) fn check(&self, cfg: &ModelConfig) -> Result<(), EngineError> {
        if self.is_none() {
            return Ok(());
        }
        if let Some(lb) = self.low_bit_copies {
            light_experts(cfg, "low-bit experts", lb.experts)?;
            if !(2..=8).contains(&lb.bits) {
                return Err(EngineError::Config(format!("low-bit copies of {} bits: give 2 to 8", lb.bits)));
            }
        }
        if self.defer > 0 {
            light_experts(cfg, "deferred experts", self.defer)?;
        }
        Ok(())
    }

    /// A short text for a state's fingerprint (empty when nothing is approximated).
    pub(crate) fn describe(&self) -> String {
        let mut s = String::new();
        if let Some(lb) = self.low_bit_copies {
            // The fingerprint's bytes as before the field's name changed: saved states stay valid.
            s += &format!("low_bit={}x{}", lb.experts, lb.bits);
        }
        if self.defer > 0 {
            s += &format!("defer={}", self.defer);
        }
        s
    }
}

/// HOBBIT's low-bit copies in the decode path: a second model holding them for every routed expert
/// (`convert --experts int2`); an expert that is among the `experts` lightest of every token of
/// the step that chose it, and is neither cached nor on its way, is read from its copy instead.
/// Changes results, and they then depend on what the cache holds.
#[derive(Debug, Clone)]
pub struct LowBitCopies {
    pub model: Arc<Model>,
    pub experts: usize,
}

/// A cache key's flag for a low-bit copy: `(layer, expert | LOW_BIT)`.
pub(crate) const LOW_BIT: u32 = 1 << 31;

impl LowBitCopies {
    /// Refuses copies of another model: the architecture and each expert matrix's name and
    /// shape must be the model's, and `experts` leave at least one expert a token read whole.
    pub(crate) fn check(&self, model: &Model, cfg: &ModelConfig) -> Result<(), EngineError> {
        let (a, b) = (&model.manifest().architecture, &self.model.manifest().architecture);
        let fields = [
            ("layers", a.layers.to_string(), b.layers.to_string()),
            ("hidden", a.hidden.to_string(), b.hidden.to_string()),
            ("experts", a.experts.to_string(), b.experts.to_string()),
            ("moe_layers", format!("{:?}", a.moe_layers), format!("{:?}", b.moe_layers)),
        ];
        for (what, mine, theirs) in fields {
            if mine != theirs {
                return Err(EngineError::Config(format!(
                    "low-bit copies: their {what} is {theirs}, the model's {mine}: copies of another model"
                )));
            }
        }
        let shapes = |m: &Model| -> Vec<(String, Vec<u64>)> {
            m.manifest()
                .expert_layouts
                .iter()
                .flat_map(|l| l.matrices.iter().map(|t| (t.name.clone(), t.shape.clone())))
                .collect()
        };
        let (mine, theirs) = (shapes(model), shapes(&self.model));
        if let Some((n, s)) = mine.iter().find(|m| !theirs.contains(m)) {
            return Err(EngineError::Config(format!("low-bit copies hold no expert matrix `{n}` of shape {s:?}")));
        }
        light_experts(cfg, "low-bit experts", self.experts)
    }
}

/// Refuses a count of each token's lightest experts (`what`: the option's name) that the model
/// cannot take: 1 to k - 1 of the k it uses (after top-k reduction), so the heaviest stays as it
/// was.
pub(crate) fn light_experts(cfg: &ModelConfig, what: &str, n: usize) -> Result<(), EngineError> {
    let Some(moe) = cfg.moe.as_ref() else {
        return Err(EngineError::Config(format!("{what} {n} was given, but the model has no routed experts")));
    };
    let k = moe.keep.unwrap_or(moe.top_k).min(moe.top_k);
    if n == 0 || n >= k {
        return Err(EngineError::Config(format!(
            "{what} {n}: each token uses {k} routed experts here; give 1 to {} (its heaviest stays as it is)",
            k.saturating_sub(1)
        )));
    }
    Ok(())
}

/// Which of a token's routed experts are its `n` lightest: by weight, and of equal weights the
/// higher expert id (the order `k3_router::trim` keeps them in, reversed).
pub(crate) fn lightest(r: &Routing, n: usize) -> Vec<bool> {
    let mut order: Vec<usize> = (0..r.experts.len()).collect();
    order.sort_by(|&a, &b| r.weights[a].total_cmp(&r.weights[b]).then(r.experts[b].cmp(&r.experts[a])));
    let mut light = vec![false; r.experts.len()];
    order.iter().take(n).for_each(|&i| light[i] = true);
    light
}

/// `m`'s values rounded to `bits`-bit integers in groups along each row (32, or the largest of
/// 16 and 8 that divides a row), one f16 scale a group, as `[rows, cols]` f32.
///
/// The values are read back through the matrix's own product (each column is `W e_j`), so any
/// encoding, a VQ rotation included, yields what its products compute.
pub(crate) fn low_bit_copy(m: &Matrix<'_>, bits: u32) -> Vec<f32> {
    let (rows, cols) = (m.rows(), m.cols());
    let mut eye = vec![0f32; cols * cols];
    (0..cols).for_each(|j| eye[j * cols + j] = 1.0);
    let mut columns = vec![0f32; cols * rows];
    m.matmul(&eye, &mut columns);
    let mut w = vec![0f32; rows * cols];
    for (j, col) in columns.chunks_exact(rows).enumerate() {
        col.iter().enumerate().for_each(|(i, v)| w[i * cols + j] = *v);
    }
    let group = [32, 16, 8].into_iter().find(|g| cols.is_multiple_of(*g)).unwrap_or(cols);
    k3_quant::rtn::roundtrip(&w, cols, bits, group, k3_quant::rtn::Scale::Few)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lightest_are_by_weight_then_the_higher_id() {
        let r = Routing { experts: vec![7, 3, 9, 1], weights: vec![0.4, 0.1, 0.1, 0.4] };
        assert_eq!(lightest(&r, 1), [false, false, true, false]);
        assert_eq!(lightest(&r, 2), [false, true, true, false]);
        assert_eq!(lightest(&r, 3), [true, true, true, false]);
    }

    #[test]
    fn a_copy_reads_back_the_matrix_and_rounds_it() {
        // 2 x 32: one group a row. 8 bits keep these values within half a step; 2 bits leave
        // four levels.
        let w: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) / 16.0).collect();
        let m = Matrix::f32(&w, 2, 32).unwrap();
        let fine = low_bit_copy(&m, 8);
        let step = 11.0 / 16.0 / 127.0;
        assert!(w.iter().zip(&fine).all(|(a, b)| (a - b).abs() <= step));
        let coarse = low_bit_copy(&m, 2);
        for row in coarse.chunks(32) {
            let mut levels: Vec<i64> = row.iter().map(|v| (v * 1e4).round() as i64).collect();
            levels.sort_unstable();
            levels.dedup();
            assert!(levels.len() <= 4, "{levels:?}");
        }
    }
}
