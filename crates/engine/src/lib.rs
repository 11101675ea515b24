//! # k3-engine
//!
//! The model side of k3: reading a checkpoint's config, converting Hugging Face checkpoints to
//! WASTE, and (issue #7 onwards) the Kimi forward pass that streams experts through `k3-io`.

pub mod config;
pub mod convert;
