//! The scalar products: the oracle of the SIMD kernels (exact integers, so equal to the bit).

use super::BLOCK;

/// `a` `[m, k4]`, `keys` packed `[k4 / 4][BLOCK][4]`, `out` `[m, n]`.
pub fn scores(a: &[i8], keys: &[i8], k4: usize, n: usize, out: &mut [i32]) {
    for (ar, or) in a.chunks_exact(k4).zip(out.chunks_exact_mut(n.max(1))) {
        for (j, o) in or.iter_mut().enumerate().take(n) {
            *o = (0..k4).map(|t| i32::from(ar[t]) * i32::from(keys[((t / 4) * BLOCK + j) * 4 + t % 4])).sum();
        }
    }
}

/// `w` `[m, BLOCK]`, `values` packed `[BLOCK / 4][k][4]`, `out` `[m, k]`.
pub fn weighted(w: &[u8], values: &[i8], k: usize, out: &mut [i32]) {
    weighted_cols(w, values, k, 0..w.len() / BLOCK, 0..k, out)
}

/// Rows `rows`, columns `cols` of [`weighted`] (also the SIMD kernels' columns past their last
/// whole register).
pub(super) fn weighted_cols(
    w: &[u8],
    values: &[i8],
    k: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: &mut [i32],
) {
    for i in rows {
        for t in cols.clone() {
            out[i * k + t] = (0..BLOCK)
                .map(|j| i32::from(w[i * BLOCK + j]) * i32::from(values[((j / 4) * k + t) * 4 + j % 4]))
                .sum();
        }
    }
}
