//! Dense f64 linear algebra the calibrated encoder needs: Cholesky factors, triangular and
//! small symmetric inverses, and `H x` for a block of rows. Written for the sizes at hand (K3's
//! `cols x cols` matrices are 100 MB): along rows, and a block of rows at a time.

/// Rows encoded side by side, so the `cols x cols` matrices they read are read once per block
/// (streamed per row, they bound a whole pass by memory: docs/EFFICIENCY.md).
pub(super) const ROW_BLOCK: usize = 16;

/// `H x_r` for a block of vectors: `xt` holds them transposed (`xt[j * n + r]` is vector `r`'s
/// entry `j`) and `out[i * n + r]` gets `sum_j h_ij x_rj`, summed in `j` order like a plain dot
/// product. The vectors run side by side in the inner loop (independent sums the compiler puts
/// in lanes), where one dot product at a time waits on each add.
pub(super) fn products(h: &[f64], cols: usize, xt: &[f64], out: &mut [f64]) {
    let n = xt.len() / cols.max(1);
    for (hrow, o) in h.chunks_exact(cols).zip(out.chunks_exact_mut(n)) {
        o.fill(0.0);
        for (&hij, xj) in hrow.iter().zip(xt.chunks_exact(n)) {
            o.iter_mut().zip(xj).for_each(|(o, x)| *o += hij * x);
        }
    }
}

/// Rows `[n, cols]` transposed to `[cols, n]`, as f64.
pub(super) fn transposed<T: Copy + Into<f64>>(rows: &[T], cols: usize) -> Vec<f64> {
    let n = rows.len() / cols.max(1);
    let mut t = vec![0f64; rows.len()];
    for (r, row) in rows.chunks_exact(cols).enumerate() {
        for (j, v) in row.iter().enumerate() {
            t[j * n + r] = (*v).into();
        }
    }
    t
}

/// The inverse of a symmetric positive definite `n x n` matrix, as `L^-T L^-1` from its Cholesky
/// factor `L`; `None` if it is not positive definite. For small blocks (it walks columns).
pub(super) fn spd_inverse(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let li = lower_inverse(&cholesky_lower(a, n)?, n);
    let mut inv = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (i..n).map(|k| li[k * n + i] * li[k * n + j]).sum();
            inv[i * n + j] = s;
            inv[j * n + i] = s;
        }
    }
    Some(inv)
}

/// `L^-1` of a lower triangular `L` with a nonzero diagonal, row by row: row `i` of `L M = I`
/// gives `M_i = (e_i - sum_{k<i} L_ik M_k) / L_ii`, and `M_k` is zero past column `k`.
pub(super) fn lower_inverse(l: &[f64], n: usize) -> Vec<f64> {
    let mut m = vec![0f64; n * n];
    for i in 0..n {
        let (done, rest) = m.split_at_mut(i * n);
        let row = &mut rest[..=i];
        row[i] = 1.0;
        for (k, &c) in l[i * n..i * n + i].iter().enumerate() {
            if c != 0.0 {
                row[..=k].iter_mut().zip(&done[k * n..=k * n + k]).for_each(|(r, v)| *r -= c * v);
            }
        }
        let d = l[i * n + i];
        row.iter_mut().for_each(|r| *r /= d);
    }
    m
}

pub(super) fn cholesky_lower(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            if i == j {
                if s <= 0.0 {
                    return None;
                }
                l[i * n + i] = s.sqrt();
            } else {
                l[i * n + j] = s / l[j * n + j];
            }
        }
    }
    Some(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block products are each row's plain dot products, bit for bit (same `j` order), for
    /// a block size that does not fill the lanes.
    #[test]
    fn products_are_plain_dot_products() {
        let (cols, n) = (37, 5);
        let h: Vec<f64> = crate::rng::noise(cols * cols, 1, 1.0).iter().map(|v| f64::from(*v)).collect();
        let rows = crate::rng::noise(n * cols, 2, 1.0);
        let xt = transposed(&rows, cols);
        let mut out = vec![0f64; n * cols];
        products(&h, cols, &xt, &mut out);
        for (r, row) in rows.chunks_exact(cols).enumerate() {
            for i in 0..cols {
                let mut want = 0f64;
                for j in 0..cols {
                    want += h[i * cols + j] * f64::from(row[j]);
                }
                assert_eq!(out[i * n + r].to_bits(), want.to_bits(), "row {r}, entry {i}");
                assert_eq!(xt[i * n + r], f64::from(row[i]));
            }
        }
    }

    /// `L L^-1 = I` for a random well-conditioned lower triangular `L`.
    #[test]
    fn lower_inverse_inverts() {
        let n = 11;
        let noise = crate::rng::noise(n * n, 3, 0.3);
        let l: Vec<f64> = (0..n * n)
            .map(|ij| match (ij / n, ij % n) {
                (i, j) if j < i => f64::from(noise[ij]),
                (i, j) if j == i => 1.0 + f64::from(noise[ij]).abs(),
                _ => 0.0,
            })
            .collect();
        let m = lower_inverse(&l, n);
        for i in 0..n {
            for j in 0..n {
                let s: f64 = (0..n).map(|k| l[i * n + k] * m[k * n + j]).sum();
                assert!((s - f64::from(u8::from(i == j))).abs() < 1e-12, "({i}, {j}): {s}");
            }
        }
    }
}
