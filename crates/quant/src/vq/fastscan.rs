//! Codec A kernels: fast-scan over 3 x 16 x 4 additive codes.
//!
//! Storage: rows in blocks of 32. For block `b` and item `j` (chunk `j / 3`, stage `j % 3`),
//! 16 bytes: byte `i` holds the code of row `32b + i` in its low nibble and of row `32b + i + 16`
//! in its high nibble. Items follow each other, so a 32-byte load holds items `2p` and `2p + 1`.
//!
//! A matvec first builds the table `T[j][e] = C_{j%3}[e] . x_chunk(j/3)`, quantizes it to u8 with
//! one step `delta` for all items and a per-item offset (`T ~ delta * L + min_j`), then sums
//! `L[j][code(r, j)]` over items in integers, 32 rows per `pshufb`. The integer sums are exact in
//! both the scalar reference and the AVX2 kernel, so their results are bit-identical.

use super::{Scratch, VqRef};
use crate::cpu::{Level, supported};

/// Packs row-major codes (`rows x items`, each < 16) into the interleaved layout.
pub fn pack(codes: &[u16], rows: usize, items: usize) -> Vec<u8> {
    let mut out = vec![0u8; rows * items / 2];
    for b in 0..rows / 32 {
        for j in 0..items {
            for i in 0..16 {
                let lo = codes[(32 * b + i) * items + j] as u8;
                let hi = codes[(32 * b + i + 16) * items + j] as u8;
                out[(b * items + j) * 16 + i] = lo | hi << 4;
            }
        }
    }
    out
}

/// The code of item `j` of row `r`.
pub fn code(codes: &[u8], items: usize, r: usize, j: usize) -> usize {
    let byte = codes[((r / 32) * items + j) * 16 + r % 16];
    usize::from(if r % 32 < 16 { byte & 15 } else { byte >> 4 })
}

/// Builds the u8 table for `x` (already rotated); returns `(delta, sum of offsets)`.
pub fn build_lut(codebooks: &[f32], x: &[f32], table: &mut Vec<f32>, lut: &mut Vec<u8>) -> (f32, f32) {
    let chunks = x.len() / 4;
    let items = chunks * 3;
    table.resize(items * 16, 0.0);
    for (k, xc) in x.chunks_exact(4).enumerate() {
        for s in 0..3 {
            let t = &mut table[(k * 3 + s) * 16..][..16];
            for (e, v) in t.iter_mut().enumerate() {
                let c = &codebooks[(s * 16 + e) * 4..][..4];
                *v = c[0] * xc[0] + c[1] * xc[1] + c[2] * xc[2] + c[3] * xc[3];
            }
        }
    }
    let mut range = 0f32;
    let mut bias = 0f64;
    for t in table.chunks_exact(16) {
        let (lo, hi) = t.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
        range = range.max(hi - lo);
        bias += f64::from(lo);
    }
    let delta = if range > 0.0 { range / 255.0 } else { 1.0 };
    let inv = 1.0 / delta;
    lut.resize(items * 16, 0);
    for (t, l) in table.chunks_exact(16).zip(lut.chunks_exact_mut(16)) {
        let lo = t.iter().fold(f32::INFINITY, |a, v| a.min(*v));
        for (v, q) in t.iter().zip(l.iter_mut()) {
            *q = ((v - lo) * inv).round().clamp(0.0, 255.0) as u8;
        }
    }
    (delta, bias as f32)
}

pub(super) fn matvec(level: Level, m: &VqRef<'_>, scratch: &mut Scratch, y: &mut [f32]) {
    let items = m.cols / 4 * 3;
    let (delta, bias) = build_lut(m.codebooks, &scratch.x, &mut scratch.table, &mut scratch.lut);
    scratch.sums.resize(m.rows, 0);
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2; the codes hold rows/32
        // blocks of items x 16 bytes and the table items x 16 bytes (items even: cols % 8 == 0).
        Level::Avx2 => unsafe { avx2::sums(m.codes, items, &scratch.lut, &mut scratch.sums) },
        _ => reference::sums(m.codes, items, &scratch.lut, &mut scratch.sums),
    }
    for ((out, s), sc) in y.iter_mut().zip(&scratch.sums).zip(m.scale) {
        *out = sc.to_f32() * (delta * *s as f32 + bias);
    }
}

pub mod reference {
    /// `sums[r] = sum_j lut[j][code(r, j)]`.
    pub fn sums(codes: &[u8], items: usize, lut: &[u8], sums: &mut [u32]) {
        for (r, s) in sums.iter_mut().enumerate() {
            *s = (0..items).map(|j| u32::from(lut[j * 16 + super::code(codes, items, r, j)])).sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Steps between widenings: 256 u8 values summed per u16 lane stay below 65536.
    const FLUSH: usize = 256;

    #[target_feature(enable = "avx2")]
    fn flush(a: __m256i, b: __m256i, rows: &mut [u32]) {
        let even = _mm256_sub_epi16(a, _mm256_slli_epi16::<8>(b));
        let (mut e, mut o) = ([0u16; 16], [0u16; 16]);
        // SAFETY: each array is 32 bytes.
        unsafe {
            _mm256_storeu_si256(e.as_mut_ptr().cast(), even);
            _mm256_storeu_si256(o.as_mut_ptr().cast(), b);
        }
        for k in 0..16 {
            let r = 2 * (k % 8);
            rows[r] += u32::from(e[k]);
            rows[r + 1] += u32::from(o[k]);
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn sums(codes: &[u8], items: usize, lut: &[u8], sums: &mut [u32]) {
        let m = _mm256_set1_epi8(15);
        let zero = _mm256_setzero_si256();
        for (b, out) in sums.chunks_exact_mut(32).enumerate() {
            out.fill(0);
            let base = &codes[b * items * 16..][..items * 16];
            let (mut la, mut lb, mut ha, mut hb) = (zero, zero, zero, zero);
            let mut steps = 0;
            for p in 0..items / 2 {
                // SAFETY: item pair p is 32 bytes inside the block's codes and inside the table.
                let (c, l) = unsafe {
                    (
                        _mm256_loadu_si256(base.as_ptr().add(32 * p).cast()),
                        _mm256_loadu_si256(lut.as_ptr().add(32 * p).cast()),
                    )
                };
                let rl = _mm256_shuffle_epi8(l, _mm256_and_si256(c, m));
                let rh = _mm256_shuffle_epi8(l, _mm256_and_si256(_mm256_srli_epi16::<4>(c), m));
                la = _mm256_add_epi16(la, rl);
                lb = _mm256_add_epi16(lb, _mm256_srli_epi16::<8>(rl));
                ha = _mm256_add_epi16(ha, rh);
                hb = _mm256_add_epi16(hb, _mm256_srli_epi16::<8>(rh));
                steps += 1;
                if steps == FLUSH {
                    let (lo, hi) = out.split_at_mut(16);
                    flush(la, lb, lo);
                    flush(ha, hb, hi);
                    (la, lb, ha, hb, steps) = (zero, zero, zero, zero, 0);
                }
            }
            let (lo, hi) = out.split_at_mut(16);
            flush(la, lb, lo);
            flush(ha, hb, hi);
        }
    }
}
