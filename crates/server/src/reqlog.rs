//! What the server says on standard error as it works: a line when the model is ready, one per
//! request (its id, prompt and cached tokens, time to first token, rate, how it ended) and,
//! while a long prompt is read, its progress every few seconds; for a person (`text`) or a
//! program (`json`: one object a line).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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

/// A progress line of a prompt being read at most this often, and not before it has taken this
/// long (a short prompt says only its request line).
const PREFILL_EVERY: Duration = Duration::from_secs(5);

/// A request's progress through its prompt (an agent's first request may hold 20-200k tokens:
/// minutes on a streaming model), said from the scheduler as chunks finish.
#[derive(Debug, Default)]
pub struct PrefillLog {
    /// `None`: says nothing (a job made without a request, in tests).
    said_as: Option<(LogFormat, String)>,
    /// When the scheduler began its prompt, and with how many tokens already kept.
    started: Option<(Instant, usize)>,
    said: Option<Instant>,
}

impl PrefillLog {
    pub(crate) fn new(format: LogFormat, id: &str) -> Self {
        PrefillLog { said_as: Some((format, id.to_string())), ..PrefillLog::default() }
    }

    /// The scheduler admitted the request, its kept state holding `cached` tokens.
    pub(crate) fn started(self, cached: usize) -> Self {
        PrefillLog { started: Some((Instant::now(), cached)), ..self }
    }

    /// `fed` of the `prompt`'s tokens are read.
    pub(crate) fn advanced(&mut self, fed: usize, prompt: usize) {
        let now = Instant::now();
        if let Some(line) = self.line_at(now, fed, prompt) {
            eprintln!("{line}");
            self.said = Some(now);
        }
    }

    /// The line due at `now`, if one is.
    fn line_at(&self, now: Instant, fed: usize, prompt: usize) -> Option<String> {
        let ((format, id), (started, cached)) = (self.said_as.as_ref()?, self.started?);
        let last = self.said.unwrap_or(started);
        if fed >= prompt || now.duration_since(last) < PREFILL_EVERY {
            return None;
        }
        let secs = now.duration_since(started).as_secs_f64();
        let rate = fed.saturating_sub(cached) as f64 / secs.max(1e-9);
        let eta = (prompt - fed) as f64 / rate.max(1e-9);
        Some(match format {
            LogFormat::Text => format!(
                "{id}: prompt {fed}/{prompt} tokens ({:.1}%), {rate:.1} tok/s, {secs:.0} s, ETA {eta:.0} s",
                100.0 * fed as f64 / prompt as f64
            ),
            LogFormat::Json => json!({"event": "prefill", "id": id, "prompt_tokens": prompt, "read_tokens": fed,
                                      "cached_tokens": cached, "tokens_per_s": rate, "elapsed_s": secs, "eta_s": eta})
            .to_string(),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_says_its_progress_every_few_seconds() {
        let t0 = Instant::now();
        let mut log = PrefillLog::new(LogFormat::Text, "chatcmpl-7");
        log.started = Some((t0, 1000));
        // Not before the first few seconds, nor at the prompt's end (the request line says it).
        assert_eq!(log.line_at(t0 + Duration::from_secs(4), 2000, 41_000), None);
        let line = log.line_at(t0 + Duration::from_secs(10), 5000, 41_000).unwrap();
        assert_eq!(line, "chatcmpl-7: prompt 5000/41000 tokens (12.2%), 400.0 tok/s, 10 s, ETA 90 s");
        assert_eq!(log.line_at(t0 + Duration::from_secs(60), 41_000, 41_000), None);
        log.said = Some(t0 + Duration::from_secs(10));
        assert_eq!(log.line_at(t0 + Duration::from_secs(12), 6000, 41_000), None);
        let mut json = PrefillLog::new(LogFormat::Json, "msg_1");
        json.started = Some((t0, 0));
        let v: serde_json::Value =
            serde_json::from_str(&json.line_at(t0 + Duration::from_secs(8), 4000, 8000).unwrap()).unwrap();
        assert_eq!(
            (v["event"].as_str(), v["read_tokens"].as_u64(), v["eta_s"].as_f64()),
            (Some("prefill"), Some(4000), Some(8.0))
        );
        // A job made without a request says nothing.
        let silent = PrefillLog::default().started(0);
        assert_eq!(silent.line_at(t0 + Duration::from_secs(60), 10, 100), None);
    }
}
