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

/// [`matvec`] with an explicit kernel level (for tests and benchmarks). The AVX-512 kernel gives
/// the AVX2 kernel's bits (its lanes are the AVX2 kernel's two accumulators side by side).
pub fn matvec_at(level: Level, q: &[i8], scale: &[f32], x: &[f32], y: &mut [f32]) {
    check_dims(q.len(), x.len(), x.len(), x.len(), y.len());
    assert_eq!(scale.len(), y.len(), "one scale per row");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes checked above.
        Level::Avx2 => unsafe { avx2::matvec(q, scale, x, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F/BW/VL with AVX2 and
        // FMA; shapes checked above.
        Level::Avx512 => unsafe { avx512::matmul_n::<1>(q, scale, x.len(), x, y) },
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
        Level::Avx512 => {
            for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F/BW/VL with
                // AVX2 and FMA; shapes checked, `width` whole vectors.
                unsafe {
                    match width {
                        4 => avx512::matmul_n::<4>(q, scale, cols, xb, yb),
                        3 => avx512::matmul_n::<3>(q, scale, cols, xb, yb),
                        2 => avx512::matmul_n::<2>(q, scale, cols, xb, yb),
                        _ => avx512::matmul_n::<1>(q, scale, cols, xb, yb),
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => {
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
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
