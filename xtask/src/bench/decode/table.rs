//! The table `bench decode` prints: one row per configuration, the prefill, and what batching
//! and drafting bought.

use serde_json::Value;

use super::Options;
use super::ceiling::Ceiling;

pub(super) fn print_table(o: &Options<'_>, report: &Value, ceiling: &Ceiling) {
    let prompt_len = report["prompt_tokens"].as_u64().unwrap_or(0);
    let empty = serde_json::Map::new();
    let variants = report["variants"].as_object().unwrap_or(&empty);
    println!("decode of {} tokens per sequence after a {prompt_len}-token prompt, {} reps (medians)", o.tokens, o.reps);
    println!("{}", ceiling.describe());
    println!(
        "{:<30} {:>8} {:>8} {:>10} {:>10} {:>7} {:>9} {:>9} {:>8} {:>7} {:>9} {:>10} {:>9}",
        "variant",
        "tok/s",
        "speedup",
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
    for (name, v) in variants {
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        println!(
            "{name:<30} {:>8.3} {:>7.2}x {:>10.1} {:>10.2} {:>6.1}% {:>9.4} {:>9.4} {:>8.2} {:>7} {:>9} {:>10.3} {:>8.1}%",
            f("tok_per_s"),
            f("speedup"),
            f("prefill_tok_per_s"),
            f("bytes_per_token") / 1e6,
            100.0 * f("hit_rate"),
            f("io_wait_s_per_token"),
            f("compute_s_per_token"),
            f("overlap_efficiency"),
            v["lookahead_recall"].as_f64().map_or("-".to_string(), |r| format!("{r:.2}")),
            v["io_bound_ratio"].as_f64().map_or("-".to_string(), |r| format!("{r:.2}x")),
            f("warm_tok_per_s"),
            100.0 * f("warm_hit_rate")
        );
    }
    // The prefill: its chunk, speed and expert bytes read per prompt token, cold and warm.
    println!();
    println!(
        "{:<30} {:>7} {:>11} {:>12} {:>16} {:>17}",
        "variant", "chunk", "prefill/s", "prefill MB/t", "warm prefill/s", "warm prefill MB/t"
    );
    for (name, v) in variants {
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        println!(
            "{name:<30} {:>7} {:>11.2} {:>12.2} {:>16.2} {:>17.2}",
            f("chunk"),
            f("prefill_tok_per_s"),
            f("prefill_bytes_per_token") / 1e6,
            f("warm_prefill_tok_per_s"),
            f("warm_prefill_bytes_per_token") / 1e6
        );
    }
    if o.batches.len() > 1 || o.speculate.iter().any(|&k| k > 0) {
        println!();
        println!(
            "{:<30} {:>12} {:>12} {:>8} {:>10} {:>10}",
            "variant", "experts/step", "tokens/step", "union", "accepted", "switched off"
        );
        for (name, v) in variants {
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            println!(
                "{name:<30} {:>12.1} {:>12.2} {:>8.3} {:>9.1}% {:>10}",
                f("experts_per_step"),
                f("tokens_per_step"),
                f("union_factor"),
                100.0 * f("acceptance_rate"),
                f("switched_off")
            );
        }
    }
}
