//! Up to `FEW` vectors against nibble-packed weights (MXFP4, int4), in the split layout.

use std::arch::x86_64::*;

use super::super::nibbles::Nibbles;
use super::super::scales::{BlockScale, four_ps};
use super::super::split::{BLOCK_LANES, SEGMENT};
use super::super::{BLOCK, FEW, Q8Batch};
use crate::simd::prefetch_at;

/// Rows a tile takes.
const R: usize = 4;

/// `ys` `[n, rows]` = `W X` for at most [`FEW`] vectors: per 128 columns of a row, 64 packed bytes
/// masked into their even and shifted into their odd nibbles (looked up for MXFP4), two
/// `vpdpbusd` per vector from the block sums' offset, one conversion, and one multiply-add with
/// four blocks' `scale * step` spread over their lanes; the 16 lanes summed at the end of the row.
/// Every (row, vector) runs the same operations in the same order in any tile, alone or among a
/// few: the same bits; within rounding of the reference's.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, `x` holds at
/// most [`FEW`] vectors, and `ys` holds `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            tile!(1, 2, 3, 4; 1, 2, 3, 4);
        }
    }
}

/// Rows `r0..r0 + RT` against the `N` vectors.
///
/// # Safety
/// As for [`matmul`], with the tile's rows inside the matrix and `N` the batch's vectors.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
    let (blocks, row_bytes, full) = (cols / BLOCK, cols / 2, cols / SEGMENT);
    let split = x.split();
    let padded = split.padded();
    let lanes = padded / BLOCK * BLOCK_LANES;
    let (a, sums, steps) = (split.values().as_ptr(), split.sums().as_ptr(), split.steps().as_ptr());
    let low = _mm512_set1_epi8(0x0f);
    // SAFETY: 16 bytes from a 16-byte array.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(w.levels.as_ptr().cast()) });
    let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let neg = _mm512_set1_epi32(-w.offset);
    // The packed bytes of a last, partial segment (32, 64 or 96 columns).
    let tail: __mmask64 = (1u64 << ((cols % SEGMENT) / 2)) - 1;
    let mut acc = [[_mm512_setzero_ps(); N]; RT];
    for s in 0..cols.div_ceil(SEGMENT) {
        let (mut even, mut odd) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
        let (mut bias, mut step) = ([_mm512_setzero_si512(); N], [_mm512_setzero_ps(); N]);
        for v in 0..N {
            // SAFETY: vector v's padded values, sums and steps hold whole segments; s is one.
            unsafe {
                let at = v * padded + s * SEGMENT;
                even[v] = _mm512_loadu_si512(a.add(at).cast());
                odd[v] = _mm512_loadu_si512(a.add(at + SEGMENT / 2).cast());
                let at = v * lanes + s * 16;
                // The offset of the levels, taken back out: -offset * sum(a) in each block's lanes.
                bias[v] = _mm512_mullo_epi32(_mm512_loadu_si512(sums.add(at).cast()), neg);
                step[v] = _mm512_loadu_ps(steps.add(at));
            }
        }
        for i in 0..RT {
            // SAFETY: row r0 + i's bytes of segment s: 64 of a whole one, the `tail` mask's of a
            // partial last one (masked bytes are not read); `four`'s row and block exist.
            let (raw, scale) = unsafe {
                let p = w.q.as_ptr().add((r0 + i) * row_bytes + s * 64);
                // The same line of the next tile's row: a tile's rows are read side by side, so
                // a fixed distance ahead would land in this tile's own rows.
                prefetch_at::<0, u8>(p.wrapping_add(RT * row_bytes));
                let raw = if s < full { _mm512_loadu_si512(p.cast()) } else { _mm512_maskz_loadu_epi8(tail, p.cast()) };
                (raw, four_ps(w.scale.four(r0 + i, s, blocks)))
            };
            let (mut lo, mut hi) = (_mm512_and_si512(raw, low), _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low));
            if LOOKUP {
                lo = _mm512_shuffle_epi8(table, lo);
                hi = _mm512_shuffle_epi8(table, hi);
            }
            let scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(scale));
            for v in 0..N {
                let dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias[v], lo, even[v]), hi, odd[v]);
                acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scale, step[v]), acc[i][v]);
            }
        }
    }
    for i in 0..RT {
        for v in 0..N {
            // SAFETY: (vector v, row r0 + i) is inside `ys` (the caller's contract).
            unsafe { *out.add(v * rows + r0 + i) = _mm512_reduce_add_ps(acc[i][v]) };
        }
    }
}
