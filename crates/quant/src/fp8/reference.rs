//! The scalar definition of a block-scaled FP8 product (the order is the module's doc): the
//! oracle the SIMD kernels are tested against, bit for bit.

use super::{Fp8Ref, LANES, e4m3};

/// `y = W x`.
pub fn matvec(m: &Fp8Ref<'_>, x: &[f32], y: &mut [f32]) {
    for (r, out) in y.iter_mut().enumerate() {
        *out = row(m, r, x);
    }
}

/// Row `r` times `x`.
pub fn row(m: &Fp8Ref<'_>, r: usize, x: &[f32]) -> f32 {
    let (q, scales) = m.row(r);
    let mut total = [0f32; LANES];
    for ((wb, xb), s) in q.chunks(m.block_cols).zip(x.chunks(m.block_cols)).zip(scales) {
        let mut part = [0f32; LANES];
        let padded = wb.len().next_multiple_of(LANES);
        for c in 0..padded {
            let (w, v) = if c < wb.len() { (e4m3(wb[c]) / 256.0, xb[c]) } else { (0.0, 0.0) };
            part[c % LANES] = w.mul_add(v, part[c % LANES]);
        }
        let s = s * 256.0;
        for (t, p) in total.iter_mut().zip(part) {
            *t = p.mul_add(s, *t);
        }
    }
    reduce(&total)
}

/// The 32 totals summed: the two 16-lane halves added, then the two 8-lane halves, then
/// `simd::hsum`'s order over 8.
pub fn reduce(t: &[f32; LANES]) -> f32 {
    let v: [f32; 16] = std::array::from_fn(|l| t[l] + t[l + 16]);
    let h: [f32; 8] = std::array::from_fn(|l| v[l] + v[l + 8]);
    let s: [f32; 4] = std::array::from_fn(|l| h[l] + h[l + 4]);
    (s[0] + s[2]) + (s[1] + s[3])
}
