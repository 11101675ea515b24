//! Small dense products for attention over a block of cached positions: all heads' scores
//! against a block of keys (`A B^T`), and the probability-weighted sum of the block (`P B`).
//! Register-blocked so every loaded value feeds several FMAs.

use crate::cpu::{Level, level, supported};

/// `out[i][j] (+)= sum_k a[i][k] * b[j][k]`: `a` `[m, k]`, `b` `[n, k]`, `out` `[m, n]`.
pub fn abt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
    abt_at(level(), a, b, k, out, accumulate)
}

pub fn abt_at(level: Level, a: &[f32], b: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
    let (m, n) = (a.len() / k.max(1), b.len() / k.max(1));
    assert!(k > 0 && a.len() == m * k && b.len() == n * k && out.len() == m * n, "abt: shapes do not match");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes checked.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::abt(a, b, k, out, accumulate) },
        Level::Scalar => reference::abt(a, b, k, out, accumulate),
    }
}

/// `acc[i][..] += sum_j p[i][j] * b[j][..]`: `p` `[m, n]`, `b` `[n, k]`, `acc` `[m, k]`.
pub fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
    pb_acc_at(level(), p, b, k, acc)
}

pub fn pb_acc_at(level: Level, p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
    let n = b.len() / k.max(1);
    let m = p.len().checked_div(n).unwrap_or(0);
    assert!(k > 0 && b.len() == n * k && p.len() == m * n && acc.len() == m * k, "pb_acc: shapes do not match");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F; shapes checked.
        Level::Avx512 => unsafe { avx512::pb_acc(p, b, k, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `abt_at`.
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

pub mod reference {
    pub fn abt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
        let n = b.len() / k;
        for (i, ar) in a.chunks_exact(k).enumerate() {
            for (j, br) in b.chunks_exact(k).enumerate() {
                let s: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
                let o = &mut out[i * n + j];
                *o = if accumulate { *o + s } else { s };
            }
        }
    }

    pub fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
        let n = b.len() / k;
        for (pr, ar) in p.chunks_exact(n).zip(acc.chunks_exact_mut(k)) {
            for (pv, br) in pr.iter().zip(b.chunks_exact(k)) {
                for (a, bv) in ar.iter_mut().zip(br) {
                    *a += pv * bv;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Register blocks are indexed by (row, column) of the block; indices read clearer than iterators.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use std::arch::x86_64::*;

    /// Rows of `a` per register block, and of `b`.
    const MI: usize = 4;
    const NJ: usize = 2;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn abt(a: &[f32], b: &[f32], k: usize, out: &mut [f32], accumulate: bool) {
        let (m, n) = (a.len() / k, b.len() / k);
        let kv = k / 8 * 8;
        let dot_tail = |i: usize, j: usize| -> f32 { (kv..k).map(|t| a[i * k + t] * b[j * k + t]).sum() };
        let mut i = 0;
        while i < m {
            let mi = MI.min(m - i);
            let mut j = 0;
            while j < n {
                let nj = NJ.min(n - j);
                let mut acc = [[_mm256_setzero_ps(); NJ]; MI];
                if mi == MI && nj == NJ {
                    let mut t = 0;
                    while t < kv {
                        // SAFETY: rows i..i+4 of a and j..j+2 of b exist; t + 8 <= kv <= k.
                        unsafe {
                            let av = [0, 1, 2, 3].map(|r| _mm256_loadu_ps(a.as_ptr().add((i + r) * k + t)));
                            for (c, col) in (0..NJ).map(|c| (c, _mm256_loadu_ps(b.as_ptr().add((j + c) * k + t)))) {
                                for r in 0..MI {
                                    acc[r][c] = _mm256_fmadd_ps(av[r], col, acc[r][c]);
                                }
                            }
                        }
                        t += 8;
                    }
                } else {
                    for r in 0..mi {
                        for c in 0..nj {
                            let mut t = 0;
                            while t < kv {
                                // SAFETY: row i + r of a, row j + c of b, t + 8 <= kv <= k.
                                unsafe {
                                    acc[r][c] = _mm256_fmadd_ps(
                                        _mm256_loadu_ps(a.as_ptr().add((i + r) * k + t)),
                                        _mm256_loadu_ps(b.as_ptr().add((j + c) * k + t)),
                                        acc[r][c],
                                    );
                                }
                                t += 8;
                            }
                        }
                    }
                }
                // A block's eight sums reduced together (a short `k`, as a small model's heads
                // have, would otherwise spend more on eight reductions than on the FMAs); a
                // partial block's unused accumulators are zeros. Each sum's order is its own
                // lanes' alone, so a row's bits never depend on the rows beside it.
                let sums = hsum8(acc);
                for r in 0..mi {
                    for c in 0..nj {
                        let s = sums[r * NJ + c] + dot_tail(i + r, j + c);
                        let o = &mut out[(i + r) * n + j + c];
                        *o = if accumulate { *o + s } else { s };
                    }
                }
                j += nj;
            }
            i += mi;
        }
    }

    /// The sums of the eight accumulators of a block, `[r][c]` in order, in one register's lanes:
    /// two levels of pairwise adds within 128-bit halves, then the halves added.
    #[target_feature(enable = "avx2")]
    fn hsum8(acc: [[__m256; NJ]; MI]) -> [f32; MI * NJ] {
        let [[a0, a1], [a2, a3], [a4, a5], [a6, a7]] = acc;
        let (t0, t1) = (_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        let (t2, t3) = (_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
        let (u0, u1) = (_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
        let lo = _mm256_permute2f128_ps::<0x20>(u0, u1);
        let hi = _mm256_permute2f128_ps::<0x31>(u0, u1);
        let mut out = [0f32; MI * NJ];
        // SAFETY: `out` holds eight f32s.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi)) };
        out
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
        let n = b.len() / k;
        let m = p.len() / n;
        let kv = k / 16 * 16;
        let mut i = 0;
        while i < m {
            let mi = MI.min(m - i);
            let mut t = 0;
            while t < kv {
                let mut r8 = [[_mm256_setzero_ps(); 2]; MI];
                for r in 0..mi {
                    // SAFETY: row i + r of acc exists; t + 16 <= kv <= k.
                    unsafe {
                        r8[r] = [
                            _mm256_loadu_ps(acc.as_ptr().add((i + r) * k + t)),
                            _mm256_loadu_ps(acc.as_ptr().add((i + r) * k + t + 8)),
                        ];
                    }
                }
                for j in 0..n {
                    // SAFETY: row j of b exists; t + 16 <= k; p has m x n entries.
                    unsafe {
                        let b0 = _mm256_loadu_ps(b.as_ptr().add(j * k + t));
                        let b1 = _mm256_loadu_ps(b.as_ptr().add(j * k + t + 8));
                        for r in 0..mi {
                            let pv = _mm256_set1_ps(*p.get_unchecked((i + r) * n + j));
                            r8[r][0] = _mm256_fmadd_ps(pv, b0, r8[r][0]);
                            r8[r][1] = _mm256_fmadd_ps(pv, b1, r8[r][1]);
                        }
                    }
                }
                for r in 0..mi {
                    // SAFETY: as above.
                    unsafe {
                        _mm256_storeu_ps(acc.as_mut_ptr().add((i + r) * k + t), r8[r][0]);
                        _mm256_storeu_ps(acc.as_mut_ptr().add((i + r) * k + t + 8), r8[r][1]);
                    }
                }
                t += 16;
            }
            super::pb_acc_tail(p, b, k, i..i + mi, acc);
            i += mi;
        }
    }
}

/// `pb_acc` with eight rows by 32 columns of accumulators (the AVX2 kernel has four by 16, too
/// few to keep two FMA pipes busy through their latency). Every value is the same chain of fused
/// multiply-adds over `j` in order as the AVX2 kernel's, the columns past the last 16 the same
/// scalar adds: both levels give the same bits.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    const MI: usize = 8;

    #[target_feature(enable = "avx512f")]
    pub(super) fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
        let n = b.len() / k;
        let m = p.len() / n;
        let kv = k / 16 * 16;
        let mut i = 0;
        while i < m {
            let mi = MI.min(m - i);
            let mut t = 0;
            while t + 32 <= kv {
                block::<2>(p, b, k, n, i, mi, t, acc);
                t += 32;
            }
            if t < kv {
                block::<1>(p, b, k, n, i, mi, t, acc);
            }
            super::pb_acc_tail(p, b, k, i..i + mi, acc);
            i += mi;
        }
    }

    /// Rows `i..i + mi` (at most [`MI`]), columns `t..t + 16 W`: every `j`'s products added.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn block<const W: usize>(p: &[f32], b: &[f32], k: usize, n: usize, i: usize, mi: usize, t: usize, acc: &mut [f32]) {
        let mut r16 = [[_mm512_setzero_ps(); W]; MI];
        for (r, row) in r16.iter_mut().enumerate().take(mi) {
            for (c, v) in row.iter_mut().enumerate() {
                // SAFETY: row i + r of acc exists (r < mi <= m - i); t + 16 W <= kv <= k.
                *v = unsafe { _mm512_loadu_ps(acc.as_ptr().add((i + r) * k + t + 16 * c)) };
            }
        }
        for j in 0..n {
            // SAFETY: row j of b exists; t + 16 W <= k.
            let bv: [__m512; W] =
                std::array::from_fn(|c| unsafe { _mm512_loadu_ps(b.as_ptr().add(j * k + t + 16 * c)) });
            for (r, row) in r16.iter_mut().enumerate().take(mi) {
                let pv = _mm512_set1_ps(p[(i + r) * n + j]);
                for (v, bc) in row.iter_mut().zip(&bv) {
                    *v = _mm512_fmadd_ps(pv, *bc, *v);
                }
            }
        }
        for (r, row) in r16.iter().enumerate().take(mi) {
            for (c, v) in row.iter().enumerate() {
                // SAFETY: as the loads above.
                unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add((i + r) * k + t + 16 * c), *v) };
            }
        }
    }
}
