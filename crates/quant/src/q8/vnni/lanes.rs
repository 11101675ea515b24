//! Batches of more than `FEW` vectors: register lanes are vectors.

use std::arch::x86_64::*;

use super::super::tile::{RowTile, Tile, walk};
use super::super::{BLOCK, LANES, Q8Batch};
use super::weights::Weights;

/// Rows a tile decodes together, and groups of [`LANES`] vectors it applies them to (24 256-bit
/// accumulators, with the activations and a broadcast weight word in the rest of the registers).
const R: usize = 4;
const G: usize = 3;
/// Independent integer sums per (row, group) and block when a tile has few groups: a lone
/// chain of eight dependent `vpdpbusd` would wait on their latency (integer sums in any split
/// are the same sum).
const CHAINS: usize = 3;

/// `ys` `[n, rows]` = `W X`. Rows are decoded a tile at a time into offset bytes (with each
/// block's scale), then applied to the vectors eight to a register: lane `l` of an accumulator is
/// vector `l` of its group, so one broadcast weight word and one `vpdpbusd` advance eight (row,
/// vector) dots by four columns, and a block's dot is whole in its lane when its scale is
/// applied. Each (row, vector) thus runs the reference's order exactly, whatever tile, group or
/// lane it falls in: the reference's bits.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matmul<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    let cols = x.cols();
    let decode_rows = |tile: &mut RowTile, r0, rn| {
        // SAFETY: rows r0..r0 + rn exist (the caller's contract); this function's CPU features.
        unsafe { decode(tile, w, r0, rn, cols) }
    };
    walk(x, rows, ys, (R, G), decode_rows, |at, tile, rn, gn| {
        // SAFETY: the tile's rows are decoded and its groups exist in `x`; outputs go to (vector
        // < n, row < rows) only; this function's CPU features.
        unsafe {
            macro_rules! tile {
                ($($r:literal),*; $($g:literal),*) => { tile!(@rows ($($r),*) ($($g),*)) };
                (@rows ($($r:literal),*) $gs:tt) => {
                    match rn { $($r => tile!(@groups $r $gs),)* _ => unreachable!() }
                };
                (@groups $r:literal ($($g:literal),*)) => {
                    match gn { $($g => at.run::<W, $r, $g, { CHAINS / $g }>(w, tile),)* _ => unreachable!() }
                };
            }
            tile!(1, 2, 3, 4; 1, 2, 3);
        }
    });
}

/// Decodes rows `r0..r0 + rn` into `t`.
///
/// # Safety
/// As for [`matmul`], with the rows inside the matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn decode<W: Weights>(t: &mut RowTile, w: &W, r0: usize, rn: usize, cols: usize) {
    let blocks = cols / BLOCK;
    for i in 0..rn {
        // SAFETY: row r0 + i exists; its `cols` bytes fit row i of the tile.
        unsafe { w.decode(r0 + i, &mut t.w[i * cols..][..cols]) };
        if W::BLOCK_SCALED {
            for b in 0..blocks {
                t.scale[i * blocks + b] = w.scale(r0 + i, b);
            }
        }
    }
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
                // SAFETY: `lane` holds LANES floats; row r0 + i and the outputs are the tile's.
                unsafe {
                    _mm256_storeu_ps(lane.as_mut_ptr(), y);
                    self.store(i, g, &lane);
                }
            }
        }
    }
}
