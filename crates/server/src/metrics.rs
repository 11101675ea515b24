//! Counters for `GET /metrics`, in Prometheus' text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::scheduler::Status;

/// Everything counted since the server started.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    pub requests: AtomicU64,
    pub requests_refused: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub steps: AtomicU64,
    /// Sequences summed over steps (over `steps`: the mean batch size).
    pub step_sequences: AtomicU64,
    pub step_rows: AtomicU64,
    pub last_batch: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed_steps: AtomicU64,
    pub prefix_lookups: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub prefix_tokens_saved: AtomicU64,
    pub prefix_bytes: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            requests: AtomicU64::new(0),
            requests_refused: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            steps: AtomicU64::new(0),
            step_sequences: AtomicU64::new(0),
            step_rows: AtomicU64::new(0),
            last_batch: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed_steps: AtomicU64::new(0),
            prefix_lookups: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_tokens_saved: AtomicU64::new(0),
            prefix_bytes: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    pub(crate) fn record_step(&self, sequences: usize, rows: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Ordering::Relaxed);
        self.step_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.last_batch.store(sequences as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_prefix(&self, c: &crate::prefix::PrefixCache) {
        self.prefix_lookups.store(c.lookups, Ordering::Relaxed);
        self.prefix_hits.store(c.hits, Ordering::Relaxed);
        self.prefix_tokens_saved.store(c.tokens_saved, Ordering::Relaxed);
        self.prefix_bytes.store(c.used() as u64, Ordering::Relaxed);
    }

    /// The Prometheus exposition, with the scheduler's live state and the engine's cache counters.
    pub fn render(&self, status: &Status, cache: Option<k3_engine::CacheStats>) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let steps = get(&self.steps);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP k3_{name} {help}\n# TYPE k3_{name} {kind}\nk3_{name} {value}");
        };
        metric("requests_total", "counter", "Completion requests accepted.", get(&self.requests) as f64);
        metric(
            "requests_refused_total",
            "counter",
            "Requests refused because the queue was full.",
            get(&self.requests_refused) as f64,
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests whose client left before the end.",
            get(&self.cancelled) as f64,
        );
        metric("prompt_tokens_total", "counter", "Prompt tokens prefilled.", get(&self.prompt_tokens) as f64);
        metric("completion_tokens_total", "counter", "Tokens generated.", get(&self.completion_tokens) as f64);
        metric(
            "completion_tokens_per_second",
            "gauge",
            "Tokens generated per second since start.",
            get(&self.completion_tokens) as f64 / secs,
        );
        metric(
            "queue_depth",
            "gauge",
            "Requests waiting to join the batch.",
            status.queued.load(Ordering::Relaxed) as f64,
        );
        metric("batch_size", "gauge", "Sequences in the running batch.", status.active.load(Ordering::Relaxed) as f64);
        metric("steps_total", "counter", "Forward steps run.", steps as f64);
        metric(
            "mean_batch_size",
            "gauge",
            "Sequences per step, mean since start.",
            get(&self.step_sequences) as f64 / steps.max(1) as f64,
        );
        metric(
            "failed_steps_total",
            "counter",
            "Steps that failed (every sequence in them failed).",
            get(&self.failed_steps) as f64,
        );
        metric(
            "prefix_cache_lookups_total",
            "counter",
            "Requests looked up in the prefix cache.",
            get(&self.prefix_lookups) as f64,
        );
        metric(
            "prefix_cache_hits_total",
            "counter",
            "Requests that resumed a kept state.",
            get(&self.prefix_hits) as f64,
        );
        metric(
            "prefix_cache_tokens_saved_total",
            "counter",
            "Prompt tokens not prefilled thanks to the prefix cache.",
            get(&self.prefix_tokens_saved) as f64,
        );
        metric("prefix_cache_bytes", "gauge", "Bytes of state the prefix cache keeps.", get(&self.prefix_bytes) as f64);
        if let Some(c) = cache {
            let lookups = (c.hits + c.misses).max(1);
            metric(
                "expert_cache_hit_rate",
                "gauge",
                "Expert cache hits over lookups since start.",
                c.hits as f64 / lookups as f64,
            );
            metric("expert_bytes_read_total", "counter", "Expert bytes read from the drive.", c.bytes_read as f64);
        }
        out
    }
}
