//! Chat prompts in the model's own format, token by token: structural markup as special tokens,
//! every piece of text tokenized on its own as plain text, so content can never forge a turn.
//!
//! - Kimi K3 ("XTML", `xtml`): only `<|open|>`, `<|close|>`, `<|sep|>` and `<|end_of_msg|>`
//!   are special tokens; tag names and attributes are ordinary text, each encoded as its own
//!   segment (segment boundaries are token boundaries).
//! - Kimi-Linear and K2 (`im_` turns, `im`): `<|im_system|>`/`<|im_user|>`/`<|im_assistant|>`
//!   NAME `<|im_middle|>` TEXT `<|im_end|>`, tool calls between Kimi's tool-call markers.
//!
//! - K2 / DeepSeek-V3 models that ship a Jinja template: that template (`template`); without
//!   one, K2's `im_` turns.
//!
//! All are checked against Python jinja2 renderings of the releases' own chat templates
//! (fixtures/chat/).

pub use crate::json_style::python_json;
pub use crate::template::{LIMITS as TEMPLATE_LIMITS, Limits as TemplateLimits};

use crate::Dialect;
use crate::message::Writer;
pub use crate::message::{
    Call, ChatError, DEFAULT_EFFORT, IMAGE_PLACEHOLDER, Message, PromptOptions, Role, ToolChoice,
};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Builds token sequences for one model family.
#[derive(Debug)]
pub struct ChatFormat<'t> {
    w: Writer<'t>,
    dialect: Dialect,
    /// K2 / DeepSeek-V3: the model's own template, when it ships one (else K2's `im_` turns).
    template: Option<Result<crate::template::Template, String>>,
}

impl<'t> ChatFormat<'t> {
    pub fn new(tok: &'t Tokenizer, dialect: Dialect) -> Self {
        Self::with_limits(tok, dialect, TEMPLATE_LIMITS)
    }

    /// As [`new`](Self::new), the model's template run within `limits`.
    pub fn with_limits(tok: &'t Tokenizer, dialect: Dialect, limits: TemplateLimits) -> Self {
        let template = match (dialect, tok.chat_template()) {
            (Dialect::Template, Some(source)) => {
                Some(crate::template::Template::with_limits(source, limits).map_err(|e| e.to_string()))
            }
            _ => None,
        };
        ChatFormat { w: Writer { tok }, dialect, template }
    }

    /// Renders a probe conversation (a system turn, tools declared, a user turn, an assistant
    /// turn with reasoning and a tool call, its result, another user turn): a model whose chat
    /// template fails or runs past its limits is refused when it is converted or loaded, not at
    /// a user's first message.
    pub fn check(&self) -> Result<(), ChatError> {
        if self.template.is_none() {
            return Ok(());
        }
        let tools = r#"[{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#;
        let mut call = Message::new(Role::Assistant, "");
        call.thinking = Some("The user wants the weather.".into());
        call.tool_calls.push(Call {
            id: Some("functions.get_weather:0".into()),
            name: "get_weather".into(),
            arguments: r#"{"city": "Paris"}"#.into(),
        });
        let mut result = Message::new(Role::Tool, "sunny");
        result.tool_call_id = Some("functions.get_weather:0".into());
        result.name = Some("get_weather".into());
        let messages = [
            Message::new(Role::System, "You are helpful."),
            Message::new(Role::User, "Weather in Paris?"),
            call,
            result,
            Message::new(Role::User, "Thanks."),
        ];
        let o = PromptOptions { tools: Some(tools), ..PromptOptions::default() };
        self.prompt_with(&messages, &o).map(drop)
    }

    /// The model's template, or why it cannot be used.
    fn template(&self) -> Option<Result<&crate::template::Template, ChatError>> {
        self.template.as_ref().map(|t| t.as_ref().map_err(|e| ChatError::invalid("chat_template", e.clone())))
    }

    /// The whole conversation, ending with the prompt for the assistant's next turn (with a
    /// thinking section first when `think`).
    pub fn prompt(&self, messages: &[Message], think: bool) -> Result<Vec<u32>, ChatError> {
        self.prompt_with(messages, &PromptOptions { think, ..PromptOptions::default() })
    }

    /// The whole conversation with its options: declarations and system notes first, the
    /// messages (tool calls and results in the model's markup), the format's closing notes, and
    /// the prompt for the assistant's next turn.
    pub fn prompt_with(&self, messages: &[Message], o: &PromptOptions<'_>) -> Result<Vec<u32>, ChatError> {
        self.check_images(messages)?;
        if let Some(t) = self.template() {
            return t?.render(self.w.tok, messages, o, true);
        }
        match self.dialect {
            Dialect::Xtml => self.w.xtml_prompt(messages, o),
            Dialect::Im | Dialect::Template => self.w.im_prompt(messages, o),
        }
    }

    /// A conversation's first user turn, after the system turn `system` (if any), and the prompt
    /// for the answer: the whole conversation as [`prompt_with`](Self::prompt_with) writes it,
    /// so a template's default system turn comes where and as the template writes it
    /// (K2-Instruct's only together with the first message). What `k3-cli chat` feeds first.
    pub fn first_turn(
        &self,
        o: &PromptOptions<'_>,
        system: Option<&str>,
        user: &Message,
    ) -> Result<Vec<u32>, ChatError> {
        let mut messages: Vec<Message> = system.map(|s| Message::new(Role::System, s)).into_iter().collect();
        messages.push(user.clone());
        self.prompt_with(&messages, o)
    }

    /// A later user turn and the prompt for the answer, to follow the tokens of the previous
    /// answer and its end-of-turn id. With a template, the template's own rendering of the turn
    /// (it may differ from the family's: moonshotai-Kimi-K2's writes no names): what it adds
    /// to a conversation of a system turn when `user` follows.
    pub fn next_turn(&self, user: &Message, think: bool) -> Result<Vec<u32>, ChatError> {
        if let Some(t) = self.template() {
            let (t, o) = (t?, PromptOptions { think, ..PromptOptions::default() });
            let system = Message::new(Role::System, "");
            let before = t.render(self.w.tok, std::slice::from_ref(&system), &o, false)?;
            let after = t.render(self.w.tok, &[system, user.clone()], &o, true)?;
            return after.strip_prefix(before.as_slice()).map(<[u32]>::to_vec).ok_or_else(|| {
                ChatError::invalid("chat_template", "renders the conversation before a user turn differently with it")
            });
        }
        let mut out = self.turn(user, think)?;
        out.extend(self.generation_prompt(think)?);
        Ok(out)
    }

    /// What opens the assistant's turn.
    pub fn generation_prompt(&self, think: bool) -> Result<Vec<u32>, TokenizerError> {
        match self.dialect {
            Dialect::Xtml => self.w.xtml_generation_prompt(think),
            Dialect::Im | Dialect::Template => self.w.im_generation_prompt(),
        }
    }

    /// One complete turn with no tool calls or results (those need the conversation around them:
    /// use [`prompt_with`](Self::prompt_with)).
    pub fn turn(&self, m: &Message, think: bool) -> Result<Vec<u32>, ChatError> {
        self.check_images(std::slice::from_ref(m))?;
        match self.dialect {
            Dialect::Xtml => self.w.xtml_turn(m, think),
            Dialect::Im | Dialect::Template => self.w.im_turn(m, &mut Default::default()),
        }
    }

    /// Images only where the format has a place for them: K3's user and system turns, at
    /// character boundaries of the text, in order.
    fn check_images(&self, messages: &[Message]) -> Result<(), ChatError> {
        for (i, m) in messages.iter().enumerate().filter(|(_, m)| !m.images.is_empty()) {
            let what = format!("messages[{i}]");
            if self.dialect != Dialect::Xtml {
                return Err(ChatError::invalid(what, "this model's chat format has no place for images"));
            }
            if !matches!(m.role, Role::User | Role::System) {
                return Err(ChatError::invalid(what, "images go in user or system turns"));
            }
            let ordered = m.images.windows(2).all(|w| w[0] <= w[1]);
            if !ordered || m.images.iter().any(|&at| !m.content.is_char_boundary(at)) {
                return Err(ChatError::invalid(what, "image positions must be ascending character boundaries"));
            }
        }
        Ok(())
    }

    /// The id that ends the assistant's turn.
    pub fn end_of_turn(&self) -> Result<u32, TokenizerError> {
        match self.dialect {
            Dialect::Xtml => self.w.special("<|end_of_msg|>"),
            Dialect::Im | Dialect::Template => self.w.special("<|im_end|>"),
        }
    }
}
