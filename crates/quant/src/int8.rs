//! int8 per-row trunk quantization: `q` i8 `[rows, cols]`, `scale` f32 `[rows]`, `w = q * scale`.

use crate::cpu::{Level, level, supported};
use crate::simd::check_dims;

/// Symmetric per-row quantization: `scale = max|w| / 127`.
pub fn quantize(w: &[f32], cols: usize) -> (Vec<i8>, Vec<f32>) {
    assert!(cols > 0 && w.len().is_multiple_of(cols), "weights are not whole rows of {cols}");
    let mut q = vec![0i8; w.len()];
    let mut scale = Vec::with_capacity(w.len() / cols);
    for (row, qr) in w.chunks_exact(cols).zip(q.chunks_exact_mut(cols)) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        for (d, v) in qr.iter_mut().zip(row) {
            *d = (v * inv).round().clamp(-127.0, 127.0) as i8;
        }
        scale.push(s);
    }
    (q, scale)
}

/// `y = W x`.
pub fn matvec(q: &[i8], scale: &[f32], x: &[f32], y: &mut [f32]) {
    matvec_at(level(), q, scale, x, y)
}

/// [`matvec`] with an explicit kernel level (for tests and benchmarks).
pub fn matvec_at(level: Level, q: &[i8], scale: &[f32], x: &[f32], y: &mut [f32]) {
    check_dims(q.len(), x.len(), x.len(), x.len(), y.len());
    assert_eq!(scale.len(), y.len(), "one scale per row");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes checked above.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::matvec(q, scale, x, y) },
        Level::Scalar => reference::matvec(q, scale, x, y),
    }
}

/// `Y = W X` for a batch (`xs` `[n, cols]`, `ys` `[n, rows]`): each weight widened once for four
/// vectors, every (row, vector) summed in exactly [`matvec`]'s order (a batch gives the same bits).
pub fn matmul(q: &[i8], scale: &[f32], cols: usize, xs: &[f32], ys: &mut [f32]) {
    matmul_at(level(), q, scale, cols, xs, ys)
}

/// [`matmul`] with an explicit kernel level (for tests and benchmarks).
pub fn matmul_at(level: Level, q: &[i8], scale: &[f32], cols: usize, xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / cols.max(1);
    assert!(cols > 0 && xs.len() == n * cols, "xs is not whole {cols}-vectors");
    let rows = scale.len();
    assert!(q.len() == rows * cols && ys.len() == n * rows, "shapes do not match");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => {
            for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes
                // checked, `width` whole vectors.
                unsafe {
                    match width {
                        4 => avx2::matmul_n::<4>(q, scale, cols, xb, yb),
                        3 => avx2::matmul_n::<3>(q, scale, cols, xb, yb),
                        2 => avx2::matmul_n::<2>(q, scale, cols, xb, yb),
                        _ => avx2::matvec(q, scale, xb, yb),
                    }
                }
            }
        }
        Level::Scalar => {
            for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                reference::matvec(q, scale, x, y);
            }
        }
    }
}

pub mod reference {
    pub fn matvec(q: &[i8], scale: &[f32], x: &[f32], y: &mut [f32]) {
        let cols = x.len();
        for (r, out) in y.iter_mut().enumerate() {
            let dot: f32 = q[r * cols..][..cols].iter().zip(x).map(|(a, b)| f32::from(*a) * b).sum();
            *out = dot * scale[r];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
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
}
