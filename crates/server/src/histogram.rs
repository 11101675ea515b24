//! Prometheus histograms (time to first token, between tokens, request latency) and the rate of
//! the last seconds, for `GET /metrics`.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

/// Seconds to a first token and of whole requests: a K3 prompt from disk takes minutes.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0];
/// Seconds between tokens: ~1 ms for the default model in RAM, seconds for K3 from disk.
pub const TOKEN_BUCKETS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Counts of observations at or below each upper bound, their sum and count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, inner: Mutex::new((vec![0; bounds.len()], 0.0, 0)) }
    }

    pub fn observe(&self, seconds: f64) {
        if !seconds.is_finite() {
            return;
        }
        if let Ok(mut h) = self.inner.lock() {
            // Cumulative, as Prometheus' `le` buckets are.
            for (count, &le) in h.0.iter_mut().zip(self.bounds) {
                if seconds <= le {
                    *count += 1;
                }
            }
            h.1 += seconds;
            h.2 += 1;
        }
    }

    /// The exposition of `k3_NAME` (buckets, `+Inf`, sum, count).
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let Ok(h) = self.inner.lock() else { return };
        let _ = writeln!(out, "# HELP k3_{name} {help}\n# TYPE k3_{name} histogram");
        for (count, le) in h.0.iter().zip(self.bounds) {
            let _ = writeln!(out, "k3_{name}_bucket{{le=\"{le}\"}} {count}");
        }
        let _ =
            writeln!(out, "k3_{name}_bucket{{le=\"+Inf\"}} {}\nk3_{name}_sum {}\nk3_{name}_count {}", h.2, h.1, h.2);
    }
}

/// Events counted per second over the last [`RecentRate::WINDOW`] seconds.
#[derive(Debug)]
pub struct RecentRate {
    started: Instant,
    /// (second since start, events in it), oldest first.
    seconds: Mutex<VecDeque<(u64, u64)>>,
}

impl RecentRate {
    pub const WINDOW: u64 = 10;

    pub fn new() -> Self {
        RecentRate { started: Instant::now(), seconds: Mutex::new(VecDeque::new()) }
    }

    pub fn add(&self, n: u64) {
        let now = self.started.elapsed().as_secs();
        if let Ok(mut s) = self.seconds.lock() {
            match s.back_mut() {
                Some((sec, count)) if *sec == now => *count += n,
                _ => s.push_back((now, n)),
            }
            while s.front().is_some_and(|&(sec, _)| sec + Self::WINDOW < now) {
                s.pop_front();
            }
        }
    }

    /// Events per second over the last whole seconds of the window (the running second is
    /// partial, so left out), or over the time since start when that is shorter.
    pub fn per_second(&self) -> f64 {
        let now = self.started.elapsed().as_secs();
        let span = Self::WINDOW.min(now);
        if span == 0 {
            return 0.0;
        }
        let Ok(s) = self.seconds.lock() else { return 0.0 };
        let events: u64 = s.iter().filter(|&&(sec, _)| sec < now && sec + span >= now).map(|&(_, n)| n).sum();
        events as f64 / span as f64
    }
}

impl Default for RecentRate {
    fn default() -> Self {
        RecentRate::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_count_everything() {
        let h = Histogram::new(&TOKEN_BUCKETS);
        for s in [0.0005, 0.003, 0.003, 20.0] {
            h.observe(s);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("k3_x_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("k3_x_bucket{le=\"0.005\"} 3\n"), "{out}");
        assert!(out.contains("k3_x_bucket{le=\"10\"} 3\n"), "{out}");
        assert!(out.contains("k3_x_bucket{le=\"+Inf\"} 4\nk3_x_sum 20.0065\nk3_x_count 4\n"), "{out}");
    }
}
