//! The OpenAI request bodies this server reads, checked into what the engine runs: every field
//! it knows validated (a 400 naming the field), the sampling ones in `sampling`, the tools in
//! `tools`; fields it cannot honour (`echo`, `suffix`, `best_of`, `n` > 1) refused by name;
//! fields that ask nothing of the answer (`user`, `metadata`) ignored, as OpenAI's clients expect.

mod sampling;
mod tools;

pub use sampling::{Sampling, Stop};

use k3_engine::config::Family;
use k3_text::chat_format::{Call, ChatError, ChatFormat, Message, PromptOptions, Role, ToolChoice};
use k3_text::tokenizer::Tokenizer;
use k3_text::toolcall::ToolCallReader;
use serde::Deserialize;

use crate::error::ApiError;
use crate::resume_points::{Beginnings, resume_points};
// Also reachable as `api::images`, where `k3-cli chat` reads saved images with it.
pub use crate::images;
use crate::job::ModelInfo;
use crate::request::Prepared;

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    /// With `type: json_schema`: `{"name", "schema", "strict"?, "description"?}`.
    pub json_schema: Option<serde_json::Value>,
}

/// What the answer must be.
#[derive(Debug, Default)]
struct Answer {
    json_object: bool,
    /// The schema's JSON text (shown to K3) and its compiled form.
    schema: Option<(String, std::sync::Arc<k3_text::json_schema::JsonSchema>)>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Return each token's log-probability (and `top_logprobs` alternatives).
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: Sampling,
    pub reasoning_effort: Option<String>,
    /// vLLM's and SGLang's way through to the template: `thinking` / `enable_thinking` (how
    /// Moonshot's docs switch K3's thinking off) are honoured, any other key refused by name.
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    pub response_format: Option<ResponseFormat>,
    /// Kept as the client wrote it: the model is shown the declarations in their own key order.
    pub tools: Option<Box<serde_json::value::RawValue>>,
    pub tool_choice: Option<serde_json::Value>,
    /// `false`: at most one call a turn (the turn ends at the first call read).
    pub parallel_tool_calls: Option<bool>,
    /// llama-server's: stream `prompt_progress` chunks while the prompt is read (a boolean;
    /// anything else is refused by name).
    pub return_progress: Option<serde_json::Value>,
    /// The most tokens of thinking before the model is made to answer (a whole number >= 1),
    /// for a model that thinks, with its thinking on; `max_tokens` still counts thinking and
    /// answer together, as OpenAI's does.
    pub thinking_budget: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
    /// An earlier assistant turn's reasoning, sent back by clients.
    pub reasoning_content: Option<String>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<RequestToolCall>>,
    /// A tool result: the call it answers.
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct RequestToolCall {
    pub id: Option<String>,
    pub function: RequestFunction,
}

#[derive(Debug, Deserialize)]
pub struct RequestFunction {
    pub name: String,
    /// A JSON text (OpenAI's shape), or an object some clients send (kept as written).
    pub arguments: Box<serde_json::value::RawValue>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub image_url: Option<images::ImageUrl>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Return each token's log-probability and this many alternatives (0..=5).
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// The chat routes' thinking switches: a raw prompt has no template to switch, so they are
    /// refused by name rather than ignored.
    pub reasoning_effort: Option<serde_json::Value>,
    pub chat_template_kwargs: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
}

/// A reasoning effort as K3's template takes it (low, high, max; `none` turns thinking off):
/// OpenAI's minimal is low, medium is high, xhigh is max, as every route maps them. `None` for a
/// value no API defines.
pub(crate) fn k3_effort(e: &str) -> Option<&'static str> {
    match e {
        "none" => Some("none"),
        "minimal" | "low" => Some("low"),
        "medium" | "high" => Some("high"),
        "xhigh" | "max" => Some("max"),
        _ => None,
    }
}

fn check_model(asked: Option<&str>, info: &ModelInfo) -> Result<(), ApiError> {
    match asked {
        Some(m) if !m.is_empty() && m != info.id => Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("the model `{m}` does not exist here; this server runs `{}`", info.id),
        )),
        _ => Ok(()),
    }
}

/// Refuses text that cannot fit the context whatever it tokenizes to (every token covers at most
/// `max_token_bytes` bytes), before it is tokenized whole.
fn check_fits(bytes: usize, info: &ModelInfo, field: &str) -> Result<(), ApiError> {
    let most = (info.context as usize).saturating_mul(info.max_token_bytes.max(1));
    if bytes > most {
        // Every token covers at most `max_token_bytes`: at least this many tokens.
        let tokens = bytes.div_ceil(info.max_token_bytes.max(1)) as u64;
        return Err(ApiError::context_exceeded(
            field,
            tokens,
            info.context,
            format!("the prompt is {bytes} bytes of text, more than the context of {} tokens can hold", info.context),
        ));
    }
    Ok(())
}

impl ChatMessage {
    /// Bytes of client text in the message.
    fn text_bytes(&self) -> usize {
        let content = match &self.content {
            None => 0,
            Some(Content::Text(t)) => t.len(),
            Some(Content::Parts(p)) => p.iter().filter_map(|p| p.text.as_ref()).map(String::len).sum(),
        };
        content + self.reasoning_content.as_ref().map_or(0, String::len)
    }

    /// The engine's message for `messages[i]`: text parts and images (data only: nothing is
    /// fetched), tool calls with their arguments as written; the images, in order, checked by
    /// their headers (decoded later, within the budgets: [`images::admit`]).
    fn to_message(&self, i: usize, sees: bool) -> Result<(Message, Vec<images::RequestImage>), ApiError> {
        let role = match self.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(ApiError::bad(
                    &format!("messages[{i}].role"),
                    format!("role `{other}` is not supported (system, developer, user, assistant, tool)"),
                ));
            }
        };
        let (mut at, mut pics) = (Vec::new(), Vec::new());
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let field = format!("messages[{i}].content[{j}]");
                    match (p.kind.as_str(), &p.text, &p.image_url) {
                        ("text", Some(t), _) => text.push_str(t),
                        ("image_url", _, Some(u)) if sees => {
                            let field = format!("{field}.image_url");
                            pics.push(images::probed(u.bytes(&field)?, &format!("{field}.url"))?);
                            at.push(text.len());
                        }
                        ("image_url", ..) => {
                            return Err(ApiError::bad(
                                &field,
                                "this model reads no images (a K3 model converted with its vision tower does)",
                            ));
                        }
                        (kind, ..) => {
                            return Err(ApiError::bad(
                                &field,
                                format!("content part `{kind}` is not supported (text, image_url)"),
                            ));
                        }
                    }
                }
                text
            }
        };
        let mut msg = Message::new(role, content);
        msg.images = at;
        msg.thinking = self.reasoning_content.clone();
        msg.name = self.name.clone();
        msg.tool_call_id = self.tool_call_id.clone();
        for t in self.tool_calls.iter().flatten() {
            let raw = t.function.arguments.get();
            let arguments = serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_string());
            msg.tool_calls.push(Call { id: t.id.clone(), name: t.function.name.clone(), arguments });
        }
        Ok((msg, pics))
    }
}

fn include_usage(o: &Option<StreamOptions>) -> bool {
    o.as_ref().is_some_and(|o| o.include_usage)
}

impl ChatRequest {
    /// Renders the conversation in the model's own chat format: structural markup as special
    /// tokens, every message's text tokenized on its own as plain text, so content can never
    /// forge a turn.
    /// `beginnings`: conversations' beginnings rendered for earlier requests' resume points.
    pub fn prepare(
        &self,
        tok: &Tokenizer,
        info: &ModelInfo,
        stop_bytes: usize,
        beginnings: &Beginnings,
    ) -> Result<Prepared, ApiError> {
        check_model(self.model.as_deref(), info)?;
        let text: usize = self.messages.iter().map(ChatMessage::text_bytes).sum();
        check_fits(text, info, "messages")?;
        let answer = self.answer(info)?;
        if self.messages.is_empty() {
            return Err(ApiError::bad("messages", "messages is empty"));
        }
        let (mut messages, mut images) = (Vec::new(), Vec::new());
        for (i, m) in self.messages.iter().enumerate() {
            let (msg, pics) = m.to_message(i, info.sees)?;
            messages.push(msg);
            images.extend(pics);
        }
        if !images.is_empty() {
            k3_generate::media::check_tokenizer(tok).map_err(|e| ApiError::bad("messages", e.to_string()))?;
        }
        let t = self.tools(&messages, tok, info)?;
        let (tools, tool_choice) = (t.declared.as_deref(), t.choice);
        let think = self.think(info)?;
        let thinking_budget = self.thinking_budget(info, think)?;
        let format = ChatFormat::new(tok, k3_generate::dialect(info.family));
        let internal = |e: k3_text::tokenizer::TokenizerError| {
            ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        };
        let options = PromptOptions {
            think,
            effort: think.then(|| {
                self.reasoning_effort.as_deref().and_then(k3_effort).unwrap_or(k3_text::chat_format::DEFAULT_EFFORT)
            }),
            tools,
            tool_choice,
            json_object: answer.json_object,
            json_schema: answer.schema.as_ref().map(|(text, _)| text.as_str()),
        };
        let prompt = format.prompt_with(&messages, &options).map_err(|e| match e {
            ChatError::Invalid { what, reason } => ApiError::bad(&what, reason),
            ChatError::Tokenizer(e) => internal(e),
        })?;
        let resume_points = resume_points(&format, &messages, &options, &prompt, beginnings);
        let end = format.end_of_turn().map_err(internal)?;
        let stop_ids: Vec<u32> = std::iter::once(end).chain(info.eos.iter().copied().filter(|&e| e != end)).collect();
        let mut params = self.sampling.params(info, prompt.len(), stop_ids, stop_bytes)?;
        params.starts_in_think = think;
        // A budget within max_tokens (OpenAI's max_tokens bounds all a turn writes).
        params.max_thinking = thinking_budget;
        params.max_tokens_counts_thinking = thinking_budget.is_some();
        // K2-Thinking and its kind reason between `<think>` tokens: that text is the reasoning.
        params.think_tags = if info.family == Family::KimiK3 { None } else { tok.think_tags() };
        params.reasoning_apart = think || params.think_tags.is_some();
        params.json_object = answer.json_object;
        params.json_schema = answer.schema.map(|(_, s)| s);
        params.strict_tools = t.strict.iter().map(|(n, s, _)| (n.clone(), s.clone())).collect();
        params.logprobs = self.logprobs()?;
        Ok(Prepared {
            prompt,
            params,
            stream: self.stream,
            include_usage: include_usage(&self.stream_options),
            tools: tools.is_some() && tool_choice != ToolChoice::None,
            single_call: self.parallel_tool_calls == Some(false),
            resume_points,
            images,
            // Only a stream has chunks to carry it; a whole answer is unchanged.
            progress: self.return_progress()? && self.stream,
        })
    }

    /// `return_progress`: a boolean, false when absent.
    fn return_progress(&self) -> Result<bool, ApiError> {
        match &self.return_progress {
            None | Some(serde_json::Value::Null) => Ok(false),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(other) => {
                Err(ApiError::bad("return_progress", format!("return_progress is {other}; give true or false")))
            }
        }
    }

    /// `thinking_budget`: a whole number of tokens, at least 1; refused for a model with no
    /// thinking channel and for K3 with its thinking switched off.
    fn thinking_budget(&self, info: &ModelInfo, think: bool) -> Result<Option<u64>, ApiError> {
        let n = match &self.thinking_budget {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(v) => v.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
                ApiError::bad(
                    "thinking_budget",
                    format!("thinking_budget is {v}; give a whole number of tokens, at least 1"),
                )
            })?,
        };
        if !info.about.thinking {
            return Err(ApiError::bad(
                "thinking_budget",
                format!("{} models have no thinking to budget", info.family.name()),
            ));
        }
        if info.family == Family::KimiK3 && !think {
            return Err(ApiError::bad(
                "thinking_budget",
                "thinking is switched off (reasoning_effort none, or chat_template_kwargs): there is no thinking to budget",
            ));
        }
        Ok(Some(n))
    }

    /// `logprobs` / `top_logprobs`: how many alternatives to report per token, if any.
    fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs, self.top_logprobs) {
            (_, Some(n)) if n > 20 => Err(ApiError::bad("top_logprobs", format!("top_logprobs = {n}; at most 20"))),
            (false, Some(n)) if n > 0 => Err(ApiError::bad("top_logprobs", "top_logprobs needs logprobs: true")),
            (true, n) => Ok(Some(n.unwrap_or(0) as usize)),
            (false, _) => Ok(None),
        }
    }

    /// What `response_format` asks of the answer: text, a JSON object, or a value of a schema.
    fn answer(&self, info: &ModelInfo) -> Result<Answer, ApiError> {
        let Some(f) = &self.response_format else { return Ok(Answer::default()) };
        match f.kind.as_str() {
            "text" => Ok(Answer::default()),
            "json_object" => Ok(Answer { json_object: true, schema: None }),
            "json_schema" => {
                let spec = f.json_schema.as_ref().and_then(serde_json::Value::as_object).ok_or_else(|| {
                    ApiError::bad("response_format.json_schema", "give {\"name\": ..., \"schema\": {...}}")
                })?;
                if let Some(name) =
                    spec.get("name").filter(|n| !n.as_str().is_some_and(|n| !n.is_empty() && n.len() <= 64))
                {
                    return Err(ApiError::bad(
                        "response_format.json_schema.name",
                        format!("{name}: a name of 1 to 64 characters"),
                    ));
                }
                let schema = spec
                    .get("schema")
                    .ok_or_else(|| ApiError::bad("response_format.json_schema.schema", "the schema is missing"))?;
                let compiled = k3_text::json_schema::JsonSchema::compile(schema, &tools::schema_limits(info))
                    .map_err(|e| ApiError::bad("response_format.json_schema.schema", e.to_string()))?;
                Ok(Answer { json_object: false, schema: Some((schema.to_string(), std::sync::Arc::new(compiled))) })
            }
            other => Err(ApiError::bad(
                "response_format",
                format!("response_format `{other}` is not supported (`text`, `json_object` and `json_schema` are)"),
            )),
        }
    }

    /// The declared tools (checked; see [`tools`]) and `tool_choice`; refused for a model that
    /// cannot call tools.
    fn tools(&self, messages: &[Message], tok: &Tokenizer, info: &ModelInfo) -> Result<tools::Tools, ApiError> {
        let t = tools::check(self.tools.as_deref(), self.tool_choice.as_ref(), &tools::schema_limits(info))?;
        let uses_tools =
            t.declared.is_some() || messages.iter().any(|m| m.role == Role::Tool || !m.tool_calls.is_empty());
        if uses_tools && ToolCallReader::new(tok, k3_generate::dialect(info.family)).is_none() {
            return Err(ApiError::bad(
                "tools",
                "this model's tokenizer has no tool-call markers: it cannot call tools",
            ));
        }
        Ok(t)
    }

    /// K3 thinks unless `reasoning_effort` is `none` or `chat_template_kwargs` switches thinking
    /// off; other families have no thinking channel to switch on.
    fn think(&self, info: &ModelInfo) -> Result<bool, ApiError> {
        let switch = self.thinking_switch()?;
        match (info.family, self.reasoning_effort.as_deref(), switch) {
            (_, Some("none"), Some((key, true))) => Err(ApiError::bad(
                &format!("chat_template_kwargs.{key}"),
                "asks for thinking, which reasoning_effort `none` turns off",
            )),
            (Family::KimiK3, Some("none"), _) | (Family::KimiK3, _, Some((_, false))) => Ok(false),
            (Family::KimiK3, None, _) => Ok(true),
            (Family::KimiK3, Some(e), _) if k3_effort(e).is_some() => Ok(true),
            (Family::KimiK3, Some(other), _) => Err(ApiError::bad(
                "reasoning_effort",
                format!(
                    "reasoning_effort `{other}`: give none (thinking off), minimal, low, medium, high, xhigh or max"
                ),
            )),
            (_, _, Some((key, true))) => Err(ApiError::bad(
                &format!("chat_template_kwargs.{key}"),
                format!("{} models have no thinking to switch on", info.family.name()),
            )),
            // No effort to set: the values agent clients send with every request (OpenAI's and
            // K3's names) change nothing.
            (_, Some(e), _) if k3_effort(e).is_none() => Err(ApiError::bad(
                "reasoning_effort",
                format!("reasoning_effort `{e}`: give none, minimal, low, medium, high, xhigh or max"),
            )),
            _ => Ok(false),
        }
    }

    /// `chat_template_kwargs`' thinking switch (`thinking` or `enable_thinking`, a boolean) and
    /// the key it came under; any other key is refused by name, never ignored.
    fn thinking_switch(&self) -> Result<Option<(&str, bool)>, ApiError> {
        let mut switch: Option<(&str, bool)> = None;
        for (key, value) in self.chat_template_kwargs.iter().flatten() {
            let param = format!("chat_template_kwargs.{key}");
            if !matches!(key.as_str(), "thinking" | "enable_thinking") {
                return Err(ApiError::bad(
                    &param,
                    "not a switch this server's chat formats take (they take thinking or enable_thinking)",
                ));
            }
            let Some(on) = value.as_bool() else { return Err(ApiError::bad(&param, "must be true or false")) };
            if switch.is_some_and(|(_, was)| was != on) {
                return Err(ApiError::bad(&param, "disagrees with the other thinking switch"));
            }
            switch = Some((key, on));
        }
        Ok(switch)
    }
}

impl CompletionRequest {
    /// The prompt as plain text (no special tokens from text) or as token ids.
    pub fn prepare(&self, tok: Option<&Tokenizer>, info: &ModelInfo, stop_bytes: usize) -> Result<Prepared, ApiError> {
        check_model(self.model.as_deref(), info)?;
        for (field, given) in
            [("reasoning_effort", &self.reasoning_effort), ("chat_template_kwargs", &self.chat_template_kwargs)]
        {
            if given.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(ApiError::bad(
                    field,
                    "a completion's prompt is sent as it is, with no chat template to switch thinking in: \
                     use /v1/chat/completions",
                ));
            }
        }
        if let Prompt::Text(t) = &self.prompt {
            check_fits(t.len(), info, "prompt")?;
        }
        let encode = |t: &str| {
            tok.map(|k| k.encode(t))
                .ok_or_else(|| ApiError::bad("prompt", "this model embeds no tokenizer: send the prompt as token ids"))
        };
        let prompt = match &self.prompt {
            Prompt::Text(t) => encode(t)?,
            Prompt::Texts(v) if v.len() == 1 => encode(&v[0])?,
            Prompt::Texts(v) => {
                return Err(ApiError::bad("prompt", format!("{} prompts: this server takes one per request", v.len())));
            }
            Prompt::Ids(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= info.vocab) {
                    return Err(ApiError::bad(
                        "prompt",
                        format!("token id {bad} is outside the vocabulary of {}", info.vocab),
                    ));
                }
                ids.clone()
            }
        };
        if prompt.is_empty() {
            return Err(ApiError::bad("prompt", "the prompt is empty"));
        }
        let mut params = self.sampling.params(info, prompt.len(), info.eos.clone(), stop_bytes)?;
        params.logprobs = match self.logprobs {
            None => None,
            Some(n) if n <= 5 => Some(n as usize),
            Some(n) => return Err(ApiError::bad("logprobs", format!("logprobs = {n}; at most 5"))),
        };
        Ok(Prepared {
            prompt,
            params,
            stream: self.stream,
            include_usage: include_usage(&self.stream_options),
            tools: false,
            single_call: false,
            resume_points: Vec::new(),
            images: Vec::new(),
            progress: false,
        })
    }
}
