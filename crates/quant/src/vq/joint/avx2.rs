//! The joint search's kernels on AVX2: 16-entry rows as two 8-lane halves.

use std::arch::x86_64::*;

use super::{Batch, Books, E, Kernel, Rows, Scratch, Table, Tables};

/// [`Books::search_all`] compiled for AVX2, with its kernels.
#[target_feature(enable = "avx2,popcnt")]
pub unsafe fn search(books: &Books, tables: &Tables, batch: Batch<'_>, scratch: &mut Scratch, out: &mut [u16]) {
    // The kernels need only AVX2, which this function's callers have checked for.
    let kernel = Kernel {
        // SAFETY: AVX2 is present (above).
        order: |d: &[f32; E], p| unsafe { order(d, p) },
        // SAFETY: AVX2 is present (above).
        leasts: |t: &Table, r: &Rows, q: &Rows, p, es: &mut Rows| unsafe { leasts(t, r, q, p, es) },
        // SAFETY: AVX2 is present (above).
        find: |t: &Table, r: &[f32; E], q, l, k| unsafe { find(t, r, q, l, k) },
    };
    books.search_all(tables, batch, scratch, out, kernel);
}

/// The least of 16 values (in every lane).
#[target_feature(enable = "avx2")]
fn hmin(lo: __m256, hi: __m256) -> __m256 {
    let m = _mm256_min_ps(lo, hi);
    let m = _mm256_min_ps(m, _mm256_permute2f128_ps::<1>(m, m));
    let m = _mm256_min_ps(m, _mm256_shuffle_ps::<0b01_00_11_10>(m, m));
    _mm256_min_ps(m, _mm256_shuffle_ps::<0b10_11_00_01>(m, m))
}

/// The reference's order, its first `picks` entries: each entry's rank is the count of
/// entries below it, summed in lanes (16 compares of a broadcast against both halves). Only if
/// two of the first ranks collide (equal distances) are the earlier equals counted too.
#[target_feature(enable = "avx2,popcnt")]
pub unsafe fn order(d0: &[f32; E], picks: usize) -> [u8; E] {
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
                // A true compare is -1: subtracting it counts one.
                *r = _mm256_sub_epi32(*r, _mm256_castps_si256(below));
            }
        }
        rank
    };
    let slots = |rank: [__m256i; 2], order: &mut [u8; E]| {
        let mut single = true;
        for (p, o) in order.iter_mut().enumerate().take(picks) {
            let at = _mm256_set1_epi32(p as i32);
            let hit = |r| _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(r, at))) as u32;
            let m = hit(rank[0]) | hit(rank[1]) << 8;
            single &= m.count_ones() == 1;
            *o = (m.trailing_zeros() & 15) as u8;
        }
        single
    };
    let mut order = [0u8; E];
    if !slots(ranks(false), &mut order) {
        // Equal distances shared a rank: with the earlier equals counted, ranks are distinct.
        slots(ranks(true), &mut order);
    }
    order
}

/// The reference's leasts, four picks at a time: each table row is loaded once for the four,
/// and their eight chains of minima run side by side. Rows past `picks` are computed too (from
/// earlier searches' values) and not read.
#[target_feature(enable = "avx2")]
pub unsafe fn leasts(table: &Table, rbs: &Rows, qs: &Rows, picks: usize, es: &mut Rows) -> [f32; E] {
    let mut out = [f32::INFINITY; E];
    // SAFETY: loads and stores of 8 lanes at offsets 0 and 8 of 16-entry rows of fixed-size
    // arrays; `p0 + 3 <= 15` indexes `rbs`, `qs` and `es` (16 rows) in bounds. Unaligned.
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
                let (q, e) = (&qs[p0 + pp], &mut es[p0 + pp]);
                let lo = _mm256_sub_ps(a[0], _mm256_loadu_ps(q.as_ptr()));
                let hi = _mm256_sub_ps(a[1], _mm256_loadu_ps(q.as_ptr().add(8)));
                _mm256_storeu_ps(e.as_mut_ptr(), lo);
                _mm256_storeu_ps(e.as_mut_ptr().add(8), hi);
                out[p0 + pp] = _mm256_cvtss_f32(hmin(lo, hi));
            }
        }
    }
    out
}

/// The reference's `find`: row `k` of the transposed table, both halves at once.
#[target_feature(enable = "avx2")]
pub unsafe fn find(table_t: &Table, rb: &[f32; E], q: f32, least: f32, k: usize) -> usize {
    let row = &table_t[k * E..][..E];
    let (q, l) = (_mm256_set1_ps(q), _mm256_set1_ps(least));
    // SAFETY: loads of 8 lanes at offsets 0 and 8 of 16-entry rows.
    let hit = |h: usize| unsafe {
        let part = _mm256_sub_ps(_mm256_loadu_ps(row.as_ptr().add(8 * h)), _mm256_loadu_ps(rb.as_ptr().add(8 * h)));
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_sub_ps(part, q), l)) as u32
    };
    let m = hit(0) | hit(1) << 8;
    if m == 0 { 0 } else { m.trailing_zeros() as usize }
}
