//! `bench cache-sim`'s figures that need no cache (batches, speculation, pruning) and its tables.

use std::collections::HashSet;

use k3_router::RouterConfig;
use k3_router::synthetic::{K3Like, random_ids, trace};
use k3_router::trace_stats::Trace;
use serde_json::{Value, json};

use super::Options;

/// Distinct experts over activations, per layer and step, for rows `rows(t)` of each step.
fn union_factor(traces: &[&Trace], steps: impl Iterator<Item = Vec<(usize, usize)>>) -> f64 {
    let (mut distinct, mut activations) = (0usize, 0usize);
    for rows in steps {
        let layers = traces[0].len();
        (0..layers).for_each(|l| {
            let mut set = HashSet::new();
            for &(s, t) in &rows {
                let r = &traces[s][l][t];
                activations += r.experts.len();
                set.extend(r.experts.iter().copied());
            }
            distinct += set.len();
        });
    }
    distinct as f64 / activations.max(1) as f64
}

/// Batches of unrelated sequences, speculation's verify steps, pruning by use.
pub fn without_cache(p: &K3Like, cfg: &RouterConfig, o: &Options) -> Value {
    let n = o.warm + o.tokens;
    let seqs: Vec<Trace> = (0..8).map(|s| trace(p, cfg, &random_ids(n, 160_000, o.seed + 1 + s), o.layers)).collect();
    let refs: Vec<&Trace> = seqs.iter().collect();
    let batches: Vec<Value> = [1usize, 2, 4, 8]
        .iter()
        .map(|&b| {
            let u = union_factor(&refs[..b], (o.warm..n).map(|t| (0..b).map(|s| (s, t)).collect()));
            json!({"batch": b, "union_factor": u, "records_per_token_vs_one": u})
        })
        .collect();
    let mut speculation = Vec::new();
    for drafts in [2usize, 4, 8] {
        let w = drafts + 1;
        let u = union_factor(&refs[..1], (o.warm..n - w).step_by(w).map(|t| (t..t + w).map(|t| (0, t)).collect()));
        for accept in [0.5f64, 0.7, 0.9] {
            // Tokens a verify step yields: the model's own plus each draft kept while all before it were.
            let tokens: f64 = (0..w).map(|i| accept.powi(i as i32)).sum();
            speculation.push(json!({
                "drafts": drafts, "union_factor": u, "acceptance": accept, "tokens_per_step": tokens,
                "records_per_token_vs_plain": u * w as f64 / tokens,
            }));
        }
    }
    let pruning = pruning(&seqs[0], &seqs[1], cfg.experts);
    json!({"batches": batches, "speculation": speculation, "pruning": pruning})
}

/// The least used `q` of each layer's experts by `fit`'s use, and the share of `test`'s
/// activations (and routing weight) they carry: what pruning them saves in reads.
pub fn pruning(fit: &Trace, test: &Trace, experts: usize) -> Vec<Value> {
    [0.05, 0.1, 0.25]
        .iter()
        .map(|&q| {
            let (mut acts, mut pruned, mut mass, mut pruned_mass) = (0usize, 0usize, 0.0f64, 0.0f64);
            for (lf, lt) in fit.iter().zip(test) {
                let mut uses = vec![0usize; experts];
                lf.iter().flat_map(|r| &r.experts).for_each(|&e| uses[e as usize] += 1);
                let mut order: Vec<usize> = (0..experts).collect();
                order.sort_by_key(|&e| (uses[e], e));
                let cold: HashSet<u32> = order[..(q * experts as f64) as usize].iter().map(|&e| e as u32).collect();
                for r in lt {
                    for (e, w) in r.experts.iter().zip(&r.weights) {
                        acts += 1;
                        mass += f64::from(*w);
                        if cold.contains(e) {
                            pruned += 1;
                            pruned_mass += f64::from(*w);
                        }
                    }
                }
            }
            json!({"pruned_fraction": q, "activations_saved": pruned as f64 / acts.max(1) as f64,
                   "weight_mass_lost": pruned_mass / mass.max(1e-30)})
        })
        .collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

pub fn print(r: &Value) {
    println!(
        "expert cache on {} routing: {} layers, {} tokens after {} to warm; hit rate (records read per token)",
        r["routing"].as_str().unwrap_or(""),
        r["layers"],
        r["tokens"],
        r["warm_tokens"]
    );
    println!(
        "{:>8} {:>6}  {:>13} {:>13} {:>13} {:>13} {:>13}",
        "experts", "slots", "LRU", "LFU", "LFRU", "learned", "Belady (MIN)"
    );
    for row in r["policies"].as_array().into_iter().flatten() {
        let cell = |k: &str| format!("{:.1}% ({:.2})", 100.0 * f(&row[k], "hit_rate"), f(&row[k], "records_per_token"));
        let pct = format!("{:.1}%", 100.0 * f(row, "fraction"));
        println!(
            "{pct:>8} {:>6}  {:>13} {:>13} {:>13} {:>13} {:>13}",
            row["slots"],
            cell("lru"),
            cell("lfu"),
            cell("lfru"),
            cell("learned"),
            cell("belady")
        );
    }
    println!("\nlevers at one size, LFRU (records read per token; a low-bit read counted at its size)");
    println!("{:<46} {:>7} {:>9} {:>9} {:>9}  results", "lever", "hit", "records", "vs LFRU", "low-bit");
    for row in r["levers"].as_array().into_iter().flatten() {
        println!(
            "{:<46} {:>6.1}% {:>9.2} {:>9.3} {:>8.1}%  {}",
            row["lever"].as_str().unwrap_or(""),
            100.0 * f(row, "hit_rate"),
            f(row, "records_per_token"),
            f(row, "bytes_vs_lfru"),
            100.0 * f(row, "low_precision_share"),
            row["results"].as_str().unwrap_or("")
        );
    }
    let nc = &r["no_cache"];
    if nc["batches"].is_array() {
        println!("\nwithout a cache: batches of unrelated sequences (union factor = records per token vs one)");
        for b in nc["batches"].as_array().into_iter().flatten() {
            println!("  batch {:>2}: {:.3}", b["batch"], f(b, "union_factor"));
        }
        println!("speculation: records per accepted token vs plain decode");
        for s in nc["speculation"].as_array().into_iter().flatten() {
            println!(
                "  {} drafts (union {:.3}), acceptance {:.1}: {:.2} tokens a step, {:.3}",
                s["drafts"],
                f(s, "union_factor"),
                f(s, "acceptance"),
                f(s, "tokens_per_step"),
                f(s, "records_per_token_vs_plain")
            );
        }
    }
    println!("pruning the least used experts (use counted on another text)");
    for p in nc["pruning"].as_array().into_iter().flatten() {
        println!(
            "  {:.0}% pruned: {:.1}% of activations saved, {:.1}% of routing weight lost",
            100.0 * f(p, "pruned_fraction"),
            100.0 * f(p, "activations_saved"),
            100.0 * f(p, "weight_mass_lost")
        );
    }
}
