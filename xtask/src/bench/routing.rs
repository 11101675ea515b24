//! `cargo xtask bench routing`: a model's routing statistics next to the published K3 figures
//! (issue #37): next-token reuse, the union factor of 4 and 32 consecutive tokens (in the prompt's
//! prefill and in greedy decode), weight by rank, flatness of use, the overlap of two unrelated
//! texts, and the router lookahead's recall. For any model: the default one, a synthetic preset
//! (no tokenizer: seeded random token ids), a converted checkpoint.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_engine::{EngineOptions, OpenOptions, OwnedEngine, Session};
use k3_generate::sample::argmax;
use k3_router::lookahead::Predictor;
use k3_router::trace_stats::{TokenRoute, Trace, TraceStats, overlap};
use k3_text::tokenizer::Tokenizer;
use serde_json::{Value, json};

/// Published K3 figures (WARP's traces of real text, warp-spark's verifier, colibri), with where
/// each comes from.
const PUBLISHED: [(&str, f64, &str); 9] = [
    ("next_token_reuse", 0.295, "WARP, real text (Kimi-Linear 0.336)"),
    ("union_4_decode", 0.658, "warp-spark, 4 decode positions"),
    ("union_4_prefill", 0.763, "WARP, 4 prefill tokens"),
    ("union_32_prefill", 0.37, "colibri, 32 prefill tokens"),
    ("weight_rank_1", 0.149, "WARP"),
    ("weight_rank_8", 0.055, "WARP"),
    ("weight_rank_16", 0.032, "WARP"),
    ("lower_half_mass", 0.33, "WARP: ranks 9-16"),
    ("overlap_two_texts", 0.298, "Kimi-Linear (256 experts), two unrelated prompts; here their first 32 tokens"),
];

/// Tokens of the two texts whose experts are compared: the published overlap is of prompts, and
/// over hundreds of tokens a flat router uses nearly every expert of a layer.
const SHORT: usize = 32;

/// The first `n` tokens of every layer of `t`.
fn first(t: &Trace, n: usize) -> Trace {
    t.iter().map(|l| l[..n.min(l.len())].to_vec()).collect()
}

pub struct Options {
    pub model: PathBuf,
    pub prompt_file: Option<PathBuf>,
    pub prompt_tokens: usize,
    pub decode_tokens: usize,
}

/// The trace of a session, per MoE layer, from `first` on.
fn trace_of(s: &mut Session, first: usize) -> Trace {
    let mut layers: Vec<Vec<(usize, TokenRoute)>> = Vec::new();
    for r in s.routing_trace.take().unwrap_or_default().into_iter().filter(|r| r.position >= first) {
        let l = r.layer as usize;
        if layers.len() <= l {
            layers.resize_with(l + 1, Vec::new);
        }
        layers[l].push((r.position, TokenRoute { experts: r.experts, weights: r.weights }));
    }
    layers
        .into_iter()
        .filter(|l| !l.is_empty())
        .map(|mut l| {
            l.sort_by_key(|(p, _)| *p);
            l.into_iter().map(|(_, r)| r).collect()
        })
        .collect()
}

/// Two prompts of `n` tokens: the text's start and its second half's start (seeded random ids
/// for a model without a tokenizer).
fn prompts(tok: Option<&Tokenizer>, file: &Path, n: usize, vocab: usize) -> Result<(Vec<u32>, Vec<u32>)> {
    let Some(tok) = tok else {
        let ids = |seed: u64| {
            k3_quant::rng::noise(n, seed, 1.0).iter().map(|x| (x.abs() * 1e6) as u32 % vocab as u32).collect()
        };
        return Ok((ids(1), ids(2)));
    };
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let ids = tok.encode(&text);
    anyhow::ensure!(ids.len() >= 2 * n, "{} is {} tokens: give one of at least {}", file.display(), ids.len(), 2 * n);
    let half = ids.len() / 2;
    Ok((ids[..n].to_vec(), ids[half..half + n].to_vec()))
}

/// A model's routing of the first `n` tokens of `file` (seeded random ids for a model without a
/// tokenizer), fed as a prompt: per MoE layer, each position's experts and weights, with the
/// model's experts per layer.
pub fn text_trace(model: &Path, file: &Path, n: usize) -> Result<(Trace, usize)> {
    let opts = EngineOptions { context: n as u64 + 8, ..EngineOptions::default() };
    let owned = OwnedEngine::open(model, &OpenOptions::default(), opts)?;
    let engine = owned.engine();
    let tok = k3_generate::model_tokenizer(owned.model()).transpose()?;
    let ids = match tok {
        Some(t) => {
            let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
            let ids = t.encode(&text);
            anyhow::ensure!(ids.len() >= n, "{} is {} tokens: give one of at least {n}", file.display(), ids.len());
            ids[..n].to_vec()
        }
        None => prompts(None, file, n, engine.vocab())?.0,
    };
    let mut s = engine.session();
    s.routing_trace = Some(Vec::new());
    for c in ids.chunks(engine.prefill_chunk().max(1)) {
        engine.forward_last(&mut s, c)?;
    }
    Ok((trace_of(&mut s, 0), engine.config().experts as usize))
}

pub fn run(o: &Options, json_out: bool) -> Result<Value> {
    let opts = EngineOptions {
        context: (o.prompt_tokens + o.decode_tokens + 8) as u64,
        lookahead_stats: true,
        ..EngineOptions::default()
    };
    let owned = OwnedEngine::open(&o.model, &OpenOptions::default(), opts)?;
    let engine = owned.engine();
    let tok = k3_generate::model_tokenizer(owned.model()).transpose()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let file = o.prompt_file.clone().unwrap_or_else(|| root.join("fixtures/default-model/heldout.txt"));
    let (a, b) = prompts(tok.as_ref(), &file, o.prompt_tokens, engine.vocab())?;
    let experts = engine.config().experts as usize;
    let run = |ids: &[u32], decode: usize| -> Result<(Trace, Trace, Session)> {
        let mut s = engine.session();
        s.routing_trace = Some(Vec::new());
        let mut logits = Vec::new();
        for c in ids.chunks(engine.prefill_chunk().max(1)) {
            logits = engine.forward_last(&mut s, c)?;
        }
        let prefill = trace_of(&mut s, 0);
        s.routing_trace = Some(Vec::new());
        for _ in 0..decode {
            let next = argmax(&logits[logits.len() - engine.vocab()..]);
            logits = engine.forward(&mut s, &[next], None)?;
        }
        let decoded = trace_of(&mut s, ids.len());
        Ok((prefill, decoded, s))
    };
    let (prefill, decoded, session) = run(&a, o.decode_tokens)?;
    let (other, _, _) = run(&b, 0)?;
    let p = TraceStats::of(&prefill, experts, &[4, 32]);
    let d = TraceStats::of(&decoded, experts, &[4, 32]);
    let recall = session.lookahead.total(Predictor::AfterMoe).recall();
    let union = |s: &TraceStats, n: usize| s.union.iter().find(|(w, _)| *w == n).map_or(f64::NAN, |(_, u)| *u);
    let rank = |r: usize| p.weight_by_rank.get(r - 1).copied().unwrap_or(f64::NAN);
    let ours: [(&str, f64); 9] = [
        ("next_token_reuse", p.next_token_reuse),
        ("union_4_decode", union(&d, 4)),
        ("union_4_prefill", union(&p, 4)),
        ("union_32_prefill", union(&p, 32)),
        ("weight_rank_1", rank(1)),
        ("weight_rank_8", rank(8)),
        ("weight_rank_16", rank(16)),
        ("lower_half_mass", p.lower_half_mass),
        ("overlap_two_texts", overlap(&first(&prefill, SHORT), &first(&other, SHORT))),
    ];
    let rows: Vec<Value> = PUBLISHED
        .iter()
        .zip(ours)
        .map(|((name, k3, source), (_, v))| json!({"statistic": name, "model": v, "k3_published": k3, "ratio": v / k3, "source": source}))
        .collect();
    let report = json!({
        "model": o.model.display().to_string(), "experts": experts, "top_k": engine.config().experts_per_token,
        "prompt_tokens": o.prompt_tokens, "decode_tokens": o.decode_tokens, "rows": rows,
        "decode_next_token_reuse": d.next_token_reuse, "top_tenth_share": p.top_tenth_share,
        "lookahead_recall_after_moe": recall, "weight_by_rank": p.weight_by_rank,
    });
    if !json_out {
        println!(
            "routing of {} ({experts} experts, top {}), {} prompt + {} decoded tokens",
            o.model.display(),
            engine.config().experts_per_token,
            o.prompt_tokens,
            o.decode_tokens
        );
        println!("{:<20} {:>8} {:>8} {:>7}  source", "statistic", "model", "K3", "ratio");
        for r in &rows {
            println!(
                "{:<20} {:>8.3} {:>8.3} {:>7.2}  {}",
                r["statistic"].as_str().unwrap_or(""),
                r["model"].as_f64().unwrap_or(f64::NAN),
                r["k3_published"].as_f64().unwrap_or(f64::NAN),
                r["ratio"].as_f64().unwrap_or(f64::NAN),
                r["source"].as_str().unwrap_or("")
            );
        }
        println!(
            "decode next-token reuse {:.3}; top tenth of experts takes {:.3} of activations (flat: 0.1); \
                  lookahead recall (after MoE, top-k + k/2 predicted) {:.3} (K3: 0.59)",
            d.next_token_reuse, p.top_tenth_share, recall
        );
    }
    Ok(report)
}
