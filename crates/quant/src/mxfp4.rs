//! MXFP4 (OCP microscaling FP4) in the compressed-tensors layout K3 ships: `packed` u8
//! `[rows, cols/2]`, low nibble = even column, E2M1 values; `scale` u8 `[rows, cols/32]`, E8M0.
//!
//! The fast paths use the doubled E2M1 values, which are small integers (one `pshufb` table), and
//! fold the 1/2 into the block scale, so the f32 kernel is exact up to summation order.

use crate::cpu::{Level, level, supported};
use crate::simd::{with_nibble_order, with_nibble_order_padded};

/// E2M1 nibble -> value; bit 3 is the sign.
pub const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
/// Twice the E2M1 values: exact small integers.
pub(crate) const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
/// Columns per scale block.
pub const BLOCK: usize = 32;

/// `2^(e - 127)`, the E8M0 scale (255 is NaN).
pub const fn e8m0(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(0x0040_0000), // 2^-127, subnormal
        _ => f32::from_bits((e as u32) << 23),
    }
}

/// `2^(e - 128)`: the E8M0 scale with the 1/2 of the doubled values folded in (exact).
const fn e8m0_half(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(0x0020_0000),
        1 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits(((e - 1) as u32) << 23),
    }
}

pub(crate) static SCALE_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = e8m0_half(e as u8);
        e += 1;
    }
    t
};

/// Checks the layout of an MXFP4 matrix with `rows` rows against `cols` columns.
#[track_caller]
fn check(packed: &[u8], scale: &[u8], cols: usize, rows: usize) {
    assert!(cols.is_multiple_of(BLOCK), "MXFP4 needs columns in multiples of 32, got {cols}");
    assert_eq!(packed.len(), rows * cols / 2, "packed bytes for [{rows}, {cols}]");
    assert_eq!(scale.len(), rows * cols / BLOCK, "scale bytes for [{rows}, {cols}]");
}

/// Decodes one row exactly.
pub fn decode_row(packed: &[u8], scale: &[u8], out: &mut [f32]) {
    check(packed, scale, out.len(), 1);
    for (c, o) in out.iter_mut().enumerate() {
        let byte = packed[c / 2];
        let nib = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
        *o = E2M1[usize::from(nib)] * e8m0(scale[c / BLOCK]);
    }
}

/// `y = W x` with f32 activations; exact weights, f32 accumulation.
pub fn matvec(packed: &[u8], scale: &[u8], x: &[f32], y: &mut [f32]) {
    matvec_at(level(), packed, scale, x, y)
}

/// [`matvec`] with an explicit kernel level (for tests and benchmarks).
pub fn matvec_at(level: Level, packed: &[u8], scale: &[u8], x: &[f32], y: &mut [f32]) {
    check(packed, scale, x.len(), y.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => with_nibble_order(x, |xp| {
            // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes checked above.
            unsafe { avx2::matvec(packed, scale, xp, y) }
        }),
        Level::Scalar => reference::matvec(packed, scale, x, y),
    }
}

/// `Y = W X` for a batch of `n = xs.len() / cols` vectors (`xs` `[n, cols]`, `ys` `[n, rows]`),
/// decoding each weight block once for the whole batch.
pub fn matmul(packed: &[u8], scale: &[u8], cols: usize, xs: &[f32], ys: &mut [f32]) {
    matmul_at(level(), packed, scale, cols, xs, ys)
}

/// [`matmul`] with an explicit kernel level (for tests and benchmarks).
pub fn matmul_at(level: Level, packed: &[u8], scale: &[u8], cols: usize, xs: &[f32], ys: &mut [f32]) {
    assert!(cols > 0 && xs.len().is_multiple_of(cols), "xs is not a whole number of {cols}-vectors");
    let n = xs.len() / cols;
    assert!(n > 0 && ys.len().is_multiple_of(n), "ys is not {n} vectors");
    let rows = ys.len() / n;
    check(packed, scale, cols, rows);
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 => with_nibble_order_padded(xs, cols, |xp, stride| {
            for (xb, yb) in xp.chunks(stride * avx2::MAX_BATCH).zip(ys.chunks_mut(rows * avx2::MAX_BATCH)) {
                // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; shapes checked above.
                unsafe { avx2::matmul(packed, scale, cols, stride, xb, yb) }
            }
        }),
        Level::Scalar => reference::matmul(packed, scale, cols, xs, ys),
    }
}

/// Scalar references: the oracles the fast kernels are tested against.
pub mod reference {
    use super::{BLOCK, E2M1, e8m0};

    pub fn matvec(packed: &[u8], scale: &[u8], x: &[f32], y: &mut [f32]) {
        let cols = x.len();
        for (r, out) in y.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (c, xv) in x.iter().enumerate() {
                let byte = packed[(r * cols + c) / 2];
                let nib = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
                acc += E2M1[usize::from(nib)] * e8m0(scale[(r * cols + c) / BLOCK]) * xv;
            }
            *out = acc;
        }
    }

    pub fn matmul(packed: &[u8], scale: &[u8], cols: usize, xs: &[f32], ys: &mut [f32]) {
        let rows = ys.len() / (xs.len() / cols);
        for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
            matvec(packed, scale, x, y);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, E2M1_DOUBLED, SCALE_HALF};
    use crate::simd::{hsum, prefetch_ahead};

    /// Vectors per pass of the batched kernel (accumulators live on the stack).
    pub(super) const MAX_BATCH: usize = 32;

    /// The 32 doubled weights of one block as int8: even columns, then odd columns.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn decode_i8(bytes: *const u8) -> __m256i {
        // SAFETY: the callers pass a pointer to 16 readable bytes (one block of a checked row).
        let raw = unsafe { _mm_loadu_si128(bytes.cast()) };
        let m = _mm_set1_epi8(15);
        let lo = _mm_and_si128(raw, m);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), m);
        // SAFETY: E2M1_DOUBLED is 16 bytes.
        let t = unsafe { _mm_loadu_si128(E2M1_DOUBLED.as_ptr().cast()) };
        _mm256_shuffle_epi8(_mm256_set_m128i(t, t), _mm256_set_m128i(hi, lo))
    }

    /// The doubled weights of one block as four f32 vectors (columns in decode order).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn decode_f32(bytes: *const u8) -> [__m256; 4] {
        let w = decode_i8(bytes);
        let a = _mm256_castsi256_si128(w);
        let b = _mm256_extracti128_si256::<1>(w);
        let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        [f(a), f(_mm_srli_si128::<8>(a)), f(b), f(_mm_srli_si128::<8>(b))]
    }

    #[target_feature(enable = "avx2,fma")]
    /// One accumulator per row, in block order: the same order as [`matmul`], so a vector gives
    /// bit-identical results alone or in a batch (prefill equals token-by-token decode).
    pub(super) fn matvec(packed: &[u8], scale: &[u8], xp: &[f32], y: &mut [f32]) {
        let cols = xp.len();
        let blocks = cols / BLOCK;
        for (r, out) in y.iter_mut().enumerate() {
            let mut acc = _mm256_setzero_ps();
            for b in 0..blocks {
                // SAFETY: block b of row r lies inside `packed` (checked shape), and 32 values of
                // `xp` from b * 32 lie inside it.
                unsafe {
                    if b.is_multiple_of(4) {
                        prefetch_ahead(packed.as_ptr().wrapping_add((r * blocks + b) * 16));
                    }
                    let w = decode_f32(packed.as_ptr().add((r * blocks + b) * 16));
                    let x = xp.as_ptr().add(b * BLOCK);
                    let mut s = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
                    s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x.add(8)), s);
                    s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x.add(16)), s);
                    s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x.add(24)), s);
                    let sc = _mm256_set1_ps(SCALE_HALF[usize::from(*scale.get_unchecked(r * blocks + b))]);
                    acc = _mm256_fmadd_ps(s, sc, acc);
                }
            }
            *out = hsum(acc);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn matmul(packed: &[u8], scale: &[u8], cols: usize, stride: usize, xp: &[f32], ys: &mut [f32]) {
        let n = xp.len() / stride;
        let rows = ys.len() / n;
        let blocks = cols / BLOCK;
        let mut acc = [_mm256_setzero_ps(); MAX_BATCH];
        for r in 0..rows {
            acc[..n].fill(_mm256_setzero_ps());
            for b in 0..blocks {
                // SAFETY: as in `matvec`, for each of the n vectors of `xp`.
                unsafe {
                    let w = decode_f32(packed.as_ptr().add((r * blocks + b) * 16));
                    let sc = _mm256_set1_ps(SCALE_HALF[usize::from(*scale.get_unchecked(r * blocks + b))]);
                    for (v, a) in acc[..n].iter_mut().enumerate() {
                        let x = xp.as_ptr().add(v * stride + b * BLOCK);
                        let mut s = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
                        s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x.add(8)), s);
                        s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x.add(16)), s);
                        s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x.add(24)), s);
                        *a = _mm256_fmadd_ps(s, sc, *a);
                    }
                }
            }
            for (v, a) in acc[..n].iter().enumerate() {
                ys[v * rows + r] = hsum(*a);
            }
        }
    }
}

/// Quantizes `w` (`[rows, cols]`) to MXFP4 the OCP way: each 32-block gets the shared exponent
/// `floor(log2(max|w|)) - 2` (E2M1's largest value is 6 = 1.5 x 2^2), each value the nearest E2M1
/// value of `w / 2^exp` (ties to the even code, saturating at 6). Returns `(packed, scale)`.
pub fn quantize(w: &[f32], cols: usize) -> (Vec<u8>, Vec<u8>) {
    assert!(cols.is_multiple_of(BLOCK) && w.len().is_multiple_of(cols), "MXFP4 needs whole rows of 32k columns");
    let mut packed = vec![0u8; w.len() / 2];
    let mut scale = vec![0u8; w.len() / BLOCK];
    for (b, block) in w.chunks_exact(BLOCK).enumerate() {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 { (amax.log2().floor() as i32 - 2 + 127).clamp(0, 254) } else { 0 };
        scale[b] = e as u8;
        let inv = 1.0 / e8m0(e as u8);
        for (i, v) in block.iter().enumerate() {
            let t = (v * inv).abs();
            // Nearest of the 8 magnitudes; on a tie the even code (smaller mantissa) wins.
            let mut best = 0usize;
            for (c, m) in E2M1[..8].iter().enumerate() {
                let (d, db) = ((t - m).abs(), (t - E2M1[best]).abs());
                if d < db || (d == db && c % 2 == 0 && best % 2 == 1) {
                    best = c;
                }
            }
            let nib = best as u8 | if v.is_sign_negative() && best != 0 { 8 } else { 0 };
            packed[b * 16 + i / 2] |= if i % 2 == 0 { nib } else { nib << 4 };
        }
    }
    (packed, scale)
}
