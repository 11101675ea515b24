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

pub fn run(o: &Options, json_out: bool) -> Result<Value> {
    anyhow::ensure!(o.tokens > 0 && o.layers > 0, "--tokens and --layers must be at least 1");
    let (cfg, p) = k3_shape();
    let n = o.warm + o.tokens;
    let ids = random_ids(n, 160_000, o.seed);
    let test = trace(&p, &cfg, &ids, o.layers);
    let train = trace(&p, &cfg, &random_ids(n, 160_000, o.seed + 1000), o.layers);
    let predict = |l: u32, t: usize| p.predict(&cfg, l, &RowContext::at(t, |i| ids[i]), cfg.top_k / 2);
    let experts = cfg.experts;
    let mut policies = Vec::new();
    for &f in &o.sizes {
        let slots = slots_for(f, &test, experts);
        let learned = sim::learn(&train, slots, o.warm, 1);
        let choices: [(&str, Choice); 5] = [
            ("lru", Choice::Engine(Policy::Lru)),
            ("lfu", Choice::Engine(Policy::Lfu)),
            ("lfru", Choice::Engine(Policy::Lfru)),
            ("learned", Choice::Learned(learned.clone())),
            ("belady", Choice::Belady),
        ];
        let mut row = json!({"fraction": f, "slots": slots, "learned_weights": learned.w});
        for (name, c) in choices {
            let out = Sim::new(&test, slots, c, Variant::default()).run(0, o.warm, n, &predict);
            row[name] = outcome_json(&out);
        }
        policies.push(row);
    }
    let levers = levers(o, &test, experts, &predict);
    let no_cache = tables::without_cache(&p, &cfg, o);
    let report = json!({
        "routing": "k3-like (896 experts, top 16)", "layers": o.layers, "warm_tokens": o.warm, "tokens": o.tokens,
        "seed": o.seed, "policies": policies, "levers": levers, "no_cache": no_cache,
    });
    if !json_out {
        tables::print(&report);
    }
    Ok(report)
}

/// Each lever at `o.lever_size` with LFRU, against LFRU alone.
fn levers(o: &Options, test: &Trace, experts: usize, predict: &dyn Fn(u32, usize) -> Vec<u32>) -> Vec<Value> {
    let slots = slots_for(o.lever_size, test, experts);
    let low = o.low_ratio;
    let base = Variant { low_ratio: low, ..Variant::default() };
    let variants: [(&str, Variant, &str); 8] = [
        ("lfru", base, "exact"),
        ("lookahead 8", Variant { lookahead: 8, ..base }, "exact"),
        ("lookahead 4", Variant { lookahead: 4, ..base }, "exact"),
        ("hobbit: ranks 9-16 low-bit on a miss", Variant { hobbit_keep: Some(8), ..base }, "changes results"),
        ("hobbit: ranks 13-16 low-bit on a miss", Variant { hobbit_keep: Some(12), ..base }, "changes results"),
        ("dynaexq: a quarter of the bytes demoted", Variant { dynaexq: true, ..base }, "changes results"),
        ("top-12 of 16", Variant { top_k: Some(12), ..base }, "changes results"),
        ("top-8 of 16", Variant { top_k: Some(8), ..base }, "changes results"),
    ];
    let n = o.warm + o.tokens;
    let mut rows = Vec::new();
    let mut base_records = f64::NAN;
    for (name, v, exact) in variants {
        let out = Sim::new(test, slots, Choice::Engine(Policy::Lfru), v).run(0, o.warm, n, predict);
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
        Sim::new(test, slots, Choice::Engine(Policy::Lfru), base).with_layer_shares(false).run(0, o.warm, n, predict);
    let mut row = outcome_json(&whole);
    row["lever"] = json!("lfru, no layer shares (the engine before #37)");
    row["results"] = json!("exact");
    row["bytes_vs_lfru"] = json!(whole.per_token() / base_records);
    rows.push(row);
    rows
}
