#![recursion_limit = "256"]
//! # k3-engine
//!
//! The model: its config, tensor names, weights, memory plan, checksum verification and the Kimi
//! forward pass ([`Engine`]) over a WASTE model, streaming experts through `k3-io`. Text (the
//! tokenizer, chat formats, tool calls) is `k3-text`'s, a turn of generation `k3-generate`'s,
//! conversion `k3-convert`'s.

pub mod budget;
pub mod config;
mod memory_plan;
mod model;
pub mod names;
mod owned;
mod verify;
pub mod weights;

pub use memory_plan::MemoryPlan;
pub use model::{
    ActivationPrecision, Engine, EngineOptions, ExpertApprox, ExpertWeights, ImageWork, Inserted, LayerWalk, Logits,
    LowBitCopies, PromptImage, Ran, RoundedCopies, RoutedToken, RunStats, SavedState, Seq, Session, Span, SpanKind,
    StateFileError, StateFileLayout, StateHeader, TrunkWeights, WALK_GROUP_ROWS, WeightClasses, activate,
    read_state_header, state_ids_bytes, tap,
};
pub use owned::OwnedEngine;
pub use verify::TrunkCheck;

// The types the engine's options and results expose, so callers need this crate alone.
pub use k3_attn::{KvCacheType, MlaForm};
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
