//! The checkpoint processor's resize, `PIL.Image.resize(size, BICUBIC)` on 8-bit RGB, computed as
//! Pillow computes it so the tower sees the same pixels: a separable convolution with the Keys
//! cubic (a = -0.5) widened by the scale when shrinking (antialiasing), weights normalized per
//! output pixel then rounded to fixed point with 22 fraction bits, the horizontal pass first
//! into an 8-bit image (rows the vertical pass will not read are skipped), then the vertical
//! pass. Checked byte for byte against Pillow 13 (`fixtures/golden/tiny-k3-vision`).

use crate::Picture;

/// Fraction bits of the fixed-point weights (Pillow's `PRECISION_BITS` for 8-bit images).
const PRECISION_BITS: u32 = 32 - 8 - 2;
const SUPPORT: f64 = 2.0;

fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Per output pixel: the first input pixel read and the fixed-point weights of the inputs read.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

fn taps(in_size: usize, out_size: usize) -> Taps {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = SUPPORT * filterscale;
    let mut first = Vec::with_capacity(out_size);
    let mut weights = Vec::with_capacity(out_size);
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // C's (int) cast truncates toward zero; the clamp makes that the floor here.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let ss = 1.0 / filterscale;
        let k: Vec<f64> = (xmin..xmax).map(|x| bicubic((x as f64 - center + 0.5) * ss)).collect();
        let ww: f64 = k.iter().sum();
        let fixed = k
            .iter()
            .map(|w| {
                let w = if ww != 0.0 { w / ww } else { *w };
                let f = w * f64::from(1u32 << PRECISION_BITS);
                (if f < 0.0 { f - 0.5 } else { f + 0.5 }) as i32
            })
            .collect();
        first.push(xmin);
        weights.push(fixed);
    }
    Taps { first, weights }
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One output value: the fixed-point sum over `n` inputs `stride` apart from `at`.
fn tap(src: &[u8], at: usize, stride: usize, w: &[i32]) -> u8 {
    let mut acc: i32 = 1 << (PRECISION_BITS - 1);
    for (i, &k) in w.iter().enumerate() {
        acc += i32::from(src[at + i * stride]) * k;
    }
    clip8(acc)
}

/// `pic` resized to `width x height` (each at least 1) as Pillow's BICUBIC does.
pub fn bicubic_resize(pic: &Picture, width: u32, height: u32) -> Picture {
    let (iw, ih) = (pic.width as usize, pic.height as usize);
    let (ow, oh) = (width.max(1) as usize, height.max(1) as usize);
    if (iw, ih) == (ow, oh) {
        return pic.clone();
    }
    let vert = taps(ih, oh);
    // Rows the vertical pass reads.
    let y0 = vert.first[0];
    let y1 = vert.first[oh - 1] + vert.weights[oh - 1].len();
    let (rows, tmp_w, tmp): (usize, usize, Vec<u8>) = if iw != ow {
        let horiz = taps(iw, ow);
        let mut out = vec![0u8; (y1 - y0) * ow * 3];
        for (r, row) in out.chunks_exact_mut(ow * 3).enumerate() {
            let base = (y0 + r) * iw * 3;
            for (x, px) in row.chunks_exact_mut(3).enumerate() {
                for (c, v) in px.iter_mut().enumerate() {
                    *v = tap(&pic.rgb, base + horiz.first[x] * 3 + c, 3, &horiz.weights[x]);
                }
            }
        }
        (y1 - y0, ow, out)
    } else {
        (ih, iw, pic.rgb.clone())
    };
    if ih == oh {
        return Picture { width: ow as u32, height: rows as u32, rgb: tmp, had_alpha: pic.had_alpha };
    }
    // The horizontal pass kept only rows y0..y1; without it every row is there.
    let shift = if iw != ow { y0 } else { 0 };
    let stride = tmp_w * 3;
    let mut out = vec![0u8; oh * stride];
    for (y, row) in out.chunks_exact_mut(stride).enumerate() {
        let start = vert.first[y] - shift;
        for (i, v) in row.iter_mut().enumerate() {
            *v = tap(&tmp, start * stride + i, stride, &vert.weights[y]);
        }
    }
    Picture { width: ow as u32, height: oh as u32, rgb: out, had_alpha: pic.had_alpha }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [(200, 135), (150, 101), (7, 3), (3, 7), (1000, 1)] {
            let t = taps(i, o);
            for w in &t.weights {
                let s: i64 = w.iter().map(|&v| i64::from(v)).sum();
                assert!((s - (1 << PRECISION_BITS)).abs() <= w.len() as i64, "{i}->{o}: {s}");
            }
        }
    }

    #[test]
    fn a_flat_picture_stays_flat() {
        let pic = Picture { width: 37, height: 23, rgb: [10u8, 200, 77].repeat(37 * 23), had_alpha: false };
        let out = bicubic_resize(&pic, 11, 30);
        assert_eq!((out.width, out.height), (11, 30));
        assert!(out.rgb.chunks_exact(3).all(|p| p == [10, 200, 77]));
    }
}
