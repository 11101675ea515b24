//! One type for "a weight matrix in any stored encoding", so layers (attention, MLPs) can hold
//! projections without caring how they are stored. Borrowed: parts usually live in the mapped
//! trunk or an expert record.

use std::cell::{Cell, RefCell};

use half::{bf16, f16};

use crate::bf16dot::{self, Bf16Batch};
use crate::fp8::Fp8Ref;
use crate::q8::{self, Q8Batch};
use crate::vq::{Scratch, VqRef};
use crate::{dense, int2, int4, int8, mxfp4};

/// How a product rounds its input vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activations {
    /// f32 as given: the products are exact up to f32 summation order.
    #[default]
    Exact,
    /// Quantized to int8 in 32-blocks ([`q8`]) where the encoding has an integer kernel and the
    /// CPU has integer dots (AVX512-VNNI or AVX2); exact elsewhere.
    Int8,
    /// Rounded to bf16 ([`bf16dot`]) for batches of more than [`q8::FEW`] vectors, where the
    /// encoding's values are whole bf16 values (bf16, int8, int4) and the CPU has AVX512-BF16;
    /// exact elsewhere (a lone decode vector included).
    Bf16,
}

/// A `[rows, cols]` matrix, `y = W x`. The integer encodings carry how their products round
/// the activations (`act`; see [`Matrix::with_activations`]).
#[derive(Debug, Clone, Copy)]
pub enum Matrix<'a> {
    F32 {
        w: &'a [f32],
        rows: usize,
        cols: usize,
    },
    Bf16 {
        w: &'a [bf16],
        rows: usize,
        cols: usize,
        act: Activations,
    },
    Int8Row {
        q: &'a [i8],
        scale: &'a [f32],
        rows: usize,
        cols: usize,
        act: Activations,
    },
    Int4Group {
        q: &'a [u8],
        scale: &'a [f16],
        group: usize,
        rows: usize,
        cols: usize,
        act: Activations,
    },
    Mxfp4 {
        packed: &'a [u8],
        scale: &'a [u8],
        rows: usize,
        cols: usize,
        act: Activations,
    },
    /// 2-bit groups ([`int2`]): HOBBIT's low-bit expert copies (exact activations).
    Int2Group {
        q: &'a [u8],
        scale: &'a [f16],
        group: usize,
        rows: usize,
        cols: usize,
    },
    /// FP8 e4m3 in blocks with f32 scales, as FP8 checkpoints store them (exact activations).
    Fp8(Fp8Ref<'a>),
    Vq(VqRef<'a>),
}

/// Weights per row block of a batched product: about half a core's L2 here, so a block stays
/// cached while every vector of a chunk passes over it.
const BLOCK_BYTES: usize = 256 << 10;

thread_local! {
    static VQ_SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Why parts cannot form a matrix of the claimed shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {len} values cannot be a [{rows}, {cols}] matrix")]
pub struct ShapeError {
    pub what: &'static str,
    pub len: usize,
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Matrix<'a> {
    /// An f32 matrix, checked.
    pub fn f32(w: &'a [f32], rows: usize, cols: usize) -> Result<Self, ShapeError> {
        if w.len() != rows * cols {
            return Err(ShapeError { what: "f32", len: w.len(), rows, cols });
        }
        Ok(Matrix::F32 { w, rows, cols })
    }

    /// A bf16 matrix, checked.
    pub fn bf16(w: &'a [bf16], rows: usize, cols: usize) -> Result<Self, ShapeError> {
        if w.len() != rows * cols {
            return Err(ShapeError { what: "bf16", len: w.len(), rows, cols });
        }
        Ok(Matrix::Bf16 { w, rows, cols, act: Activations::Exact })
    }

    /// The same matrix with its products rounding activations as `act` says (a no-op for the
    /// encodings with no kernel for rounded activations: f32, VQ).
    pub fn with_activations(self, act: Activations) -> Self {
        match self {
            Matrix::Bf16 { w, rows, cols, .. } => Matrix::Bf16 { w, rows, cols, act },
            Matrix::Int8Row { q, scale, rows, cols, .. } => Matrix::Int8Row { q, scale, rows, cols, act },
            Matrix::Int4Group { q, scale, group, rows, cols, .. } => {
                Matrix::Int4Group { q, scale, group, rows, cols, act }
            }
            Matrix::Mxfp4 { packed, scale, rows, cols, .. } => Matrix::Mxfp4 { packed, scale, rows, cols, act },
            other => other,
        }
    }

    /// Whether this matrix's products quantize their inputs to int8 (asked for, a shape the
    /// kernels take, and a CPU with integer dots: AVX512-VNNI or AVX2).
    pub fn takes_q8(&self) -> bool {
        let (shape_ok, act) = match *self {
            Matrix::Int8Row { cols, act, .. } | Matrix::Mxfp4 { cols, act, .. } => {
                (cols.is_multiple_of(q8::BLOCK), act)
            }
            Matrix::Int4Group { cols, group, act, .. } => {
                (cols.is_multiple_of(q8::BLOCK) && group.is_multiple_of(q8::BLOCK), act)
            }
            _ => return false,
        };
        // A matrix built without a file (whose shapes are checked at open) could have no columns.
        shape_ok && self.cols() > 0 && act == Activations::Int8 && q8::available()
    }

    /// Whether this matrix's products of `n` vectors round them to bf16 (asked for, an encoding
    /// of whole bf16 values, a batch larger than [`q8::FEW`], a CPU with AVX512-BF16).
    pub fn takes_bf16(&self, n: usize) -> bool {
        let act = match *self {
            Matrix::Bf16 { act, .. } | Matrix::Int8Row { act, .. } | Matrix::Int4Group { act, .. } => act,
            _ => return false,
        };
        act == Activations::Bf16 && self.cols() > 0 && self.cols().is_multiple_of(2) && bf16dot::takes(n)
    }

    /// The parts as the bf16 products read them (for a matrix that [takes](Self::takes_bf16)
    /// them).
    fn bf16_weights(&self) -> bf16dot::Weights<'a> {
        match *self {
            Matrix::Bf16 { w, .. } => bf16dot::Weights::Bf16(w),
            Matrix::Int8Row { q, scale, .. } => bf16dot::Weights::Int8 { q, scale },
            Matrix::Int4Group { q, scale, group, .. } => bf16dot::Weights::Int4 { q, scale, group },
            _ => unreachable!("takes_bf16 admits only the bf16, int8 and int4 encodings"),
        }
    }

    /// `Y = W X` for activations already rounded ([`Bf16Batch`]); `ys` `[n, rows]`. Called only
    /// for a matrix that [takes them](Self::takes_bf16).
    pub(crate) fn matmul_bf16(&self, x: &Bf16Batch, ys: &mut [f32]) {
        assert_eq!(x.cols(), self.cols(), "activations have {} columns for {}", x.cols(), self.cols());
        bf16dot::matmul(&self.bf16_weights(), x, ys)
    }

    /// `Y = W X` for activations already quantized ([`Q8Batch`]); `ys` `[n, rows]`. Called only
    /// for a matrix that [takes them](Self::takes_q8).
    pub(crate) fn matmul_q8(&self, x: &Q8Batch, ys: &mut [f32]) {
        assert_eq!(x.cols(), self.cols(), "activations have {} columns for {}", x.cols(), self.cols());
        match *self {
            Matrix::Int8Row { q, scale, .. } => q8::matmul_int8(q, scale, x, ys),
            Matrix::Int4Group { q, scale, group, .. } => q8::matmul_int4(q, scale, group, x, ys),
            Matrix::Mxfp4 { packed, scale, .. } => q8::matmul_mxfp4(packed, scale, x, ys),
            _ => unreachable!("takes_q8 admits only the int8, int4 and MXFP4 encodings"),
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            Matrix::F32 { rows, .. }
            | Matrix::Bf16 { rows, .. }
            | Matrix::Int8Row { rows, .. }
            | Matrix::Int4Group { rows, .. }
            | Matrix::Int2Group { rows, .. }
            | Matrix::Mxfp4 { rows, .. } => *rows,
            Matrix::Fp8(m) => m.rows,
            Matrix::Vq(v) => v.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Matrix::F32 { cols, .. }
            | Matrix::Bf16 { cols, .. }
            | Matrix::Int8Row { cols, .. }
            | Matrix::Int4Group { cols, .. }
            | Matrix::Int2Group { cols, .. }
            | Matrix::Mxfp4 { cols, .. } => *cols,
            Matrix::Fp8(m) => m.cols,
            Matrix::Vq(v) => v.cols,
        }
    }

    /// `y = W x` with the fastest kernel the CPU supports.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        assert_eq!(x.len(), self.cols(), "x has {} entries for {} columns", x.len(), self.cols());
        assert_eq!(y.len(), self.rows(), "y has {} entries for {} rows", y.len(), self.rows());
        if self.takes_q8() {
            return q8::with_quantized(x, self.cols(), |q| self.matmul_q8(q, y));
        }
        match *self {
            Matrix::F32 { w, .. } => dense::matvec_f32(w, x, y),
            Matrix::Bf16 { w, .. } => dense::matvec_bf16(w, x, y),
            Matrix::Int8Row { q, scale, .. } => int8::matvec(q, scale, x, y),
            Matrix::Int4Group { q, scale, group, .. } => int4::matvec(q, scale, group, x, y),
            Matrix::Int2Group { q, scale, group, .. } => int2::matvec(q, scale, group, x, y),
            Matrix::Mxfp4 { packed, scale, .. } => mxfp4::matvec(packed, scale, x, y),
            Matrix::Fp8(m) => m.matvec(x, y),
            Matrix::Vq(v) => VQ_SCRATCH.with_borrow_mut(|s| v.matvec(x, y, s)),
        }
    }

    /// Whether whole rows of this matrix can be read out ([`Matrix::row_values`]): the
    /// encodings an embedding table may have (f32, bf16, int8 rows, int4 groups).
    pub fn reads_rows(&self) -> bool {
        matches!(self, Matrix::F32 { .. } | Matrix::Bf16 { .. } | Matrix::Int8Row { .. } | Matrix::Int4Group { .. })
    }

    /// Writes row `r`'s values, as the exact products multiply them, into `out` (`cols` of
    /// them): a table lookup. Returns false, writing nothing, for a row past the end, an `out`
    /// of another length, or an encoding that does not [read rows](Matrix::reads_rows).
    pub fn row_values(&self, r: usize, out: &mut [f32]) -> bool {
        let cols = self.cols();
        if r >= self.rows() || out.len() != cols {
            return false;
        }
        let span = r * cols..(r + 1) * cols;
        match *self {
            Matrix::F32 { w, .. } => out.copy_from_slice(&w[span]),
            Matrix::Bf16 { w, .. } => out.iter_mut().zip(&w[span]).for_each(|(o, v)| *o = v.to_f32()),
            Matrix::Int8Row { q, scale, .. } => {
                let s = scale[r];
                out.iter_mut().zip(&q[span]).for_each(|(o, &v)| *o = f32::from(v) * s);
            }
            Matrix::Int4Group { q, scale, group, .. } => {
                let bytes = &q[r * cols / 2..(r + 1) * cols / 2];
                let scales = &scale[r * cols / group..(r + 1) * cols / group];
                for (g, (out, bytes)) in out.chunks_exact_mut(group).zip(bytes.chunks_exact(group / 2)).enumerate() {
                    let s = scales[g].to_f32();
                    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
                        pair[0] = f32::from((b & 0x0f) as i8 - 8) * s;
                        pair[1] = f32::from((b >> 4) as i8 - 8) * s;
                    }
                }
            }
            _ => return false,
        }
        true
    }

    /// Rows `start..start + n` as a matrix of their own (for per-head slices). `None` when the
    /// encoding cannot be cut there (VQ fast-scan codes come in blocks of 32 rows).
    pub fn rows_view(&self, start: usize, n: usize) -> Option<Matrix<'a>> {
        if start + n > self.rows() {
            return None;
        }
        let cols = self.cols();
        Some(match *self {
            Matrix::F32 { w, .. } => Matrix::F32 { w: &w[start * cols..(start + n) * cols], rows: n, cols },
            Matrix::Bf16 { w, act, .. } => Matrix::Bf16 { w: &w[start * cols..(start + n) * cols], rows: n, cols, act },
            Matrix::Int8Row { q, scale, act, .. } => Matrix::Int8Row {
                q: &q[start * cols..(start + n) * cols],
                scale: &scale[start..start + n],
                rows: n,
                cols,
                act,
            },
            Matrix::Int4Group { q, scale, group, act, .. } => Matrix::Int4Group {
                q: &q[start * cols / 2..(start + n) * cols / 2],
                scale: &scale[start * cols / group..(start + n) * cols / group],
                group,
                rows: n,
                cols,
                act,
            },
            Matrix::Int2Group { q, scale, group, .. } => Matrix::Int2Group {
                q: &q[start * cols / 4..(start + n) * cols / 4],
                scale: &scale[start * cols / group..(start + n) * cols / group],
                group,
                rows: n,
                cols,
            },
            Matrix::Mxfp4 { packed, scale, act, .. } => Matrix::Mxfp4 {
                packed: &packed[start * cols / 2..(start + n) * cols / 2],
                scale: &scale[start * cols / 32..(start + n) * cols / 32],
                rows: n,
                cols,
                act,
            },
            Matrix::Fp8(m) => Matrix::Fp8(m.rows_view(start, n)?),
            Matrix::Vq(_) => return None,
        })
    }

    /// This matrix as [`Dense`] (what can be multiplied transposed), if it is stored f32, bf16
    /// or FP8; `None` for the other quantized encodings.
    pub fn dense(self) -> Option<Dense<'a>> {
        let (rows, cols) = (self.rows(), self.cols());
        let w = match self {
            Matrix::F32 { w, .. } => DenseRows::F32(w),
            Matrix::Bf16 { w, .. } => DenseRows::Bf16(w),
            Matrix::Fp8(m) => DenseRows::Fp8(m),
            _ => return None,
        };
        Some(Dense { w, rows, cols })
    }

    /// `Y = W X` for `n` vectors (`xs` `[n, cols]`, `ys` `[n, rows]`); MXFP4, bf16, int8, int4
    /// and VQ fast-scan read each weight block once for several vectors, f32 and residual VQ run
    /// one vector at a time.
    /// Every encoding gives the same bits as [`matvec`](Self::matvec) per vector.
    pub fn matmul(&self, xs: &[f32], ys: &mut [f32]) {
        let (rows, cols) = (self.rows(), self.cols());
        let n = xs.len() / cols.max(1);
        assert_eq!(xs.len(), n * cols, "xs is not whole {cols}-vectors");
        assert_eq!(ys.len(), n * rows, "ys is not {n} vectors of {rows}");
        if n == 0 {
            return;
        }
        self.matmul_in_blocks(xs, ys, (BLOCK_BYTES / self.row_bytes().max(1)).max(1));
    }

    /// [`matmul`](Self::matmul) taking `block` rows at a time (exposed for tests and benchmarks).
    pub fn matmul_in_blocks(&self, xs: &[f32], ys: &mut [f32], block: usize) {
        let (rows, cols) = (self.rows(), self.cols());
        let n = xs.len() / cols.max(1);
        if self.takes_q8() {
            // The int8 kernels block their own loops (vector blocks in L2, register tiles).
            return q8::with_quantized(xs, cols, |q| self.matmul_q8(q, ys));
        }
        if self.takes_bf16(n) {
            return bf16dot::with_rounded(xs, cols, |x| self.matmul_bf16(x, ys));
        }
        if n <= 4 || block >= rows || matches!(self, Matrix::F32 { .. } | Matrix::Vq(_)) {
            return self.matmul_whole(xs, ys);
        }
        // Larger than a core's cache: take the rows a block at a time, every vector against one
        // block before the next, so the weights come from memory once rather than once per four
        // vectors. Each (row, vector) still runs the same kernel, so the bits do not change.
        let mut out = vec![0f32; n * block];
        for start in (0..rows).step_by(block) {
            let r = block.min(rows - start);
            let part = self.rows_view(start, r).expect("dense encodings cut at any row");
            part.matmul_whole(xs, &mut out[..n * r]);
            for (y, o) in ys.chunks_exact_mut(rows).zip(out.chunks_exact(r)) {
                y[start..start + r].copy_from_slice(o);
            }
        }
    }

    /// Stored bytes of one row (scales included).
    fn row_bytes(&self) -> usize {
        let cols = self.cols();
        match *self {
            Matrix::F32 { .. } => 4 * cols,
            Matrix::Bf16 { .. } => 2 * cols,
            Matrix::Int8Row { .. } => cols + 4,
            Matrix::Int4Group { group, .. } => cols / 2 + 2 * cols / group.max(1),
            Matrix::Int2Group { group, .. } => cols / 4 + 2 * cols / group.max(1),
            Matrix::Mxfp4 { .. } => cols / 2 + cols / 32,
            Matrix::Fp8(m) => m.row_bytes(),
            Matrix::Vq(v) => (v.codes.len() + 2 * v.scale.len()) / v.rows.max(1),
        }
    }

    /// [`matmul`](Self::matmul) over all rows at once.
    fn matmul_whole(&self, xs: &[f32], ys: &mut [f32]) {
        let (rows, cols) = (self.rows(), self.cols());
        match *self {
            Matrix::Mxfp4 { packed, scale, .. } => mxfp4::matmul(packed, scale, cols, xs, ys),
            Matrix::Fp8(m) => m.matmul(xs, ys),
            Matrix::Bf16 { w, .. } => dense::matmul_bf16(w, cols, xs, ys),
            Matrix::Int8Row { q, scale, .. } => int8::matmul(q, scale, cols, xs, ys),
            Matrix::Int4Group { q, scale, group, .. } => int4::matmul(q, scale, group, cols, xs, ys),
            Matrix::Int2Group { q, scale, group, .. } => int2::matmul(q, scale, group, cols, xs, ys),
            Matrix::Vq(v) => VQ_SCRATCH.with_borrow_mut(|s| v.matmul(xs, ys, s)),
            _ => {
                for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                    self.matvec(x, y);
                }
            }
        }
    }
}

/// A matrix stored f32, bf16 or FP8 ([`Matrix::dense`]): the encodings that can be multiplied
/// transposed (a row at a time, widened exactly), as the absorbed MLA query needs the key
/// projection.
#[derive(Debug, Clone, Copy)]
pub struct Dense<'a> {
    w: DenseRows<'a>,
    rows: usize,
    cols: usize,
}

#[derive(Debug, Clone, Copy)]
enum DenseRows<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    /// Each row widened to `e4m3 * scale` in f32: the values the checkpoint's own dequantization
    /// gives.
    Fp8(Fp8Ref<'a>),
}

thread_local! {
    /// A bf16 row widened to f32, kept between products (no allocation per call on decode).
    static WIDENED: Cell<Option<Vec<f32>>> = const { Cell::new(None) };
}

impl Dense<'_> {
    /// Row `r` widened exactly to f32 into `out` (`cols` values; false, writing nothing, for a
    /// row past the end or an `out` of another length): the values the products multiply.
    pub fn row_values(&self, r: usize, out: &mut [f32]) -> bool {
        let cols = self.cols;
        if r >= self.rows || out.len() != cols {
            return false;
        }
        match self.w {
            DenseRows::F32(w) => out.copy_from_slice(&w[r * cols..(r + 1) * cols]),
            DenseRows::Bf16(w) => out.iter_mut().zip(&w[r * cols..(r + 1) * cols]).for_each(|(o, v)| *o = v.to_f32()),
            DenseRows::Fp8(m) => m.widen_row(r, out),
        }
        true
    }

    /// `y = W^T x` (`x` has `rows` entries, `y` gets `cols`).
    pub fn matvec_transposed(&self, x: &[f32], y: &mut [f32]) {
        self.matmul_transposed(x, y)
    }

    /// `Y = X W` for `n` vectors (`xs` `[n, rows]`, `ys` `[n, cols]`): each vector's
    /// [`matvec_transposed`](Self::matvec_transposed), a bf16 row widened once for all of them.
    /// The same bits per vector as alone.
    pub fn matmul_transposed(&self, xs: &[f32], ys: &mut [f32]) {
        let (rows, cols) = (self.rows, self.cols);
        let n = xs.len() / rows.max(1);
        assert_eq!(xs.len(), n * rows, "xs is not whole {rows}-vectors");
        assert_eq!(ys.len(), n * cols, "ys is not {n} vectors of {cols}");
        // Row r of W times each vector's value r, added to that vector's output: rows in order.
        let apply = |r: usize, row: &[f32], ys: &mut [f32]| {
            for (y, x) in ys.chunks_exact_mut(cols).zip(xs.chunks_exact(rows)) {
                crate::vecops::axpby(1.0, y, x[r], row);
            }
        };
        ys.fill(0.0);
        match self.w {
            DenseRows::F32(w) => {
                for (r, row) in w.chunks_exact(cols).enumerate() {
                    apply(r, row, ys);
                }
            }
            DenseRows::Bf16(w) => crate::scratch::with_taken(&WIDENED, |row| {
                row.resize(cols, 0.0);
                for (r, src) in w.chunks_exact(cols).enumerate() {
                    for (d, s) in row.iter_mut().zip(src) {
                        *d = s.to_f32();
                    }
                    apply(r, row, ys);
                }
            }),
            DenseRows::Fp8(m) => crate::scratch::with_taken(&WIDENED, |row| {
                row.resize(cols, 0.0);
                for r in 0..rows {
                    m.widen_row(r, row);
                    apply(r, row, ys);
                }
            }),
        }
    }
}
