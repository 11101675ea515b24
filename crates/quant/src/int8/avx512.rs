//! The AVX-512 kernels: 16 weights a step widened to one 16-lane f32 vector. Lanes 0-7 are the
//! AVX2 kernel's first accumulator and lanes 8-15 its second, each summing the same columns in
//! the same order, and the two halves are added and reduced as the AVX2 kernel adds and reduces
//! its two: the same bits at half the instructions.

use std::arch::x86_64::*;

use crate::simd::{hsum, prefetch_ahead};

/// `N` vectors (`xs` `[N, cols]`) against every row, `ys` `[N, rows]`; `N = 1` is the
/// matrix-vector product.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL with AVX2 and FMA; `q` holds `rows * cols` weights and `scale`
/// `rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn matmul_n<const N: usize>(q: &[i8], scale: &[f32], cols: usize, xs: &[f32], ys: &mut [f32]) {
    for r in 0..ys.len() / N {
        // SAFETY: row r exists; the caller's contract for the rest.
        unsafe { row::<N>(q, scale, cols, xs, ys, r) }
    }
}

/// Row `r` against the `N` vectors. One row at a time: tiles of rows, which would hide the FMA's
/// latency, cut how far ahead a row's prefetches reach into the rows to come, and measured slower
/// in decode (docs/EFFICIENCY.md).
///
/// # Safety
/// As for [`matmul_n`], with row `r` inside the matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[inline]
unsafe fn row<const N: usize>(q: &[i8], scale: &[f32], cols: usize, xs: &[f32], ys: &mut [f32], r: usize) {
    let rows = ys.len() / N;
    let main = cols / 16 * 16;
    let row = &q[r * cols..][..cols];
    let mut acc = [_mm512_setzero_ps(); N];
    let mut c = 0;
    while c < main {
        // SAFETY: c + 16 <= main <= cols for the row and each of the N vectors.
        unsafe {
            let at = row.as_ptr().add(c);
            prefetch_ahead(at);
            let w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(at.cast())));
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(w, _mm512_loadu_ps(xs.as_ptr().add(t * cols + c)), *a);
            }
        }
        c += 16;
    }
    for (t, a) in acc.iter().enumerate() {
        let x = &xs[t * cols..][..cols];
        let tail: f32 = row[main..].iter().zip(&x[main..]).map(|(a, b)| f32::from(*a) * b).sum();
        let halves = _mm256_add_ps(
            _mm512_castps512_ps256(*a),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*a))),
        );
        ys[t * rows + r] = (hsum(halves) + tail) * scale[r];
    }
}
