//! `cargo xtask bench attn`: attention at Kimi K3's dimensions and long contexts, each part beside
//! the bound of what it uses (the memory read rate and the f32 FMA ceiling, both measured in the
//! same run), and K3's attention per token projected from the measured rates.
//!
//! - KDA decode: the delta-rule update of 96 heads x 128 x 128 f32 state (6.3 MB per layer),
//!   cycling through 16 layers' states so they come from memory, as in a 69-KDA-layer decode.
//! - KDA prefill: the state pass over a chunk of positions, position by position (the engine's
//!   form) and chunked (the WY / UT form), alternated; heads over the pool (the state stays in
//!   cache; the projections are products, counted with the products).
//! - MLA decode: one query's absorbed attention of 96 heads over P cached positions (512 + 64 f32
//!   each), on one thread and on the pool (groups of positions and heads split).
//! - MLA prefill: the last queries of a P-token prompt (eight a thread), over the pool, each over
//!   its causal span, in the absorbed form; and a whole last chunk in the expanded form (latents
//!   decompressed per head, then flash-style blocks), measured on [`EXPANDED_HEADS`] of K3's
//!   heads (heads are independent and alike) and scaled to 96. The projection of a P-token prompt
//!   takes, chunk by chunk, whichever form `MlaForm::Auto` would pick.

use k3_attn::KdaForm;
use k3_attn::kda::{delta_rule, state_pass};
use k3_attn::mla::{MlaForm, attend, attend_cache, attend_expanded, form_costs};
use k3_attn::{KvCacheType, MlaCache, MlaConfig, PositionEmbedding};
use k3_quant::rng::noise;
use rayon::prelude::*;
use serde_json::{Value, json};

use super::{median, mem_read_gbps, time};

const H: usize = 96;
const HD: usize = 128;
const KDA_LAYERS: usize = 16;
const KV_LORA: usize = 512;
const ROPE: usize = 64;
/// K3's layers of each kind (`models.md`: 69 KDA, 24 MLA of 93).
const K3_KDA: f64 = 69.0;
const K3_MLA: f64 = 24.0;
/// Cores of the projection.
const CORES: f64 = 8.0;
/// Multiply-adds per (query, cached position) pair of the absorbed form: scores over the latent
/// and the shared key, then the weighted sum of latents.
const MACS_PER_PAIR: f64 = (H * (KV_LORA + ROPE + KV_LORA)) as f64;
/// Heads the expanded form is measured on.
const EXPANDED_HEADS: usize = 8;
const NOPE: usize = 128;
const V: usize = 128;

/// K3's MLA with `heads` heads.
fn k3_mla(heads: usize) -> MlaConfig {
    MlaConfig {
        hidden: 7168,
        heads,
        kv_lora: KV_LORA,
        nope: NOPE,
        rope: ROPE,
        v_dim: V,
        lowrank_eps: 1e-6,
        positions: PositionEmbedding::None,
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a rayon pool")
}

/// The median seconds of `reps` runs of `f` on a pool of `threads`.
fn on_pool(threads: usize, reps: usize, mut f: impl FnMut() + Send) -> f64 {
    let p = pool(threads);
    median((0..reps).map(|_| time(|| p.install(&mut f))).collect())
}

/// The f32 FMA ceiling of one core, multiply-adds a second (the widest this CPU has).
fn fma_peak() -> f64 {
    peak_of("f32 FMA")
}

/// The ceiling of one core's widest instructions whose name starts with `family`.
fn peak_of(family: &str) -> f64 {
    k3_quant::peak::peaks()
        .iter()
        .filter(|p| p.name.starts_with(family))
        .map(|p| {
            let secs = median(
                (0..3)
                    .map(|i| {
                        time(|| {
                            std::hint::black_box((p.run)(i));
                        })
                    })
                    .collect(),
            );
            p.macs / secs
        })
        .fold(0.0, f64::max)
}

fn kda_decode(reps: usize, mem: f64) -> Value {
    let mut states: Vec<Vec<f32>> = (0..KDA_LAYERS).map(|l| noise(H * HD * HD, l as u64, 0.1)).collect();
    let (q, k, v) = (noise(H * HD, 100, 0.2), noise(H * HD, 101, 0.2), noise(H * HD, 102, 1.0));
    let decay: Vec<f32> = noise(H * HD, 103, 0.1).iter().map(|x| 0.95 + x).collect();
    let (mut u, mut o) = (vec![0f32; HD], vec![0f32; H * HD]);
    let mut samples = Vec::new();
    for _ in 0..reps {
        let t = time(|| {
            for s in states.iter_mut() {
                for h in 0..H {
                    let r = h * HD..(h + 1) * HD;
                    let s = &mut s[h * HD * HD..(h + 1) * HD * HD];
                    delta_rule(
                        s,
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
    })
}

/// KDA's state pass over a prompt chunk of `chunk` positions at K3's heads (96 x 128, its gate's
/// range of decays), heads over the pool, position by position and chunked alternately
/// ([`state_pass`]; the convolutions, norms and gates before it are the same in either form).
fn kda_prefill(chunk: usize, reps: usize, peak: f64, threads: usize) -> Value {
    let n = chunk * HD;
    let unit = |seed: u64| -> Vec<f32> {
        let mut x = noise(n, seed, 1.0);
        for row in x.chunks_mut(HD) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
        x
    };
    let (q, k, v) = (unit(6), unit(7), noise(n, 8, 1.0));
    // K3's gate: -5 sigmoid(.), here between -0.5 and 0.
    let g: Vec<f32> = noise(n, 9, 1.0).iter().map(|x| -0.25 * (1.0 + x.clamp(-1.0, 1.0))).collect();
    let beta: Vec<f32> = noise(chunk, 10, 1.0).iter().map(|x| 0.5 + 0.4 * x.clamp(-1.0, 1.0)).collect();
    let pool = pool(threads);
    let mut samples = [Vec::new(), Vec::new()];
    for _ in 0..reps {
        for (i, form) in [KdaForm::Recurrent, KdaForm::Chunked].into_iter().enumerate() {
            let mut states = noise(H * HD * HD, 5, 0.1);
            samples[i].push(time(|| {
                pool.install(|| {
                    states.par_chunks_mut(HD * HD).for_each(|s| {
                        let (mut gh, mut sink) = (g.clone(), 0f32);
                        state_pass(form, s, [&q, &k, &v], &mut gh, &beta, |_, o| sink += o[0]);
                        std::hint::black_box(sink);
                    })
                })
            }));
        }
    }
    let [rec, chunked] = samples.map(median);
    // The recurrence's multiply-adds per head and position: two reads of the state (S^T k,
    // S^T q) and its rank-one update.
    let macs = (chunk * H * HD * HD * 3) as f64;
    json!({
        "chunk": chunk, "threads": threads, "chunk_seconds": rec, "chunked_seconds": chunked,
        "chunked_speedup": rec / chunked, "seconds_per_token": rec / chunk as f64,
        "fraction_of_fma_peak": macs / rec / (peak * threads as f64),
        "chunked_fraction_of_fma_peak": macs / chunked / (peak * threads as f64),
    })
}

/// Synthetic latents and shared keys of `positions` cached positions.
struct Cache {
    c: Vec<f32>,
    kext: Vec<f32>,
}

impl Cache {
    fn new(positions: usize) -> Cache {
        Cache { c: noise(positions * KV_LORA, 1, 1.0), kext: noise(positions * ROPE, 2, 1.0) }
    }
}

fn scale() -> f32 {
    1.0 / ((128 + ROPE) as f32).sqrt()
}

/// One decode query over `positions` of a cache stored as `kind` on `threads`: seconds.
fn cached_decode(cache: &Cache, kind: KvCacheType, positions: usize, reps: usize, threads: usize) -> f64 {
    let mut rows = MlaCache::new(kind, KV_LORA, ROPE);
    for (c, k) in cache.c.chunks_exact(KV_LORA).zip(cache.kext.chunks_exact(ROPE)).take(positions) {
        rows.append(c, k).expect("rows of the cache's widths");
    }
    let (qabs, qext) = (noise(H * KV_LORA, 3, 0.1), noise(H * ROPE, 4, 0.1));
    let mut lat = vec![0f32; H * KV_LORA];
    on_pool(threads, reps, || {
        attend_cache(&qabs, &qext, &rows, positions, scale(), threads > 1, &mut lat)
            .expect("queries of the cache's widths")
    })
}

/// Decode over each of `kinds`' caches: on one thread, the pool, and K3's projection.
/// `peaks`: one core's f32 FMA and int8 dot ceilings (an absent ceiling, 0, reports no fraction).
fn decode_by_cache(
    cache: &Cache,
    kinds: &[KvCacheType],
    positions: usize,
    (reps, threads): (usize, usize),
    peaks: (f64, f64),
) -> Value {
    let macs = MACS_PER_PAIR * positions as f64;
    // The int8 path's arithmetic is integer dots (VNNI, or AVX2's vpmaddubsw).
    let rows: Vec<Value> = kinds
        .iter()
        .map(|&kind| {
            let one = cached_decode(cache, kind, positions, reps, 1);
            let pooled = cached_decode(cache, kind, positions, reps, threads);
            let peak = if kind == KvCacheType::Int8 { peaks.1 } else { peaks.0 };
            let fraction = if peak > 0.0 { macs / one / peak } else { f64::NAN };
            json!({
                "kv_cache": kind.name(), "decode_seconds_one_thread": one, "decode_seconds": pooled,
                "fraction_of_peak": fraction,
                "k3_decode_attention_seconds_per_token": K3_MLA * macs / (macs / (pooled * threads as f64) * CORES),
            })
        })
        .collect();
    Value::Array(rows)
}

/// One decode query over `positions` on `threads`.
fn mla_decode(cache: &Cache, positions: usize, reps: usize, threads: usize) -> f64 {
    let (qabs, qext) = (noise(H * KV_LORA, 3, 0.1), noise(H * ROPE, 4, 0.1));
    let mut lat = vec![0f32; H * KV_LORA];
    on_pool(threads, reps, || {
        attend(&qabs, &qext, &cache.c, &cache.kext, positions, KV_LORA, ROPE, scale(), threads > 1, &mut lat)
    })
}

/// The last `chunk` queries of a `positions`-token prompt, rows over the pool.
fn mla_prefill(cache: &Cache, positions: usize, chunk: usize, reps: usize, threads: usize) -> f64 {
    let (qabs, qext) = (noise(chunk * H * KV_LORA, 3, 0.1), noise(chunk * H * ROPE, 4, 0.1));
    let mut lat = vec![0f32; chunk * H * KV_LORA];
    let from = positions - chunk;
    on_pool(threads, reps, || {
        lat.par_chunks_mut(H * KV_LORA).enumerate().for_each(|(i, lat)| {
            let (qa, qe) = (&qabs[i * H * KV_LORA..][..H * KV_LORA], &qext[i * H * ROPE..][..H * ROPE]);
            attend(qa, qe, &cache.c, &cache.kext, from + i + 1, KV_LORA, ROPE, scale(), false, lat)
        })
    })
}

/// The last `chunk` queries of a `positions`-token prompt in the expanded form, on
/// [`EXPANDED_HEADS`] heads over the pool: seconds.
fn mla_expanded(cache: &Cache, positions: usize, chunk: usize, reps: usize, threads: usize) -> f64 {
    let cfg = k3_mla(EXPANDED_HEADS);
    let h = EXPANDED_HEADS;
    let w: Vec<half::bf16> = noise(h * (NOPE + V) * KV_LORA, 5, 0.05).into_iter().map(half::bf16::from_f32).collect();
    let kv_b = k3_quant::Matrix::bf16(&w, h * (NOPE + V), KV_LORA).ok().and_then(|m| m.dense()).expect("bf16 is dense");
    let q = noise(chunk * h * (NOPE + ROPE), 6, 0.1);
    let mut ctx = vec![0f32; chunk * h * V];
    on_pool(threads, reps, || {
        attend_expanded(&cfg, &kv_b, scale(), &cache.c, &cache.kext, positions, &q, threads > 1, &mut ctx)
    })
}

/// Core-seconds of a `positions`-token prompt's MLA attention (one layer) in chunks of `chunk`,
/// each chunk in the form [`MlaForm::Auto`] picks, at the measured per-core rates (multiply-adds
/// a core-second) of each form.
fn prompt_core_seconds(positions: usize, chunk: usize, absorbed_rate: f64, expanded_rate: f64) -> f64 {
    let cfg = k3_mla(H);
    (chunk..=positions.next_multiple_of(chunk))
        .step_by(chunk)
        .map(|end| {
            let end = end.min(positions);
            let rows = chunk.min(end);
            let (a, e) = form_costs(&cfg, rows, end);
            if MlaForm::Auto.expands(&cfg, rows, end) { e as f64 / expanded_rate } else { a as f64 / absorbed_rate }
        })
        .sum()
}

/// MLA at one context length: decode on one thread and the pool, the last prefill chunk, and the
/// K3 projection on [`CORES`] cores at the measured per-core rates.
#[allow(clippy::too_many_arguments)]
fn mla(
    positions: usize,
    chunk: usize,
    reps: usize,
    mem: f64,
    (peak, int8_peak): (f64, f64),
    threads: usize,
    kinds: &[KvCacheType],
) -> Value {
    let cache = Cache::new(positions);
    let by_cache = decode_by_cache(&cache, kinds, positions, (reps, threads), (peak, int8_peak));
    let one = mla_decode(&cache, positions, reps, 1);
    let pooled = mla_decode(&cache, positions, reps, threads);
    // Queries of the last chunk measured: a few per thread (a query at 128k positions is ~13 G
    // multiply-adds; the rate a pair is what the projection takes).
    let chunk = chunk.min(positions);
    let few = chunk.min(8 * threads);
    let pre = mla_prefill(&cache, positions, few, reps.min(3), threads);
    let expanded = mla_expanded(&cache, positions, chunk, reps.min(3), threads);
    let expanded_macs = form_costs(&k3_mla(EXPANDED_HEADS), chunk, positions).1 as f64;
    let expanded_rate = expanded_macs / (expanded * threads as f64);
    let cache_bytes = (positions * (KV_LORA + ROPE) * 4) as f64;
    let decode_macs = MACS_PER_PAIR * positions as f64;
    // The chunk's pairs: each query over its causal span.
    let chunk_macs = MACS_PER_PAIR * (few * (positions - few) + few * (few + 1) / 2) as f64;
    // Core-seconds a MAC, from the pooled runs (what scaling the pool measured is in them).
    let decode_rate = decode_macs / (pooled * threads as f64);
    let prefill_rate = chunk_macs / (pre * threads as f64);
    // A P-token prompt attends P^2 / 2 pairs a layer.
    let prompt_pairs = (positions as f64).powi(2) / 2.0;
    json!({
        "positions": positions, "cache_bytes": cache_bytes,
        "decode_seconds_one_thread": one, "decode_seconds": pooled, "threads": threads,
        "decode_by_cache": by_cache,
        "decode_speedup": one / pooled,
        "decode_fraction_of_fma_peak": decode_macs / one / peak,
        "decode_fraction_of_memory_bound": cache_bytes / (mem * 1e9) / one,
        "prefill_queries": few, "prefill_seconds": pre,
        "prefill_fraction_of_fma_peak": chunk_macs / pre / (peak * threads as f64),
        "expanded_chunk": chunk, "expanded_heads": EXPANDED_HEADS, "expanded_seconds": expanded,
        "expanded_fraction_of_fma_peak": expanded_macs / expanded / (peak * threads as f64),
        "k3_prefill_mla_absorbed_seconds_per_token": K3_MLA * MACS_PER_PAIR * prompt_pairs / (prefill_rate * CORES) / positions as f64,
        "k3_decode_attention_seconds_per_token": K3_MLA * decode_macs / (decode_rate * CORES),
        "k3_prefill_mla_seconds_per_token":
            K3_MLA * prompt_core_seconds(positions, chunk, prefill_rate, expanded_rate) / CORES / positions as f64,
    })
}

/// A context length: `4k`, `64k`, `1m` or a plain number of positions.
pub fn context(s: &str) -> anyhow::Result<usize> {
    let p = s.trim().to_ascii_lowercase();
    let (num, mul) = match p.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => p.strip_suffix('m').map_or((p.as_str(), 1), |n| (n, 1 << 20)),
    };
    let n: usize = num.parse().map_err(|_| anyhow::anyhow!("`{s}` is not a length like 4k or 65536"))?;
    anyhow::ensure!((1..=1 << 20).contains(&n.saturating_mul(mul)), "{s} is not within 1..=1m positions");
    Ok(n * mul)
}

pub fn run(
    contexts: &[usize],
    chunk: usize,
    threads: usize,
    reps: usize,
    kinds: &[KvCacheType],
    json_out: bool,
) -> Value {
    let mem = mem_read_gbps(512 << 20, 5);
    let peak = fma_peak();
    let int8_peak = peak_of("int8 dot");
    let kda_pre = kda_prefill(chunk, reps.min(3), peak, threads);
    let k3_kda_prefill = K3_KDA * kda_pre["seconds_per_token"].as_f64().unwrap_or(0.0) * threads as f64 / CORES;
    let mla_rows: Vec<Value> =
        contexts.iter().map(|&p| mla(p, chunk, reps, mem, (peak, int8_peak), threads, kinds)).collect();
    let report = json!({
        "cpu": super::cpu_name(), "mem_read_gbps": mem, "f32_fma_peak_gmacs": peak / 1e9,
        "int8_dot_peak_gmacs": int8_peak / 1e9, "threads": threads,
        "kda_decode": kda_decode(reps, mem), "kda_prefill": kda_pre,
        "k3_kda_prefill_seconds_per_token": k3_kda_prefill, "mla": mla_rows,
    });
    if !json_out {
        print_table(&report);
    }
    report
}

fn print_table(r: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "{}; memory read {:.1} GB/s (one core); f32 FMA ceiling {:.1} G MAC/s a core; pool of {} threads",
        r["cpu"].as_str().unwrap_or("?"),
        f(r, "mem_read_gbps"),
        f(r, "f32_fma_peak_gmacs"),
        r["threads"]
    );
    let k = &r["kda_decode"];
    println!(
        "KDA decode (96 x 128 x 128 state): {:.3} ms a layer, {:.0}% of its memory bound",
        f(k, "step_seconds") * 1e3,
        f(k, "fraction_of_bound") * 100.0
    );
    let k = &r["kda_prefill"];
    println!(
        "KDA prefill, chunk of {}: recurrence {:.1} ms a layer ({:.0}% of the FMA ceiling), chunked {:.1} ms ({:.2}x); K3 on {CORES} cores: {:.3} s a token",
        k["chunk"],
        f(k, "chunk_seconds") * 1e3,
        f(k, "fraction_of_fma_peak") * 100.0,
        f(k, "chunked_seconds") * 1e3,
        f(k, "chunked_speedup"),
        f(r, "k3_kda_prefill_seconds_per_token")
    );
    println!(
        "{:>9} {:>11} {:>11} {:>7} {:>7} {:>12} {:>7} {:>13} {:>7} {:>13} {:>13} {:>13}",
        "positions",
        "decode 1t",
        "decode pool",
        "x",
        "% FMA",
        "prefill 8/thr",
        "% FMA",
        "expanded",
        "% FMA",
        "K3 decode s/t",
        "K3 absorbed",
        "K3 prefill s/t"
    );
    for m in r["mla"].as_array().into_iter().flatten() {
        println!(
            "{:>9} {:>9.2}ms {:>9.2}ms {:>7.2} {:>6.0}% {:>11.1}ms {:>6.0}% {:>11.1}ms {:>6.0}% {:>13.3} {:>13.3} {:>14.3}",
            m["positions"],
            f(m, "decode_seconds_one_thread") * 1e3,
            f(m, "decode_seconds") * 1e3,
            f(m, "decode_speedup"),
            f(m, "decode_fraction_of_fma_peak") * 100.0,
            f(m, "prefill_seconds") * 1e3,
            f(m, "prefill_fraction_of_fma_peak") * 100.0,
            f(m, "expanded_seconds") * 1e3,
            f(m, "expanded_fraction_of_fma_peak") * 100.0,
            f(m, "k3_decode_attention_seconds_per_token"),
            f(m, "k3_prefill_mla_absorbed_seconds_per_token"),
            f(m, "k3_prefill_mla_seconds_per_token")
        );
    }
    println!(
        "{:>9} {:>8} {:>11} {:>11} {:>9} {:>10} {:>13}",
        "positions", "cache", "decode 1t", "decode pool", "vs f32", "% of peak", "K3 decode s/t"
    );
    for m in r["mla"].as_array().into_iter().flatten() {
        for c in m["decode_by_cache"].as_array().into_iter().flatten() {
            println!(
                "{:>9} {:>8} {:>9.2}ms {:>9.2}ms {:>8.2}x {:>9.0}% {:>13.3}",
                m["positions"],
                c["kv_cache"].as_str().unwrap_or("?"),
                f(c, "decode_seconds_one_thread") * 1e3,
                f(c, "decode_seconds") * 1e3,
                f(m, "decode_seconds_one_thread") / f(c, "decode_seconds_one_thread"),
                f(c, "fraction_of_peak") * 100.0,
                f(c, "k3_decode_attention_seconds_per_token"),
            );
        }
    }
}
