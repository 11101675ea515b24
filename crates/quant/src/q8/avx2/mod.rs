//! The int8-activation products on AVX2 (no VNNI: Haswell to Zen 3, Intel desktops without
//! AVX-512), as llama.cpp's q8 dots are: each 32-block's weights decoded to signed bytes, the
//! activations given the weights' signs (`vpsignb`) so that `vpmaddubsw` multiplies the weights'
//! magnitudes (unsigned) by them, `vpmaddwd` sums the pairs into 32-bit lanes. No pair can
//! saturate: |w| <= 128 and |x| <= 127 give at most 2 * 128 * 127 = 32,512.
//!
//! Batches (more than [`FEW`] vectors): eight rows at a time, one lane each: a block's eight
//! integer dots are summed across their lanes (exactly: integers), converted, and accumulated with
//! one fused multiply-add per block in block order, `acc = fma(dot, step * scale, acc)` — the
//! scalar reference's order, so every (row, vector) gets the reference's bits on any split of the
//! rows over threads. A few vectors (decode) keep eight float lanes per (row, vector) instead
//! ([`few`]): the same bits alone or among a few, within rounding of the reference's.

mod nibbles;

use std::arch::x86_64::*;

use half::f16;

use super::scales::{BlockScale, E8m0, GroupF16};
use super::{BLOCK, FEW, Q8Batch};
use crate::mxfp4::E2M1_DOUBLED;
use crate::simd::prefetch_ahead;

pub(super) use nibbles::matmul as few_nibbles;

/// Rows a tile takes: one 32-bit lane each.
const ROWS: usize = 8;

/// A weight matrix as these kernels read it.
pub(super) trait Weights {
    /// Row `r`'s block `b` as 32 signed bytes in column order.
    ///
    /// # Safety
    /// `r` is a row and `b` a block of the matrix; the CPU has AVX2.
    unsafe fn block(&self, r: usize, b: usize) -> __m256i;
    /// The scale of block `b` of row `r` (1 for weights scaled per row).
    fn scale(&self, r: usize, b: usize) -> f32;
    /// The scale applied to row `r`'s sum at the end (1 for weights scaled per block).
    fn row_scale(&self, r: usize) -> f32;
}

/// 16 bytes of nibbles (low nibble = even column) as 32 signed bytes through `table`.
#[target_feature(enable = "avx2")]
#[inline]
fn nibbles(raw: __m128i, table: __m256i) -> __m256i {
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(raw, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
    // Interleaved back into column order: low nibble, high nibble, next byte's...
    let first = _mm_unpacklo_epi8(lo, hi);
    let second = _mm_unpackhi_epi8(lo, hi);
    _mm256_shuffle_epi8(table, _mm256_set_m128i(second, first))
}

/// The 16 bytes at `at` of nibble-packed weights, with the line `PREFETCH` bytes ahead asked
/// for every fourth block (a cache line holds four): memory streams at its bandwidth.
///
/// # Safety
/// `at..at + 16` lies inside `q`.
#[inline]
unsafe fn packed_block(q: &[u8], at: usize) -> __m128i {
    // SAFETY: the caller's bounds; SSE2 is part of x86_64.
    unsafe {
        let p = q.as_ptr().add(at);
        if (at / 16).is_multiple_of(4) {
            prefetch_ahead(p);
        }
        _mm_loadu_si128(p.cast())
    }
}

fn table(levels: [i8; 16]) -> __m256i {
    // SAFETY: reading 16 bytes from a 16-byte array; AVX is present wherever these kernels run
    // (they are called only at the AVX2 level).
    unsafe {
        let t = _mm_loadu_si128(levels.as_ptr().cast());
        _mm256_set_m128i(t, t)
    }
}

/// Nibble-packed weights (`cols / 2` bytes a row, low nibble = even column) read through a
/// 16-entry table of signed levels, a scale per 32-block: MXFP4 and int4.
pub(super) struct Packed<'a, S> {
    q: &'a [u8],
    blocks: usize,
    table: __m256i,
    scale: S,
}

/// MXFP4 (`packed` `[rows, cols/2]`, E8M0 `scale` `[rows, cols/32]`): doubled E2M1 levels, the
/// half folded into the scale.
pub(super) fn mxfp4<'a>(packed: &'a [u8], scale: &'a [u8], cols: usize) -> Packed<'a, E8m0<'a>> {
    Packed { q: packed, blocks: cols / BLOCK, table: table(E2M1_DOUBLED), scale: E8m0 { scale, blocks: cols / BLOCK } }
}

/// int4 (`q` `[rows, cols/2]`, levels nibble - 8, f16 `scale` per `group`).
pub(super) fn int4<'a>(q: &'a [u8], scale: &'a [f16], group: usize, cols: usize) -> Packed<'a, GroupF16<'a>> {
    let levels = std::array::from_fn(|n| n as i8 - 8);
    Packed { q, blocks: cols / BLOCK, table: table(levels), scale: GroupF16 { scale, group, groups: cols / group } }
}

impl<S: BlockScale> Weights for Packed<'_, S> {
    #[inline]
    unsafe fn block(&self, r: usize, b: usize) -> __m256i {
        // SAFETY: 16 bytes of row r's block b (the caller's contract); AVX2 present.
        unsafe { nibbles(packed_block(self.q, (r * self.blocks + b) * 16), self.table) }
    }

    #[inline]
    fn scale(&self, r: usize, b: usize) -> f32 {
        self.scale.at(r, b)
    }

    fn row_scale(&self, _: usize) -> f32 {
        1.0
    }
}

/// int8: one f32 scale per row.
pub(super) struct Int8<'a> {
    pub q: &'a [i8],
    pub scale: &'a [f32],
    pub cols: usize,
}

impl Weights for Int8<'_> {
    #[inline]
    unsafe fn block(&self, r: usize, b: usize) -> __m256i {
        // SAFETY: 32 bytes of row r from column 32b (the caller's contract).
        unsafe {
            let at = self.q.as_ptr().add(r * self.cols + b * BLOCK);
            // A line ahead every other block (64 bytes): streaming from memory at its bandwidth.
            if b.is_multiple_of(2) {
                prefetch_ahead(at);
            }
            _mm256_loadu_si256(at.cast())
        }
    }

    #[inline]
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }

    fn row_scale(&self, r: usize) -> f32 {
        self.scale[r]
    }
}

/// Eight rows' block dots (one `i32x8` of partial sums each) summed, row `i` in lane `i`.
#[target_feature(enable = "avx2")]
#[inline]
fn lane_sums(p: &[__m256i; ROWS]) -> __m256i {
    let t0 = _mm256_hadd_epi32(p[0], p[1]);
    let t1 = _mm256_hadd_epi32(p[2], p[3]);
    let t2 = _mm256_hadd_epi32(p[4], p[5]);
    let t3 = _mm256_hadd_epi32(p[6], p[7]);
    // Each 128-bit half: rows 0-3 (u0) or 4-7 (u1), that half's sums.
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(u0, u1), _mm256_permute2x128_si256::<0x31>(u0, u1))
}

/// `ys` `[n, rows]` = `W X`: up to [`FEW`] vectors row by row ([`few`]), more eight rows at a
/// time with the reference's bits ([`batch`]).
///
/// # Safety
/// The CPU has AVX2 and FMA; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matmul<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe { if x.vectors() <= FEW { few(w, rows, x, ys) } else { batch(w, rows, x, ys) } }
}

/// A few vectors (a decode step's): each (row, vector) keeps eight float lanes, a block's
/// partial dots converted and multiply-added into them with the block's scale (llama.cpp's
/// order), summed across the lanes at the end of the row. No horizontal sum per block; a vector
/// gets the same bits alone or among a few, within rounding of the reference's.
///
/// # Safety
/// As for [`matmul`], with at most [`FEW`] vectors.
#[target_feature(enable = "avx2,fma")]
unsafe fn few<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract; each call's rows lie inside the matrix.
    unsafe {
        macro_rules! rows_of {
            ($n:literal) => {{
                let pairs = rows / 2 * 2;
                for r0 in (0..pairs).step_by(2) {
                    few_tile::<W, 2, $n>(w, r0, rows, x, ys);
                }
                if pairs < rows {
                    few_tile::<W, 1, $n>(w, pairs, rows, x, ys);
                }
            }};
        }
        match x.vectors() {
            1 => rows_of!(1),
            2 => rows_of!(2),
            3 => rows_of!(3),
            4 => rows_of!(4),
            // No vectors: nothing to compute (`matmul` sends only up to `FEW` here).
            _ => {}
        }
    }
}

/// Rows `r0..r0 + R` against the `N` vectors, accumulators in registers (`R * N` chains).
///
/// # Safety
/// As for [`few`], with rows `r0..r0 + R` inside the matrix and `N` the batch's vectors.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn few_tile<W: Weights, const R: usize, const N: usize>(
    w: &W,
    r0: usize,
    rows: usize,
    x: &Q8Batch,
    ys: &mut [f32],
) {
    let cols = x.cols();
    let blocks = cols / BLOCK;
    let (u, steps) = (x.values().as_ptr(), x.steps());
    let (ones, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
    let mut acc = [[_mm256_setzero_ps(); N]; R];
    for b in 0..blocks {
        let mut xq = [_mm256_setzero_si256(); N];
        for v in 0..N {
            // SAFETY: vector v's block b: 32 values inside the batch.
            xq[v] = _mm256_xor_si256(unsafe { _mm256_loadu_si256(u.add(v * cols + b * BLOCK).cast()) }, flip);
        }
        for i in 0..R {
            // SAFETY: row r0 + i and block b exist (the caller's contract).
            let sign = unsafe { w.block(r0 + i, b) };
            let (mag, scale) = (_mm256_abs_epi8(sign), w.scale(r0 + i, b));
            for v in 0..N {
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(xq[v], sign)), ones);
                let c = _mm256_set1_ps(steps[v * blocks + b] * scale);
                acc[i][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), c, acc[i][v]);
            }
        }
    }
    for i in 0..R {
        for v in 0..N {
            ys[v * rows + r0 + i] = sum8(acc[i][v]) * w.row_scale(r0 + i);
        }
    }
}

/// The eight lanes of `a` summed (a fixed order: the same bits for the same lanes).
#[target_feature(enable = "avx2")]
#[inline]
fn sum8(a: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// More than [`FEW`] vectors: eight rows a tile, one lane each, in the reference's order (its
/// bits); a tile's block decoded once for every vector.
///
/// # Safety
/// As for [`matmul`].
#[target_feature(enable = "avx2,fma")]
unsafe fn batch<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let (cols, n) = (x.cols(), x.vectors());
    let blocks = cols / BLOCK;
    let (u, steps) = (x.values(), x.steps());
    let (ones, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
    let mut acc = vec![_mm256_setzero_ps(); n];
    for r0 in (0..rows).step_by(ROWS) {
        let live = ROWS.min(rows - r0);
        acc.fill(_mm256_setzero_ps());
        for b in 0..blocks {
            // The tile's weights for this block: magnitudes, and the weights whose signs the
            // activations take (rows past the matrix are zeros: their dots are 0).
            let (mut mag, mut sign) = ([_mm256_setzero_si256(); ROWS], [_mm256_setzero_si256(); ROWS]);
            let mut scale = [0f32; ROWS];
            for i in 0..live {
                // SAFETY: row r0 + i and block b exist (the caller's contract).
                sign[i] = unsafe { w.block(r0 + i, b) };
                mag[i] = _mm256_abs_epi8(sign[i]);
                scale[i] = w.scale(r0 + i, b);
            }
            // SAFETY: eight f32 from an array of eight.
            let scale = unsafe { _mm256_loadu_ps(scale.as_ptr()) };
            for (v, a) in acc.iter_mut().enumerate() {
                // SAFETY: vector v's block b: 32 values inside `u` (`n * cols` of them).
                let q = unsafe { _mm256_loadu_si256(u.as_ptr().add(v * cols + b * BLOCK).cast()) };
                // The offset values signed: u - 128, as bytes.
                let xq = _mm256_xor_si256(q, flip);
                let mut p = [_mm256_setzero_si256(); ROWS];
                for i in 0..live {
                    p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(mag[i], _mm256_sign_epi8(xq, sign[i])), ones);
                }
                let dots = _mm256_cvtepi32_ps(lane_sums(&p));
                let c = _mm256_mul_ps(_mm256_set1_ps(steps[v * blocks + b]), scale);
                *a = _mm256_fmadd_ps(dots, c, *a);
            }
        }
        for (v, a) in acc.iter().enumerate() {
            let mut lanes = [0f32; ROWS];
            // SAFETY: eight f32 into an array of eight.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
            for (i, l) in lanes[..live].iter().enumerate() {
                ys[v * rows + r0 + i] = l * w.row_scale(r0 + i);
            }
        }
    }
}
