//! The switches every command that runs the model shares, and the statistics it reports.

use std::path::PathBuf;

use anyhow::{Context, Result};
use k3_engine::budget::{parse_size, peak_rss_bytes};
use k3_engine::{Engine, EngineOptions, RunStats};
use k3_io::Policy;

#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Memory to live within: trunk, attention state, expert cache, I/O buffers (e.g. 48G, 512M;
    /// default: an expert cache of up to half the memory available at start).
    #[arg(long)]
    pub mem: Option<String>,
    /// Read, then compute (no overlap of expert reads with arithmetic), for measurement.
    #[arg(long)]
    pub no_overlap: bool,
    /// Do not prefetch the next layer's predicted experts.
    #[arg(long)]
    pub no_lookahead: bool,
    #[arg(long, default_value = "lfru")]
    pub cache_policy: String,
    /// Context length the memory plan reserves attention cache for.
    #[arg(long, default_value_t = 4096)]
    pub context: u64,
    /// Print a summary of the run's statistics.
    #[arg(long)]
    pub stats: bool,
    /// Write the run's statistics as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Print the memory plan.
    #[arg(long)]
    pub verbose: bool,
    /// Other directories holding expert shards (one per drive); repeat the flag.
    #[arg(long = "shard-dir")]
    pub shard_dirs: Vec<PathBuf>,
    /// Expert usage counts: the hottest experts in it are pinned in the cache, and this run's
    /// routing is added to it at the end (created if missing).
    #[arg(long)]
    pub usage_history: Option<PathBuf>,
}

/// Prefill (tokens, seconds), decode (tokens, seconds) and each decode step's numbers.
type Split = ((usize, f64), (usize, f64), Vec<serde_json::Value>);

impl EngineArgs {
    pub fn options(&self) -> Result<EngineOptions> {
        let policy: Policy = self.cache_policy.parse().map_err(anyhow::Error::msg)?;
        Ok(EngineOptions {
            mem_budget: self.mem.as_deref().map(parse_size).transpose().map_err(anyhow::Error::msg)?,
            overlap: !self.no_overlap,
            lookahead: !self.no_lookahead,
            policy,
            context: self.context,
            ..EngineOptions::default()
        })
    }

    /// Pins the hottest experts of the usage history, if one was given.
    pub fn start(&self, engine: &Engine<'_>) -> Result<()> {
        self.print_plan(engine);
        if let Some(p) = self.usage_history.as_ref().filter(|p| p.exists()) {
            let h = k3_router::UsageHistory::load(p)?;
            let n = engine.pin_hottest(&h);
            if self.verbose {
                eprintln!("pinned the {n} most used experts of {}", p.display());
            }
        }
        Ok(())
    }

    /// Adds this run's routing to the usage history, if one was given.
    pub fn finish(&self, session: &k3_engine::Session) -> Result<()> {
        if let Some(p) = &self.usage_history {
            let mut h = if p.exists() { k3_router::UsageHistory::load(p)? } else { k3_router::UsageHistory::default() };
            h.merge(&session.usage);
            h.save(p)?;
        }
        Ok(())
    }

    pub fn print_plan(&self, engine: &Engine<'_>) {
        if !self.verbose {
            return;
        }
        let p = engine.plan();
        let mb = |b: u64| b as f64 / 1e6;
        eprintln!("memory plan{}:", p.budget.map(|b| format!(" (budget {:.1} MB)", mb(b))).unwrap_or_default());
        eprintln!("  trunk (mapped)        {:>12.1} MB", mb(p.trunk_bytes));
        eprintln!(
            "  attention state       {:>12.1} MB  (MLA caches sized for {} tokens)",
            mb(p.state_bytes),
            p.context
        );
        eprintln!(
            "  expert cache          {:>12.1} MB  ({} slots of {:.2} MB)",
            mb(p.slot_bytes * p.cache_slots),
            p.cache_slots,
            mb(p.slot_bytes)
        );
        eprintln!("  overhead              {:>12.1} MB", mb(p.overhead_bytes));
        eprintln!("  total                 {:>12.1} MB", mb(p.total()));
    }

    /// As [`report`](Self::report), with prefill and decode timed separately and each decode
    /// step's own numbers.
    pub fn report_split(
        &self,
        s: &RunStats,
        prefill: (usize, f64),
        decode: (usize, f64),
        per_token: Vec<serde_json::Value>,
    ) -> Result<()> {
        self.report_with(s, Some((prefill, decode, per_token)))
    }

    /// Prints and/or writes the statistics, as asked.
    pub fn report(&self, s: &RunStats) -> Result<()> {
        self.report_with(s, None)
    }

    fn report_with(&self, s: &RunStats, split: Option<Split>) -> Result<()> {
        let rss = peak_rss_bytes();
        let step = s.seconds.max(1e-12);
        // Compute: the step minus the time blocked on reads; I/O: the time reads were in flight.
        let compute = (s.seconds - s.io_wait_seconds).max(0.0);
        let overlap = compute.max(s.io_span_seconds) / step;
        let c = &s.cache;
        let lookups = (c.hits + c.misses).max(1);
        let rate = |(n, t): (usize, f64)| n as f64 / t.max(1e-12);
        let mut json = serde_json::json!({
            "tokens": s.tokens,
            "seconds": s.seconds,
            "tokens_per_s": s.tokens as f64 / step,
            "bytes_read": c.bytes_read,
            "bytes_read_per_token": c.bytes_read as f64 / s.tokens.max(1) as f64,
            "cache_hit_rate": c.hits as f64 / lookups as f64,
            "cache": {"hits": c.hits, "misses": c.misses, "evictions": c.evictions, "failed_reads": c.failed_reads},
            "prefetches": {"issued": c.prefetches_issued, "used": c.prefetches_used, "wasted": c.prefetches_wasted},
            "io_wait_seconds": s.io_wait_seconds,
            "io_span_seconds": s.io_span_seconds,
            "compute_seconds": compute,
            "overlap_efficiency": overlap,
            "peak_rss_bytes": rss,
        });
        if let Some((p, d, steps)) = &split {
            json["prefill"] = serde_json::json!({"tokens": p.0, "seconds": p.1, "tokens_per_s": rate(*p)});
            json["decode"] = serde_json::json!({"tokens": d.0, "seconds": d.1, "tokens_per_s": rate(*d)});
            json["per_token"] = serde_json::Value::Array(steps.clone());
        }
        if let Some(path) = &self.stats_json {
            std::fs::write(path, serde_json::to_vec_pretty(&json)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if self.stats {
            if let Some((p, d, steps)) = &split {
                let mut times: Vec<f64> = steps.iter().filter_map(|t| t["seconds"].as_f64()).collect();
                times.sort_by(f64::total_cmp);
                let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
                eprintln!(
                    "prefill {} tokens at {:.2} tok/s; decode {} tokens at {:.2} tok/s (median step {:.1} ms)",
                    p.0,
                    rate(*p),
                    d.0,
                    rate(*d),
                    median * 1e3
                );
            }
            eprintln!(
                "{} tokens in {:.3} s ({:.2} tok/s); read {:.2} MB ({:.2} MB/token), cache hit rate {:.1}%, \
                 prefetches {} used / {} wasted of {}; I/O wait {:.3} s, compute {:.3} s, overlap efficiency {:.2}; peak RSS {:.1} MB",
                s.tokens,
                s.seconds,
                s.tokens as f64 / step,
                c.bytes_read as f64 / 1e6,
                c.bytes_read as f64 / 1e6 / s.tokens.max(1) as f64,
                100.0 * c.hits as f64 / lookups as f64,
                c.prefetches_used,
                c.prefetches_wasted,
                c.prefetches_issued,
                s.io_wait_seconds,
                compute,
                overlap,
                rss.unwrap_or(0) as f64 / 1e6
            );
        }
        Ok(())
    }
}
