//! Where a patch is: the learned position table resized to the image's grid (bilinear, as
//! `F.interpolate(..., mode="bilinear", align_corners=False)`), and the 2D rotary angles
//! (`Rope2DPosEmbRepeated`: pairs alternate between the column and the row, the frequencies
//! `10000^(-4i/head_dim)`), both computed in f32 as the reference computes them.

/// The `[h0, w0, d]` table resized to `[h, w, d]`, row-major positions.
pub fn interpolate(table: &[f32], h0: usize, w0: usize, d: usize, h: usize, w: usize) -> Vec<f32> {
    if (h, w) == (h0, w0) {
        return table.to_vec();
    }
    let axis = |inp: usize, out: usize| -> Vec<(usize, usize, f32, f32)> {
        let scale = inp as f32 / out as f32;
        (0..out)
            .map(|o| {
                let src = (scale * (o as f32 + 0.5) - 0.5).max(0.0);
                let i0 = (src as usize).min(inp - 1);
                let i1 = if i0 < inp - 1 { i0 + 1 } else { i0 };
                let l1 = src - i0 as f32;
                (i0, i1, 1.0 - l1, l1)
            })
            .collect()
    };
    let (ys, xs) = (axis(h0, h), axis(w0, w));
    let mut out = vec![0f32; h * w * d];
    for (y, &(y0, y1, hy0, hy1)) in ys.iter().enumerate() {
        for (x, &(x0, x1, wx0, wx1)) in xs.iter().enumerate() {
            let o = &mut out[(y * w + x) * d..][..d];
            let at = |yy: usize, xx: usize| &table[(yy * w0 + xx) * d..][..d];
            let (a, b, c, e) = (at(y0, x0), at(y0, x1), at(y1, x0), at(y1, x1));
            for k in 0..d {
                o[k] = hy0 * (wx0 * a[k] + wx1 * b[k]) + hy1 * (wx0 * c[k] + wx1 * e[k]);
            }
        }
    }
    out
}

/// Per position (row-major over `h x w`) and per pair of a head's `head_dim` values: the
/// rotation's `(cos, sin)`.
pub fn rotary(h: usize, w: usize, head_dim: usize) -> Vec<(f32, f32)> {
    let freqs: Vec<f32> = (0..head_dim / 4).map(|i| 1.0 / 10000f32.powf((4 * i) as f32 / head_dim as f32)).collect();
    let pairs = head_dim / 2;
    let mut out = Vec::with_capacity(h * w * pairs);
    for y in 0..h {
        for x in 0..w {
            for j in 0..pairs {
                let pos = if j % 2 == 0 { x } else { y };
                let angle = pos as f32 * freqs[j / 2];
                let a = f64::from(angle);
                out.push((a.cos() as f32, a.sin() as f32));
            }
        }
    }
    out
}

/// Rotates one head's values in place: pair `j` is `(v[2j], v[2j+1])` as a complex number.
pub fn rotate(v: &mut [f32], rot: &[(f32, f32)]) {
    for (p, &(c, s)) in v.chunks_exact_mut(2).zip(rot) {
        let (a, b) = (p[0], p[1]);
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_keeps_a_constant_and_the_corners_of_a_ramp() {
        let (h0, w0, d) = (4, 4, 2);
        let table: Vec<f32> = (0..h0 * w0).flat_map(|i| [1.5, (i % w0) as f32]).collect();
        let out = interpolate(&table, h0, w0, d, 8, 3);
        assert!(out.chunks_exact(2).all(|p| p[0] == 1.5));
        // Upsampling a ramp along x by 2 (align_corners false): the first column is clamped.
        let wide = interpolate(&table, h0, w0, d, 4, 8);
        let row: Vec<f32> = wide.chunks_exact(2).take(8).map(|p| p[1]).collect();
        assert_eq!(row, [0.0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.0]);
    }

    #[test]
    fn rotation_keeps_the_norm_and_position_zero_is_identity() {
        let rot = rotary(3, 5, 8);
        let mut v = [0.3f32, -1.2, 2.0, 0.5, -0.7, 0.1, 1.1, 0.9];
        let orig = v;
        rotate(&mut v, &rot[..4]);
        assert_eq!(v, orig);
        rotate(&mut v, &rot[(2 * 5 + 4) * 4..][..4]);
        let n = |x: &[f32]| x.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&v) - n(&orig)).abs() < 1e-5);
        assert_ne!(v, orig);
    }
}
