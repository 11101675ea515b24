//! The int8-activation products on AVX2 (no VNNI: Haswell to Zen 3, Intel desktops without
//! AVX-512), on `vpmaddubsw` (unsigned by signed bytes, pairs summed into 16 bits) and `vpmaddwd`
//! (into 32-bit lanes), as llama.cpp's q8 dots are.
//!
//! - `lanes`: batches (more than [`FEW`] vectors), vectors in register lanes as the VNNI lanes
//!   kernel's: the scalar reference's order and bits.
//! - `nibbles`: up to [`FEW`] vectors against MXFP4 and int4, in the split layout.
//! - [`few`]: up to [`FEW`] vectors against int8, row by row: each 32-block's weights signed, the
//!   activations given their signs (`vpsignb`) so that `vpmaddubsw` multiplies the weights'
//!   magnitudes by them (no pair saturates: 2 * 128 * 127 = 32,512), eight float lanes per (row,
//!   vector): the same bits alone or among a few, within rounding of the reference's.

mod lanes;
mod nibbles;

use std::arch::x86_64::*;

use half::f16;

use super::scales::{BlockScale, E8m0, GroupF16, four_ps};
use super::{BLOCK, FEW, Q8Batch};
use crate::mxfp4::E2M1_DOUBLED;
use crate::simd::prefetch_ahead;

use lanes::Rows;
pub(super) use nibbles::matmul as few_nibbles;

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
/// 16-entry table of levels offset by `O` (unsigned), a scale per 32-block: MXFP4 and int4, as
/// the batched kernel ([`lanes`]) reads them.
pub(super) struct Packed<'a, S, const O: i32> {
    q: &'a [u8],
    blocks: usize,
    table: __m256i,
    scale: S,
}

/// MXFP4 (`packed` `[rows, cols/2]`, E8M0 `scale` `[rows, cols/32]`): doubled E2M1 levels
/// (-12..=12) offset by 12, the half folded into the scale.
pub(super) fn mxfp4<'a>(packed: &'a [u8], scale: &'a [u8], cols: usize) -> Packed<'a, E8m0<'a>, 12> {
    let levels = E2M1_DOUBLED.map(|l| l + 12);
    Packed { q: packed, blocks: cols / BLOCK, table: table(levels), scale: E8m0 { scale, blocks: cols / BLOCK } }
}

/// int4 (`q` `[rows, cols/2]`, levels nibble - 8, f16 `scale` per `group`): the nibble is the
/// level offset by 8.
pub(super) fn int4<'a>(q: &'a [u8], scale: &'a [f16], group: usize, cols: usize) -> Packed<'a, GroupF16<'a>, 8> {
    let levels = std::array::from_fn(|n| n as i8);
    Packed { q, blocks: cols / BLOCK, table: table(levels), scale: GroupF16 { scale, group, groups: cols / group } }
}

impl<S: BlockScale, const O: i32> Rows for Packed<'_, S, O> {
    const SIGNED: bool = false;
    const OFFSET: i32 = O;
    const BLOCK_SCALED: bool = true;

    #[inline]
    unsafe fn decode(&self, r: usize, out: &mut [u8]) {
        for (b, o) in out.chunks_exact_mut(BLOCK).enumerate() {
            // SAFETY: 16 bytes of row r's block b (the caller's contract), 32 into `o`; AVX2.
            unsafe {
                let v = nibbles(packed_block(self.q, (r * self.blocks + b) * 16), self.table);
                _mm256_storeu_si256(o.as_mut_ptr().cast(), v);
            }
        }
    }

    /// Four scales at a time in registers (one call a row: not worth inlining).
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scales(&self, r: usize, out: &mut [f32]) {
        let blocks = out.len();
        for (s, o) in out.chunks_mut(4).enumerate() {
            let mut four = [0f32; 4];
            // SAFETY: four f32 into an array of four.
            unsafe { _mm_storeu_ps(four.as_mut_ptr(), four_ps(self.scale.four(r, s, blocks))) };
            o.copy_from_slice(&four[..o.len()]);
        }
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

impl Rows for Int8<'_> {
    const SIGNED: bool = true;
    const OFFSET: i32 = 0;
    const BLOCK_SCALED: bool = false;

    #[inline]
    unsafe fn decode(&self, r: usize, out: &mut [u8]) {
        for (d, s) in out.iter_mut().zip(&self.q[r * self.cols..][..self.cols]) {
            *d = *s as u8;
        }
    }

    unsafe fn scales(&self, _: usize, out: &mut [f32]) {
        out.fill(1.0);
    }

    fn row_scale(&self, r: usize) -> f32 {
        self.scale[r]
    }
}

/// The few-vector kernel's reads ([`few`]).
impl Int8<'_> {
    #[inline]
    /// Row `r`'s block `b` as 32 signed bytes in column order.
    ///
    /// # Safety
    /// `r` is a row and `b` a block of the matrix; the CPU has AVX2.
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
}

/// `ys` `[n, rows]` = `W X` for more than [`FEW`] vectors (a few take [`few_nibbles`] or, for
/// int8, [`matmul_int8`]), with the reference's bits ([`lanes`]).
///
/// # Safety
/// The CPU has AVX2 and FMA; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matmul<W: Rows>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract, passed on (no vectors: nothing to compute).
    unsafe {
        if x.vectors() > FEW {
            lanes::matmul(w, rows, x, ys)
        }
    }
}

/// `ys` `[n, rows]` = `W X` for int8 weights: up to [`FEW`] vectors row by row ([`few`]), more
/// through [`lanes`].
///
/// # Safety
/// As for [`matmul`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matmul_int8(w: &Int8<'_>, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe { if x.vectors() <= FEW { few(w, rows, x, ys) } else { lanes::matmul(w, rows, x, ys) } }
}

/// A few vectors (a decode step's): each (row, vector) keeps eight float lanes, a block's
/// partial dots converted and multiply-added into them with the block's scale (llama.cpp's
/// order), summed across the lanes at the end of the row. No horizontal sum per block; a vector
/// gets the same bits alone or among a few, within rounding of the reference's.
///
/// # Safety
/// As for [`matmul`], with at most [`FEW`] vectors.
#[target_feature(enable = "avx2,fma")]
unsafe fn few(w: &Int8<'_>, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract; each call's rows lie inside the matrix.
    unsafe {
        macro_rules! rows_of {
            ($n:literal) => {{
                let pairs = rows / 2 * 2;
                for r0 in (0..pairs).step_by(2) {
                    few_tile::<2, $n>(w, r0, rows, x, ys);
                }
                if pairs < rows {
                    few_tile::<1, $n>(w, pairs, rows, x, ys);
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
unsafe fn few_tile<const R: usize, const N: usize>(w: &Int8<'_>, r0: usize, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
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
            let mag = _mm256_abs_epi8(sign);
            for v in 0..N {
                let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(xq[v], sign)), ones);
                let c = _mm256_set1_ps(steps[v * blocks + b]);
                acc[i][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), c, acc[i][v]);
            }
        }
    }
    for i in 0..R {
        for v in 0..N {
            ys[v * rows + r0 + i] = sum8(acc[i][v]) * w.scale[r0 + i];
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
