//! Predicting the next layer's experts, and measuring how well each predictor does.
//!
//! During layer l the disk would otherwise idle at the layer boundary; reading layer l+1's likely
//! experts early hides that time. Predictors:
//! - [`Predictor::AfterAttention`]: layer l+1's router applied to the hidden state available at
//!   the end of layer l's attention;
//! - [`Predictor::AfterMoe`]: the same on the state after layer l's MoE (later, but closer);
//! - [`Predictor::PreviousToken`]: the experts layer l+1 chose for the previous token (baseline).
//!
//! The engine computes the logits (it owns the norms and gate matrices); this module picks the
//! `top_k + margin` predicted experts and keeps per-layer statistics.

use crate::route::{RouterConfig, select};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Predictor {
    AfterAttention,
    AfterMoe,
    PreviousToken,
}

impl Predictor {
    pub const ALL: [Predictor; 3] = [Predictor::AfterAttention, Predictor::AfterMoe, Predictor::PreviousToken];

    pub fn name(self) -> &'static str {
        match self {
            Predictor::AfterAttention => "after-attention",
            Predictor::AfterMoe => "after-moe",
            Predictor::PreviousToken => "previous-token",
        }
    }
}

/// The predicted experts for a layer from logits of its router: `top_k + margin` by biased score.
pub fn predict(cfg: &RouterConfig, logits: &[f32], bias: &[f32], margin: usize) -> Vec<u32> {
    select(cfg, logits, bias, (cfg.top_k + margin).min(cfg.experts))
}

/// Counts for one (predictor, layer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub tokens: u64,
    /// Predicted experts that the layer then chose.
    pub hits: u64,
    /// Experts the layer chose.
    pub chosen: u64,
    /// Predicted experts it did not choose (reads that would be wasted).
    pub wasted: u64,
}

impl Counts {
    /// Fraction of the chosen experts that were predicted.
    pub fn recall(&self) -> f64 {
        if self.chosen == 0 { 0.0 } else { self.hits as f64 / self.chosen as f64 }
    }

    /// Wasted predictions per token.
    pub fn wasted_per_token(&self) -> f64 {
        if self.tokens == 0 { 0.0 } else { self.wasted as f64 / self.tokens as f64 }
    }
}

/// Per-layer statistics for every predictor.
#[derive(Debug, Clone, Default)]
pub struct LookaheadStats {
    layers: Vec<[Counts; 3]>,
}

impl LookaheadStats {
    pub fn new(layers: usize) -> Self {
        LookaheadStats { layers: vec![[Counts::default(); 3]; layers] }
    }

    /// Records that `predictor` predicted `predicted` for `layer`, which then chose `chosen`.
    pub fn record(&mut self, predictor: Predictor, layer: usize, predicted: &[u32], chosen: &[u32]) {
        let c = &mut self.layers[layer][predictor as usize];
        let hits = chosen.iter().filter(|e| predicted.contains(e)).count() as u64;
        c.tokens += 1;
        c.hits += hits;
        c.chosen += chosen.len() as u64;
        c.wasted += predicted.len() as u64 - predicted.iter().filter(|e| chosen.contains(e)).count() as u64;
    }

    /// Counts for one layer (zero for a layer the statistics do not cover).
    pub fn counts(&self, predictor: Predictor, layer: usize) -> Counts {
        self.layers.get(layer).map_or(Counts::default(), |l| l[predictor as usize])
    }

    /// Counts over all layers.
    pub fn total(&self, predictor: Predictor) -> Counts {
        self.layers.iter().fold(Counts::default(), |mut a, l| {
            let c = l[predictor as usize];
            a.tokens += c.tokens;
            a.hits += c.hits;
            a.chosen += c.chosen;
            a.wasted += c.wasted;
            a
        })
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }
}
