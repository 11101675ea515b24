//! Kimi-Linear and K2's `im_` turns, as K2's chat template renders them: tools declared in a
//! `tool_declare` system turn (as Python's `json.dumps` writes them), calls between Kimi's
//! tool-call markers numbered through the conversation (`functions.NAME:IDX`), each result a
//! system-like turn under the tool's name that answers the oldest unanswered call.

use std::collections::VecDeque;

use crate::json_style::python_json;
use crate::message::{ChatError, Message, PromptOptions, Role, Writer};
use crate::tokenizer::TokenizerError;

/// Calls are numbered through the conversation; results answer them in order.
#[derive(Debug, Default)]
pub(crate) struct Numbering {
    calls: usize,
    unanswered: VecDeque<String>,
}

impl Writer<'_> {
    pub(crate) fn im_prompt(&self, messages: &[Message], o: &PromptOptions<'_>) -> Result<Vec<u32>, ChatError> {
        let mut out = self.im_preamble(o)?;
        let mut numbering = Numbering::default();
        for m in messages {
            out.extend(self.im_turn(m, &mut numbering)?);
        }
        out.extend(self.im_generation_prompt()?);
        Ok(out)
    }

    pub(crate) fn im_preamble(&self, o: &PromptOptions<'_>) -> Result<Vec<u32>, ChatError> {
        let mut out = Vec::new();
        if let Some(tools) = o.tools {
            let text = python_json(tools).map_err(|e| ChatError::invalid("tools", format!("not valid JSON: {e}")))?;
            out.push(self.special("<|im_system|>")?);
            out.extend(self.tok.encode("tool_declare"));
            out.push(self.special("<|im_middle|>")?);
            out.extend(self.tok.encode(&text));
            out.push(self.special("<|im_end|>")?);
        }
        Ok(out)
    }

    pub(crate) fn im_generation_prompt(&self) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        self.im_open(&mut out, Role::Assistant, None)?;
        Ok(out)
    }

    pub(crate) fn im_turn(&self, m: &Message, n: &mut Numbering) -> Result<Vec<u32>, ChatError> {
        let mut out = Vec::new();
        self.im_open(&mut out, m.role, m.name.as_deref())?;
        match m.role {
            Role::Tool => {
                let id = n
                    .unanswered
                    .pop_front()
                    .unwrap_or_else(|| format!("functions.{}:{}", m.name.as_deref().unwrap_or("unknown"), n.calls));
                out.extend(self.tok.encode(&format!("## Return of {id}\n{}", m.content)));
            }
            _ => out.extend(self.tok.encode(&m.content)),
        }
        if !m.tool_calls.is_empty() {
            out.push(self.special("<|tool_calls_section_begin|>")?);
            for call in &m.tool_calls {
                let id = format!("functions.{}:{}", call.name, n.calls);
                n.calls += 1;
                out.push(self.special("<|tool_call_begin|>")?);
                out.extend(self.tok.encode(&id));
                out.push(self.special("<|tool_call_argument_begin|>")?);
                out.extend(self.tok.encode(&call.arguments));
                out.push(self.special("<|tool_call_end|>")?);
                n.unanswered.push_back(id);
            }
            out.push(self.special("<|tool_calls_section_end|>")?);
        }
        out.push(self.special("<|im_end|>")?);
        Ok(out)
    }

    /// `<|im_ROLE|>NAME<|im_middle|>`: a tool's result is a system-like turn under its name.
    fn im_open(&self, out: &mut Vec<u32>, role: Role, name: Option<&str>) -> Result<(), TokenizerError> {
        let marker = if role == Role::Tool { "system" } else { role.name() };
        out.push(self.special(&format!("<|im_{marker}|>"))?);
        out.extend(self.tok.encode(name.unwrap_or(role.name())));
        out.push(self.special("<|im_middle|>")?);
        Ok(())
    }
}
