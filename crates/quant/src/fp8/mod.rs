//! FP8 e4m3 (`float8_e4m3fn`: bias 7, no infinities, `S.1111.111` NaN), the encoding of Kimi
//! K2-Instruct's and DeepSeek-V3/R1's weights, and products with block-scaled FP8 matrices as
//! those checkpoints store them (#35): the e4m3 bytes and one f32 scale per
//! `block_rows x block_cols` block (`weight_scale_inv`), `w = e4m3(q) * scale[r/br][c/bc]`.
//!
//! Every e4m3 value is exact in f32 (and bf16, and f16 up to a power of two), so the products
//! read the stored bytes and lose nothing to a widened copy. How a row is summed (the order the
//! kernels share, bit for bit, with [`reference`]):
//! - a weight is `e4m3(q) / 256`: the byte's bits placed in an IEEE half
//!   (`sign << 15 | magnitude << 7`) are exactly that value, subnormals included, so the kernels
//!   widen with `vcvtph2ps`; the 256 goes into the block's scale (`scale * 256`, exact);
//! - [`LANES`] partial sums per block, column `c` of the block into lane `c % 32`, each a fused
//!   multiply-add in column order (a partial chunk at a matrix's right edge padded with `0 x 0`);
//! - at the block's end each lane's partial sum times the block's scale is fused into the lane's
//!   row total;
//! - the 32 totals reduced as the AVX-512 kernel reduces its two registers (`simd::hsum` order).
//!
//! NaN bytes (`0x7F`, `0xFF`) are refused at conversion; the kernels read them as 480.

use crate::cpu::{Level, level, supported};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod reference;

/// How far ahead of the weights the kernels ask for more (bytes): a byte a weight streams more
/// bytes a second than the other kernels; the shared 2 KiB left two threads at 0.55 of the read
/// bandwidth, 4 KiB at 0.70-0.75, 8 KiB at 0.78-0.98 (16 KiB no better; docs/EFFICIENCY.md).
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 8192;

/// Partial sums a row keeps per block: the AVX-512 kernel's two registers (AVX2's four).
pub const LANES: usize = 32;

/// The value of an e4m3fn byte, from the format's definition (the reference the kernels are
/// tested against).
pub fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0xF), f32::from(b & 7));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    sign * if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) }
}

/// Whether `b` is one of e4m3's two NaN bytes.
pub fn is_nan(b: u8) -> bool {
    b & 0x7F == 0x7F
}

/// `out[i] = e4m3(bytes[i])`.
pub fn widen(bytes: &[u8], out: &mut [f32]) {
    widen_at(level(), bytes, out)
}

/// [`widen`] with an explicit kernel level (for tests and benchmarks).
pub fn widen_at(level: Level, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len(), "one value per byte");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 or Avx512 only when the CPU has AVX2; lengths checked.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::widen(bytes, out) },
        Level::Scalar => out.iter_mut().zip(bytes).for_each(|(o, &b)| *o = e4m3(b)),
    }
}

/// A block-scaled FP8 matrix (or rows of one), borrowed from its stored parts. Made only by
/// [`Fp8Ref::new`] (which checks the parts against the shape) and [`Fp8Ref::rows_view`], so the
/// kernels' shape checks hold for whatever a file contains.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Ref<'a> {
    /// `rows * cols` e4m3 bytes, row-major.
    pub(crate) q: &'a [u8],
    /// The stored matrix's block scales, `[ceil(all rows / block_rows), ceil(cols / block_cols)]`
    /// (all of them, also for a view of some rows: see `row0`).
    pub(crate) scale: &'a [f32],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) block_rows: usize,
    pub(crate) block_cols: usize,
    /// The index of this view's first row in the stored matrix (which row of scales it takes).
    pub(crate) row0: usize,
}

/// Why parts cannot form a block-scaled FP8 matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fp8Error {
    #[error("FP8 blocks of {0} x {1}: block rows must be positive and block columns a positive multiple of 32")]
    Blocks(usize, usize),
    #[error("FP8 [{rows}, {cols}]: {what} has {len} values, expected {want}")]
    Len { what: &'static str, rows: usize, cols: usize, len: usize, want: usize },
}

impl<'a> Fp8Ref<'a> {
    /// A whole stored matrix, its parts' sizes checked.
    pub fn new(
        q: &'a [u8],
        scale: &'a [f32],
        rows: usize,
        cols: usize,
        block_rows: usize,
        block_cols: usize,
    ) -> Result<Self, Fp8Error> {
        if block_rows == 0 || block_cols == 0 || !block_cols.is_multiple_of(LANES) {
            return Err(Fp8Error::Blocks(block_rows, block_cols));
        }
        let len =
            |what, len, want| if len == want { Ok(()) } else { Err(Fp8Error::Len { what, rows, cols, len, want }) };
        len("q", q.len(), rows * cols)?;
        len("scale", scale.len(), rows.div_ceil(block_rows) * cols.div_ceil(block_cols))?;
        Ok(Fp8Ref { q, scale, rows, cols, block_rows, block_cols, row0: 0 })
    }

    /// Rows `start..start + n` (`None` past the end).
    pub fn rows_view(&self, start: usize, n: usize) -> Option<Self> {
        (start + n <= self.rows).then(|| Fp8Ref {
            q: &self.q[start * self.cols..(start + n) * self.cols],
            rows: n,
            row0: self.row0 + start,
            ..*self
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Column blocks a row has.
    pub fn blocks(&self) -> usize {
        self.cols.div_ceil(self.block_cols)
    }

    /// Row `r`'s bytes and its blocks' scales.
    pub(crate) fn row(&self, r: usize) -> (&'a [u8], &'a [f32]) {
        let b = self.blocks();
        let s = (self.row0 + r) / self.block_rows * b;
        (&self.q[r * self.cols..][..self.cols], &self.scale[s..s + b])
    }

    /// Stored bytes a row takes, scales included (its share of them).
    pub fn row_bytes(&self) -> usize {
        self.cols + 4 * self.blocks() / self.block_rows.max(1)
    }

    /// `y = W x`.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matmul_at(level(), x, y)
    }

    /// `Y = W X` (`xs` `[n, cols]`, `ys` `[n, rows]`): each byte widened once for up to four
    /// vectors, every vector's bits those of [`matvec`](Self::matvec).
    pub fn matmul(&self, xs: &[f32], ys: &mut [f32]) {
        self.matmul_at(level(), xs, ys)
    }

    /// [`matmul`](Self::matmul) with an explicit kernel level (for tests and benchmarks).
    pub fn matmul_at(&self, level: Level, xs: &[f32], ys: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        let n = xs.len() / cols.max(1);
        assert!(xs.len() == n * cols, "xs is not whole {cols}-vectors");
        assert!(ys.len() == n * rows, "ys is not {n} vectors of {rows}");
        assert!(self.q.len() == rows * cols, "q has {} bytes for [{rows}, {cols}]", self.q.len());
        let last = (self.row0 + rows).div_ceil(self.block_rows) * self.blocks();
        assert!(rows == 0 || self.scale.len() >= last, "too few block scales");
        assert!(self.block_cols.is_multiple_of(LANES) && self.block_cols > 0, "blocks of {} columns", self.block_cols);
        if n == 0 || rows == 0 {
            return;
        }
        // The kernel for each width of a group of vectors (1-4), at the level asked for.
        type Kernel = unsafe fn(&Fp8Ref<'_>, &[f32], &mut [f32]);
        let widths: Option<[Kernel; 4]> = match supported(level) {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => {
                Some([avx512::matmul_n::<1>, avx512::matmul_n::<2>, avx512::matmul_n::<3>, avx512::matmul_n::<4>])
            }
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => Some([avx2::matmul_n::<1>, avx2::matmul_n::<2>, avx2::matmul_n::<3>, avx2::matmul_n::<4>]),
            Level::Scalar => None,
        };
        match widths {
            Some(kernels) => {
                for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                    // SAFETY: `supported` returned the kernels' level only if the CPU has its
                    // features (AVX-512 F/BW/VL, or AVX2, FMA and F16C); shapes and scales checked
                    // above; `width` (1-4) whole vectors.
                    unsafe { kernels[width - 1](self, xb, yb) }
                }
            }
            None => {
                for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                    reference::matvec(self, x, y);
                }
            }
        }
    }

    /// Row `r`'s weights as f32 (`e4m3 * scale`, rounded once: the values a checkpoint's own
    /// dequantization gives), for products that need the row whole (used transposed).
    pub fn widen_row(&self, r: usize, out: &mut [f32]) {
        let (q, scales) = self.row(r);
        widen(q, out);
        for (chunk, s) in out.chunks_mut(self.block_cols).zip(scales) {
            chunk.iter_mut().for_each(|v| *v *= s);
        }
    }
}

/// `b`, or a neighbouring byte where `b` is one of the two NaNs: random weights for benchmarks
/// and synthetic models that conversion would accept.
pub fn finite(b: u8) -> u8 {
    if is_nan(b) { b ^ 1 } else { b }
}

/// The e4m3 byte nearest `v` (ties to the even mantissa; beyond ±448 saturated, NaN as 0):
/// torch's `to(float8_e4m3fn)` for values in range, which DeepSeek's block quantization keeps
/// them in.
pub fn to_e4m3(v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    // Magnitudes 0..=0x7E are increasing in value: the last one at or below `a`, then its
    // successor if that is nearer (or as near with an even mantissa).
    let (mut lo, mut hi) = (0u8, 0x7Eu8);
    if a >= e4m3(hi) {
        return sign | hi;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3(mid) <= a { lo = mid } else { hi = mid }
    }
    let (dl, dh) = (a - e4m3(lo), e4m3(hi) - a);
    sign | if dh < dl || (dh == dl && hi % 2 == 0) { hi } else { lo }
}

/// DeepSeek's FP8 block quantization of a `[rows, cols]` matrix (`weight_quant`): per block,
/// `scale = max|w| / 448` (1 for an all-zero block), `q = e4m3(w / scale)`. Returns the bytes and
/// the `[ceil(rows/block), ceil(cols/block)]` scales (`weight_scale_inv`).
pub fn quantize(w: &[f32], rows: usize, cols: usize, block: usize) -> (Vec<u8>, Vec<f32>) {
    assert!(block > 0 && w.len() == rows * cols, "weights are not [{rows}, {cols}]");
    let (br, bc) = (rows.div_ceil(block), cols.div_ceil(block));
    let mut scale = vec![1f32; br * bc];
    for (i, s) in scale.iter_mut().enumerate() {
        let (r0, c0) = (i / bc * block, i % bc * block);
        let amax = (r0..(r0 + block).min(rows))
            .flat_map(|r| &w[r * cols + c0..r * cols + (c0 + block).min(cols)])
            .fold(0f32, |m, v| m.max(v.abs()));
        if amax > 0.0 {
            *s = amax / 448.0;
        }
    }
    let q = w.iter().enumerate().map(|(i, v)| to_e4m3(v / scale[i / cols / block * bc + i % cols / block])).collect();
    (q, scale)
}
