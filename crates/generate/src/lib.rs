//! # k3-generate
//!
//! A turn on top of the model: a prompt's ids in, tokens and visible text out ([`Generator`],
//! one step at a time; [`Decoder`] for callers that batch the forward passes themselves, as the
//! server does), sampled ([`sample`]) with the model's recommended settings
//! ([`generation_config`]), sped up by drafts from the context ([`speculate`]), images placed in
//! prompts ([`media`]), perplexity and choices scored ([`eval`]), and the [`cache`] of kept
//! states (a RAM tier and a disk tier) that `k3-cli generate`, `chat` and the server resume
//! from. It joins `k3-engine` (the model) and `k3-text` (markup and matching), which know
//! nothing of each other.

pub mod cache;
mod decoder;
pub mod eval;
pub mod generation_config;
mod generator;
pub mod media;
mod params;
pub mod sample;
pub mod speculate;
mod visible;

pub use decoder::{Decoder, Emit};
pub use generator::{Generator, StepStats, Token};
pub use params::{Finish, GenerateParams};

use k3_text::{Tokenizer, TokenizerError};

/// Why a turn cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    // Boxed: the two are large, and every step's result carries this type.
    #[error(transparent)]
    Engine(Box<k3_engine::EngineError>),
    #[error(transparent)]
    Tokenizer(Box<TokenizerError>),
    /// The request's own settings or inputs are wrong (a sampler value, an image, a marker the
    /// tokenizer lacks): the message names the part.
    #[error("{0}")]
    Input(String),
    /// The prompt (after what the session holds) leaves no room for an answer in the planned
    /// context: a caller that can say how to make room matches this.
    #[error("the prompt is {tokens} tokens, which leaves no room in a context of {context} tokens")]
    NoRoom { tokens: usize, context: usize },
}

impl From<k3_engine::EngineError> for GenerateError {
    fn from(e: k3_engine::EngineError) -> Self {
        GenerateError::Engine(Box::new(e))
    }
}

impl From<TokenizerError> for GenerateError {
    fn from(e: TokenizerError) -> Self {
        GenerateError::Tokenizer(Box::new(e))
    }
}

impl From<k3_text::strict::MissingMarker> for GenerateError {
    fn from(e: k3_text::strict::MissingMarker) -> Self {
        GenerateError::Input(e.to_string())
    }
}

/// The tokenizer a WASTE model embeds (`tiktoken.model` with `tokenizer_config.json`, or a
/// Hugging Face `tokenizer.json`); `None` when it embeds neither.
pub fn model_tokenizer(m: &k3_format::Model) -> Option<Result<Tokenizer, TokenizerError>> {
    Tokenizer::from_files(|name| m.blob(name))
}

/// The markup a model family's chats are written in.
pub fn dialect(family: k3_engine::config::Family) -> k3_text::Dialect {
    use k3_engine::config::Family;
    match family {
        Family::KimiK3 => k3_text::Dialect::Xtml,
        Family::KimiLinear => k3_text::Dialect::Im,
        Family::DeepseekV3 => k3_text::Dialect::Template,
    }
}
