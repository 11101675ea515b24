//! The AVX512-VNNI products, and the AVX-512 quantizer of activations. A tile of rows is decoded
//! once into signed bytes and applied to the vectors eight to a register (lane = vector), so a
//! block's integer dot is whole in one lane before its scale is applied: per 32 columns of a
//! (row, vector) eight `vpdpbusd` lanes, then one conversion, multiply and multiply-add. Every
//! (row, vector) follows the scalar reference's order exactly, so the kernels give its bits,
//! a vector the same alone or in a batch, and rows split over threads change nothing.

use std::arch::x86_64::*;

use half::f16;

use super::{BLOCK, LANES, Q8Batch};
use crate::mxfp4::{E2M1_DOUBLED, SCALE_HALF};
use crate::simd::prefetch_ahead;

/// A weight matrix as the tiles read it: a row's weights as unsigned bytes `w + OFFSET` in
/// column order (`vpdpbusd` multiplies unsigned bytes by signed ones: the activations are the
/// signed side, and `OFFSET * sum(a)` comes back out per block), and their scales.
pub(super) trait Weights {
    /// Whether weights carry a scale per 32-block (else one per row, applied at the end).
    const BLOCK_SCALED: bool;
    /// What the stored bytes add to each weight.
    const OFFSET: i32;
    /// Row `r`'s `cols` weights, offset, into `out`.
    ///
    /// # Safety
    /// `r` is a row of the matrix and `out` holds its `cols` columns; the CPU has AVX-512 BW/VNNI.
    unsafe fn decode(&self, r: usize, out: &mut [u8]);
    /// Row `r`, blocks `2p` and `2p + 1`, as signed weights (no offset), for [`matmul_rows`].
    ///
    /// # Safety
    /// `r` is a row of the matrix and `2p + 1` one of its blocks; the CPU has AVX-512 BW/VNNI.
    unsafe fn pair(&self, r: usize, p: usize) -> __m512i;
    /// Row `r`, block `b` alone, signed (a row with an odd number of blocks ends with one).
    ///
    /// # Safety
    /// As for [`pair`](Self::pair), for block `b`.
    unsafe fn one(&self, r: usize, b: usize) -> __m256i;
    /// The scale of block `b` of row `r` (for [`BLOCK_SCALED`](Self::BLOCK_SCALED) weights).
    fn scale(&self, r: usize, b: usize) -> f32;
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

fn table(values: [u8; 16]) -> __m512i {
    // SAFETY: reading 16 bytes from a 16-byte array; SSE2 is part of x86_64.
    let t = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    // SAFETY: AVX-512 F (the only caller runs under `matmul`, which requires it).
    unsafe { _mm512_broadcast_i32x4(t) }
}

/// Nibble-packed weights (`cols / 2` bytes a row, low nibble = even column) read through a
/// 16-entry table of levels (offset by [`Weights::OFFSET`]), with a scale per 32-block: MXFP4
/// and int4.
pub(super) struct Packed<'a, S, const OFFSET: i32> {
    pub q: &'a [u8],
    pub cols: usize,
    pub levels: [u8; 16],
    /// The levels without the offset, for [`matmul_rows`].
    pub signed: [i8; 16],
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

/// MXFP4's doubled E2M1 levels (-12..=12) offset by 12.
const MXFP4_OFFSET: i32 = 12;
/// int4's levels (nibble - 8) offset by 8: the nibble itself.
const INT4_OFFSET: i32 = 8;

/// MXFP4 (`packed` `[rows, cols/2]`, E8M0 `scale` `[rows, cols/32]`) as the tiles read it.
pub(super) fn mxfp4<'a>(packed: &'a [u8], scale: &'a [u8], cols: usize) -> Packed<'a, E8m0<'a>, MXFP4_OFFSET> {
    let levels = E2M1_DOUBLED.map(|l| (i32::from(l) + MXFP4_OFFSET) as u8);
    Packed { q: packed, cols, levels, signed: E2M1_DOUBLED, scale: E8m0 { scale, blocks: cols / BLOCK } }
}

/// int4 (`q` `[rows, cols/2]`, levels nibble - 8, f16 `scale` per `group`) as the tiles read it.
pub(super) fn int4<'a>(
    q: &'a [u8],
    scale: &'a [f16],
    group: usize,
    cols: usize,
) -> Packed<'a, GroupF16<'a>, INT4_OFFSET> {
    let levels = std::array::from_fn(|n| n as u8);
    let signed = std::array::from_fn(|n| n as i8 - INT4_OFFSET as i8);
    Packed { q, cols, levels, signed, scale: GroupF16 { scale, group, groups: cols / group } }
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn pair(&self, r: usize, p: usize) -> __m512i {
        // SAFETY: the caller's bounds: row r's blocks 2p, 2p + 1 (32 bytes) lie inside `q`.
        unsafe {
            let at = self.q.as_ptr().add(r * self.cols / 2 + p * 32);
            prefetch_ahead(at);
            nibbles512(_mm256_loadu_si256(at.cast()), table(self.signed.map(|l| l as u8)))
        }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    unsafe fn one(&self, r: usize, b: usize) -> __m256i {
        // SAFETY: the caller's bounds: row r's block b (16 bytes) lies inside `q`.
        unsafe {
            nibbles256(
                _mm_loadu_si128(self.q.as_ptr().add(r * self.cols / 2 + b * 16).cast()),
                table(self.signed.map(|l| l as u8)),
            )
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

pub(super) struct Int8<'a> {
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
    fn scale(&self, _: usize, _: usize) -> f32 {
        1.0
    }
    fn row_scale(&self, r: usize) -> f32 {
        self.scale[r]
    }
}

/// Rows a tile decodes together, and groups of [`LANES`] vectors it applies them to (24 256-bit
/// accumulators, with the activations and a broadcast weight word in the rest of the registers).
const R: usize = 4;
const G: usize = 3;
/// Independent integer sums per (row, group) and block when a tile has few groups: a lone
/// chain of eight dependent `vpdpbusd` would wait on their latency (integer sums in any split
/// are the same sum).
const CHAINS: usize = 3;
/// Activation bytes a pass over the rows keeps in L2.
const VECTOR_BLOCK_BYTES: usize = 192 << 10;

/// `ys` `[n, rows]` = `W X`. Rows are decoded a tile at a time into offset bytes (with each
/// block's scale), then applied to the vectors eight to a register: lane `l` of an accumulator is
/// vector `l` of its group, so one broadcast weight word and one `vpdpbusd` advance eight (row,
/// vector) dots by four columns, and a block's dot is whole in its lane when its scale is
/// applied. Each (row, vector) thus runs the reference's order exactly, whatever tile, group or
/// lane it falls in: the reference's bits, alone or in a batch.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matmul<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let (cols, n) = (x.cols(), x.vectors());
    let groups = n.div_ceil(LANES);
    let per_pass = (VECTOR_BLOCK_BYTES / (cols * LANES)).max(G) / G * G;
    if n <= FEW {
        // SAFETY: the caller's contract, passed on.
        return unsafe { matmul_rows(w, rows, x, ys) };
    }
    let mut tile = RowTile::new(R, cols);
    let out = ys.as_mut_ptr();
    for g_start in (0..groups).step_by(per_pass) {
        let g_end = groups.min(g_start + per_pass);
        for r0 in (0..rows).step_by(R) {
            let rn = R.min(rows - r0);
            // SAFETY: rows r0..r0 + rn exist (the caller's contract).
            unsafe { tile.decode(w, r0, rn, cols) };
            for g0 in (g_start..g_end).step_by(G) {
                let gn = G.min(g_end - g0);
                let at = Tile { x, r0, g0, rows, n, out };
                // SAFETY: the tile's rows are decoded and its groups exist in `x`; outputs go to
                // (vector < n, row < rows) only.
                unsafe {
                    macro_rules! tile {
                        ($($r:literal),*; $($g:literal),*) => { tile!(@rows ($($r),*) ($($g),*)) };
                        (@rows ($($r:literal),*) $gs:tt) => {
                            match rn { $($r => tile!(@groups $r $gs),)* _ => unreachable!() }
                        };
                        (@groups $r:literal ($($g:literal),*)) => {
                            match gn { $($g => at.run::<W, $r, $g, { CHAINS / $g }>(w, &tile),)* _ => unreachable!() }
                        };
                    }
                    tile!(1, 2, 3, 4; 1, 2, 3);
                }
            }
        }
    }
}

/// `R` rows decoded: offset weights `[R, cols]` and each (row, block)'s scale.
struct RowTile {
    w: Vec<u8>,
    scale: Vec<f32>,
}

impl RowTile {
    fn new(rows: usize, cols: usize) -> RowTile {
        RowTile { w: vec![0; rows * cols], scale: vec![0.0; rows * (cols / BLOCK)] }
    }

    /// Decodes rows `r0..r0 + rn`.
    ///
    /// # Safety
    /// As for [`matmul`], with the rows inside the matrix.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn decode<W: Weights>(&mut self, w: &W, r0: usize, rn: usize, cols: usize) {
        let blocks = cols / BLOCK;
        for i in 0..rn {
            // SAFETY: row r0 + i exists; its `cols` bytes fit row i of the tile.
            unsafe { w.decode(r0 + i, &mut self.w[i * cols..][..cols]) };
            if W::BLOCK_SCALED {
                for b in 0..blocks {
                    self.scale[i * blocks + b] = w.scale(r0 + i, b);
                }
            }
        }
    }
}

/// Batches up to this many vectors take [`matmul_rows`]: eight lanes of vectors would leave most
/// of each register idle (one vector through [`matmul`]'s tiles measured 0.6x of it).
use super::FEW;
/// Where a tile's vectors and outputs are: groups `g0..` of `x`, rows `r0..` of `rows`.
struct Tile<'a> {
    x: &'a Q8Batch,
    r0: usize,
    g0: usize,
    rows: usize,
    n: usize,
    out: *mut f32,
}

impl Tile<'_> {
    /// `RT` decoded rows against `GT` groups of vectors. Register tiles are indexed by (row,
    /// group); indices read clearer than iterators here.
    ///
    /// # Safety
    /// As for [`matmul`]: the rows decoded into `t`, groups `g0..g0 + GT` inside `x`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    #[inline]
    #[allow(clippy::needless_range_loop)]
    unsafe fn run<W: Weights, const RT: usize, const GT: usize, const CH: usize>(&self, w: &W, t: &RowTile) {
        let cols = self.x.cols();
        let (blocks, words) = (cols / BLOCK, cols / 4);
        let (lanes, steps, sums) = (self.x.lanes().as_ptr(), self.x.lane_steps().as_ptr(), self.x.lane_sums().as_ptr());
        let (wt, offset) = (t.w.as_ptr(), _mm256_set1_epi32(-W::OFFSET));
        let mut acc = [[_mm256_setzero_ps(); GT]; RT];
        for b in 0..blocks {
            // Each lane starts at -OFFSET * sum(a): what the offset weights add, taken out.
            let mut dot = [[[_mm256_setzero_si256(); GT]; RT]; CH];
            for g in 0..GT {
                // SAFETY: group g0 + g holds `blocks` sums of LANES vectors.
                let s = unsafe { _mm256_loadu_si256(sums.add(((self.g0 + g) * blocks + b) * LANES).cast()) };
                let start = _mm256_mullo_epi32(s, offset);
                for i in 0..RT {
                    dot[0][i][g] = start;
                }
            }
            for k in 0..BLOCK / 4 {
                let mut a = [_mm256_setzero_si256(); GT];
                for g in 0..GT {
                    // SAFETY: group g0 + g holds `words` words of LANES vectors; word 8b + k is one.
                    a[g] = unsafe {
                        _mm256_loadu_si256(lanes.add((((self.g0 + g) * words) + b * 8 + k) * LANES * 4).cast())
                    };
                }
                for i in 0..RT {
                    // SAFETY: row i of the tile holds `cols` weights; 4 from column 32b + 4k.
                    let word = unsafe { wt.add(i * cols + b * BLOCK + 4 * k).cast::<i32>().read_unaligned() };
                    let wv = _mm256_set1_epi32(word);
                    for g in 0..GT {
                        dot[k % CH][i][g] = _mm256_dpbusd_epi32(dot[k % CH][i][g], wv, a[g]);
                    }
                }
            }
            for c in 1..CH {
                for i in 0..RT {
                    for g in 0..GT {
                        dot[0][i][g] = _mm256_add_epi32(dot[0][i][g], dot[c][i][g]);
                    }
                }
            }
            let dot = dot[0];
            for g in 0..GT {
                // SAFETY: group g0 + g holds `blocks` steps of LANES vectors.
                let d = unsafe { _mm256_loadu_ps(steps.add(((self.g0 + g) * blocks + b) * LANES)) };
                for i in 0..RT {
                    let c = if W::BLOCK_SCALED { _mm256_mul_ps(d, _mm256_set1_ps(t.scale[i * blocks + b])) } else { d };
                    acc[i][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][g]), c, acc[i][g]);
                }
            }
        }
        let mut lane = [0f32; LANES];
        for i in 0..RT {
            let s = _mm256_set1_ps(w.row_scale(self.r0 + i));
            for g in 0..GT {
                let y = if W::BLOCK_SCALED { acc[i][g] } else { _mm256_mul_ps(acc[i][g], s) };
                // SAFETY: `lane` holds LANES floats.
                unsafe { _mm256_storeu_ps(lane.as_mut_ptr(), y) };
                for (l, y) in lane.iter().enumerate() {
                    let v = (self.g0 + g) * LANES + l;
                    if v < self.n {
                        // SAFETY: (vector v < n, row r0 + i < rows) is inside `ys`.
                        unsafe { *self.out.add(v * self.rows + self.r0 + i) = *y };
                    }
                }
            }
        }
    }
}

/// [`matmul`] for a few vectors ([`FEW`]): register tiles of 4 rows by 4 vectors over pairs of
/// blocks, the lanes partial sums of a (row, vector) summed at the end. Its own order, not the
/// reference's: its bits are the same for a vector alone or among a few, and within rounding of
/// [`matmul`]'s.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn matmul_rows<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let n = x.vectors();
    let per_block = n;
    let out = ys.as_mut_ptr();
    for v0 in (0..n).step_by(per_block.max(1)) {
        let v_end = n.min(v0 + per_block);
        for r0 in (0..rows).step_by(R4) {
            let rn = R4.min(rows - r0);
            for v in (v0..v_end).step_by(R4) {
                let vn = R4.min(v_end - v);
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
                            match vn { $($v => row_tile::<W, $r, $v>(w, x, r0, v, rows, out),)* _ => unreachable!() }
                        };
                    }
                    tile!(1, 2, 3, 4; 1, 2, 3, 4);
                }
            }
        }
    }
}

/// Rows and vectors per [`row_tile`].
const R4: usize = 4;

/// One tile: rows `r0..r0 + RT` against vectors `v0..v0 + VT`, written to `out`. Register tiles
/// are indexed by (row, vector); indices read clearer than iterators here.
///
/// # Safety
/// As for [`matmul`], with the rows and vectors of the tile inside the matrix and the batch.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn row_tile<W: Weights, const RT: usize, const VT: usize>(
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
                let (a, b) = (w.scale(r0 + i, 2 * p), w.scale(r0 + i, 2 * p + 1));
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
            let ws = _mm256_set1_ps(w.scale(r0 + i, b));
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
