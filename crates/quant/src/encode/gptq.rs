//! GPTQ-style encoding with calibration inputs: each chunk's error pushed onto the columns not
//! yet encoded through the factor of the inputs' second-moment matrix.

use rayon::prelude::*;

use super::linalg::{Mat, cholesky_lower, gemm, lower_inverse};
use super::search::Searcher;
use super::train::{Codebooks, reconstruct};

/// The GPTQ factor for a second-moment matrix `h` (`n x n`, row-major, overwritten): the upper
/// triangular `U` with `(H + damp I)^-1 = U^T U`, where `damp` is `rel_damp` times the mean
/// diagonal. `None` if `h` is not positive definite even after damping.
pub fn gptq_factor(h: &mut [f64], n: usize, rel_damp: f64) -> Option<Vec<f64>> {
    let mean_diag = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
    for i in 0..n {
        h[i * n + i] += rel_damp * mean_diag.max(1e-12);
    }
    // With J the order-reversing permutation, J H J = K K^T (K lower) gives H = R R^T for the
    // upper R = J K J, so H^-1 = R^-T R^-1 and U = R^-1 = J K^-1 J: one Cholesky and one
    // triangular inverse, both along rows (the inverse-then-Cholesky way walked columns of
    // n x n matrices: 207 core-seconds for K3's 3,584 columns, docs/EFFICIENCY.md). `J A J` of
    // a row-major matrix is its values in reverse order.
    let reversed: Vec<f64> = h.iter().rev().copied().collect();
    let k = cholesky_lower(&reversed, n)?;
    let mut u = lower_inverse(&k, n);
    u.reverse();
    Some(u)
}

/// Columns whose error feedback is gathered before it is pushed on (GPTQ's "lazy batch"): within
/// a block each chunk updates only the block's later columns; the block's errors then reach every
/// column right of it in one product (`gemm`): the same updates, summed in another order.
const COL_BLOCK: usize = 128;
/// Rows a worker encodes side by side (the rows of that product).
const ROWS: usize = 128;

/// GPTQ-style encoding (as in GPTVQ): each row is encoded chunk by chunk from left to right;
/// the error of a chunk, `E = (w_b - q_b) U_bb^-1`, is pushed onto the columns not yet encoded,
/// `w_rest -= E U_b,rest`, so later chunks compensate for it in the output `W x`. `w` holds the
/// rows (`cols` wide) and is overwritten; `u` comes from [`gptq_factor`]. Within a chunk the
/// distance weighs column `j` by `1 / U_jj^2`: the error feedback leaves a chunk's error costing
/// `|(w_b - q_b) U_bb^-1|^2` at the outputs, whose diagonal this is (OBQ's loss; on the default
/// model it gave KL 0.00066 against 0.00069 for weighing by `E[x_j^2]`, mean of four draws).
pub fn gptq_encode(w: &mut [f32], cols: usize, u: &[f32], cb: &Codebooks, beam: usize, codes: &mut Vec<u16>) {
    let (d, s_n) = (cb.dim, cb.stages);
    let chunks = cols / d;
    let weights: Vec<f32> = (0..cols).map(|j| 1.0 / (u[j * cols + j] * u[j * cols + j])).collect();
    codes.resize(w.len() / d * s_n, 0);
    let width = (COL_BLOCK / d).max(1) * d;
    // One searcher per worker, kept across its rows (its weighted tables are per column); a
    // chunk's vectors of all the worker's rows are searched in one call.
    let init = || {
        let searcher = Searcher::for_codebooks(cb);
        (searcher, vec![0f32; d], vec![0f32; ROWS * d], vec![0u16; ROWS * s_n], vec![0f32; ROWS * width])
    };
    let blocks = w.par_chunks_mut(cols * ROWS).zip(codes.par_chunks_mut(chunks * s_n * ROWS));
    blocks.for_each_init(init, |(searcher, q, vs, found, es), (rows, outs)| {
        let n = rows.len() / cols;
        for b0 in (0..cols).step_by(width) {
            let b1 = (b0 + width).min(cols);
            let bw = b1 - b0;
            for k in b0 / d..b1 / d {
                let c0 = k * d;
                for (v, row) in vs.chunks_exact_mut(d).zip(rows.chunks_exact(cols)) {
                    v.copy_from_slice(&row[c0..c0 + d]);
                }
                searcher.encode_many(&vs[..n * d], Some(&weights[c0..c0 + d]), cb, beam, &mut found[..n * s_n]);
                for (r, (row, one)) in rows.chunks_exact_mut(cols).zip(found.chunks_exact(s_n)).enumerate() {
                    reconstruct(cb, one, q);
                    outs[(r * chunks + k) * s_n..][..s_n].copy_from_slice(one);
                    // Solve e U_bb = (w_b - q_b) for the row vector e (U_bb upper triangular).
                    let e = &mut es[r * bw + c0 - b0..][..d];
                    for j in 0..d {
                        let mut v = row[c0 + j] - q[j];
                        for i in 0..j {
                            v -= e[i] * u[(c0 + i) * cols + c0 + j];
                        }
                        e[j] = v / u[(c0 + j) * cols + c0 + j];
                    }
                    for (i, ei) in e.iter().enumerate() {
                        let urow = &u[(c0 + i) * cols + c0 + d..(c0 + i) * cols + b1];
                        row[c0 + d..b1].iter_mut().zip(urow).for_each(|(wv, uv)| *wv -= ei * uv);
                    }
                }
            }
            if b1 < cols {
                let (e, rest) = (Mat::new(&es[..], n, bw, bw), Mat::new(&u[b0 * cols + b1..], bw, cols - b1, cols));
                gemm(-1.0, e, rest, 1.0, &mut rows[b1..], cols);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gptq_factor_inverts_the_damped_matrix() {
        // A Toeplitz matrix, and `A A^T + I` for a random A (not the same read backwards, so
        // the factor's reversal is exercised).
        let n = 5;
        let mut toeplitz = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                toeplitz[i * n + j] = 1.0 / (1.0 + (i as f64 - j as f64).abs()) + if i == j { 1.0 } else { 0.0 };
            }
        }
        check_factor(toeplitz, n);
        let n = 13;
        let a = crate::rng::noise(n * n, 9, 1.0);
        let random: Vec<f64> = (0..n * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                (0..n).map(|k| f64::from(a[i * n + k]) * f64::from(a[j * n + k])).sum::<f64>()
                    + f64::from(u8::from(i == j))
            })
            .collect();
        check_factor(random, n);
    }

    fn check_factor(mut h: Vec<f64>, n: usize) {
        let orig = h.clone();
        let u = gptq_factor(&mut h, n, 0.01).unwrap();
        let damp = 0.01 * (0..n).map(|i| orig[i * n + i]).sum::<f64>() / n as f64;
        // (H + damp I) U^T U = I.
        for i in 0..n {
            for j in 0..n {
                let mut s = 0.0;
                for k in 0..n {
                    let utu: f64 = (0..n).map(|m| u[m * n + k] * u[m * n + j]).sum();
                    s += (orig[i * n + k] + if i == k { damp } else { 0.0 }) * utu;
                }
                assert!((s - if i == j { 1.0 } else { 0.0 }).abs() < 1e-9, "({i}, {j}): {s}");
            }
            for j in 0..i {
                assert_eq!(u[i * n + j], 0.0, "U is upper triangular");
            }
        }
    }
}
