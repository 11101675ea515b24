//! Up to `FEW` vectors against nibble-packed weights (MXFP4, int4), in the split layout.

use std::arch::x86_64::*;

use super::super::nibbles::Nibbles;
use super::super::scales::{BlockScale, four_ps};
use super::super::split::{BLOCK_LANES, SEGMENT};
use super::super::{BLOCK, FEW, Q8Batch};
use crate::simd::prefetch_at;

/// Rows a tile takes (sixteen 256-bit registers: accumulators, scales and constants).
const R: usize = 2;

/// `ys` `[n, rows]` = `W X` for at most [`FEW`] vectors, as llama.cpp's q4 dots are: per 64
/// columns of a row, 32 packed bytes masked into their even and shifted into their odd nibbles
/// (looked up for MXFP4), `vpmaddubsw` of each against the vector's even and odd values, the two
/// added (at most 2 * 2 * 24 * 127 = 12,192: no saturation), `vpmaddwd` into 32-bit lanes, the
/// block sums' offset taken out, one conversion and one multiply-add with two blocks' `scale *
/// step` spread over their lanes, into one of two accumulators per half segment, summed at the end
/// of the row. Every (row, vector) runs the same operations in the same order in any tile, alone
/// or among a few: the same bits; within rounding of the reference's.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` has `rows` rows of `x.cols()` columns, `x` holds at most
/// [`FEW`] vectors, and `ys` holds `x.vectors() * rows` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::q8) unsafe fn matmul<S: BlockScale>(w: &Nibbles<'_, S>, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let (n, out) = (x.vectors(), ys.as_mut_ptr());
    debug_assert!(n <= FEW && w.cols == x.cols());
    for r0 in (0..rows).step_by(R) {
        let rn = R.min(rows - r0);
        // SAFETY: rows r0..r0 + rn and vectors 0..n exist; the caller's contract.
        unsafe {
            macro_rules! tile {
                ($($r:literal),*; $($v:literal),*) => { tile!(@rows ($($r),*) ($($v),*)) };
                (@rows ($($r:literal),*) $vs:tt) => {
                    match rn { $($r => tile!(@vecs $r $vs),)* _ => unreachable!() }
                };
                (@vecs $r:literal ($($v:literal),*)) => {
                    match (n, w.lookup) {
                        $(($v, true) => tile::<S, true, $r, $v>(w, x, r0, rows, out),
                          ($v, false) => tile::<S, false, $r, $v>(w, x, r0, rows, out),)*
                        _ => unreachable!()
                    }
                };
            }
            tile!(1, 2; 1, 2, 3, 4);
        }
    }
}

/// The packed bytes `p..p + len` (16 or 32) of a row, zero-extended to 32, and the same bytes
/// `ahead` further asked for (the next tile's row: a tile's rows are read side by side, so a
/// fixed distance ahead would land in this tile's own rows).
///
/// # Safety
/// `p..p + len` lies inside the row.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn packed(p: *const u8, len: usize, ahead: usize) -> __m256i {
    prefetch_at::<0, u8>(p.wrapping_add(ahead));
    // SAFETY: the caller's bounds.
    unsafe { if len >= 32 { _mm256_loadu_si256(p.cast()) } else { _mm256_zextsi128_si256(_mm_loadu_si128(p.cast())) } }
}

/// Rows `r0..r0 + RT` against the `N` vectors.
///
/// # Safety
/// As for [`matmul`], with the tile's rows inside the matrix and `N` the batch's vectors.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<S: BlockScale, const LOOKUP: bool, const RT: usize, const N: usize>(
    w: &Nibbles<'_, S>,
    x: &Q8Batch,
    r0: usize,
    rows: usize,
    out: *mut f32,
) {
    let cols = w.cols;
    let (blocks, row_bytes) = (cols / BLOCK, cols / 2);
    let split = x.split();
    let padded = split.padded();
    let lanes = padded / BLOCK * BLOCK_LANES;
    let (a, sums, steps) = (split.values().as_ptr(), split.sums().as_ptr(), split.steps().as_ptr());
    let (low, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
    // SAFETY: 16 bytes from a 16-byte array.
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(w.levels.as_ptr().cast()) });
    let spread = [_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)];
    let neg = _mm256_set1_epi32(-w.offset);
    let mut acc = [[[_mm256_setzero_ps(); 2]; N]; RT];
    for s in 0..cols.div_ceil(SEGMENT) {
        // Packed bytes of this segment in each half: 32 and 32, or a partial last one's.
        let bytes = (cols - s * SEGMENT).min(SEGMENT) / 2;
        let halves = [bytes.min(32), bytes.saturating_sub(32)];
        let mut bias = [[_mm256_setzero_si256(); 2]; N];
        for v in 0..N {
            for h in 0..2 {
                // SAFETY: vector v's padded sums hold whole segments; s is one.
                let sum = unsafe { _mm256_loadu_si256(sums.add(v * lanes + s * 16 + h * 8).cast()) };
                // The offset of the levels, taken back out: -offset * sum(a) in each block's lanes.
                bias[v][h] = _mm256_mullo_epi32(sum, neg);
            }
        }
        for i in 0..RT {
            // SAFETY: row r0 + i and block 4s exist.
            let four = _mm256_castps128_ps256(four_ps(w.scale.four(r0 + i, s, blocks)));
            let p = w.q[(r0 + i) * row_bytes..].as_ptr();
            for h in 0..2 {
                if halves[h] == 0 {
                    continue;
                }
                // SAFETY: the half's packed bytes lie inside row r0 + i.
                let raw = unsafe { packed(p.add(s * 64 + h * 32), halves[h], RT * row_bytes) };
                let (mut lo, mut hi) = (_mm256_and_si256(raw, low), _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low));
                if LOOKUP {
                    lo = _mm256_shuffle_epi8(table, lo);
                    hi = _mm256_shuffle_epi8(table, hi);
                }
                let scale = _mm256_permutevar8x32_ps(four, spread[h]);
                for v in 0..N {
                    // SAFETY: vector v's padded values and steps hold whole segments.
                    let (even, odd, step) = unsafe {
                        let at = v * padded + s * SEGMENT + h * 32;
                        (
                            _mm256_loadu_si256(a.add(at).cast()),
                            _mm256_loadu_si256(a.add(at + SEGMENT / 2).cast()),
                            _mm256_loadu_ps(steps.add(v * lanes + s * 16 + h * 8)),
                        )
                    };
                    let pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, even), _mm256_maddubs_epi16(hi, odd));
                    let dot = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), bias[v][h]);
                    acc[i][v][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, step), acc[i][v][h]);
                }
            }
        }
    }
    for i in 0..RT {
        for v in 0..N {
            // SAFETY: (vector v, row r0 + i) is inside `ys` (the caller's contract).
            unsafe { *out.add(v * rows + r0 + i) = super::sum8(_mm256_add_ps(acc[i][v][0], acc[i][v][1])) };
        }
    }
}
