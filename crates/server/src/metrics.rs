//! Counters for `GET /metrics`, in Prometheus' text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::histogram::{Histogram, LATENCY_BUCKETS, RecentRate, TOKEN_BUCKETS};
use crate::status::Status;

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
    /// Rows (prompt and generated tokens) run through the model.
    pub step_rows: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed_steps: AtomicU64,
    pub prompt_cache_lookups: AtomicU64,
    pub prompt_cache_hits: AtomicU64,
    pub prompt_cache_tokens_saved: AtomicU64,
    pub prompt_cache_bytes: AtomicU64,
    pub prompt_cache_ram_hits: AtomicU64,
    /// The disk tier's counters at the last step.
    pub disk: std::sync::Mutex<Option<k3_generate::cache::disk::DiskStats>>,
    /// Seconds from a request's arrival to its first token.
    pub ttft: Histogram,
    /// Seconds between a request's consecutive tokens.
    pub inter_token: Histogram,
    /// Seconds from a request's arrival to its end (requests that finished).
    pub latency: Histogram,
    /// Tokens generated, per second, over the last seconds.
    pub recent_tokens: RecentRate,
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
            cancelled: AtomicU64::new(0),
            failed_steps: AtomicU64::new(0),
            prompt_cache_lookups: AtomicU64::new(0),
            prompt_cache_hits: AtomicU64::new(0),
            prompt_cache_tokens_saved: AtomicU64::new(0),
            prompt_cache_bytes: AtomicU64::new(0),
            prompt_cache_ram_hits: AtomicU64::new(0),
            disk: std::sync::Mutex::new(None),
            ttft: Histogram::new(&LATENCY_BUCKETS),
            inter_token: Histogram::new(&TOKEN_BUCKETS),
            latency: Histogram::new(&LATENCY_BUCKETS),
            recent_tokens: RecentRate::new(),
        }
    }
}

impl Metrics {
    pub(crate) fn record_step(&self, sequences: usize, rows: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences.fetch_add(sequences as u64, Ordering::Relaxed);
        self.step_rows.fetch_add(rows as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_prompt_cache(&self, c: &mut k3_generate::cache::PromptCache) {
        self.prompt_cache_lookups.store(c.lookups, Ordering::Relaxed);
        self.prompt_cache_hits.store(c.hits, Ordering::Relaxed);
        self.prompt_cache_tokens_saved.store(c.tokens_saved, Ordering::Relaxed);
        self.prompt_cache_bytes.store(c.used() as u64, Ordering::Relaxed);
        self.prompt_cache_ram_hits.store(c.ram_hits, Ordering::Relaxed);
        if let Ok(mut d) = self.disk.lock() {
            *d = c.disk_stats();
        }
    }

    /// The Prometheus exposition, with the scheduler's live state and the engine's cache counters.
    pub fn render(&self, status: &Status, cache: Option<k3_engine::CacheStats>) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let (c, g) = ("counter", "gauge");
        let mut rows: Vec<(&str, &str, &str, f64)> = vec![
            ("requests_total", c, "Completion requests accepted.", get(&self.requests)),
            ("requests_refused_total", c, "Requests refused because the queue was full.", get(&self.requests_refused)),
            ("requests_cancelled_total", c, "Requests whose client left before the end.", get(&self.cancelled)),
            ("prompt_tokens_total", c, "Prompt tokens prefilled.", get(&self.prompt_tokens)),
            ("completion_tokens_total", c, "Tokens generated.", get(&self.completion_tokens)),
            (
                "completion_tokens_per_second",
                g,
                "Tokens generated per second (all requests together) over the last 10 s.",
                self.recent_tokens.per_second(),
            ),
            (
                "completion_tokens_per_second_since_start",
                g,
                "Tokens generated per second since start, idle time included.",
                get(&self.completion_tokens) / secs,
            ),
            ("queue_depth", g, "Requests waiting to join the batch.", status.queued.load(Ordering::Relaxed) as f64),
            ("batch_size", g, "Sequences in the running batch.", status.active.load(Ordering::Relaxed) as f64),
            ("steps_total", c, "Forward steps run.", get(&self.steps)),
            ("step_rows_total", c, "Rows (prompt and generated tokens) run through the model.", get(&self.step_rows)),
            (
                "mean_batch_size",
                g,
                "Sequences per step, mean since start.",
                get(&self.step_sequences) / get(&self.steps).max(1.0),
            ),
            ("failed_steps_total", c, "Steps that failed (every sequence in them failed).", get(&self.failed_steps)),
            (
                "prompt_cache_lookups_total",
                c,
                "Requests looked up in the prompt cache.",
                get(&self.prompt_cache_lookups),
            ),
            ("prompt_cache_hits_total", c, "Requests that resumed a kept state.", get(&self.prompt_cache_hits)),
            (
                "prompt_cache_tokens_saved_total",
                c,
                "Prompt tokens not prefilled thanks to the prompt cache.",
                get(&self.prompt_cache_tokens_saved),
            ),
            ("prompt_cache_bytes", g, "Bytes of state the prompt cache keeps in RAM.", get(&self.prompt_cache_bytes)),
            (
                "prompt_cache_ram_hits_total",
                c,
                "Requests that resumed a state kept in RAM.",
                get(&self.prompt_cache_ram_hits),
            ),
        ];
        if let Some(d) = self.disk.lock().ok().and_then(|d| *d) {
            let disk: [(&str, &str, &str, f64); 8] = [
                ("prompt_cache_disk_hits_total", c, "Requests that resumed a state read from disk.", d.hits as f64),
                ("prompt_cache_disk_tokens_total", c, "Prompt tokens restored from disk.", d.tokens_restored as f64),
                ("prompt_cache_disk_bytes", g, "Bytes of the state files on disk.", d.bytes as f64),
                ("prompt_cache_disk_files", g, "State files on disk.", d.entries as f64),
                ("prompt_cache_disk_read_bytes_total", c, "Bytes of state files read back.", d.bytes_read as f64),
                ("prompt_cache_disk_written_bytes_total", c, "Bytes of state files written.", d.bytes_written as f64),
                ("prompt_cache_disk_refused_total", c, "State files found bad and ignored.", d.refused as f64),
                (
                    "prompt_cache_disk_skipped_total",
                    c,
                    "States not written (writer busy, too large, failed).",
                    d.skipped as f64,
                ),
            ];
            rows.extend(disk);
        }
        if let Some(cs) = cache {
            let lookups = (cs.hits + cs.misses).max(1) as f64;
            rows.push((
                "expert_cache_hit_rate",
                g,
                "Expert cache hits over lookups since start.",
                cs.hits as f64 / lookups,
            ));
            rows.push(("expert_bytes_read_total", c, "Expert bytes read from the drive.", cs.bytes_read as f64));
        }
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP k3_{name} {help}\n# TYPE k3_{name} {kind}\nk3_{name} {value}");
        }
        self.ttft.render(
            &mut out,
            "time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token.",
        );
        self.inter_token.render(&mut out, "inter_token_seconds", "Seconds between a request's consecutive tokens.");
        self.latency.render(
            &mut out,
            "request_seconds",
            "Seconds from a request's arrival to its end (finished ones).",
        );
        out
    }
}
