//! Splitting a matrix's rows over the current rayon pool (the caller's `ThreadPool::install`, or
//! the global pool). The kernels stay single-threaded: each row is computed whole, by one thread,
//! with the same kernel it would use alone, so however the rows are split — any thread count —
//! every output is bit-identical (a property test checks it for every encoding).

use rayon::prelude::*;

use crate::Matrix;
use crate::{bf16dot, q8};

/// Rows per task are a multiple of this (a cache line of f32 outputs, and the VQ codes' blocks).
const ROW_BLOCK: usize = 32;
/// Below this many weights a product runs on the calling thread: waking others costs more.
pub const MIN_PARALLEL_WEIGHTS: usize = 1 << 18;

/// How many tasks a product of `m` with `batch` vectors is split into on `threads` threads (1:
/// it runs on the calling thread).
pub fn tasks(m: &Matrix<'_>, threads: usize, batch: usize) -> usize {
    rows_per_task(m, threads, batch * m.rows() * m.cols()).map_or(1, |per| m.rows().div_ceil(per))
}

/// Rows per task for `m` on `threads` threads: about four tasks per thread (for balance), whole
/// row blocks, and at least `MIN_PARALLEL_WEIGHTS / 4` weights each; `None` to stay serial.
fn rows_per_task(m: &Matrix<'_>, threads: usize, work: usize) -> Option<usize> {
    let (rows, cols) = (m.rows(), m.cols().max(1));
    if threads < 2 || work < MIN_PARALLEL_WEIGHTS || rows < 2 * ROW_BLOCK || m.rows_view(0, ROW_BLOCK).is_none() {
        return None;
    }
    let min_rows = (MIN_PARALLEL_WEIGHTS / 4 / cols).max(1);
    let per = rows.div_ceil(threads * 4).max(min_rows).next_multiple_of(ROW_BLOCK);
    (per < rows).then_some(per)
}

/// `y = W x`, rows split over the current pool.
pub fn matvec(m: &Matrix<'_>, x: &[f32], y: &mut [f32]) {
    if m.takes_q8() {
        return q8::with_quantized(x, m.cols(), |q| split(m, 1, y, |part, out| part.matmul_q8(q, out)));
    }
    split(m, 1, y, |part, out| part.matvec(x, out));
}

/// `Y = W X` for a batch (`xs` `[n, cols]`, `ys` `[n, rows]`), rows split over the current pool:
/// each task runs the batched kernel on its rows for every vector.
pub fn matmul(m: &Matrix<'_>, xs: &[f32], ys: &mut [f32]) {
    let cols = m.cols().max(1);
    let n = xs.len() / cols;
    if m.takes_q8() {
        // Quantized once here, not once per task.
        return q8::with_quantized(xs, cols, |q| split(m, n, ys, |part, out| part.matmul_q8(q, out)));
    }
    if m.takes_bf16(n) {
        return bf16dot::with_rounded(xs, cols, |x| split(m, n, ys, |part, out| part.matmul_bf16(x, out)));
    }
    if n == 1 {
        return matvec(m, xs, ys);
    }
    split(m, n, ys, |part, out| part.matmul(xs, out));
}

/// `ya = A X` and `yb = B X` for the same batch (a gated MLP's gate and up projections): under
/// int8 or bf16 activations the batch is rounded once for both.
pub fn matmul_pair(a: &Matrix<'_>, b: &Matrix<'_>, xs: &[f32], ya: &mut [f32], yb: &mut [f32]) {
    let cols = a.cols().max(1);
    let n = xs.len() / cols;
    if a.takes_q8() && b.takes_q8() && a.cols() == b.cols() {
        return q8::with_quantized(xs, cols, |q| {
            split(a, n, ya, |part, out| part.matmul_q8(q, out));
            split(b, n, yb, |part, out| part.matmul_q8(q, out));
        });
    }
    if a.takes_bf16(n) && b.takes_bf16(n) && a.cols() == b.cols() {
        return bf16dot::with_rounded(xs, cols, |x| {
            split(a, n, ya, |part, out| part.matmul_bf16(x, out));
            split(b, n, yb, |part, out| part.matmul_bf16(x, out));
        });
    }
    matmul(a, xs, ya);
    matmul(b, xs, yb);
}

/// Runs `product(rows, out)` over row blocks of `m` on the pool (or once, whole, when that is not
/// worth it) and gathers the blocks' `[n, r]` outputs into `ys` `[n, rows]`.
fn split(m: &Matrix<'_>, n: usize, ys: &mut [f32], product: impl Fn(&Matrix<'_>, &mut [f32]) + Sync) {
    let (rows, cols) = (m.rows(), m.cols().max(1));
    let Some(per) = rows_per_task(m, rayon::current_num_threads(), n * rows * cols) else {
        return product(m, ys);
    };
    if n == 1 {
        // One vector: each task writes its rows of `ys` in place.
        return ys.par_chunks_mut(per).enumerate().for_each(|(i, yc)| {
            product(&m.rows_view(i * per, yc.len()).expect("row blocks are cuttable"), yc);
        });
    }
    let parts: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(per))
        .into_par_iter()
        .map(|i| {
            let r = per.min(rows - i * per);
            let mut out = vec![0f32; n * r];
            product(&m.rows_view(i * per, r).expect("row blocks are cuttable"), &mut out);
            (i * per, out)
        })
        .collect();
    for (start, out) in parts {
        let r = out.len() / n;
        for (y, o) in ys.chunks_exact_mut(rows).zip(out.chunks_exact(r)) {
            y[start..start + r].copy_from_slice(o);
        }
    }
}
