//! The MoE step's sampling tap for calibration: with [`ExpertInputs`] attached to
//! `EngineOptions::calibrate`, each routed expert's inputs and routing weights are kept as a
//! uniform sample per expert (reservoir sampling, seeded). What is done with them (re-encoding)
//! is conversion's business (`k3-convert`).

use std::collections::HashMap;
use std::sync::Mutex;

use k3_quant::rng::XorShift;

#[derive(Debug, Clone)]
pub struct Sample {
    pub dim: usize,
    /// Up to the cap, `[n, dim]`.
    pub vectors: Vec<f32>,
    /// `[n]`: the routing weight the expert's output for each input was scaled by. An expert's
    /// error reaches the residual stream scaled by it, so an input counts by its square.
    pub gates: Vec<f32>,
    /// Inputs seen (sampled or not).
    pub seen: u64,
}

impl Sample {
    pub fn len(&self) -> usize {
        self.vectors.len() / self.dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }
}

/// Samples by (layer, expert).
/// Each (layer, expert)'s sample.
pub type Samples = HashMap<(u32, u32), Sample>;

/// The sampled inputs of every routed expert, filled while the engine runs. Each expert's
/// reservoir draws from its own seeded generator, so its sample depends only on its own inputs
/// (not on the order workers finish in): a calibration run is repeatable.
#[derive(Debug)]
pub struct ExpertInputs {
    cap: usize,
    state: Mutex<HashMap<(u32, u32), (Sample, XorShift)>>,
}

impl ExpertInputs {
    /// Keeps up to `cap` inputs per expert.
    pub fn new(cap: usize) -> Self {
        ExpertInputs { cap: cap.max(1), state: Mutex::new(HashMap::new()) }
    }

    /// `xs` (`[n, dim]`): inputs expert `key` (layer, expert) was applied to, `gates` (`[n]`) the
    /// routing weights of its outputs.
    pub fn record(&self, key: (u32, u32), xs: &[f32], gates: &[f32], dim: usize) {
        debug_assert_eq!(xs.len(), gates.len() * dim, "one gate per input");
        // A panic elsewhere while this lock was held leaves the samples as they were: still usable.
        let mut map = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (s, rng) = map.entry(key).or_insert_with(|| {
            let seed = 0xCA11B ^ (u64::from(key.0) << 32 | u64::from(key.1));
            (Sample { dim, vectors: Vec::new(), gates: Vec::new(), seen: 0 }, XorShift::new(seed))
        });
        for (x, &g) in xs.chunks_exact(dim).zip(gates) {
            s.seen += 1;
            if s.len() < self.cap {
                s.vectors.extend_from_slice(x);
                s.gates.push(g);
            } else {
                // Reservoir sampling: every input seen so far equally likely to be kept.
                let j = (rng.next_u64() % s.seen) as usize;
                if j < self.cap {
                    s.vectors[j * dim..(j + 1) * dim].copy_from_slice(x);
                    s.gates[j] = g;
                }
            }
        }
    }

    /// The samples, by (layer, expert).
    pub fn take(&self) -> Samples {
        std::mem::take(&mut *self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
            .into_iter()
            .map(|(k, (s, _))| (k, s))
            .collect()
    }
}
