//! The few-vector layout for nibble-packed weights: each vector's values signed, even and odd
//! columns apart per 128 columns, so that a row's packed bytes meet them as they are stored.
//!
//! A packed byte holds columns `2j` (low nibble) and `2j + 1` (high nibble). Masking 64 bytes
//! gives the even columns of 128, shifting and masking the odd ones: two `vpdpbusd` against the
//! activations' even and odd halves, with no widening or interleaving of the weights (the old
//! few-vector tiles spent more on that than on the products). Each 32-block's even (or odd)
//! columns are 16 consecutive bytes of a half, so a block's dot lands in four whole 32-bit lanes,
//! and per-block data is stored four lanes wide to match: its sum of values in the first lane
//! (the weights' offset comes back out of it) and its step in all four.

use super::BLOCK;

/// Columns a segment of the layout covers (a 512-bit register of packed bytes).
pub const SEGMENT: usize = 128;
/// Lanes per block in the per-block data.
pub const BLOCK_LANES: usize = 4;

/// `n` vectors in the split layout, each padded with zeros to whole segments.
#[derive(Debug, Clone, Default)]
pub(crate) struct Split {
    /// Per vector `[segments][2][64]`: even columns, then odd ones (zeros past the columns).
    values: Vec<i8>,
    /// Per vector `[segments * 4][BLOCK_LANES]`: a block's sum of signed values, then three zeros.
    sums: Vec<i32>,
    /// Per vector `[segments * 4][BLOCK_LANES]`: a block's step four times (0 past the columns).
    steps: Vec<f32>,
    /// Padded columns per vector.
    padded: usize,
}

impl Split {
    /// Builds the layout of the offset values `u` (`[n, cols]`) and steps `d` (`[n, cols / 32]`).
    pub(crate) fn build(&mut self, u: &[u8], d: &[f32], cols: usize) {
        let n = u.len() / cols;
        let padded = cols.div_ceil(SEGMENT) * SEGMENT;
        let lanes = padded / BLOCK * BLOCK_LANES;
        self.padded = padded;
        self.values.clear();
        self.values.resize(n * padded, 0);
        self.sums.clear();
        self.sums.resize(n * lanes, 0);
        self.steps.clear();
        self.steps.resize(n * lanes, 0.0);
        for v in 0..n {
            let (u, d) = (&u[v * cols..][..cols], &d[v * cols / BLOCK..][..cols / BLOCK]);
            let values = &mut self.values[v * padded..][..padded];
            for (segment, out) in u.chunks(SEGMENT).zip(values.chunks_exact_mut(SEGMENT)) {
                let (even, odd) = out.split_at_mut(SEGMENT / 2);
                for ((pair, e), o) in segment.chunks_exact(2).zip(even).zip(odd) {
                    (*e, *o) = ((pair[0] ^ 0x80) as i8, (pair[1] ^ 0x80) as i8);
                }
            }
            let (sums, steps) = (&mut self.sums[v * lanes..][..lanes], &mut self.steps[v * lanes..][..lanes]);
            for (b, (block, step)) in u.chunks_exact(BLOCK).zip(d).enumerate() {
                sums[b * BLOCK_LANES] = block.iter().map(|q| i32::from(*q) - 128).sum();
                steps[b * BLOCK_LANES..][..BLOCK_LANES].fill(*step);
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.values.clear();
        self.sums.clear();
        self.steps.clear();
        self.padded = 0;
    }

    /// Padded columns per vector (whole segments).
    pub(crate) fn padded(&self) -> usize {
        self.padded
    }

    pub(crate) fn values(&self) -> &[i8] {
        &self.values
    }

    pub(crate) fn sums(&self) -> &[i32] {
        &self.sums
    }

    pub(crate) fn steps(&self) -> &[f32] {
        &self.steps
    }
}
