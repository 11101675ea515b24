//! Training additive codebooks: residual k-means to start, then rounds of joint refinement
//! (re-encode every vector with a beam search, refit all codebooks at once by least squares).
//! Distances may be weighted per dimension (activation importance).
//!
//! A code of `S` stages reconstructs a `D`-vector as `sum_s C_s[code_s]`; both VQ codecs are
//! of this form (the fast-scan 3x16x4 and the residual 3x256x8), with different sizes.

use rayon::prelude::*;

use super::joint::Joint;

/// Vectors to encode: `n x dim` values, with optional per-value weights (same shape).
#[derive(Debug, Clone, Copy)]
pub struct Data<'a> {
    pub dim: usize,
    pub vecs: &'a [f32],
    pub weights: Option<&'a [f32]>,
}

impl Data<'_> {
    pub fn len(&self) -> usize {
        self.vecs.len() / self.dim
    }

    pub fn is_empty(&self) -> bool {
        self.vecs.is_empty()
    }

    fn vec(&self, i: usize) -> &[f32] {
        &self.vecs[i * self.dim..][..self.dim]
    }

    fn weight(&self, i: usize) -> Option<&[f32]> {
        self.weights.map(|w| &w[i * self.dim..][..self.dim])
    }
}

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

#[inline]
fn dist(a: &[f32], b: &[f32], w: Option<&[f32]>) -> f32 {
    match w {
        None => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        Some(w) => a.iter().zip(b).zip(w).map(|((x, y), w)| w * (x - y) * (x - y)).sum(),
    }
}

/// The nearest centroid of `cent` (`[k, dim]`) to every vector (the first of equals), in tasks
/// of 1,024 vectors. With 16 centroids the distances run as [`stage_dists_n`]'s 16-lane loops
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
        for (k, a) in a.iter_mut().enumerate() {
            let (v, w) = (data.vec(t * TASK + k), data.weight(t * TASK + k));
            let mut best = (f32::INFINITY, 0);
            let mut pick = |c: usize, e: f32| {
                if e < best.0 {
                    best = (e, c);
                }
            };
            match &soa {
                Some(soa) => {
                    let mut ds = [0f32; 16];
                    stage_dists_n(v, w, soa, &mut ds);
                    ds.iter().enumerate().for_each(|(c, e)| pick(c, *e));
                }
                None => cent.chunks_exact(d).enumerate().for_each(|(c, cv)| pick(c, dist(v, cv, w))),
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

/// Largest vector dimension and stage count the encoder handles (codecs use 4 or 8 and 3).
pub(crate) const MAX_DIM: usize = 8;
const MAX_STAGES: usize = 8;

/// A partial encoding in the beam search.
#[derive(Debug, Clone, Copy)]
struct Beam {
    err: f32,
    res: [f32; MAX_DIM],
    codes: [u16; MAX_STAGES],
}

/// The widest beam searched (wider requests are narrowed to it).
pub const MAX_BEAM: usize = 64;

/// Reusable memory of the beam search, for one set of codebooks.
#[derive(Debug)]
pub struct Search {
    /// The best candidates of a stage so far, best first: (error, beam, entry).
    cand: [(f32, u32, u32); MAX_BEAM],
    beams: [Beam; MAX_BEAM],
    next: [Beam; MAX_BEAM],
    /// The codebooks transposed ([`Codebooks::transposed`]).
    soa: Vec<f32>,
    dists: Vec<f32>,
}

impl Search {
    /// Memory for searching `cb` (which must not change while this is used).
    pub fn for_codebooks(cb: &Codebooks) -> Self {
        let empty = Beam { err: 0.0, res: [0.0; MAX_DIM], codes: [0; MAX_STAGES] };
        Search {
            cand: [(0.0, 0, 0); MAX_BEAM],
            beams: [empty; MAX_BEAM],
            next: [empty; MAX_BEAM],
            soa: cb.transposed(),
            dists: vec![0f32; cb.entries],
        }
    }
}

/// `dists[e] = sum_j w_j (r_j - c_j)^2` over one stage's entries (`soa`: `[dim][entry]`), summed
/// over `j` in order with the same operations as [`dist`], so the same bits.
fn stage_dists(r: &[f32], w: Option<&[f32]>, soa: &[f32], dists: &mut [f32]) {
    // The fast-scan codec's 16 entries as a fixed-size array: the compiler keeps them in registers.
    if let Ok(d16) = <&mut [f32; 16]>::try_from(&mut *dists) {
        return stage_dists_n(r, w, soa, d16);
    }
    let e_n = dists.len();
    dists.fill(0.0);
    for (j, rj) in r.iter().enumerate() {
        let col = &soa[j * e_n..(j + 1) * e_n];
        match w {
            None => dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += (rj - c) * (rj - c)),
            Some(w) => {
                let wj = w[j];
                dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += wj * (rj - c) * (rj - c));
            }
        }
    }
}

#[inline(always)]
pub(super) fn stage_dists_n<const N: usize>(r: &[f32], w: Option<&[f32]>, soa: &[f32], dists: &mut [f32; N]) {
    *dists = [0.0; N];
    for (j, rj) in r.iter().enumerate() {
        let col: &[f32; N] = soa[j * N..(j + 1) * N].try_into().expect("N entries");
        match w {
            None => dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += (rj - c) * (rj - c)),
            Some(w) => {
                let wj = w[j];
                dists.iter_mut().zip(col).for_each(|(acc, c)| *acc += wj * (rj - c) * (rj - c));
            }
        }
    }
}

/// Beam search over the stages in order for one vector `v` (weights `w`), keeping the `beam` best
/// partial reconstructions; writes the best codes to `out` (`stages` entries).
pub fn encode_vec(v: &[f32], w: Option<&[f32]>, cb: &Codebooks, beam: usize, search: &mut Search, out: &mut [u16]) {
    let (s_n, d) = (cb.stages, cb.dim);
    assert!(d <= MAX_DIM && s_n <= MAX_STAGES, "encoder handles up to {MAX_DIM} dims and {MAX_STAGES} stages");
    let beam = beam.clamp(1, MAX_BEAM);
    let Search { cand, beams, next, soa, dists } = search;
    debug_assert_eq!(soa.len(), s_n * d * cb.entries, "a Search is for its codebooks");
    beams[0] = Beam { err: 0.0, res: [0.0; MAX_DIM], codes: [0; MAX_STAGES] };
    beams[0].res[..d].copy_from_slice(v);
    let mut live = 1;
    for s in 0..s_n - 1 {
        let stage = &soa[s * d * cb.entries..(s + 1) * d * cb.entries];
        // The `beam` best candidates as they come, best first; equal errors keep their order.
        let mut n = 0;
        for (b, bm) in beams[..live].iter().enumerate() {
            stage_dists(&bm.res[..d], w, stage, dists);
            for (e, &err) in dists.iter().enumerate() {
                if n == beam {
                    if err >= cand[beam - 1].0 {
                        continue;
                    }
                    n -= 1;
                }
                let mut i = n;
                while i > 0 && cand[i - 1].0 > err {
                    cand[i] = cand[i - 1];
                    i -= 1;
                }
                cand[i] = (err, b as u32, e as u32);
                n += 1;
            }
        }
        for (slot, &(err, b, e)) in next.iter_mut().zip(&cand[..n]) {
            *slot = beams[b as usize];
            for (r, c) in slot.res[..d].iter_mut().zip(cb.entry(s, e as usize)) {
                *r -= c;
            }
            slot.codes[s] = e as u16;
            slot.err = err;
        }
        live = n;
        std::mem::swap(beams, next);
    }
    // The last stage needs only the best candidate over every beam (the first of equals).
    let s = s_n - 1;
    let stage = &soa[s * d * cb.entries..(s + 1) * d * cb.entries];
    let (mut best, mut at) = (f32::INFINITY, (0, 0));
    for (b, bm) in beams[..live].iter().enumerate() {
        stage_dists(&bm.res[..d], w, stage, dists);
        for (e, &err) in dists.iter().enumerate() {
            if err < best {
                (best, at) = (err, (b, e));
            }
        }
    }
    out.copy_from_slice(&beams[at.0].codes[..s_n]);
    out[s] = at.1 as u16;
}

/// The search one set of codebooks gets: [`Joint`] for 3 x 16-entry codebooks (fast-scan),
/// the stage-by-stage beam ([`encode_vec`]) otherwise.
#[derive(Debug)]
pub enum Searcher {
    Joint(Box<Joint>),
    Beam(Box<Search>),
}

impl Searcher {
    pub fn for_codebooks(cb: &Codebooks) -> Self {
        Joint::new(cb)
            .map_or_else(|| Searcher::Beam(Box::new(Search::for_codebooks(cb))), |j| Searcher::Joint(Box::new(j)))
    }

    /// The codes of `v` (weights `w`) into `out`; `width` is the joint search's first-stage
    /// picks or the beam's width.
    pub fn encode(&mut self, v: &[f32], w: Option<&[f32]>, cb: &Codebooks, width: usize, out: &mut [u16]) {
        match self {
            Searcher::Joint(joint) => joint.encode(v, w, width, out),
            Searcher::Beam(search) => encode_vec(v, w, cb, width, search, out),
        }
    }
}

/// Encodes every vector of `data`, in parallel. `codes` gets `stages` entries per vector.
pub fn encode(data: Data<'_>, cb: &Codebooks, beam: usize, codes: &mut Vec<u16>) {
    // Tasks of 1,024 vectors: per-vector tasks cost rayon's bookkeeping on every vector.
    const TASK: usize = 1024;
    codes.resize(data.len() * cb.stages, 0);
    codes.par_chunks_mut(TASK * cb.stages).enumerate().for_each_init(
        || Searcher::for_codebooks(cb),
        |searcher, (t, outs)| {
            for (k, out) in outs.chunks_exact_mut(cb.stages).enumerate() {
                let i = t * TASK + k;
                searcher.encode(data.vec(i), data.weight(i), cb, beam, out);
            }
        },
    );
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

/// The GPTQ factor for a second-moment matrix `h` (`n x n`, row-major, overwritten): the upper
/// triangular `U` with `(H + damp I)^-1 = U^T U`, where `damp` is `rel_damp` times the mean
/// diagonal. `None` if `h` is not positive definite even after damping.
pub fn gptq_factor(h: &mut [f64], n: usize, rel_damp: f64) -> Option<Vec<f64>> {
    let mean_diag = (0..n).map(|i| h[i * n + i]).sum::<f64>() / n as f64;
    for i in 0..n {
        h[i * n + i] += rel_damp * mean_diag.max(1e-12);
    }
    let l = cholesky_lower(h, n)?;
    // L^-1 by forward substitution, row by row (lower triangular).
    let mut li = vec![0f64; n * n];
    for i in 0..n {
        li[i * n + i] = 1.0 / l[i * n + i];
        for j in 0..i {
            let mut s = 0.0;
            for k in j..i {
                s += l[i * n + k] * li[k * n + j];
            }
            li[i * n + j] = -s / l[i * n + i];
        }
    }
    // H^-1 = L^-T L^-1.
    let mut hi = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = 0.0;
            for k in i..n {
                s += li[k * n + i] * li[k * n + j];
            }
            hi[i * n + j] = s;
            hi[j * n + i] = s;
        }
    }
    let c = cholesky_lower(&hi, n)?;
    // U = C^T (upper).
    let mut u = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            u[j * n + i] = c[i * n + j];
        }
    }
    Some(u)
}

fn cholesky_lower(a: &[f64], n: usize) -> Option<Vec<f64>> {
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

/// GPTQ-style encoding (as in GPTVQ): each row is encoded chunk by chunk from left to right;
/// the error of a chunk, `E = (w_b - q_b) U_bb^-1`, is pushed onto the columns not yet encoded,
/// `w_rest -= E U_b,rest`, so later chunks compensate for it in the output `W x`. `w` holds the
/// rows (`cols` wide) and is overwritten; `u` comes from [`gptq_factor`]. Within a chunk the
/// distance is weighted by `importance` (per column), when given.
pub fn gptq_encode(
    w: &mut [f32],
    cols: usize,
    u: &[f64],
    importance: Option<&[f32]>,
    cb: &Codebooks,
    beam: usize,
    codes: &mut Vec<u16>,
) {
    let (d, s_n) = (cb.dim, cb.stages);
    let chunks = cols / d;
    codes.resize(w.len() / d * s_n, 0);
    // One searcher per worker, kept across its rows (its weighted tables are per column).
    let init = || (Searcher::for_codebooks(cb), vec![0f32; d], vec![0u16; s_n], vec![0f64; d]);
    let rows = w.par_chunks_exact_mut(cols).zip(codes.par_chunks_exact_mut(chunks * s_n));
    rows.for_each_init(init, |(searcher, q, one, e), (row, out)| {
        for k in 0..chunks {
            let c0 = k * d;
            let weights = importance.map(|m| &m[c0..c0 + d]);
            searcher.encode(&row[c0..c0 + d], weights, cb, beam, one);
            reconstruct(cb, one, q);
            out[k * s_n..(k + 1) * s_n].copy_from_slice(one);
            // Solve e U_bb = (w_b - q_b) for the row vector e (U_bb upper triangular).
            for j in 0..d {
                let mut v = f64::from(row[c0 + j] - q[j]);
                for i in 0..j {
                    v -= e[i] * u[(c0 + i) * cols + c0 + j];
                }
                e[j] = v / u[(c0 + j) * cols + c0 + j];
            }
            for (i, ei) in e.iter().enumerate() {
                let urow = &u[(c0 + i) * cols..(c0 + i + 1) * cols];
                for (wv, uv) in row[c0 + d..].iter_mut().zip(&urow[c0 + d..]) {
                    *wv -= (*ei * uv) as f32;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codebooks(seed: u64) -> Codebooks {
        let values = crate::rng::noise(2 * 16 * 4, seed, 1.0);
        Codebooks { stages: 2, entries: 16, dim: 4, values }
    }

    /// The transposed distances are `dist`'s bits, and a beam as wide as the entries finds the
    /// best of all 256 two-stage codes (an exhaustive reference).
    #[test]
    fn the_search_matches_exhaustive_search() {
        let cb = codebooks(3);
        let mut search = Search::for_codebooks(&cb);
        let vs = crate::rng::noise(200 * 4, 4, 1.5);
        let ws = crate::rng::noise(200 * 4, 5, 1.0).iter().map(|v| v.abs() + 0.1).collect::<Vec<f32>>();
        let mut dists = vec![0f32; 16];
        let mut out = [0u16; 2];
        for (i, v) in vs.chunks_exact(4).enumerate() {
            let w = &ws[i * 4..(i + 1) * 4];
            stage_dists(v, Some(w), &search.soa[..64], &mut dists);
            for (e, got) in dists.iter().enumerate() {
                assert_eq!(got.to_bits(), dist(v, cb.entry(0, e), Some(w)).to_bits());
            }
            encode_vec(v, Some(w), &cb, 16, &mut search, &mut out);
            let err = |a: usize, b: usize| {
                let r: Vec<f32> = (0..4).map(|j| v[j] - cb.entry(0, a)[j] - cb.entry(1, b)[j]).collect();
                dist(&r, &[0.0; 4], Some(w))
            };
            let best = (0..256).map(|c| err(c / 16, c % 16)).fold(f32::INFINITY, f32::min);
            assert!(err(out[0] as usize, out[1] as usize) <= best * (1.0 + 1e-5) + 1e-7, "vector {i}");
        }
    }

    #[test]
    fn gptq_factor_inverts_the_damped_matrix() {
        let n = 5;
        let mut h = vec![0f64; n * n];
        for i in 0..n {
            for j in 0..n {
                h[i * n + j] = 1.0 / (1.0 + (i as f64 - j as f64).abs()) + if i == j { 1.0 } else { 0.0 };
            }
        }
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
