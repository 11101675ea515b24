//! How an engine runs: the switches of `k3-cli`, and what the memory plan must cover.

use k3_io::Policy;
use k3_quant::Matrix;

#[derive(Clone)]
pub struct EngineOptions {
    /// Total memory to live within (trunk, attention state, activations, expert cache, I/O buffers).
    pub mem_budget: Option<u64>,
    /// Compute while expert reads are in flight (off: read, then compute).
    pub overlap: bool,
    /// Prefetch the next layer's predicted experts.
    pub lookahead: bool,
    /// After a warm-up, a layer's prefetch continues only while at least this fraction of the
    /// guesses it would prefetch (the best top-k / 2 per token) turn out chosen (0 = always).
    pub lookahead_min_precision: f64,
    /// Also measure the after-MoE and previous-token predictors (an extra router pass per layer
    /// and token: for `k3-cli lookahead` and benchmarks, off on the decode path).
    pub lookahead_stats: bool,
    pub policy: Policy,
    /// Give up a cached expert of the layer holding the most slots, so each layer keeps its
    /// share (off: the policy over the whole cache). docs/EFFICIENCY.md measures both.
    pub cache_layer_shares: bool,
    /// Top-k reduction: each token uses only its `n` heaviest routed experts (fewer reads), their
    /// weights scaled to the total of all it chose. Changes results: `None` (off) by default.
    pub experts_per_token: Option<usize>,
    /// Each token keeps its heaviest routed experts until they carry this share of its routing
    /// weight. Changes results: `None` (off) by default.
    pub expert_top_p: Option<f32>,
    /// Low-bit copies of, or deferral of, each token's lightest experts: measured for their
    /// cost (`k3-cli perplexity`), not offered for generation. Nothing by default.
    pub approx: super::ExpertApprox,
    /// HOBBIT: low-bit copies read instead of a light expert's record on a miss. Changes results:
    /// `None` (off) by default.
    pub low_bit_copies: Option<super::LowBitCopies>,
    /// Cache-aware routing: each token's `n` lightest routed experts that the cache does not
    /// hold are swapped for the best-scored runners-up it does hold. Changes results: `None`
    /// (off) by default.
    pub cache_aware: Option<usize>,
    /// Reads in flight at once.
    pub queue_depth: usize,
    /// Tokens of context the memory plan reserves MLA cache for (sessions reserve it up front).
    pub context: u64,
    /// Sessions held at once (a server's batch): the plan reserves attention state for each.
    pub sequences: u64,
    /// The most tokens the caller passes to one `forward` call: the plan reserves their
    /// activations. `None`: the plan picks it (small when every expert fits in the cache, large
    /// when they stream from disk: `Engine::prefill_chunk`).
    pub chunk: Option<u64>,
    /// Memory the caller keeps beside the engine (the logits it collects, say), for the plan.
    pub reserved_bytes: u64,
    /// Compute threads (0: one per core). The reader's I/O thread and the calling thread come on
    /// top; results are the same bits for any number.
    pub threads: usize,
    /// Which integer-encoded matrices (int8/int4 trunk, int4/MXFP4 experts) round their inputs
    /// to int8 (32-value blocks, integer dot products where the CPU has VNNI). `Exact` is the
    /// default and what every comparison with a reference uses; the others' cost is measured in
    /// docs/EFFICIENCY.md.
    pub activations: ActivationPrecision,
    /// Check every trunk tensor's checksum when loading (on every core). Off only for a model
    /// that was verified before (`k3-cli verify`) and has not been touched since.
    pub verify_trunk: bool,
    /// When set, every routed expert's inputs are sampled into it (a calibration run).
    pub calibrate: Option<std::sync::Arc<crate::model::tap::ExpertInputs>>,
    #[doc(hidden)]
    pub fault: Option<k3_io::reader::FaultHook>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            mem_budget: None,
            overlap: true,
            lookahead: true,
            lookahead_min_precision: 0.8,
            lookahead_stats: false,
            policy: Policy::Lfru,
            cache_layer_shares: true,
            experts_per_token: None,
            expert_top_p: None,
            approx: super::ExpertApprox::default(),
            low_bit_copies: None,
            cache_aware: None,
            queue_depth: 32,
            context: 4096,
            sequences: 1,
            chunk: None,
            reserved_bytes: 0,
            threads: 0,
            activations: ActivationPrecision::Exact,
            verify_trunk: true,
            calibrate: None,
            fault: None,
        }
    }
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("mem_budget", &self.mem_budget)
            .field("overlap", &self.overlap)
            .field("lookahead", &self.lookahead)
            .field("policy", &self.policy)
            .field("context", &self.context)
            .field("sequences", &self.sequences)
            .field("chunk", &self.chunk)
            .field("threads", &self.threads)
            .field("verify_trunk", &self.verify_trunk)
            .finish_non_exhaustive()
    }
}

/// Where the engine multiplies rounded activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationPrecision {
    /// f32 everywhere.
    #[default]
    Exact,
    /// The routed experts only, on int8: nearly all of a MoE prefill's arithmetic, and on the
    /// default model a mean KL of 4e-5 nats against exact (the trunk's attention and dense MLPs
    /// cost 7x more KL for a small share of the work).
    Experts,
    /// The experts as [`Experts`](Self::Experts) (those without an int8 kernel, bf16 ones, on
    /// bf16), and the trunk's products of a batch (prefill chunks, drafts scored) on bf16: rounding
    /// each value to 8 significant bits costs far less than int8 blocks. A decode step's lone
    /// vector stays exact in the trunk.
    Bf16Trunk,
    /// Every integer-encoded matrix, trunk included, on int8.
    All,
}

impl ActivationPrecision {
    /// The precision of the routed experts' products.
    pub fn experts(self) -> k3_quant::Activations {
        if self == ActivationPrecision::Exact { k3_quant::Activations::Exact } else { k3_quant::Activations::Int8 }
    }

    /// An expert matrix at this precision: int8 where its encoding has an int8 kernel, and under
    /// [`Bf16Trunk`](Self::Bf16Trunk) bf16 batches where it has none.
    pub(crate) fn for_experts(self, m: Matrix<'_>) -> Matrix<'_> {
        let m = m.with_activations(self.experts());
        if self == ActivationPrecision::Bf16Trunk && !m.takes_q8() {
            m.with_activations(k3_quant::Activations::Bf16)
        } else {
            m
        }
    }

    /// The precision of the trunk's products.
    pub fn trunk(self) -> k3_quant::Activations {
        match self {
            ActivationPrecision::All => k3_quant::Activations::Int8,
            ActivationPrecision::Bf16Trunk => k3_quant::Activations::Bf16,
            ActivationPrecision::Exact | ActivationPrecision::Experts => k3_quant::Activations::Exact,
        }
    }

    /// The precision of the output head's product (the logits): as the trunk's, except under
    /// [`Bf16Trunk`](Self::Bf16Trunk), whose logits stay exact.
    pub fn head(self) -> k3_quant::Activations {
        match self {
            ActivationPrecision::Bf16Trunk => k3_quant::Activations::Exact,
            other => other.trunk(),
        }
    }

    /// Every precision, in the order `--activations` lists them.
    pub const ALL: [Self; 4] = [
        ActivationPrecision::Exact,
        ActivationPrecision::Experts,
        ActivationPrecision::Bf16Trunk,
        ActivationPrecision::All,
    ];

    /// The names `--activations` takes.
    pub const NAMES: [&str; 4] = [Self::ALL[0].name(), Self::ALL[1].name(), Self::ALL[2].name(), Self::ALL[3].name()];

    pub const fn name(self) -> &'static str {
        match self {
            ActivationPrecision::Exact => "exact",
            ActivationPrecision::Experts => "int8-experts",
            ActivationPrecision::Bf16Trunk => "bf16-trunk",
            ActivationPrecision::All => "int8",
        }
    }
}

impl std::str::FromStr for ActivationPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("`{s}` is not an activation precision (one of {})", Self::NAMES.join(", ")))
    }
}
