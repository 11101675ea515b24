//! Dense f64 linear algebra the calibrated encoder needs: Cholesky factors, triangular and
//! small symmetric inverses, and `H x` for a block of rows. Written for the sizes at hand (K3's
//! `cols x cols` matrices are 100 MB): along rows, and a block of rows at a time.

/// Rows encoded side by side, so the `cols x cols` matrices they read are read once per block
/// (streamed per row, they bound a whole pass by memory: docs/EFFICIENCY.md).
pub(super) const ROW_BLOCK: usize = 128;

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

/// Rows and columns a blocked factorization takes at a time: its updates are products of
/// `NB`-wide panels (`gemm`), where the unblocked loops ran at a tenth of a core's peak.
const NB: usize = 128;

/// `L^-1` of a lower triangular `L` with a nonzero diagonal, a block of `NB` rows at a time: row
/// block `I` of `L M = I` gives `M_I,<I = -L_II^-1 (L_I,<I M_<I,<I)` and `M_II = L_II^-1`.
pub(super) fn lower_inverse(l: &[f64], n: usize) -> Vec<f64> {
    let mut m = vec![0f64; n * n];
    for i0 in (0..n).step_by(NB) {
        let nb = NB.min(n - i0);
        let diag: Vec<f64> = (0..nb * nb).map(|x| l[(i0 + x / nb) * n + i0 + x % nb]).collect();
        let dinv = lower_inverse_small(&diag, nb);
        let (done, rest) = m.split_at_mut(i0 * n);
        if i0 > 0 {
            // t = L_I,<I M_<I,<I, a block column at a time from its diagonal down (`M` is lower
            // triangular: the whole product did twice the work).
            let mut t = vec![0f64; nb * i0];
            for c0 in (0..i0).step_by(NB) {
                let c1 = (c0 + NB).min(i0);
                let lrow = Mat::new(&l[i0 * n + c0..], nb, i0 - c0, n);
                let mcol = Mat::new(&done[c0 * n + c0..], i0 - c0, c1 - c0, n);
                gemm(1.0, lrow, mcol, 0.0, &mut t[c0..], i0);
            }
            gemm(-1.0, Mat::new(&dinv, nb, nb, nb), Mat::new(&t, nb, i0, i0), 0.0, rest, n);
        }
        for r in 0..nb {
            rest[r * n + i0..][..nb].copy_from_slice(&dinv[r * nb..][..nb]);
        }
    }
    m
}

/// [`lower_inverse`] of one block, row by row: row `i` of `L M = I` gives
/// `M_i = (e_i - sum_{k<i} L_ik M_k) / L_ii`, and `M_k` is zero past column `k`.
fn lower_inverse_small(l: &[f64], n: usize) -> Vec<f64> {
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

/// The lower Cholesky factor `L` of a symmetric `n x n` matrix (`a = L L^T`, read from its lower
/// triangle), `NB` columns at a time: the diagonal block factored, the panel below it solved
/// (`A_panel L_jj^-T`, one `gemm`: solved row by row it was half the factorization's time), the
/// rest of the lower triangle updated by the panel's product with itself (`gemm`). `None` if `a`
/// is not positive definite.
pub(super) fn cholesky_lower(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = a.to_vec();
    for j0 in (0..n).step_by(NB) {
        let j1 = (j0 + NB).min(n);
        let (nb, below) = (j1 - j0, n - j1);
        for i in j0..j1 {
            for j in j0..=i {
                let s = l[i * n + j] - (j0..j).map(|k| l[i * n + k] * l[j * n + k]).sum::<f64>();
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
        if below > 0 {
            let diag: Vec<f64> = (0..nb * nb).map(|x| l[(j0 + x / nb) * n + j0 + x % nb]).collect();
            let dinv = lower_inverse_small(&diag, nb);
            let rows: Vec<f64> = (0..below * nb).map(|x| l[(j1 + x / nb) * n + j0 + x % nb]).collect();
            let (rows, dinv_t) = (Mat::new(&rows, below, nb, nb), Mat::new(&dinv, nb, nb, nb).t());
            gemm(1.0, rows, dinv_t, 0.0, &mut l[j1 * n + j0..], n);
        }
        // The trailing lower triangle minus the panel's product with itself, a strip of rows at
        // a time (each strip only up to its own last column).
        let panel: Vec<f64> = (0..below * nb).map(|x| l[(j1 + x / nb) * n + j0 + x % nb]).collect();
        for i0 in (0..below).step_by(NB) {
            let i1 = (i0 + NB).min(below);
            let strip = Mat::new(&panel[i0 * nb..], i1 - i0, nb, nb);
            let upto = Mat::new(&panel, i1, nb, nb).t();
            gemm(-1.0, strip, upto, 1.0, &mut l[(j1 + i0) * n + j1..], n);
        }
    }
    for i in 0..n {
        l[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
    Some(l)
}

/// `g += sum_a deltas[a] * rows[a]` for `deltas.len()` consecutive rows of `cols` values
/// (`rows`, row-major): descent's update of `H e` when a chunk's error changes. In f32: `g`
/// starts from an f32 product anyway, and half the bytes of `H`'s rows and of `g` is what the
/// update waits on (a quarter of the calibrated encoder's time as plain f64 loops).
pub(super) fn add_rows(g: &mut [f32], rows: &[f32], deltas: &[f32]) {
    add_rows_at(crate::cpu::level(), g, rows, deltas)
}

pub(super) fn add_rows_at(level: crate::cpu::Level, g: &mut [f32], rows: &[f32], deltas: &[f32]) {
    use crate::cpu::{Level, supported};
    assert_eq!(rows.len(), g.len() * deltas.len(), "add_rows: one row of g's width per delta");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; the lengths are
        // checked above.
        Level::Avx2 => unsafe { simd::add_rows::<false>(g, rows, deltas) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, and Avx512 only when the CPU has AVX-512 F.
        Level::Avx512 => unsafe { simd::add_rows::<true>(g, rows, deltas) },
        Level::Scalar => add_rows_reference(g, rows, deltas),
    }
}

/// [`add_rows`]' scalar reference: each entry's terms in row order, each fused (as the SIMD
/// FMAs are, so every level gives the same bits).
fn add_rows_reference(g: &mut [f32], rows: &[f32], deltas: &[f32]) {
    let cols = g.len();
    for (j, gv) in g.iter_mut().enumerate() {
        for (a, d) in deltas.iter().enumerate() {
            *gv = d.mul_add(rows[a * cols + j], *gv);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Sixteen entries of `g` at a time (AVX-512, `WIDE`) or eight (AVX2), every row's term
    /// added with an FMA, in row order; the tail like the reference.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA (and AVX-512 F if `WIDE`); `rows.len() == g.len() * deltas.len()`.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn add_rows<const WIDE: bool>(g: &mut [f32], rows: &[f32], deltas: &[f32]) {
        let cols = g.len();
        let mut j = 0;
        if WIDE {
            while j + 16 <= cols {
                // SAFETY: j + 16 <= cols, and row a's entries j..j + 16 lie inside `rows`
                // (checked length).
                unsafe {
                    let mut acc = _mm512_loadu_ps(g.as_ptr().add(j));
                    for (a, &d) in deltas.iter().enumerate() {
                        let h = _mm512_loadu_ps(rows.as_ptr().add(a * cols + j));
                        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), h, acc);
                    }
                    _mm512_storeu_ps(g.as_mut_ptr().add(j), acc);
                }
                j += 16;
            }
        }
        while j + 8 <= cols {
            // SAFETY: as above, for 8 entries.
            unsafe {
                let mut acc = _mm256_loadu_ps(g.as_ptr().add(j));
                for (a, &d) in deltas.iter().enumerate() {
                    let h = _mm256_loadu_ps(rows.as_ptr().add(a * cols + j));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), h, acc);
                }
                _mm256_storeu_ps(g.as_mut_ptr().add(j), acc);
            }
            j += 8;
        }
        for j in j..cols {
            for (a, d) in deltas.iter().enumerate() {
                g[j] = d.mul_add(rows[a * cols + j], g[j]);
            }
        }
    }
}

/// A matrix view into a slice: entry `(i, j)` at `data[i * rs + j * cs]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mat<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// Row-major, `stride` values from one row's start to the next.
    pub(super) fn new(data: &'a [T], rows: usize, cols: usize, stride: usize) -> Self {
        Mat { data, rows, cols, rs: stride, cs: 1 }
    }

    /// The transpose (the same values).
    pub(super) fn t(self) -> Self {
        Mat { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// One past the largest index read; 0 when empty.
    fn extent(&self) -> usize {
        if self.rows == 0 || self.cols == 0 { 0 } else { (self.rows - 1) * self.rs + (self.cols - 1) * self.cs + 1 }
    }
}

/// The element types `gemm` multiplies (matrixmultiply's `sgemm` and `dgemm`).
pub(super) trait Gemm: Copy {
    /// # Safety
    /// As `matrixmultiply::dgemm`: every index the strides reach is inside its allocation, and
    /// `c` does not overlap `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        beta: Self,
        c: *mut Self,
        ldc: usize,
    );
}

macro_rules! impl_gemm {
    ($t:ty, $f:path) => {
        impl Gemm for $t {
            unsafe fn raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: $t,
                a: Mat<'_, $t>,
                b: Mat<'_, $t>,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                let s = |v: usize| v as isize;
                // SAFETY: the caller's contract, passed on.
                unsafe {
                    $f(
                        m,
                        k,
                        n,
                        alpha,
                        a.data.as_ptr(),
                        s(a.rs),
                        s(a.cs),
                        b.data.as_ptr(),
                        s(b.rs),
                        s(b.cs),
                        beta,
                        c,
                        s(ldc),
                        1,
                    )
                }
            }
        }
    };
}
impl_gemm!(f32, matrixmultiply::sgemm);
impl_gemm!(f64, matrixmultiply::dgemm);

/// `c = alpha a b + beta c`, `c` row-major with rows `ldc` apart, by matrixmultiply's blocked
/// kernels (~150 / 75 GFLOP/s a core here in f32 / f64, against ~5 for the loops they replace:
/// docs/EFFICIENCY.md). The shapes are the encoder's own, never a file's: a mismatch is a bug.
pub(super) fn gemm<T: Gemm>(alpha: T, a: Mat<'_, T>, b: Mat<'_, T>, beta: T, c: &mut [T], ldc: usize) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "gemm: inner dimensions differ");
    assert!(a.extent() <= a.data.len() && b.extent() <= b.data.len(), "gemm: a view runs past its slice");
    assert!(m == 0 || n == 0 || (m - 1) * ldc + n <= c.len(), "gemm: the output runs past its slice");
    assert!(n <= ldc || m <= 1, "gemm: output rows overlap");
    // SAFETY: the asserts above keep every index inside `a`, `b` and `c`; `c` is borrowed
    // mutably, so it overlaps neither.
    unsafe { T::raw(m, k, n, alpha, a, b, beta, c.as_mut_ptr(), ldc) }
}

/// `E[x x^T]` of `n` vectors (`xs`, `[n, cols]`), `cols x cols`: the lower triangle in strips of
/// rows (`gemm` of the inputs' columns with themselves, in f32: twice the f64 rate, its sums to
/// ~1e-6, far inside the 1% damping added to the diagonal), widened, then mirrored.
pub(super) fn second_moment(xs: &[f32], cols: usize) -> Vec<f64> {
    use rayon::prelude::*;
    let n = xs.len() / cols.max(1);
    let mut h = vec![0f32; cols * cols];
    let x = Mat::new(xs, n, cols, cols);
    h.par_chunks_mut(cols * NB).enumerate().for_each(|(s, strip)| {
        let (i0, rows) = (s * NB, strip.len() / cols);
        let xi = Mat::new(&xs[i0..], n, rows, cols).t();
        let upto = Mat { cols: i0 + rows, ..x };
        gemm(1.0 / n.max(1) as f32, xi, upto, 0.0, strip, cols);
    });
    let mut out = vec![0f64; cols * cols];
    for i in 0..cols {
        for j in 0..=i {
            let v = f64::from(h[i * cols + j]);
            out[i * cols + j] = v;
            out[j * cols + i] = v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gemm` against plain triple loops, through offset, strided and transposed views, with
    /// `beta` keeping what the output held.
    #[test]
    fn gemm_is_the_plain_product() {
        let (m, k, n) = (7, 300, 9);
        let a = crate::rng::noise(m * (k + 3), 1, 1.0);
        let b = crate::rng::noise(n * k, 2, 1.0);
        let mut c = crate::rng::noise(m * 12, 3, 1.0);
        let before = c.clone();
        // a: rows of k values 3 apart from an offset; b: stored transposed (n x k).
        gemm(2.0, Mat::new(&a[1..], m, k, k + 3), Mat::new(&b, n, k, k).t(), 0.5, &mut c, 12);
        for i in 0..m {
            for j in 0..12 {
                let want = if j < n {
                    2.0 * (0..k).map(|x| f64::from(a[1 + i * (k + 3) + x]) * f64::from(b[j * k + x])).sum::<f64>()
                        + 0.5 * f64::from(before[i * 12 + j])
                } else {
                    f64::from(before[i * 12 + j])
                };
                assert!((f64::from(c[i * 12 + j]) - want).abs() < 1e-3, "({i}, {j}): {} vs {want}", c[i * 12 + j]);
            }
        }
    }

    /// The blocked Cholesky factor (several blocks and a partial one) multiplies back to the
    /// matrix, and a matrix that is not positive definite is refused.
    #[test]
    fn blocked_cholesky_factors() {
        let n = 2 * NB + 37;
        let x = crate::rng::noise(2 * n * n, 5, 1.0);
        let h = second_moment(&x, n);
        // The second moments are the plain averages (to f32's sums), symmetric.
        for (i, j) in [(0, 0), (5, 3), (n - 1, 2), (NB + 1, NB - 1), (n - 1, n - 1)] {
            let want: f64 = x.chunks_exact(n).map(|r| f64::from(r[i]) * f64::from(r[j])).sum::<f64>() / (2 * n) as f64;
            assert!((h[i * n + j] - want).abs() < 1e-5 * (1.0 + want.abs()), "({i}, {j}): {} vs {want}", h[i * n + j]);
            assert_eq!(h[i * n + j], h[j * n + i]);
        }
        let l = cholesky_lower(&h, n).unwrap();
        for i in (0..n).step_by(7) {
            for j in 0..n {
                let s: f64 = (0..n).map(|k| l[i * n + k] * l[j * n + k]).sum();
                assert!((s - h[i * n + j]).abs() < 1e-9, "({i}, {j}): {s} vs {}", h[i * n + j]);
            }
        }
        let mut bad = h.clone();
        bad[(n - 1) * n + n - 1] = -1.0;
        assert!(cholesky_lower(&bad, n).is_none());
    }

    /// The SIMD row update is the reference's, bit for bit (both fuse each term), for widths
    /// with and without 16- and 8-wide tails.
    #[test]
    fn add_rows_levels_agree() {
        for cols in [3, 8, 37, 61] {
            let rows = crate::rng::noise(4 * cols, 7, 1.0);
            let start = crate::rng::noise(cols, 8, 1.0);
            let deltas = [0.5, -1.25, 2.0, 0.125];
            let mut want = start.clone();
            add_rows_reference(&mut want, &rows, &deltas);
            let plain: Vec<f64> = (0..cols)
                .map(|j| f64::from(start[j]) + (0..4).map(|a| f64::from(deltas[a] * rows[a * cols + j])).sum::<f64>())
                .collect();
            for (w, p) in want.iter().zip(&plain) {
                assert!((f64::from(*w) - p).abs() < 1e-5, "reference {w} vs the plain sum {p}");
            }
            for level in crate::cpu::levels() {
                let mut got = start.clone();
                add_rows_at(level, &mut got, &rows, &deltas);
                assert_eq!(got, want, "{level:?}, {cols} columns");
            }
        }
    }

    /// `L L^-1 = I` for a random well-conditioned lower triangular `L` of three row blocks.
    #[test]
    fn lower_inverse_inverts() {
        let n = 2 * NB + 11;
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
