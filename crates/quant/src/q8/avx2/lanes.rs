//! Batches of more than `FEW` vectors on AVX2: register lanes are vectors, as the VNNI lanes
//! kernel's, with `vpmaddubsw` + `vpmaddwd` where VNNI has `vpdpbusd`.

use std::arch::x86_64::*;

use super::super::tile::{RowTile, Tile, walk};
use super::super::{BLOCK, LANES, Q8Batch};

/// Rows a tile decodes together, and groups of [`LANES`] vectors it applies them to at a time
/// (4 float and 4 integer accumulators, 4 pair sums, an activation word, a weight word and the
/// ones in sixteen registers; 2 rows by 2 groups measured 0.8x for MXFP4).
const R: usize = 4;
const G: usize = 1;

/// A weight matrix as this kernel reads it: a row decoded to bytes in column order, and scales.
pub(in crate::q8) trait Rows {
    /// Whether the decoded bytes are signed weights (int8: `vpmaddubsw` then takes their
    /// magnitudes and gives their signs to the activations, llama.cpp's way: a pair is at most
    /// 2 * 128 * 127) rather than unsigned levels `w + OFFSET` (nibbles: at most 24, so four
    /// words' pairs add in 16 bits, 4 * 2 * 24 * 127 = 24,384, before `vpmaddwd`).
    const SIGNED: bool;
    /// What an unsigned level adds to its weight (taken back out per block with the sums).
    const OFFSET: i32;
    /// Whether weights carry a scale per 32-block (else one per row, applied at the end).
    const BLOCK_SCALED: bool;
    /// Row `r`'s `cols` decoded bytes into `out`.
    ///
    /// # Safety
    /// `r` is a row of the matrix and `out` holds its `cols` columns; the CPU has AVX2.
    unsafe fn decode(&self, r: usize, out: &mut [u8]);
    /// Row `r`'s block scales into `out` (one per 32 columns; for [`BLOCK_SCALED`](Self::BLOCK_SCALED)
    /// weights).
    ///
    /// # Safety
    /// `r` is a row of the matrix and `out` holds its blocks; the CPU has AVX2 and F16C.
    unsafe fn scales(&self, r: usize, out: &mut [f32]);
    fn row_scale(&self, r: usize) -> f32;
}

/// `ys` `[n, rows]` = `W X`. Rows are decoded [`R`] at a time, then applied to the vectors eight
/// to a register: lane `l` of an accumulator is vector `l` of its group, so one broadcast weight
/// word and one `vpmaddubsw` advance eight (row, vector) dots by four columns, and a block's dot
/// is whole in its lane when its scale is applied: each (row, vector) runs the reference's order
/// exactly, whatever tile, group or lane it falls in (the reference's bits).
///
/// # Safety
/// The CPU has AVX2 and FMA; `w` has `rows` rows of `x.cols()` columns, `x` more than `FEW`
/// vectors in its lane layout, and `ys` holds `x.vectors() * rows` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matmul<W: Rows>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let cols = x.cols();
    let decode_rows = |tile: &mut RowTile, r0, rn| {
        // SAFETY: rows r0..r0 + rn exist (the caller's contract); this function's CPU features.
        unsafe { decode(tile, w, r0, rn, cols) }
    };
    walk(x, rows, ys, (R, G), decode_rows, |at, tile, rn, gn| {
        debug_assert_eq!(gn, G);
        // SAFETY: the tile's rows are decoded and its group exists in `x`; outputs go to (vector
        // < n, row < rows) only; this function's CPU features.
        unsafe {
            match rn {
                1 => at.run_maddubs::<W, 1, G>(w, tile),
                2 => at.run_maddubs::<W, 2, G>(w, tile),
                3 => at.run_maddubs::<W, 3, G>(w, tile),
                _ => at.run_maddubs::<W, 4, G>(w, tile),
            }
        }
    });
}

/// Decodes rows `r0..r0 + rn` into `t`.
///
/// # Safety
/// As for [`matmul`], with the rows inside the matrix.
#[target_feature(enable = "avx2,fma")]
unsafe fn decode<W: Rows>(t: &mut RowTile, w: &W, r0: usize, rn: usize, cols: usize) {
    let blocks = cols / BLOCK;
    for i in 0..rn {
        // SAFETY: row r0 + i exists; its `cols` bytes fit row i of the tile.
        unsafe { w.decode(r0 + i, &mut t.w[i * cols..][..cols]) };
        if W::BLOCK_SCALED {
            // SAFETY: row r0 + i exists; its blocks fit row i of the scales.
            unsafe { w.scales(r0 + i, &mut t.scale[i * blocks..][..blocks]) };
        }
    }
}

impl Tile<'_> {
    /// `RT` decoded rows against `GT` groups of eight vectors. Register tiles are indexed by
    /// (row, group); indices read clearer than iterators here.
    ///
    /// # Safety
    /// As for [`matmul`]: the rows decoded into `t`, groups `g0..g0 + GT` inside `x`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::needless_range_loop)]
    unsafe fn run_maddubs<W: Rows, const RT: usize, const GT: usize>(&self, w: &W, t: &RowTile) {
        let cols = self.x.cols();
        let (blocks, words) = (cols / BLOCK, cols / 4);
        let (lanes, steps, sums) = (self.x.lanes().as_ptr(), self.x.lane_steps().as_ptr(), self.x.lane_sums().as_ptr());
        let (wt, offset, ones) = (t.w.as_ptr(), _mm256_set1_epi32(-W::OFFSET), _mm256_set1_epi16(1));
        let mut acc = [[_mm256_setzero_ps(); GT]; RT];
        for b in 0..blocks {
            let mut dot = [[_mm256_setzero_si256(); GT]; RT];
            if W::OFFSET != 0 {
                for g in 0..GT {
                    // Each lane starts at -OFFSET * sum(a): what the offset levels add, taken out.
                    // SAFETY: group g0 + g holds `blocks` sums of LANES vectors.
                    let s = unsafe { _mm256_loadu_si256(sums.add(((self.g0 + g) * blocks + b) * LANES).cast()) };
                    let start = _mm256_mullo_epi32(s, offset);
                    for i in 0..RT {
                        dot[i][g] = start;
                    }
                }
            }
            // Four words at a time: nibble levels' pairs add in 16 bits first (see `Rows`).
            for k4 in 0..2 {
                let mut pairs = [[_mm256_setzero_si256(); GT]; RT];
                for k in 4 * k4..4 * k4 + 4 {
                    let mut a = [_mm256_setzero_si256(); GT];
                    for g in 0..GT {
                        // SAFETY: group g0 + g holds `words` words of LANES vectors; 8b + k is one.
                        a[g] = unsafe {
                            _mm256_loadu_si256(lanes.add((((self.g0 + g) * words) + b * 8 + k) * LANES * 4).cast())
                        };
                    }
                    for i in 0..RT {
                        // SAFETY: row i of the tile holds `cols` bytes; 4 from column 32b + 4k.
                        let word = unsafe { wt.add(i * cols + b * BLOCK + 4 * k).cast::<i32>().read_unaligned() };
                        let wv = _mm256_set1_epi32(word);
                        for g in 0..GT {
                            if W::SIGNED {
                                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(a[g], wv));
                                dot[i][g] = _mm256_add_epi32(dot[i][g], _mm256_madd_epi16(p, ones));
                            } else {
                                pairs[i][g] = _mm256_add_epi16(pairs[i][g], _mm256_maddubs_epi16(wv, a[g]));
                            }
                        }
                    }
                }
                if !W::SIGNED {
                    for i in 0..RT {
                        for g in 0..GT {
                            dot[i][g] = _mm256_add_epi32(dot[i][g], _mm256_madd_epi16(pairs[i][g], ones));
                        }
                    }
                }
            }
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
                // SAFETY: `lane` holds LANES floats; row r0 + i and the outputs are the tile's.
                unsafe {
                    _mm256_storeu_ps(lane.as_mut_ptr(), y);
                    self.store(i, g, &lane);
                }
            }
        }
    }
}
