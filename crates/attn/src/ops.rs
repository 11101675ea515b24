//! Scalar helpers shared by both attention kinds.

use k3_quant::Matrix;

use crate::AttnError;

/// `x / sqrt(mean(x^2) + eps) * w`, the mean accumulated in f64.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `ln(1 + e^x)`, and `x` itself above 20 (as PyTorch's softplus threshold).
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

pub(crate) fn check_matrix(
    layer: &str,
    tensor: &'static str,
    m: &Matrix<'_>,
    rows: usize,
    cols: usize,
) -> Result<(), AttnError> {
    if m.rows() != rows || m.cols() != cols {
        return Err(AttnError::Shape {
            layer: layer.to_string(),
            tensor,
            rows: m.rows(),
            cols: m.cols(),
            want_rows: rows,
            want_cols: cols,
        });
    }
    Ok(())
}

pub(crate) fn check_len(layer: &str, tensor: &'static str, v: &[f32], want: usize) -> Result<(), AttnError> {
    if v.len() != want {
        return Err(AttnError::Length { layer: layer.to_string(), tensor, len: v.len(), want });
    }
    Ok(())
}
