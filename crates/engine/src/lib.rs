#![recursion_limit = "256"]
//! # k3-engine
//!
//! The model side of k3: the model's config, converting Hugging Face checkpoints to WASTE, and the
//! Kimi forward pass ([`model::Engine`]) over a WASTE model.

pub mod budget;
pub mod chat;
pub mod config;
pub mod convert;
pub mod eval;
pub mod model;
pub mod sample;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use model::{Engine, EngineOptions, MemoryPlan, RunStats, Session, Span, SpanKind};

/// Why a model cannot be run, or an input cannot be processed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Format(#[from] k3_format::FormatError),
    #[error(transparent)]
    Attn(#[from] k3_attn::AttnError),
    #[error(transparent)]
    ConfigFile(#[from] config::ConfigError),
    #[error("model config: {0}")]
    Config(String),
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Input(String),
    #[error("reading an expert: {0}")]
    Io(#[from] k3_io::IoError),
}
