//! Tool calls read out of a reply token by token, in the model's own markup: Kimi's `im_`
//! markers (K2, Kimi-Linear; `im`) or K3's XTML `tools` element (`xtml`). Text streams as it
//! comes and each call is whole at its end. Markup is recognized by token id only (a model that
//! writes the characters `<|tool_call_begin|>` or `<|open|>` wrote text); markup that is
//! malformed or cut off ends as the text it was, never as an error.

use crate::Dialect;
use crate::im::calls::ImReader;
pub use crate::message::{Piece, ToolCall};
use crate::tokenizer::Tokenizer;
use crate::xtml::calls::XtmlReader;

/// Reads tool calls out of a reply's tokens.
#[derive(Debug, Clone)]
pub enum ToolCallReader {
    Im(ImReader),
    Xtml(XtmlReader),
}

impl ToolCallReader {
    /// A reader for `family`'s markup; `None` when `tok` lacks the markers (the model cannot call
    /// tools).
    pub fn new(tok: &Tokenizer, dialect: Dialect) -> Option<Self> {
        match dialect {
            Dialect::Xtml => XtmlReader::new(tok).map(ToolCallReader::Xtml),
            Dialect::Im | Dialect::Template => ImReader::new(tok).map(ToolCallReader::Im),
        }
    }

    /// Token `id` of `tok`'s vocabulary, `visible` the text the decoder showed for it (K3's
    /// markup is hidden there, so its reader decodes the token's bytes itself).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, visible: &str) -> Vec<Piece> {
        match self {
            ToolCallReader::Im(r) => r.push(id, visible),
            ToolCallReader::Xtml(r) => {
                let raw = if tok.special_name(id).is_some() {
                    Vec::new()
                } else {
                    tok.decode_bytes(&[id]).unwrap_or_default()
                };
                r.push(id, &raw, visible)
            }
        }
    }

    /// The reply ended: a section left open comes out as the text it was.
    pub fn finish(&mut self) -> Vec<Piece> {
        match self {
            ToolCallReader::Im(r) => r.finish(),
            ToolCallReader::Xtml(r) => r.finish(),
        }
    }
}
