//! The arithmetic ceilings of this CPU (`k3_quant::peak`'s loops), measured on N threads: every
//! thread its own loop, nothing read from memory; and which ceiling each kernel of `bench
//! kernels` is held against.

use rayon::prelude::*;
use serde_json::{Value, json};

use super::{median, time};

/// Each ceiling in G multiply-adds per second on `threads` threads, medians of `reps`.
pub fn measure(threads: usize, reps: usize) -> Vec<(&'static str, f64)> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
    let peaks = k3_quant::peak::peaks();
    let mut samples = vec![Vec::new(); peaks.len()];
    for _ in 0..reps.max(1) {
        for (p, s) in peaks.iter().zip(samples.iter_mut()) {
            let t = pool.install(|| {
                time(|| {
                    let x: f32 = (0..threads).into_par_iter().map(|i| (p.run)(i as u64 + 1)).sum();
                    std::hint::black_box(x);
                })
            });
            s.push(p.macs * threads as f64 / t / 1e9);
        }
    }
    peaks.iter().zip(samples).map(|(p, s)| (p.name, median(s))).collect()
}

/// The ceiling a kernel's multiply-adds are bound by, by the kernel's name in `bench kernels`:
/// the f32 kernels (every one of them AVX2 code at any level) by AVX2's FMA, the int8-activation
/// MXFP4 kernel by AVX2's `vpmaddubsw`. The fast-scan VQ kernel adds table entries instead of
/// multiplying: it has no multiply-add ceiling (its bound is the bandwidth).
pub fn ceiling_of(kernel: &str) -> Option<&'static str> {
    if kernel.contains("_bf16act") && k3_quant::bf16dot::available_at(k3_quant::cpu::level()) {
        Some("bf16 dot (AVX512-BF16)")
    } else if kernel.contains("_q8") {
        // The int8-activation products run on VNNI at the AVX-512 level, on `vpmaddubsw` at AVX2's
        // (`K3_SIMD=avx2` on an AVX-512 machine included).
        Some(if vnni_level() { "int8 dot (AVX512-VNNI)" } else { "int8 dot (AVX2 vpmaddubsw)" })
    } else if ["bf16", "int8_row", "int4_g32", "mxfp4_f32", "vq_b"].iter().any(|k| kernel.starts_with(k)) {
        Some("f32 FMA (AVX2)")
    } else {
        None
    }
}

/// Whether the kernels run at the AVX-512 (VNNI) level.
fn vnni_level() -> bool {
    #[cfg(target_arch = "x86_64")]
    return k3_quant::cpu::level() >= k3_quant::cpu::Level::Avx512;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The ceilings as a JSON object, name -> G multiply-adds per second.
pub fn to_json(peaks: &[(&'static str, f64)]) -> Value {
    Value::Object(peaks.iter().map(|(n, g)| (n.to_string(), json!(g))).collect())
}
