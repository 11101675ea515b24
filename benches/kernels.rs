//! Criterion benchmarks of the k3-quant kernels (one core, weights hot in cache): K3's expert
//! shapes, a prefill chunk, and MLA attention's per-block products. `cargo xtask bench kernels`
//! measures the expert kernels hot and cold, side by side, next to the memory bandwidth, and
//! prints the table/JSON the ledger quotes.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use k3_quant::{dense, int4, int8, mxfp4, vq};
use std::hint::black_box;

/// K3 expert gate/up projection: [moe_intermediate 3072, latent 3584].
const ROWS: usize = 3072;
const COLS: usize = 3584;

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / u32::MAX as f32 - 0.5).collect()
}

fn kernels(c: &mut Criterion) {
    let w = data(ROWS * COLS, 1);
    let x = data(COLS, 2);
    let mut y = vec![0f32; ROWS];
    let mut g = c.benchmark_group("k3_expert_3072x3584");
    g.throughput(Throughput::Elements((ROWS * COLS) as u64));
    g.sample_size(20);

    let packed: Vec<u8> = (0..ROWS * COLS / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scale: Vec<u8> = (0..ROWS * COLS / 32).map(|i| 118 + (i % 8) as u8).collect();
    g.bench_function("mxfp4_f32", |b| b.iter(|| mxfp4::matvec(black_box(&packed), &scale, &x, &mut y)));
    let q8 = k3_quant::q8::Q8Batch::quantize(&x, COLS);
    g.bench_function("mxfp4_q8", |b| b.iter(|| k3_quant::q8::matmul_mxfp4(black_box(&packed), &scale, &q8, &mut y)));

    let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
    g.bench_function("bf16", |b| b.iter(|| dense::matvec_bf16(black_box(&wb), &x, &mut y)));
    let (q, s) = int8::quantize(&w, COLS);
    g.bench_function("int8_row", |b| b.iter(|| int8::matvec(black_box(&q), &s, &x, &mut y)));
    let (q4, s4) = int4::quantize(&w, COLS, 32);
    g.bench_function("int4_g32", |b| b.iter(|| int4::matvec(black_box(&q4), &s4, 32, &x, &mut y)));
    g.bench_function("int4_g32_q8", |b| b.iter(|| k3_quant::q8::matmul_int4(black_box(&q4), &s4, 32, &q8, &mut y)));
    for codec in vq::Codec::ALL {
        let m = k3_quant::encode::encode(codec, &w, COLS, &k3_quant::encode::EncodeOptions::fast())
            .expect("K3 shapes suit both codecs");
        let mut scratch = vq::Scratch::default();
        g.bench_function(codec.name(), |b| b.iter(|| m.matvec(black_box(&x), &mut y, &mut scratch)));
    }
    g.finish();
}

/// A prefill chunk of 64 vectors through a K3 shared-expert projection ([18432, 7168], far
/// beyond a core's cache): the matrix whole (weights re-streamed for every four vectors) against
/// the default row blocks (each block cached while all 64 vectors pass over it).
fn batched(c: &mut Criterion) {
    let (rows, cols, n) = (18432, 7168, 64);
    let wb: Vec<bf16> = data(rows * cols, 3).iter().map(|v| bf16::from_f32(*v)).collect();
    let xs = data(n * cols, 4);
    let mut ys = vec![0f32; n * rows];
    let m = k3_quant::Matrix::Bf16 { w: &wb, rows, cols, act: k3_quant::Activations::Exact };
    let mut g = c.benchmark_group("k3_prefill_18432x7168x64");
    g.throughput(Throughput::Elements((rows * cols * n) as u64));
    g.sample_size(10);
    g.bench_function("bf16_whole", |b| b.iter(|| m.matmul_in_blocks(black_box(&xs), &mut ys, rows)));
    g.bench_function("bf16_blocked", |b| b.iter(|| m.matmul(black_box(&xs), &mut ys)));
    g.finish();
}

/// MLA attention's two products over one block of 32 cached positions (hot in cache): all heads'
/// scores against the latents and shared keys, and the weighted sum of latents; at the default
/// model's widths (4 heads, latent 64, shared key 16) and at a K3 decode task's (16 of its
/// heads, 512, 64). Elements are multiply-adds.
fn attention(c: &mut Criterion) {
    use k3_quant::gemm::{self, Part};
    for (name, h, l, r) in [("default_4x64+16", 4, 64, 16), ("k3_16x512+64", 16, 512, 64)] {
        let (q, qe, keys, ke) = (data(h * l, 5), data(h * r, 6), data(32 * l, 7), data(32 * r, 8));
        let mut s = vec![0f32; h * 32];
        let mut lat = vec![0f32; h * l];
        let mut g = c.benchmark_group(format!("mla_block_{name}"));
        g.throughput(Throughput::Elements((h * 32 * (l + r)) as u64));
        let parts = [Part { a: &q, b: &keys, k: l }, Part { a: &qe, b: &ke, k: r }];
        g.bench_function("scores", |b| b.iter(|| gemm::abt_parts(black_box(&parts), &mut s, false)));
        g.throughput(Throughput::Elements((h * 32 * l) as u64));
        g.bench_function("weighted", |b| b.iter(|| gemm::pb_acc(black_box(&s), &keys, l, &mut lat)));
        g.finish();
    }
}

criterion_group!(benches, kernels, batched, attention);
criterion_main!(benches);
