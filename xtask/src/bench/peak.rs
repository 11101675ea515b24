//! The arithmetic ceilings of this CPU, measured: multiply-adds per second of each instruction
//! family a kernel can use, on the current rayon pool (every thread its own loop, nothing read
//! from memory). A kernel's rate is then stated as a fraction of the ceiling of the arithmetic it
//! uses: f32 FMA (AVX2 256-bit, AVX-512 512-bit), bf16 dot (`vdpbf16ps`, AVX512-BF16), int8 dot
//! (`vpdpbusd`, AVX512-VNNI; AVX2's `vpmaddubsw`, whose i16 pairs a kernel then widens).

use rayon::prelude::*;
use serde_json::{Value, json};

use super::{median, time};

/// One ceiling: its name, multiply-adds per call of `run` (per thread), and the loop.
struct Peak {
    name: &'static str,
    macs: f64,
    run: fn(u64) -> f32,
}

/// Iterations of each loop per call: long enough that timing overhead vanishes (~10-50 ms).
const ITERS: u64 = 4 << 20;
/// Independent accumulators per loop: enough to cover the FMA latency (4-5 cycles) on two ports.
const ACC: usize = 12;

/// The ceilings this CPU has.
fn peaks() -> Vec<Peak> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        let n = (ITERS * ACC as u64) as f64;
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            v.push(Peak { name: "f32 FMA (AVX2)", macs: n * 8.0, run: x86::fma256 });
            v.push(Peak { name: "int8 dot (AVX2 vpmaddubsw)", macs: n * 32.0, run: x86::maddubs256 });
        }
        if is_x86_feature_detected!("avx512f") {
            v.push(Peak { name: "f32 FMA (AVX-512)", macs: n * 16.0, run: x86::fma512 });
        }
        if is_x86_feature_detected!("avx512bf16") {
            v.push(Peak { name: "bf16 dot (AVX512-BF16)", macs: n * 32.0, run: x86::dpbf16 });
        }
        if is_x86_feature_detected!("avx512vnni") {
            v.push(Peak { name: "int8 dot (AVX512-VNNI)", macs: n * 64.0, run: x86::dpbusd512 });
        }
    }
    v
}

/// Each ceiling in G multiply-adds per second on `threads` threads, medians of `reps`.
pub fn measure(threads: usize, reps: usize) -> Vec<(&'static str, f64)> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
    let peaks = peaks();
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
    if kernel.starts_with("mxfp4_q8") {
        Some("int8 dot (AVX2 vpmaddubsw)")
    } else if ["bf16", "int8_row", "int4_g32", "mxfp4_f32", "vq_b"].iter().any(|k| kernel.starts_with(k)) {
        Some("f32 FMA (AVX2)")
    } else {
        None
    }
}

/// The ceilings as a JSON object, name -> G multiply-adds per second.
pub fn to_json(peaks: &[(&'static str, f64)]) -> Value {
    Value::Object(peaks.iter().map(|(n, g)| (n.to_string(), json!(g))).collect())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The loops: `ACC` independent accumulators, one instruction each per iteration, operands
    //! in registers. The seed keeps the compiler from folding the loop; the result is returned.
    use std::arch::x86_64::*;

    use super::{ACC, ITERS};

    #[target_feature(enable = "avx2,fma")]
    fn fma256_impl(seed: u64) -> f32 {
        let a = _mm256_set1_ps(1.0 + seed as f32 * 1e-9);
        let b = _mm256_set1_ps(0.999_999);
        let mut acc = [_mm256_set1_ps(0.5); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm256_fmadd_ps(*r, b, a);
            }
        }
        let s = acc.iter().fold(_mm256_setzero_ps(), |s, r| _mm256_add_ps(s, *r));
        _mm256_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2")]
    fn maddubs256_impl(seed: u64) -> f32 {
        let a = _mm256_set1_epi8(seed as i8 | 1);
        let b = _mm256_set1_epi8(3);
        let mut acc = [_mm256_setzero_si256(); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                // The i16 pair sums themselves: the widening a kernel adds runs on other ports.
                *r = _mm256_add_epi16(*r, _mm256_maddubs_epi16(a, b));
            }
        }
        let s = acc.iter().fold(_mm256_setzero_si256(), |s, r| _mm256_add_epi16(s, *r));
        _mm256_extract_epi16::<0>(s) as f32
    }

    #[target_feature(enable = "avx512f")]
    fn fma512_impl(seed: u64) -> f32 {
        let a = _mm512_set1_ps(1.0 + seed as f32 * 1e-9);
        let b = _mm512_set1_ps(0.999_999);
        let mut acc = [_mm512_set1_ps(0.5); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm512_fmadd_ps(*r, b, a);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, r| _mm512_add_ps(s, *r)))
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    fn dpbf16_impl(seed: u64) -> f32 {
        let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0 + seed as f32 * 1e-9), _mm512_set1_ps(0.5));
        let b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.25), _mm512_set1_ps(0.125));
        let mut acc = [_mm512_setzero_ps(); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm512_dpbf16_ps(*r, a, b);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, r| _mm512_add_ps(s, *r)))
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    fn dpbusd512_impl(seed: u64) -> f32 {
        let a = _mm512_set1_epi8(seed as i8 | 1);
        let b = _mm512_set1_epi8(3);
        let mut acc = [_mm512_setzero_si512(); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                *r = _mm512_dpbusd_epi32(*r, a, b);
            }
        }
        _mm512_reduce_add_epi32(acc.iter().fold(_mm512_setzero_si512(), |s, r| _mm512_add_epi32(s, *r))) as f32
    }

    // SAFETY (all five): each is pushed by `peaks` only after the features it enables were
    // detected on this CPU; the loops touch registers only.
    pub fn fma256(seed: u64) -> f32 {
        // SAFETY: see above (AVX2 and FMA detected).
        unsafe { fma256_impl(seed) }
    }
    pub fn maddubs256(seed: u64) -> f32 {
        // SAFETY: see above (AVX2 detected).
        unsafe { maddubs256_impl(seed) }
    }
    pub fn fma512(seed: u64) -> f32 {
        // SAFETY: see above (AVX-512 F detected).
        unsafe { fma512_impl(seed) }
    }
    pub fn dpbf16(seed: u64) -> f32 {
        // SAFETY: see above (AVX512-BF16 detected).
        unsafe { dpbf16_impl(seed) }
    }
    pub fn dpbusd512(seed: u64) -> f32 {
        // SAFETY: see above (AVX512-VNNI detected).
        unsafe { dpbusd512_impl(seed) }
    }
}
