//! `cargo xtask bench cache-sim`: the expert cache's levers (issue #37) judged on a routing trace
//! without reading a byte: K3's shape (896 experts, top 16) routed by the K3-like process, or a
//! model's own routing (`--model`). Every figure is in records (one expert's bytes), so it holds
//! for MXFP4 and VQ3 alike; the engine's `bench decode` measures the same policies' hit rates
//! against a drive.
//!
//! - Policies at each cache size: the engine's LRU / LFU / LFRU (layers keep their shares), a
//!   learned recency-frequency policy (FlashMoE; fitted on another text) and Belady's MIN, the
//!   offline optimum no policy can beat.
//! - At one size, the levers that change what is read: the lookahead reading ahead, HOBBIT's
//!   low-bit copies on a miss, DynaExq's demoted copies, top-k reduction.
//! - Without a cache: the union factor of batches and of speculation's verify steps, and what
//!   pruning the least used experts saves.

mod learned;
mod sim;
mod tables;

use anyhow::Result;
use k3_io::Policy;
use k3_router::RouterConfig;
use k3_router::synthetic::{K3Like, RowContext, random_ids, trace};
use k3_router::trace_stats::Trace;
use serde_json::{Value, json};

use sim::{Choice, Outcome, Sim, Variant};

pub struct Options {
    /// A model whose own routing of a text is simulated (else the K3-like process).
    pub model: Option<std::path::PathBuf>,
    pub prompt_file: Option<std::path::PathBuf>,
    /// Cache sizes, as fractions of the experts.
    pub sizes: Vec<f64>,
    pub layers: u32,
    pub warm: usize,
    pub tokens: usize,
    pub seed: u64,
    /// The size the levers are compared at.
    pub lever_size: f64,
    /// A low-bit copy's bytes over the record's (HOBBIT, DynaExq).
    pub low_ratio: f64,
}

/// The K3-like process at K3's routing shape.
fn k3_shape() -> (RouterConfig, K3Like) {
    let cfg = RouterConfig::new(896, 16);
    let p = K3Like::new(&cfg, 7);
    (cfg, p)
}

fn slots_for(fraction: f64, trace: &Trace, experts: usize) -> usize {
    (fraction * (trace.len() * experts) as f64).round() as usize
}

fn outcome_json(o: &Outcome) -> Value {
    json!({"hit_rate": o.hit_rate(), "records_per_token": o.per_token(), "low_precision_share": o.low as f64 / o.requests.max(1) as f64})
}

/// The text a model routes: a test trace and another to fit the learned policy on, the
/// experts per layer, the lookahead's guesses (K3-like routing only) and what needs no cache.
struct Source {
    name: String,
    test: Trace,
    train: Trace,
    experts: usize,
    no_cache: Value,
}

/// The K3-like process and the test text's ids (what its lookahead guesses from).
type Process = (RouterConfig, K3Like, Vec<u32>);

fn source(o: &Options) -> Result<(Source, Option<Process>)> {
    let n = o.warm + o.tokens;
    let Some(model) = &o.model else {
        let (cfg, p) = k3_shape();
        let ids = random_ids(n, 160_000, o.seed);
        let test = trace(&p, &cfg, &ids, o.layers);
        let train = trace(&p, &cfg, &random_ids(n, 160_000, o.seed + 1000), o.layers);
        let no_cache = tables::without_cache(&p, &cfg, o);
        let name = "k3-like (896 experts, top 16)".to_string();
        return Ok((Source { name, test, train, experts: cfg.experts, no_cache }, Some((cfg, p, ids))));
    };
    // A model's own routing of one text: its first half fits the learned policy, the second is
    // the test.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let file = o.prompt_file.clone().unwrap_or_else(|| root.join("fixtures/default-model/heldout.txt"));
    let (whole, experts) = crate::bench::routing::text_trace(model, &file, 2 * n)?;
    let train: Trace = whole.iter().map(|l| l[..n].to_vec()).collect();
    let test: Trace = whole.iter().map(|l| l[n..].to_vec()).collect();
    let no_cache = json!({"pruning": tables::pruning(&train, &test, experts)});
    Ok((Source { name: model.display().to_string(), test, train, experts, no_cache }, None))
}

pub fn run(o: &Options, json_out: bool) -> Result<Value> {
    anyhow::ensure!(o.tokens > 0 && o.layers > 0, "--tokens and --layers must be at least 1");
    let n = o.warm + o.tokens;
    let (src, process) = source(o)?;
    let predict = |l: u32, t: usize| match &process {
        Some((cfg, p, ids)) => p.predict(cfg, l, &RowContext::at(t, |i| ids[i]), cfg.top_k / 2),
        None => Vec::new(),
    };
    let mut policies = Vec::new();
    for &f in &o.sizes {
        let slots = slots_for(f, &src.test, src.experts);
        let learned = sim::learn(&src.train, slots, o.warm, 1);
        let choices: [(&str, Choice); 5] = [
            ("lru", Choice::Engine(Policy::Lru)),
            ("lfu", Choice::Engine(Policy::Lfu)),
            ("lfru", Choice::Engine(Policy::Lfru)),
            ("learned", Choice::Learned(learned.clone())),
            ("belady", Choice::Belady),
        ];
        let mut row = json!({"fraction": f, "slots": slots, "learned_weights": learned.w});
        for (name, c) in choices {
            let out = Sim::new(&src.test, slots, c, Variant::default()).run(o.warm, n, &predict);
            row[name] = outcome_json(&out);
        }
        policies.push(row);
    }
    let levers = levers(o, &src.test, src.experts, &predict, process.is_some());
    let report = json!({
        "routing": src.name, "layers": src.test.len(), "warm_tokens": o.warm, "tokens": o.tokens,
        "seed": o.seed, "policies": policies, "levers": levers, "no_cache": src.no_cache,
    });
    if !json_out {
        tables::print(&report);
    }
    Ok(report)
}

/// Each lever at `o.lever_size` with LFRU, against LFRU alone.
fn levers(
    o: &Options,
    test: &Trace,
    experts: usize,
    predict: &dyn Fn(u32, usize) -> Vec<u32>,
    lookahead: bool,
) -> Vec<Value> {
    let slots = slots_for(o.lever_size, test, experts);
    let low = o.low_ratio;
    let base = Variant { low_ratio: low, ..Variant::default() };
    let k = test.first().and_then(|l| l.first()).map_or(1, |r| r.experts.len());
    let (half, three_q) = ((k / 2).max(1), (3 * k / 4).max(1));
    let variants: [(String, Variant, &str); 8] = [
        ("lfru".into(), base, "exact"),
        ("lookahead, k/2 guesses".into(), Variant { lookahead: half, ..base }, "exact"),
        ("lookahead, k/4 guesses".into(), Variant { lookahead: (k / 4).max(1), ..base }, "exact"),
        (
            format!("hobbit: ranks {}-{k} low-bit on a miss", half + 1),
            Variant { hobbit_keep: Some(half), ..base },
            "changes results",
        ),
        (
            format!("hobbit: ranks {}-{k} low-bit on a miss", three_q + 1),
            Variant { hobbit_keep: Some(three_q), ..base },
            "changes results",
        ),
        ("dynaexq: a quarter of the bytes demoted".into(), Variant { dynaexq: true, ..base }, "changes results"),
        (format!("top-{three_q} of {k}"), Variant { top_k: Some(three_q), ..base }, "changes results"),
        (format!("top-{half} of {k}"), Variant { top_k: Some(half), ..base }, "changes results"),
    ];
    let n = o.warm + o.tokens;
    let mut rows = Vec::new();
    let mut base_records = f64::NAN;
    for (name, v, exact) in variants {
        if v.lookahead > 0 && !lookahead {
            continue; // a model's trace carries no lookahead guesses
        }
        let out = Sim::new(test, slots, Choice::Engine(Policy::Lfru), v).run(o.warm, n, predict);
        if name == "lfru" {
            base_records = out.per_token();
        }
        let mut row = outcome_json(&out);
        row["lever"] = json!(name);
        row["results"] = json!(exact);
        row["bytes_vs_lfru"] = json!(out.per_token() / base_records);
        rows.push(row);
    }
    let whole =
        Sim::new(test, slots, Choice::Engine(Policy::Lfru), base).with_layer_shares(false).run(o.warm, n, predict);
    let mut row = outcome_json(&whole);
    row["lever"] = json!("lfru, no layer shares (the engine before #37)");
    row["results"] = json!("exact");
    row["bytes_vs_lfru"] = json!(whole.per_token() / base_records);
    rows.push(row);
    rows
}
