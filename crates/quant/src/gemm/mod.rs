//! Small dense products for attention over a block of cached positions: all heads' scores
//! against a block of keys (`A B^T`), and the probability-weighted sum of the block (`P B`).
//! Register-blocked so every loaded value feeds several FMAs.
//!
//! A score may run over a key held in [`Part`]s (MLA's latent and its shared rope key, stored
//! apart): the parts' products go into the same accumulators and are reduced once, which for a
//! small model's short rows costs about what the multiply-adds do. Each score is its own chain
//! over its own row and column at every level, so its bits never depend on the rows and columns
//! beside it (attention splits heads and positions over threads and relies on it); the levels
//! differ from each other in the order of a score's sum (each within rounding of the reference).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod reference;

use crate::cpu::{Level, level, supported};

/// One part of the inner dimension of `A B^T`: `a` `[m, k]` against `b` `[n, k]`.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    pub a: &'a [f32],
    pub b: &'a [f32],
    pub k: usize,
}

/// `out[i][j] (+)= sum_k a[i][k] * b[j][k]`: `a` `[m, k]`, `b` `[n, k]`, `out` `[m, n]`.
pub fn abt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
    abt_parts(&[Part { a, b, k }], out, accumulate)
}

/// `out[i][j] (+)= sum over parts of sum_k a[i][k] * b[j][k]`: every part `[m, k_p]` against
/// `[n, k_p]` for the same `m` and `n`, `out` `[m, n]`.
pub fn abt_parts(parts: &[Part<'_>], out: &mut [f32], accumulate: bool) {
    abt_parts_at(level(), parts, out, accumulate)
}

pub fn abt_parts_at(level: Level, parts: &[Part<'_>], out: &mut [f32], accumulate: bool) {
    let (m, n) = parts.first().map_or((0, 0), |p| (p.a.len() / p.k.max(1), p.b.len() / p.k.max(1)));
    // Divisions, not products: a product could wrap past a huge `k`.
    let rows = |x: &[f32], k: usize, want: usize| x.len().is_multiple_of(k) && x.len() / k == want;
    let fits = |p: &Part<'_>| p.k > 0 && rows(p.a, p.k, m) && rows(p.b, p.k, n);
    assert!(
        !parts.is_empty() && parts.iter().all(fits) && m.checked_mul(n) == Some(out.len()),
        "abt: shapes do not match"
    );
    if m == 0 || n == 0 {
        return;
    }
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F; shapes checked.
        Level::Avx512 => unsafe { avx512::abt(parts, m, n, out, accumulate) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes checked.
        Level::Avx2 => unsafe { avx2::abt(parts, m, n, out, accumulate) },
        Level::Scalar => reference::abt_parts(parts, out, accumulate),
    }
}

/// `acc[i][..] += sum_j p[i][j] * b[j][..]`: `p` `[m, n]`, `b` `[n, k]`, `acc` `[m, k]`.
pub fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
    pb_acc_at(level(), p, b, k, acc)
}

pub fn pb_acc_at(level: Level, p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
    let n = b.len() / k.max(1);
    let m = p.len().checked_div(n).unwrap_or(0);
    let fits = k > 0 && b.len() == n * k && p.len() == m * n && m.checked_mul(k) == Some(acc.len());
    assert!(fits, "pb_acc: shapes do not match");
    if m == 0 || n == 0 {
        return;
    }
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F; shapes checked.
        Level::Avx512 => unsafe { avx512::pb_acc(p, b, k, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `abt_parts_at`.
        Level::Avx2 => unsafe { avx2::pb_acc(p, b, k, acc) },
        Level::Scalar => reference::pb_acc(p, b, k, acc),
    }
}

/// The SIMD `pb_acc` kernels' columns past the last whole 16 for rows `rows`: scalar
/// multiply-then-add over `j` in order (every level the same, so the same bits).
#[cfg(target_arch = "x86_64")]
fn pb_acc_tail(p: &[f32], b: &[f32], k: usize, rows: std::ops::Range<usize>, acc: &mut [f32]) {
    let n = b.len() / k;
    for i in rows {
        for j in 0..n {
            let pv = p[i * n + j];
            for t in k / 16 * 16..k {
                acc[i * k + t] += pv * b[j * k + t];
            }
        }
    }
}

/// A score `s` into `o`: added with `accumulate`, else written.
#[inline]
fn put(o: &mut f32, s: f32, accumulate: bool) {
    *o = if accumulate { *o + s } else { s };
}
