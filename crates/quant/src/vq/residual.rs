//! Codec B kernels: 3 x 256 x 8 residual codes, row-major u8 (`codes[r * items + 3k + s]`).
//! Each 8-chunk is decoded as the sum of three codewords (the codebooks, 24 KB, stay in L1) and
//! multiplied with the (rotated) activations.

use super::VqRef;
use crate::cpu::{Level, supported};

pub(super) fn matvec(level: Level, m: &VqRef<'_>, x: &[f32], y: &mut [f32]) {
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `supported` returns Avx2 only when the CPU has AVX2 and FMA; every code is a u8
        // indexing one of 256 entries, and the codebooks hold 3 x 256 x 8 values.
        Level::Avx2 | Level::Avx512 => unsafe { avx2::matvec(m, x, y) },
        Level::Scalar => reference::matvec(m, x, y),
    }
}

pub mod reference {
    use super::super::VqRef;

    pub fn matvec(m: &VqRef<'_>, x: &[f32], y: &mut [f32]) {
        let items = m.cols / 8 * 3;
        for (r, out) in y.iter_mut().enumerate() {
            let codes = &m.codes[r * items..][..items];
            let mut acc = 0f32;
            for (k, xc) in x.chunks_exact(8).enumerate() {
                for (d, xv) in xc.iter().enumerate() {
                    let w: f32 = (0..3).map(|s| m.codebooks[(s * 256 + usize::from(codes[3 * k + s])) * 8 + d]).sum();
                    acc += w * xv;
                }
            }
            *out = acc * m.scale[r].to_f32();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::VqRef;
    use crate::simd::hsum;

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn matvec(m: &VqRef<'_>, x: &[f32], y: &mut [f32]) {
        assert!(m.codebooks.len() >= 3 * 256 * 8, "residual codebooks hold 3 x 256 x 8 values");
        let items = m.cols / 8 * 3;
        let cb = m.codebooks.as_ptr();
        for (r, out) in y.iter_mut().enumerate() {
            let codes = &m.codes[r * items..][..items];
            let mut acc = [_mm256_setzero_ps(); 2];
            for (k, c) in codes.chunks_exact(3).enumerate() {
                // SAFETY: each code < 256 selects an 8-float entry of its stage's 256; chunk k of x
                // holds 8 floats (cols = 8 x chunks).
                unsafe {
                    let w = _mm256_add_ps(
                        _mm256_add_ps(
                            _mm256_loadu_ps(cb.add(usize::from(c[0]) * 8)),
                            _mm256_loadu_ps(cb.add((256 + usize::from(c[1])) * 8)),
                        ),
                        _mm256_loadu_ps(cb.add((512 + usize::from(c[2])) * 8)),
                    );
                    acc[k & 1] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(8 * k)), acc[k & 1]);
                }
            }
            *out = hsum(_mm256_add_ps(acc[0], acc[1])) * m.scale[r].to_f32();
        }
    }
}
