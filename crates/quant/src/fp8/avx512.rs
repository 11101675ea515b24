//! The AVX-512 kernel: 32 bytes a step widened to two 16-lane f32 registers (lanes 0-15 and
//! 16-31 of the block's partial sums) through IEEE halves, each block's partial sums fused into
//! the row's totals with the block's scale.

use std::arch::x86_64::*;

use super::Fp8Ref;
use crate::simd::{hsum, prefetch_at};

use super::PREFETCH;

/// 32 e4m3 bytes as two registers of `e4m3 / 256` (lanes 0-15, 16-31).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
fn widen32(raw: __m256i) -> [__m512; 2] {
    let words = _mm512_cvtepu8_epi16(raw);
    let half =
        _mm512_and_si512(_mm512_srai_epi16::<1>(_mm512_slli_epi16::<8>(words)), _mm512_set1_epi16(0xBF80u16 as i16));
    [_mm512_cvtph_ps(_mm512_castsi512_si256(half)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(half))]
}

/// `N` vectors (`xs` `[N, cols]`) against every row of `m`, `ys` `[N, rows]`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL with AVX2 and FMA; `m`'s parts hold its rows (checked by the
/// caller), `xs` and `ys` are `N` whole vectors.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn matmul_n<const N: usize>(m: &Fp8Ref<'_>, xs: &[f32], ys: &mut [f32]) {
    let (rows, cols) = (m.rows, m.cols);
    for r in 0..rows {
        let (q, scales) = m.row(r);
        let mut total = [[_mm512_setzero_ps(); 2]; N];
        for (b, s) in scales.iter().enumerate() {
            let (c0, c1) = (b * m.block_cols, ((b + 1) * m.block_cols).min(cols));
            let mut part = [[_mm512_setzero_ps(); 2]; N];
            let mut c = c0;
            while c + 32 <= c1 {
                // SAFETY: c + 32 <= c1 <= cols for the row and each of the N vectors.
                unsafe {
                    let at = q.as_ptr().add(c);
                    prefetch_at::<PREFETCH, _>(at);
                    let w = widen32(_mm256_loadu_si256(at.cast()));
                    for (t, p) in part.iter_mut().enumerate() {
                        let x = xs.as_ptr().add(t * cols + c);
                        p[0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(x), p[0]);
                        p[1] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(x.add(16)), p[1]);
                    }
                }
                c += 32;
            }
            if c < c1 {
                // The matrix's right edge: the missing columns read as 0 x 0.
                let k = c1 - c;
                let (lo, hi) = (mask16(k), mask16(k.saturating_sub(16)));
                // SAFETY: masked loads touch only the k < 32 columns left in the row and vectors.
                unsafe {
                    let w = widen32(_mm256_maskz_loadu_epi8(((1u64 << k) - 1) as u32, q.as_ptr().add(c).cast()));
                    for (t, p) in part.iter_mut().enumerate() {
                        let x = xs.as_ptr().add(t * cols + c);
                        p[0] = _mm512_fmadd_ps(w[0], _mm512_maskz_loadu_ps(lo, x), p[0]);
                        p[1] = _mm512_fmadd_ps(w[1], _mm512_maskz_loadu_ps(hi, x.add(16)), p[1]);
                    }
                }
            }
            let s = _mm512_set1_ps(s * 256.0);
            for (tot, p) in total.iter_mut().zip(&part) {
                tot[0] = _mm512_fmadd_ps(p[0], s, tot[0]);
                tot[1] = _mm512_fmadd_ps(p[1], s, tot[1]);
            }
        }
        for (t, tot) in total.iter().enumerate() {
            let v = _mm512_add_ps(tot[0], tot[1]);
            let halves = _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            );
            ys[t * rows + r] = hsum(halves);
        }
    }
}

/// The mask of the first `k` of 16 lanes.
fn mask16(k: usize) -> __mmask16 {
    ((1u32 << k.min(16)) - 1) as __mmask16
}
