//! The joint search on AVX-512, written out whole: a 16-entry row is one register, the pair
//! table stays in 16 registers across a batch, and a vector's distances and dot products never
//! leave registers between the steps (the portable search's 16-entry arrays cost store-forwarding
//! stalls here). The same operations in the same order as the reference: the same bits.

use std::arch::x86_64::*;

use super::{BLOCK, Batch, Books, E, Scratch, Tables, entry, row};

/// [`Books::search_all`] on AVX-512, [`BLOCK`] vectors at a time step by step.
#[target_feature(enable = "avx2,popcnt,avx512f")]
pub unsafe fn search(books: &Books, tables: &Tables, batch: Batch<'_>, scratch: &mut Scratch, out: &mut [u16]) {
    let Batch { vs, w, picks } = batch;
    let picks = picks.clamp(1, E);
    let Scratch { rbs, qs, es } = scratch;
    let t: [__m512; E] = std::array::from_fn(|j| load(row(&tables.pairs, j)));
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
                store(&mut rbs[i * E + p], _mm512_sub_ps(vb, load(row(&tables.ab, a))));
                let q = _mm512_sub_ps(_mm512_sub_ps(vc, load(row(&tables.ac, a))), _mm512_set1_ps(dd[a]));
                store(&mut qs[i * E + p], q);
            }
        }
        // The errors.
        let mut least = [0f32; BLOCK];
        for (i, l) in least.iter_mut().enumerate().take(n) {
            let at = i * E..i * E + picks;
            *l = leasts(&t, &rbs[at.clone()], &qs[at.clone()], &mut es[at]);
        }
        // The codes.
        for (i, out) in out.chunks_exact_mut(3).enumerate() {
            let at = i * E..i * E + picks;
            let code = pick(tables, &rbs[at.clone()], &qs[at.clone()], &es[at], least[i], orders[i]);
            out.copy_from_slice(&code);
        }
    }
}

/// A 16-entry row as a register.
#[target_feature(enable = "avx512f")]
#[inline]
fn load(row: &[f32; E]) -> __m512 {
    // SAFETY: a 16-lane load of a 16-entry array.
    unsafe { _mm512_loadu_ps(row.as_ptr()) }
}

/// A register into a 16-entry row.
#[target_feature(enable = "avx512f")]
#[inline]
fn store(row: &mut [f32; E], x: __m512) {
    // SAFETY: a 16-lane store to a 16-entry array.
    unsafe { _mm512_storeu_ps(row.as_mut_ptr(), x) }
}

/// The first-stage distances |v - a_i|² (`stage_dists_n`'s operations), and 2 v·b_j, 2 v·c_k.
#[target_feature(enable = "avx512f")]
#[inline]
fn dots(books: &Books, v: &[f32], w: Option<&[f32]>) -> (__m512, __m512, __m512) {
    let (mut d0, mut vb, mut vc) = (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
    for (j, &vj) in v.iter().enumerate() {
        let diff = _mm512_sub_ps(_mm512_set1_ps(vj), load(books.col(0, j)));
        let wj = w.map_or(1.0, |w| w[j]);
        let sq = match w {
            None => _mm512_mul_ps(diff, diff),
            Some(_) => _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(wj), diff), diff),
        };
        d0 = _mm512_add_ps(d0, sq);
        let wv = _mm512_set1_ps(2.0 * wj * vj);
        vb = _mm512_add_ps(vb, _mm512_mul_ps(wv, load(books.col(1, j))));
        vc = _mm512_add_ps(vc, _mm512_mul_ps(wv, load(books.col(2, j))));
    }
    (d0, vb, vc)
}

/// One vector's code from its per-pick rows and least error: the first pick with the least
/// error, and in it the first `(j, k)` in row order (per `k` whose least it is, the first `j`,
/// from the transposed table).
#[target_feature(enable = "avx512f")]
#[inline]
fn pick(tables: &Tables, rbs: &[[f32; E]], qs: &[[f32; E]], es: &[[f32; E]], least: f32, order: u64) -> [u16; 3] {
    // Not below infinity (or NaN): no pick has an error (the reference's `None`).
    if least.partial_cmp(&f32::INFINITY) != Some(std::cmp::Ordering::Less) {
        return [0; 3];
    }
    let l = _mm512_set1_ps(least);
    // Which picks have it, without a branch per pick.
    let mut with = 0u32;
    for (p, e) in es.iter().enumerate() {
        with |= u32::from(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(load(e), l) != 0) << p;
    }
    if with == 0 {
        return [0; 3];
    }
    let p = with.trailing_zeros() as usize;
    let mut ks = u32::from(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(load(&es[p]), l));
    let (rb, mut jk) = (load(&rbs[p]), E * E);
    while ks != 0 {
        let k = ks.trailing_zeros() as usize;
        ks &= ks - 1;
        let part = _mm512_sub_ps(load(row(&tables.pairs_t, k)), rb);
        let js = u32::from(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_sub_ps(part, _mm512_set1_ps(qs[p][k])), l));
        if js != 0 {
            jk = jk.min(js.trailing_zeros() as usize * E + k);
        }
    }
    let jk = if jk == E * E { 0 } else { jk };
    [entry(order, p) as u16, (jk / E) as u16, (jk % E) as u16]
}

/// The reference's order, its first `picks` entries, as 4-bit fields of an integer (kept in a
/// register: bytes stored one by one and read back as a row stalled store forwarding). Ranks
/// are counted in lanes by masked adds (one compare per entry); only if two of the first ranks
/// collide (equal distances) are the earlier equals counted too.
#[target_feature(enable = "avx512f,popcnt")]
#[inline]
pub fn order(d0: __m512, picks: usize) -> u64 {
    // NaN as +infinity (`unnan`).
    let v = _mm512_mask_mov_ps(d0, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(d0, d0), _mm512_set1_ps(f32::INFINITY));
    // Broadcasts from memory are loads, not shuffles competing with the compares.
    let mut d = [0f32; E];
    store(&mut d, v);
    let ranks = |ties: bool| {
        let (mut rank, one) = (_mm512_setzero_si512(), _mm512_set1_epi32(1));
        for (j, &dj) in d.iter().enumerate() {
            let x = _mm512_set1_ps(dj);
            // Lanes `i` with `d_j < d_i` (and, with ties, `d_j == d_i` for `j < i`).
            let mut below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, v);
            if ties {
                below |= _mm512_mask_cmp_ps_mask::<_CMP_EQ_OQ>(!((2u32 << j) - 1) as u16, x, v);
            }
            rank = _mm512_mask_add_epi32(rank, below, rank, one);
        }
        rank
    };
    let slots = |rank: __m512i| {
        let (mut order, mut single) = (0u64, true);
        for p in 0..picks {
            let m = _mm512_cmpeq_epi32_mask(rank, _mm512_set1_epi32(p as i32));
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

/// The reference's per-pick errors into `es` (one row per pick), up to four picks at a time,
/// each pick's minima in two chains (even and odd rows) so eight run side by side; returns the
/// least of them all.
#[target_feature(enable = "avx512f")]
#[inline]
fn leasts(t: &[__m512; E], rbs: &[[f32; E]], qs: &[[f32; E]], es: &mut [[f32; E]]) -> f32 {
    let picks = es.len();
    let mut least = _mm512_set1_ps(f32::INFINITY);
    let mut p0 = 0;
    while p0 < picks {
        let n = (picks - p0).min(4);
        let mut acc = [[_mm512_set1_ps(f32::INFINITY); 2]; 4];
        for j in (0..E).step_by(2) {
            for (pp, a) in acc.iter_mut().enumerate().take(n) {
                let rb = &rbs[p0 + pp];
                a[0] = _mm512_min_ps(a[0], _mm512_sub_ps(t[j], _mm512_set1_ps(rb[j])));
                a[1] = _mm512_min_ps(a[1], _mm512_sub_ps(t[j + 1], _mm512_set1_ps(rb[j + 1])));
            }
        }
        for (pp, a) in acc.iter().enumerate().take(n) {
            let e = _mm512_sub_ps(_mm512_min_ps(a[0], a[1]), load(&qs[p0 + pp]));
            store(&mut es[p0 + pp], e);
            least = _mm512_min_ps(least, e);
        }
        p0 += n;
    }
    _mm512_reduce_min_ps(least)
}
