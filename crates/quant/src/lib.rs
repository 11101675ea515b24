//! # k3-quant: the arithmetic of every decode step
//!
//! Matrix-vector kernels over stored weight encodings: dense f32/bf16, int8 per-row and int4
//! grouped (trunk), MXFP4 (K3's experts) and the 3-bit VQ codecs (WASTE experts), with their
//! encoders. Every kernel has a scalar reference (`reference` modules, the test oracle) and an
//! AVX2/FMA version chosen at run time ([`cpu::level`]).
//!
//! Conventions: matrices are row-major `[rows, cols]`, `y = W x`, `y` is overwritten. Kernels are
//! single-threaded; callers split rows across threads (`par` does it over a rayon pool, bit for bit
//! the same as one thread). This crate does no I/O.

pub mod bf16dot;
pub mod cpu;
pub mod dense;
pub mod encode;
pub mod expf;
pub mod fp8;
pub mod gemm;
pub mod gemm8;
pub mod int2;
pub mod int4;
pub mod int8;
mod matrix;
pub mod mxfp4;
pub mod par;
pub mod peak;
pub mod q8;
pub mod rng;
pub mod rtn;
mod scratch;
mod simd;
pub mod vecops;
pub mod vq;
pub use matrix::{Activations, Dense, Matrix, ShapeError};
