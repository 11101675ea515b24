//! Round-to-nearest group quantization: the int4 encodings, the 3-bit baseline the VQ codecs are
//! measured against and the 2-bit copies. A group of values shares one scale; each value is a signed
//! integer in `[-2^(bits-1), 2^(bits-1) - 1]`.

use half::f16;

/// How a group's scale is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// [`nearest_of_few`]: routed experts, the 3-bit baseline and the 2-bit copies.
    Few,
    /// [`fitted`]: the int4 trunk. Not the experts': on int4 experts it saves 3.5% of the KL, but
    /// int8 activations then add 0.118 of what remains on a bf16 trunk (0.074 before), over the
    /// tenth `--activations auto` allows (docs/EFFICIENCY.md "A fitted int4 scale for the trunk").
    Fitted,
}

/// Quantizes one group: returns the scale (rounded to f16, as stored) and the signed levels.
pub(crate) fn quantize_group(w: &[f32], bits: u32, scale: Scale, levels: &mut [i8]) -> f16 {
    match scale {
        Scale::Few => nearest_of_few(w, bits, levels),
        Scale::Fitted => fitted(w, bits, levels),
    }
}

/// Candidate scales put the value of largest magnitude at `-2^(bits-1) * (1 + k / 80)` levels
/// (`k` in -18..=18: on the negative end, which has one level more, whatever its sign; the
/// scale is negative for a positive one); each candidate's levels are rounded, the scale refit
/// to them by least squares and the levels rounded again. The candidate (before or after its
/// refit), or one of [`nearest_of_few`]'s, with the least squared error wins. The default
/// model's int4 trunk: 11% less KL than [`nearest_of_few`]; at two bits it would cost 8% more.
fn fitted(w: &[f32], bits: u32, levels: &mut [i8]) -> f16 {
    let (qmin, qmax) = (-(1i32 << (bits - 1)) as f32, ((1i32 << (bits - 1)) - 1) as f32);
    let peak = w.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    if peak == 0.0 {
        levels.fill(0);
        return f16::ZERO;
    }
    let round = |s: f32, out: &mut [i8]| {
        for (l, v) in out.iter_mut().zip(w) {
            *l = (v / s).round().clamp(qmin, qmax) as i8;
        }
    };
    let error = |s: f32, l: &[i8]| -> f32 { w.iter().zip(l).map(|(v, q)| (v - f32::from(*q) * s).powi(2)).sum() };
    let mut trial = vec![0i8; w.len()];
    let mut best = (f32::INFINITY, f16::ZERO);
    // Whether `s` was usable (then `trial` holds its levels).
    let mut consider = |s: f16, trial: &mut [i8]| {
        let sf = s.to_f32();
        let usable = sf != 0.0 && sf.is_finite();
        if usable {
            round(sf, trial);
            let e = error(sf, trial);
            if e < best.0 {
                best = (e, s);
            }
        }
        usable
    };
    // [`nearest_of_few`]'s candidates too: never a larger error than it.
    for d in 0..=8 {
        consider(f16::from_f32(peak.abs() / (qmax + (-qmin - qmax) * d as f32 / 8.0)), &mut trial);
    }
    for k in -18..=18 {
        let s = f16::from_f32(peak / (qmin * (1.0 + k as f32 / 80.0)));
        if !consider(s, &mut trial) {
            continue;
        }
        // Least squares for these levels: s = <w, l> / <l, l>.
        let (wl, ll) = w.iter().zip(&trial).fold((0f32, 0f32), |(wl, ll), (v, q)| {
            let q = f32::from(*q);
            (wl + v * q, ll + q * q)
        });
        if ll > 0.0 {
            consider(f16::from_f32(wl / ll), &mut trial);
        }
    }
    round(best.1.to_f32(), levels);
    best.1
}

/// Tries a few scales around `max|w| / qmax` and keeps the one with the least squared error.
fn nearest_of_few(w: &[f32], bits: u32, levels: &mut [i8]) -> f16 {
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
/// each row, `bits` per value, f16 scales chosen by `scale`.
pub fn roundtrip(w: &[f32], cols: usize, bits: u32, group: usize, scale: Scale) -> Vec<f32> {
    assert!(cols.is_multiple_of(group), "{cols} columns are not a multiple of the group {group}");
    let mut out = vec![0f32; w.len()];
    let mut levels = vec![0i8; group];
    for (src, dst) in w.chunks_exact(group).zip(out.chunks_exact_mut(group)) {
        let s = quantize_group(src, bits, scale, &mut levels).to_f32();
        for (d, l) in dst.iter_mut().zip(&levels) {
            *d = f32::from(*l) * s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rng::XorShift;

    fn squared_error(w: &[f32], bits: u32, quantize: fn(&[f32], u32, &mut [i8]) -> f16) -> f32 {
        let mut levels = vec![0i8; w.len()];
        let s = quantize(w, bits, &mut levels).to_f32();
        w.iter().zip(&levels).map(|(v, l)| (v - f32::from(*l) * s).powi(2)).sum()
    }

    /// Heavy-tailed groups, as trained weights are: a Gaussian with one value in eight scaled up.
    fn group(rng: &mut XorShift, n: usize) -> Vec<f32> {
        (0..n).map(|i| rng.gaussian() * if i % 8 == 3 { 3.0 } else { 1.0 }).collect()
    }

    proptest! {
        /// The fitted scale's levels stay in range and never cost more than the few scales it
        /// replaced (whose candidates it tries too).
        #[test]
        fn fitted_is_never_worse_than_the_few(seed in any::<u64>(), bits in 3u32..=4, n in prop::sample::select(vec![8usize, 16, 32, 64])) {
            let w = group(&mut XorShift::new(seed), n);
            let mut levels = vec![0i8; n];
            fitted(&w, bits, &mut levels);
            let end = 1i8 << (bits - 1);
            prop_assert!(levels.iter().all(|l| (-end..end).contains(l)), "{levels:?}");
            prop_assert!(squared_error(&w, bits, fitted) <= squared_error(&w, bits, nearest_of_few));
        }
    }

    /// What the refit buys, in the weights' own error: at 4 bits in groups of 32, at least 5% less
    /// squared error than the few scales (the KL it saves on a trained model is measured in
    /// docs/EFFICIENCY.md); the levels' negative end reached for either sign of the largest value.
    #[test]
    fn fitted_scales_cost_less_error_than_the_few() {
        let mut rng = XorShift::new(57);
        let (mut fit, mut few, mut negative) = (0f64, 0f64, 0);
        for _ in 0..2000 {
            let w = group(&mut rng, 32);
            fit += f64::from(squared_error(&w, 4, fitted));
            few += f64::from(squared_error(&w, 4, nearest_of_few));
            negative += usize::from(fitted(&w, 4, &mut [0; 32]).to_f32() < 0.0);
        }
        assert!(fit < 0.95 * few, "fitted {fit:.1} against {few:.1}");
        assert!((500..1500).contains(&negative), "{negative} of 2000 scales negative");
    }

    /// Nearly every fitted scale is the least-squares scale of its own levels (the refit's; a grid
    /// candidate wins where rounding again moved levels).
    #[test]
    fn fitted_scales_are_nearly_all_their_levels_least_squares_scale() {
        let mut rng = XorShift::new(58);
        let mut refit = 0;
        for _ in 0..2000 {
            let w = group(&mut rng, 32);
            let mut l = [0i8; 32];
            let s = fitted(&w, 4, &mut l);
            let (wl, ll) = w
                .iter()
                .zip(&l)
                .fold((0f32, 0f32), |(a, b), (v, q)| (a + v * f32::from(*q), b + f32::from(*q).powi(2)));
            refit += usize::from(f16::from_f32(wl / ll) == s);
        }
        assert!(refit > 1900, "{refit} of 2000 scales are their levels' least-squares scale");
    }

    #[test]
    fn a_group_of_zeros_has_a_zero_scale() {
        let mut levels = [5i8; 32];
        assert_eq!(fitted(&[0.0; 32], 4, &mut levels), f16::ZERO);
        assert_eq!(levels, [0; 32]);
    }
}
