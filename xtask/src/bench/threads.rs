//! `cargo xtask bench kernels --threads N`: the matrix-vector products of a decode step split over
//! 1..N threads (`k3_quant::par`), on matrices far larger than the caches — a K3 trunk projection
//! in bf16, int8, int4 and FP8, sixteen MXFP4 experts and sixteen K2-Instruct FP8 experts in
//! turn — next to the memory read bandwidth
//! measured on the same thread count in the same run. The bound: bytes / bandwidth. Beside them,
//! a product with no serial part and no memory traffic (a cache-resident bf16 matrix times 64
//! vectors) shows how far this machine's cores scale when nothing else limits them.

use half::{bf16, f16};
use k3_quant::rng::noise;
use k3_quant::{Activations, Matrix, int4, int8, mxfp4, par};
use rayon::prelude::*;
use serde_json::{Value, json};

use super::{median, time};

/// A K3 KDA projection (q/k/v/g): [96 x 128, 7168].
const TRUNK: (usize, usize) = (12288, 7168);
/// K3's expert gate/up shape, cycled over this many experts (88 MB of MXFP4).
const EXPERT: (usize, usize) = (3072, 3584);
/// K2-Instruct's expert gate/up shape in FP8 (14.7 MB each), cycled over `EXPERTS` of them.
const K2_EXPERT: (usize, usize) = (2048, 7168);
const EXPERTS: usize = 16;
/// The cache-resident product: [2048, 2048] bf16 (8 MB) times this many vectors.
const HOT: (usize, usize, usize) = (2048, 2048, 64);

/// Streaming read bandwidth over `buf` on the current pool, GB/s: 256-bit loads into four
/// independent accumulators with the same software prefetch as the kernels (the strongest plain
/// read this machine does, so "fraction of bandwidth" is not flattered).
fn read_gbps(buf: &[u64]) -> f64 {
    let chunk = buf.len().div_ceil(rayon::current_num_threads() * 4).next_multiple_of(16);
    let t = time(|| {
        let s: u64 = buf.par_chunks(chunk).map(sum_chunk).reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(s);
    });
    (buf.len() * 8) as f64 / t / 1e9
}

/// The wrapping sum of `c`, read as fast as one core reads.
fn sum_chunk(c: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked just above).
        return unsafe { sum_avx2(c) };
    }
    c.iter().fold(0u64, |a, b| a.wrapping_add(*b))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_avx2(c: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let main = c.len() / 16 * 16;
    let mut i = 0;
    while i < main {
        // SAFETY: i + 16 <= main <= c.len(): four 4-lane loads in bounds; a prefetch never faults.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(c.as_ptr().wrapping_add(i + 256).cast());
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_epi64(*a, _mm256_loadu_si256(c.as_ptr().add(i + 4 * k).cast()));
            }
        }
        i += 16;
    }
    let mut lanes = [0u64; 4];
    let v = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    // SAFETY: `lanes` holds exactly the 32 bytes stored.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    lanes.iter().chain(&c[main..]).fold(0u64, |a, b| a.wrapping_add(*b))
}

/// One product to measure: its matrices (cycled) and their bytes each.
struct Case<'a> {
    name: &'static str,
    mats: Vec<Matrix<'a>>,
    bytes: usize,
}

impl<'a> Case<'a> {
    /// The same product with int8 activations.
    fn int8(&self, name: &'static str) -> Case<'a> {
        Case {
            name,
            mats: self.mats.iter().map(|m| m.with_activations(Activations::Int8)).collect(),
            bytes: self.bytes,
        }
    }
}

pub fn run(max_threads: usize, reps: usize, json_out: bool) -> Value {
    let (r, c) = TRUNK;
    let n = r * c;
    let w = noise(n, 1, 1.0);
    let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
    let (q8, s8) = int8::quantize(&w, c);
    let (q4, s4): (Vec<u8>, Vec<f16>) = int4::quantize(&w, c, 32);
    let scales = |r: usize, c: usize| vec![1e-3f32; r.div_ceil(128) * c.div_ceil(128)];
    let trunk_fp8 = (super::kernels::fp8_bytes(2, n), scales(r, c));
    drop(w);
    let (kr, kc) = K2_EXPERT;
    let k2: Vec<(Vec<u8>, Vec<f32>)> =
        (0..EXPERTS).map(|i| (super::kernels::fp8_bytes(30 + i as u64, kr * kc), scales(kr, kc))).collect();
    fn fp8((q, s): &(Vec<u8>, Vec<f32>), r: usize, c: usize) -> Matrix<'_> {
        Matrix::Fp8(k3_quant::fp8::Fp8Ref::new(q, s, r, c, 128, 128).expect("shapes"))
    }
    let (er, ec) = EXPERT;
    let experts: Vec<(Vec<u8>, Vec<u8>)> =
        (0..EXPERTS).map(|i| mxfp4::quantize(&noise(er * ec, 10 + i as u64, 1.0), ec)).collect();
    let exact = [
        Case {
            name: "bf16 12288x7168",
            mats: vec![Matrix::Bf16 { w: &wb, rows: r, cols: c, act: Activations::Exact }],
            bytes: n * 2,
        },
        Case {
            name: "int8_row 12288x7168",
            mats: vec![Matrix::Int8Row { q: &q8, scale: &s8, rows: r, cols: c, act: Activations::Exact }],
            bytes: n + r * 4,
        },
        Case {
            name: "int4_g32 12288x7168",
            mats: vec![Matrix::Int4Group { q: &q4, scale: &s4, group: 32, rows: r, cols: c, act: Activations::Exact }],
            bytes: n / 2 + n / 16,
        },
        Case {
            name: "mxfp4 3072x3584 x16",
            mats: experts
                .iter()
                .map(|(p, s)| Matrix::Mxfp4 { packed: p, scale: s, rows: er, cols: ec, act: Activations::Exact })
                .collect(),
            bytes: er * ec / 2 + er * ec / 32,
        },
        Case { name: "fp8_b128 12288x7168", mats: vec![fp8(&trunk_fp8, r, c)], bytes: n + trunk_fp8.1.len() * 4 },
        Case {
            name: "fp8_b128 2048x7168 x16",
            mats: k2.iter().map(|m| fp8(m, kr, kc)).collect(),
            bytes: kr * kc + k2[0].1.len() * 4,
        },
    ];
    // The int8, int4 and MXFP4 products again with int8 activations (VNNI where the CPU has it).
    let q8 = [
        exact[1].int8("int8_row_q8 12288x7168"),
        exact[2].int8("int4_g32_q8 12288x7168"),
        exact[3].int8("mxfp4_q8 3072x3584 x16"),
    ];
    let cases: Vec<Case<'_>> = exact.into_iter().chain(q8).collect();
    let (hr, hc, _) = HOT;
    let hot_w: Vec<bf16> = noise(hr * hc, 4, 1.0).iter().map(|v| bf16::from_f32(*v)).collect();
    let hot = Matrix::Bf16 { w: &hot_w, rows: hr, cols: hc, act: Activations::Exact };
    let buf: Vec<u64> = (0..(1usize << 30) / 8).map(|i| i as u64).collect();
    let rows: Vec<Value> =
        (1..=max_threads.max(1)).map(|threads| measure_threads(threads, reps, &cases, &hot, &buf)).collect();
    if !json_out {
        print_table(&cases, &rows, max_threads, reps);
    }
    json!({"threads": rows})
}

/// One row of `run`'s table: the read bandwidth, a hot bf16 product and every case on `threads`
/// threads, medians of `reps`.
/// `hot`: the bf16 product held in the caches; `buf`: the 1 GiB the read bandwidth is taken on.
fn measure_threads(threads: usize, reps: usize, cases: &[Case<'_>], hot: &Matrix<'_>, buf: &[u64]) -> Value {
    let (hr, hc, hn) = HOT;
    let hot_x = noise(hn * hc, 5, 1.0);
    let mut hot_y = vec![0f32; hn * hr];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
    // Every repetition measures the bandwidth and each product once, in turn, so drift on this
    // shared machine falls on all of them alike.
    let (mut bw, mut rates, mut hot_rate) = (Vec::new(), vec![Vec::new(); cases.len()], Vec::new());
    for _ in 0..reps {
        bw.push(pool.install(|| read_gbps(buf)));
        let t = pool.install(|| time(|| (0..4).for_each(|_| par::matmul(hot, &hot_x, &mut hot_y))));
        hot_rate.push((4 * hr * hc * hn) as f64 / t / 1e9);
        for (case, rate) in cases.iter().zip(rates.iter_mut()) {
            let x = noise(case.mats[0].cols(), 3, 1.0);
            let mut y = vec![0f32; case.mats[0].rows()];
            let calls = case.mats.len().max(4);
            let t = pool
                .install(|| time(|| (0..calls).for_each(|i| par::matvec(&case.mats[i % case.mats.len()], &x, &mut y))));
            rate.push((case.bytes * calls) as f64 / t / 1e9);
        }
    }
    let bw = median(bw);
    let mut kernels = serde_json::Map::new();
    for (case, rate) in cases.iter().zip(rates) {
        let gbps = median(rate);
        kernels.insert(case.name.into(), json!({"weight_gbps": gbps, "of_bandwidth": gbps / bw}));
    }
    let hot_gmacs = median(hot_rate);
    let peaks = super::peak::measure(threads, reps.min(3));
    let fma = peaks.iter().find(|(n, _)| *n == "f32 FMA (AVX2)").map_or(f64::NAN, |p| p.1);
    json!({
        "threads": threads, "mem_read_gbps": bw, "peak_gmacs": super::peak::to_json(&peaks),
        "hot_bf16_matmul_gmacs": hot_gmacs, "hot_bf16_of_fma_peak": hot_gmacs / fma, "kernels": kernels,
    })
}

/// The human-readable table of `run`'s rows.
fn print_table(cases: &[Case<'_>], rows: &[Value], max_threads: usize, reps: usize) {
    println!(
        "matvec over 1..{max_threads} threads, weights far beyond the caches (medians of {reps}): GB/s of weights (fraction of the read bandwidth on as many threads)"
    );
    print!("{:>7} {:>10} {:>12} {:>30}", "threads", "read GB/s", "FMA GMAC/s", "hot bf16 x64 GMAC/s (of FMA)");
    for case in cases {
        print!(" {:>26}", case.name);
    }
    println!();
    for row in rows {
        let hot = row["hot_bf16_matmul_gmacs"].as_f64().unwrap_or(0.0);
        let first = rows[0]["hot_bf16_matmul_gmacs"].as_f64().unwrap_or(1.0);
        print!(
            "{:>7} {:>10.2} {:>12.1} {:>13.2} ({:>4.2}x, {:>4.2})",
            row["threads"],
            row["mem_read_gbps"].as_f64().unwrap_or(0.0),
            row["peak_gmacs"]["f32 FMA (AVX2)"].as_f64().unwrap_or(0.0),
            hot,
            hot / first,
            row["hot_bf16_of_fma_peak"].as_f64().unwrap_or(0.0)
        );
        for case in cases {
            let k = &row["kernels"][case.name];
            print!(
                " {:>18.2} ({:>4.2})",
                k["weight_gbps"].as_f64().unwrap_or(0.0),
                k["of_bandwidth"].as_f64().unwrap_or(0.0)
            );
        }
        println!();
    }
}
