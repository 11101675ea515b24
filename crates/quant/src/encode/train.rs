//! Training additive codebooks: residual k-means to start, then rounds of joint refinement
//! (re-encode every vector, [`super::search`], refit all codebooks at once by least squares).
//! Distances may be weighted per dimension (activation importance).
//!
//! A code of `S` stages reconstructs a `D`-vector as `sum_s C_s[code_s]`; both VQ codecs are
//! of this form (the fast-scan 3x16x4 and the residual 3x256x8), with different sizes.

use rayon::prelude::*;

use super::distance::{Data, dist};

/// `stages x entries x dim` codebook values.
#[derive(Debug, Clone, PartialEq)]
pub struct Codebooks {
    pub stages: usize,
    pub entries: usize,
    pub dim: usize,
    pub values: Vec<f32>,
}

impl Codebooks {
    pub fn entry(&self, stage: usize, e: usize) -> &[f32] {
        &self.values[(stage * self.entries + e) * self.dim..][..self.dim]
    }

    /// The values as `[stage][dim][entry]`: a stage's distances to all its entries are then
    /// loops over contiguous entries (vectorized by the compiler).
    pub fn transposed(&self) -> Vec<f32> {
        let (s_n, e_n, d) = (self.stages, self.entries, self.dim);
        let mut soa = vec![0f32; s_n * d * e_n];
        for s in 0..s_n {
            for e in 0..e_n {
                for (j, v) in self.entry(s, e).iter().enumerate() {
                    soa[(s * d + j) * e_n + e] = *v;
                }
            }
        }
        soa
    }
}

/// The nearest centroid of `cent` (`[k, dim]`) to every vector (the first of equals), in tasks
/// of 1,024 vectors. With 16 centroids, [`super::nearest`]: [`super::distance::stage_dists_n`]'s 16-lane loops
/// over transposed centroids (the same sums in the same order as [`dist`]: the same bits).
fn nearest_all(data: Data<'_>, cent: &[f32], assign: &mut [u32]) {
    const TASK: usize = 1024;
    let d = data.dim;
    let soa: Option<Vec<f32>> = (cent.len() == 16 * d).then(|| {
        let mut soa = vec![0f32; 16 * d];
        for (e, c) in cent.chunks_exact(d).enumerate() {
            for (j, v) in c.iter().enumerate() {
                soa[j * 16 + e] = *v;
            }
        }
        soa
    });
    assign.par_chunks_mut(TASK).enumerate().for_each(|(t, a)| {
        if let Some(soa) = &soa {
            return super::nearest::nearest16(data, t * TASK, soa, a);
        }
        for (k, a) in a.iter_mut().enumerate() {
            let (v, w) = (data.vec(t * TASK + k), data.weight(t * TASK + k));
            let mut best = (f32::INFINITY, 0);
            for (c, cv) in cent.chunks_exact(d).enumerate() {
                let e = dist(v, cv, w);
                if e < best.0 {
                    best = (e, c);
                }
            }
            *a = best.1 as u32;
        }
    });
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Weighted Lloyd k-means on `data`, initialized from distinct random vectors.
fn kmeans(data: Data<'_>, k: usize, iters: usize, seed: u64) -> Vec<f32> {
    let (n, d) = (data.len(), data.dim);
    let mut next = rng(seed);
    let mut cent: Vec<f32> = (0..k).flat_map(|_| data.vec((next() % n as u64) as usize).to_vec()).collect();
    let mut assign = vec![0u32; n];
    for _ in 0..iters {
        nearest_all(data, &cent, &mut assign);
        let mut sum = vec![0f64; k * d];
        let mut wsum = vec![0f64; k * d];
        for (i, &a) in assign.iter().enumerate() {
            let v = data.vec(i);
            for j in 0..d {
                let w = data.weight(i).map_or(1.0, |w| f64::from(w[j]));
                sum[a as usize * d + j] += w * f64::from(v[j]);
                wsum[a as usize * d + j] += w;
            }
        }
        for c in 0..k {
            if wsum[c * d..(c + 1) * d].iter().all(|w| *w == 0.0) {
                // An empty cluster restarts at a random vector.
                cent[c * d..(c + 1) * d].copy_from_slice(data.vec((next() % n as u64) as usize));
                continue;
            }
            for j in 0..d {
                if wsum[c * d + j] > 0.0 {
                    cent[c * d + j] = (sum[c * d + j] / wsum[c * d + j]) as f32;
                }
            }
        }
    }
    cent
}

/// A strided subsample of at most `max` vectors (with their weights).
pub fn subsample(data: Data<'_>, max: usize) -> (Vec<f32>, Option<Vec<f32>>) {
    let n = data.len();
    let step = n.div_ceil(max).max(1);
    let pick = |src: &[f32]| -> Vec<f32> {
        (0..n).step_by(step).flat_map(|i| src[i * data.dim..][..data.dim].to_vec()).collect()
    };
    (pick(data.vecs), data.weights.map(pick))
}

/// Residual k-means: stage s is k-means on what stages before it left.
pub fn init_residual(data: Data<'_>, stages: usize, entries: usize, iters: usize, seed: u64) -> Codebooks {
    let (mut res, w) = (data.vecs.to_vec(), data.weights);
    let d = data.dim;
    let mut values = Vec::with_capacity(stages * entries * d);
    let mut assign = vec![0u32; res.len() / d.max(1)];
    for s in 0..stages {
        let sub = Data { dim: d, vecs: &res, weights: w };
        let cent = kmeans(sub, entries, iters, seed.wrapping_add(s as u64));
        nearest_all(Data { dim: d, vecs: &res, weights: w }, &cent, &mut assign);
        res.par_chunks_exact_mut(d).zip(&assign).for_each(|(r, &best)| {
            for (x, c) in r.iter_mut().zip(&cent[best as usize * d..][..d]) {
                *x -= c;
            }
        });
        values.extend_from_slice(&cent);
    }
    Codebooks { stages, entries, dim: d, values }
}

/// Refits all codebooks jointly for fixed codes: per dimension, weighted least squares over the
/// `stages x entries` unknowns, with a small ridge that keeps unused entries where they were.
pub fn refit(data: Data<'_>, codes: &[u16], cb: &mut Codebooks) {
    let (s_n, e_n, d) = (cb.stages, cb.entries, cb.dim);
    let m = s_n * e_n;
    for j in 0..d {
        let mut g = vec![0f64; m * m];
        let mut rhs = vec![0f64; m];
        for i in 0..data.len() {
            let w = data.weight(i).map_or(1.0, |w| f64::from(w[j]));
            let cs = &codes[i * s_n..][..s_n];
            let v = f64::from(data.vec(i)[j]);
            for s in 0..s_n {
                let p = s * e_n + usize::from(cs[s]);
                rhs[p] += w * v;
                for t in 0..s_n {
                    g[p * m + t * e_n + usize::from(cs[t])] += w;
                }
            }
        }
        let diag_mean = (0..m).map(|p| g[p * m + p]).sum::<f64>() / m as f64;
        let ridge = 1e-6 * diag_mean.max(1e-12);
        for p in 0..m {
            g[p * m + p] += ridge;
            rhs[p] += ridge * f64::from(cb.values[p * d + j]);
        }
        if let Some(x) = cholesky_solve(&mut g, &mut rhs, m) {
            for (p, v) in x.iter().enumerate() {
                cb.values[p * d + j] = *v as f32;
            }
        }
    }
}

/// Solves `G x = b` for symmetric positive definite `G` (overwritten); `None` if not SPD.
fn cholesky_solve(g: &mut [f64], b: &mut [f64], m: usize) -> Option<Vec<f64>> {
    for c in 0..m {
        let mut diag = g[c * m + c];
        for k in 0..c {
            diag -= g[c * m + k] * g[c * m + k];
        }
        if diag <= 0.0 {
            return None;
        }
        let l = diag.sqrt();
        g[c * m + c] = l;
        for r in c + 1..m {
            let mut v = g[r * m + c];
            for k in 0..c {
                v -= g[r * m + k] * g[c * m + k];
            }
            g[r * m + c] = v / l;
        }
    }
    for r in 0..m {
        let mut v = b[r];
        for k in 0..r {
            v -= g[r * m + k] * b[k];
        }
        b[r] = v / g[r * m + r];
    }
    for r in (0..m).rev() {
        let mut v = b[r];
        for k in r + 1..m {
            v -= g[k * m + r] * b[k];
        }
        b[r] = v / g[r * m + r];
    }
    Some(b.to_vec())
}

/// Reconstructs vector `i` from its codes into `out`.
pub fn reconstruct(cb: &Codebooks, codes: &[u16], out: &mut [f32]) {
    out.fill(0.0);
    for (s, &c) in codes.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(cb.entry(s, usize::from(c))) {
            *o += v;
        }
    }
}

/// [`reconstruct`] for consecutive vectors: `codes` has `stages` entries for each `dim` of `out`
/// (whole rows of a matrix, in the encoder's layout).
pub fn reconstruct_all(cb: &Codebooks, codes: &[u16], out: &mut [f32]) {
    for (o, c) in out.chunks_exact_mut(cb.dim).zip(codes.chunks_exact(cb.stages)) {
        reconstruct(cb, c, o);
    }
}
