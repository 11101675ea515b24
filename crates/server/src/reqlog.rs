//! What the server says on standard error as it works: a line when the model is ready and one
//! per request (its id, prompt and cached tokens, time to first token, rate, how it ended), for a
//! person (`text`) or a program (`json`: one object a line).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::json;

use crate::job::{ModelInfo, Tally};
use crate::metrics::Metrics;

/// How the log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The model is loaded and requests are answered.
/// `asked`: the context the plan was asked for (the model's own longest, when it was fitted to
/// memory), said beside the context when memory lowered it.
pub(crate) fn ready(format: LogFormat, info: &ModelInfo, asked: u64, load_secs: f64) {
    let fitted = (asked > info.context).then_some(asked);
    match format {
        LogFormat::Text => eprintln!(
            "ready: `{}` ({}, {} layers, context {}{}) loaded in {load_secs:.1} s",
            info.id,
            info.family.name(),
            info.layers,
            info.context,
            fitted
                .map(|a| format!(" of the model's {a}: what memory leaves; --context or --mem to change"))
                .unwrap_or_default()
        ),
        LogFormat::Json => eprintln!(
            "{}",
            json!({"event": "ready", "model": info.id, "family": info.family.name(), "layers": info.layers,
                   "context": info.context, "context_wanted": fitted, "load_s": load_secs})
        ),
    }
}

/// Something a request asked for that the server did differently (a `num_ctx` clamped).
pub(crate) fn warning(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("warning: {message}"),
        LogFormat::Json => eprintln!("{}", json!({"event": "warning", "message": message})),
    }
}

/// One request's line, written when it ends (also when the client leaves before that).
#[derive(Debug)]
pub(crate) struct RequestLog {
    format: LogFormat,
    id: String,
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u64,
    said: bool,
    /// Where the times go into `/metrics`' histograms.
    metrics: Option<Arc<Metrics>>,
    tally: Arc<Tally>,
}

impl RequestLog {
    pub fn new(format: LogFormat, id: &str, metrics: Option<Arc<Metrics>>, tally: Arc<Tally>) -> Self {
        let started = Instant::now();
        let id = id.to_string();
        RequestLog { format, id, started, first: None, last: None, tokens: 0, said: false, metrics, tally }
    }

    /// A token came out.
    pub fn token(&mut self) {
        let now = Instant::now();
        if let Some(m) = &self.metrics {
            match self.last {
                None => m.ttft.observe(now.duration_since(self.started).as_secs_f64()),
                Some(last) => m.inter_token.observe(now.duration_since(last).as_secs_f64()),
            }
        }
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.tokens += 1;
    }

    /// The request ended: `finish` is its `finish_reason` (or why it did not finish). Counts the
    /// caller does not have (a failure's zeros) are the scheduler's tally.
    pub fn done(&mut self, finish: &str, prompt: usize, cached: usize, completion: u64) {
        self.said = true;
        let prompt = prompt.max(self.tally.prompt.load(Ordering::Relaxed));
        let cached = cached.max(self.tally.cached.load(Ordering::Relaxed));
        let completion = completion.max(self.tally.completion.load(Ordering::Relaxed));
        let total = self.started.elapsed().as_secs_f64();
        if let Some(m) = self.metrics.as_ref().filter(|_| !matches!(finish, "failed" | "cancelled")) {
            m.latency.observe(total);
        }
        let ttft = self.first.map(|f| f.duration_since(self.started).as_secs_f64());
        // The rate after the first token: what a reader of the stream sees.
        let rate = self
            .first
            .map(|f| f.elapsed().as_secs_f64())
            .filter(|s| *s > 0.0 && completion > 1)
            .map(|s| (completion - 1) as f64 / s);
        match self.format {
            LogFormat::Text => eprintln!(
                "{}: prompt {prompt} tokens ({cached} cached), first token {}, {completion} tokens{}, {total:.2} s, {finish}",
                self.id,
                ttft.map_or("-".into(), |t| format!("{t:.3} s")),
                rate.map_or(String::new(), |r| format!(" at {r:.1} tok/s")),
            ),
            LogFormat::Json => eprintln!(
                "{}",
                json!({"event": "request", "id": self.id, "prompt_tokens": prompt, "cached_tokens": cached,
                       "completion_tokens": completion, "ttft_s": ttft, "tokens_per_s": rate, "total_s": total,
                       "finish_reason": finish})
            ),
        }
    }
}

impl Drop for RequestLog {
    /// A request that never reached its end (it failed, or the client left) is said too.
    fn drop(&mut self) {
        if !self.said {
            let tokens = self.tokens;
            self.done("cancelled", 0, 0, tokens);
        }
    }
}
