//! Calibration: the inputs each routed expert actually sees while the model reads text (the
//! engine's sampling tap, `k3_engine::tap`, keeps a uniform sample per expert with the
//! routing weight each was mixed in with), so a re-encoding can minimize the error that reaches
//! the outputs instead of the plain weight error.

use std::collections::HashMap;

use k3_engine::tap::{ExpertInputs, Sample, Samples};

/// Calibration for a conversion: each expert's sampled inputs, and per layer a pool for experts
/// the text never routed to.
#[derive(Debug, Default)]
pub struct Calibration {
    experts: Samples,
    layers: HashMap<u32, Sample>,
}

impl Calibration {
    /// From the samples of a run; each layer's pool takes up to `cap` inputs across its experts.
    pub fn new(experts: Samples, cap: usize) -> Self {
        let mut layers: HashMap<u32, Sample> = HashMap::new();
        let mut keys: Vec<&(u32, u32)> = experts.keys().collect();
        keys.sort();
        for key in keys {
            let s = &experts[key];
            let pool = layers.entry(key.0).or_insert_with(|| Sample {
                dim: s.dim,
                vectors: Vec::new(),
                gates: Vec::new(),
                seen: 0,
            });
            let room = cap.saturating_sub(pool.len()).min(s.len().div_ceil(4).max(1)).min(s.len());
            pool.vectors.extend_from_slice(&s.vectors[..room * s.dim]);
            pool.gates.extend_from_slice(&s.gates[..room]);
            pool.seen += s.seen;
        }
        Calibration { experts, layers }
    }

    /// The inputs to weight expert `(layer, expert)` with: its own when the text routed at least
    /// `min` inputs to it, else its layer's.
    pub fn inputs(&self, layer: u32, expert: u32, min: usize) -> Option<&Sample> {
        match self.experts.get(&(layer, expert)) {
            Some(s) if s.len() >= min => Some(s),
            _ => self.layers.get(&layer).filter(|s| !s.is_empty()),
        }
    }

    /// What a converted model records of its calibration: a hash of every expert's sample (and
    /// so of the text, the windows and the cap that chose it) with the counts, so that a
    /// conversion resumed with another calibration (or none) is refused, not mixed.
    pub fn provenance(&self) -> serde_json::Value {
        let mut keys: Vec<&(u32, u32)> = self.experts.keys().collect();
        keys.sort();
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for key in keys {
            let s = &self.experts[key];
            for v in [u64::from(key.0), u64::from(key.1), s.dim as u64, s.seen] {
                h.update(&v.to_le_bytes());
            }
            s.vectors.iter().chain(&s.gates).for_each(|v| h.update(&v.to_le_bytes()));
        }
        let (experts, inputs) = self.coverage();
        serde_json::json!({ "experts": experts, "inputs": inputs, "xxh3": format!("{:016x}", h.digest()) })
    }

    /// Experts with a sample of their own, and inputs sampled in all.
    pub fn coverage(&self) -> (usize, u64) {
        (self.experts.len(), self.experts.values().map(|s| s.seen).sum())
    }
}

/// The widest input a routed expert reads: its w1's columns (K3's latent width, the hidden size
/// elsewhere).
fn input_width(m: &k3_format::Manifest) -> u64 {
    let w1 = m.expert_layouts.iter().flat_map(|l| &l.matrices).filter(|t| t.name == "w1");
    w1.filter_map(|t| t.shape.get(1).copied()).max().unwrap_or(m.architecture.hidden)
}

/// The most memory a calibration run over `tokens` tokens keeping up to `cap` inputs per expert
/// can hold in samples: per MoE layer, every token's routed inputs or every expert's cap, whichever
/// is fewer, each `width` values and a gate.
fn sample_bytes(arch: &k3_format::Architecture, width: u64, tokens: usize, cap: usize) -> u64 {
    let per_layer = (tokens as u64 * u64::from(arch.experts_per_token)).min(u64::from(arch.experts) * cap as u64);
    arch.moe_layers.len() as u64 * per_layer * (width + 1) * 4
}

/// Refuses a run whose samples could take more than `limit` bytes, saying what would help: fewer
/// tokens or samples, or (when `limit` holds fewer inputs per expert than its input width, so its
/// second moments would be singular however the run is cut) no calibration.
fn check_memory(
    arch: &k3_format::Architecture,
    width: u64,
    tokens: usize,
    cap: usize,
    limit: u64,
) -> Result<(), String> {
    let need = sample_bytes(arch, width, tokens, cap);
    if need <= limit {
        return Ok(());
    }
    let fit = limit / (arch.moe_layers.len() as u64 * u64::from(arch.experts) * (width + 1) * 4).max(1);
    let advice = if fit < width {
        format!(
            "that holds {fit} inputs per expert, fewer than the {width} an expert's input statistics need: convert \
             this model without calibration (a model this size needs a calibration pass per layer, which k3 does \
             not have)"
        )
    } else {
        "calibrate on fewer tokens or fewer samples per expert".to_string()
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(format!(
        "calibrating on {tokens} tokens keeping up to {cap} inputs per expert can hold {:.1} GiB of samples, more \
         than the {:.1} GiB allowed (half of this machine's memory): {advice}",
        gib(need),
        gib(limit)
    ))
}

/// `tokens` of `ids` for calibration, as whole windows of `window` tokens spread evenly over the
/// whole text (its first and last window among them), not its first `tokens`: a text's opening
/// is one kind of text (a book's first chapters), and each expert's sample should be the inputs
/// the whole text gives it. All of `ids` when it is no longer than `tokens`.
pub fn spread(ids: &[u32], tokens: usize, window: usize) -> Vec<u32> {
    let window = window.max(1);
    if ids.len() <= tokens {
        return ids.to_vec();
    }
    let (count, whole) = (tokens.div_ceil(window), ids.len() / window);
    if count >= whole {
        return ids[..tokens].to_vec();
    }
    // Window starts at whole-window boundaries, evenly spaced from the first window to the last.
    let mut out = Vec::with_capacity(count * window);
    for i in 0..count {
        let w = if count == 1 { 0 } else { i * (whole - 1) / (count - 1) };
        out.extend_from_slice(&ids[w * window..(w + 1) * window]);
    }
    out.truncate(tokens);
    out
}

/// Runs `ids` through `model` in windows of `window` tokens (each from an empty state, as
/// `k3-cli perplexity` scores), sampling up to `cap` inputs of every routed expert on every core.
/// `progress(done, total)` after each window.
pub fn collect(
    model: &k3_format::Model,
    ids: &[u32],
    window: usize,
    cap: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Calibration, k3_engine::EngineError> {
    let m = model.manifest();
    if let Some(total) = k3_engine::budget::total_memory_bytes() {
        check_memory(&m.architecture, input_width(m), ids.len(), cap, total / 2)
            .map_err(k3_engine::EngineError::Input)?;
    }
    let inputs = std::sync::Arc::new(ExpertInputs::new(cap));
    let window = window.max(1);
    let opts = k3_engine::EngineOptions {
        calibrate: Some(inputs.clone()),
        context: window as u64,
        chunk: Some(window as u64),
        ..k3_engine::EngineOptions::default()
    };
    let engine = k3_engine::Engine::load_with(model, opts)?;
    for (i, w) in ids.chunks(window).enumerate() {
        engine.forward_last(&mut engine.session(), w)?;
        progress(((i + 1) * window).min(ids.len()), ids.len());
    }
    Ok(Calibration::new(inputs.take(), cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reservoir_keeps_the_cap_and_samples_the_whole_stream() {
        let inputs = ExpertInputs::new(10);
        let xs: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let gates: Vec<f32> = xs.iter().map(|x| x / 1000.0).collect();
        inputs.record((1, 2), &xs, &gates, 1);
        let s = inputs.take().remove(&(1, 2)).unwrap();
        assert_eq!((s.len(), s.seen), (10, 1000));
        // Each kept input keeps its own gate through the reservoir's replacements.
        assert!(s.vectors.iter().zip(&s.gates).all(|(x, g)| *g == x / 1000.0), "{:?} {:?}", s.vectors, s.gates);
        // Not just the first ten: a uniform sample of a 0..1000 stream has mean near 500.
        let mean = s.vectors.iter().sum::<f32>() / 10.0;
        assert!(mean > 150.0, "{:?}", s.vectors);
        let cal = Calibration::new(HashMap::from([((1, 2), s)]), 100);
        assert_eq!(cal.inputs(1, 2, 4).unwrap().len(), 10);
        assert_eq!(cal.inputs(1, 5, 4).unwrap().len(), 3, "an unrouted expert falls back to its layer's pool");
        assert!(cal.inputs(2, 0, 4).is_none());
    }

    #[test]
    fn sample_memory_is_bounded_and_checked() {
        let arch = |name: &str, experts, k, moe: u32| k3_format::Architecture {
            name: name.into(),
            layers: moe + 1,
            hidden: 1,
            vocab: 1,
            experts,
            experts_per_token: k,
            moe_layers: (1..=moe).collect(),
        };
        // The default model (3 MoE layers of 16 experts, top-4, 256 wide): 16 K tokens route
        // 65,536 inputs per layer, which 16 x 4,096 samples hold: 3 x 65,536 x 257 x 4 bytes.
        let default = arch("kimi_linear", 16, 4, 3);
        assert_eq!(sample_bytes(&default, 256, 16384, 4096), 3 * 65536 * 257 * 4);
        // With 1,024 samples the caps bind: 3 x 16,384 inputs.
        assert_eq!(sample_bytes(&default, 256, 16384, 1024), 3 * 16384 * 257 * 4);
        assert!(check_memory(&default, 256, 16384, 4096, 1 << 30).is_ok());
        // Too little room for these settings but enough for a smaller run: lower them.
        let err = check_memory(&default, 256, 16384, 4096, 100 << 20).unwrap_err();
        assert!(err.contains("fewer tokens or fewer samples"), "{err}");
        // K3 (92 MoE layers, 896 experts, top-16, experts reading the 3,584-wide latent) over
        // 16 K tokens: ~322 GiB. Half of a 64 GiB machine holds 29 inputs per expert, far below
        // the 3,584 its second moments need: no run of this design can calibrate it.
        let k3 = arch("kimi_k3", 896, 16, 92);
        assert_eq!(sample_bytes(&k3, 3584, 16384, 4096), 92 * 16384 * 16 * 3585 * 4);
        let err = check_memory(&k3, 3584, 16384, 4096, 32 << 30).unwrap_err();
        assert!(err.contains("holds 29 inputs per expert") && err.contains("without calibration"), "{err}");
    }

    /// The input width comes from the stored experts: tiny-k3's experts read its 128-wide latent,
    /// not the 256-wide hidden state.
    #[test]
    fn the_input_width_is_the_experts_own() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny-k3.waste");
        let model = k3_format::Model::open(dir).unwrap();
        assert_eq!((input_width(model.manifest()), model.manifest().architecture.hidden), (128, 256));
    }

    #[test]
    fn calibration_windows_spread_over_the_whole_text() {
        let ids: Vec<u32> = (0..1000).collect();
        let got = spread(&ids, 40, 10);
        // Four whole windows of ten, the first and the last of the text's 100 among them, evenly
        // spaced (0, 33, 66, 99).
        let want: Vec<u32> = [0, 330, 660, 990].iter().flat_map(|&s| s..s + 10).collect();
        assert_eq!(got, want);
        // A request for a partial window ends mid-window; a short text is taken whole.
        assert_eq!(spread(&ids, 15, 10), [(0..10).collect::<Vec<u32>>(), (990..995).collect()].concat());
        assert_eq!(spread(&ids[..30], 40, 10), ids[..30]);
        // More windows than the text holds whole: its opening, as before.
        assert_eq!(spread(&ids[..25], 20, 10), ids[..20]);
    }
}
