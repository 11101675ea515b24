//! The switches every command that runs the model shares, and the statistics it reports.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_engine::Policy;
use k3_engine::budget::{parse_size, peak_rss_bytes};
use k3_engine::{ActivationPrecision, Engine, EngineOptions, RunStats};
use k3_engine::{Model, OutputFile};
use k3_generate::speculate::SpecStats;

/// How the engine runs: memory, context, threads, caching, where the shards are.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineKnobs {
    /// Memory to live within: trunk, attention state, activations, expert cache, I/O buffers (e.g.
    /// 48G, 512M; default: an expert cache of up to half the memory available at start).
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// Tokens of context to plan attention memory for; a longer conversation stops there
    /// [default: chat: the model's own longest context (max_position_embeddings) as far as memory
    /// allows beside the expert cache (--verbose says how much); generate: 4096, or the prompt and
    /// up to 4096 new tokens; what the command needs: the prompt for logits/trace, the window for
    /// perplexity].
    #[arg(short = 'c', long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub context: Option<u64>,
    /// Compute threads [default: one per core]. Reads run on their own thread besides; results
    /// are the same bits for any number.
    #[arg(short = 't', long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Which products round their inputs (faster): the rule's choice for the model (`auto`:
    /// rounded only where that adds at most a tenth of the KL the weights' own encodings cost,
    /// and never over 1e-3 nats; a model as trained runs exact); none (`exact`, f32); the routed
    /// experts' MXFP4/int4/int8 matrices to int8 (`int8-experts`: blocks of 32, integer dot
    /// products on AVX2 or AVX512-VNNI); those and the trunk's products of a batch to bf16
    /// (`bf16-trunk`: where the CPU has AVX512-BF16; a decode step's vector stays exact); or every
    /// int8/int4/MXFP4 matrix, trunk included, to int8 (`int8`). `--stats` says which ran; the
    /// measured costs are in docs/EFFICIENCY.md [default: auto for generate, chat and serve;
    /// exact for logits, trace, perplexity and lookahead, whose numbers are compared with
    /// references].
    #[arg(long, value_name = "PRECISION", value_parser = k3_engine::ActivationPrecision::NAMES)]
    pub activations: Option<String>,
    /// How MLA caches store each position: `auto` (int8 where the run's activations round
    /// products, as `--activations auto` does for quantized weights, and the CPU has AVX2; f32
    /// otherwise, so a model as trained runs f32), `f32` as computed, `bf16` (half the bytes:
    /// twice the context in the same memory) or `int8` (a scale a row: ~3.6x, attended in
    /// integers in the absorbed form: 1.85-2.4x f32's decode attention at K3's widths). Rounded
    /// once, when the position is appended. Measured costs in docs/EFFICIENCY.md [default: auto
    /// for generate, chat and serve; f32 for logits, trace, perplexity and lookahead].
    #[arg(long, value_name = "TYPE", value_parser = ["auto", "f32", "bf16", "int8"])]
    pub kv_cache: Option<String>,
    /// Which form MLA prefill runs: `auto` (absorbed for decode and chunks under a few hundred
    /// tokens, expanded, i.e. keys and values decompressed per head, where that takes fewer
    /// multiply-adds: ~2-3x fewer for long prompts), `absorbed` (every chunk gives the bits of
    /// stepping token by token) or `expanded`. The forms agree to float noise (~1e-6; with an
    /// int8 cache to ~1e-5 nats, the absorbed form's queries and weights rounded) [default:
    /// auto].
    #[arg(long, value_name = "FORM", default_value = "auto", value_parser = k3_engine::MlaForm::NAMES)]
    pub mla_form: String,
    /// Read, then compute (no overlap of expert reads with arithmetic), for measurement.
    #[arg(long)]
    pub no_overlap: bool,
    /// Do not prefetch the next layer's predicted experts.
    #[arg(long)]
    pub no_lookahead: bool,
    /// Which cached expert to drop when the cache is full (among the layer holding the most
    /// slots, so each layer keeps its share).
    #[arg(long, default_value = "lfru", value_parser = ["lru", "lfu", "lfru"])]
    pub cache_policy: String,
    /// Top-k reduction: each token uses only its N heaviest routed experts (of the model's own
    /// top-k; K3 routes 16), so fewer expert reads. Changes results: its measured cost is in
    /// docs/EFFICIENCY.md [default: every expert the model routes to].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub experts_per_token: Option<u16>,
    /// Each token keeps its heaviest routed experts until they carry this share of its routing
    /// weight (0-1]. Changes results [default: off].
    #[arg(long, value_name = "P")]
    pub expert_top_p: Option<f32>,
    /// Cache-aware routing: each token's N lightest routed experts that the expert cache does not
    /// hold are swapped for the best-scored runners-up it does hold (their weights kept), so
    /// fewer reads. Changes results, and they then depend on what the cache holds: its measured
    /// cost is in docs/EFFICIENCY.md [default: off].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub cache_aware_experts: Option<u16>,
    /// HOBBIT: a model directory of low-bit copies of this model's experts (`convert --experts
    /// int2` of the same checkpoint). An expert among each token's `--low-bit-experts` lightest
    /// that misses the cache is read from its copy, a fraction of the bytes. Changes results, and
    /// they then depend on what the cache holds: its measured cost is in docs/EFFICIENCY.md
    /// [default: none].
    #[arg(long, value_name = "DIR")]
    pub low_bit_copies: Option<PathBuf>,
    /// With `--low-bit-copies`: how many of each token's lightest routed experts may be read from
    /// their copies [default: half the experts a token uses].
    #[arg(long, value_name = "N", requires = "low_bit_copies", value_parser = clap::value_parser!(u16).range(1..))]
    pub low_bit_experts: Option<u16>,
    /// Skip checking the trunk's checksums at load (only for a model `k3-cli verify` passed and
    /// nothing has touched since; expert records are always checked as they are read).
    #[arg(long)]
    pub no_verify: bool,
    /// Other directories holding expert shards (one per drive); repeat the flag [default: none:
    /// shards are looked for beside the model's header].
    #[arg(long = "shard-dir", value_name = "DIR")]
    pub shard_dirs: Vec<PathBuf>,
}

/// The switches of a command that runs the model once: the engine's, and what to report.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    #[command(flatten)]
    pub knobs: EngineKnobs,
    /// Print a summary of the run's statistics (to standard error).
    #[arg(long)]
    pub stats: bool,
    /// Write the run's statistics as JSON to this file [default: none].
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Print the memory plan and the load-time checks (to standard error).
    #[arg(long)]
    pub verbose: bool,
    /// Expert usage counts: the hottest experts in it are pinned in the cache, and this run's
    /// routing is added to it at the end (created if missing) [default: none].
    #[arg(long, value_name = "FILE")]
    pub usage_history: Option<PathBuf>,
}

impl EngineKnobs {
    pub fn options(&self, needs: Needs) -> Result<EngineOptions> {
        let policy: Policy = self.cache_policy.parse().map_err(anyhow::Error::msg)?;
        Ok(EngineOptions {
            mem_budget: self.mem.as_deref().map(parse_size).transpose().map_err(anyhow::Error::msg)?,
            overlap: !self.no_overlap,
            lookahead: !self.no_lookahead,
            policy,
            experts_per_token: self.experts_per_token.map(usize::from),
            expert_top_p: self.expert_top_p,
            low_bit_copies: self.low_bit_copies()?,
            cache_aware: self.cache_aware_experts.map(usize::from),
            context: self.context.unwrap_or(needs.context).max(needs.min_context),
            fit_context: needs.fit && self.context.is_none(),
            chunk: needs.chunk.map(|c| c as u64),
            reserved_bytes: needs.reserved_bytes,
            threads: self.threads.map_or(0, usize::from),
            kv_cache: match self.kv_cache.as_deref() {
                Some("auto") => None,
                Some(t) => Some(t.parse().map_err(anyhow::Error::msg)?),
                // Commands whose numbers are compared with references run exact.
                None if needs.activations == ActivationPrecision::Auto => None,
                None => Some(k3_engine::KvCacheType::F32),
            },
            mla_form: self.mla_form.parse().map_err(anyhow::Error::msg)?,
            verify_trunk: !self.no_verify,
            activations: match self.activations.as_deref() {
                Some(a) => a.parse().map_err(anyhow::Error::msg)?,
                None => needs.activations,
            },
            ..EngineOptions::default()
        })
    }
}

impl EngineKnobs {
    /// The low-bit copies, opened and checked whole (their shards may be in `--shard-dir`s too).
    fn low_bit_copies(&self) -> Result<Option<k3_engine::LowBitCopies>> {
        let Some(dir) = &self.low_bit_copies else {
            return Ok(None);
        };
        let model =
            open_model(dir, &self.shard_dirs).with_context(|| format!("opening low-bit copies {}", dir.display()))?;
        let k = (model.manifest().architecture.experts_per_token as usize).max(2);
        let top = self.experts_per_token.map_or(k, usize::from).min(k);
        let experts = self.low_bit_experts.map_or(top / 2, usize::from);
        Ok(Some(k3_engine::LowBitCopies { model: std::sync::Arc::new(model), experts }))
    }
}

/// What a command asks of the memory plan beyond the switches.
#[derive(Debug, Clone, Copy)]
pub struct Needs {
    /// The context to plan for when `--context` is not given.
    pub context: u64,
    /// Without `--context`, `context` is the most wanted: the engine fits it to the model's own
    /// longest context and to what memory leaves beside the expert cache (chat, serve).
    pub fit: bool,
    /// The context the command's work takes whatever `--context` says (a window, a prompt).
    pub min_context: u64,
    /// Tokens per forward call (`None`: the engine picks for the model and budget).
    pub chunk: Option<usize>,
    /// Bytes the command keeps itself (collected logits, say).
    pub reserved_bytes: u64,
    /// The activation precision when `--activations` is not given.
    pub activations: ActivationPrecision,
}

/// What generate, chat and serve run with by default: the quality rule's choice for the model
/// (`ActivationPrecision::for_weights`: rounded only where it adds at most a tenth of the KL the
/// weights' encodings cost); `logits`, `trace`, `perplexity` and the golden tests run exact.
pub const RUN_ACTIVATIONS: ActivationPrecision = ActivationPrecision::Auto;

impl Needs {
    /// A command whose work takes exactly `context` tokens of context.
    pub fn exact(context: u64, chunk: usize) -> Self {
        Needs {
            context,
            fit: false,
            min_context: context,
            chunk: Some(chunk),
            reserved_bytes: 0,
            activations: ActivationPrecision::Exact,
        }
    }
}

/// Prefill (tokens, seconds), decode (tokens, seconds) and each decode step's numbers.
type Split = ((usize, f64), (usize, f64), Vec<serde_json::Value>);

/// A generation's own figures: prefill and decode (tokens, seconds), each decode step's numbers,
/// and each token's log-probabilities when they were asked for.
#[derive(Debug)]
pub struct Turn {
    pub prefill: (usize, f64),
    pub decode: (usize, f64),
    pub per_token: Vec<serde_json::Value>,
    pub logprobs: Option<Vec<serde_json::Value>>,
}

impl EngineArgs {
    /// Checks the files this run will write (`--stats-json`, `--usage-history`) before any work.
    fn check_outputs(&self) -> Result<()> {
        for p in self.stats_json.iter().chain(&self.usage_history) {
            drop(OutputFile::create(p)?);
        }
        if let Some(p) = self.usage_history.as_ref().filter(|p| p.exists()) {
            k3_engine::UsageHistory::load(p)?;
        }
        Ok(())
    }

    /// Checks the outputs, loads the engine (verifying the trunk) and pins the usage history's
    /// hottest experts: what every model-running command does before its work.
    pub fn load<'m>(&self, model: &'m Model, path: &Path, needs: Needs) -> Result<Engine<'m>> {
        self.load_with(model, path, needs, |_| {})
    }

    /// As [`load`](Self::load), with the command's own options (`adjust`) on top of the switches.
    pub fn load_with<'m>(
        &self,
        model: &'m Model,
        path: &Path,
        needs: Needs,
        adjust: impl FnOnce(&mut EngineOptions),
    ) -> Result<Engine<'m>> {
        self.check_outputs()?;
        let mut opts = self.knobs.options(needs)?;
        adjust(&mut opts);
        let engine = Engine::load_with(model, opts).with_context(|| format!("loading {}", path.display()))?;
        self.start(&engine)?;
        Ok(engine)
    }

    /// Pins the hottest experts of the usage history, if one was given.
    fn start(&self, engine: &Engine<'_>) -> Result<()> {
        self.print_plan(engine);
        if let Some(p) = self.usage_history.as_ref().filter(|p| p.exists()) {
            let h = k3_engine::UsageHistory::load(p)?;
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
            let mut h = if p.exists() { k3_engine::UsageHistory::load(p)? } else { k3_engine::UsageHistory::default() };
            h.merge(&session.usage);
            h.save(p)?;
        }
        Ok(())
    }

    fn print_plan(&self, engine: &Engine<'_>) {
        if !self.verbose {
            return;
        }
        let p = engine.plan();
        let mb = |b: u64| b as f64 / 1e6;
        eprintln!("compute threads: {} (reads on a thread of their own)", engine.threads());
        match engine.trunk_check() {
            Some(c) => eprintln!(
                "trunk checksums verified: {:.1} MB in {:.3} s ({:.2} GB/s)",
                mb(c.bytes),
                c.seconds,
                c.bytes as f64 / 1e9 / c.seconds.max(1e-9)
            ),
            None => eprintln!("trunk checksums not verified (--no-verify)"),
        }
        eprintln!("memory plan{}:", p.budget.map(|b| format!(" (budget {:.1} MB)", mb(b))).unwrap_or_default());
        eprintln!("  trunk (mapped)        {:>12.1} MB", mb(p.trunk_bytes));
        eprintln!(
            "  attention state       {:>12.1} MB  (MLA caches up to {} tokens{}{}, growing with use)",
            mb(p.state_bytes),
            p.context,
            if p.sequences > 1 { format!(", {} sequences", p.sequences) } else { String::new() },
            if p.asked_context > p.context {
                format!(": the model's {} fitted to memory", p.asked_context)
            } else {
                String::new()
            }
        );
        eprintln!("  activations           {:>12.1} MB  ({}-token chunks)", mb(p.activation_bytes), p.chunk);
        if p.reserved_bytes > 0 {
            eprintln!("  outputs               {:>12.1} MB", mb(p.reserved_bytes));
        }
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
    pub fn report_split(&self, engine: &Engine<'_>, s: &RunStats, t: Turn, spec: Option<&SpecStats>) -> Result<()> {
        self.report_with(engine, s, Some((t.prefill, t.decode, t.per_token)), spec, t.logprobs)
    }

    /// Prints and/or writes the statistics (with speculation's, when it ran), as asked.
    pub fn report(&self, engine: &Engine<'_>, s: &RunStats, spec: Option<&SpecStats>) -> Result<()> {
        self.report_with(engine, s, None, spec, None)
    }

    fn report_with(
        &self,
        engine: &Engine<'_>,
        s: &RunStats,
        split: Option<Split>,
        spec: Option<&SpecStats>,
        logprobs: Option<Vec<serde_json::Value>>,
    ) -> Result<()> {
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
            "steps": s.steps,
            "experts_computed_per_token": s.experts_computed as f64 / s.tokens.max(1) as f64,
            "experts_low_bit_per_token": s.experts_low_bit as f64 / s.tokens.max(1) as f64,
            "experts_rerouted_per_token": s.experts_rerouted as f64 / s.tokens.max(1) as f64,
            "cache_hit_rate": c.hits as f64 / lookups as f64,
            "cache": {"hits": c.hits, "misses": c.misses, "evictions": c.evictions, "failed_reads": c.failed_reads},
            "prefetches": {"issued": c.prefetches_issued, "used": c.prefetches_used, "wasted": c.prefetches_wasted},
            "io_wait_seconds": s.io_wait_seconds,
            "io_span_seconds": s.io_span_seconds,
            "compute_seconds": compute,
            "overlap_efficiency": overlap,
            "peak_rss_bytes": rss,
            "memory_plan_bytes": engine.plan().total(),
            "activations": activations_json(engine),
        });
        if let Some((p, d, steps)) = &split {
            json["prefill"] = serde_json::json!({"tokens": p.0, "seconds": p.1, "tokens_per_s": rate(*p)});
            json["decode"] = serde_json::json!({"tokens": d.0, "seconds": d.1, "tokens_per_s": rate(*d)});
            json["per_token"] = serde_json::Value::Array(steps.clone());
        }
        if let Some(sp) = spec {
            json["speculation"] = serde_json::json!({
                "verify_steps": sp.verifies, "drafted": sp.drafted, "accepted": sp.accepted,
                "acceptance_rate": sp.acceptance_rate(), "switched_off": sp.switched_off,
            });
        }
        if let Some(l) = logprobs {
            json["logprobs"] = serde_json::Value::Array(l);
        }
        if let Some(path) = &self.stats_json {
            k3_engine::write_atomic(path, &serde_json::to_vec_pretty(&json)?)?;
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
            print_expert_levers(s, spec, c.bytes_read);
            eprintln!("{}", activations_line(engine.activations(), engine.kv_cache()));
        }
        Ok(())
    }
}

/// The precision that ran and what each class of products ran at on this CPU.
fn activations_json(engine: &Engine<'_>) -> serde_json::Value {
    let a = engine.activations();
    let mut v = serde_json::to_value(a.ran()).unwrap_or_default();
    v["precision"] = a.name().into();
    v["kv_cache"] = engine.kv_cache().name().into();
    v
}

/// `activations bf16-trunk (avx512): experts int8, trunk bf16 batches, head exact; MLA cache int8`.
pub fn activations_line(a: ActivationPrecision, kv: k3_engine::KvCacheType) -> String {
    let r = a.ran();
    format!(
        "activations {} ({}): experts {}, trunk {}, head {}; MLA cache {}",
        a.name(),
        r.simd,
        r.experts,
        r.trunk,
        r.head,
        kv.name()
    )
}

/// The summary lines of the levers that change which experts run: low-bit copies, cache-aware
/// routing, speculation (only those that acted).
fn print_expert_levers(s: &RunStats, spec: Option<&SpecStats>, bytes_read: u64) {
    if s.experts_low_bit > 0 {
        eprintln!(
            "low-bit copies: {} of {} experts computed ({:.1}%) read from their copies",
            s.experts_low_bit,
            s.experts_computed,
            100.0 * s.experts_low_bit as f64 / s.experts_computed.max(1) as f64
        );
    }
    if s.experts_rerouted > 0 {
        eprintln!("cache-aware routing: {} experts swapped for cached runners-up", s.experts_rerouted);
    }
    if let Some(sp) = spec.filter(|sp| sp.verifies > 0) {
        eprintln!(
            "speculation: {} verify steps, {} drafted, {} accepted ({:.1}%), switched off {} times; \
             {:.1} experts and {:.2} MB read per token",
            sp.verifies,
            sp.drafted,
            sp.accepted,
            100.0 * sp.acceptance_rate(),
            sp.switched_off,
            s.experts_computed as f64 / s.tokens.max(1) as f64,
            bytes_read as f64 / 1e6 / s.tokens.max(1) as f64,
        );
    }
}

/// Opens a WASTE model, looking for shards in `shard_dirs` too.
pub fn open_model(path: &Path, shard_dirs: &[PathBuf]) -> Result<Model> {
    // The format's errors name the file already.
    Ok(Model::open_with(path, &k3_engine::OpenOptions { shard_dirs: shard_dirs.to_vec() })?)
}
