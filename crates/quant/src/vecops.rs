//! Vector primitives for attention and norms: dot products and scaled adds over f32 slices.

use crate::cpu::{Level, level, supported};

/// `x / sqrt(mean(x^2) + eps) * w`, the mean accumulated in f64 (as the reference models do).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `sum a[i] * b[i]`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_at(level(), a, b)
}

pub fn dot_at(level: Level, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of {} and {} values", a.len(), b.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; lengths checked.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::dot(a, b) },
        Level::Scalar => reference::dot(a, b),
    }
}

/// `y = alpha * y + beta * x`.
pub fn axpby(alpha: f32, y: &mut [f32], beta: f32, x: &[f32]) {
    axpby_at(level(), alpha, y, beta, x)
}

pub fn axpby_at(level: Level, alpha: f32, y: &mut [f32], beta: f32, x: &[f32]) {
    assert_eq!(x.len(), y.len(), "axpby of {} and {} values", x.len(), y.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_at`.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::axpby(alpha, y, beta, x) },
        Level::Scalar => reference::axpby(alpha, y, beta, x),
    }
}

pub mod reference {
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    pub fn axpby(alpha: f32, y: &mut [f32], beta: f32, x: &[f32]) {
        for (yv, xv) in y.iter_mut().zip(x) {
            *yv = alpha * *yv + beta * xv;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::simd::hsum;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len() / 16 * 16;
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i < n {
            for (k, s) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8k + 8 <= n <= len.
                unsafe {
                    *s = _mm256_fmadd_ps(
                        _mm256_loadu_ps(a.as_ptr().add(i + 8 * k)),
                        _mm256_loadu_ps(b.as_ptr().add(i + 8 * k)),
                        *s,
                    );
                }
            }
            i += 16;
        }
        hsum(_mm256_add_ps(acc[0], acc[1])) + a[n..].iter().zip(&b[n..]).map(|(x, y)| x * y).sum::<f32>()
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn axpby(alpha: f32, y: &mut [f32], beta: f32, x: &[f32]) {
        let n = y.len() / 8 * 8;
        let (a, b) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= len of both.
            unsafe {
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                let xv = _mm256_loadu_ps(x.as_ptr().add(i));
                _mm256_storeu_ps(y.as_mut_ptr().add(i), _mm256_fmadd_ps(b, xv, _mm256_mul_ps(a, yv)));
            }
            i += 8;
        }
        for (yv, xv) in y[n..].iter_mut().zip(&x[n..]) {
            *yv = alpha * *yv + beta * xv;
        }
    }
}
