//! Block scales of the nibble-packed encodings as the integer kernels read them (both levels:
//! `vnni` and `avx2`): one f32 per (row, 32-block).

use std::arch::x86_64::*;

use half::f16;

use super::BLOCK;
use crate::mxfp4::SCALE_HALF;

/// One f32 scale per (row, 32-block).
pub(super) trait BlockScale {
    fn at(&self, r: usize, b: usize) -> f32;

    /// The scales of blocks `4s..4s + 4` of row `r` (a segment of the split layout) as stored,
    /// 0 past the row's `blocks`. Small enough to inline into the kernels' loops: anything else
    /// is [`floats`](Self::floats).
    fn four(&self, r: usize, s: usize, blocks: usize) -> Four;

    /// [`four`](Self::four) one scale at a time: a row's last, partial segment, groups wider
    /// than a block, E8M0's special exponents. Out of line (a call in the loop would spill the
    /// kernels' registers every time).
    #[cold]
    #[inline(never)]
    fn floats(&self, r: usize, s: usize, blocks: usize) -> [f32; 4] {
        std::array::from_fn(|j| if 4 * s + j < blocks { self.at(r, 4 * s + j) } else { 0.0 })
    }
}

/// MXFP4's E8M0 block exponents, with the 1/2 of the doubled E2M1 levels folded in.
pub(super) struct E8m0<'a> {
    pub scale: &'a [u8],
    pub blocks: usize,
}

impl BlockScale for E8m0<'_> {
    #[inline]
    fn at(&self, r: usize, b: usize) -> f32 {
        SCALE_HALF[usize::from(self.scale[r * self.blocks + b])]
    }

    #[inline(always)]
    fn four(&self, r: usize, s: usize, blocks: usize) -> Four {
        let at = r * self.blocks + 4 * s;
        match self.scale.get(at..at + 4) {
            Some(e) if 4 * s + 4 <= blocks => Four::E8m0(u32::from_le_bytes([e[0], e[1], e[2], e[3]])),
            _ => Four::Floats(self.floats(r, s, blocks)),
        }
    }
}

/// int4's f16 group scales (groups a multiple of 32 wide).
pub(super) struct GroupF16<'a> {
    pub scale: &'a [f16],
    pub group: usize,
    pub groups: usize,
}

impl BlockScale for GroupF16<'_> {
    #[inline]
    fn at(&self, r: usize, b: usize) -> f32 {
        let bits = self.scale[r * self.groups + b * BLOCK / self.group].to_bits();
        // F16C directly: `f16::to_f32` outside a target-feature context detects the CPU per call
        // (int4 x 64 vectors measured 30 against 47 G/s with it).
        // SAFETY: F16C comes with every level these kernels run at (`cpu::Level::Avx2` includes
        // it, AVX-512 CPUs have it), SSE with x86_64.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
    }

    #[inline(always)]
    fn four(&self, r: usize, s: usize, blocks: usize) -> Four {
        let at = r * self.groups + 4 * s;
        match self.scale.get(at..at + 4) {
            Some(h) if self.group == BLOCK && 4 * s + 4 <= blocks => {
                Four::F16(h.iter().rev().fold(0u64, |a, v| a << 16 | u64::from(v.to_bits())))
            }
            _ => Four::Floats(self.floats(r, s, blocks)),
        }
    }
}

/// Four block scales as stored ([`BlockScale::four`]), decoded in registers by [`four_ps`].
pub(super) enum Four {
    /// Four E8M0 exponents, the first in the low byte.
    E8m0(u32),
    /// Four f16 bit patterns, the first in the low 16 bits.
    F16(u64),
    Floats([f32; 4]),
}

/// The four scales as f32 lanes.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) fn four_ps(f: Four) -> __m128 {
    match f {
        Four::E8m0(word) => {
            let e = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(word as i32));
            // Exponents 2..=254 are normal halves, 2^(e - 128): their bits are (e - 1) << 23. The
            // rest (subnormal halves, NaN) from the table.
            let odd = _mm_or_si128(_mm_cmpgt_epi32(_mm_set1_epi32(2), e), _mm_cmpeq_epi32(e, _mm_set1_epi32(255)));
            if _mm_movemask_epi8(odd) != 0 {
                let [a, b, c, d] = word.to_le_bytes().map(|e| SCALE_HALF[usize::from(e)]);
                return _mm_setr_ps(a, b, c, d);
            }
            _mm_castsi128_ps(_mm_slli_epi32::<23>(_mm_sub_epi32(e, _mm_set1_epi32(1))))
        }
        Four::F16(h) => _mm_cvtph_ps(_mm_cvtsi64_si128(h as i64)),
        Four::Floats(v) => _mm_setr_ps(v[0], v[1], v[2], v[3]),
    }
}
