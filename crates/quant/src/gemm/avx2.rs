//! AVX2 + FMA: `abt` in register blocks of eight accumulators of eight lanes (four rows by two
//! columns, or two by four, or one by eight), reduced together; `pb_acc` in four rows by 16
//! columns.

// Register blocks are indexed by (row, column) of the block; indices read clearer than iterators.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{Part, put};

/// Rows of a `pb_acc` register block.
const MI: usize = 4;
/// Accumulators of an `abt` register block: `R` rows of `a` by `8 / R` of `b`.
const TILE: usize = 8;

/// Row blocks of four, the last one of two or one (a task holding a single head), each against
/// `8 / R` columns. A block's rows and columns past the matrices' last are computed as copies of
/// the last (so every block runs the same loop) and never written: each score is its own
/// accumulator's chain over its own row and column, whichever block holds it.
///
/// # Safety
/// The CPU has AVX2 and FMA; every part's `a` is `[m, k]` and `b` `[n, k]` for its `k > 0`, `out` is
/// `[m, n]` and `m, n > 0` (as `abt_parts_at` checks).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn abt(parts: &[Part<'_>], m: usize, n: usize, out: &mut [f32], accumulate: bool) {
    let mut i = 0;
    while i < m {
        match m - i {
            // SAFETY: `abt`'s contract, and row `i < m`.
            1 => unsafe { rows::<1>(parts, m, n, i, out, accumulate) },
            // SAFETY: `abt`'s contract, and row `i < m`.
            2 => unsafe { rows::<2>(parts, m, n, i, out, accumulate) },
            // SAFETY: `abt`'s contract, and row `i < m`.
            _ => unsafe { rows::<4>(parts, m, n, i, out, accumulate) },
        }
        i += 4.min(m - i);
    }
}

/// Rows `i..i + R` (the last copied past `m`) against every column.
///
/// # Safety
/// As [`abt`]'s, and `i < m`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn rows<const R: usize>(parts: &[Part<'_>], m: usize, n: usize, i: usize, out: &mut [f32], accumulate: bool) {
    let nj = TILE / R;
    let rows: [usize; R] = std::array::from_fn(|r| (i + r).min(m - 1));
    for j in (0..n).step_by(nj) {
        let cols: [usize; TILE] = std::array::from_fn(|c| (j + c).min(n - 1));
        let mut acc = [_mm256_setzero_ps(); TILE];
        for p in parts {
            let mut t = 0;
            while t + 8 <= p.k {
                // SAFETY: rows < m, columns < n (clamped), t < k; without a mask t + 8 <= k.
                unsafe { step(p, rows, &cols, t, None, &mut acc) };
                t += 8;
            }
            if t < p.k {
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((p.k - t) as i32), lane);
                // SAFETY: rows < m, columns < n (clamped), t < k; without a mask t + 8 <= k.
                unsafe { step(p, rows, &cols, t, Some(mask), &mut acc) };
            }
        }
        // A block's eight sums reduced together (a short `k`, as a small model's heads
        // have, would otherwise spend more on eight reductions than on the FMAs).
        let sums = hsum8(acc);
        for r in 0..R.min(m - i) {
            for c in 0..nj.min(n - j) {
                put(&mut out[(i + r) * n + j + c], sums[r * nj + c], accumulate);
            }
        }
    }
}

/// Columns `t..t + 8` of the block's rows and first `8 / R` columns (the lanes past `mask`'s
/// zeros: a short row's end, loaded as zeros) into its accumulators `[r * 8 / R + c]`.
///
/// # Safety
/// The rows are rows of `p.a` and the columns rows of `p.b`; `t < k`, and `t + 8 <= k`
/// without a mask.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn step<const R: usize>(
    p: &Part<'_>,
    rows: [usize; R],
    cols: &[usize; TILE],
    t: usize,
    mask: Option<__m256i>,
    acc: &mut [__m256; TILE],
) {
    let load = |x: &[f32], row: usize| {
        let at = row * p.k + t;
        debug_assert!(at < x.len() && (mask.is_some() || at + 8 <= x.len()));
        // SAFETY: `row` is a row of `x` and `t < k` (`step`'s contract): without
        // a mask `t + 8 <= k`; with one only the lanes before the row's end are read
        // (`vmaskmovps` touches no other).
        unsafe {
            match mask {
                None => _mm256_loadu_ps(x.as_ptr().add(at)),
                Some(m) => _mm256_maskload_ps(x.as_ptr().add(at), m),
            }
        }
    };
    let nj = TILE / R;
    let av = rows.map(|r| load(p.a, r));
    for c in 0..nj {
        let col = load(p.b, cols[c]);
        for r in 0..R {
            acc[r * nj + c] = _mm256_fmadd_ps(av[r], col, acc[r * nj + c]);
        }
    }
}

/// The sums of the eight accumulators of a block, in order, in one register's lanes: two levels
/// of pairwise adds within 128-bit halves, then the halves added (the same adds for each).
#[target_feature(enable = "avx2")]
fn hsum8(acc: [__m256; TILE]) -> [f32; TILE] {
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    let (t0, t1) = (_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    let (t2, t3) = (_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    let (u0, u1) = (_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
    let lo = _mm256_permute2f128_ps::<0x20>(u0, u1);
    let hi = _mm256_permute2f128_ps::<0x31>(u0, u1);
    let mut out = [0f32; TILE];
    // SAFETY: `out` holds eight f32s.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi)) };
    out
}

/// `pb_acc` in blocks of four rows by 16 columns.
///
/// # Safety
/// The CPU has the level's features; `b` is `[n, k]`, `p` `[m, n]` and `acc` `[m, k]` with
/// `k, n > 0` (as `pb_acc_at` checks).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
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
