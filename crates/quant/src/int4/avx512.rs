//! The AVX-512 kernels. A block's 16 bytes are widened to 16 lanes, one byte a lane, and each
//! nibble looked up in a 16-entry table of its f32 levels with `vpermps`, whose index is a lane's
//! low four bits: the low nibble (even column) as loaded, the high one after a shift. The table
//! holds the levels times the group's scale, so a lookup gives the weight itself: no mask,
//! subtract, conversion or scaling per weight, three shuffles and two FMAs per 32 weights against
//! the AVX2 kernel's eight shuffles, four conversions and five FMAs.
//!
//! A (row, vector) keeps two accumulators (even and odd columns), the same for a vector alone or
//! among a few: a batch gives the bits of its vectors alone.

use std::arch::x86_64::*;

use half::f16;

use crate::simd::prefetch_ahead;

/// `N` nibble-ordered vectors (`xp` `[N, cols]`) against every row, `ys` `[N, rows]`; `N = 1` is
/// the matrix-vector product. One row at a time: its two accumulators a vector hide enough of the
/// FMA's latency, and tiles of rows measured no faster in decode (docs/EFFICIENCY.md).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL, FMA and F16C; `cols` and `group` are multiples of 32, `group`
/// divides `cols`, `q` holds `rows * cols / 2` bytes and `scale` `rows * cols / group` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn matmul_n<const N: usize>(
    q: &[u8],
    scale: &[f16],
    group: usize,
    cols: usize,
    xp: &[f32],
    ys: &mut [f32],
) {
    let rows = ys.len() / N;
    let shape = Shape { group, cols, rows };
    for r in 0..rows {
        // SAFETY: row r exists; the caller's contract for the rest.
        unsafe { row::<N>(q, scale, shape, xp, ys, r) }
    }
}

#[derive(Clone, Copy)]
struct Shape {
    group: usize,
    cols: usize,
    rows: usize,
}

/// Row `r` against the `N` vectors.
///
/// # Safety
/// As for [`matmul_n`], with row `r` inside the matrix.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn row<const N: usize>(
    q: &[u8],
    scale: &[f16],
    Shape { group, cols, rows }: Shape,
    xp: &[f32],
    ys: &mut [f32],
    r: usize,
) {
    let (blocks, per_group, groups) = (cols / 32, group / 32, cols / group);
    let levels = _mm512_setr_ps(-8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
    // Even and odd columns, a vector.
    let mut acc = [[_mm512_setzero_ps(); 2]; N];
    // Sixteen groups' scales, converted together.
    let mut scales = [0f32; 16];
    for g in 0..groups {
        if g % 16 == 0 {
            let k = (groups - g).min(16);
            let mask = if k == 16 { u16::MAX } else { (1u16 << k) - 1 };
            // SAFETY: row r's groups g..g + k lie inside `scale`; a masked load reads no others.
            unsafe {
                let h = _mm256_maskz_loadu_epi16(mask, scale.as_ptr().add(r * groups + g).cast());
                _mm512_storeu_ps(scales.as_mut_ptr(), _mm512_cvtph_ps(h));
            }
        }
        // The group's levels times its scale: exact (a 4-bit level times an f16 has at most 15
        // significant bits), so the table gives each weight's value.
        let table = _mm512_mul_ps(levels, _mm512_set1_ps(scales[g % 16]));
        for b in g * per_group..(g + 1) * per_group {
            // SAFETY: block b of row r (16 bytes) lies inside `q`, and 32 values of each of the N
            // vectors from b * 32 inside `xp`.
            unsafe {
                let at = q.as_ptr().add((r * blocks + b) * 16);
                if b.is_multiple_of(4) {
                    prefetch_ahead(at);
                }
                let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(at.cast()));
                let even = _mm512_permutexvar_ps(v, table);
                let odd = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table);
                for (t, [e, o]) in acc.iter_mut().enumerate() {
                    let x = xp.as_ptr().add(t * cols + b * 32);
                    *e = _mm512_fmadd_ps(even, _mm512_loadu_ps(x), *e);
                    *o = _mm512_fmadd_ps(odd, _mm512_loadu_ps(x.add(16)), *o);
                }
            }
        }
    }
    for (t, [e, o]) in acc.iter().enumerate() {
        ys[t * rows + r] = _mm512_reduce_add_ps(_mm512_add_ps(*e, *o));
    }
}
