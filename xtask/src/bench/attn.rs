//! `cargo xtask bench attn`: the state-bound parts of decode at Kimi K3's dimensions, next to
//! their memory-traffic bounds (bytes touched / read bandwidth measured in the same run) and, for
//! MLA, the arithmetic bound.
//!
//! - KDA: the delta-rule update of 96 heads x 128 x 128 f32 state (6.3 MB per layer), cycling
//!   through 16 layers' states so they come from memory, as in a 69-KDA-layer decode.
//! - MLA: absorbed attention of 96 heads over 4K and 64K cached positions (512 + 64 f32 each).

use k3_attn::MlaConfig;
use k3_attn::kda::delta_rule;
use k3_attn::mla::attend;
use k3_quant::rng::noise;
use serde_json::{Value, json};

use super::{cpu_mhz, median, mem_read_gbps, time};

const H: usize = 96;
const HD: usize = 128;
const KDA_LAYERS: usize = 16;
const KV_LORA: usize = 512;
const ROPE: usize = 64;

fn kda(reps: usize, mem: f64) -> Value {
    let mut states: Vec<Vec<f32>> = (0..KDA_LAYERS).map(|l| noise(H * HD * HD, l as u64, 0.1)).collect();
    let q = noise(H * HD, 100, 0.2);
    let k = noise(H * HD, 101, 0.2);
    let v = noise(H * HD, 102, 1.0);
    let decay: Vec<f32> = noise(H * HD, 103, 0.1).iter().map(|x| 0.95 + x).collect();
    let (mut u, mut o) = (vec![0f32; HD], vec![0f32; H * HD]);
    let mut samples = Vec::new();
    for _ in 0..reps {
        let t = time(|| {
            for s in states.iter_mut() {
                for h in 0..H {
                    let r = h * HD..(h + 1) * HD;
                    delta_rule(
                        &mut s[h * HD * HD..(h + 1) * HD * HD],
                        &q[r.clone()],
                        &k[r.clone()],
                        &v[r.clone()],
                        &decay[r.clone()],
                        0.5,
                        &mut u,
                        &mut o[r],
                    );
                }
            }
        });
        samples.push(t / KDA_LAYERS as f64);
    }
    let secs = median(samples);
    let state_bytes = (H * HD * HD * 4) as f64;
    // Touched: every state byte read once and written once.
    let bound = 2.0 * state_bytes / (mem * 1e9);
    json!({
        "heads": H, "head_dim": HD, "state_bytes": state_bytes,
        "step_seconds": secs, "bound_seconds": bound, "fraction_of_bound": bound / secs,
        "state_gbps": 2.0 * state_bytes / secs / 1e9,
    })
}

fn mla(positions: usize, reps: usize, mem: f64, mhz: Option<f64>) -> Value {
    let cfg = MlaConfig {
        hidden: 7168,
        heads: H,
        kv_lora: KV_LORA,
        nope: 128,
        rope: ROPE,
        v_dim: 128,
        lowrank_eps: 1e-6,
        positions: k3_attn::PositionEmbedding::None,
    };
    let c = noise(positions * KV_LORA, 1, 1.0);
    let kext = noise(positions * ROPE, 2, 1.0);
    let qabs = noise(H * KV_LORA, 3, 0.1);
    let qext = noise(H * ROPE, 4, 0.1);
    let mut lat = vec![0f32; H * KV_LORA];
    let scale = 1.0 / ((cfg.nope + cfg.rope) as f32).sqrt();
    let mut samples = Vec::new();
    for _ in 0..reps {
        samples.push(time(|| attend(&qabs, &qext, &c, &kext, positions, KV_LORA, ROPE, scale, false, &mut lat)));
    }
    let secs = median(samples);
    let cache_bytes = (positions * (KV_LORA + ROPE) * 4) as f64;
    let bound = cache_bytes / (mem * 1e9);
    // Scores (512 + 64 MACs) and the weighted sum (512 MACs) per head and position.
    let flops = (H * positions * (KV_LORA + ROPE + KV_LORA) * 2) as f64;
    // AVX2 + FMA peak: 2 FMA units x 8 lanes x 2 flops per cycle.
    let peak = mhz.map(|m| m * 1e6 * 32.0);
    json!({
        "positions": positions, "cache_bytes": cache_bytes, "step_seconds": secs,
        "memory_bound_seconds": bound, "fraction_of_memory_bound": bound / secs,
        "gflops": flops / secs / 1e9,
        "compute_bound_seconds": peak.map(|p| flops / p),
        "fraction_of_compute_bound": peak.map(|p| flops / p / secs),
    })
}

pub fn run(reps: usize, json_out: bool) -> Value {
    let mem = mem_read_gbps(512 << 20, 5);
    let mhz = cpu_mhz();
    let report = json!({
        "mem_read_gbps": mem,
        "cpu_mhz": mhz,
        "kda_decode": kda(reps, mem),
        "mla_decode_4k": mla(4096, reps, mem, mhz),
        "mla_decode_64k": mla(65536, reps.min(5), mem, mhz),
    });
    if !json_out {
        println!("memory read {mem:.1} GB/s (one core); {} MHz nominal", mhz.unwrap_or(0.0));
        let k = &report["kda_decode"];
        println!(
            "KDA decode, 96 x 128 x 128 state: {:.3} ms per layer, bound {:.3} ms (state read + written once): {:.0}% of bound",
            k["step_seconds"].as_f64().unwrap_or(0.0) * 1e3,
            k["bound_seconds"].as_f64().unwrap_or(0.0) * 1e3,
            k["fraction_of_bound"].as_f64().unwrap_or(0.0) * 100.0
        );
        for key in ["mla_decode_4k", "mla_decode_64k"] {
            let m = &report[key];
            println!(
                "MLA decode over {} positions: {:.2} ms per layer; memory bound {:.2} ms ({:.1}%), compute bound {:.2} ms ({:.0}%), {:.1} GFLOP/s",
                m["positions"],
                m["step_seconds"].as_f64().unwrap_or(0.0) * 1e3,
                m["memory_bound_seconds"].as_f64().unwrap_or(0.0) * 1e3,
                m["fraction_of_memory_bound"].as_f64().unwrap_or(0.0) * 100.0,
                m["compute_bound_seconds"].as_f64().unwrap_or(0.0) * 1e3,
                m["fraction_of_compute_bound"].as_f64().unwrap_or(0.0) * 100.0,
                m["gflops"].as_f64().unwrap_or(0.0)
            );
        }
    }
    report
}
