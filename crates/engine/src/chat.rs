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
    /// A tool's result.
    Tool,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's reasoning, kept in the history when the model produced one.
    pub thinking: Option<String>,
    /// The name the turn is written under instead of its role's (a tool result: the tool's).
    pub name: Option<String>,
    /// An assistant turn's tool calls: (function name, arguments as written).
    pub tool_calls: Vec<(String, String)>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message { role, content: content.into(), thinking: None, name: None, tool_calls: Vec::new() }
    }
}

/// A JSON text as Python's `json.dumps` writes it (what Kimi's chat templates render tool
/// declarations with: key order kept, `", "` and `": "` between items, no ASCII escaping).
pub fn python_json(json: &str) -> Result<String, serde_json::Error> {
    // Validate, then respace the text itself: parsing into a map would lose the key order.
    serde_json::from_str::<serde::de::IgnoredAny>(json)?;
    let mut out = String::with_capacity(json.len() + json.len() / 8);
    let mut chars = json.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => {
                // The whole string token, re-escaped as Python does.
                let mut end = i + 1;
                let mut escaped = false;
                for (j, d) in chars.by_ref() {
                    end = j + d.len_utf8();
                    match (escaped, d) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, '"') => break,
                        _ => {}
                    }
                }
                let s: String = serde_json::from_str(&json[i..end])?;
                out.push_str(&serde_json::to_string(&s)?);
            }
            ',' => out.push_str(", "),
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    Ok(out)
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
        self.prompt_with_tools(messages, None, think)
    }

    /// As [`prompt`](Self::prompt), declaring `tools` (a JSON array of OpenAI tool objects, as
    /// [`python_json`] writes it) first; assistant turns' calls and tool results in the model's
    /// markup. Only the `im_` family (Kimi-Linear, K2) declares tools this way.
    pub fn prompt_with_tools(
        &self,
        messages: &[Message],
        tools: Option<&str>,
        think: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        if let Some(t) = tools {
            if self.family != Family::KimiLinear {
                return Err(TokenizerError::Config {
                    file: "tokenizer_config.json".into(),
                    reason: "tool declarations in this model's chat format are not supported yet".into(),
                });
            }
            out.push(self.special("<|im_system|>")?);
            out.extend(self.tok.encode("tool_declare"));
            out.push(self.special("<|im_middle|>")?);
            out.extend(self.tok.encode(t));
            out.push(self.special("<|im_end|>")?);
        }
        // Calls are numbered through the conversation; results answer them in order.
        let (mut calls, mut unanswered) = (0usize, std::collections::VecDeque::new());
        for m in messages {
            out.extend(self.turn_numbered(m, &mut calls, &mut unanswered)?);
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
        self.turn_numbered(m, &mut 0, &mut std::collections::VecDeque::new())
    }

    fn turn_numbered(
        &self,
        m: &Message,
        calls: &mut usize,
        unanswered: &mut std::collections::VecDeque<String>,
    ) -> Result<Vec<u32>, TokenizerError> {
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
                self.kl_open_named(&mut out, m.role, m.name.as_deref())?;
                match m.role {
                    Role::Tool => {
                        let id = unanswered
                            .pop_front()
                            .unwrap_or_else(|| format!("functions.{}:{calls}", m.name.as_deref().unwrap_or("unknown")));
                        out.extend(self.tok.encode(&format!("## Return of {id}\n{}", m.content)));
                    }
                    _ => out.extend(self.tok.encode(&m.content)),
                }
                if !m.tool_calls.is_empty() {
                    out.push(self.special("<|tool_calls_section_begin|>")?);
                    for (name, arguments) in &m.tool_calls {
                        let id = format!("functions.{name}:{calls}");
                        *calls += 1;
                        out.push(self.special("<|tool_call_begin|>")?);
                        out.extend(self.tok.encode(&id));
                        out.push(self.special("<|tool_call_argument_begin|>")?);
                        out.extend(self.tok.encode(arguments));
                        out.push(self.special("<|tool_call_end|>")?);
                        unanswered.push_back(id);
                    }
                    out.push(self.special("<|tool_calls_section_end|>")?);
                }
                out.push(self.special("<|im_end|>")?);
            }
        }
        Ok(out)
    }

    fn kl_open(&self, out: &mut Vec<u32>, role: Role) -> Result<(), TokenizerError> {
        self.kl_open_named(out, role, None)
    }

    /// `<|im_ROLE|>NAME<|im_middle|>`: a tool's result is a system-like turn under its name.
    fn kl_open_named(&self, out: &mut Vec<u32>, role: Role, name: Option<&str>) -> Result<(), TokenizerError> {
        let marker = if role == Role::Tool { "system" } else { role.name() };
        out.push(self.special(&format!("<|im_{marker}|>"))?);
        out.extend(self.tok.encode(name.unwrap_or(role.name())));
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
