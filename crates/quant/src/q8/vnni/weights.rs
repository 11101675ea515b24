//! The stored encodings as the VNNI kernels read them: rows decoded to bytes, block scales.

use std::arch::x86_64::*;

use half::f16;

use super::super::BLOCK;
use super::super::scales::{BlockScale, E8m0, GroupF16};
use crate::mxfp4::E2M1_DOUBLED;
use crate::simd::{prefetch_ahead, prefetch_at};

/// A weight matrix as the lanes kernel reads it: a row's weights as unsigned bytes `w + OFFSET` in
/// column order (`vpdpbusd` multiplies unsigned bytes by signed ones: the activations are the
/// signed side, and `OFFSET * sum(a)` comes back out per block), and their scales.
pub(in crate::q8) trait Weights {
    /// Whether weights carry a scale per 32-block (else one per row, applied at the end).
    const BLOCK_SCALED: bool;
    /// What the stored bytes add to each weight.
    const OFFSET: i32;
    /// Row `r`'s `cols` weights, offset, into `out`.
    ///
    /// # Safety
    /// `r` is a row of the matrix and `out` holds its `cols` columns; the CPU has AVX-512 BW/VNNI.
    unsafe fn decode(&self, r: usize, out: &mut [u8]);
    /// The scale of block `b` of row `r` (for [`BLOCK_SCALED`](Self::BLOCK_SCALED) weights).
    fn scale(&self, r: usize, b: usize) -> f32;
    fn row_scale(&self, r: usize) -> f32;
}

/// Nibble pairs (low nibble = even column) to signed bytes through a 16-entry table: the bytes
/// widened to 16 bits, the high nibble moved to the high byte, both masked, looked up.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn nibbles512(raw: __m256i, table: __m512i) -> __m512i {
    let t = _mm512_cvtepu8_epi16(raw);
    // (t | t << 4) & 0x0f0f: low byte = low nibble, high byte = high nibble.
    let n = _mm512_ternarylogic_epi32::<0xA8>(t, _mm512_slli_epi16::<4>(t), _mm512_set1_epi16(0x0f0f));
    _mm512_shuffle_epi8(table, n)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
fn nibbles256(raw: __m128i, table: __m512i) -> __m256i {
    let t = _mm256_cvtepu8_epi16(raw);
    let n = _mm256_ternarylogic_epi32::<0xA8>(t, _mm256_slli_epi16::<4>(t), _mm256_set1_epi16(0x0f0f));
    _mm256_shuffle_epi8(_mm512_castsi512_si256(table), n)
}

fn table(values: [u8; 16]) -> __m512i {
    // SAFETY: reading 16 bytes from a 16-byte array; SSE2 is part of x86_64.
    let t = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    // SAFETY: AVX-512 F (the only caller runs under `matmul`, which requires it).
    unsafe { _mm512_broadcast_i32x4(t) }
}

/// Nibble-packed weights (`cols / 2` bytes a row, low nibble = even column) read through a
/// 16-entry table of levels (offset by [`Weights::OFFSET`]), with a scale per 32-block: MXFP4
/// and int4.
pub(in crate::q8) struct Packed<'a, S, const OFFSET: i32> {
    q: &'a [u8],
    cols: usize,
    /// The levels offset (the lanes kernel's table).
    levels: [u8; 16],
    scale: S,
}

impl<'a, S, const O: i32> Packed<'a, S, O> {
    /// The table from the sixteen nibble values' signed levels.
    fn new(q: &'a [u8], cols: usize, signed: [i8; 16], scale: S) -> Self {
        Packed { q, cols, levels: signed.map(|l| (i32::from(l) + O) as u8), scale }
    }
}

/// MXFP4's doubled E2M1 levels (-12..=12) offset by 12.
const MXFP4_OFFSET: i32 = 12;
/// int4's levels (nibble - 8) offset by 8: the nibble itself.
const INT4_OFFSET: i32 = 8;

/// MXFP4 (`packed` `[rows, cols/2]`, E8M0 `scale` `[rows, cols/32]`) as the lanes kernel reads it.
pub(in crate::q8) fn mxfp4<'a>(packed: &'a [u8], scale: &'a [u8], cols: usize) -> Packed<'a, E8m0<'a>, MXFP4_OFFSET> {
    Packed::new(packed, cols, E2M1_DOUBLED, E8m0 { scale, blocks: cols / BLOCK })
}

/// int4 (`q` `[rows, cols/2]`, levels nibble - 8, f16 `scale` per `group`) as the lanes kernel reads it.
pub(in crate::q8) fn int4<'a>(
    q: &'a [u8],
    scale: &'a [f16],
    group: usize,
    cols: usize,
) -> Packed<'a, GroupF16<'a>, INT4_OFFSET> {
    let signed = std::array::from_fn(|n| n as i8 - INT4_OFFSET as i8);
    Packed::new(q, cols, signed, GroupF16 { scale, group, groups: cols / group })
}

impl<S: BlockScale, const O: i32> Weights for Packed<'_, S, O> {
    const BLOCK_SCALED: bool = true;
    const OFFSET: i32 = O;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn decode(&self, r: usize, out: &mut [u8]) {
        let (t, row) = (table(self.levels), &self.q[r * self.cols / 2..][..self.cols / 2]);
        let (pairs, tail) = (row.chunks_exact(32), row.len() % 32);
        for (p, raw) in pairs.enumerate() {
            // SAFETY: `raw` holds 32 bytes, `out` the 64 columns they decode to.
            unsafe {
                prefetch_ahead(raw.as_ptr());
                let v = nibbles512(_mm256_loadu_si256(raw.as_ptr().cast()), t);
                _mm512_storeu_si512(out.as_mut_ptr().add(p * 64).cast(), v);
            }
        }
        if tail > 0 {
            // SAFETY: a row with an odd number of blocks ends with one: 16 bytes, 32 columns.
            // (`two_rows` below reads the same way.)
            unsafe {
                let v = nibbles256(_mm_loadu_si128(row.as_ptr().add(row.len() - 16).cast()), t);
                _mm256_storeu_si256(out.as_mut_ptr().add(self.cols - 32).cast(), v);
            }
        }
    }
    #[inline]
    fn scale(&self, r: usize, b: usize) -> f32 {
        self.scale.at(r, b)
    }
    fn row_scale(&self, _: usize) -> f32 {
        1.0
    }
}

pub(in crate::q8) struct Int8<'a> {
    pub q: &'a [i8],
    pub scale: &'a [f32],
    pub cols: usize,
}

impl Weights for Int8<'_> {
    const BLOCK_SCALED: bool = false;
    /// `w + 128` is `w` with its top bit flipped.
    const OFFSET: i32 = 128;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn decode(&self, r: usize, out: &mut [u8]) {
        let flip = _mm256_set1_epi8(-128);
        for (b, block) in self.q[r * self.cols..][..self.cols].chunks_exact(BLOCK).enumerate() {
            // SAFETY: `block` holds 32 bytes, `out` its 32 columns.
            unsafe {
                prefetch_ahead(block.as_ptr());
                let v = _mm256_xor_si256(_mm256_loadu_si256(block.as_ptr().cast()), flip);
                _mm256_storeu_si256(out.as_mut_ptr().add(b * BLOCK).cast(), v);
            }
        }
    }
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
    fn row_scale(&self, r: usize) -> f32 {
        self.scale[r]
    }
}

/// The few-vector tiles' reads (int8 only: nibble-packed weights take `nibbles`).
impl Int8<'_> {
    /// Row `r`, blocks `2p` and `2p + 1`, as signed weights, and the line `ahead` bytes further
    /// asked for.
    ///
    /// # Safety
    /// `r` is a row of the matrix and `2p + 1` one of its blocks; the CPU has AVX-512 BW/VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    pub(super) unsafe fn pair(&self, r: usize, p: usize, ahead: usize) -> __m512i {
        // SAFETY: the caller's bounds: 64 bytes at this offset lie inside `q`.
        unsafe {
            let at = self.q.as_ptr().add(r * self.cols + p * 64);
            prefetch_at::<0, i8>(at.wrapping_add(ahead));
            _mm512_loadu_si512(at.cast())
        }
    }
    /// Row `r`, block `b` alone (a row with an odd number of blocks ends with one).
    ///
    /// # Safety
    /// As for [`pair`](Self::pair), for block `b`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    pub(super) unsafe fn one(&self, r: usize, b: usize) -> __m256i {
        // SAFETY: the caller's bounds: 32 bytes at this offset lie inside `q`.
        unsafe { _mm256_loadu_si256(self.q.as_ptr().add(r * self.cols + b * 32).cast()) }
    }
}
