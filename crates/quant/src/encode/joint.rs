//! The search for 3-stage, 16-entry codebooks (the fast-scan codec): the best few first-stage
//! entries, then for each the last two stages jointly over all 256 pairs, through the expansion
//! `|r - b - c|² = |r|² - 2 r·b - 2 r·c + |b + c|²` with `r = v - a_i`. Everything that does not
//! depend on the vector is tabulated once per codebook (per weight vector when distances are
//! weighted): `|b_j + c_k|²`, and `2 a_i·b_j`, `2 a_i·c_k`, so a pick's `2 r·b` is `2 v·b_j`
//! (shared by all picks) minus a table row. Searching the pairs jointly finds codes the
//! stage-by-stage beam misses, and the table turns each pair into a subtract and a minimum: the
//! 256 pairs run 8 or 16 at a time in SIMD lanes.
//!
//! With 16 first-stage picks the search is exhaustive (all 4096 codes).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use std::collections::HashMap;

use super::distance::{MAX_DIM, stage_dists_n};
use super::train::Codebooks;
use crate::cpu::{Level, level, supported};

const E: usize = 16;

/// Weighted tables kept per search before the cache starts over (4 KiB each). Importance
/// weights are per input column, so a matrix needs one set per chunk position (896 for K3's
/// 3,584 columns): each is computed once per thread, not once per vector.
const CACHED_TABLES: usize = 2048;

/// Reusable state of the joint search, for one set of codebooks.
#[derive(Debug, Clone)]
pub struct Joint {
    books: Books,
    /// The tables with unit weights.
    plain: Box<Tables>,
    /// The tables per weight vector seen (keyed by the weights' bits).
    weighted: HashMap<[u32; MAX_DIM], Box<Tables>>,
    scratch: Scratch,
    level: Level,
}

/// The codebooks as the search reads them.
#[derive(Debug, Clone)]
struct Books {
    dim: usize,
    /// Transposed, `[stage][dim][entry]` ([`Codebooks::transposed`]).
    soa: [f32; 3 * MAX_DIM * E],
}

/// What the search tabulates for one weight vector `w` (all ones when unweighted), with `a`,
/// `b`, `c` the three stages' entries and sums over the dimensions `d` in order.
#[derive(Debug, Clone)]
struct Tables {
    /// `sum_d w_d (b_j + c_k)_d²` at `j * 16 + k`.
    pairs: Table,
    /// The same at `k * 16 + j` (a column of `pairs` as a row).
    pairs_t: Table,
    /// `sum_d (2 w_d a_id) b_jd` at `i * 16 + j`.
    ab: Table,
    /// `sum_d (2 w_d a_id) c_kd` at `i * 16 + k`.
    ac: Table,
}

/// Per-pick rows of up to [`BLOCK`] vectors (16 rows each), kept so a search does not zero
/// 3 KiB per vector.
#[derive(Debug, Clone)]
struct Scratch {
    /// `2 r·b_j` per pick.
    rbs: Vec<[f32; E]>,
    /// `2 r·c_k - |r|²` per pick.
    qs: Vec<[f32; E]>,
    /// Per pick and `k`, the least error over `j`.
    es: Vec<[f32; E]>,
}

/// Vectors a SIMD kernel takes step by step together: each step's work for one vector is
/// independent of the next one's, so the CPU overlaps them (one vector's steps are a chain).
const BLOCK: usize = 4;

impl Joint {
    /// The search for `cb`, if it has 3 stages of 16 entries of at most 8 dims.
    pub fn new(cb: &Codebooks) -> Option<Self> {
        Self::at(level(), cb)
    }

    /// [`new`](Self::new) with an explicit kernel level (tests compare levels).
    pub fn at(level: Level, cb: &Codebooks) -> Option<Self> {
        if cb.stages != 3 || cb.entries != E || cb.dim > MAX_DIM {
            return None;
        }
        let mut soa = [0f32; 3 * MAX_DIM * E];
        let t = cb.transposed();
        soa[..t.len()].copy_from_slice(&t);
        let books = Books { dim: cb.dim, soa };
        let zero = vec![[0.0; E]; BLOCK * E];
        Some(Joint {
            plain: Box::new(books.tables(None)),
            books,
            weighted: HashMap::new(),
            scratch: Scratch { rbs: zero.clone(), qs: zero.clone(), es: zero },
            level: supported(level),
        })
    }

    /// The best code for `v` (weights `w`) among the `picks` best first-stage entries, each with
    /// all 256 pairs of the other two; codes to `out` (3 entries). On equal errors the first in
    /// (pick, second, third) order wins, in every kernel.
    pub fn encode(&mut self, v: &[f32], w: Option<&[f32]>, picks: usize, out: &mut [u16]) {
        self.encode_many(v, w, picks, out);
    }

    /// [`encode`](Self::encode) for each vector of `vs`, all with the weights `w`, codes to
    /// `out` (3 per vector): one table lookup and one kernel call for all of them, which takes
    /// them [`BLOCK`] at a time (GPTQ and descent search a chunk of many rows at once).
    pub fn encode_many(&mut self, vs: &[f32], w: Option<&[f32]>, picks: usize, out: &mut [u16]) {
        let Joint { books, plain, weighted, scratch, level } = self;
        assert_eq!(vs.len() / books.dim * 3, out.len(), "3 codes per {}-vector", books.dim);
        assert!(vs.len().is_multiple_of(books.dim), "whole {}-vectors", books.dim);
        let tables: &Tables = match w {
            None => plain,
            Some(w) => {
                assert_eq!(w.len(), books.dim, "{} weights for {}-dim codebooks", w.len(), books.dim);
                let mut key = [0u32; MAX_DIM];
                key.iter_mut().zip(w).for_each(|(k, w)| *k = w.to_bits());
                if weighted.len() == CACHED_TABLES && !weighted.contains_key(&key) {
                    weighted.clear();
                }
                weighted.entry(key).or_insert_with(|| Box::new(books.tables(Some(w))))
            }
        };
        run(*level, books, tables, Batch { vs, w, picks }, scratch, out);
    }

    /// [`encode_many`](Self::encode_many) unweighted.
    pub fn encode_all(&mut self, vs: &[f32], picks: usize, out: &mut [u16]) {
        self.encode_many(vs, None, picks, out);
    }
}

/// Vectors to search, all with the same weights.
#[derive(Clone, Copy)]
struct Batch<'a> {
    /// `dim`-vectors, one after another.
    vs: &'a [f32],
    w: Option<&'a [f32]>,
    /// First-stage entries searched per vector.
    picks: usize,
}

/// The search of every vector of `batch` at `level`, codes to `out` (3 per vector).
fn run(level: Level, books: &Books, tables: &Tables, batch: Batch<'_>, scratch: &mut Scratch, out: &mut [u16]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Joint::at` stores a level `supported` vouched for: each only on CPUs with it.
        Level::Avx2 => unsafe { avx2::search(books, tables, batch, scratch, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Level::Avx512 => unsafe { avx512::search(books, tables, batch, scratch, out) },
        Level::Scalar => books.search_all(tables, batch, scratch, out),
    }
}

impl Books {
    fn col(&self, stage: usize, j: usize) -> &[f32; E] {
        self.soa[(stage * self.dim + j) * E..][..E].try_into().expect("16 entries")
    }

    /// [`Tables`] for weights `w` (`None`: all ones).
    fn tables(&self, w: Option<&[f32]>) -> Tables {
        let weight = |j: usize| w.map_or(1.0, |w| w[j]);
        let mut t = Tables { pairs: [0.0; E * E], pairs_t: [0.0; E * E], ab: [0.0; E * E], ac: [0.0; E * E] };
        for j in 0..self.dim {
            let (a, b, c, wj) = (self.col(0, j), self.col(1, j), self.col(2, j), weight(j));
            for e in 0..E {
                for f in 0..E {
                    let bc = b[e] + c[f];
                    t.pairs[e * E + f] += wj * bc * bc;
                    let wa = 2.0 * wj * a[e];
                    t.ab[e * E + f] += wa * b[f];
                    t.ac[e * E + f] += wa * c[f];
                }
            }
        }
        for (jk, v) in t.pairs.iter().enumerate() {
            t.pairs_t[jk % E * E + jk / E] = *v;
        }
        t
    }

    /// [`search`](Self::search) for each vector of `batch`.
    fn search_all(&self, tables: &Tables, Batch { vs, w, picks }: Batch<'_>, scratch: &mut Scratch, out: &mut [u16]) {
        for (v, out) in vs.chunks_exact(self.dim).zip(out.chunks_exact_mut(3)) {
            out.copy_from_slice(&self.search(tables, v, w, picks, scratch));
        }
    }

    /// [`Joint::encode`]'s search, the scalar reference: the SIMD searches (`avx2`, `avx512`)
    /// do the same operations in the same order, so they return the same bits.
    fn search(&self, tables: &Tables, v: &[f32], w: Option<&[f32]>, picks: usize, scratch: &mut Scratch) -> [u16; 3] {
        let d = self.dim;
        let weight = |j: usize| w.map_or(1.0, |w| w[j]);
        let (rbs, qs, es) = (rows(&mut scratch.rbs), rows(&mut scratch.qs), rows(&mut scratch.es));
        // First-stage distances |v - a_i|², as the beam search computes them.
        let mut d0 = [0f32; E];
        stage_dists_n(v, w, &self.soa[..d * E], &mut d0);
        let picks = picks.clamp(1, E);
        let order = reference::order(&d0);
        // 2 v·b_j and 2 v·c_k (weighted), shared by every pick.
        let (mut vb, mut vc) = ([0f32; E], [0f32; E]);
        for (j, &vj) in v.iter().enumerate() {
            let wv = 2.0 * weight(j) * vj;
            for e in 0..E {
                vb[e] += wv * self.col(1, j)[e];
                vc[e] += wv * self.col(2, j)[e];
            }
        }
        // Per pick, with r = v - a_i: 2 r·b_j and the per-lane term, so that
        // error = (|b+c|² - 2 r·b) - (2 r·c - |r|²).
        for (p, &i) in order[..picks].iter().enumerate() {
            let i = usize::from(i);
            let (ab, ac) = (row(&tables.ab, i), row(&tables.ac, i));
            for e in 0..E {
                rbs[p][e] = vb[e] - ab[e];
                qs[p][e] = (vc[e] - ac[e]) - d0[i];
            }
        }
        let leasts = reference::leasts(&tables.pairs, rbs, qs, picks, es);
        // The first pick with the least error (a later pick must do strictly better: equal
        // errors keep the earlier code); only its pair is looked for.
        let mut best: Option<(f32, usize)> = None;
        for (p, &least) in leasts[..picks].iter().enumerate() {
            if least < best.map_or(f32::INFINITY, |b| b.0) {
                best = Some((least, p));
            }
        }
        let Some((least, p)) = best else { return [0; 3] };
        // The first (j, k) in row order: per `k` whose least it is, the first `j`.
        let mut jk = E * E;
        for k in 0..E {
            if es[p][k] == least {
                jk = jk.min(reference::find(&tables.pairs_t, &rbs[p], qs[p][k], least, k) * E + k);
            }
        }
        let jk = if jk == E * E { 0 } else { jk };
        [u16::from(order[p]), (jk / E) as u16, (jk % E) as u16]
    }
}

/// `|b_j + c_k|²` at `j * 16 + k`.
type Table = [f32; E * E];
/// Sixteen 16-entry rows (one per first-stage pick).
type Rows = [[f32; E]; E];

/// Entry `p` of a SIMD order: the first-stage entries as 4-bit fields of an integer (kept in a
/// register: bytes stored one by one and read back as a row stall store forwarding).
fn entry(order: u64, p: usize) -> usize {
    (order >> (4 * p) & 15) as usize
}

/// Row `i` of a 16 x 16 table.
fn row(t: &Table, i: usize) -> &[f32; E] {
    t[i * E..][..E].try_into().expect("16 entries")
}

/// The first 16 rows of a scratch buffer.
fn rows(r: &mut [[f32; E]]) -> &mut Rows {
    (&mut r[..E]).try_into().expect("16 rows")
}

/// `d` with NaN as +infinity: a NaN distance is never near.
fn unnan(d: &[f32; E]) -> [f32; E] {
    d.map(|v| if v.is_nan() { f32::INFINITY } else { v })
}

/// The search's steps in scalar code.
mod reference {
    use super::{E, Rows, Table};

    /// The 16 first-stage entries, nearest first (equal distances in entry order, NaN as
    /// +infinity).
    pub fn order(d0: &[f32; E]) -> [u8; E] {
        let d = super::unnan(d0);
        let mut order = [0u8; E];
        for i in 0..E {
            let rank = (0..E).filter(|&j| d[j] < d[i] || (d[j] == d[i] && j < i)).count();
            // Ranks are a permutation of 0..16: every entry has its slot (no branch).
            order[rank] = i as u8;
        }
        order
    }

    /// Per pick `p`, the errors `es[p][k] = min_j (pairs[j][k] - rbs[p][j]) - qs[p][k]`, and
    /// their least.
    pub fn leasts(table: &Table, rbs: &Rows, qs: &Rows, picks: usize, es: &mut Rows) -> [f32; E] {
        let mut out = [f32::INFINITY; E];
        for p in 0..picks {
            let mut m = [f32::INFINITY; E];
            for (j, row) in table.chunks_exact(E).enumerate() {
                for k in 0..E {
                    let part = row[k] - rbs[p][j];
                    if part < m[k] {
                        m[k] = part;
                    }
                }
            }
            for k in 0..E {
                es[p][k] = m[k] - qs[p][k];
                if es[p][k] < out[p] {
                    out[p] = es[p][k];
                }
            }
        }
        out
    }

    /// The first `j` with `(pairs_t[k][j] - rb[j]) - q == least`.
    pub fn find(table_t: &Table, rb: &[f32; E], q: f32, least: f32, k: usize) -> usize {
        (0..E).find(|&j| (table_t[k * E + j] - rb[j]) - q == least).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::levels;
    use crate::rng::noise;
    use proptest::prelude::*;

    fn codebooks(seed: u64, dim: usize) -> Codebooks {
        Codebooks { stages: 3, entries: 16, dim, values: noise(3 * 16 * dim, seed, 1.0) }
    }

    fn error(cb: &Codebooks, v: &[f32], w: Option<&[f32]>, code: [usize; 3]) -> f64 {
        (0..cb.dim)
            .map(|j| {
                let r = f64::from(v[j]) - (0..3).map(|s| f64::from(cb.entry(s, code[s])[j])).sum::<f64>();
                f64::from(w.map_or(1.0, |w| w[j])) * r * r
            })
            .sum()
    }

    /// With 16 picks the search finds the least error over all 4096 codes (to f32 rounding of
    /// the expansion: 1e-5 relative plus 1e-6 absolute on errors of order 1).
    #[test]
    fn sixteen_picks_are_exhaustive() {
        for (seed, dim) in [(1, 4), (2, 8), (3, 3)] {
            let cb = codebooks(seed, dim);
            let mut joint = Joint::new(&cb).unwrap();
            let vs = noise(300 * dim, seed + 10, 2.0);
            let ws: Vec<f32> = noise(300 * dim, seed + 20, 1.0).iter().map(|v| v.abs() + 0.05).collect();
            for (i, v) in vs.chunks_exact(dim).enumerate() {
                let w = (i % 2 == 0).then(|| &ws[i * dim..(i + 1) * dim]);
                let mut out = [0u16; 3];
                joint.encode(v, w, 16, &mut out);
                let got = error(&cb, v, w, out.map(usize::from));
                let best =
                    (0..4096).map(|c| error(&cb, v, w, [c / 256, c / 16 % 16, c % 16])).fold(f64::INFINITY, f64::min);
                assert!(got <= best * (1.0 + 1e-5) + 1e-6, "vector {i}: {got} against {best}");
            }
        }
    }

    proptest! {
        /// Every SIMD kernel this CPU runs returns the scalar reference's codes, bit for bit, at
        /// any pick count.
        #[test]
        fn simd_matches_the_reference(seed in 0u64..1000, picks in 1usize..=16, weighted: bool) {
            let cb = codebooks(seed, 4);
            let mut scalar = Joint::at(Level::Scalar, &cb).unwrap();
            let vs = noise(64 * 4, seed + 1, 1.5);
            let ws: Vec<f32> = noise(64 * 4, seed + 2, 1.0).iter().map(|v| v.abs() + 0.05).collect();
            for lvl in levels().into_iter().skip(1) {
                let mut simd = Joint::at(lvl, &cb).unwrap();
                for (i, v) in vs.chunks_exact(4).enumerate() {
                    let w = weighted.then(|| &ws[i * 4..(i + 1) * 4]);
                    let (mut a, mut b) = ([0u16; 3], [0u16; 3]);
                    scalar.encode(v, w, picks, &mut a);
                    simd.encode(v, w, picks, &mut b);
                    prop_assert_eq!(a, b, "{:?}, vector {}", lvl, i);
                }
            }
        }
    }

    proptest! {
        /// Each SIMD order's first `picks` entries are the reference's: on distances that are
        /// (almost always) distinct, and on ones from a small set with NaNs (every draw has
        /// ties).
        #[test]
        fn orders_match_the_reference(
            vals in proptest::collection::vec(0u16..10_000, 16), ties: bool, picks in 1usize..=16,
        ) {
            let d: [f32; E] = std::array::from_fn(|i| match (ties, vals[i] % 6) {
                (true, 5) => f32::NAN,
                (true, v) => f32::from(v) * 0.5,
                (false, _) => f32::from(vals[i]) * 0.01,
            });
            let want = reference::order(&d);
            #[cfg(target_arch = "x86_64")]
            use std::arch::x86_64::{_mm256_loadu_ps, _mm512_loadu_ps};
            #[cfg(target_arch = "x86_64")]
            for lvl in levels().into_iter().skip(1) {
                // SAFETY: `levels` lists only levels this CPU has.
                let order = unsafe {
                    match lvl {
                        Level::Avx2 => avx2::order([_mm256_loadu_ps(d.as_ptr()), _mm256_loadu_ps(d.as_ptr().add(8))], picks),
                        Level::Avx512 => avx512::order(_mm512_loadu_ps(d.as_ptr()), picks),
                        Level::Scalar => unreachable!("skipped"),
                    }
                };
                let got: [u8; E] = std::array::from_fn(|p| if p < picks { entry(order, p) as u8 } else { 0 });
                prop_assert_eq!(&got[..picks], &want[..picks], "{:?} on {:?}", lvl, d);
            }
        }

        /// A batch's codes (whole blocks of vectors through each step, the last block short),
        /// unweighted or all with one set of weights (GPTQ's and descent's chunks), are the
        /// scalar reference's, vector by vector, at every level.
        #[test]
        fn a_batch_is_the_reference(seed in 0u64..1000, picks in 1usize..=16, weighted: bool) {
            let cb = codebooks(seed, 4);
            let vs = noise(41 * 4, seed + 3, 1.5);
            let ws: Vec<f32> = noise(4, seed + 4, 1.0).iter().map(|v| v.abs() + 0.05).collect();
            let w = weighted.then_some(&ws[..]);
            let mut scalar = Joint::at(Level::Scalar, &cb).unwrap();
            for lvl in levels() {
                let mut joint = Joint::at(lvl, &cb).unwrap();
                let mut all = vec![0u16; 41 * 3];
                joint.encode_many(&vs, w, picks, &mut all);
                for (i, (v, got)) in vs.chunks_exact(4).zip(all.chunks_exact(3)).enumerate() {
                    let mut want = [0u16; 3];
                    scalar.encode(v, w, picks, &mut want);
                    prop_assert_eq!(got, &want[..], "{:?}, vector {}", lvl, i);
                }
            }
        }
    }

    /// Ties go to the first code in search order in both kernels: a vector equidistant from
    /// several codes (all-zero codebooks make every code equal).
    #[test]
    fn ties_go_to_the_first_code() {
        let cb = Codebooks { stages: 3, entries: 16, dim: 4, values: vec![0.0; 192] };
        for lvl in levels() {
            let mut joint = Joint::at(lvl, &cb).unwrap();
            let mut out = [9u16; 3];
            joint.encode(&[0.5, -1.0, 0.25, 2.0], None, 16, &mut out);
            assert_eq!(out, [0, 0, 0], "{lvl:?}");
        }
    }
}
