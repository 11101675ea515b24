//! The search for 3-stage, 16-entry codebooks (the fast-scan codec): the best few first-stage
//! entries, then for each the last two stages jointly over all 256 pairs, through the expansion
//! `|r - b - c|² = |r|² - 2 r·b - 2 r·c + |b + c|²` with `|b + c|²` tabulated once per codebook
//! (per weight vector when distances are weighted). Searching the pairs jointly finds codes the
//! stage-by-stage beam misses, and the table turns each pair into two adds and a compare: the
//! 256 pairs run 8 or 16 at a time in SIMD lanes.
//!
//! With 16 first-stage picks the search is exhaustive (all 4096 codes).

use std::collections::HashMap;

use super::train::{Codebooks, MAX_DIM, stage_dists_n};
use crate::cpu::{Level, level, supported};

const E: usize = 16;

/// Weighted tables kept per search before the cache starts over (1 KiB each). Importance
/// weights are per input column, so a matrix needs one table per chunk position (896 for K3's
/// 3,584 columns): each is computed once per thread, not once per vector.
const CACHED_TABLES: usize = 4096;

/// Reusable state of the joint search, for one set of codebooks.
#[derive(Debug, Clone)]
pub struct Joint {
    books: Books,
    /// `|b_j + c_k|²` unweighted.
    plain: Box<Table>,
    /// `sum_d w_d (b_j + c_k)_d²` per weight vector seen (keyed by the weights' bits).
    weighted: HashMap<[u32; MAX_DIM], Box<Table>>,
    /// Scratch: the per-pick rows, kept so a search does not zero 2 KiB per vector.
    rows: (Rows, Rows),
    level: Level,
}

/// The codebooks as the search reads them.
#[derive(Debug, Clone)]
struct Books {
    dim: usize,
    /// Transposed, `[stage][dim][entry]` ([`Codebooks::transposed`]).
    soa: [f32; 3 * MAX_DIM * E],
}

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
        let plain = Box::new(pair_norms(&soa, cb.dim, None));
        Some(Joint {
            books: Books { dim: cb.dim, soa },
            plain,
            weighted: HashMap::new(),
            rows: ([[0.0; E]; E], [[0.0; E]; E]),
            level: supported(level),
        })
    }

    /// The best code for `v` (weights `w`) among the `picks` best first-stage entries, each with
    /// all 256 pairs of the other two; codes to `out` (3 entries). On equal errors the first in
    /// (pick, second, third) order wins, in every kernel.
    pub fn encode(&mut self, v: &[f32], w: Option<&[f32]>, picks: usize, out: &mut [u16]) {
        let Joint { books, plain, weighted, rows, level } = self;
        assert_eq!(v.len(), books.dim, "a {}-vector for {}-dim codebooks", v.len(), books.dim);
        let table: &Table = match w {
            None => plain,
            Some(w) => {
                let mut key = [0u32; MAX_DIM];
                key.iter_mut().zip(w).for_each(|(k, w)| *k = w.to_bits());
                if weighted.len() == CACHED_TABLES && !weighted.contains_key(&key) {
                    weighted.clear();
                }
                weighted.entry(key).or_insert_with(|| Box::new(pair_norms(&books.soa, books.dim, Some(w))))
            }
        };
        let code = match level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Joint::at` stores a level `supported` vouched for: Avx2 only on CPUs with it.
            // (AVX-512 versions measured 1.03x for the whole search, none for the order alone:
            // EFFICIENCY.md.)
            Level::Avx2 | Level::Avx512 => unsafe { avx2::search(books, table, v, w, picks, rows) },
            Level::Scalar => books.search(table, v, w, picks, rows, reference::KERNEL),
        };
        out.copy_from_slice(&code);
    }
}

impl Books {
    fn col(&self, stage: usize, j: usize) -> &[f32; E] {
        col(&self.soa, self.dim, stage, j)
    }

    /// [`Joint::encode`]'s search, with the kernel's `minima` and `find` for the pairs;
    /// inlined into each kernel, so its 16-entry loops are compiled for that kernel's instruction
    /// set (the same operations in the same order: the same bits).
    #[inline(always)]
    fn search(
        &self,
        table: &Table,
        v: &[f32],
        w: Option<&[f32]>,
        picks: usize,
        (rbs, qs): &mut (Rows, Rows),
        kernel: Kernel<
            impl Fn(&[f32; E]) -> [u8; E],
            impl Fn(&Table, &Rows, &Rows, usize) -> [f32; E],
            impl Fn(&Table, &[f32; E], &[f32; E], f32) -> usize,
        >,
    ) -> [u16; 3] {
        let d = self.dim;
        let weight = |j: usize| w.map_or(1.0, |w| w[j]);
        // First-stage distances |v - a_i|², as the beam search computes them.
        let mut d0 = [0f32; E];
        stage_dists_n(v, w, &self.soa[..d * E], &mut d0);
        let picks = picks.clamp(1, E);
        let order = (kernel.order)(&d0);
        // Per pick, 2 w r with r = v - a_i, its dots with every b_j (rbs) and c_k, and the
        // per-lane term: error = (|b+c|² - 2 r·b) - (2 r·c - |r|²).
        for (p, &i) in order[..picks].iter().enumerate() {
            let i = usize::from(i);
            let mut wr = [0f32; MAX_DIM];
            for j in 0..d {
                wr[j] = 2.0 * weight(j) * (v[j] - self.col(0, j)[i]);
            }
            // Local sums (kept in registers), stored once.
            let (mut rb, mut rc) = ([0f32; E], [0f32; E]);
            for (j, wrj) in wr[..d].iter().enumerate() {
                for (acc, b) in rb.iter_mut().zip(self.col(1, j)) {
                    *acc += wrj * b;
                }
                for (acc, c) in rc.iter_mut().zip(self.col(2, j)) {
                    *acc += wrj * c;
                }
            }
            rbs[p] = rb;
            qs[p] = std::array::from_fn(|k| rc[k] - d0[i]);
        }
        let leasts = (kernel.leasts)(table, rbs, qs, picks);
        // The first pick with the least error (a later pick must do strictly better: equal
        // errors keep the earlier code); only its pair is looked for.
        let mut best: Option<(f32, usize)> = None;
        for (p, &least) in leasts[..picks].iter().enumerate() {
            if least < best.map_or(f32::INFINITY, |b| b.0) {
                best = Some((least, p));
            }
        }
        match best {
            Some((least, p)) => {
                let jk = (kernel.find)(table, &rbs[p], &qs[p], least);
                [u16::from(order[p]), (jk / E) as u16, (jk % E) as u16]
            }
            None => [0; 3],
        }
    }
}

/// The 16 entries' values in dimension `j` of stage `stage`, from transposed codebooks.
fn col(soa: &[f32], dim: usize, stage: usize, j: usize) -> &[f32; E] {
    soa[(stage * dim + j) * E..][..E].try_into().expect("16 entries")
}

/// `sum_d w_d (b_j + c_k)_d²` at `j * 16 + k` (`w` = 1 when `None`).
fn pair_norms(soa: &[f32], dim: usize, w: Option<&[f32]>) -> Table {
    let mut table = [0f32; E * E];
    for j in 0..dim {
        let (b, c) = (col(soa, dim, 1, j), col(soa, dim, 2, j));
        let wj = w.map_or(1.0, |w| w[j]);
        for (bj, row) in b.iter().zip(table.chunks_exact_mut(E)) {
            for (t, ck) in row.iter_mut().zip(c) {
                *t += wj * (bj + ck) * (bj + ck);
            }
        }
    }
    table
}

/// `|b_j + c_k|²` at `j * 16 + k`.
type Table = [f32; E * E];
/// Sixteen 16-entry rows (one per first-stage pick).
type Rows = [[f32; E]; E];

/// `d` with NaN as +infinity: a NaN distance is never near.
fn unnan(d: &[f32; E]) -> [f32; E] {
    d.map(|v| if v.is_nan() { f32::INFINITY } else { v })
}

/// A search's three kernels (scalar reference or SIMD), with the same results.
struct Kernel<O, L, F> {
    /// The 16 first-stage entries, nearest first (equal distances in entry order,
    /// NaN as +infinity): entry `i` goes to its rank, the count of entries before it in that
    /// order, so the 16 ranks are independent compares rather than a chain of minima.
    order: O,
    /// Per pick `p`, the least error `min_jk (table[j][k] - rbs[p][j]) - qs[p][k]`.
    leasts: L,
    /// The first `j * 16 + k` where a pick's error is its least.
    find: F,
}

mod reference {
    use super::{E, Kernel, Rows, Table};

    type Fns = Kernel<
        fn(&[f32; E]) -> [u8; E],
        fn(&Table, &Rows, &Rows, usize) -> [f32; E],
        fn(&Table, &[f32; E], &[f32; E], f32) -> usize,
    >;
    pub const KERNEL: Fns = Kernel { order, leasts, find };

    fn order(d0: &[f32; E]) -> [u8; E] {
        let d = super::unnan(d0);
        let mut order = [0u8; E];
        for i in 0..E {
            let rank = (0..E).filter(|&j| d[j] < d[i] || (d[j] == d[i] && j < i)).count();
            // Ranks are a permutation of 0..16: every entry has its slot (no branch).
            order[rank] = i as u8;
        }
        order
    }

    /// `min_k (min_j (table[j][k] - rb[j]) - q[k])`: subtracting `q[k]` keeps order, so this is
    /// the least of the pick's errors `(table[j][k] - rb[j]) - q[k]`.
    fn leasts(table: &Table, rbs: &Rows, qs: &Rows, picks: usize) -> [f32; E] {
        let mut out = [f32::INFINITY; E];
        for ((rb, q), least) in rbs.iter().zip(qs).zip(out.iter_mut()).take(picks) {
            let mut m = [f32::INFINITY; E];
            for (j, row) in table.chunks_exact(E).enumerate() {
                for k in 0..E {
                    let part = row[k] - rb[j];
                    if part < m[k] {
                        m[k] = part;
                    }
                }
            }
            for k in 0..E {
                let err = m[k] - q[k];
                if err < *least {
                    *least = err;
                }
            }
        }
        out
    }

    fn find(table: &Table, rb: &[f32; E], q: &[f32; E], least: f32) -> usize {
        (0..E * E).find(|&jk| (table[jk] - rb[jk / E]) - q[jk % E] == least).unwrap_or(0)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Books, E, Kernel, Rows, Table};
    use std::arch::x86_64::*;

    /// [`Books::search`] compiled for AVX2, with its kernels.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn search(
        books: &Books,
        table: &Table,
        v: &[f32],
        w: Option<&[f32]>,
        picks: usize,
        rows: &mut (Rows, Rows),
    ) -> [u16; 3] {
        // The kernels need only AVX2, which this function's callers have checked for.
        let kernel = Kernel {
            // SAFETY: AVX2 is present (above).
            order: |d: &[f32; E]| unsafe { order(d) },
            // SAFETY: AVX2 is present (above).
            leasts: |t: &Table, r: &Rows, q: &Rows, p| unsafe { leasts(t, r, q, p) },
            // SAFETY: AVX2 is present (above).
            find: |t: &Table, r: &[f32; E], q: &[f32; E], l| unsafe { find(t, r, q, l) },
        };
        books.search(table, v, w, picks, rows, kernel)
    }

    /// The least of 16 values (in every lane).
    #[target_feature(enable = "avx2")]
    fn hmin(lo: __m256, hi: __m256) -> __m256 {
        let m = _mm256_min_ps(lo, hi);
        let m = _mm256_min_ps(m, _mm256_permute2f128_ps::<1>(m, m));
        let m = _mm256_min_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
        _mm256_min_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m))
    }

    /// The reference's order: each entry's rank is the count of entries below it (two 8-lane
    /// compares); only if two ranks collide (equal distances) are the earlier equals counted too.
    #[target_feature(enable = "avx2,popcnt")]
    pub unsafe fn order(d0: &[f32; E]) -> [u8; E] {
        // NaN as +infinity (`unnan`), in registers.
        let mut d = [0f32; E];
        let v: [__m256; 2] = std::array::from_fn(|h| {
            // SAFETY: loads and stores of 8 lanes at offsets 0 and 8 of 16-entry arrays.
            unsafe {
                let raw = _mm256_loadu_ps(d0.as_ptr().add(8 * h));
                let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(raw, raw);
                let v = _mm256_blendv_ps(raw, _mm256_set1_ps(f32::INFINITY), nan);
                _mm256_storeu_ps(d.as_mut_ptr().add(8 * h), v);
                v
            }
        });
        let mask = |x: __m256, lt: bool| {
            let m = |h: __m256| {
                let c = if lt { _mm256_cmp_ps::<_CMP_LT_OQ>(h, x) } else { _mm256_cmp_ps::<_CMP_EQ_OQ>(h, x) };
                _mm256_movemask_ps(c) as u32
            };
            m(v[0]) | m(v[1]) << 8
        };
        let mut order = [0u8; E];
        let mut seen = 0u32;
        for (i, &di) in d.iter().enumerate() {
            let rank = mask(_mm256_set1_ps(di), true).count_ones();
            seen |= 1 << rank;
            order[rank as usize] = i as u8;
        }
        if seen != 0xFFFF {
            // Equal distances shared a rank: the earlier entry goes first.
            for (i, &di) in d.iter().enumerate() {
                let x = _mm256_set1_ps(di);
                let rank = (mask(x, true) | mask(x, false) & ((1 << i) - 1)).count_ones() as usize;
                order[rank] = i as u8;
            }
        }
        order
    }

    /// The reference's leasts, four picks at a time: each table row is loaded once for the
    /// four, and their eight chains of minima run side by side. Rows past `picks` are computed
    /// too (from zeros) and not read.
    #[target_feature(enable = "avx2")]
    pub unsafe fn leasts(table: &Table, rbs: &Rows, qs: &Rows, picks: usize) -> [f32; E] {
        let mut out = [f32::INFINITY; E];
        // SAFETY: loads of 8 lanes at offsets 0 and 8 of 16-entry rows of fixed-size arrays;
        // `p0 + 3 <= 15` indexes `rbs` and `qs` (16 rows) in bounds. Unaligned.
        unsafe {
            for p0 in (0..picks).step_by(4) {
                let mut acc = [[_mm256_set1_ps(f32::INFINITY); 2]; 4];
                for (j, row) in table.chunks_exact(E).enumerate() {
                    let t = [_mm256_loadu_ps(row.as_ptr()), _mm256_loadu_ps(row.as_ptr().add(8))];
                    for (pp, a) in acc.iter_mut().enumerate() {
                        let r = _mm256_set1_ps(rbs[p0 + pp][j]);
                        a[0] = _mm256_min_ps(a[0], _mm256_sub_ps(t[0], r));
                        a[1] = _mm256_min_ps(a[1], _mm256_sub_ps(t[1], r));
                    }
                }
                for (pp, a) in acc.iter().enumerate() {
                    let q = &qs[p0 + pp];
                    let lo = _mm256_sub_ps(a[0], _mm256_loadu_ps(q.as_ptr()));
                    let hi = _mm256_sub_ps(a[1], _mm256_loadu_ps(q.as_ptr().add(8)));
                    out[p0 + pp] = _mm256_cvtss_f32(hmin(lo, hi));
                }
            }
        }
        out
    }

    /// The reference's `find`, 8 lanes at a time.
    #[target_feature(enable = "avx2")]
    pub unsafe fn find(table: &Table, rb: &[f32; E], q: &[f32; E], least: f32) -> usize {
        // SAFETY: loads of 8 lanes at offsets 0 and 8 of 16-entry rows of fixed-size arrays.
        unsafe {
            let qv = [_mm256_loadu_ps(q.as_ptr()), _mm256_loadu_ps(q.as_ptr().add(8))];
            let l = _mm256_set1_ps(least);
            for (j, (row, &rbj)) in table.chunks_exact(E).zip(rb).enumerate() {
                let r = _mm256_set1_ps(rbj);
                for (h, qh) in qv.iter().enumerate() {
                    let part = _mm256_sub_ps(_mm256_loadu_ps(row.as_ptr().add(8 * h)), r);
                    let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_sub_ps(part, *qh), l));
                    if hit != 0 {
                        return j * E + 8 * h + hit.trailing_zeros() as usize;
                    }
                }
            }
            0
        }
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
        /// The SIMD order is the reference's: on distances that are (almost always) distinct, and
        /// on ones from a small set with NaNs (every draw has ties).
        #[test]
        fn orders_match_the_reference(vals in proptest::collection::vec(0u16..10_000, 16), ties: bool) {
            let d: [f32; E] = std::array::from_fn(|i| match (ties, vals[i] % 6) {
                (true, 5) => f32::NAN,
                (true, v) => f32::from(v) * 0.5,
                (false, _) => f32::from(vals[i]) * 0.01,
            });
            let want = (reference::KERNEL.order)(&d);
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::detect() >= Level::Avx2 {
                // SAFETY: the CPU has AVX2 (checked above).
                let got = unsafe { avx2::order(&d) };
                prop_assert_eq!(got, want, "on {:?}", d);
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
