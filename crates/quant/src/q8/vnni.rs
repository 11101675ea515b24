//! The AVX512-VNNI products: register tiles of `R` rows by `V` vectors. Per pair of 32-blocks
//! each row's 64 weights are decoded once into signed bytes and each vector's 64 activations
//! loaded once; every (row, vector) then costs one `vpdpbusd`, one conversion and one
//! multiply-add (plus one multiply for the block scales). Each (row, vector) runs the same
//! instructions whatever tile it falls in, so a vector gets the same bits alone or in a batch,
//! and rows split over threads change nothing.

use std::arch::x86_64::*;

use half::f16;

use super::{BLOCK, Q8Batch};
use crate::mxfp4::{E2M1_DOUBLED, SCALE_HALF};
use crate::simd::prefetch_ahead;

/// Rows and vectors per register tile (16 accumulators, with the weights, their sums and scales
/// in the remaining registers).
const R: usize = 4;
const V: usize = 4;
/// Activation bytes per vector block: kept in L2 while every row tile passes over them.
const VECTOR_BLOCK_BYTES: usize = 192 << 10;

/// A weight matrix as the tiles read it: 64 signed weights of a row per block pair, in column
/// order, and their scales.
pub(super) trait Weights {
    /// Whether weights carry a scale per 32-block (else one per row, applied at the end).
    const BLOCK_SCALED: bool;
    /// Row `r`, blocks `2p` and `2p + 1`.
    ///
    /// # Safety
    /// `r` is a row of the matrix and `2p + 1` one of its blocks; the CPU has AVX-512 BW/VNNI.
    unsafe fn pair(&self, r: usize, p: usize) -> __m512i;
    /// Row `r`, block `b` alone (a row with an odd number of blocks ends with one).
    ///
    /// # Safety
    /// As for [`pair`](Self::pair), for block `b`.
    unsafe fn one(&self, r: usize, b: usize) -> __m256i;
    /// The scales of blocks `b` and `b + 1` of row `r` (lanes 0-7 and 8-15); `b` alone in a
    /// 256-bit register for [`one`](Self::one).
    fn scales(&self, r: usize, b: usize) -> (f32, f32);
    fn row_scale(&self, r: usize) -> f32;
}

/// `xs` quantized per 32-block into `u` and `d`, the same bits as
/// [`reference::quantize_block`](super::reference::quantize_block): the step and its inverse as
/// there, `round` (halves away from zero) as truncation plus one where the dropped part is at
/// least a half. A block whose inverse step overflows (`max|x|` below ~4e-37) takes the reference.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; `u.len() == xs.len()` and `d.len() == xs.len() / 32`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn quantize(xs: &[f32], u: &mut [u8], d: &mut [f32]) {
    let (inf, half) = (_mm512_set1_ps(f32::INFINITY), _mm512_set1_ps(0.5));
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let (sign, one, offset) = (_mm512_set1_epi32(i32::MIN), _mm512_set1_ps(1.0), _mm512_set1_epi32(128));
    for ((xb, ub), db) in xs.chunks_exact(BLOCK).zip(u.chunks_exact_mut(BLOCK)).zip(d.iter_mut()) {
        // SAFETY: `xb` holds 32 values.
        let (a, b) = unsafe { (_mm512_loadu_ps(xb.as_ptr()), _mm512_loadu_ps(xb.as_ptr().add(16))) };
        let (abs_a, abs_b) = (_mm512_abs_ps(a), _mm512_abs_ps(b));
        // Not less than infinity, or unordered: an infinity or a NaN.
        let bad = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(abs_a, inf) | _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(abs_b, inf);
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(abs_a, abs_b));
        let step = amax / 127.0;
        let inv = if step > 0.0 { 1.0 / step } else { 0.0 };
        if bad != 0 || !inv.is_finite() {
            *db = super::reference::quantize_block(xb, ub);
            continue;
        }
        *db = step;
        let inv = _mm512_set1_ps(inv);
        let level = |x: __m512| -> __m128i {
            let t = _mm512_mul_ps(x, inv);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
            // t - r is exact (|t| <= 2^8): a dropped half or more rounds away from zero.
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(t, r)), half);
            let unit = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_and_si512(_mm512_castps_si512(t), sign),
                _mm512_castps_si512(one),
            ));
            let r = _mm512_min_ps(_mm512_max_ps(_mm512_mask_add_ps(r, away, r, unit), lo), hi);
            _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvttps_epi32(r), offset))
        };
        let (qa, qb) = (level(a), level(b));
        // SAFETY: `ub` holds 32 bytes.
        unsafe {
            _mm_storeu_si128(ub.as_mut_ptr().cast(), qa);
            _mm_storeu_si128(ub.as_mut_ptr().add(16).cast(), qb);
        }
    }
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

fn table(values: [i8; 16]) -> __m512i {
    // SAFETY: reading 16 bytes from a 16-byte array; SSE2 is part of x86_64.
    let t = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    // SAFETY: AVX-512 F (the only caller runs under `matmul`, which requires it).
    unsafe { _mm512_broadcast_i32x4(t) }
}

/// Nibble-packed weights (`cols / 2` bytes a row, low nibble = even column) read through a
/// 16-entry table of levels, with a scale per 32-block: MXFP4 and int4.
pub(super) struct Packed<'a, S> {
    pub q: &'a [u8],
    pub cols: usize,
    pub levels: [i8; 16],
    pub scale: S,
}

/// One f32 scale per (row, 32-block).
pub(super) trait BlockScale {
    fn at(&self, r: usize, b: usize) -> f32;
}

/// MXFP4's E8M0 block exponents, with the 1/2 of the doubled E2M1 levels folded in.
pub(super) struct E8m0<'a> {
    pub scale: &'a [u8],
    pub blocks: usize,
}

impl BlockScale for E8m0<'_> {
    #[inline]
    fn at(&self, r: usize, b: usize) -> f32 {
        SCALE_HALF[usize::from(self.scale[r * self.blocks + b])]
    }
}

/// int4's f16 group scales (groups a multiple of 32 wide).
pub(super) struct GroupF16<'a> {
    pub scale: &'a [f16],
    pub group: usize,
    pub groups: usize,
}

impl BlockScale for GroupF16<'_> {
    #[inline]
    fn at(&self, r: usize, b: usize) -> f32 {
        let bits = self.scale[r * self.groups + b * BLOCK / self.group].to_bits();
        // F16C directly: `f16::to_f32` outside a target-feature context detects the CPU per call
        // (int4 x 64 vectors measured 30 against 47 G/s with it).
        // SAFETY: F16C comes with every CPU that runs these kernels (AVX-512), SSE with x86_64.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
    }
}

/// MXFP4 (`packed` `[rows, cols/2]`, E8M0 `scale` `[rows, cols/32]`) as the tiles read it.
pub(super) fn mxfp4<'a>(packed: &'a [u8], scale: &'a [u8], cols: usize) -> Packed<'a, E8m0<'a>> {
    Packed { q: packed, cols, levels: E2M1_DOUBLED, scale: E8m0 { scale, blocks: cols / BLOCK } }
}

/// int4 (`q` `[rows, cols/2]`, levels nibble - 8, f16 `scale` per `group`) as the tiles read it.
pub(super) fn int4<'a>(q: &'a [u8], scale: &'a [f16], group: usize, cols: usize) -> Packed<'a, GroupF16<'a>> {
    const LEVELS: [i8; 16] = [-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7];
    Packed { q, cols, levels: LEVELS, scale: GroupF16 { scale, group, groups: cols / group } }
}

impl<S: BlockScale> Weights for Packed<'_, S> {
    const BLOCK_SCALED: bool = true;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn pair(&self, r: usize, p: usize) -> __m512i {
        // SAFETY: the caller's bounds: row r's blocks 2p, 2p + 1 (32 bytes) lie inside `q`.
        unsafe {
            let at = self.q.as_ptr().add(r * self.cols / 2 + p * 32);
            prefetch_ahead(at);
            nibbles512(_mm256_loadu_si256(at.cast()), table(self.levels))
        }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn one(&self, r: usize, b: usize) -> __m256i {
        // SAFETY: the caller's bounds: row r's block b (16 bytes) lies inside `q`.
        unsafe {
            nibbles256(_mm_loadu_si128(self.q.as_ptr().add(r * self.cols / 2 + b * 16).cast()), table(self.levels))
        }
    }
    #[inline]
    fn scales(&self, r: usize, b: usize) -> (f32, f32) {
        let second = if b + 1 < self.cols / BLOCK { self.scale.at(r, b + 1) } else { 0.0 };
        (self.scale.at(r, b), second)
    }
    fn row_scale(&self, _: usize) -> f32 {
        1.0
    }
}

pub(super) struct Int8<'a> {
    pub q: &'a [i8],
    pub scale: &'a [f32],
    pub cols: usize,
}

impl Weights for Int8<'_> {
    const BLOCK_SCALED: bool = false;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn pair(&self, r: usize, p: usize) -> __m512i {
        // SAFETY: the caller's bounds: 64 bytes at this offset lie inside `q`.
        unsafe {
            let at = self.q.as_ptr().add(r * self.cols + p * 64);
            prefetch_ahead(at);
            _mm512_loadu_si512(at.cast())
        }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn one(&self, r: usize, b: usize) -> __m256i {
        // SAFETY: the caller's bounds: 32 bytes at this offset lie inside `q`.
        unsafe { _mm256_loadu_si256(self.q.as_ptr().add(r * self.cols + b * 32).cast()) }
    }
    fn scales(&self, _: usize, _: usize) -> (f32, f32) {
        (1.0, 1.0)
    }
    fn row_scale(&self, r: usize) -> f32 {
        self.scale[r]
    }
}

/// `ys` `[n, rows]` = `W X`: vector blocks that stay in L2, row tiles over each.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matmul<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let n = x.vectors();
    let per_block = (VECTOR_BLOCK_BYTES / x.cols()).max(V) / V * V;
    let out = ys.as_mut_ptr();
    for v0 in (0..n).step_by(per_block) {
        let v_end = n.min(v0 + per_block);
        for r0 in (0..rows).step_by(R) {
            let rn = R.min(rows - r0);
            for v in (v0..v_end).step_by(V) {
                let vn = V.min(v_end - v);
                // SAFETY: rows r0..r0 + rn and vectors v..v + vn exist; the caller's contract.
                unsafe {
                    macro_rules! tile {
                        ($($r:literal),*; $($v:literal),*) => {
                            tile!(@rows ($($r),*) ($($v),*))
                        };
                        (@rows ($($r:literal),*) $vs:tt) => {
                            match rn { $($r => tile!(@vecs $r $vs),)* _ => unreachable!() }
                        };
                        (@vecs $r:literal ($($v:literal),*)) => {
                            match vn { $($v => tile::<W, $r, $v>(w, x, r0, v, rows, out),)* _ => unreachable!() }
                        };
                    }
                    tile!(1, 2, 3, 4; 1, 2, 3, 4);
                }
            }
        }
    }
}

/// One tile: rows `r0..r0 + RT` against vectors `v0..v0 + VT`, written to `out`. Register tiles
/// are indexed by (row, vector); indices read clearer than iterators here.
///
/// # Safety
/// As for [`matmul`], with the rows and vectors of the tile inside the matrix and the batch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn tile<W: Weights, const RT: usize, const VT: usize>(
    w: &W,
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
        let mut ws = [_mm512_setzero_ps(); RT];
        for i in 0..RT {
            // SAFETY: row r0 + i and blocks 2p, 2p + 1 exist (the caller's contract).
            wv[i] = unsafe { w.pair(r0 + i, p) };
            // -128 * sum(w) per lane: the offset of the activations, taken back out.
            bias[i] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, high, wv[i]));
            if W::BLOCK_SCALED {
                let (a, b) = w.scales(r0 + i, 2 * p);
                ws[i] = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
            }
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
                let c = if W::BLOCK_SCALED { _mm512_mul_ps(ws[i], dv) } else { dv };
                acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), c, acc[i][v]);
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
            let ws = _mm256_set1_ps(w.scales(r0 + i, b).0);
            for v in 0..VT {
                // SAFETY: 32 values and one step of block b of vector v0 + v.
                let (q, dv) = unsafe {
                    (
                        _mm256_loadu_si256(u.add((v0 + v) * cols + b * 32).cast()),
                        _mm256_set1_ps(*d.add((v0 + v) * blocks + b)),
                    )
                };
                let dot = _mm256_dpbusd_epi32(bias, q, wv);
                let c = if W::BLOCK_SCALED { _mm256_mul_ps(ws, dv) } else { dv };
                let (t, c) = (_mm512_zextps256_ps512(_mm256_cvtepi32_ps(dot)), _mm512_zextps256_ps512(c));
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
