//! Kimi's `im_` tool-call markup (K2, Kimi-Linear): after the text,
//! `<|tool_calls_section_begin|>`, then per call
//! `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|>`,
//! then `<|tool_calls_section_end|>`.

use crate::message::{Piece, ToolCall};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// Inside the section, between calls.
    Section,
    /// Reading a call's id.
    Id,
    /// Reading a call's arguments.
    Arguments,
}

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARGUMENTS: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

/// Reads tool calls out of a reply's tokens.
#[derive(Debug, Clone)]
pub struct ImReader {
    markers: [u32; 5],
    state: State,
    id: String,
    arguments: String,
    /// The open section as written, markers spelled out: what is shown if it never closes well.
    raw: String,
}

impl ImReader {
    /// A reader for `tok`'s markers; `None` when the tokenizer has no tool-call markers (the model
    /// cannot call tools).
    pub fn new(tok: &Tokenizer) -> Option<Self> {
        let m = |name| tok.special(name);
        let markers = [m(SECTION_BEGIN)?, m(SECTION_END)?, m(CALL_BEGIN)?, m(ARGUMENTS)?, m(CALL_END)?];
        Some(ImReader { markers, state: State::Text, id: String::new(), arguments: String::new(), raw: String::new() })
    }

    /// Token `id`, whose text is `text` (empty for special tokens).
    pub fn push(&mut self, id: u32, text: &str) -> Vec<Piece> {
        let [section_begin, section_end, call_begin, arguments, call_end] = self.markers;
        let marker = [SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGUMENTS, CALL_END]
            .into_iter()
            .zip(self.markers)
            .find(|(_, m)| *m == id)
            .map(|(name, _)| name);
        if self.state != State::Text {
            self.raw.push_str(marker.unwrap_or(text));
        }
        match (self.state, id) {
            (State::Text, i) if i == section_begin => {
                self.state = State::Section;
                self.raw = SECTION_BEGIN.to_string();
                Vec::new()
            }
            (State::Text, _) if text.is_empty() => Vec::new(),
            (State::Text, _) => vec![Piece::Text(text.to_string())],
            (State::Section, i) if i == call_begin => {
                self.state = State::Id;
                self.id.clear();
                Vec::new()
            }
            (State::Section, i) if i == section_end => {
                self.state = State::Text;
                self.raw.clear();
                Vec::new()
            }
            (State::Section, _) if marker.is_none() && text.trim().is_empty() => Vec::new(),
            (State::Id, i) if i == arguments => {
                self.state = State::Arguments;
                self.arguments.clear();
                Vec::new()
            }
            (State::Id, _) if marker.is_none() => {
                self.id.push_str(text);
                Vec::new()
            }
            (State::Arguments, i) if i == call_end => match name_of(self.id.trim()) {
                Some(name) => {
                    self.state = State::Section;
                    let call = ToolCall {
                        id: self.id.trim().to_string(),
                        name: name.to_string(),
                        arguments: self.arguments.trim().to_string(),
                    };
                    // What was shown as a call is no longer owed as text.
                    self.raw = SECTION_BEGIN.to_string();
                    vec![Piece::Call(call)]
                }
                None => self.bail(),
            },
            (State::Arguments, _) if marker.is_none() => {
                self.arguments.push_str(text);
                Vec::new()
            }
            // A marker out of place: the markup is malformed.
            _ => self.bail(),
        }
    }

    /// The reply ended: a section left open comes out as the text it was.
    pub fn finish(&mut self) -> Vec<Piece> {
        match self.state {
            State::Text => Vec::new(),
            State::Section if self.raw == SECTION_BEGIN => {
                self.state = State::Text;
                self.raw.clear();
                Vec::new()
            }
            _ => self.bail(),
        }
    }

    fn bail(&mut self) -> Vec<Piece> {
        self.state = State::Text;
        vec![Piece::Text(std::mem::take(&mut self.raw))]
    }
}

/// `NAME` of `functions.NAME:IDX` (or `NAME:IDX`).
pub(crate) fn name_of(id: &str) -> Option<&str> {
    let rest = id.strip_prefix("functions.").unwrap_or(id);
    let (name, idx) = rest.rsplit_once(':')?;
    (!name.is_empty() && idx.chars().all(|c| c.is_ascii_digit())).then_some(name)
}
