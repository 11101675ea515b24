//! `cargo xtask bench decode`: the engine decoding a model larger than the memory it is given,
//! variants side by side in one run (interleaved repetitions, medians), next to the drive's
//! O_DIRECT ceiling at the engine's read size and queue depth.

use std::path::Path;

use anyhow::{Context, Result};
use k3_engine::sample::{Sampler, SamplerConfig};
use k3_engine::{Engine, EngineOptions};
use k3_format::Model;
use k3_io::Policy;
use k3_router::lookahead::Predictor;
use serde_json::{Value, json};

use super::median;

pub struct Options<'a> {
    pub model: &'a Path,
    pub tokens: usize,
    pub prompt: usize,
    pub mem: Option<u64>,
    pub reps: usize,
    pub variants: Vec<String>,
}

pub const ALL_VARIANTS: [&str; 5] = ["read-then-compute", "overlap", "overlap+lookahead", "lru", "lfu"];

fn options(name: &str, mem: Option<u64>) -> Result<EngineOptions> {
    let base = EngineOptions { mem_budget: mem, ..EngineOptions::default() };
    Ok(match name {
        "read-then-compute" => EngineOptions { overlap: false, lookahead: false, ..base },
        "overlap" => EngineOptions { lookahead: false, ..base },
        "overlap+lookahead" => base,
        "lru" => EngineOptions { policy: Policy::Lru, ..base },
        "lfu" => EngineOptions { policy: Policy::Lfu, ..base },
        other => anyhow::bail!("unknown variant `{other}` (one of {})", ALL_VARIANTS.join(", ")),
    })
}

/// One cold run: a fresh engine (empty cache), prefill, then `tokens` greedy decode steps.
fn run_once(model: &Model, opts: EngineOptions, prompt: &[u32], tokens: usize) -> Result<Value> {
    let engine = Engine::load_with(model, opts)?;
    let mut s = engine.session();
    let mut logits = engine.forward(&mut s, prompt, None)?;
    let before = s.stats;
    let v = engine.vocab();
    let mut sampler = Sampler::new(SamplerConfig::default());
    let t = std::time::Instant::now();
    for _ in 0..tokens {
        let next = sampler.sample(&logits[logits.len() - v..]);
        logits = engine.forward(&mut s, &[next], None)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let after = s.stats;
    let bytes = after.cache.bytes_read - before.cache.bytes_read;
    let hits = after.cache.hits - before.cache.hits;
    let misses = after.cache.misses - before.cache.misses;
    let wait = after.io_wait_seconds - before.io_wait_seconds;
    let span = after.io_span_seconds - before.io_span_seconds;
    let compute = (secs - wait).max(0.0);
    let recall = s.lookahead.total(Predictor::AfterAttention).recall();
    Ok(json!({
        "tok_per_s": tokens as f64 / secs,
        "bytes_per_token": bytes as f64 / tokens as f64,
        "hit_rate": hits as f64 / (hits + misses).max(1) as f64,
        "io_wait_s_per_token": wait / tokens as f64,
        "compute_s_per_token": compute / tokens as f64,
        "overlap_efficiency": compute.max(span) / secs,
        "prefetch_used": after.cache.prefetches_used - before.cache.prefetches_used,
        "prefetch_wasted": after.cache.prefetches_wasted - before.cache.prefetches_wasted,
        "lookahead_recall": recall,
        "cache_slots": engine.plan().cache_slots,
    }))
}

pub fn run(o: &Options<'_>, ceiling_gbps: f64, json_out: bool) -> Result<Value> {
    let model = Model::open(o.model).with_context(|| format!("opening {}", o.model.display()))?;
    let vocab = model.manifest().architecture.vocab as u32;
    let mut rng = k3_quant::rng::XorShift::new(11);
    let prompt: Vec<u32> = (0..o.prompt.max(1)).map(|_| (rng.next_u64() % u64::from(vocab - 8)) as u32).collect();
    let mut samples: Vec<Vec<Value>> = vec![Vec::new(); o.variants.len()];
    for rep in 0..o.reps {
        for k in 0..o.variants.len() {
            let i = (k + rep) % o.variants.len();
            let name = &o.variants[i];
            eprintln!("  rep {rep}: {name}");
            samples[i].push(run_once(&model, options(name, o.mem)?, &prompt, o.tokens)?);
        }
    }
    let rss = crate::bench::peak_rss_bytes();
    let mut variants = serde_json::Map::new();
    for (name, runs) in o.variants.iter().zip(samples) {
        let med = |key: &str| median(runs.iter().map(|r| r[key].as_f64().unwrap_or(0.0)).collect());
        let tps = med("tok_per_s");
        let bpt = med("bytes_per_token");
        let bound = if bpt > 0.0 { ceiling_gbps * 1e9 / bpt } else { f64::INFINITY };
        variants.insert(
            name.clone(),
            json!({
                "tok_per_s": tps, "bytes_per_token": bpt, "hit_rate": med("hit_rate"),
                "io_wait_s_per_token": med("io_wait_s_per_token"), "compute_s_per_token": med("compute_s_per_token"),
                "overlap_efficiency": med("overlap_efficiency"), "lookahead_recall": med("lookahead_recall"),
                "prefetch_used": med("prefetch_used"), "prefetch_wasted": med("prefetch_wasted"),
                "io_bound_tok_per_s": bound, "io_bound_ratio": tps / bound, "peak_rss_bytes": rss,
                "cache_slots": runs[0]["cache_slots"],
            }),
        );
    }
    let report = json!({
        "model": o.model.display().to_string(), "ceiling_gbps": ceiling_gbps, "decode_tokens": o.tokens,
        "prompt_tokens": prompt.len(), "mem_budget": o.mem, "reps": o.reps, "variants": variants,
    });
    if !json_out {
        println!(
            "decode of {} tokens after a {}-token prompt, {} reps (medians), O_DIRECT ceiling {ceiling_gbps:.2} GB/s",
            o.tokens,
            prompt.len(),
            o.reps
        );
        println!(
            "{:<20} {:>8} {:>10} {:>7} {:>9} {:>9} {:>8} {:>7} {:>9}",
            "variant", "tok/s", "MB/token", "hit", "wait s/t", "comp s/t", "overlap", "recall", "vs bound"
        );
        for (name, v) in &variants {
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            println!(
                "{name:<20} {:>8.3} {:>10.1} {:>6.1}% {:>9.3} {:>9.3} {:>8.2} {:>7.2} {:>8.2}x",
                f("tok_per_s"),
                f("bytes_per_token") / 1e6,
                100.0 * f("hit_rate"),
                f("io_wait_s_per_token"),
                f("compute_s_per_token"),
                f("overlap_efficiency"),
                f("lookahead_recall"),
                f("io_bound_ratio")
            );
        }
    }
    Ok(report)
}
