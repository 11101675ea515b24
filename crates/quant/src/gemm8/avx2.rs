//! AVX2: `vpmaddubsw` (unsigned x signed byte pairs summed to i16) then `vpmaddwd` by ones. The
//! keys enter as `sign(key, q)` against `|q|` (so a query of either sign is the unsigned side);
//! pair sums stay within i16 because keys are at least -127 and weights at most 127.

use std::arch::x86_64::*;

use super::BLOCK;

/// Query rows of a register block (four registers of 8 keys each).
const MI: usize = 2;
/// Weight rows, and registers of 8 columns, of a weighted-sum block.
const WI: usize = 2;
const WC: usize = 4;

#[target_feature(enable = "avx2")]
pub(super) fn scores(a: &[i8], keys: &[i8], k4: usize, n: usize, out: &mut [i32]) {
    let m = a.len() / k4;
    let ones = _mm256_set1_epi16(1);
    let mut i = 0;
    while i < m {
        let mi = MI.min(m - i);
        let mut acc = [[_mm256_setzero_si256(); 4]; MI];
        for g in 0..k4 / 4 {
            // SAFETY: keys holds k4 / 4 words of BLOCK (32) rows of 4 bytes: 128 bytes at g * 128.
            let c: [__m256i; 4] =
                std::array::from_fn(|h| unsafe { _mm256_loadu_si256(keys.as_ptr().add(g * 128 + 32 * h).cast()) });
            for (r, row) in acc.iter_mut().enumerate().take(mi) {
                // SAFETY: row i + r of a has k4 bytes; 4 g + 4 <= k4.
                let w = unsafe { a.as_ptr().add((i + r) * k4 + 4 * g).cast::<i32>().read_unaligned() };
                let qs = _mm256_set1_epi32(w);
                let qa = _mm256_abs_epi8(qs);
                for (x, cv) in row.iter_mut().zip(&c) {
                    let pairs = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(*cv, qs));
                    *x = _mm256_add_epi32(*x, _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        for (r, row) in acc.iter().enumerate().take(mi) {
            let mut all = [0i32; BLOCK];
            for (h, v) in row.iter().enumerate() {
                // SAFETY: `all` holds 32 values, 8 at 8 h.
                unsafe { _mm256_storeu_si256(all.as_mut_ptr().add(8 * h).cast(), *v) };
            }
            out[(i + r) * n..(i + r + 1) * n].copy_from_slice(&all[..n]);
        }
        i += mi;
    }
}

#[target_feature(enable = "avx2")]
pub(super) fn weighted(w: &[u8], values: &[i8], k: usize, out: &mut [i32]) {
    let m = w.len() / BLOCK;
    let kv = k / 8 * 8;
    let mut i = 0;
    while i < m {
        let mi = WI.min(m - i);
        let mut t = 0;
        while t + 8 * WC <= kv {
            weighted_block::<WC>(w, values, k, i, mi, t, out);
            t += 8 * WC;
        }
        while t < kv {
            weighted_block::<1>(w, values, k, i, mi, t, out);
            t += 8;
        }
        super::reference::weighted_cols(w, values, k, i..i + mi, kv..k, out);
        i += mi;
    }
}

/// Weight rows `i..i + mi`, columns `t..t + 8 C`, over the block's eight words of positions.
#[target_feature(enable = "avx2")]
#[inline]
fn weighted_block<const C: usize>(w: &[u8], values: &[i8], k: usize, i: usize, mi: usize, t: usize, out: &mut [i32]) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); C]; WI];
    for g in 0..BLOCK / 4 {
        // SAFETY: values holds BLOCK / 4 groups of k columns of 4 bytes; t + 8 C <= k.
        let v: [__m256i; C] =
            std::array::from_fn(|c| unsafe { _mm256_loadu_si256(values.as_ptr().add((g * k + t + 8 * c) * 4).cast()) });
        for (r, row) in acc.iter_mut().enumerate().take(mi) {
            // SAFETY: row i + r of w has BLOCK bytes; 4 g + 4 <= BLOCK.
            let word = unsafe { w.as_ptr().add((i + r) * BLOCK + 4 * g).cast::<i32>().read_unaligned() };
            let wv = _mm256_set1_epi32(word);
            for (x, vc) in row.iter_mut().zip(&v) {
                *x = _mm256_add_epi32(*x, _mm256_madd_epi16(_mm256_maddubs_epi16(wv, *vc), ones));
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(mi) {
        for (c, x) in row.iter().enumerate() {
            // SAFETY: row i + r of out has k values; t + 8 C <= k.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add((i + r) * k + t + 8 * c).cast(), *x) };
        }
    }
}

/// [`pack_values`](super::pack_values) into a zeroed `out`: four rows' 32 columns interleaved by
/// byte then by 16-bit pair within 128-bit lanes, the lanes put back in column order.
#[target_feature(enable = "avx2")]
pub(super) fn pack_values(rows: &[i8], k: usize, out: &mut [i8]) {
    let n = rows.len() / k;
    let kv = k / 32 * 32;
    for g in 0..n.div_ceil(4) {
        let load = |i: usize, t: usize| {
            let j = 4 * g + i;
            if j < n {
                // SAFETY: row j < n has k values and t + 32 <= kv <= k.
                unsafe { _mm256_loadu_si256(rows.as_ptr().add(j * k + t).cast()) }
            } else {
                _mm256_setzero_si256()
            }
        };
        for t in (0..kv).step_by(32) {
            let [r0, r1, r2, r3] = [0, 1, 2, 3].map(|i| load(i, t));
            let (a, b) = (_mm256_unpacklo_epi8(r0, r1), _mm256_unpackhi_epi8(r0, r1));
            let (c, d) = (_mm256_unpacklo_epi8(r2, r3), _mm256_unpackhi_epi8(r2, r3));
            // Columns 0-3 | 16-19, 4-7 | 20-23, 8-11 | 24-27, 12-15 | 28-31.
            let (x0, x1) = (_mm256_unpacklo_epi16(a, c), _mm256_unpackhi_epi16(a, c));
            let (x2, x3) = (_mm256_unpacklo_epi16(b, d), _mm256_unpackhi_epi16(b, d));
            let y = [
                _mm256_permute2x128_si256::<0x20>(x0, x1),
                _mm256_permute2x128_si256::<0x20>(x2, x3),
                _mm256_permute2x128_si256::<0x31>(x0, x1),
                _mm256_permute2x128_si256::<0x31>(x2, x3),
            ];
            for (q, v) in y.iter().enumerate() {
                // SAFETY: out holds BLOCK / 4 groups of k columns of 4 bytes; t + 32 <= k.
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().add((g * k + t) * 4 + 32 * q).cast(), *v) };
            }
        }
    }
    super::pack::values_cols(rows, k, kv..k, out);
}
