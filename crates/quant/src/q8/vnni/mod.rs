//! The AVX512-VNNI products and the AVX-512 quantizer of activations.
//!
//! - `weights`: the stored encodings (MXFP4, int4, int8) as the kernels read them.
//! - `lanes`: batches of more than [`FEW`](super::FEW) vectors. A tile of rows is decoded once
//!   into offset bytes and applied to the vectors eight to a register (lane = vector), so a
//!   block's integer dot is whole in one lane before its scale is applied: per 32 columns of a
//!   (row, vector) eight `vpdpbusd` lanes, then one conversion, multiply and multiply-add. Every
//!   (row, vector) follows the scalar reference's order exactly: the reference's bits.
//! - `nibbles`: up to `FEW` vectors against MXFP4 and int4, in the split layout (packed bytes
//!   masked and shifted into even and odd columns, no widening; a vector the same bits alone or
//!   among a few).
//! - `tiles`: up to `FEW` vectors against int8, 4 x 4 register tiles over pairs of blocks (the
//!   same).
//!
//! Rows split over threads change nothing in either.

mod lanes;
mod nibbles;
mod quantize;
mod tiles;
mod weights;

pub(super) use nibbles::matmul as few_nibbles;
pub(super) use quantize::quantize;
pub(super) use weights::{Int8, int4, mxfp4};

use super::{FEW, Q8Batch};
use weights::Weights;

/// `ys` `[n, rows]` = `W X` for more than [`FEW`] vectors (a few take [`few_nibbles`] or, for
/// int8, [`matmul_int8`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL and VNNI; `w` has `rows` rows of `x.cols()` columns, and `ys` holds
/// `x.vectors() * rows` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matmul<W: Weights>(w: &W, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract, passed on.
    unsafe { lanes::matmul(w, rows, x, ys) }
}

/// `ys` `[n, rows]` = `W X` for int8 weights: the few-vector tiles up to [`FEW`] vectors, the
/// lanes kernel above.
///
/// # Safety
/// As for [`matmul`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn matmul_int8(w: &Int8<'_>, rows: usize, x: &Q8Batch, ys: &mut [f32]) {
    // SAFETY: the caller's contract, passed on (no vectors: nothing to compute).
    unsafe {
        match x.vectors() {
            0 => {}
            n if n <= FEW => tiles::matmul_rows(w, rows, x, ys),
            _ => lanes::matmul(w, rows, x, ys),
        }
    }
}
