//! `cargo xtask bench decode`: the engine decoding a model larger than the memory it is given,
//! variants side by side in one run (interleaved repetitions, medians), next to the drive's
//! O_DIRECT ceiling at the engine's read size and queue depth.

use std::path::Path;

use std::time::Instant;

use anyhow::{Context, Result};
use k3_engine::{ActivationPrecision as Activations, Engine, EngineOptions, Logits, Seq, Session};
use k3_format::Model;
use k3_generate::sample::{Sampler, SamplerConfig};
use k3_generate::speculate::SpecStats;
use k3_generate::{GenerateParams, Generator};
use k3_io::Policy;
use k3_router::lookahead::{LookaheadStats, Predictor};
use serde_json::{Value, json};

use super::median;

mod ceiling;
mod cli;
mod table;

pub use cli::{Args, task};

pub struct Options<'a> {
    pub model: &'a Path,
    pub tokens: usize,
    pub prompt: usize,
    /// Compute thread counts to run every variant with.
    pub threads: Vec<usize>,
    pub mem: Option<u64>,
    pub reps: usize,
    pub variants: Vec<String>,
    /// Independent sequences decoded together.
    pub batches: Vec<usize>,
    /// Tokens drafted per step (0 = plain decoding).
    pub speculate: Vec<usize>,
    /// Prompt tokens per forward call of the prefill (`None`: the engine's choice).
    pub chunks: Vec<Option<usize>>,
    /// Activation precisions to run every configuration with.
    pub activations: Vec<Activations>,
    /// A prompt given as ids (instead of random ones).
    pub prompt_ids: Option<&'a [u32]>,
    /// How tokens are chosen (greedy by default).
    pub sampler: SamplerConfig,
    /// HOBBIT's copies, for the `hobbit` variant.
    pub low_bit_copies: Option<k3_engine::LowBitCopies>,
}

pub const ALL_VARIANTS: [&str; 6] = ["read-then-compute", "overlap", "overlap+lookahead", "lru", "lfu", "global-cache"];

pub(super) fn options(name: &str, mem: Option<u64>, context: u64, threads: usize) -> Result<EngineOptions> {
    // No lookahead statistics (two more router passes a layer): the variants run what users run;
    // the prefetch's own predictor is measured wherever it runs.
    let base = EngineOptions { mem_budget: mem, context, chunk: None, threads, ..EngineOptions::default() };
    Ok(match name {
        "read-then-compute" => EngineOptions { overlap: false, lookahead: false, ..base },
        "overlap" => EngineOptions { lookahead: false, ..base },
        "overlap+lookahead" => base,
        "lru" => EngineOptions { policy: Policy::Lru, ..base },
        "lfu" => EngineOptions { policy: Policy::Lfu, ..base },
        // The policy over the whole cache, not per layer's share.
        "global-cache" => EngineOptions { cache_layer_shares: false, ..base },
        // Overlap with HOBBIT's copies (`run_once` adds them).
        "hobbit" => EngineOptions { lookahead: false, ..base },
        other => anyhow::bail!("unknown variant `{other}` (one of {}, hobbit)", ALL_VARIANTS.join(", ")),
    })
}

/// One configuration measured: an engine variant, a thread count, independent sequences decoded
/// together, drafted tokens per step.
#[derive(Debug, Clone)]
struct Run {
    variant: String,
    threads: usize,
    batch: usize,
    speculate: usize,
    chunk: Option<usize>,
    activations: Activations,
}

/// What one decode measured: seconds of the decode, tokens it produced (every sequence's),
/// stats of the first sequence before and after it (step counters are the whole step's), the
/// lookahead's recall, the prefill's seconds, and speculation's counts.
struct Decoded {
    seconds: f64,
    tokens: usize,
    before: k3_engine::RunStats,
    after: k3_engine::RunStats,
    /// `None` where the prefetch's predictor did not run (no lookahead, or every expert cached).
    recall: Option<f64>,
    prefill_seconds: f64,
    prefill_tokens: usize,
    /// Expert bytes read during the prefill.
    prefill_bytes: u64,
    /// Prompt tokens per forward call of the prefill.
    chunk: usize,
    spec: SpecStats,
}

/// The prefetch's predictor's recall, where it ran.
fn recall(stats: &LookaheadStats) -> Option<f64> {
    let total = stats.total(Predictor::AfterAttention);
    (total.tokens > 0).then(|| total.recall())
}

/// Prefill each prompt, then `tokens` greedy steps: every sequence in each step, or (with
/// `speculate`) one sequence through the generator with drafts.
/// `read_before`: the engine's expert bytes read so far (the prefill's are counted from there).
fn decode(engine: &Engine<'_>, prompts: &[Vec<u32>], o: &Options<'_>, run: &Run, read_before: u64) -> Result<Decoded> {
    let tokens = o.tokens;
    let chunk = run.chunk.unwrap_or_else(|| engine.prefill_chunk()).max(1);
    if run.speculate > 0 {
        return speculative(engine, &prompts[0], o, run.speculate, chunk, read_before);
    }
    let mut sessions: Vec<Session> = prompts.iter().map(|_| engine.session()).collect();
    let t0 = Instant::now();
    let mut logits = Vec::with_capacity(prompts.len());
    for (s, p) in sessions.iter_mut().zip(prompts) {
        let mut last = Vec::new();
        for c in p.chunks(chunk) {
            last = engine.forward_last(s, c)?;
        }
        logits.push(last);
    }
    let prefill_seconds = t0.elapsed().as_secs_f64();
    // The engine's cache counters after the last prefill (each session holds them as of its own
    // last step).
    let mut before = sessions[0].stats;
    before.cache = sessions.last().map_or(before.cache, |s| s.stats.cache);
    let mut sampler = Sampler::new(o.sampler.clone())?;
    let t = Instant::now();
    for _ in 0..tokens {
        let next: Vec<[u32; 1]> = logits.iter().map(|l| [sampler.sample(l)]).collect();
        let mut seqs: Vec<Seq<'_>> =
            sessions.iter_mut().zip(&next).map(|(session, ids)| Seq::new(session, ids, Logits::Last)).collect();
        logits = engine.forward_batch(&mut seqs)?;
    }
    Ok(Decoded {
        seconds: t.elapsed().as_secs_f64(),
        tokens: tokens * prompts.len(),
        before,
        after: sessions[0].stats,
        recall: recall(&sessions[0].lookahead),
        prefill_seconds,
        prefill_tokens: prompts.iter().map(Vec::len).sum(),
        prefill_bytes: before.cache.bytes_read - read_before,
        chunk,
        spec: SpecStats::default(),
    })
}

/// One sequence, `tokens` tokens with up to `k` drafts verified per step.
fn speculative(
    engine: &Engine<'_>,
    prompt: &[u32],
    o: &Options<'_>,
    k: usize,
    chunk: usize,
    read_before: u64,
) -> Result<Decoded> {
    let mut s = engine.session();
    let params = GenerateParams {
        max_tokens: o.tokens as u64,
        chunk: Some(chunk),
        speculate: k,
        sampler: o.sampler.clone(),
        ..Default::default()
    };
    let mut g = Generator::start(engine, &mut s, prompt, None, params, &mut |_, _| {})?;
    let (prefill_seconds, before) = (g.prefill.1, g.session().stats);
    let t = Instant::now();
    let mut produced = 0;
    while g.step(engine)?.is_some() {
        produced += 1;
    }
    let (seconds, spec) = (t.elapsed().as_secs_f64(), g.spec);
    drop(g);
    Ok(Decoded {
        seconds,
        tokens: produced,
        before,
        after: s.stats,
        recall: recall(&s.lookahead),
        prefill_seconds,
        prefill_tokens: prompt.len(),
        prefill_bytes: before.cache.bytes_read - read_before,
        chunk,
        spec,
    })
}

/// One cold run (a fresh engine, empty cache), then the same prompts again on the now warm cache.
fn run_once(model: &Model, run: &Run, o: &Options<'_>, prompts: &[Vec<u32>], context: u64) -> Result<Value> {
    let opts = EngineOptions {
        chunk: run.chunk.map(|c| c as u64),
        activations: run.activations,
        low_bit_copies: if run.variant == "hobbit" { o.low_bit_copies.clone() } else { None },
        ..options(&run.variant, o.mem, context, run.threads)?
    };
    let engine = Engine::load_with(model, opts)?;
    let cold = decode(&engine, prompts, o, run, 0)?;
    let warm = decode(&engine, prompts, o, run, cold.after.cache.bytes_read)?;
    let (mut r, warm) = (measure(&engine, &cold), measure(&engine, &warm));
    for key in ["tok_per_s", "hit_rate", "prefill_tok_per_s", "prefill_bytes_per_token"] {
        r[format!("warm_{key}")] = warm[key].clone();
    }
    r["cache_slots"] = json!(engine.plan().cache_slots);
    Ok(r)
}

fn measure(engine: &Engine<'_>, d: &Decoded) -> Value {
    let Decoded {
        seconds: secs,
        tokens,
        before,
        after,
        recall,
        prefill_seconds,
        prefill_tokens,
        prefill_bytes,
        chunk,
        spec,
    } = d;
    let (secs, n) = (*secs, (*tokens).max(1) as f64);
    let bytes = after.cache.bytes_read - before.cache.bytes_read;
    let hits = after.cache.hits - before.cache.hits;
    let misses = after.cache.misses - before.cache.misses;
    let wait = after.io_wait_seconds - before.io_wait_seconds;
    let span = after.io_span_seconds - before.io_span_seconds;
    let steps = (after.steps - before.steps).max(1) as f64;
    let compute = (secs - wait).max(0.0);
    json!({
        "tok_per_s": n / secs,
        "prefill_tok_per_s": *prefill_tokens as f64 / prefill_seconds,
        "prefill_bytes_per_token": *prefill_bytes as f64 / (*prefill_tokens).max(1) as f64,
        "chunk": chunk,
        "bytes_per_token": bytes as f64 / n,
        "hit_rate": hits as f64 / (hits + misses).max(1) as f64,
        "io_wait_s_per_token": wait / n,
        "compute_s_per_token": compute / n,
        "overlap_efficiency": compute.max(span) / secs,
        "prefetch_used": after.cache.prefetches_used - before.cache.prefetches_used,
        "prefetch_wasted": after.cache.prefetches_wasted - before.cache.prefetches_wasted,
        "lookahead_recall": recall,
        "experts_per_step": (after.experts_computed - before.experts_computed) as f64 / steps,
        "low_bit_per_step": (after.experts_low_bit - before.experts_low_bit) as f64 / steps,
        "tokens_per_step": n / steps,
        "acceptance_rate": spec.acceptance_rate(),
        "switched_off": spec.switched_off,
        "threads": engine.threads(),
    })
}

/// Random prompts, one per sequence (different seeds: independent sequences), or the given ids.
fn prompts(vocab: u32, len: usize, batch: usize, given: Option<&[u32]>) -> Vec<Vec<u32>> {
    (0..batch)
        .map(|i| match given {
            Some(ids) => ids.to_vec(),
            None => {
                let mut rng = k3_quant::rng::XorShift::new(11 + i as u64);
                (0..len.max(1)).map(|_| (rng.next_u64() % u64::from(vocab - 8)) as u32).collect()
            }
        })
        .collect()
}

/// Every (variant, threads, batch, speculate) asked for; drafts run one sequence at a time.
fn runs(o: &Options<'_>) -> Vec<Run> {
    let mut runs = Vec::new();
    for v in &o.variants {
        for &threads in &o.threads {
            for &batch in &o.batches {
                for &speculate in o.speculate.iter().filter(|&&k| batch == 1 || k == 0) {
                    for &chunk in &o.chunks {
                        for &activations in &o.activations {
                            runs.push(Run { variant: v.clone(), threads, batch, speculate, chunk, activations });
                        }
                    }
                }
            }
        }
    }
    runs
}

impl Run {
    /// The variant, with the dimensions that vary in this benchmark.
    fn label(&self, o: &Options<'_>) -> String {
        let mut l = self.variant.clone();
        if o.threads.len() > 1 {
            l += &format!(" @{}t", self.threads);
        }
        if o.batches.len() > 1 {
            l += &format!(" x{}", self.batch);
        }
        if o.speculate.len() > 1 {
            l += &format!(" spec{}", self.speculate);
        }
        if o.chunks.len() > 1 {
            l += &self.chunk.map_or(" chunk auto".to_string(), |c| format!(" chunk{c}"));
        }
        if o.activations.len() > 1 {
            l += &format!(" {}", self.activations.name());
        }
        l
    }
}

/// What the report keeps of each run, as medians over its repetitions.
const MEDIAN_KEYS: [&str; 21] = [
    "tok_per_s",
    "prefill_tok_per_s",
    "prefill_bytes_per_token",
    "chunk",
    "bytes_per_token",
    "hit_rate",
    "io_wait_s_per_token",
    "compute_s_per_token",
    "overlap_efficiency",
    "lookahead_recall",
    "prefetch_used",
    "prefetch_wasted",
    "experts_per_step",
    "low_bit_per_step",
    "tokens_per_step",
    "acceptance_rate",
    "switched_off",
    "warm_tok_per_s",
    "warm_hit_rate",
    "warm_prefill_tok_per_s",
    "warm_prefill_bytes_per_token",
];

/// One run's medians (its I/O bound is added by [`ceiling::apply`]).
fn summarize(run: &Run, samples: &[Value], rss: Option<u64>) -> Value {
    // A key no sample has a number for (the recall where no predictor ran) stays null.
    let med = |key: &str| {
        let xs: Vec<f64> = samples.iter().filter_map(|r| r[key].as_f64()).collect();
        (!xs.is_empty()).then(|| median(xs))
    };
    let mut v: serde_json::Map<String, Value> = MEDIAN_KEYS.iter().map(|k| (k.to_string(), json!(med(k)))).collect();
    v.insert("variant".into(), json!(run.variant));
    v.insert("threads".into(), json!(run.threads));
    v.insert("batch".into(), json!(run.batch));
    v.insert("speculate".into(), json!(run.speculate));
    v.insert("peak_rss_bytes".into(), json!(rss));
    v.insert("cache_slots".into(), samples[0]["cache_slots"].clone());
    Value::Object(v)
}

/// The runs' report; `ceiling::apply` adds the I/O bound and `table::print_table` shows it.
pub fn run(o: &Options<'_>) -> Result<Value> {
    let model = Model::open(o.model).with_context(|| format!("opening {}", o.model.display()))?;
    let vocab = model.manifest().architecture.vocab as u32;
    // Interleaved: a rep runs each configuration once, in a rotating order.
    let runs = runs(o);
    let prompt_len = o.prompt_ids.map_or(o.prompt, <[u32]>::len);
    let context = (prompt_len + o.tokens + o.speculate.iter().max().unwrap_or(&0) + 1) as u64;
    let mut samples: Vec<Vec<Value>> = vec![Vec::new(); runs.len()];
    for rep in 0..o.reps {
        for k in 0..runs.len() {
            let i = (k + rep) % runs.len();
            eprintln!("  rep {rep}: {}", runs[i].label(o));
            let p = prompts(vocab, o.prompt, runs[i].batch, o.prompt_ids);
            samples[i].push(run_once(&model, &runs[i], o, &p, context)?);
        }
    }
    let rss = k3_engine::budget::peak_rss_bytes();
    let medians: Vec<Value> = runs.iter().zip(&samples).map(|(r, s)| summarize(r, s, rss)).collect();
    // Against the same configuration one sequence at a time, without drafts: the union factor
    // (distinct experts computed per token produced, over a lone token's) and the speed-up.
    let mut variants = serde_json::Map::new();
    for (i, run) in runs.iter().enumerate() {
        let mut v = medians[i].clone();
        let single = runs.iter().position(|r| {
            r.variant == run.variant
                && r.threads == run.threads
                && r.batch == 1
                && r.speculate == 0
                && r.chunk == run.chunk
                && r.activations == run.activations
        });
        if let Some(j) = single {
            let f = |k: &str, m: &Value| m[k].as_f64().unwrap_or(0.0);
            let lone = f("experts_per_step", &medians[j]);
            let per_token = f("experts_per_step", &v) / f("tokens_per_step", &v).max(1e-9);
            v["union_factor"] = json!(per_token / lone.max(1e-9));
            v["speedup"] = json!(f("tok_per_s", &v) / f("tok_per_s", &medians[j]).max(1e-12));
        }
        variants.insert(run.label(o), v);
    }
    Ok(json!({
        "model": o.model.display().to_string(), "decode_tokens": o.tokens,
        "prompt_tokens": prompt_len, "mem_budget": o.mem, "reps": o.reps, "variants": variants,
    }))
}
