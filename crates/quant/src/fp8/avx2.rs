//! The AVX2 kernels: e4m3 widened by moving bits ([`widen`]), and the block-scaled products:
//! 32 bytes a step widened through IEEE halves to four 8-lane registers (the block's 32 partial
//! sums), each block's partial sums fused into the row's totals with the block's scale.

use std::arch::x86_64::*;

use super::Fp8Ref;
use crate::simd::{hsum, prefetch_at};

use super::PREFETCH;

/// e4m3 widened eight bytes at a time: the magnitude's 7 bits placed under an f32's exponent and
/// mantissa (`<< 20`) read as 2^(e-127) x 1.m (or a denormal m x 2^-129 for e = 0), times 2^120
/// gives e4m3's 2^(e-7) x 1.m (or m x 2^-9) exactly; the sign ORed back; the NaN pattern blended
/// in.
///
/// # Safety
/// The CPU must have AVX2; `bytes.len() == out.len()`.
#[target_feature(enable = "avx2")]
pub unsafe fn widen(bytes: &[u8], out: &mut [f32]) {
    let n = bytes.len() / 8 * 8;
    let (seven, sign_bit, scale, nan) = (
        _mm256_set1_epi32(0x7F),
        _mm256_set1_epi32(0x80),
        _mm256_set1_ps(f32::from_bits((127 + 120) << 23)),
        _mm256_set1_ps(f32::NAN),
    );
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 <= n <= bytes.len(); an unaligned 8-byte load.
        let b = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(bytes.as_ptr().add(i).cast()) });
        let mag = _mm256_and_si256(b, seven);
        let v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32::<20>(mag)), scale);
        let sign = _mm256_castsi256_ps(_mm256_slli_epi32::<24>(_mm256_and_si256(b, sign_bit)));
        let v = _mm256_or_ps(v, sign);
        let is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, seven));
        // SAFETY: i + 8 <= n <= out.len(); an unaligned store.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_blendv_ps(v, nan, is_nan)) };
    }
    for (o, &b) in out[n..].iter_mut().zip(&bytes[n..]) {
        *o = super::e4m3(b);
    }
}

/// 16 e4m3 bytes as two registers of `e4m3 / 256`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn widen16(raw: __m128i) -> [__m256; 2] {
    let words = _mm256_cvtepu8_epi16(raw);
    let half =
        _mm256_and_si256(_mm256_srai_epi16::<1>(_mm256_slli_epi16::<8>(words)), _mm256_set1_epi16(0xBF80u16 as i16));
    [_mm256_cvtph_ps(_mm256_castsi256_si128(half)), _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(half))]
}

/// `N` vectors (`xs` `[N, cols]`) against every row of `m`, `ys` `[N, rows]`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `m`'s parts hold its rows (checked by the caller), `xs` and
/// `ys` are `N` whole vectors.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul_n<const N: usize>(m: &Fp8Ref<'_>, xs: &[f32], ys: &mut [f32]) {
    let (rows, cols) = (m.rows, m.cols);
    let mut edge_x = [[0f32; 32]; N];
    for r in 0..rows {
        let (q, scales) = m.row(r);
        let mut total = [[_mm256_setzero_ps(); 4]; N];
        for (b, s) in scales.iter().enumerate() {
            let (c0, c1) = (b * m.block_cols, ((b + 1) * m.block_cols).min(cols));
            let mut part = [[_mm256_setzero_ps(); 4]; N];
            let mut c = c0;
            while c + 32 <= c1 {
                // SAFETY: c + 32 <= c1 <= cols for the row and each vector.
                unsafe { step(q.as_ptr().add(c), std::array::from_fn(|t| xs.as_ptr().add(t * cols + c)), &mut part) };
                c += 32;
            }
            if c < c1 {
                // The matrix's right edge: the missing columns read as 0 x 0, from copies.
                let k = c1 - c;
                let mut edge_w = [0u8; 32];
                edge_w[..k].copy_from_slice(&q[c..c1]);
                for (t, e) in edge_x.iter_mut().enumerate() {
                    e[..k].copy_from_slice(&xs[t * cols + c..t * cols + c1]);
                    e[k..].fill(0.0);
                }
                // SAFETY: the copies hold 32 bytes and 32 values each.
                unsafe { step(edge_w.as_ptr(), std::array::from_fn(|t| edge_x[t].as_ptr()), &mut part) };
            }
            let s = _mm256_set1_ps(s * 256.0);
            for (tot, p) in total.iter_mut().zip(&part) {
                for (a, b) in tot.iter_mut().zip(p) {
                    *a = _mm256_fmadd_ps(*b, s, *a);
                }
            }
        }
        for (t, tot) in total.iter().enumerate() {
            // The AVX-512 kernel's order: (lanes 0-15) + (16-31), then its two 8-lane halves.
            let v = [_mm256_add_ps(tot[0], tot[2]), _mm256_add_ps(tot[1], tot[3])];
            ys[t * rows + r] = hsum(_mm256_add_ps(v[0], v[1]));
        }
    }
}

/// One step of 32 columns: `part[t][k] += w * x[t]` for lanes `8k..8k + 8`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` points at 32 readable bytes and each `x[t]` at 32
/// readable values.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn step<const N: usize>(w: *const u8, x: [*const f32; N], part: &mut [[__m256; 4]; N]) {
    prefetch_at::<PREFETCH, _>(w);
    for h in 0..2 {
        // SAFETY: the caller's contract: 32 bytes at w, 32 values at each x[t].
        unsafe {
            let wv = widen16(_mm_loadu_si128(w.add(16 * h).cast()));
            for (p, xt) in part.iter_mut().zip(x) {
                let xp = xt.add(16 * h);
                p[2 * h] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xp), p[2 * h]);
                p[2 * h + 1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xp.add(8)), p[2 * h + 1]);
            }
        }
    }
}
