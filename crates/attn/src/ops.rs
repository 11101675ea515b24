//! Scalar helpers shared by both attention kinds.

use k3_quant::Matrix;

use crate::AttnError;

pub(crate) use k3_quant::vecops::{rms_norm, sigmoid};

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
