//! Round-to-nearest group quantization: the int4 trunk encoding and the 3-bit baseline the VQ
//! codecs are measured against. A group of values shares one scale; each value is a signed
//! integer in `[-2^(bits-1), 2^(bits-1) - 1]`.

use half::f16;

/// Quantizes one group: returns the scale (rounded to f16, as stored) and the signed levels.
/// Tries a few scales around `max|w| / qmax` and keeps the one with the least squared error.
pub(crate) fn quantize_group(w: &[f32], bits: u32, levels: &mut [i8]) -> f16 {
    let qmin = -(1i32 << (bits - 1));
    let qmax = (1i32 << (bits - 1)) - 1;
    let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        levels.fill(0);
        return f16::ZERO;
    }
    let mut best = (f32::INFINITY, f16::ZERO);
    // Candidate divisors between qmax and -qmin: the largest magnitude lands on the top level or
    // on the (one larger) negative end.
    for step in 0..=8 {
        let div = qmax as f32 + (-qmin - qmax) as f32 * step as f32 / 8.0;
        let s = f16::from_f32(amax / div);
        let sf = s.to_f32();
        if sf == 0.0 {
            continue;
        }
        let err: f32 = w
            .iter()
            .map(|v| {
                let q = (v / sf).round().clamp(qmin as f32, qmax as f32);
                (v - q * sf).powi(2)
            })
            .sum();
        if err < best.0 {
            best = (err, s);
        }
    }
    let sf = best.1.to_f32();
    for (l, v) in levels.iter_mut().zip(w) {
        *l = (v / sf).round().clamp(qmin as f32, qmax as f32) as i8;
    }
    best.1
}

/// Quantizes and dequantizes a row-major matrix (for measuring error): groups of `group` along
/// each row, `bits` per value, f16 scales.
pub fn roundtrip(w: &[f32], cols: usize, bits: u32, group: usize) -> Vec<f32> {
    assert!(cols.is_multiple_of(group), "{cols} columns are not a multiple of the group {group}");
    let mut out = vec![0f32; w.len()];
    let mut levels = vec![0i8; group];
    for (src, dst) in w.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
        let s = quantize_group(src, bits, &mut levels).to_f32();
        for (d, l) in dst.iter_mut().zip(&levels) {
            *d = f32::from(*l) * s;
        }
    }
    out
}
