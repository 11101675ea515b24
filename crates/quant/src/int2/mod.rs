//! int2 grouped quantization, HOBBIT's low-bit copies of routed experts: `q` u8 `[rows, cols/4]`
//! (byte `i` of a row holds columns `4i .. 4i+3`, two bits each from the lowest; level = crumb -
//! 2), `scale` f16 `[rows, cols/group]`, `w = (crumb - 2) * scale`. The AVX2 kernel is int4's,
//! with a 2-bit block decoder.

use half::f16;

use crate::cpu::{Level, level, supported};
use crate::rtn::{Scale, quantize_group};

/// Round-to-nearest 2-bit quantization in groups of `group` (a multiple of 4) along each row.
pub fn quantize(w: &[f32], cols: usize, group: usize) -> (Vec<u8>, Vec<f16>) {
    assert!(group >= 4 && group.is_multiple_of(4) && cols.is_multiple_of(group), "{cols} columns in groups of {group}");
    assert!(w.len().is_multiple_of(cols), "weights are not whole rows of {cols}");
    let mut q = vec![0u8; w.len() / 4];
    let mut scale = vec![f16::ZERO; w.len() / group];
    let mut levels = vec![0i8; group];
    for ((q, s), src) in q.chunks_exact_mut(group / 4).zip(scale.iter_mut()).zip(w.chunks_exact(group)) {
        *s = quantize_group(src, 2, Scale::Few, &mut levels);
        for (b, four) in q.iter_mut().zip(levels.chunks_exact(4)) {
            *b = four.iter().enumerate().fold(0u8, |acc, (j, l)| acc | (((l + 2) as u8) << (2 * j)));
        }
    }
    (q, scale)
}

#[track_caller]
fn check(q: &[u8], scale: &[f16], cols: usize, group: usize, rows: usize) {
    assert!(group >= 4 && group.is_multiple_of(4) && cols.is_multiple_of(group), "{cols} columns in groups of {group}");
    assert_eq!(q.len(), rows * cols / 4, "packed bytes for [{rows}, {cols}]");
    assert_eq!(scale.len(), rows * cols / group, "scales for [{rows}, {cols}] in groups of {group}");
}

/// Reorders each 32-block of every vector in `xs` to the order a block of crumbs decodes in:
/// columns 0, 4, .., 28, then 1, 5, .., 29, and so on.
fn crumb_order(xs: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(xs.len());
    for b in xs.chunks_exact(32) {
        for j in 0..4 {
            out.extend((0..8).map(|i| b[4 * i + j]));
        }
    }
    out
}

/// `y = W x`.
pub fn matvec(q: &[u8], scale: &[f16], group: usize, x: &[f32], y: &mut [f32]) {
    matvec_at(level(), q, scale, group, x, y)
}

/// [`matvec`] with an explicit kernel level (for tests and benchmarks). The AVX2 kernel (also
/// the AVX-512 level's) takes groups that are multiples of 32; others use the reference.
pub fn matvec_at(level: Level, q: &[u8], scale: &[f16], group: usize, x: &[f32], y: &mut [f32]) {
    check(q, scale, x.len(), group, y.len());
    match supported(level) {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 | Level::Avx512 if group.is_multiple_of(32) => {
            let xp = crumb_order(x);
            // SAFETY: `supported` returns Avx2 or Avx512 only when the CPU has AVX2, FMA and F16C;
            // shapes checked.
            unsafe { crate::int4::avx2::matvec::<2>(q, scale, group, &xp, y) }
        }
        _ => reference::matvec(q, scale, group, x, y),
    }
}

/// `Y = W X` for a batch (`xs` `[n, cols]`, `ys` `[n, rows]`): each block unpacked once for up to
/// four vectors, every (row, vector) summed in exactly [`matvec`]'s order.
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
        Level::Avx2 | Level::Avx512 if group.is_multiple_of(32) => {
            for (width, xb, yb) in crate::simd::groups(xs, ys, cols, rows) {
                let xp = crumb_order(xb);
                // SAFETY: as in `matvec_at`; `width` whole vectors.
                unsafe { crate::int4::avx2::matmul_width::<2>(width, q, scale, group, cols, &xp, yb) }
            }
        }
        _ => {
            for (x, y) in xs.chunks_exact(cols).zip(ys.chunks_exact_mut(rows)) {
                reference::matvec(q, scale, group, x, y);
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
                let crumb = (q[(r * cols + c) / 4] >> (2 * (c % 4))) & 3;
                acc += (f32::from(crumb) - 2.0) * scale[(r * cols + c) / group].to_f32() * xv;
            }
            *out = acc;
        }
    }
}
