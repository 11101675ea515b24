//! AVX512-VNNI: `vpdpbusd` takes its first side unsigned, so the keys' bytes enter offset by 128
//! (`x ^ 0x80`) and each score gives back `128 sum(q)`; the weights are unsigned already.

use std::arch::x86_64::*;

use super::BLOCK;

/// Query rows of a register block (two registers of 16 keys each).
const MI: usize = 8;
/// Weight rows, and registers of 16 columns, of a weighted-sum block.
const WI: usize = 4;
const WC: usize = 4;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) fn scores(a: &[i8], keys: &[i8], k4: usize, n: usize, out: &mut [i32]) {
    let m = a.len() / k4;
    let flip = _mm512_set1_epi8(-128);
    let masks = [(1u32 << n.min(16)) - 1, (1u32 << n.saturating_sub(16)) - 1].map(|x| x as __mmask16);
    let mut i = 0;
    while i < m {
        let mi = MI.min(m - i);
        let mut acc = [[_mm512_setzero_si512(); 2]; MI];
        for g in 0..k4 / 4 {
            // SAFETY: keys holds k4 / 4 words of BLOCK (32) rows of 4 bytes: 128 bytes at g * 128.
            let c = [0, 1].map(|h| unsafe {
                _mm512_xor_si512(_mm512_loadu_si512(keys.as_ptr().add(g * 128 + 64 * h).cast()), flip)
            });
            for (r, row) in acc.iter_mut().enumerate().take(mi) {
                // SAFETY: row i + r of a has k4 bytes; 4 g + 4 <= k4.
                let w = unsafe { a.as_ptr().add((i + r) * k4 + 4 * g).cast::<i32>().read_unaligned() };
                let q = _mm512_set1_epi32(w);
                row[0] = _mm512_dpbusd_epi32(row[0], c[0], q);
                row[1] = _mm512_dpbusd_epi32(row[1], c[1], q);
            }
        }
        for (r, row) in acc.iter().enumerate().take(mi) {
            let sum: i32 = a[(i + r) * k4..(i + r + 1) * k4].iter().map(|x| i32::from(*x)).sum();
            let back = _mm512_set1_epi32(128 * sum);
            for (h, v) in row.iter().enumerate().take(n.div_ceil(16)) {
                // SAFETY: 16 h < n, so the pointer stays within row i + r of out (n values); the
                // mask keeps the lanes below n - 16 h.
                unsafe {
                    _mm512_mask_storeu_epi32(
                        out.as_mut_ptr().add((i + r) * n + 16 * h).cast(),
                        masks[h],
                        _mm512_sub_epi32(*v, back),
                    )
                };
            }
        }
        i += mi;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) fn weighted(w: &[u8], values: &[i8], k: usize, out: &mut [i32]) {
    let m = w.len() / BLOCK;
    let kv = k / 16 * 16;
    let mut i = 0;
    while i < m {
        let mi = WI.min(m - i);
        let mut t = 0;
        while t + 16 * WC <= kv {
            weighted_block::<WC>(w, values, k, i, mi, t, out);
            t += 16 * WC;
        }
        while t < kv {
            weighted_block::<1>(w, values, k, i, mi, t, out);
            t += 16;
        }
        super::reference::weighted_cols(w, values, k, i..i + mi, kv..k, out);
        i += mi;
    }
}

/// Weight rows `i..i + mi`, columns `t..t + 16 C`, over the block's eight words of positions.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn weighted_block<const C: usize>(w: &[u8], values: &[i8], k: usize, i: usize, mi: usize, t: usize, out: &mut [i32]) {
    let mut acc = [[_mm512_setzero_si512(); C]; WI];
    for g in 0..BLOCK / 4 {
        // SAFETY: values holds BLOCK / 4 groups of k columns of 4 bytes; t + 16 C <= k.
        let v: [__m512i; C] = std::array::from_fn(|c| unsafe {
            _mm512_loadu_si512(values.as_ptr().add((g * k + t + 16 * c) * 4).cast())
        });
        for (r, row) in acc.iter_mut().enumerate().take(mi) {
            // SAFETY: row i + r of w has BLOCK bytes; 4 g + 4 <= BLOCK.
            let word = unsafe { w.as_ptr().add((i + r) * BLOCK + 4 * g).cast::<i32>().read_unaligned() };
            let wv = _mm512_set1_epi32(word);
            for (x, vc) in row.iter_mut().zip(&v) {
                *x = _mm512_dpbusd_epi32(*x, wv, *vc);
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(mi) {
        for (c, x) in row.iter().enumerate() {
            // SAFETY: row i + r of out has k values; t + 16 C <= k.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().add((i + r) * k + t + 16 * c).cast(), *x) };
        }
    }
}
