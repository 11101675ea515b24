//! Chat prompts in the model's own format.
//!
//! - Kimi K3 ("XTML"): only `<|open|>`, `<|close|>`, `<|sep|>` and `<|end_of_msg|>` are special
//!   tokens; tag names and attributes are ordinary text, each encoded as its own segment (segment
//!   boundaries are token boundaries). A turn is
//!   `<|open|>` `message` ` role` `="` ROLE `"` `<|sep|>` TEXT `<|close|>` `message` `<|sep|>` `<|end_of_msg|>`;
//!   an assistant turn's TEXT wraps `think` and `response` elements the same way.
//! - Kimi-Linear: `<|im_system|>`/`<|im_user|>`/`<|im_assistant|>` ROLE `<|im_middle|>` TEXT `<|im_end|>`.

use crate::config::Family;
use crate::tokenizer::{Tokenizer, TokenizerError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's reasoning, kept in the history when the model produced one.
    pub thinking: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message { role, content: content.into(), thinking: None }
    }
}

/// Builds token sequences for one model family.
#[derive(Debug)]
pub struct ChatFormat<'t> {
    tok: &'t Tokenizer,
    family: Family,
}

impl<'t> ChatFormat<'t> {
    pub fn new(tok: &'t Tokenizer, family: Family) -> Self {
        ChatFormat { tok, family }
    }

    fn special(&self, name: &str) -> Result<u32, TokenizerError> {
        self.tok.special(name).ok_or_else(|| TokenizerError::Config {
            file: "tokenizer_config.json".into(),
            reason: format!("the chat format needs the special token `{name}`, which the tokenizer does not have"),
        })
    }

    /// `<|open|>tag<|sep|>` or `<|close|>tag<|sep|>`.
    fn tag(&self, out: &mut Vec<u32>, marker: &str, tag: &str) -> Result<(), TokenizerError> {
        out.push(self.special(marker)?);
        out.extend(self.tok.encode(tag));
        out.push(self.special("<|sep|>")?);
        Ok(())
    }

    fn k3_open_message(&self, out: &mut Vec<u32>, role: Role) -> Result<(), TokenizerError> {
        out.push(self.special("<|open|>")?);
        for seg in ["message", " role", "=\"", role.name(), "\""] {
            out.extend(self.tok.encode(seg));
        }
        out.push(self.special("<|sep|>")?);
        Ok(())
    }

    /// The whole conversation, ending with the prompt for the assistant's next turn (with a
    /// thinking section first when `think`).
    pub fn prompt(&self, messages: &[Message], think: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        for m in messages {
            out.extend(self.turn(m)?);
        }
        out.extend(self.generation_prompt(think)?);
        Ok(out)
    }

    /// What opens the assistant's turn.
    pub fn generation_prompt(&self, think: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        match self.family {
            Family::KimiK3 => {
                self.k3_open_message(&mut out, Role::Assistant)?;
                self.tag(&mut out, "<|open|>", if think { "think" } else { "response" })?;
            }
            Family::KimiLinear => self.kl_open(&mut out, Role::Assistant)?,
        }
        Ok(out)
    }

    /// One complete turn.
    pub fn turn(&self, m: &Message) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        match self.family {
            Family::KimiK3 => {
                self.k3_open_message(&mut out, m.role)?;
                if m.role == Role::Assistant {
                    self.tag(&mut out, "<|open|>", "think")?;
                    out.extend(self.tok.encode(m.thinking.as_deref().unwrap_or("")));
                    self.tag(&mut out, "<|close|>", "think")?;
                    self.tag(&mut out, "<|open|>", "response")?;
                    out.extend(self.tok.encode(&m.content));
                    self.tag(&mut out, "<|close|>", "response")?;
                } else {
                    out.extend(self.tok.encode(&m.content));
                }
                self.tag(&mut out, "<|close|>", "message")?;
                out.push(self.special("<|end_of_msg|>")?);
            }
            Family::KimiLinear => {
                self.kl_open(&mut out, m.role)?;
                out.extend(self.tok.encode(&m.content));
                out.push(self.special("<|im_end|>")?);
            }
        }
        Ok(out)
    }

    fn kl_open(&self, out: &mut Vec<u32>, role: Role) -> Result<(), TokenizerError> {
        out.push(self.special(&format!("<|im_{}|>", role.name()))?);
        out.extend(self.tok.encode(role.name()));
        out.push(self.special("<|im_middle|>")?);
        Ok(())
    }

    /// The id that ends the assistant's turn.
    pub fn end_of_turn(&self) -> Result<u32, TokenizerError> {
        match self.family {
            Family::KimiK3 => self.special("<|end_of_msg|>"),
            Family::KimiLinear => self.special("<|im_end|>"),
        }
    }
}
