//! Calibration: the inputs each routed expert actually sees while the source model reads text
//! (the engine's sampling tap, `k3_engine::tap`, keeps a uniform sample per expert with the
//! routing weight each was mixed in with), so a re-encoding can minimize the error that reaches
//! the outputs instead of the plain weight error.
//!
//! The model reads the text one layer at a time ([`Walker`], over the engine's `LayerWalk`):
//! between layers only the calibration tokens' boundary states are held, and each MoE layer's
//! samples only while that layer's experts are encoded. Memory: [`PeakMemory`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use k3_engine::tap::{ExpertInputs, Sample};

use k3_engine::{Engine, EngineError, LayerWalk};

/// Fewest inputs of its own an expert needs for them to count at all; below it, its layer's
/// pool stands in (a "fallback").
pub const MIN_OWN_INPUTS: usize = 16;

/// What a calibrated conversion runs: the source model (WASTE; the engine runs those), the
/// token ids it reads in windows from empty states, and the inputs kept per expert.
#[derive(Debug, Clone)]
pub struct CalibrationPlan {
    pub source: PathBuf,
    pub ids: Vec<u32>,
    pub window: usize,
    pub cap: usize,
}

impl CalibrationPlan {
    /// What a converted model records of its calibration: the ids' hash with the settings that
    /// chose each expert's sample (the reservoirs are seeded, so the same ids give the same
    /// samples), so a conversion resumed with another calibration, or none, is refused.
    pub fn provenance(&self) -> serde_json::Value {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        self.ids.iter().for_each(|t| h.update(&t.to_le_bytes()));
        serde_json::json!({
            "tokens": self.ids.len(),
            "window": self.window,
            "samples": self.cap,
            "ids_xxh3": format!("{:016x}", h.digest()),
            "pass": "layer at a time",
            "rule": format!("own inputs >= input width; fewer shrunk toward the layer's pool; under {MIN_OWN_INPUTS}: the pool"),
        })
    }

    fn windows(&self) -> Vec<Vec<u32>> {
        self.ids.chunks(self.window.max(1)).map(<[u32]>::to_vec).collect()
    }
}

/// How one MoE layer's experts were calibrated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LayerCalibration {
    pub layer: u32,
    /// Experts with at least an input width of inputs: weighted by their own.
    pub own: u32,
    /// Experts with fewer (but at least [`MIN_OWN_INPUTS`]): their own shrunk toward the pool.
    pub shrunk: u32,
    /// Experts with fewer than [`MIN_OWN_INPUTS`]: the layer's pool alone (the fallbacks).
    pub pooled: u32,
    /// Inputs the layer's experts saw (sampled or not).
    pub inputs: u64,
}

/// One MoE layer's calibration: each expert's sampled inputs and a pool of the layer's.
#[derive(Debug)]
pub struct Calibration {
    layer: u32,
    experts: HashMap<u32, Sample>,
    pool: Sample,
    /// Inputs an expert needs to be weighted by its own alone: the width they are.
    target: usize,
    report: LayerCalibration,
}

impl Calibration {
    /// Layer `layer`'s samples; its pool takes up to `cap` inputs across its experts, experts
    /// with fewer than `target` inputs are shrunk toward it.
    pub fn new(layer: u32, experts: HashMap<u32, Sample>, cap: usize, target: usize, all: u32) -> Self {
        let dim = experts.values().map(|s| s.dim).max().unwrap_or(0);
        let mut pool = Sample { dim, vectors: Vec::new(), gates: Vec::new(), seen: 0 };
        let mut keys: Vec<&u32> = experts.keys().collect();
        keys.sort();
        let mut report = LayerCalibration { layer, ..LayerCalibration::default() };
        for key in keys {
            let s = &experts[key];
            let room = cap.saturating_sub(pool.len()).min(s.len().div_ceil(4).max(1)).min(s.len());
            pool.vectors.extend_from_slice(&s.vectors[..room * s.dim]);
            pool.gates.extend_from_slice(&s.gates[..room]);
            pool.seen += s.seen;
            report.inputs += s.seen;
        }
        for e in 0..all {
            match experts.get(&e).map_or(0, Sample::len) {
                n if n >= target.max(MIN_OWN_INPUTS) => report.own += 1,
                n if n >= MIN_OWN_INPUTS => report.shrunk += 1,
                _ => report.pooled += 1,
            }
        }
        Calibration { layer, experts, pool, target, report }
    }

    pub fn layer(&self) -> u32 {
        self.layer
    }

    pub fn report(&self) -> LayerCalibration {
        self.report
    }

    /// The inputs to weight `expert` with (`None` if the layer saw none at all):
    /// - at least the input width of its own: those;
    /// - fewer, but at least [`MIN_OWN_INPUTS`]: its own and the pool's, gates scaled so that
    ///   their second moments are `(n/T) H_own + (1 - n/T) H_pool` (`n` its inputs, `T` the
    ///   width): a second-moment matrix from fewer inputs than its width is singular, and
    ///   shrinkage toward the layer's keeps what the expert's own say;
    /// - fewer still: the pool's.
    pub fn inputs(&self, expert: u32) -> Option<Cow<'_, Sample>> {
        let own = self.experts.get(&expert).filter(|s| s.len() >= MIN_OWN_INPUTS);
        let pool = (!self.pool.is_empty()).then_some(&self.pool);
        match (own, pool) {
            (Some(s), _) if s.len() >= self.target => Some(Cow::Borrowed(s)),
            (Some(s), Some(p)) => Some(Cow::Owned(shrink(s, p, self.target))),
            (Some(s), None) => Some(Cow::Borrowed(s)),
            (None, p) => p.map(Cow::Borrowed),
        }
    }
}

/// `own` and `pool` in one sample whose second moments are `(n/T) H_own + (1 - n/T) H_pool`:
/// over the `m = n + p` rows, own rows' gates scaled by `sqrt(m/T)`, the pool's by
/// `sqrt(m (T - n) / (T p))`.
fn shrink(own: &Sample, pool: &Sample, target: usize) -> Sample {
    let (n, p, t) = (own.len() as f64, pool.len() as f64, target as f64);
    let m = n + p;
    let (a, b) = ((m / t).sqrt() as f32, (m * (t - n) / (t * p)).sqrt() as f32);
    let mut vectors = own.vectors.clone();
    vectors.extend_from_slice(&pool.vectors);
    let mut gates: Vec<f32> = own.gates.iter().map(|g| g * a).collect();
    gates.extend(pool.gates.iter().map(|g| g * b));
    Sample { dim: own.dim, vectors, gates, seen: own.seen }
}

/// The widest input a routed expert reads: its w1's columns (K3's latent width, the hidden size
/// elsewhere).
fn input_width(m: &k3_format::Manifest) -> u64 {
    columns(m, "w1").unwrap_or(m.architecture.hidden)
}

/// The most columns expert matrix `name` has in any layout (its input's width).
fn columns(m: &k3_format::Manifest, name: &str) -> Option<u64> {
    let mats = m.expert_layouts.iter().flat_map(|l| &l.matrices).filter(|t| t.name == name);
    mats.filter_map(|t| t.shape.get(1).copied()).max()
}

/// The most one MoE layer's samples hold: every token's routed inputs or every expert's cap,
/// whichever is fewer, each `width` values and a gate, plus the pool's `cap`.
fn layer_sample_bytes(arch: &k3_format::Architecture, width: u64, tokens: u64, cap: u64) -> u64 {
    let per_layer = (tokens * u64::from(arch.experts_per_token)).min(u64::from(arch.experts) * cap);
    (per_layer + cap) * (width + 1) * 4
}

/// A calibrated conversion's peak memory, by part (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PeakMemory {
    /// The engine's own plan: trunk, expert cache (a quarter of the machine's memory at most),
    /// a step's activations for [`k3_engine::WALK_GROUP_ROWS`] rows.
    pub engine: u64,
    /// Every token's state between layers (`Engine::walk_bytes`).
    pub boundary: u64,
    /// One MoE layer's samples ([`layer_sample_bytes`]); all layers' at once (the old pass) were
    /// `moe_layers` times this.
    pub samples: u64,
    /// The experts encoded at once, each with its two prepared input sets: `H` in f64 and f32
    /// and GPTQ's f32 factor, 16 bytes per entry of the `width^2` and `mid^2` matrices.
    pub encoding: u64,
}

impl PeakMemory {
    pub fn total(&self) -> u64 {
        self.engine + self.boundary + self.samples + self.encoding
    }

    /// The encoding term for `in_flight` experts reading `width`-wide inputs with `mid`-wide
    /// activations.
    pub fn encoding_bytes(in_flight: u64, width: u64, mid: u64) -> u64 {
        in_flight * 16 * (width * width + mid * mid)
    }
}

/// Experts a conversion encodes at once (`write::experts`' batches).
pub fn experts_in_flight() -> u64 {
    2 * rayon::current_num_threads().max(1) as u64
}

/// The calibration pass over a source model: the walk, and the tap it samples through.
#[derive(Debug)]
pub struct Walker<'m> {
    engine: Engine<'m>,
    walk: LayerWalk,
    inputs: Arc<ExpertInputs>,
    cap: usize,
    width: usize,
    experts: u32,
    peak: PeakMemory,
}

impl<'m> Walker<'m> {
    /// The engine on `model` with the sampling tap, before the first layer; refused when its
    /// peak ([`PeakMemory`]) is over three quarters of this machine's memory.
    pub fn new(model: &'m k3_format::Model, plan: &CalibrationPlan) -> Result<Self, EngineError> {
        let m = model.manifest();
        let inputs = Arc::new(ExpertInputs::new(plan.cap));
        // The walk reads each expert once per group of rows: a cache buys it little, so it gets
        // a quarter of the machine's memory at most, the rest left to the samples and encoding.
        let machine = k3_engine::budget::total_memory_bytes();
        let opts = k3_engine::EngineOptions {
            calibrate: Some(inputs.clone()),
            mem_budget: machine.map(|t| t / 4),
            context: plan.window.max(1) as u64,
            chunk: Some(k3_engine::WALK_GROUP_ROWS as u64),
            ..k3_engine::EngineOptions::default()
        };
        let engine = Engine::load_with(model, opts)?;
        let width = input_width(m);
        let walk = engine.walk(plan.windows())?;
        let (tokens, cap) = (plan.ids.len() as u64, plan.cap as u64);
        let peak = PeakMemory {
            engine: engine.plan().total(),
            boundary: engine.walk_bytes(walk.rows() as u64),
            samples: layer_sample_bytes(&m.architecture, width, tokens, cap),
            encoding: PeakMemory::encoding_bytes(experts_in_flight(), width, columns(m, "w2").unwrap_or(0)),
        };
        if let Some(total) = machine
            && peak.total() > total / 4 * 3
        {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            return Err(EngineError::Input(format!(
                "calibrating on {} tokens keeping up to {} inputs per expert needs {:.1} GiB at its peak (the \
                 engine {:.1}, the tokens' states between layers {:.1}, one layer's samples {:.1}, the experts \
                 encoded at once {:.1}), more than the {:.1} GiB allowed (three quarters of this machine's \
                 memory): calibrate on fewer tokens or samples",
                plan.ids.len(),
                plan.cap,
                gib(peak.total()),
                gib(peak.engine),
                gib(peak.boundary),
                gib(peak.samples),
                gib(peak.encoding),
                gib(total / 4 * 3)
            )));
        }
        let experts = m.architecture.experts;
        Ok(Walker { engine, walk, inputs, cap: plan.cap, width: width as usize, experts, peak })
    }

    /// This walk's peak memory by part ([`PeakMemory`]), as checked when it was made.
    pub fn peak(&self) -> PeakMemory {
        self.peak
    }

    /// MoE layer `layer`'s calibration: the walk runs up to and through it (sampling only the
    /// layer it is on; earlier layers' samples are dropped as it passes them).
    pub fn layer(&mut self, layer: u32) -> Result<Calibration, EngineError> {
        if (layer as usize) < self.walk.layers_done() {
            return Err(EngineError::Input(format!("the calibration walk is past layer {layer}")));
        }
        loop {
            let li = self.engine.walk_layer(&mut self.walk)?;
            let samples = self.inputs.take();
            if li == layer as usize {
                let experts = samples.into_iter().filter(|((l, _), _)| *l == layer).map(|((_, e), s)| (e, s)).collect();
                return Ok(Calibration::new(layer, experts, self.cap, self.width, self.experts));
            }
        }
    }
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
        // Layer 1 of 8 experts: expert 2 has 10 inputs (under MIN_OWN_INPUTS: the pool stands in).
        let cal = Calibration::new(1, HashMap::from([(2, s)]), 100, 4, 8);
        assert_eq!(cal.inputs(2).unwrap().len(), 3, "too few of its own: the layer's pool (a quarter of 10)");
        assert_eq!(cal.inputs(5).unwrap().len(), 3, "an unrouted expert falls back to its layer's pool");
        assert_eq!(cal.report(), LayerCalibration { layer: 1, own: 0, shrunk: 0, pooled: 8, inputs: 1000 });
    }

    /// Own inputs at the width are used as they are; fewer are mixed with the pool so that the
    /// second moments are `(n/T) H_own + (1 - n/T) H_pool`.
    #[test]
    fn experts_with_few_inputs_are_shrunk_toward_the_pool() {
        let sample = |n: usize, v: f32| Sample { dim: 1, vectors: vec![v; n], gates: vec![1.0; n], seen: n as u64 };
        // Expert 0: 40 inputs of 1.0 (target 30: its own); expert 1: 20 inputs of 3.0 (shrunk).
        let cal = Calibration::new(0, HashMap::from([(0, sample(40, 1.0)), (1, sample(20, 3.0))]), 1000, 30, 3);
        assert!(matches!(cal.inputs(0), Some(Cow::Borrowed(s)) if s.len() == 40));
        let moment = |s: &Sample| -> f64 {
            s.vectors.iter().zip(&s.gates).map(|(x, g)| f64::from(g * x).powi(2)).sum::<f64>() / s.len() as f64
        };
        // The pool: 10 of expert 0's (1.0) and 5 of expert 1's (3.0): E[x^2] = (10 + 45) / 15.
        let pool = 55.0 / 15.0;
        let got = moment(&cal.inputs(1).unwrap());
        let want = (20.0 / 30.0) * 9.0 + (10.0 / 30.0) * pool;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        assert_eq!(cal.report(), LayerCalibration { layer: 0, own: 1, shrunk: 1, pooled: 1, inputs: 60 });
    }

    #[test]
    fn one_layer_of_samples_at_a_time() {
        let arch = |name: &str, experts, k, moe: u32| k3_format::Architecture {
            name: name.into(),
            layers: moe + 1,
            hidden: 1,
            vocab: 1,
            experts,
            experts_per_token: k,
            moe_layers: (1..=moe).collect(),
        };
        // The default model (16 experts, top-4, 256 wide): 16 K tokens route 65,536 inputs to a
        // layer, which 16 x 4,096 samples hold, plus the pool's 4,096.
        let default = arch("kimi_linear", 16, 4, 3);
        assert_eq!(layer_sample_bytes(&default, 256, 16384, 4096), (65536 + 4096) * 257 * 4);
        // K3 (896 experts, top-16, experts reading the 3,584-wide latent) over 16 K tokens: one
        // layer's samples 3.6 GiB (all 92 layers at once were ~322 GiB); its boundary (7,168 wide,
        // 8 AttnRes snapshots) 3.9 GiB: 7.5 GiB with 64 GB's room.
        let k3 = arch("kimi_k3", 896, 16, 92);
        let samples = layer_sample_bytes(&k3, 3584, 16384, 4096);
        assert_eq!(samples, (16384 * 16 + 4096) * 3585 * 4);
        let boundary = 16384 * 7168 * 4 * 9;
        assert!(boundary + samples < 8 << 30);
        // 32 experts in flight (16 cores) with their 3,584- and 3,072-wide inputs: 11.4 GB.
        assert_eq!(PeakMemory::encoding_bytes(32, 3584, 3072), 32 * 16 * (3584 * 3584 + 3072 * 3072));
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
