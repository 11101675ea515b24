//! e4m3 widened eight bytes at a time by moving bits: the magnitude's 7 bits placed under an f32's
//! exponent and mantissa (`<< 20`) read as 2^(e-127) x 1.m (or a denormal m x 2^-129 for e = 0),
//! times 2^120 gives e4m3's 2^(e-7) x 1.m (or m x 2^-9) exactly; the sign ORed back; the NaN
//! pattern blended in.

use std::arch::x86_64::*;

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
