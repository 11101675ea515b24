//! Dense trunk matrices: f32 and bf16, row-major `[rows, cols]`, `y = W x`.

use half::bf16;

use crate::cpu::{Level, level, supported};
use crate::simd::check_dims;

/// `y[r] = sum_c w[r*cols + c] * x[c]`.
pub fn matvec_f32(w: &[f32], x: &[f32], y: &mut [f32]) {
    matvec_f32_at(level(), w, x, y)
}

/// [`matvec_f32`] with an explicit kernel level (for tests and benchmarks).
pub fn matvec_f32_at(level: Level, w: &[f32], x: &[f32], y: &mut [f32]) {
    let cols = x.len();
    check_dims(w.len(), cols, x.len(), cols, y.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::matvec_f32(w, x, y) },
        Level::Scalar => reference::matvec_f32(w, x, y),
    }
}

/// `y = W x` for bf16 weights (exact widening to f32, f32 accumulation).
pub fn matvec_bf16(w: &[bf16], x: &[f32], y: &mut [f32]) {
    matvec_bf16_at(level(), w, x, y)
}

/// [`matvec_bf16`] with an explicit kernel level (for tests and benchmarks).
pub fn matvec_bf16_at(level: Level, w: &[bf16], x: &[f32], y: &mut [f32]) {
    let cols = x.len();
    check_dims(w.len(), cols, x.len(), cols, y.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::matvec_bf16(w, x, y) },
        Level::Scalar => reference::matvec_bf16(w, x, y),
    }
}

/// `Y = W X` for a batch of vectors (`xs` `[n, cols]`, `ys` `[n, rows]`): each weight is widened
/// once for four vectors, and every (row, vector) is summed in exactly the order [`matvec_bf16`]
/// sums it, so a batch gives the same bits as its vectors one by one.
pub(crate) fn matmul_bf16(w: &[bf16], cols: usize, xs: &[f32], ys: &mut [f32]) {
    matmul_bf16_at(level(), w, cols, xs, ys)
}

/// [`matmul_bf16`] with an explicit kernel level (for tests and benchmarks).
pub(crate) fn matmul_bf16_at(level: Level, w: &[bf16], cols: usize, xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / cols.max(1);
    assert!(cols > 0 && xs.len() == n * cols, "xs is not whole {cols}-vectors");
    let rows = w.len() / cols;
    assert!(w.len() == rows * cols && ys.len() == n * rows, "shapes do not match");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => {
            for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; `width`
                // whole vectors.
                unsafe {
                    match width {
                        4 => avx2::matmul_n_bf16::<4>(w, cols, xb, yb),
                        3 => avx2::matmul_n_bf16::<3>(w, cols, xb, yb),
                        2 => avx2::matmul_n_bf16::<2>(w, cols, xb, yb),
                        _ => avx2::matvec_bf16(w, xb, yb),
                    }
                }
            }
        }
        Level::Scalar => {
            for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                reference::matvec_bf16(w, x, y);
            }
        }
    }
}

/// Scalar references: the oracles the fast kernels are tested against.
pub mod reference {
    use half::bf16;

    pub fn matvec_f32(w: &[f32], x: &[f32], y: &mut [f32]) {
        for (r, out) in y.iter_mut().enumerate() {
            *out = w[r * x.len()..(r + 1) * x.len()].iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    pub fn matvec_bf16(w: &[bf16], x: &[f32], y: &mut [f32]) {
        for (r, out) in y.iter_mut().enumerate() {
            *out = w[r * x.len()..(r + 1) * x.len()].iter().zip(x).map(|(a, b)| a.to_f32() * b).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    use half::bf16;

    use crate::simd::{hsum, prefetch_ahead};

    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn matvec_f32(w: &[f32], x: &[f32], y: &mut [f32]) {
        let cols = x.len();
        let main = cols / 32 * 32;
        for (r, out) in y.iter_mut().enumerate() {
            let row = &w[r * cols..(r + 1) * cols];
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < main {
                prefetch_ahead(row.as_ptr().wrapping_add(c));
                for (k, a) in acc.iter_mut().enumerate() {
                    // SAFETY: c + 8k + 8 <= main <= cols = row.len() = x.len().
                    let (wv, xv) = unsafe {
                        (_mm256_loadu_ps(row.as_ptr().add(c + 8 * k)), _mm256_loadu_ps(x.as_ptr().add(c + 8 * k)))
                    };
                    *a = _mm256_fmadd_ps(wv, xv, *a);
                }
                c += 32;
            }
            let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            *out = hsum(v) + row[main..].iter().zip(&x[main..]).map(|(a, b)| a * b).sum::<f32>();
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn matvec_bf16(w: &[bf16], x: &[f32], y: &mut [f32]) {
        let cols = x.len();
        let main = cols / 16 * 16;
        for (r, out) in y.iter_mut().enumerate() {
            let row = &w[r * cols..(r + 1) * cols];
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut c = 0;
            while c < main {
                prefetch_ahead(row.as_ptr().wrapping_add(c));
                for (k, a) in acc.iter_mut().enumerate() {
                    // SAFETY: c + 8k + 8 <= main <= cols; bf16 is 2 bytes, so 8 of them are 16 bytes.
                    let (raw, xv) = unsafe {
                        (
                            _mm_loadu_si128(row.as_ptr().add(c + 8 * k).cast()),
                            _mm256_loadu_ps(x.as_ptr().add(c + 8 * k)),
                        )
                    };
                    // bf16 -> f32 is exact: the bits move to the top half.
                    let wv = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)));
                    *a = _mm256_fmadd_ps(wv, xv, *a);
                }
                c += 16;
            }
            *out = hsum(_mm256_add_ps(acc[0], acc[1]))
                + row[main..].iter().zip(&x[main..]).map(|(a, b)| a.to_f32() * b).sum::<f32>();
        }
    }

    /// `N` vectors (`xs` `[N, cols]`, `ys` `[N, rows]`): each weight block widened once, the
    /// vectors' accumulators in the same order as [`matvec_bf16`].
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn matmul_n_bf16<const N: usize>(w: &[bf16], cols: usize, xs: &[f32], ys: &mut [f32]) {
        let rows = ys.len() / N;
        let main = cols / 16 * 16;
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            let mut acc = [[_mm256_setzero_ps(); 2]; N];
            let mut c = 0;
            while c < main {
                prefetch_ahead(row.as_ptr().wrapping_add(c));
                for k in 0..2 {
                    // SAFETY: c + 8k + 8 <= main <= cols for the row and for each of the N vectors.
                    unsafe {
                        let raw = _mm_loadu_si128(row.as_ptr().add(c + 8 * k).cast());
                        let wv = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)));
                        for (t, a) in acc.iter_mut().enumerate() {
                            let xv = _mm256_loadu_ps(xs.as_ptr().add(t * cols + c + 8 * k));
                            a[k] = _mm256_fmadd_ps(wv, xv, a[k]);
                        }
                    }
                }
                c += 16;
            }
            for (t, a) in acc.iter().enumerate() {
                let x = &xs[t * cols..(t + 1) * cols];
                ys[t * rows + r] = hsum(_mm256_add_ps(a[0], a[1]))
                    + row[main..].iter().zip(&x[main..]).map(|(a, b)| a.to_f32() * b).sum::<f32>();
            }
        }
    }
}
