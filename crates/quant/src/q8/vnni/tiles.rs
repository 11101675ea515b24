//! Up to `FEW` vectors against int8 weights: 4 x 4 register tiles over pairs of blocks.

use std::arch::x86_64::*;

use super::super::{BLOCK, FEW, Q8Batch};
use super::weights::{Int8, Weights};

/// The product for a few vectors ([`FEW`]): register tiles of 4 rows by 4 vectors over pairs of
/// blocks, the lanes partial sums of a (row, vector) summed at the end. Its own order, not the
/// reference's: its bits are the same for a vector alone or among a few, and within rounding of
/// the batched kernel's (the reference's).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matmul_rows(w: &Int8<'_>, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let n = x.vectors();
    debug_assert!(n <= FEW && FEW <= R4, "one tile's vectors");
    let out = ys.as_mut_ptr();
    for r0 in (0..rows).step_by(R4) {
        let rn = R4.min(rows - r0);
        // SAFETY: rows r0..r0 + rn and vectors 0..n exist; the caller's contract.
        unsafe {
            macro_rules! tile {
                ($($r:literal),*; $($v:literal),*) => {
                    tile!(@rows ($($r),*) ($($v),*))
                };
                (@rows ($($r:literal),*) $vs:tt) => {
                    match rn { $($r => tile!(@vecs $r $vs),)* _ => unreachable!() }
                };
                (@vecs $r:literal ($($v:literal),*)) => {
                    match n { $($v => row_tile::<$r, $v>(w, x, r0, 0, rows, out),)* _ => unreachable!() }
                };
            }
            tile!(1, 2, 3, 4; 1, 2, 3, 4);
        }
    }
}

/// Rows and vectors per [`row_tile`].
const R4: usize = 4;

/// One tile: rows `r0..r0 + RT` against vectors `v0..v0 + VT`, written to `out`. Register tiles
/// are indexed by (row, vector); indices read clearer than iterators here.
///
/// # Safety
/// As for [`matmul_rows`], with the rows and vectors of the tile inside the matrix and the batch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn row_tile<const RT: usize, const VT: usize>(
    w: &Int8<'_>,
    x: &Q8Batch,
    r0: usize,
    v0: usize,
    rows: usize,
    out: *mut f32,
) {
    let cols = x.cols();
    let blocks = cols / BLOCK;
    let (u, d) = (x.values().as_ptr(), x.steps().as_ptr());
    let zero = _mm512_setzero_si512();
    let high = _mm512_set1_epi8(-128);
    // Lanes 0-7 take the first block's step, 8-15 the second's.
    let halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc = [[_mm512_setzero_ps(); VT]; RT];
    for p in 0..blocks / 2 {
        let mut wv = [zero; RT];
        let mut bias = [zero; RT];
        for i in 0..RT {
            // SAFETY: row r0 + i and blocks 2p, 2p + 1 exist (the caller's contract).
            // The same line of the next tile's row: this tile reads its rows side by side, so a
            // fixed distance ahead would land in its own rows.
            wv[i] = unsafe { w.pair(r0 + i, p, RT * cols) };
            // -128 * sum(w) per lane: the offset of the activations, taken back out.
            bias[i] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, high, wv[i]));
        }
        for v in 0..VT {
            // SAFETY: vector v0 + v holds `cols` values and `blocks` steps; 64 values and 2
            // steps from block 2p lie inside them.
            let (q, dv) = unsafe {
                let q = _mm512_loadu_si512(u.add((v0 + v) * cols + p * 64).cast());
                let two = _mm_castpd_ps(_mm_load_sd(d.add((v0 + v) * blocks + 2 * p).cast()));
                (q, _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(two)))
            };
            for i in 0..RT {
                let dot = _mm512_dpbusd_epi32(bias[i], q, wv[i]);
                acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dv, acc[i][v]);
            }
        }
    }
    if blocks % 2 == 1 {
        let b = blocks - 1;
        let (zero, high) = (_mm256_setzero_si256(), _mm256_set1_epi8(-128));
        for i in 0..RT {
            // SAFETY: row r0 + i and block b exist.
            let wv = unsafe { w.one(r0 + i, b) };
            let bias = _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, high, wv));
            for v in 0..VT {
                // SAFETY: 32 values and one step of block b of vector v0 + v.
                let (q, dv) = unsafe {
                    (
                        _mm256_loadu_si256(u.add((v0 + v) * cols + b * 32).cast()),
                        _mm256_set1_ps(*d.add((v0 + v) * blocks + b)),
                    )
                };
                let dot = _mm256_dpbusd_epi32(bias, q, wv);
                let (t, c) = (_mm512_zextps256_ps512(_mm256_cvtepi32_ps(dot)), _mm512_zextps256_ps512(dv));
                acc[i][v] = _mm512_fmadd_ps(t, c, acc[i][v]);
            }
        }
    }
    for i in 0..RT {
        let s = w.row_scale(r0 + i);
        for v in 0..VT {
            // SAFETY: (vector v0 + v, row r0 + i) is inside `ys` (the caller's contract).
            unsafe { *out.add((v0 + v) * rows + r0 + i) = _mm512_reduce_add_ps(acc[i][v]) * s };
        }
    }
}
