//! The joint search on AVX2, written out like [`super::avx512`]'s: a 16-entry row is two
//! 8-lane registers, a vector's distances and dot products stay in registers between the steps,
//! and [`BLOCK`] vectors go through each step together. The same operations in the same order
//! as the reference: the same bits.

use std::arch::x86_64::*;

use super::{BLOCK, Batch, Books, E, Scratch, Table, Tables, entry, row};
use crate::simd::{hmin16, unnan};

/// A 16-entry row: lanes 0-7 and 8-15.
type Row = [__m256; 2];

/// [`Books::search_all`] on AVX2, [`BLOCK`] vectors at a time step by step.
#[target_feature(enable = "avx2,popcnt")]
pub unsafe fn search(books: &Books, tables: &Tables, batch: Batch<'_>, scratch: &mut Scratch, out: &mut [u16]) {
    let Batch { vs, w, picks } = batch;
    let picks = picks.clamp(1, E);
    let Scratch { rbs, qs, es } = scratch;
    let d = books.dim;
    for (vs, out) in vs.chunks(BLOCK * d).zip(out.chunks_mut(BLOCK * 3)) {
        let n = vs.len() / d;
        let mut orders = [0u64; BLOCK];
        // Distances, order, and the per-pick rows.
        for (i, (v, order)) in vs.chunks_exact(d).zip(&mut orders).enumerate() {
            let (d0, vb, vc) = dots(books, v, w);
            *order = self::order(d0, picks);
            let mut dd = [0f32; E];
            store(&mut dd, d0);
            for p in 0..picks {
                let a = entry(*order, p);
                let (ab, ac) = (row(&tables.ab, a), row(&tables.ac, a));
                store(&mut rbs[i * E + p], sub(vb, load(ab)));
                let q = sub(sub(vc, load(ac)), splat(dd[a]));
                store(&mut qs[i * E + p], q);
            }
        }
        // The errors.
        let mut least = [0f32; BLOCK];
        for (i, l) in least.iter_mut().enumerate().take(n) {
            let at = i * E..i * E + picks;
            *l = leasts(&tables.pairs, &rbs[at.clone()], &qs[at.clone()], &mut es[at]);
        }
        // The codes.
        for (i, out) in out.chunks_exact_mut(3).enumerate() {
            let at = i * E..i * E + picks;
            let code = pick(tables, &rbs[at.clone()], &qs[at.clone()], &es[at], least[i], orders[i]);
            out.copy_from_slice(&code);
        }
    }
}

#[target_feature(enable = "avx2")]
#[inline]
fn load(r: &[f32; E]) -> Row {
    // SAFETY: 8-lane loads at offsets 0 and 8 of a 16-entry array.
    unsafe { [_mm256_loadu_ps(r.as_ptr()), _mm256_loadu_ps(r.as_ptr().add(8))] }
}

#[target_feature(enable = "avx2")]
#[inline]
fn store(r: &mut [f32; E], x: Row) {
    // SAFETY: 8-lane stores at offsets 0 and 8 of a 16-entry array.
    unsafe {
        _mm256_storeu_ps(r.as_mut_ptr(), x[0]);
        _mm256_storeu_ps(r.as_mut_ptr().add(8), x[1]);
    }
}

#[target_feature(enable = "avx2")]
#[inline]
fn splat(x: f32) -> Row {
    [_mm256_set1_ps(x); 2]
}

#[target_feature(enable = "avx2")]
#[inline]
fn sub(a: Row, b: Row) -> Row {
    [_mm256_sub_ps(a[0], b[0]), _mm256_sub_ps(a[1], b[1])]
}

#[target_feature(enable = "avx2")]
#[inline]
fn add(a: Row, b: Row) -> Row {
    [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
}

#[target_feature(enable = "avx2")]
#[inline]
fn mul(a: Row, b: Row) -> Row {
    [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])]
}

#[target_feature(enable = "avx2")]
#[inline]
fn min(a: Row, b: Row) -> Row {
    [_mm256_min_ps(a[0], b[0]), _mm256_min_ps(a[1], b[1])]
}

/// The lanes of `x` equal to `y`, as 16 bits.
#[target_feature(enable = "avx2")]
#[inline]
fn eq(x: Row, y: Row) -> u32 {
    let m = |h: usize| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(x[h], y[h])) as u32;
    m(0) | m(1) << 8
}

/// The least of 16 values.
#[target_feature(enable = "avx2")]
#[inline]
fn hmin(x: Row) -> f32 {
    _mm256_cvtss_f32(hmin16(x[0], x[1]))
}

/// The first-stage distances |v - a_i|² (`stage_dists_n`'s operations), and 2 v·b_j, 2 v·c_k.
#[target_feature(enable = "avx2")]
#[inline]
fn dots(books: &Books, v: &[f32], w: Option<&[f32]>) -> (Row, Row, Row) {
    let zero = splat(0.0);
    let (mut d0, mut vb, mut vc) = (zero, zero, zero);
    for (j, &vj) in v.iter().enumerate() {
        let diff = sub(splat(vj), load(books.col(0, j)));
        let wj = w.map_or(1.0, |w| w[j]);
        let sq = match w {
            None => mul(diff, diff),
            Some(_) => mul(mul(splat(wj), diff), diff),
        };
        d0 = add(d0, sq);
        let wv = splat(2.0 * wj * vj);
        vb = add(vb, mul(wv, load(books.col(1, j))));
        vc = add(vc, mul(wv, load(books.col(2, j))));
    }
    (d0, vb, vc)
}

/// [`super::avx512::order`] with two 8-lane halves: ranks counted by subtracting compares (a
/// true compare is -1).
#[target_feature(enable = "avx2,popcnt")]
#[inline]
pub fn order(d0: Row, picks: usize) -> u64 {
    // NaN as +infinity (`unnan`).
    let v = d0.map(|x| unnan(x));
    let mut d = [0f32; E];
    store(&mut d, v);
    let ranks = |ties: bool| {
        let mut rank = [_mm256_setzero_si256(); 2];
        for (j, &dj) in d.iter().enumerate() {
            let x = _mm256_set1_ps(dj);
            for (h, (r, vh)) in rank.iter_mut().zip(&v).enumerate() {
                // Lanes `i` with `d_j < d_i` (and, with ties, `d_j == d_i` for `j < i`).
                let mut below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, *vh);
                if ties {
                    let lane =
                        _mm256_add_epi32(_mm256_set1_epi32(8 * h as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                    let after = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(j as i32)));
                    below = _mm256_or_ps(below, _mm256_and_ps(after, _mm256_cmp_ps::<_CMP_EQ_OQ>(x, *vh)));
                }
                *r = _mm256_sub_epi32(*r, _mm256_castps_si256(below));
            }
        }
        rank
    };
    let slots = |rank: [__m256i; 2]| {
        let (mut order, mut single) = (0u64, true);
        for p in 0..picks {
            let at = _mm256_set1_epi32(p as i32);
            let hit = |r| _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(r, at))) as u32;
            let m = hit(rank[0]) | hit(rank[1]) << 8;
            single &= m.count_ones() == 1;
            order |= u64::from(m.trailing_zeros() & 15) << (4 * p);
        }
        (order, single)
    };
    match slots(ranks(false)) {
        (order, true) => order,
        // Equal distances shared a rank: with the earlier equals counted, ranks are distinct.
        _ => slots(ranks(true)).0,
    }
}

/// The reference's per-pick errors into `es`, four picks at a time (each table row loaded once
/// for the four, eight chains of minima side by side); returns the least of them all.
#[target_feature(enable = "avx2")]
#[inline]
fn leasts(table: &Table, rbs: &[[f32; E]], qs: &[[f32; E]], es: &mut [[f32; E]]) -> f32 {
    let picks = es.len();
    let mut least = splat(f32::INFINITY);
    let mut p0 = 0;
    while p0 < picks {
        let n = (picks - p0).min(4);
        let mut acc = [splat(f32::INFINITY); 4];
        for (j, t) in table.chunks_exact(E).enumerate() {
            let t = load(t.try_into().expect("16 entries"));
            for (pp, a) in acc.iter_mut().enumerate().take(n) {
                *a = min(*a, sub(t, splat(rbs[p0 + pp][j])));
            }
        }
        for (pp, a) in acc.iter().enumerate().take(n) {
            let e = sub(*a, load(&qs[p0 + pp]));
            store(&mut es[p0 + pp], e);
            least = min(least, e);
        }
        p0 += n;
    }
    hmin(least)
}

/// [`super::avx512`]'s `pick` on two halves.
#[target_feature(enable = "avx2,popcnt")]
#[inline]
fn pick(tables: &Tables, rbs: &[[f32; E]], qs: &[[f32; E]], es: &[[f32; E]], least: f32, order: u64) -> [u16; 3] {
    // Not below infinity (or NaN): no pick has an error (the reference's `None`).
    if least.partial_cmp(&f32::INFINITY) != Some(std::cmp::Ordering::Less) {
        return [0; 3];
    }
    let l = splat(least);
    let mut with = 0u32;
    for (p, e) in es.iter().enumerate() {
        with |= u32::from(eq(load(e), l) != 0) << p;
    }
    if with == 0 {
        return [0; 3];
    }
    let p = with.trailing_zeros() as usize;
    let (rb, mut ks, mut jk) = (load(&rbs[p]), eq(load(&es[p]), l), E * E);
    while ks != 0 {
        let k = ks.trailing_zeros() as usize;
        ks &= ks - 1;
        let js = eq(sub(sub(load(row(&tables.pairs_t, k)), rb), splat(qs[p][k])), l);
        if js != 0 {
            jk = jk.min(js.trailing_zeros() as usize * E + k);
        }
    }
    let jk = if jk == E * E { 0 } else { jk };
    [entry(order, p) as u16, (jk / E) as u16, (jk % E) as u16]
}
