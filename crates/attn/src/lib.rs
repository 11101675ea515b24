//! # k3-attn: the attention layers of the Kimi family
//!
//! - [`kda`]: Kimi Delta Attention, a gated delta-rule linear attention with short causal
//!   convolutions; its state is a fixed-size matrix per head.
//! - [`mla`]: gated multi-head latent attention (NoPE, or RoPE for K2 / DeepSeek-V3) over a
//!   compressed per-token cache: decoded in the absorbed form, long prefill chunks in the
//!   expanded form ([`MlaForm`]).
//!
//! Both take the already-normalized layer input and return the layer output (before the
//! residual). Projections are [`k3_quant::Matrix`] views in any stored encoding. Prefill over a
//! chunk gives bit-identical results to stepping token by token (for MLA, in the same
//! [`MlaForm`]). States serialize to bytes so a
//! session can be resumed.

pub mod kda;
mod latents;
pub mod mla;
mod ops;
pub mod rope;
mod state_io;

pub use kda::{Kda, KdaConfig, KdaForm, KdaGate, KdaRun, KdaSeq, KdaState, KdaTape, KdaWeights, OutputGate};
pub use latents::KvCacheType;
pub use mla::{Mla, MlaCache, MlaConfig, MlaForm, MlaSeq, MlaWeights, PositionEmbedding, QPath};

/// Bad weights, shapes or saved state, named precisely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttnError {
    #[error("{layer}: `{tensor}` is [{rows}, {cols}], expected [{want_rows}, {want_cols}]")]
    Shape { layer: String, tensor: &'static str, rows: usize, cols: usize, want_rows: usize, want_cols: usize },
    #[error("{layer}: `{tensor}` has {len} values, expected {want}")]
    Length { layer: String, tensor: &'static str, len: usize, want: usize },
    #[error("{layer}: {reason}")]
    Unsupported { layer: String, reason: String },
    #[error("saved {what} state: {reason}")]
    State { what: &'static str, reason: String },
}
