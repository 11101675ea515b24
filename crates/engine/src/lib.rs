#![recursion_limit = "256"]
//! # k3-engine
//!
//! The model side of k3: the model's config and the Kimi forward pass ([`model::Engine`]) over a
//! WASTE model, generation, and the text around it (tokenizer, chat formats, tool calls).
//! Conversion is `k3-convert`'s.

pub mod budget;
pub mod chat;
pub mod config;
pub mod eval;
pub mod generate;
pub mod generation_config;
pub mod json_prefix;
pub mod json_schema;
pub mod media;
mod model;
pub mod names;
pub mod owned;
pub mod plan;
pub mod sample;
pub mod speculate;
pub mod state_store;
pub mod tokenizer;
pub mod toolcall;
pub mod verify;
pub mod weights;

pub use model::{
    ActivationPrecision, Engine, EngineOptions, ExpertApprox, ImageWork, Inserted, LayerState, LayerWalk, Logits,
    LowBit, LowBitCopies, RoutedToken, RunStats, STATE_FILE_VERSION, SavedState, Seq, Session, Span, SpanKind,
    StateFileError, StateFileLayout, StateHeader, WALK_GROUP_ROWS, activate, read_state_header, tap,
};
pub use owned::OwnedEngine;
pub use plan::MemoryPlan;

// The types the engine's options and results expose, so callers need this crate alone.
pub use k3_format::{Model, OpenOptions, OutputFile, write_atomic};
pub use k3_io::{CacheStats, Policy};
pub use k3_router::UsageHistory;
pub use k3_router::lookahead::{LookaheadStats, Predictor};

/// Why a model cannot be run, or an input cannot be processed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Format(#[from] k3_format::FormatError),
    #[error(transparent)]
    Attn(#[from] k3_attn::AttnError),
    #[error(transparent)]
    ConfigFile(#[from] config::ConfigError),
    #[error(
        "{source}\nthe model is damaged: `k3-cli verify MODEL` lists every bad part (convert or copy it again); \
         --no-verify skips this check for a model verified before"
    )]
    Damaged {
        #[source]
        source: k3_format::FormatError,
    },
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error("model config: {0}")]
    Config(String),
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Input(String),
    #[error("reading an expert: {0}")]
    Io(#[from] k3_io::IoError),
    #[error("expert record (layer {layer}, expert {expert}): {source}; `k3-cli verify` checks the whole model")]
    Expert {
        layer: u32,
        expert: u32,
        #[source]
        source: k3_io::IoError,
    },
}
