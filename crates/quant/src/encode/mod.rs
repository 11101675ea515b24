//! The VQ3 encoder, which only conversion uses: codebooks trained per matrix (k-means over
//! residual stages), every chunk's codes searched jointly, and, with calibration, GPTQ's error
//! feedback and coordinate descent on the output error. One public entry, [`encode`] (and
//! [`encode_owned`]), with its options and calibration; the runtime's kernels (`vq`) never need
//! this folder.

mod descent;
mod distance;
mod encoder;
mod gptq;
mod joint;
mod linalg;
mod nearest;
mod search;
mod train;

pub use encoder::{Calibration, EncodeOptions, encode, encode_owned};

/// `xs W^T`: `n` inputs (`xs`, `[n, cols]`) through a `[rows, cols]` matrix `w`, `[n, rows]` out,
/// by the blocked `gemm` (calibration computes an expert's activations for its sampled inputs
/// with it: one matrix-vector product per input was a fifth of a calibrated conversion).
pub fn products(xs: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
    use linalg::{Mat, gemm};
    let (n, rows) = (xs.len() / cols.max(1), w.len() / cols.max(1));
    let mut out = vec![0f32; n * rows];
    gemm(1.0, Mat::new(xs, n, cols, cols), Mat::new(w, rows, cols, cols).t(), 0.0, &mut out, rows.max(1));
    out
}
