//! The f64 oracles' shared arithmetic, for the attention layers' oracle tests.

#![allow(dead_code)]

use k3_quant::Matrix;

/// Values uniform in [-scale, scale).
pub fn rand(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    k3_quant::rng::noise(n, seed, 2.0 * scale)
}

pub fn m(w: &[f32], rows: usize, cols: usize) -> Matrix<'_> {
    Matrix::f32(w, rows, cols).unwrap()
}

pub fn mv(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| f64::from(*a) * b).sum()).collect()
}

pub fn rms(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    x.iter().zip(w).map(|(v, g)| v / (ms + eps).sqrt() * f64::from(*g)).collect()
}

pub fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn rel(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every head's softmax-weighted sum of the latent rows `c` (`[len][l]`), each position scored
/// `(qabs . c_t + qext . k_t) * scale` (`qabs` `[H, l]`, `qext` `[H, r]`, `k` `[len][r]`), in f64.
pub fn attend_f64(
    qabs: &[f32],
    qext: &[f32],
    c: &[Vec<f64>],
    k: &[Vec<f64>],
    (l, r): (usize, usize),
    scale: f32,
) -> Vec<f64> {
    let h = qabs.len() / l;
    let dot = |a: &[f32], b: &[f64]| a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum::<f64>();
    let mut want = vec![0f64; h * l];
    for hd in 0..h {
        let s: Vec<f64> = (0..c.len())
            .map(|t| {
                (dot(&qabs[hd * l..(hd + 1) * l], &c[t]) + dot(&qext[hd * r..(hd + 1) * r], &k[t])) * f64::from(scale)
            })
            .collect();
        let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        for (t, p) in e.iter().enumerate() {
            for i in 0..l {
                want[hd * l + i] += p / z * c[t][i];
            }
        }
    }
    want
}

/// Rows of `d` values as f64.
pub fn rows_f64(x: &[f32], d: usize) -> Vec<Vec<f64>> {
    x.chunks(d).map(|r| r.iter().map(|v| f64::from(*v)).collect()).collect()
}
