//! AVX-512 F: `abt` in register blocks of 16 accumulators of 16 lanes (four rows by four columns,
//! or two by eight, or one by 16), reduced together by a shuffle tree; `pb_acc` in up to eight
//! rows by up to 64 columns.

use std::arch::x86_64::*;

use super::{Part, put};

/// Accumulators of an `abt` register block: `R` rows of `a` by `16 / R` of `b`.
const TILE: usize = 16;

/// Row blocks of four, the last one of two or one (a task holding a single head, as a small
/// model's decode gives), each against `16 / R` columns: 16 accumulators, never a row computed
/// in vain but for a last block of three. As the AVX2 kernel: rows and columns past the
/// matrices' last are copies of the last, never written, so each score is its own accumulator's
/// chain whichever block holds it; a row's end is read by masked loads (zeros past it).
///
/// # Safety
/// The CPU has AVX-512 F; every part's `a` is `[m, k]` and `b` `[n, k]` for its `k > 0`, `out` is
/// `[m, n]` and `m, n > 0` (as `abt_parts_at` checks).
#[target_feature(enable = "avx512f")]
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
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn rows<const R: usize>(parts: &[Part<'_>], m: usize, n: usize, i: usize, out: &mut [f32], accumulate: bool) {
    let nj = TILE / R;
    let rows: [usize; R] = std::array::from_fn(|r| (i + r).min(m - 1));
    for j in (0..n).step_by(nj) {
        let cols: [usize; TILE] = std::array::from_fn(|c| (j + c).min(n - 1));
        let mut acc = [_mm512_setzero_ps(); TILE];
        for p in parts {
            let mut t = 0;
            while t + 16 <= p.k {
                // SAFETY: rows < m, columns < n (clamped), t < k; without a mask t + 16 <= k.
                unsafe { step(p, rows, &cols, t, u16::MAX, &mut acc) };
                t += 16;
            }
            if t < p.k {
                // SAFETY: rows < m, columns < n (clamped), t < k; without a mask t + 16 <= k.
                unsafe { step(p, rows, &cols, t, (1u16 << (p.k - t)) - 1, &mut acc) };
            }
        }
        let sums = reduce16(acc);
        for r in 0..R.min(m - i) {
            for c in 0..nj.min(n - j) {
                let v = r * nj + c;
                put(&mut out[(i + r) * n + j + c], sums[(v % 4) * 4 + v / 4], accumulate);
            }
        }
    }
}

/// Columns `t..t + 16` (the lanes of `mask`; a row's end is a partial mask) of the block's rows
/// and first `16 / R` columns into its accumulators `[r * 16 / R + c]`.
///
/// # Safety
/// The rows are rows of `p.a` and the columns rows of `p.b`; `t < k`, and `t + 16 <= k`
/// where `mask` is whole.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn step<const R: usize>(
    p: &Part<'_>,
    rows: [usize; R],
    cols: &[usize; TILE],
    t: usize,
    mask: u16,
    acc: &mut [__m512; TILE],
) {
    let load = |x: &[f32], row: usize| {
        debug_assert!(row * p.k + t < x.len());
        // SAFETY: `row` is a row of `x` and `t < k` (`step`'s contract); the
        // mask holds only the lanes before the row's end (`t + 16 <= k` when it is whole), and
        // a masked load reads no lane outside it.
        unsafe { _mm512_maskz_loadu_ps(mask, x.as_ptr().add(row * p.k + t)) }
    };
    let nj = TILE / R;
    let av = rows.map(|r| load(p.a, r));
    for (c, &col) in cols.iter().take(nj).enumerate() {
        let bv = load(p.b, col);
        for (r, a) in av.iter().enumerate() {
            acc[r * nj + c] = _mm512_fmadd_ps(*a, bv, acc[r * nj + c]);
        }
    }
}

/// The lane sums of 16 accumulators, accumulator `v` at index `(v % 4) * 4 + v / 4`: halves
/// added, then quarters, then lanes 0 + 2 and 1 + 3 of each quarter, then the two left. Every
/// accumulator's lanes are added in the same order, wherever it sits.
#[target_feature(enable = "avx512f")]
fn reduce16(v: [__m512; 16]) -> [f32; 16] {
    // Pairs (a, b) into [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3] (128-bit quarters).
    let halves: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(a, b), _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b))
    });
    // Pairs into one quarter a source: [a.q0 + a.q1, a.q2 + a.q3, b.q0 + b.q1, b.q2 + b.q3].
    let quarters: [__m512; 4] = std::array::from_fn(|p| {
        let (a, b) = (halves[2 * p], halves[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b))
    });
    // Within each quarter: [a0 + a2, a1 + a3, b0 + b2, b1 + b3], then [x0 + x1, x2 + x3, ..].
    let pairs: [__m512; 2] = std::array::from_fn(|p| {
        let (a, b) = (quarters[2 * p], quarters[2 * p + 1]);
        _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(a, b), _mm512_shuffle_ps::<0b11_10_11_10>(a, b))
    });
    let (a, b) = (pairs[0], pairs[1]);
    let sums = _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(a, b), _mm512_shuffle_ps::<0b11_01_11_01>(a, b));
    let mut out = [0f32; 16];
    // SAFETY: `out` holds 16 f32s.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sums) };
    out
}

/// `pb_acc` in blocks of up to eight rows by 32 columns, or four by 64 when four rows or fewer
/// are left (a few heads' weighted sums: the same 16 accumulators). Every value is the same chain
/// of fused multiply-adds over `j` in order as the AVX2 kernel's, the columns past the last 16
/// the same scalar adds: both levels give the same bits.
///
/// # Safety
/// The CPU has the level's features; `b` is `[n, k]`, `p` `[m, n]` and `acc` `[m, k]` with
/// `k, n > 0` (as `pb_acc_at` checks).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pb_acc(p: &[f32], b: &[f32], k: usize, acc: &mut [f32]) {
    let n = b.len() / k;
    let m = p.len() / n;
    let mut i = 0;
    while i < m {
        let mi = 8.min(m - i);
        if mi <= 4 {
            columns::<4, 4>(p, b, k, n, i, mi, acc);
        } else {
            columns::<8, 2>(p, b, k, n, i, mi, acc);
        }
        super::pb_acc_tail(p, b, k, i..i + mi, acc);
        i += mi;
    }
}

/// Rows `i..i + mi` (`mi <= R`): the whole 16-column groups, `W` at a time, then one at a time.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
fn columns<const R: usize, const W: usize>(
    p: &[f32],
    b: &[f32],
    k: usize,
    n: usize,
    i: usize,
    mi: usize,
    acc: &mut [f32],
) {
    let kv = k / 16 * 16;
    let mut t = 0;
    while t + 16 * W <= kv {
        block::<R, W>(p, b, k, n, i, mi, t, acc);
        t += 16 * W;
    }
    while t < kv {
        block::<R, 1>(p, b, k, n, i, mi, t, acc);
        t += 16;
    }
}

/// Rows `i..i + mi` (at most `R`), columns `t..t + 16 W`: every `j`'s products added.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
#[inline]
fn block<const R: usize, const W: usize>(
    p: &[f32],
    b: &[f32],
    k: usize,
    n: usize,
    i: usize,
    mi: usize,
    t: usize,
    acc: &mut [f32],
) {
    let mut r16 = [[_mm512_setzero_ps(); W]; R];
    for (r, row) in r16.iter_mut().enumerate().take(mi) {
        for (c, v) in row.iter_mut().enumerate() {
            // SAFETY: row i + r of acc exists (r < mi <= m - i); t + 16 W <= kv <= k.
            *v = unsafe { _mm512_loadu_ps(acc.as_ptr().add((i + r) * k + t + 16 * c)) };
        }
    }
    for j in 0..n {
        // SAFETY: row j of b exists; t + 16 W <= k.
        let bv: [__m512; W] = std::array::from_fn(|c| unsafe { _mm512_loadu_ps(b.as_ptr().add(j * k + t + 16 * c)) });
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
