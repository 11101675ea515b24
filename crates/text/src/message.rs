//! What chats are made of: the messages of a conversation and the options of a prompt (written
//! by `chat` in a model's dialect), and what a reply is read into (`toolcall`). Below every
//! dialect's module, so each dialect and the modules that dispatch to them import it alone.

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

/// A tool call in an assistant turn of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The id the client knows it by (results answer it by this id).
    pub id: Option<String>,
    pub name: String,
    /// The arguments as JSON text, as written.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// An assistant turn's reasoning, kept in the history when the model produced one.
    pub thinking: Option<String>,
    /// The name the turn is written under (a tool result: the tool's).
    pub name: Option<String>,
    /// An assistant turn's tool calls.
    pub tool_calls: Vec<Call>,
    /// A tool result: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// Images in a user or system turn: where each sits in `content` (byte offsets, ascending;
    /// K3 writes the image placeholder there, `k3_generate::media` expands it).
    pub images: Vec<usize>,
}

/// The token K3's chat format writes for an image (its template's `image_prompts` unset).
pub const IMAGE_PLACEHOLDER: &str = "<|kimi_image_placeholder|>";

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            thinking: None,
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            images: Vec::new(),
        }
    }
}

/// OpenAI's `tool_choice`, as far as a template renders it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolChoice {
    #[default]
    Auto,
    /// The model must call a tool.
    Required,
    /// The model must not call one.
    None,
}

/// K3's `thinking_effort` when the caller names none: what its template assumes.
pub const DEFAULT_EFFORT: &str = "max";

/// What a prompt carries besides the messages.
#[derive(Debug, Clone, Default)]
pub struct PromptOptions<'a> {
    /// Open the assistant's turn in the thinking channel (K3).
    pub think: bool,
    /// K3's `thinking_effort` (low, high, max) when thinking; `None` leaves it unsaid.
    pub effort: Option<&'a str>,
    /// The declared tools: a JSON array of OpenAI tool objects, as the client sent it.
    pub tools: Option<&'a str>,
    pub tool_choice: ToolChoice,
    /// The answer must be a JSON object (`response_format: json_object`).
    pub json_object: bool,
    /// The answer must match this JSON schema (`response_format: json_schema`; the schema's
    /// JSON text): K3's format shows it to the model.
    pub json_schema: Option<&'a str>,
}

/// Why a conversation cannot be written in the model's format.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Part of the conversation is malformed: `what` names the part (as a request field).
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
}

impl ChatError {
    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ChatError::Invalid { what: what.into(), reason: reason.into() }
    }
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// As the model wrote it (`functions.NAME:IDX`), what its result is returned under; empty
    /// when the markup has none (K3: the caller names the call).
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (`im_`: as the model wrote them, unchecked; K3: an object built
    /// from the typed arguments, each checked).
    pub arguments: String,
}

/// What a token adds to the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Call(ToolCall),
}

/// Writes token sequences: what every dialect's renderer needs of the tokenizer. The dialects'
/// renderers (`im/render.rs`, `xtml/render.rs`) are methods on it; `ChatFormat` chooses one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'t> {
    pub(crate) tok: &'t Tokenizer,
}

impl Writer<'_> {
    pub(crate) fn special(&self, name: &str) -> Result<u32, TokenizerError> {
        self.tok.special(name).ok_or_else(|| TokenizerError::Config {
            file: "tokenizer_config.json".into(),
            reason: format!("the chat format needs the special token `{name}`, which the tokenizer does not have"),
        })
    }
}
