//! What a run did: counters and, when asked, where a step's time went.

use k3_io::CacheStats;

/// What a stretch of a decode step was spent on (for the timeline of a step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Attention,
    /// Routing, latent projection, shared expert, the final sums.
    MoeOther,
    /// Blocked, waiting for an expert read.
    Wait,
    /// Computing with one expert.
    Expert(u32),
}

/// One stretch of time in a step, in seconds from the step's start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub layer: u32,
    pub kind: SpanKind,
    pub start: f64,
    pub end: f64,
}

/// Counters of a run (a session).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunStats {
    pub tokens: u64,
    pub seconds: f64,
    /// Time blocked waiting for expert reads.
    pub io_wait_seconds: f64,
    /// Time from a layer's first expert request to its last expert computed, summed.
    pub io_span_seconds: f64,
    pub expert_compute_seconds: f64,
    /// Distinct routed experts computed, summed over the MoE layers of every step this session
    /// was part of (a step's experts serve all of its rows, of every sequence in it).
    pub experts_computed: u64,
    /// Of those, computed from a low-bit copy (HOBBIT).
    pub experts_low_bit: u64,
    /// Routed experts swapped for cached runners-up (cache-aware routing).
    pub experts_rerouted: u64,
    /// Steps this session was part of.
    pub steps: u64,
    /// The engine's expert-cache counters after this session's last step (the cache is shared by
    /// every session of an engine, so these count from the engine's start).
    pub cache: CacheStats,
}

impl RunStats {
    /// Adds one step's expert I/O and compute times, its wall time and the cache counters after it.
    pub(crate) fn add_step(&mut self, step: &RunStats, seconds: f64, cache: Option<CacheStats>) {
        self.seconds += seconds;
        self.io_wait_seconds += step.io_wait_seconds;
        self.io_span_seconds += step.io_span_seconds;
        self.expert_compute_seconds += step.expert_compute_seconds;
        self.experts_computed += step.experts_computed;
        self.experts_low_bit += step.experts_low_bit;
        self.experts_rerouted += step.experts_rerouted;
        self.steps += 1;
        if let Some(c) = cache {
            self.cache = c;
        }
    }

    /// Adds a later session's times to these; the cache counters (cumulative per engine) are the
    /// later session's.
    pub fn accumulate(&mut self, later: &RunStats) {
        self.tokens += later.tokens;
        self.seconds += later.seconds;
        self.io_wait_seconds += later.io_wait_seconds;
        self.io_span_seconds += later.io_span_seconds;
        self.expert_compute_seconds += later.expert_compute_seconds;
        self.experts_computed += later.experts_computed;
        self.experts_low_bit += later.experts_low_bit;
        self.experts_rerouted += later.experts_rerouted;
        self.steps += later.steps;
        self.cache = later.cache;
    }
}
