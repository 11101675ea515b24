//! Strict tools (`"strict": true`): a call's arguments held to its function's parameter schema as
//! the model writes them.
//!
//! - Kimi's `im_` markup (Kimi-Linear, K2): after
//!   `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>`, only tokens that keep the
//!   arguments a value NAME's schema allows, then only `<|tool_call_end|>`.
//! - K3's XTML: once `<|open|>call tool="NAME" ...<|sep|>` names a strict function, the call's
//!   arguments are written in the format's `json` form (`<|open|>json type="object"<|sep|>`, one
//!   JSON object, `<|close|>json<|sep|>`, which K3's template also writes and the call reader
//!   reads): the markup around the object is written for the model, the object is constrained,
//!   and the call is closed for it when the object is whole.

use std::sync::Arc;

use crate::Dialect;
use crate::json_schema::{JsonSchema, SchemaPrefix};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub(crate) enum State {
    Outside,
    /// `im_`: the call's id so far (`functions.NAME:IDX`); XTML: a tag's text so far.
    Collecting(String),
    /// Inside a strict function's arguments.
    Arguments(Box<SchemaPrefix>),
    /// Inside the arguments of a function that is not strict.
    Free,
}

/// The markup's tokens.
#[derive(Debug, Clone)]
pub(crate) enum Markup {
    /// `<|tool_call_begin|>`, `<|tool_call_argument_begin|>`, `<|tool_call_end|>`.
    Im([u32; 3]),
    Xtml {
        open: u32,
        sep: u32,
        /// `<|open|>json type="object"<|sep|>`, written for the model.
        json_open: Vec<u32>,
        /// `<|close|>json<|sep|><|close|>call<|sep|>`.
        json_close: Vec<u32>,
    },
}

/// Strict tools were declared but the tokenizer lacks a marker their calls are written with.
#[derive(Debug, Clone, thiserror::Error)]
#[error("strict tools need the `{0}` marker, which this model's tokenizer lacks")]
pub struct MissingMarker(pub String);

/// Holds strict functions' arguments to their schemas as calls are written: the markup's own
/// steps are in the dialects' modules (`im/strict.rs`, `xtml/strict.rs`).
#[derive(Debug, Clone)]
pub struct StrictCalls {
    schemas: Vec<(String, Arc<JsonSchema>)>,
    pub(crate) markup: Markup,
    pub(crate) state: State,
    /// Tokens still to come that the decoder writes for the model (not the model's).
    pub(crate) skip: usize,
}

impl StrictCalls {
    /// `None` without strict tools; the markup is the tokenizer's (`im_` markers, else K3's); an
    /// error when it has neither.
    pub fn new(tok: &Tokenizer, schemas: &[(String, Arc<JsonSchema>)]) -> Result<Option<Self>, MissingMarker> {
        if schemas.is_empty() {
            return Ok(None);
        }
        let m = |name: &str| tok.special(name).ok_or_else(|| MissingMarker(name.to_string()));
        let dialect = if tok.special("<|tool_call_begin|>").is_some() { Dialect::Im } else { Dialect::Xtml };
        let markup = match dialect {
            Dialect::Xtml => {
                let (open, close, sep) = (m("<|open|>")?, m("<|close|>")?, m("<|sep|>")?);
                let mut json_open = vec![open];
                json_open.extend(tok.encode("json type=\"object\""));
                json_open.push(sep);
                let mut json_close = vec![close];
                json_close.extend(tok.encode("json"));
                json_close.extend([sep, close]);
                json_close.extend(tok.encode("call"));
                json_close.push(sep);
                Markup::Xtml { open, sep, json_open, json_close }
            }
            Dialect::Im | Dialect::Template => {
                Markup::Im([m("<|tool_call_begin|>")?, m("<|tool_call_argument_begin|>")?, m("<|tool_call_end|>")?])
            }
        };
        Ok(Some(StrictCalls { schemas: schemas.to_vec(), markup, state: State::Outside, skip: 0 }))
    }

    /// Inside a strict call's arguments: what they are checked against, and the id allowed once
    /// they are whole (`im_`'s end marker; XTML closes the call itself).
    pub fn active(&self) -> Option<(&SchemaPrefix, Option<u32>)> {
        match (&self.state, &self.markup) {
            (State::Arguments(p), Markup::Im([_, _, end])) => Some((p, Some(*end))),
            (State::Arguments(p), Markup::Xtml { .. }) if self.skip == 0 => Some((p, None)),
            _ => None,
        }
    }

    pub(crate) fn schema(&self, name: &str) -> Option<&Arc<JsonSchema>> {
        self.schemas.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }

    /// Token `id` (text `text`, empty for markers) was written; returns the tokens to write for
    /// the model next.
    pub fn observe(&mut self, id: u32, text: &str) -> Vec<u32> {
        if self.skip > 0 {
            self.skip -= 1;
            return Vec::new();
        }
        match self.markup {
            Markup::Im(markers) => {
                self.im(id, text, markers);
                Vec::new()
            }
            Markup::Xtml { .. } => self.xtml(id, text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::toolcall::{Piece, ToolCallReader};

    fn k3_tokenizer() -> Tokenizer {
        crate::tokenizer::k3_test_tokenizer()
    }

    /// A K3 call to a strict tool: the json form is written for the model, the object is held to
    /// the schema, the call is closed for it, and K3's call reader reads the call back.
    #[test]
    fn a_k3_strict_call_is_written_in_the_json_form_and_read_back() {
        let tok = k3_tokenizer();
        let schema = serde_json::json!({"type": "object", "properties": {"city": {"enum": ["Oslo"]}},
            "required": ["city"], "additionalProperties": false});
        let schemas = vec![(
            "get_weather".to_string(),
            Arc::new(JsonSchema::compile(&schema, &crate::json_schema::SchemaLimits::new(4096, 16)).unwrap()),
        )];
        let mut strict = StrictCalls::new(&tok, &schemas).unwrap().unwrap();
        let mut reader = ToolCallReader::new(&tok, Dialect::Xtml).unwrap();
        let mut pieces = Vec::new();
        let mut write = |ids: &[u32], strict: &mut StrictCalls, pieces: &mut Vec<Piece>| -> Vec<u32> {
            let mut forced = Vec::new();
            for &id in ids {
                let text = tok.token_texts().get(id as usize).cloned().flatten().unwrap_or_default();
                forced.extend(strict.observe(id, &text));
                pieces.extend(reader.push(&tok, id, &text));
            }
            forced
        };
        let opening =
            tok.encode_with_specials("<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>");
        let forced = write(&opening, &mut strict, &mut pieces);
        assert_eq!(forced, tok.encode_with_specials("<|open|>json type=\"object\"<|sep|>"));
        assert!(strict.active().is_none(), "the forced markup is not constrained");
        assert!(write(&forced, &mut strict, &mut pieces).is_empty());
        let (p, _) = strict.active().expect("inside the arguments");
        assert!(!p.accepts("{\"city\":\"Paris\"}") && p.accepts("{\"city\":\"Oslo\"}"));
        let forced = write(&tok.encode("{\"city\":\"Oslo\"}"), &mut strict, &mut pieces);
        assert_eq!(forced, tok.encode_with_specials("<|close|>json<|sep|><|close|>call<|sep|>"));
        write(&forced, &mut strict, &mut pieces);
        write(&tok.encode_with_specials("<|close|>tools<|sep|>"), &mut strict, &mut pieces);
        let calls: Vec<_> = pieces.iter().filter_map(|p| if let Piece::Call(c) = p { Some(c) } else { None }).collect();
        assert_eq!(calls.len(), 1, "{pieces:?}");
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("get_weather", "{\"city\":\"Oslo\"}"));
        assert!(strict.active().is_none());
    }
}
