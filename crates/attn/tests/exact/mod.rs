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
