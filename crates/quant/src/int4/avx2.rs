//! The AVX2 kernels: a block of 32 weights (16 bytes of nibbles, or 8 bytes of 2-bit crumbs for
//! `int2`) widened to four 8-lane f32 vectors; `BITS` says which.

use std::arch::x86_64::*;

use half::f16;

use crate::simd::{hsum, prefetch_ahead};

/// The block of 32 weights at byte `at` as four vectors of 8 weights (4 bits: nibble - 8 in
/// -8..=7, 2 bits: crumb - 2 in -2..=1), in the order the activations were permuted into;
/// prefetching ahead when asked.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn block<const BITS: usize>(q: &[u8], at: usize, prefetch: bool) -> [__m256; 4] {
    let bytes = &q[at..at + 4 * BITS];
    if prefetch {
        prefetch_ahead(bytes.as_ptr());
    }
    let w8 = if BITS == 4 {
        // SAFETY: `bytes` is 16 bytes long.
        let raw = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
        let m = _mm_set1_epi8(15);
        let lo = _mm_and_si128(raw, m);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m);
        _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
    } else {
        // SAFETY: `bytes` is 8 bytes long.
        let raw = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
        // Each 64-bit lane a copy, shifted by 0 / 2 / 4 / 6: lane j's bytes hold crumb j of
        // each of the 8 bytes (columns 4i + j).
        let wide = _mm256_srlv_epi64(_mm256_broadcastq_epi64(raw), _mm256_set_epi64x(6, 4, 2, 0));
        _mm256_sub_epi8(_mm256_and_si256(wide, _mm256_set1_epi8(3)), _mm256_set1_epi8(2))
    };
    let a = _mm256_castsi256_si128(w8);
    let c = _mm256_extracti128_si256::<1>(w8);
    let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    [f(a), f(_mm_srli_si128::<8>(a)), f(c), f(_mm_srli_si128::<8>(c))]
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn matvec<const BITS: usize>(q: &[u8], scale: &[f16], group: usize, xp: &[f32], y: &mut [f32]) {
    let cols = xp.len();
    let blocks = cols / 32;
    let per_group = group / 32;
    for (r, out) in y.iter_mut().enumerate() {
        let mut acc = _mm256_setzero_ps();
        for g in 0..cols / group {
            let mut s = _mm256_setzero_ps();
            for k in 0..per_group {
                let b = g * per_group + k;
                let w = block::<BITS>(q, (r * blocks + b) * 4 * BITS, b.is_multiple_of(16 / BITS));
                // SAFETY: 32 values of `xp` from b * 32 < cols.
                unsafe {
                    let x = xp.as_ptr().add(b * 32);
                    for (j, wj) in w.iter().enumerate() {
                        s = _mm256_fmadd_ps(*wj, _mm256_loadu_ps(x.add(8 * j)), s);
                    }
                }
            }
            let sc = scale[r * (cols / group) + g].to_f32();
            acc = _mm256_fmadd_ps(s, _mm256_set1_ps(sc), acc);
        }
        *out = hsum(acc);
    }
}

/// `N` vectors (nibble-ordered, `[N, cols]`): each block unpacked once, every vector's group
/// sum and accumulator as [`matvec`] keeps them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn matmul_n<const N: usize, const BITS: usize>(
    q: &[u8],
    scale: &[f16],
    group: usize,
    cols: usize,
    xp: &[f32],
    ys: &mut [f32],
) {
    let rows = ys.len() / N;
    let blocks = cols / 32;
    let per_group = group / 32;
    for r in 0..rows {
        let mut acc = [_mm256_setzero_ps(); N];
        for g in 0..cols / group {
            let mut s = [_mm256_setzero_ps(); N];
            for k in 0..per_group {
                let b = g * per_group + k;
                let w = block::<BITS>(q, (r * blocks + b) * 4 * BITS, b.is_multiple_of(16 / BITS));
                // SAFETY: 32 values of each of the N vectors from b * 32 < cols.
                unsafe {
                    for (t, st) in s.iter_mut().enumerate() {
                        let x = xp.as_ptr().add(t * cols + b * 32);
                        for (j, wj) in w.iter().enumerate() {
                            *st = _mm256_fmadd_ps(*wj, _mm256_loadu_ps(x.add(8 * j)), *st);
                        }
                    }
                }
            }
            let sc = _mm256_set1_ps(scale[r * (cols / group) + g].to_f32());
            for (a, st) in acc.iter_mut().zip(&s) {
                *a = _mm256_fmadd_ps(*st, sc, *a);
            }
        }
        for (t, a) in acc.iter().enumerate() {
            ys[t * rows + r] = hsum(*a);
        }
    }
}

/// [`matmul_n`] for a group of `width` (1 to 4) vectors.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn matmul_width<const BITS: usize>(
    width: usize,
    q: &[u8],
    scale: &[f16],
    group: usize,
    cols: usize,
    xp: &[f32],
    ys: &mut [f32],
) {
    match width {
        4 => matmul_n::<4, BITS>(q, scale, group, cols, xp, ys),
        3 => matmul_n::<3, BITS>(q, scale, group, cols, xp, ys),
        2 => matmul_n::<2, BITS>(q, scale, group, cols, xp, ys),
        _ => matmul_n::<1, BITS>(q, scale, group, cols, xp, ys),
    }
}
