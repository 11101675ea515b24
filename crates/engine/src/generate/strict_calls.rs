//! Strict tools (`"strict": true`): a call's arguments constrained to its function's parameter
//! schema as the model writes them, in Kimi's `im_` markup (Kimi-Linear, K2): after
//! `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>`, only tokens that keep
//! the arguments a value NAME's schema allows, then only `<|tool_call_end|>`.

use std::sync::Arc;

use crate::EngineError;
use crate::json_schema::{JsonSchema, SchemaPrefix};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
enum State {
    Outside,
    /// The call's id so far (`functions.NAME:IDX`).
    Id(String),
    /// Inside a strict function's arguments.
    Arguments(Box<SchemaPrefix>),
    /// Inside the arguments of a function that is not strict.
    Free,
}

#[derive(Debug, Clone)]
pub(super) struct StrictCalls {
    schemas: Vec<(String, Arc<JsonSchema>)>,
    /// `<|tool_call_begin|>`, `<|tool_call_argument_begin|>`, `<|tool_call_end|>`.
    markers: [u32; 3],
    state: State,
}

impl StrictCalls {
    /// `None` without strict tools; an error when the model writes calls in another markup.
    pub(super) fn new(tok: &Tokenizer, schemas: &[(String, Arc<JsonSchema>)]) -> Result<Option<Self>, EngineError> {
        if schemas.is_empty() {
            return Ok(None);
        }
        let m = |name: &str| {
            tok.special(name).ok_or_else(|| {
                EngineError::Input(format!("strict tools need the `{name}` marker, which this model's tokenizer lacks"))
            })
        };
        let markers = [m("<|tool_call_begin|>")?, m("<|tool_call_argument_begin|>")?, m("<|tool_call_end|>")?];
        Ok(Some(StrictCalls { schemas: schemas.to_vec(), markers, state: State::Outside }))
    }

    /// Inside a strict call's arguments: what they are checked against, and the id that ends
    /// them (allowed once they are complete).
    pub(super) fn active(&self) -> Option<(&SchemaPrefix, u32)> {
        match &self.state {
            State::Arguments(p) => Some((p, self.markers[2])),
            _ => None,
        }
    }

    /// Token `id` (text `text`, empty for markers) was written.
    pub(super) fn observe(&mut self, id: u32, text: &str) {
        let [begin, arguments, end] = self.markers;
        self.state = match std::mem::replace(&mut self.state, State::Outside) {
            _ if id == begin => State::Id(String::new()),
            State::Id(name) if id == arguments => {
                let name = crate::toolcall::im::name_of(name.trim()).unwrap_or_default();
                match self.schemas.iter().find(|(n, _)| n == name) {
                    Some((_, schema)) => State::Arguments(Box::new(schema.prefix())),
                    None => State::Free,
                }
            }
            State::Id(mut name) => {
                name.push_str(text);
                State::Id(name)
            }
            State::Arguments(mut p) if id != end => {
                p.push_str(text);
                State::Arguments(p)
            }
            State::Free if id != end => State::Free,
            _ => State::Outside,
        };
    }
}
