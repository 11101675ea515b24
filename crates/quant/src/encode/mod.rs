//! The VQ3 encoder, which only conversion uses: codebooks trained per matrix (k-means over
//! residual stages), every chunk's codes searched jointly, and, with calibration, GPTQ's error
//! feedback and coordinate descent on the output error. One public entry, [`encode`] (and
//! [`encode_owned`]), with its options and calibration; the runtime's kernels (`vq`) never need
//! this folder.

mod descent;
mod encoder;
mod gptq;
mod joint;
mod linalg;
mod nearest;
mod search;
mod train;

pub use encoder::{Calibration, EncodeOptions, encode, encode_owned};
