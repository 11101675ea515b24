#![recursion_limit = "256"]
//! # k3-text
//!
//! Text that needs no model: the [`tokenizer`], chat prompts in a model's own format ([`chat_format`]),
//! tool calls read out of a reply ([`toolcall`]) and held to their schemas as they are written
//! ([`strict`]), and JSON answers checked as they grow ([`json_prefix`], [`json_schema`]) over a
//! whole vocabulary at once ([`mask`]).
//!
//! Markup is organised by [`Dialect`]: everything about Kimi's `im_` turns (rendering, reading
//! calls back, strict calls) sits in `im/`, K3's XTML in `xtml/`, a model's own Jinja template
//! in `template.rs`. The model crates do not appear here: `k3-generate` joins the two.

pub mod chat_format;
mod im;
pub mod json_prefix;
pub mod json_schema;
mod json_style;
pub mod mask;
mod message;
pub mod strict;
mod template;
pub mod tokenizer;
pub mod toolcall;
mod xtml;

pub use chat_format::{ChatFormat, Message, Role};
pub use tokenizer::{Tokenizer, TokenizerError};

/// The markup a model's chats and tool calls are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Kimi K3's XTML: `<|open|>`, `<|close|>`, `<|sep|>` and `<|end_of_msg|>` are the only
    /// special tokens; tag names and attributes are text.
    Xtml,
    /// Kimi's `im_` turns and tool-call markers (Kimi-Linear).
    Im,
    /// The model's own Jinja template when its tokenizer carries one, Kimi's `im_` turns when
    /// not (Kimi K2, DeepSeek-V3); tool calls in the `im_` markers either way.
    Template,
}
