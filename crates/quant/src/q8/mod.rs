//! Int8 activations: a batch of vectors quantized in blocks of 32 (one f32 step per block, as
//! llama.cpp's Q8_0), and the products of the stored weight encodings with them as integer dot
//! products (`vpdpbusd` with AVX512-VNNI; `vpmaddubsw` with AVX2, [`avx2`]), one float scale per
//! block.
//!
//! The weights stay exact; only the activations are rounded, each value by at most half its
//! block's step (`max|x| / 254`). What that costs a model is measured, not assumed
//! (`k3-cli perplexity --activations int8 --against`, docs/EFFICIENCY.md); the engine uses these
//! products only when asked and only where the CPU has integer dots ([`available`]).
//!
//! Values are stored offset by 128 as `u8`, and again signed for the kernels that take the
//! weights as the unsigned side of `vpdpbusd` / `vpmaddubsw` (levels offset to be non-negative):
//! whichever side carries an offset, the kernels take `offset * sum` of the other side back out
//! per block, so every block's dot is the exact integer `sum(q * w)`.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod nibbles;
pub mod reference;
#[cfg(target_arch = "x86_64")]
mod scales;
mod split;
#[cfg(target_arch = "x86_64")]
mod tile;
#[cfg(target_arch = "x86_64")]
mod vnni;

use std::cell::Cell;

use half::f16;

use crate::cpu::{Level, level, supported};

/// Values per block (one step each).
pub const BLOCK: usize = 32;

/// `n` vectors of `cols` values quantized per 32-block: `u = round(x / d) + 128` in `1..=255`,
/// `d = max|x| / 127` (NaN when the block holds a NaN or an infinity, so it reaches the output as
/// it would in f32).
#[derive(Debug, Clone, Default)]
pub struct Q8Batch {
    cols: usize,
    u: Vec<u8>,
    d: Vec<f32>,
    /// The same values signed (`u - 128` as `i8`) for the kernels whose register lanes are
    /// vectors: groups of [`LANES`] vectors, each group `[cols / 4][LANES]` 4-byte words (a
    /// vector's word `k` is its values `4k..4k + 4`); a last group short of vectors padded with
    /// zeros.
    lanes: Vec<i8>,
    /// The steps in the same groups, `[blocks][LANES]` a group (padding 0).
    lane_steps: Vec<f32>,
    /// Each block's sum of signed values, in the same groups.
    lane_sums: Vec<i32>,
    /// Up to [`FEW`] vectors in the layout of the nibble-packed few-vector kernels.
    split: split::Split,
}

/// Batches of up to this many vectors take the kernels for a few; larger ones give the scalar
/// reference's bits.
pub const FEW: usize = 4;

/// Vectors per group of the lane layout (a 256-bit register of 32-bit lanes).
pub const LANES: usize = 8;

impl Q8Batch {
    /// Quantizes `xs` (`[n, cols]`, `cols` a multiple of 32), reusing the buffers.
    pub fn quantize_into(&mut self, xs: &[f32], cols: usize) {
        self.quantize_into_at(level(), xs, cols)
    }

    /// [`quantize_into`](Self::quantize_into) with the kernel for `level`: every level gives the
    /// same bits ([`reference::quantize_block`] defines them).
    pub fn quantize_into_at(&mut self, level: Level, xs: &[f32], cols: usize) {
        assert!(cols > 0 && cols.is_multiple_of(BLOCK), "int8 activations need columns in multiples of 32, got {cols}");
        assert!(xs.len().is_multiple_of(cols), "xs is not whole {cols}-vectors");
        self.cols = cols;
        self.u.resize(xs.len(), 0);
        self.d.resize(xs.len() / BLOCK, 0.0);
        #[cfg(target_arch = "x86_64")]
        let simd = supported(level) >= Level::Avx512;
        #[cfg(not(target_arch = "x86_64"))]
        let simd = false;
        if simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW/VL is present (checked just above); `u` and `d` were sized to
            // `xs` above.
            unsafe {
                vnni::quantize(xs, &mut self.u, &mut self.d)
            };
        } else {
            for ((xb, ub), d) in xs.chunks_exact(BLOCK).zip(self.u.chunks_exact_mut(BLOCK)).zip(&mut self.d) {
                *d = reference::quantize_block(xb, ub);
            }
        }
        self.interleave();
    }

    /// Builds the lane layout from `u` and `d` for batches the lanes kernel takes (more than
    /// [`FEW`] vectors), the split layout for a few (a decode step's vector pays for neither the
    /// lanes nor, in a batch, the split).
    fn interleave(&mut self) {
        let (cols, n) = (self.cols, self.vectors());
        if n <= FEW {
            self.lanes.clear();
            self.lane_steps.clear();
            self.lane_sums.clear();
            self.split.build(&self.u, &self.d, cols);
            return;
        }
        self.split.clear();
        let (words, blocks, groups) = (cols / 4, cols / BLOCK, n.div_ceil(LANES));
        self.lanes.clear();
        self.lanes.resize(groups * words * LANES * 4, 0);
        self.lane_steps.clear();
        self.lane_steps.resize(groups * blocks * LANES, 0.0);
        self.lane_sums.clear();
        self.lane_sums.resize(groups * blocks * LANES, 0);
        for (v, (u, d)) in self.u.chunks_exact(cols).zip(self.d.chunks_exact(blocks)).enumerate() {
            let (g, l) = (v / LANES, v % LANES);
            let lanes = &mut self.lanes[g * words * LANES * 4..][..words * LANES * 4];
            for (k, word) in u.chunks_exact(4).enumerate() {
                for (a, q) in lanes[(k * LANES + l) * 4..][..4].iter_mut().zip(word) {
                    *a = (*q ^ 0x80) as i8;
                }
            }
            let at = g * blocks * LANES;
            for (b, (step, block)) in d.iter().zip(u.chunks_exact(BLOCK)).enumerate() {
                self.lane_steps[at + b * LANES + l] = *step;
                self.lane_sums[at + b * LANES + l] = block.iter().map(|q| i32::from(*q) - 128).sum();
            }
        }
    }

    pub fn quantize(xs: &[f32], cols: usize) -> Q8Batch {
        let mut q = Q8Batch::default();
        q.quantize_into(xs, cols);
        q
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Vectors in the batch.
    pub fn vectors(&self) -> usize {
        self.u.len().checked_div(self.cols).unwrap_or(0)
    }

    /// The offset values, `[n, cols]`.
    pub fn values(&self) -> &[u8] {
        &self.u
    }

    /// The steps, `[n, cols / 32]`.
    pub fn steps(&self) -> &[f32] {
        &self.d
    }

    /// The values signed, in groups of [`LANES`] vectors (see the field).
    pub(crate) fn lanes(&self) -> &[i8] {
        &self.lanes
    }

    /// Each block's sum of signed values, in groups of [`LANES`] vectors.
    pub(crate) fn lane_sums(&self) -> &[i32] {
        &self.lane_sums
    }

    /// The steps in groups of [`LANES`] vectors.
    pub(crate) fn lane_steps(&self) -> &[f32] {
        &self.lane_steps
    }

    /// Up to [`FEW`] vectors in the nibble kernels' layout (empty for larger batches).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn split(&self) -> &split::Split {
        &self.split
    }

    /// Vector `v` dequantized: for tests and error measurements.
    pub fn dequantize(&self, v: usize) -> Vec<f32> {
        let u = &self.u[v * self.cols..][..self.cols];
        let d = &self.d[v * self.cols / BLOCK..][..self.cols / BLOCK];
        u.iter().enumerate().map(|(i, q)| (f32::from(*q) - 128.0) * d[i / BLOCK]).collect()
    }
}

thread_local! {
    /// A batch's buffers, kept per thread between products (taken out while in use, so a product
    /// that starts another on the same thread, as rayon's work stealing can, gets its own).
    static SCRATCH: Cell<Option<Q8Batch>> = const { Cell::new(None) };
}

/// Runs `f` on `xs` (`[n, cols]`) quantized, in buffers reused across calls on this thread (no
/// allocation per product once they have grown).
pub(crate) fn with_quantized<R>(xs: &[f32], cols: usize, f: impl FnOnce(&Q8Batch) -> R) -> R {
    crate::scratch::with_taken(&SCRATCH, |q| {
        q.quantize_into(xs, cols);
        f(q)
    })
}

/// Whether this CPU has integer dot products for these kernels: VNNI (AVX-512), or AVX2's
/// `vpmaddubsw`; without either they run their scalar references, and the engine keeps exact
/// activations.
pub fn available() -> bool {
    available_at(level())
}

pub fn available_at(level: Level) -> bool {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx2 {
        return true;
    }
    let _ = level;
    false
}

#[track_caller]
fn check(x: &Q8Batch, rows: usize, ys: &[f32]) {
    assert_eq!(ys.len(), x.vectors() * rows, "ys is not {} vectors of {rows}", x.vectors());
}

/// `Y = W X` for MXFP4 weights (`packed` `[rows, cols/2]`, `scale` `[rows, cols/32]`); `ys`
/// `[n, rows]`.
pub fn matmul_mxfp4(packed: &[u8], scale: &[u8], x: &Q8Batch, ys: &mut [f32]) {
    matmul_mxfp4_at(level(), packed, scale, x, ys)
}

pub fn matmul_mxfp4_at(level: Level, packed: &[u8], scale: &[u8], x: &Q8Batch, ys: &mut [f32]) {
    let rows = scale.len() / (x.cols / BLOCK).max(1);
    assert!(
        packed.len() == rows * x.cols / 2 && scale.len() == rows * x.cols / BLOCK,
        "MXFP4 parts for [{rows}, {}]",
        x.cols
    );
    check(x, rows, ys);
    let few = (1..=FEW).contains(&x.vectors());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 F/BW/VL and VNNI at this level; the shapes are checked
        // above, and the few-vector kernel gets at most `FEW` vectors.
        Level::Avx512 if few => unsafe { vnni::few_nibbles(&nibbles::mxfp4(packed, scale, x.cols), rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx2 if few => unsafe { avx2::few_nibbles(&nibbles::mxfp4(packed, scale, x.cols), rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 F/BW/VL and VNNI at this level; the shapes are checked above.
        Level::Avx512 => unsafe { vnni::matmul(&vnni::mxfp4(packed, scale, x.cols), rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX2 and FMA at this level; the shapes are checked above.
        Level::Avx2 => unsafe { avx2::matmul(&avx2::mxfp4(packed, scale, x.cols), rows, x, ys) },
        Level::Scalar => reference::matmul_mxfp4(packed, scale, x, ys),
    }
}

/// `Y = W X` for int4 grouped weights (`q` `[rows, cols/2]`, `scale` f16 `[rows, cols/group]`,
/// `group` a multiple of 32).
pub fn matmul_int4(q: &[u8], scale: &[f16], group: usize, x: &Q8Batch, ys: &mut [f32]) {
    matmul_int4_at(level(), q, scale, group, x, ys)
}

pub fn matmul_int4_at(level: Level, q: &[u8], scale: &[f16], group: usize, x: &Q8Batch, ys: &mut [f32]) {
    assert!(
        group >= BLOCK && group.is_multiple_of(BLOCK) && x.cols.is_multiple_of(group),
        "int4 groups of {group} for int8 activations"
    );
    let rows = scale.len() / (x.cols / group).max(1);
    assert!(
        q.len() == rows * x.cols / 2 && scale.len() == rows * x.cols / group,
        "int4 parts for [{rows}, {}]",
        x.cols
    );
    check(x, rows, ys);
    let few = (1..=FEW).contains(&x.vectors());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `matmul_mxfp4_at`.
        Level::Avx512 if few => unsafe { vnni::few_nibbles(&nibbles::int4(q, scale, group, x.cols), rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `matmul_mxfp4_at`.
        Level::Avx2 if few => unsafe { avx2::few_nibbles(&nibbles::int4(q, scale, group, x.cols), rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `matmul_mxfp4_at`.
        Level::Avx512 => unsafe { vnni::matmul(&vnni::int4(q, scale, group, x.cols), rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `matmul_mxfp4_at`.
        Level::Avx2 => unsafe { avx2::matmul(&avx2::int4(q, scale, group, x.cols), rows, x, ys) },
        Level::Scalar => reference::matmul_int4(q, scale, group, x, ys),
    }
}

/// `Y = W X` for int8 per-row weights (`q` `[rows, cols]`, `scale` `[rows]`).
pub fn matmul_int8(q: &[i8], scale: &[f32], x: &Q8Batch, ys: &mut [f32]) {
    matmul_int8_at(level(), q, scale, x, ys)
}

pub fn matmul_int8_at(level: Level, q: &[i8], scale: &[f32], x: &Q8Batch, ys: &mut [f32]) {
    let rows = scale.len();
    assert_eq!(q.len(), rows * x.cols, "int8 weights for [{rows}, {}]", x.cols);
    check(x, rows, ys);
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `matmul_mxfp4_at`.
        Level::Avx512 => unsafe { vnni::matmul_int8(&vnni::Int8 { q, scale, cols: x.cols }, rows, x, ys) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `matmul_mxfp4_at`.
        Level::Avx2 => unsafe { avx2::matmul_int8(&avx2::Int8 { q, scale, cols: x.cols }, rows, x, ys) },
        Level::Scalar => reference::matmul_int8(q, scale, x, ys),
    }
}
