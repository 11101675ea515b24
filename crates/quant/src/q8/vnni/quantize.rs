//! Activations quantized with AVX-512, the same bits as the scalar reference.

use std::arch::x86_64::*;

use super::super::BLOCK;

/// `xs` quantized per 32-block into `u` and `d`, the same bits as
/// [`reference::quantize_block`](crate::q8::reference::quantize_block): the step and its inverse as
/// there, `round` (halves away from zero) as truncation plus one where the dropped part is at
/// least a half. A block whose inverse step overflows (`max|x|` below ~4e-37) takes the reference.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; `u.len() == xs.len()` and `d.len() == xs.len() / 32`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(in crate::q8) unsafe fn quantize(xs: &[f32], u: &mut [u8], d: &mut [f32]) {
    let (inf, half) = (_mm512_set1_ps(f32::INFINITY), _mm512_set1_ps(0.5));
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let (sign, one, offset) = (_mm512_set1_epi32(i32::MIN), _mm512_set1_ps(1.0), _mm512_set1_epi32(128));
    for ((xb, ub), db) in xs.chunks_exact(BLOCK).zip(u.chunks_exact_mut(BLOCK)).zip(d.iter_mut()) {
        // SAFETY: `xb` holds 32 values.
        let (a, b) = unsafe { (_mm512_loadu_ps(xb.as_ptr()), _mm512_loadu_ps(xb.as_ptr().add(16))) };
        let (abs_a, abs_b) = (_mm512_abs_ps(a), _mm512_abs_ps(b));
        // Not less than infinity, or unordered: an infinity or a NaN.
        let bad = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(abs_a, inf) | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(abs_b, inf);
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs_a, abs_b));
        let step = amax / 127.0;
        let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
        if bad != 0 || !inv.is_finite() {
            *db = crate::q8::reference::quantize_block(xb, ub);
            continue;
        }
        *db = step;
        let inv = _mm512_set1_ps(inv);
        let level = |x: __m512| -> __m128i {
            let t = _mm512_mul_ps(x, inv);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
            // t - r is exact (|t| <= 2^8): a dropped half or more rounds away from zero.
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(t, r)), half);
            let unit = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_and_si512(_mm512_castps_si512(t), sign),
                _mm512_castps_si512(one),
            ));
            let r = _mm512_min_ps(_mm512_max_ps(_mm512_mask_add_ps(r, away, r, unit), lo), hi);
            _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvttps_epi32(r), offset))
        };
        let (qa, qb) = (level(a), level(b));
        // SAFETY: `ub` holds 32 bytes.
        unsafe {
            _mm_storeu_si128(ub.as_mut_ptr().cast(), qa);
            _mm_storeu_si128(ub.as_mut_ptr().add(16).cast(), qb);
        }
    }
}
