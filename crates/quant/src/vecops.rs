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

/// One pass of the gated delta rule over a state `s` (`[rows][cols]`, `cols = delta.len()`):
/// each row `r` becomes `decay[r] * s[r] + k[r] * delta`, and the next position's read of the
/// updated rows accumulates `u += cu[r] * s[r]` and `o += co[r] * s[r]`, rows in order. Per value
/// the arithmetic of `axpby(decay[r], s[r], k[r], delta)` followed by `axpby(1, u, cu[r], s[r])`
/// and `axpby(1, o, co[r], s[r])` at the same level, so the same bits, in one pass over `s`
/// instead of two.
#[allow(clippy::too_many_arguments)]
pub fn update_then_read(
    s: &mut [f32],
    decay: &[f32],
    k: &[f32],
    delta: &[f32],
    (cu, co): (&[f32], &[f32]),
    u: &mut [f32],
    o: &mut [f32],
) {
    update_then_read_at(level(), s, decay, k, delta, (cu, co), u, o)
}

#[allow(clippy::too_many_arguments)]
pub fn update_then_read_at(
    level: Level,
    s: &mut [f32],
    decay: &[f32],
    k: &[f32],
    delta: &[f32],
    (cu, co): (&[f32], &[f32]),
    u: &mut [f32],
    o: &mut [f32],
) {
    let (rows, cols) = (decay.len(), delta.len());
    assert!(
        s.len() == rows * cols && k.len() == rows && cu.len() == rows && co.len() == rows,
        "update_then_read: a [{rows}, {cols}] state with {} values and {}/{}/{} row weights",
        s.len(),
        k.len(),
        cu.len(),
        co.len()
    );
    assert!(u.len() == cols && o.len() == cols, "update_then_read: outputs of {} and {} for {cols}", u.len(), o.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_at`; shapes checked above.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::update_then_read(s, decay, k, delta, cu, co, u, o) },
        Level::Scalar => {
            for (r, row) in s.chunks_exact_mut(cols).enumerate() {
                reference::axpby(decay[r], row, k[r], delta);
                reference::axpby(1.0, u, cu[r], row);
                reference::axpby(1.0, o, co[r], row);
            }
        }
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

    /// Columns outer, 16 at a time (a cache line of each row), rows inner: each state value is
    /// loaded and stored once, `delta`, `u` and `o`'s 16 values stay in registers down the rows.
    /// Per value the operations of `axpby` (`fma(b, x, a * y)`; `a = 1` is exact), and its
    /// scalar tail past the last whole 8.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    pub(super) fn update_then_read(
        s: &mut [f32],
        decay: &[f32],
        k: &[f32],
        delta: &[f32],
        cu: &[f32],
        co: &[f32],
        u: &mut [f32],
        o: &mut [f32],
    ) {
        let (rows, cols) = (decay.len(), delta.len());
        let n8 = cols / 8 * 8;
        let sp = s.as_mut_ptr();
        let mut j = 0;
        while j < n8 {
            let w = if j + 16 <= n8 { 2 } else { 1 };
            // SAFETY: columns j..j + 8w of `delta`, `u`, `o` and of every row of `s` exist
            // (j + 8w <= n8 <= cols; s is rows x cols).
            unsafe {
                let mut d = [_mm256_setzero_ps(); 2];
                let (mut uv, mut ov) = ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2]);
                for i in 0..w {
                    d[i] = _mm256_loadu_ps(delta.as_ptr().add(j + 8 * i));
                    uv[i] = _mm256_loadu_ps(u.as_ptr().add(j + 8 * i));
                    ov[i] = _mm256_loadu_ps(o.as_ptr().add(j + 8 * i));
                }
                for r in 0..rows {
                    let (a, b) = (_mm256_set1_ps(decay[r]), _mm256_set1_ps(k[r]));
                    let (c1, c2) = (_mm256_set1_ps(cu[r]), _mm256_set1_ps(co[r]));
                    for i in 0..w {
                        let at = sp.add(r * cols + j + 8 * i);
                        let row = _mm256_fmadd_ps(b, d[i], _mm256_mul_ps(a, _mm256_loadu_ps(at)));
                        _mm256_storeu_ps(at, row);
                        uv[i] = _mm256_fmadd_ps(c1, row, uv[i]);
                        ov[i] = _mm256_fmadd_ps(c2, row, ov[i]);
                    }
                }
                for i in 0..w {
                    _mm256_storeu_ps(u.as_mut_ptr().add(j + 8 * i), uv[i]);
                    _mm256_storeu_ps(o.as_mut_ptr().add(j + 8 * i), ov[i]);
                }
            }
            j += 8 * w;
        }
        if n8 < cols {
            for (r, row) in s.chunks_exact_mut(cols).enumerate() {
                for c in n8..cols {
                    row[c] = decay[r] * row[c] + k[r] * delta[c];
                    // axpby's tail with alpha = 1: `1 * u + c * s`, the product by 1 exact.
                    u[c] += cu[r] * row[c];
                    o[c] += co[r] * row[c];
                }
            }
        }
    }
}
