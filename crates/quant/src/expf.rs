//! `exp` over a row of f32, vectorized: a softmax's `exp(v - max)` for many scores at once (the
//! vision tower's attention computes 200 M of them a block for an 896 x 896 image; on the
//! library's scalar `exp` a tower block took ~1.1x as long, docs/EFFICIENCY.md). Cephes' `expf`:
//! `x = n ln 2 + r`, `|r| <= ln 2 / 2`, a degree-5 polynomial for `exp(r)` (relative error below
//! 3e-7), `2^n` put into the exponent bits. Inputs are clamped to [-87.3, 88] first (below, `exp`
//! is ~1e-38, as good as 0 beside the maximum's 1; above, `2^n` stays a finite power; a NaN, from
//! whatever a damaged model scores, is taken as -87.3). The scalar reference does the same
//! operations in the same order with fused multiply-adds, so every level gives the same bits.

use crate::cpu::{Level, level, supported};

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const LOWEST: f32 = -87.3;
const HIGHEST: f32 = 88.0;
const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// `v[i] = exp(v[i] - shift)`, meant for `v[i] <= shift` (a softmax's scores less their maximum);
/// any input gives a value (see the clamp above), never a panic.
pub fn exp_shifted(v: &mut [f32], shift: f32) {
    exp_shifted_at(level(), v, shift)
}

pub fn exp_shifted_at(level: Level, v: &mut [f32], shift: f32) {
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F.
        Level::Avx512 => unsafe { avx512::exp_shifted(v, shift) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA.
        Level::Avx2 => unsafe { avx2::exp_shifted(v, shift) },
        Level::Scalar => reference::exp_shifted(v, shift),
    }
}

pub mod reference {
    use super::*;

    /// One value, as every level computes it.
    pub fn exp1(x: f32) -> f32 {
        // max before min, as the SIMD levels (their max takes the second operand for a NaN);
        // `clamp` would keep a NaN.
        #[allow(clippy::manual_clamp)]
        let x = x.max(LOWEST).min(HIGHEST);
        let n = (x * LOG2E).round_ties_even();
        let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
        let mut p = P[0];
        for c in &P[1..] {
            p = p.mul_add(r, *c);
        }
        let y = p.mul_add(r * r, r) + 1.0;
        y * f32::from_bits(((n as i32 + 127) as u32) << 23)
    }

    pub fn exp_shifted(v: &mut [f32], shift: f32) {
        v.iter_mut().for_each(|x| *x = exp1(*x - shift));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::*;

    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_shifted(v: &mut [f32], shift: f32) {
        let n = v.len() / 16 * 16;
        let s = _mm512_set1_ps(shift);
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= len.
            unsafe {
                let p = v.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, exp16(_mm512_sub_ps(_mm512_loadu_ps(p), s)));
            }
            i += 16;
        }
        reference::exp_shifted(&mut v[n..], shift);
    }

    #[target_feature(enable = "avx512f")]
    fn exp16(x: __m512) -> __m512 {
        let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(LOWEST)), _mm512_set1_ps(HIGHEST));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(LOG2E),
        ));
        let neg = _mm512_sub_ps(_mm512_setzero_ps(), n);
        let r = _mm512_fmadd_ps(neg, _mm512_set1_ps(LN2_LO), _mm512_fmadd_ps(neg, _mm512_set1_ps(LN2_HI), x));
        let mut p = _mm512_set1_ps(P[0]);
        for c in &P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
        _mm512_mul_ps(y, _mm512_castsi512_ps(bits))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_shifted(v: &mut [f32], shift: f32) {
        let n = v.len() / 8 * 8;
        let s = _mm256_set1_ps(shift);
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= len.
            unsafe {
                let p = v.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, exp8(_mm256_sub_ps(_mm256_loadu_ps(p), s)));
            }
            i += 8;
        }
        reference::exp_shifted(&mut v[n..], shift);
    }

    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LOWEST)), _mm256_set1_ps(HIGHEST));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            x,
            _mm256_set1_ps(LOG2E),
        ));
        let neg = _mm256_sub_ps(_mm256_setzero_ps(), n);
        let r = _mm256_fmadd_ps(neg, _mm256_set1_ps(LN2_LO), _mm256_fmadd_ps(neg, _mm256_set1_ps(LN2_HI), x));
        let mut p = _mm256_set1_ps(P[0]);
        for c in &P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
        _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn close_to_exp_over_the_whole_range() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let got = f64::from(reference::exp1(x));
            let want = f64::from(x).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(reference::exp1(0.0), 1.0);
        assert!(reference::exp1(-1000.0) < 1e-37);
    }

    proptest! {
        #[test]
        fn every_level_gives_the_reference_bits(v in proptest::collection::vec(-100f32..0.0, 0..70), shift in -3f32..3.0) {
            let mut v = v;
            // Inputs a damaged model could give: NaN, infinities, far above the shift.
            v.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, 95.0]);
            let mut want = v.clone();
            reference::exp_shifted(&mut want, shift);
            for l in crate::cpu::levels() {
                let mut got = v.clone();
                exp_shifted_at(l, &mut got, shift);
                prop_assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{:?}", l);
            }
        }
    }
}
