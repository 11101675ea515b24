//! int4 grouped trunk quantization: `q` u8 `[rows, cols/2]` (low nibble = even column, level =
//! nibble - 8), `scale` f16 `[rows, cols/group]`, `w = (nibble - 8) * scale`.

use half::f16;
use rayon::prelude::*;

use crate::cpu::{Level, level, supported};
use crate::rtn::{Scale, quantize_group};
use crate::simd::with_nibble_order;

/// Round-to-nearest 4-bit quantization in groups of `group` along each row ([`Scale::Few`]: a
/// routed expert's).
pub fn quantize(w: &[f32], cols: usize, group: usize) -> (Vec<u8>, Vec<f16>) {
    quantize_bits(w, cols, group, 4, Scale::Few)
}

/// Round-to-nearest to `bits` (2..=4) signed levels in groups, stored in the int4 layout (levels
/// `[-2^(bits-1), 2^(bits-1) - 1]` are int4 levels): the 3-bit baseline runs on the int4 kernels.
pub fn quantize_bits(w: &[f32], cols: usize, group: usize, bits: u32, scale: Scale) -> (Vec<u8>, Vec<f16>) {
    assert!((2..=4).contains(&bits), "{bits}-bit levels do not fit the int4 layout");
    assert!(group >= 2 && group.is_multiple_of(2) && cols.is_multiple_of(group), "{cols} columns in groups of {group}");
    assert!(w.len().is_multiple_of(cols), "weights are not whole rows of {cols}");
    // Groups are independent: quantized on the pool, in runs long enough to pay for a task.
    let mut q = vec![0u8; w.len() / 2];
    let mut scales = vec![f16::ZERO; w.len() / group];
    q.par_chunks_mut(group / 2).zip(scales.par_iter_mut()).zip(w.par_chunks(group)).with_min_len(4096).for_each_init(
        || vec![0i8; group],
        |levels, ((q, out), src)| {
            *out = quantize_group(src, bits, scale, levels);
            for (b, pair) in q.iter_mut().zip(levels.chunks_exact(2)) {
                *b = (pair[0] + 8) as u8 | ((pair[1] + 8) as u8) << 4;
            }
        },
    );
    (q, scales)
}

#[track_caller]
fn check(q: &[u8], scale: &[f16], cols: usize, group: usize, rows: usize) {
    assert!(group >= 2 && group.is_multiple_of(2) && cols.is_multiple_of(group), "{cols} columns in groups of {group}");
    assert_eq!(q.len(), rows * cols / 2, "packed bytes for [{rows}, {cols}]");
    assert_eq!(scale.len(), rows * cols / group, "scales for [{rows}, {cols}] in groups of {group}");
}

/// `y = W x`.
pub fn matvec(q: &[u8], scale: &[f16], group: usize, x: &[f32], y: &mut [f32]) {
    matvec_at(level(), q, scale, group, x, y)
}

/// [`matvec`] with an explicit kernel level (for tests and benchmarks). The AVX2 and AVX-512
/// kernels handle groups that are multiples of 32; others use the reference. The two SIMD levels
/// sum in different orders (each within rounding of the reference).
pub fn matvec_at(level: Level, q: &[u8], scale: &[f16], group: usize, x: &[f32], y: &mut [f32]) {
    check(q, scale, x.len(), group, y.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 if group.is_multiple_of(32) => with_nibble_order(x, |xp| {
            // SAFETY: `supported` returns Avx2 only when the CPU has AVX2, FMA and F16C; shapes checked.
            unsafe { avx2::matvec::<4>(q, scale, group, xp, y) }
        }),
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 if group.is_multiple_of(32) => with_nibble_order(x, |xp| {
            // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F/BW/VL with AVX2,
            // FMA and F16C; shapes checked.
            unsafe { avx512::matmul_n::<1>(q, scale, group, x.len(), xp, y) }
        }),
        // The scalar level, and groups the SIMD kernel does not take.
        _ => reference::matvec(q, scale, group, x, y),
    }
}

/// `Y = W X` for a batch (`xs` `[n, cols]`, `ys` `[n, rows]`): each 32-weight block unpacked
/// once for four vectors, every (row, vector) summed in exactly [`matvec`]'s order (a batch gives
/// the same bits).
pub fn matmul(q: &[u8], scale: &[f16], group: usize, cols: usize, xs: &[f32], ys: &mut [f32]) {
    matmul_at(level(), q, scale, group, cols, xs, ys)
}

/// [`matmul`] with an explicit kernel level (for tests and benchmarks).
pub fn matmul_at(level: Level, q: &[u8], scale: &[f16], group: usize, cols: usize, xs: &[f32], ys: &mut [f32]) {
    let n = xs.len() / cols.max(1);
    assert!(cols > 0 && xs.len() == n * cols, "xs is not whole {cols}-vectors");
    let rows = ys.len() / n.max(1);
    check(q, scale, cols, group, rows);
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 if group.is_multiple_of(32) => {
            for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                with_nibble_order(xb, |xp| {
                    // SAFETY: `supported` returns Avx512 only when the CPU has AVX-512 F/BW/VL
                    // with AVX2, FMA and F16C; shapes checked, `width` whole vectors.
                    unsafe {
                        match width {
                            4 => avx512::matmul_n::<4>(q, scale, group, cols, xp, yb),
                            3 => avx512::matmul_n::<3>(q, scale, group, cols, xp, yb),
                            2 => avx512::matmul_n::<2>(q, scale, group, cols, xp, yb),
                            _ => avx512::matmul_n::<1>(q, scale, group, cols, xp, yb),
                        }
                    }
                });
            }
        }
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 if group.is_multiple_of(32) => {
            for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                if width == 1 {
                    matvec_at(level, q, scale, group, xb, yb);
                    continue;
                }
                with_nibble_order(xb, |xp| {
                    // SAFETY: `supported` returns Avx2 only when the CPU has AVX2, FMA and F16C;
                    // shapes checked, `width` whole vectors.
                    unsafe { avx2::matmul_width::<4>(width, q, scale, group, cols, xp, yb) }
                });
            }
        }
        // The scalar level, and groups the SIMD kernels do not take.
        _ => {
            for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                matvec_at(level, q, scale, group, x, y);
            }
        }
    }
}

pub mod reference {
    use half::f16;

    pub fn matvec(q: &[u8], scale: &[f16], group: usize, x: &[f32], y: &mut [f32]) {
        let cols = x.len();
        for (r, out) in y.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (c, xv) in x.iter().enumerate() {
                let byte = q[(r * cols + c) / 2];
                let nib = if c % 2 == 0 { byte & 15 } else { byte >> 4 };
                acc += (f32::from(nib) - 8.0) * scale[(r * cols + c) / group].to_f32() * xv;
            }
            *out = acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
