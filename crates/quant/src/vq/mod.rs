//! ~3-bit vector quantization of expert matrices (the WASTE codec), two candidates:
//!
//! - **A, fast-scan additive** ([`Codec::FastScan`]): 3 codebooks x 16 entries x 4 dims, 3.0
//!   bits/weight. A matvec builds, per input vector, a table of `codeword . x_chunk` quantized to
//!   u8 and sums table entries with `pshufb`, 32 rows at once (FAISS fast-scan). Codes are stored
//!   interleaved in blocks of 32 rows.
//! - **B, residual** ([`Codec::Residual`]): 3 codebooks x 256 entries x 8 dims, 3.0 bits/weight.
//!   A matvec decodes each 8-chunk as the sum of three codewords (codebooks stay in L1) and FMAs.
//!
//! Both reconstruct a row as `scale[r] * sum_s C_s[code]` per chunk, in the basis of an optional
//! randomized block-Hadamard rotation of the input dimension. This folder is what the runtime
//! reads; the encoder that makes codes and codebooks is [`crate::encode`].

pub mod fastscan;
pub mod hadamard;
pub mod residual;

use half::f16;

use crate::cpu::{Level, level};
pub use hadamard::Rotation;

/// The VQ codec candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// A: 3 x 16 x 4 additive, fast-scan kernel.
    FastScan,
    /// B: 3 x 256 x 8 residual, codeword-gather kernel.
    Residual,
}

impl Codec {
    pub const ALL: [Codec; 2] = [Codec::FastScan, Codec::Residual];

    pub fn name(self) -> &'static str {
        match self {
            Codec::FastScan => "vq_a_3x16x4",
            Codec::Residual => "vq_b_3x256x8",
        }
    }

    pub const fn stages(self) -> usize {
        3
    }

    pub const fn entries(self) -> usize {
        match self {
            Codec::FastScan => 16,
            Codec::Residual => 256,
        }
    }

    pub const fn dim(self) -> usize {
        match self {
            Codec::FastScan => 4,
            Codec::Residual => 8,
        }
    }

    /// Rows per interleaved code block (1 = row-major).
    pub const fn interleave(self) -> usize {
        match self {
            Codec::FastScan => 32,
            Codec::Residual => 1,
        }
    }

    /// Why a `[rows, cols]` matrix cannot use this codec, if it cannot.
    pub(crate) fn check_shape(self, rows: usize, cols: usize) -> Result<(), String> {
        let col_multiple = match self {
            Codec::FastScan => 8, // an even number of (chunk, stage) items per row
            Codec::Residual => 8,
        };
        if rows == 0 || !rows.is_multiple_of(self.interleave()) || cols == 0 || !cols.is_multiple_of(col_multiple) {
            return Err(format!(
                "{} needs rows in multiples of {} and columns in multiples of {col_multiple}, got [{rows}, {cols}]",
                self.name(),
                self.interleave()
            ));
        }
        Ok(())
    }
}

/// An encoded matrix, owning its parts.
#[derive(Debug, Clone)]
pub struct VqMatrix {
    pub codec: Codec,
    pub rows: usize,
    pub cols: usize,
    /// Codes in the codec's storage layout (see the codec modules).
    pub codes: Vec<u8>,
    pub scale: Vec<f16>,
    /// `stages x entries x dim` f32.
    pub codebooks: Vec<f32>,
    pub rotation: Option<Rotation>,
}

/// A borrowed encoded matrix: what the kernels run on (parts may live in an expert record).
#[derive(Debug, Clone, Copy)]
pub struct VqRef<'a> {
    pub codec: Codec,
    pub rows: usize,
    pub cols: usize,
    pub codes: &'a [u8],
    pub scale: &'a [f16],
    pub codebooks: &'a [f32],
    pub rotation: Option<&'a Rotation>,
}

/// Per-thread working memory of the VQ kernels, reused across calls.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    table: Vec<f32>,
    lut: Vec<u8>,
    sums: Vec<u32>,
    /// A batch's rotated vectors, their tables and the tables' steps.
    xs: Vec<f32>,
    luts: Vec<u8>,
    deltas: Vec<f32>,
}

impl VqMatrix {
    pub fn as_ref(&self) -> VqRef<'_> {
        VqRef {
            codec: self.codec,
            rows: self.rows,
            cols: self.cols,
            codes: &self.codes,
            scale: &self.scale,
            codebooks: &self.codebooks,
            rotation: self.rotation.as_ref(),
        }
    }

    pub fn decode(&self) -> Vec<f32> {
        self.as_ref().decode()
    }

    pub fn matvec(&self, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        self.as_ref().matvec(x, y, scratch)
    }

    /// Bits per weight, codes and row scales (codebooks are per matrix or shared).
    pub fn bits_per_weight(&self) -> f64 {
        (self.codes.len() * 8 + self.scale.len() * 16) as f64 / (self.rows * self.cols) as f64
    }
}

impl VqRef<'_> {
    fn items(&self) -> usize {
        self.cols / self.codec.dim() * self.codec.stages()
    }

    /// The code of item `j` (chunk `j / stages`, stage `j % stages`) of row `r`.
    pub fn code(&self, r: usize, j: usize) -> usize {
        match self.codec {
            Codec::FastScan => fastscan::code(self.codes, self.items(), r, j),
            Codec::Residual => usize::from(self.codes[r * self.items() + j]),
        }
    }

    /// The matrix in the original basis (rotation undone), `[rows, cols]`.
    pub fn decode(&self) -> Vec<f32> {
        let (d, s_n, e_n) = (self.codec.dim(), self.codec.stages(), self.codec.entries());
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            let s = self.scale[r].to_f32();
            for (k, chunk) in row.chunks_exact_mut(d).enumerate() {
                for st in 0..s_n {
                    let e = self.code(r, k * s_n + st);
                    let cw = &self.codebooks[(st * e_n + e) * d..][..d];
                    chunk.iter_mut().zip(cw).for_each(|(o, c)| *o += c);
                }
                chunk.iter_mut().for_each(|v| *v *= s);
            }
            if let Some(rot) = self.rotation {
                rot.apply_inverse(row);
            }
        }
        out
    }

    /// `y = W x` with the kernel the CPU supports.
    pub fn matvec(&self, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        self.matvec_at(level(), x, y, scratch)
    }

    /// [`matvec`](Self::matvec) with an explicit kernel level.
    pub fn matvec_at(&self, level: Level, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        assert_eq!(x.len(), self.cols, "x has {} entries for {} columns", x.len(), self.cols);
        assert_eq!(y.len(), self.rows, "y has {} entries for {} rows", y.len(), self.rows);
        scratch.x.clear();
        scratch.x.extend_from_slice(x);
        if let Some(r) = self.rotation {
            r.apply(&mut scratch.x);
        }
        match self.codec {
            Codec::FastScan => fastscan::matvec(level, self, scratch, y),
            Codec::Residual => residual::matvec(level, self, &scratch.x, y),
        }
    }

    /// `Y = W X` for a batch (`xs` `[n, cols]`, `ys` `[n, rows]`), the same bits as
    /// [`matvec`](Self::matvec) per vector; fast-scan scans the codes once per pair of vectors.
    pub fn matmul(&self, xs: &[f32], ys: &mut [f32], scratch: &mut Scratch) {
        self.matmul_at(level(), xs, ys, scratch)
    }

    /// [`matmul`](Self::matmul) with an explicit kernel level.
    pub fn matmul_at(&self, level: Level, xs: &[f32], ys: &mut [f32], scratch: &mut Scratch) {
        let n = xs.len() / self.cols;
        assert_eq!(xs.len(), n * self.cols, "xs is not whole {}-vectors", self.cols);
        assert_eq!(ys.len(), n * self.rows, "ys is not {n} vectors of {}", self.rows);
        if self.codec != Codec::FastScan || n < 2 {
            for (x, y) in xs.chunks_exact(self.cols).zip(ys.chunks_exact_mut(self.rows)) {
                self.matvec_at(level, x, y, scratch);
            }
            return;
        }
        scratch.xs.clear();
        scratch.xs.extend_from_slice(xs);
        if let Some(r) = self.rotation {
            scratch.xs.chunks_exact_mut(self.cols).for_each(|x| r.apply(x));
        }
        fastscan::matmul(level, self, scratch, ys);
    }
}

/// The codec WASTE uses for experts unless told otherwise; chosen by measured quality and speed
/// (docs/LEARNED.md, docs/EFFICIENCY.md).
pub const DEFAULT_CODEC: Codec = Codec::FastScan;
