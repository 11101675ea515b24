//! How an engine runs: the switches of `k3-cli`, and what the memory plan must cover.

use k3_io::Policy;

use super::activations::ActivationPrecision;

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
    /// Tokens of context the memory plan holds MLA cache for (sessions grow into it with use).
    pub context: u64,
    /// `context` is the most wanted: the plan lowers it to the model's own longest context
    /// (`max_position_embeddings`) and to what memory leaves beside the expert cache.
    pub fit_context: bool,
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
    /// How MLA caches store a position's latent and shared key (f32 as computed; bf16 or int8
    /// rows: 2x / ~3.6x the context in the same memory, values rounded once when appended; an
    /// int8 cache is attended in integers in the absorbed form). `None`: int8 where the run's
    /// (resolved) activation precision rounds products and the CPU has AVX2, f32 otherwise
    /// ([`ActivationPrecision::kv_cache`]), resolved at load. `Some(F32)` is the default.
    pub kv_cache: Option<k3_attn::KvCacheType>,
    /// Which form MLA prefill chunks run (`Auto`: absorbed for decode and short chunks, expanded
    /// for long ones, by their multiply-adds). The forms differ in the last bits (~1e-6; with an
    /// int8 cache by the absorbed form's rounded queries and weights, ~1e-5 nats of KL), so under
    /// `Auto` a prompt's bits depend on how it was cut into chunks; `Absorbed` gives every chunk
    /// the bits of stepping token by token. In a state file's fingerprint only with an int8
    /// cache: otherwise either form's states are the same values to float noise.
    pub mla_form: k3_attn::MlaForm,
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
            fit_context: false,
            sequences: 1,
            chunk: None,
            reserved_bytes: 0,
            threads: 0,
            activations: ActivationPrecision::Exact,
            kv_cache: Some(k3_attn::KvCacheType::F32),
            mla_form: k3_attn::MlaForm::Auto,
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
            .field("fit_context", &self.fit_context)
            .field("kv_cache", &self.kv_cache)
            .field("mla_form", &self.mla_form)
            .field("sequences", &self.sequences)
            .field("chunk", &self.chunk)
            .field("threads", &self.threads)
            .field("verify_trunk", &self.verify_trunk)
            .finish_non_exhaustive()
    }
}
