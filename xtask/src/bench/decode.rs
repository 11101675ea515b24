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
    /// Compute thread counts to run every variant with.
    pub threads: Vec<usize>,
    pub mem: Option<u64>,
    pub reps: usize,
    pub variants: Vec<String>,
}

pub const ALL_VARIANTS: [&str; 5] = ["read-then-compute", "overlap", "overlap+lookahead", "lru", "lfu"];

fn options(name: &str, mem: Option<u64>, context: u64, threads: usize) -> Result<EngineOptions> {
    let base = EngineOptions {
        mem_budget: mem,
        lookahead_stats: true,
        context,
        chunk: context,
        threads,
        ..EngineOptions::default()
    };
    Ok(match name {
        "read-then-compute" => EngineOptions { overlap: false, lookahead: false, ..base },
        "overlap" => EngineOptions { lookahead: false, ..base },
        "overlap+lookahead" => base,
        "lru" => EngineOptions { policy: Policy::Lru, ..base },
        "lfu" => EngineOptions { policy: Policy::Lfu, ..base },
        other => anyhow::bail!("unknown variant `{other}` (one of {})", ALL_VARIANTS.join(", ")),
    })
}

/// What one decode measured: seconds of the decode, stats before and after it, the lookahead's
/// recall, and the prefill's seconds.
struct Decoded {
    seconds: f64,
    before: k3_engine::RunStats,
    after: k3_engine::RunStats,
    recall: f64,
    prefill_seconds: f64,
}

/// Prefill `prompt`, then `tokens` greedy decode steps on `engine`.
fn decode(engine: &Engine<'_>, prompt: &[u32], tokens: usize) -> Result<Decoded> {
    let mut s = engine.session();
    let t0 = std::time::Instant::now();
    let mut logits = engine.forward_last(&mut s, prompt)?;
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let before = s.stats;
    let v = engine.vocab();
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    let t = std::time::Instant::now();
    for _ in 0..tokens {
        let next = sampler.sample(&logits[logits.len() - v..]);
        logits = engine.forward(&mut s, &[next], None)?;
    }
    Ok(Decoded {
        seconds: t.elapsed().as_secs_f64(),
        before,
        after: s.stats,
        recall: s.lookahead.total(Predictor::AfterAttention).recall(),
        prefill_seconds,
    })
}

/// One cold run (a fresh engine, empty cache), then the same prompt again on the now warm cache.
fn run_once(model: &Model, opts: EngineOptions, prompt: &[u32], tokens: usize) -> Result<Value> {
    let engine = Engine::load_with(model, opts)?;
    let mut r = run_cold(&engine, prompt, tokens)?;
    let d = decode(&engine, prompt, tokens)?;
    let hits = d.after.cache.hits - d.before.cache.hits;
    let misses = d.after.cache.misses - d.before.cache.misses;
    r["warm_tok_per_s"] = json!(tokens as f64 / d.seconds);
    r["warm_hit_rate"] = json!(hits as f64 / (hits + misses).max(1) as f64);
    r["warm_prefill_tok_per_s"] = json!(prompt.len() as f64 / d.prefill_seconds);
    Ok(r)
}

fn run_cold(engine: &Engine<'_>, prompt: &[u32], tokens: usize) -> Result<Value> {
    let Decoded { seconds: secs, before, after, recall, prefill_seconds } = decode(engine, prompt, tokens)?;
    let bytes = after.cache.bytes_read - before.cache.bytes_read;
    let hits = after.cache.hits - before.cache.hits;
    let misses = after.cache.misses - before.cache.misses;
    let wait = after.io_wait_seconds - before.io_wait_seconds;
    let span = after.io_span_seconds - before.io_span_seconds;
    let compute = (secs - wait).max(0.0);
    Ok(json!({
        "tok_per_s": tokens as f64 / secs,
        "prefill_tok_per_s": prompt.len() as f64 / prefill_seconds,
        "bytes_per_token": bytes as f64 / tokens as f64,
        "hit_rate": hits as f64 / (hits + misses).max(1) as f64,
        "io_wait_s_per_token": wait / tokens as f64,
        "compute_s_per_token": compute / tokens as f64,
        "overlap_efficiency": compute.max(span) / secs,
        "prefetch_used": after.cache.prefetches_used - before.cache.prefetches_used,
        "prefetch_wasted": after.cache.prefetches_wasted - before.cache.prefetches_wasted,
        "lookahead_recall": recall,
        "cache_slots": engine.plan().cache_slots,
        "threads": engine.threads(),
    }))
}

pub fn run(o: &Options<'_>, ceiling_gbps: f64, json_out: bool) -> Result<Value> {
    let model = Model::open(o.model).with_context(|| format!("opening {}", o.model.display()))?;
    let vocab = model.manifest().architecture.vocab as u32;
    let mut rng = k3_quant::rng::XorShift::new(11);
    let prompt: Vec<u32> = (0..o.prompt.max(1)).map(|_| (rng.next_u64() % u64::from(vocab - 8)) as u32).collect();
    // Every (variant, thread count), interleaved: a rep runs each once, in a rotating order.
    let runs: Vec<(String, usize)> =
        o.variants.iter().flat_map(|v| o.threads.iter().map(move |&t| (v.clone(), t))).collect();
    let label = |(name, threads): &(String, usize)| {
        if o.threads.len() > 1 { format!("{name} @{threads}t") } else { name.clone() }
    };
    let mut samples: Vec<Vec<Value>> = vec![Vec::new(); runs.len()];
    let context = (prompt.len() + o.tokens) as u64;
    for rep in 0..o.reps {
        for k in 0..runs.len() {
            let i = (k + rep) % runs.len();
            let (name, threads) = &runs[i];
            eprintln!("  rep {rep}: {}", label(&runs[i]));
            samples[i].push(run_once(&model, options(name, o.mem, context, *threads)?, &prompt, o.tokens)?);
        }
    }
    let rss = k3_engine::budget::peak_rss_bytes();
    let mut variants = serde_json::Map::new();
    for (run, samples) in runs.iter().zip(samples) {
        let med = |key: &str| median(samples.iter().map(|r| r[key].as_f64().unwrap_or(0.0)).collect());
        let tps = med("tok_per_s");
        let bpt = med("bytes_per_token");
        let bound = if bpt > 0.0 { ceiling_gbps * 1e9 / bpt } else { f64::INFINITY };
        variants.insert(
            label(run),
            json!({
                "variant": run.0, "threads": run.1,
                "tok_per_s": tps, "prefill_tok_per_s": med("prefill_tok_per_s"), "bytes_per_token": bpt,
                "hit_rate": med("hit_rate"),
                "io_wait_s_per_token": med("io_wait_s_per_token"), "compute_s_per_token": med("compute_s_per_token"),
                "overlap_efficiency": med("overlap_efficiency"), "lookahead_recall": med("lookahead_recall"),
                "prefetch_used": med("prefetch_used"), "prefetch_wasted": med("prefetch_wasted"),
                "io_bound_tok_per_s": bound, "io_bound_ratio": tps / bound, "peak_rss_bytes": rss,
                "cache_slots": samples[0]["cache_slots"],
                "warm_tok_per_s": med("warm_tok_per_s"), "warm_hit_rate": med("warm_hit_rate"),
                "warm_prefill_tok_per_s": med("warm_prefill_tok_per_s"),
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
            "{:<26} {:>8} {:>10} {:>10} {:>7} {:>9} {:>9} {:>8} {:>7} {:>9} {:>10} {:>9}",
            "variant",
            "tok/s",
            "prefill/s",
            "MB/token",
            "hit",
            "wait s/t",
            "comp s/t",
            "overlap",
            "recall",
            "vs bound",
            "warm tok/s",
            "warm hit"
        );
        for (name, v) in &variants {
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            println!(
                "{name:<26} {:>8.3} {:>10.1} {:>10.1} {:>6.1}% {:>9.3} {:>9.3} {:>8.2} {:>7.2} {:>8.2}x {:>10.3} {:>8.1}%",
                f("tok_per_s"),
                f("prefill_tok_per_s"),
                f("bytes_per_token") / 1e6,
                100.0 * f("hit_rate"),
                f("io_wait_s_per_token"),
                f("compute_s_per_token"),
                f("overlap_efficiency"),
                f("lookahead_recall"),
                f("io_bound_ratio"),
                f("warm_tok_per_s"),
                100.0 * f("warm_hit_rate")
            );
        }
    }
    Ok(report)
}

/// One decode step of `variant` with its timeline, drawn as an SVG: a lane per layer, time across.
pub fn timeline_svg(model: &Model, variant: &str, mem: Option<u64>, out: &Path) -> Result<()> {
    use k3_engine::SpanKind;
    // An 8-token prompt and three steps.
    let engine = Engine::load_with(model, options(variant, mem, 11, 0)?)?;
    let mut s = engine.session();
    let v = engine.vocab();
    let mut logits = engine.forward(&mut s, &[1, 2, 3, 4, 5, 6, 7, 8], None)?;
    let mut sampler = Sampler::new(SamplerConfig::default())?;
    for step in 0..3 {
        if step == 2 {
            s.timeline = Some(Vec::new());
        }
        let next = sampler.sample(&logits[logits.len() - v..]);
        logits = engine.forward(&mut s, &[next], None)?;
    }
    let spans = s.timeline.take().unwrap_or_default();
    let total = spans.iter().map(|x| x.end).fold(0.0, f64::max).max(1e-9);
    let layers = engine.layers();
    let (w, lane, left, top) = (1000.0, 22.0, 70.0, 40.0);
    let x = |t: f64| left + t / total * w;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        left + w + 60.0,
        top + lane * layers as f64 + 60.0
    );
    svg += &format!(
        "<text x=\"{left}\" y=\"16\" font-size=\"13\">One decode step ({variant}): {:.1} ms. Waiting for expert reads in red.</text>\n",
        total * 1e3
    );
    for l in 0..layers {
        let y = top + lane * l as f64;
        svg += &format!("<text x=\"4\" y=\"{}\">layer {l}</text>\n", y + 14.0);
        svg += &format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"#ddd\"/>\n",
            left + w,
            y + lane,
            y + lane
        );
    }
    for sp in &spans {
        let (color, h, dy) = match sp.kind {
            SpanKind::Attention => ("#4a90d9", 16.0, 2.0),
            SpanKind::MoeOther => ("#9b59b6", 16.0, 2.0),
            SpanKind::Wait => ("#e74c3c", 16.0, 2.0),
            SpanKind::Expert(_) => ("#27ae60", 10.0, 5.0),
        };
        let y = top + lane * f64::from(sp.layer) + dy;
        let title = match sp.kind {
            SpanKind::Expert(e) => format!("expert {e}"),
            k => format!("{k:?}"),
        };
        svg += &format!(
            "<rect x=\"{:.2}\" y=\"{y:.1}\" width=\"{:.2}\" height=\"{h}\" fill=\"{color}\"><title>{title}: {:.2} ms</title></rect>\n",
            x(sp.start),
            (x(sp.end) - x(sp.start)).max(0.5),
            (sp.end - sp.start) * 1e3
        );
    }
    let ly = top + lane * layers as f64 + 20.0;
    for (i, (c, name)) in [
        ("#4a90d9", "attention"),
        ("#9b59b6", "routing, latent, shared expert, sums"),
        ("#27ae60", "expert compute"),
        ("#e74c3c", "waiting for reads"),
    ]
    .iter()
    .enumerate()
    {
        let lx = left + 230.0 * i as f64;
        svg += &format!(
            "<rect x=\"{lx}\" y=\"{ly}\" width=\"12\" height=\"12\" fill=\"{c}\"/><text x=\"{}\" y=\"{}\">{name}</text>\n",
            lx + 16.0,
            ly + 10.0
        );
    }
    for k in 0..=4 {
        let t = total * f64::from(k) / 4.0;
        svg +=
            &format!("<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{:.1} ms</text>\n", x(t), ly + 32.0, t * 1e3);
    }
    svg += "</svg>\n";
    k3_format::write_atomic(out, svg.as_bytes())?;
    Ok(())
}

use std::path::PathBuf;

use crate::{bounded, reps};

/// `cargo xtask bench decode`.
#[derive(clap::Args)]
pub struct Args {
    /// The WASTE model to decode with (e.g. one made by `cargo xtask synth`).
    #[arg(long)]
    pub model: PathBuf,
    /// Greedy decode steps per run.
    #[arg(long, default_value_t = 8, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
    pub tokens: usize,
    /// Prompt tokens prefilled before the decode.
    #[arg(long, default_value_t = 16, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
    pub prompt: usize,
    /// Memory budget for the engine (e.g. 4G); default: the engine's own small cache.
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// Repetitions of every variant, interleaved (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = reps)]
    pub reps: usize,
    /// Where to draw one decode step's timeline (SVG).
    #[arg(long, default_value = "bench-out/decode-step.svg")]
    pub svg: PathBuf,
    /// Comma-separated subset of: read-then-compute, overlap, overlap+lookahead, lru, lfu.
    #[arg(long)]
    pub variants: Option<String>,
    /// Comma-separated compute thread counts to run every variant with [default: one per core].
    #[arg(long, value_name = "N,N,..")]
    pub threads: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `cargo xtask bench decode`: the drive's ceiling first (for the bound column), then the variants.
pub fn task(args: Args) -> Result<()> {
    let Args { model, tokens, prompt, mem, reps, svg, variants, threads, json } = args;
    let threads = crate::thread_list(threads.as_deref())?;
    let variants: Vec<String> = match variants {
        Some(v) => v.split(',').map(|s| s.trim().to_string()).collect(),
        None => ALL_VARIANTS.iter().map(|s| s.to_string()).collect(),
    };
    let mem = mem.map(|m| k3_engine::budget::parse_size(&m)).transpose().map_err(anyhow::Error::msg)?;
    let m = Model::open(&model)?;
    let record = m.manifest().expert_layouts.iter().map(|l| l.record_bytes).max().unwrap_or(4096) as usize;
    let shard = m.shard_paths().first().cloned().context("the model has no expert shards")?;
    drop(m);
    let io = super::io::Options {
        file: Some(shard),
        file_bytes: 0,
        record,
        queue_depth: 32,
        // 2 GB per rep: long enough that a throttled drive's burst allowance does not
        // inflate the ceiling (tools/bench/with-read-ceiling.sh).
        reads: 400,
        reps: 3,
        backend: k3_io::BackendChoice::IoUring,
    };
    let ceiling = super::io::run(&io, true)?["ceiling_gbps"].as_f64().unwrap_or(0.0);
    let o = Options { model: &model, tokens, prompt, threads, mem, reps, variants };
    let report = run(&o, ceiling, json)?;
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    timeline_svg(&Model::open(&model)?, "overlap+lookahead", mem, &svg)?;
    if json {
        println!("{report}");
    } else {
        println!("timeline of one decode step: {}", svg.display());
    }
    Ok(())
}
