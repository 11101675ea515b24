//! The arithmetic ceilings of this CPU: loops that do nothing but one instruction family's
//! multiply-adds on registers (no memory traffic), so a benchmark can state a kernel's rate as a
//! fraction of the ceiling of the arithmetic it uses: f32 FMA (AVX2 256-bit, AVX-512 512-bit),
//! bf16 dot (`vdpbf16ps`, AVX512-BF16), int8 dot (`vpdpbusd`, AVX512-VNNI; AVX2's `vpmaddubsw`,
//! whose i16 pair sums a kernel then widens). Here, in the crate built at full speed, so the
//! loops measure the instructions and not an unoptimized build.

/// One ceiling: its name, the multiply-adds one call of `run` does, and the loop.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    pub name: &'static str,
    pub macs: f64,
    pub run: fn(u64) -> f32,
}

/// Iterations of each loop per call: long enough that timing overhead vanishes (~10 ms).
const ITERS: u64 = 4 << 20;
/// Independent accumulators per loop: enough to cover the FMA latency (4-5 cycles) on two ports.
const ACC: usize = 12;

/// The ceilings this CPU has (each loop only where its instructions are detected).
pub fn peaks() -> Vec<Peak> {
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
        let b = _mm256_set1_epi8(3);
        let mut acc = [_mm256_set1_epi8(seed as i8 | 1); ACC];
        for _ in 0..ITERS {
            for r in acc.iter_mut() {
                // The i16 pair sums themselves (the widening a kernel adds runs on other ports);
                // each takes the last one's result as its bytes, so none can be hoisted.
                *r = _mm256_maddubs_epi16(*r, b);
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

#[cfg(test)]
mod tests {
    use super::{ACC, ITERS};

    /// What each loop returns, computed lane by lane in scalar code: every lane and accumulator
    /// starts equal, so one lane's recurrence and the final sums give the result.
    fn reference(name: &str, seed: u64) -> Option<f64> {
        let a = 1.0 + seed as f32 * 1e-9;
        let fma_lane = || (0..ITERS).fold(0.5f32, |r, _| r.mul_add(0.999_999, a));
        let twelve = |x: f32| (0..ACC).fold(0f32, |s, _| s + x);
        Some(match name {
            "f32 FMA (AVX2)" => f64::from(twelve(fma_lane())),
            "f32 FMA (AVX-512)" => f64::from(twelve(fma_lane())) * 16.0,
            "int8 dot (AVX512-VNNI)" => {
                let byte = i32::from((seed as i8 | 1) as u8);
                let lane = (ITERS as i32).wrapping_mul(4 * byte * 3);
                f64::from(lane.wrapping_mul(ACC as i32).wrapping_mul(16) as f32)
            }
            "int8 dot (AVX2 vpmaddubsw)" => {
                let byte = u16::from((seed as i8 | 1) as u8);
                let v = (0..ITERS).fold(byte | byte << 8, |v, _| {
                    let pair = i32::from(v & 0xff) * 3 + i32::from(v >> 8) * 3;
                    pair.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16 as u16
                });
                f64::from(v.wrapping_mul(ACC as u16))
            }
            // `cvtne2ps_pbh(x, y)` puts y's values in the low 16 bf16 elements and x's in the
            // high 16: the low 8 lanes add 2 x 0.5 x 0.125 a step, the high 8 lanes 2 x 1 x 0.25
            // (1 + 1e-9 rounds to 1 in bf16), all exact in f32 at these sizes.
            "bf16 dot (AVX512-BF16)" => {
                let lane = |step: f32| (0..ITERS).fold(0f32, |s, _| s + step);
                f64::from(twelve(lane(0.125)) * 8.0 + twelve(lane(0.5)) * 8.0)
            }
            _ => return None,
        })
    }

    #[test]
    fn every_ceiling_loop_computes_what_its_scalar_reference_does() {
        let peaks = super::peaks();
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            assert!(peaks.iter().any(|p| p.name == "f32 FMA (AVX2)"));
        }
        for p in &peaks {
            let want = reference(p.name, 1).unwrap_or_else(|| panic!("no reference for {}", p.name));
            let got = f64::from((p.run)(1));
            // Integer loops exactly; float ones to the rounding of the final lane sums (the
            // 512-bit reduction adds its lanes in its own order).
            let tol = if p.name.starts_with("int8") { 0.0 } else { 1e-6 * want.abs() };
            assert!((got - want).abs() <= tol, "{}: {got} against {want}", p.name);
        }
    }
}
