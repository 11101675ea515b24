//! `cargo xtask bench verify`: what checking the trunk's checksums at load costs. xxh3 over
//! tensor-sized pieces of a buffer in memory on 1 and on every thread, side by side; with a model,
//! its load with and without the check; and the projection for K3's ~27 GB trunk.

use std::path::Path;

use anyhow::Result;
use k3_engine::{Engine, EngineOptions};
use rayon::prelude::*;
use serde_json::{Value, json};

use super::{median, time};

/// K3's trunk (attention, dense layer, shared experts, router, latent projections, embeddings).
const K3_TRUNK_BYTES: f64 = 27e9;
/// The cores the K3 projection assumes (docs/EFFICIENCY.md).
const K3_CORES: f64 = 8.0;

/// GB/s hashing `buf` as 64 MB tensors on a pool of `threads`.
fn hash_rate(buf: &[u8], threads: usize, reps: usize) -> Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let samples: Vec<f64> = (0..reps)
        .map(|_| {
            let t = time(|| {
                pool.install(|| {
                    let h: u64 = buf.par_chunks(64 << 20).map(xxhash_rust::xxh3::xxh3_64).reduce(|| 0, |a, b| a ^ b);
                    std::hint::black_box(h);
                })
            });
            buf.len() as f64 / t / 1e9
        })
        .collect();
    Ok(median(samples))
}

pub fn run(model: Option<&Path>, reps: usize, json_out: bool) -> Result<Value> {
    let threads = rayon::current_num_threads();
    let buf: Vec<u8> = (0..1u64 << 30).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
    let (one, all) = (hash_rate(&buf, 1, reps)?, hash_rate(&buf, threads, reps)?);
    drop(buf);
    let mut report = json!({
        "xxh3_gbps_1_thread": one, "xxh3_gbps_all_threads": all, "threads": threads,
        "k3_trunk_bytes": K3_TRUNK_BYTES, "k3_cores": K3_CORES,
        "k3_trunk_check_seconds": K3_TRUNK_BYTES / (one * 1e9 * K3_CORES),
    });
    if let Some(path) = model {
        let m = k3_format::Model::open(path)?;
        let load = |verify_trunk: bool| -> Result<f64> {
            let mut samples = Vec::new();
            for _ in 0..reps {
                let opts = EngineOptions { verify_trunk, ..EngineOptions::default() };
                samples.push(time(|| drop(Engine::load_with(&m, opts))));
            }
            Ok(median(samples))
        };
        // Interleaved: the unchecked load first warms the page cache for both.
        let (plain, checked) = (load(false)?, load(true)?);
        report["model"] = json!({
            "path": path.display().to_string(), "trunk_bytes": m.manifest().trunk.bytes,
            "load_seconds": plain, "load_checked_seconds": checked, "ratio": checked / plain,
        });
    }
    if !json_out {
        println!("xxh3 over 64 MB pieces of 1 GiB in memory (medians of {reps}):");
        println!("  1 thread      {one:>7.2} GB/s");
        println!("  {threads} threads     {all:>7.2} GB/s  ({:.2}x)", all / one);
        if let Some(m) = report.get("model") {
            println!(
                "loading {}: {:.3} s unchecked, {:.3} s with the trunk check ({:.2}x; trunk {:.1} MB)",
                m["path"].as_str().unwrap_or(""),
                m["load_seconds"].as_f64().unwrap_or(0.0),
                m["load_checked_seconds"].as_f64().unwrap_or(0.0),
                m["ratio"].as_f64().unwrap_or(0.0),
                m["trunk_bytes"].as_f64().unwrap_or(0.0) / 1e6
            );
        }
        println!(
            "K3's ~27 GB trunk on {K3_CORES} such cores: {:.2} s of hashing at load (besides reading it once, which the first token does anyway)",
            K3_TRUNK_BYTES / (one * 1e9 * K3_CORES)
        );
    }
    Ok(report)
}
