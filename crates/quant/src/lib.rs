//! # k3-quant
//!
//! MXFP4, trunk quantization and the 3-bit VQ expert codec: scalar references and AVX2 kernels.
//!
//! Not built yet: this crate is implemented by issue #3. See `docs/ARCHITECTURE.md` for
//! what it will own and what it may depend on.
