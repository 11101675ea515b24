//! Strict calls in the `im_` markup: after `<|tool_call_begin|>functions.NAME:IDX
//! <|tool_call_argument_begin|>`, only tokens that keep the arguments a value NAME's schema
//! allows, then only `<|tool_call_end|>`.

use crate::strict::{State, StrictCalls};

impl StrictCalls {
    pub(crate) fn im(&mut self, id: u32, text: &str, [begin, arguments, end]: [u32; 3]) {
        self.state = match std::mem::replace(&mut self.state, State::Outside) {
            _ if id == begin => State::Collecting(String::new()),
            State::Collecting(name) if id == arguments => {
                let name = super::calls::name_of(name.trim()).unwrap_or_default();
                match self.schema(name) {
                    Some(schema) => State::Arguments(Box::new(schema.prefix())),
                    None => State::Free,
                }
            }
            State::Collecting(mut name) => {
                name.push_str(text);
                State::Collecting(name)
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
