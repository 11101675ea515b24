//! Strict calls in K3's XTML: once `<|open|>call tool="NAME" ...<|sep|>` names a strict
//! function, its arguments are written in the format's `json` form, the markup around the object
//! written for the model and the object held to the schema; the call is closed for it when the
//! object is whole.

use crate::strict::{Markup, State, StrictCalls};

impl StrictCalls {
    /// K3's `json` opening (or `closing`) markup, to write for the model: its tokens are skipped
    /// as they come back through [`observe`](Self::observe).
    fn forced(&mut self, closing: bool) -> Vec<u32> {
        let Markup::Xtml { json_open, json_close, .. } = &self.markup else { return Vec::new() };
        let ids = if closing { json_close.clone() } else { json_open.clone() };
        self.skip = ids.len();
        ids
    }

    /// K3's markup; returns the tokens to write for the model (cloned only when there are some).
    pub(crate) fn xtml(&mut self, id: u32, text: &str) -> Vec<u32> {
        let Markup::Xtml { open, sep, .. } = self.markup else { return Vec::new() };
        match std::mem::replace(&mut self.state, State::Outside) {
            State::Arguments(mut p) => {
                p.push_str(text);
                if p.complete() {
                    // The object is whole: the json element and the call are closed for it.
                    return self.forced(true);
                }
                self.state = State::Arguments(p);
            }
            _ if id == open => self.state = State::Collecting(String::new()),
            State::Collecting(tag) if id == sep => {
                let strict = super::calls::parse_tag(&tag)
                    .filter(|(name, _)| *name == "call")
                    .and_then(|(_, attrs)| attrs.into_iter().find(|(k, _)| k == "tool").map(|(_, v)| v))
                    .and_then(|tool| self.schema(&tool).cloned());
                if let Some(schema) = strict {
                    self.state = State::Arguments(Box::new(schema.prefix()));
                    return self.forced(false);
                }
            }
            State::Collecting(mut tag) => {
                tag.push_str(text);
                self.state = State::Collecting(tag);
            }
            _ => {}
        }
        Vec::new()
    }
}
