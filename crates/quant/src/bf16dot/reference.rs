//! The order every bf16-activation product follows, in plain f32: per (row, vector), for each
//! scale group a dot over its column pairs (the odd column's product added first, then the even
//! one's, each sum rounded — `vdpbf16ps`'s order), applied to the row's sum with one
//! multiply-add of the group's scale; an int8 row's sum times its scale. Sums below f32's normal
//! range flush to zero as `vdpbf16ps`'s do.

use super::{Bf16Batch, Weights, value};

/// One `vdpbf16ps` lane step: `acc` plus the products of two pair words.
pub fn step(acc: f32, w: u32, x: u32) -> f32 {
    let hi = flush(acc + value((w >> 16) as u16) * value((x >> 16) as u16));
    flush(hi + value(w as u16) * value(x as u16))
}

fn flush(x: f32) -> f32 {
    if x.is_subnormal() { 0f32.copysign(x) } else { x }
}

/// `ys` `[n, rows]` = `W X`, one (row, vector) at a time.
pub fn matmul(w: &Weights<'_>, x: &Bf16Batch, ys: &mut [f32]) {
    let (cols, n) = (x.cols(), x.vectors());
    let rows = w.rows(cols);
    let per_group = w.group_pairs(cols);
    let mut row = vec![0u32; cols / 2];
    for r in 0..rows {
        w.decode_row(r, cols, &mut row);
        for v in 0..n {
            let mut acc = 0f32;
            for (g, words) in row.chunks_exact(per_group).enumerate() {
                let dot = words.iter().enumerate().fold(0f32, |d, (p, wd)| step(d, *wd, x.word(v, g * per_group + p)));
                acc = match w.group_scale(r, g, cols) {
                    Some(s) => dot.mul_add(s, acc),
                    None => dot,
                };
            }
            ys[v * rows + r] = match w.row_scale(r) {
                Some(s) => acc * s,
                None => acc,
            };
        }
    }
}
