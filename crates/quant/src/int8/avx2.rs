//! The AVX2 kernels: 16 weights a step widened to two 8-lane f32 vectors, two accumulators a
//! (row, vector).

use std::arch::x86_64::*;

use crate::simd::{hsum, prefetch_ahead};

#[target_feature(enable = "avx2,fma")]
pub(super) fn matvec(q: &[i8], scale: &[f32], x: &[f32], y: &mut [f32]) {
    let cols = x.len();
    let main = cols / 16 * 16;
    for (r, out) in y.iter_mut().enumerate() {
        let row = &q[r * cols..][..cols];
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut c = 0;
        while c < main {
            prefetch_ahead(row.as_ptr().wrapping_add(c));
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: c + 8k + 8 <= main <= cols = row.len() = x.len().
                unsafe {
                    let raw = _mm_loadl_epi64(row.as_ptr().add(c + 8 * k).cast());
                    let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
                    *a = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(c + 8 * k)), *a);
                }
            }
            c += 16;
        }
        let tail: f32 = row[main..].iter().zip(&x[main..]).map(|(a, b)| f32::from(*a) * b).sum();
        *out = (hsum(_mm256_add_ps(acc[0], acc[1])) + tail) * scale[r];
    }
}

/// `N` vectors: each weight block widened once, accumulated as [`matvec`] does per vector.
#[target_feature(enable = "avx2,fma")]
pub(super) fn matmul_n<const N: usize>(q: &[i8], scale: &[f32], cols: usize, xs: &[f32], ys: &mut [f32]) {
    let rows = ys.len() / N;
    let main = cols / 16 * 16;
    for r in 0..rows {
        let row = &q[r * cols..][..cols];
        let mut acc = [[_mm256_setzero_ps(); 2]; N];
        let mut c = 0;
        while c < main {
            prefetch_ahead(row.as_ptr().wrapping_add(c));
            for k in 0..2 {
                // SAFETY: c + 8k + 8 <= main <= cols for the row and each of the N vectors.
                unsafe {
                    let raw = _mm_loadl_epi64(row.as_ptr().add(c + 8 * k).cast());
                    let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
                    for (t, a) in acc.iter_mut().enumerate() {
                        a[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xs.as_ptr().add(t * cols + c + 8 * k)), a[k]);
                    }
                }
            }
            c += 16;
        }
        for (t, a) in acc.iter().enumerate() {
            let x = &xs[t * cols..(t + 1) * cols];
            let tail: f32 = row[main..].iter().zip(&x[main..]).map(|(a, b)| f32::from(*a) * b).sum();
            ys[t * rows + r] = (hsum(_mm256_add_ps(a[0], a[1])) + tail) * scale[r];
        }
    }
}
