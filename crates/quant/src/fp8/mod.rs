//! FP8 e4m3 (`float8_e4m3fn`: bias 7, no infinities, `S.1111.111` NaN), the encoding of Kimi
//! K2-Instruct's and DeepSeek-V3/R1's weights. Every e4m3 value is exact in f32 (and bf16), so
//! widening loses nothing: the first piece of products on FP8 weights as stored (#35).

use crate::cpu::{Level, level, supported};

#[cfg(target_arch = "x86_64")]
mod avx2;

/// The value of an e4m3fn byte, from the format's definition (the reference the kernels are
/// tested against).
pub fn e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0xF), f32::from(b & 7));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    sign * if e == 0 { m / 8.0 * 2f32.powi(-6) } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) }
}

/// `out[i] = e4m3(bytes[i])`.
pub fn widen(bytes: &[u8], out: &mut [f32]) {
    widen_at(level(), bytes, out)
}

/// [`widen`] with an explicit kernel level (for tests and benchmarks).
pub fn widen_at(level: Level, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len(), "one value per byte");
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 or Avx512 only when the CPU has AVX2; lengths checked.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::widen(bytes, out) },
        Level::Scalar => out.iter_mut().zip(bytes).for_each(|(o, &b)| *o = e4m3(b)),
    }
}
