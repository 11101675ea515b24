//! A `POST /v1/responses` body translated once into the `/v1/chat/completions` body it stands
//! for, which the chat route's own rules then check and render: `input` items into `messages`
//! (earlier items of a stored conversation first), `instructions` a system message before them,
//! function tools into chat tools (written as the client wrote their parameters), `text.format`
//! into `response_format`, `reasoning.effort` into `reasoning_effort`. Every field is honoured,
//! accepted for a stated reason, or refused with a 400 naming it as the client wrote it.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// What a Responses body asks, translated.
#[derive(Debug)]
pub struct Translated {
    /// The chat body's JSON text.
    pub chat: String,
    /// This request's input as Responses items (a string input is one user message).
    pub input: Vec<Value>,
    /// Where each of `chat`'s messages came from, as the client wrote it.
    pub sources: Vec<Source>,
    /// The request's settings as a response echoes them.
    pub echo: Map<String, Value>,
    pub stream: bool,
    pub store: bool,
}

/// Where a chat message came from: its field (`input[3]`, `instructions`, ...) and its calls'.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub field: String,
    pub calls: Vec<String>,
}

/// The fields a Responses body may have; any other is refused by name.
const FIELDS: [&str; 30] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "reasoning",
    "text",
    "parallel_tool_calls",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "include",
    "truncation",
    "service_tier",
    "background",
    "conversation",
    "prompt",
    "max_tool_calls",
    "top_logprobs",
    "stream_options",
    "prompt_cache_retention",
    // k3's own, as on /v1/chat/completions: the sampling seed.
    "seed",
    "context_management",
];

/// Tool types OpenAI runs on its own servers: nothing here runs them.
const HOSTED: [&str; 12] = [
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer_use_preview",
    "computer_use",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "shell",
    "mcp",
];

fn bad(field: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(field, message)
}

/// `field` of `o` unless absent or null.
fn get<'v>(o: &'v Map<String, Value>, field: &str) -> Option<&'v Value> {
    o.get(field).filter(|v| !v.is_null())
}

fn text_of<'v>(o: &'v Map<String, Value>, key: &str, field: &str) -> Result<Option<&'v str>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(bad(field, format!("{} is not a string", short(other)))),
    }
}

fn bool_of(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(key, format!("{} is not true or false", short(other)))),
    }
}

/// A value as an error quotes it: whole when short, else its JSON type.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= 40 {
        return text;
    }
    match v {
        Value::String(_) => "a long string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
        _ => "this value".into(),
    }
}

/// The body's tools with their `parameters` as the client wrote them (key order kept: the
/// model is shown the declarations as written, as on the chat route).
#[derive(Deserialize)]
struct RawTools {
    tools: Option<Vec<Box<RawValue>>>,
}

#[derive(Deserialize)]
struct RawParameters {
    parameters: Option<Box<RawValue>>,
}

/// `bytes` (a JSON object, already parsed into `body`) as a chat body; `earlier`: the stored
/// conversation `previous_response_id` names, as Responses items.
pub fn translate(bytes: &[u8], body: &Value, earlier: &[Value]) -> Result<Translated, ApiError> {
    let o = body.as_object().ok_or_else(|| bad("body", "the request body is not a JSON object"))?;
    if let Some(k) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(k, format!("`{k}` is not a field of a Responses request this server knows")));
    }
    refused(o)?;
    let mut chat = Map::new();
    let mut echo = Map::new();
    if let Some(m) = text_of(o, "model", "model")? {
        chat.insert("model".into(), json!(m));
    }
    let stream = bool_of(o, "stream")?.unwrap_or(false);
    chat.insert("stream".into(), json!(stream));
    sampling(o, &mut chat, &mut echo)?;
    reasoning(o, &mut chat, &mut echo)?;
    text_format(o, &mut chat, &mut echo)?;
    let tools = tools(bytes, o, &mut echo)?;
    tool_choice(o, &mut chat, &mut echo)?;
    let Conversation { messages, sources, input } = conversation(o, earlier, &mut echo)?;
    chat.insert("messages".into(), json!(messages));
    let store = bool_of(o, "store")?.unwrap_or(true);
    echo.insert("store".into(), json!(store));
    for k in ["metadata", "user", "prompt_cache_key", "safety_identifier", "previous_response_id"] {
        echo.insert(k.into(), o.get(k).cloned().unwrap_or(Value::Null));
    }
    if let Some(m) = get(o, "metadata").filter(|m| !m.is_object()) {
        return Err(bad("metadata", format!("{} is not an object of strings", short(m))));
    }
    let mut text = Value::Object(chat).to_string();
    if let Some(t) = tools {
        // The declarations go in as written: `{...}` becomes `{...,"tools":[...]}`.
        text.pop();
        text.push_str(",\"tools\":");
        text.push_str(&t);
        text.push('}');
    }
    Ok(Translated { chat: text, input, sources, echo, stream, store })
}

/// Fields asking for what this server does not do: refused by name unless they ask nothing.
fn refused(o: &Map<String, Value>) -> Result<(), ApiError> {
    if bool_of(o, "background")? == Some(true) {
        return Err(bad("background", "background responses are not supported: send the request and wait"));
    }
    echo_only(o, "conversation", "conversations are not kept here: send previous_response_id or the history")?;
    echo_only(o, "prompt", "stored prompt templates are OpenAI's: send the instructions and input")?;
    echo_only(o, "max_tool_calls", "not supported: parallel_tool_calls false limits a turn to one call")?;
    echo_only(o, "context_management", "not supported: the server compacts nothing; send a shorter history")?;
    echo_only(o, "stream_options", "not supported (no obfuscation is added to streamed events)")?;
    match get(o, "top_logprobs") {
        None => {}
        Some(v) if v.as_u64() == Some(0) => {}
        Some(v) => return Err(bad("top_logprobs", format!("{}: log-probabilities are on /v1/chat/completions", v))),
    }
    match text_of(o, "truncation", "truncation")? {
        None | Some("disabled") => {}
        Some("auto") => {
            return Err(bad(
                "truncation",
                "`auto` is not supported: k3 drops no turns; a conversation that does not fit is refused \
                 (context_length_exceeded): send a shorter one",
            ));
        }
        Some(t) => return Err(bad("truncation", format!("`{t}`: give `disabled` (or leave it out)"))),
    }
    match text_of(o, "service_tier", "service_tier")? {
        None | Some("auto" | "default") => {}
        Some(t) => return Err(bad("service_tier", format!("`{t}`: this server has one tier (auto or default)"))),
    }
    match text_of(o, "prompt_cache_retention", "prompt_cache_retention")? {
        None | Some("in_memory") => {}
        Some(t) => {
            return Err(bad("prompt_cache_retention", format!("`{t}`: the prompt cache keeps states in memory")));
        }
    }
    if let Some(v) = get(o, "include") {
        let list = v.as_array().ok_or_else(|| bad("include", "include is a list of strings"))?;
        for (i, x) in list.iter().enumerate() {
            if x.as_str() != Some("reasoning.encrypted_content") {
                return Err(bad(
                    &format!("include[{i}]"),
                    format!(
                        "{}: not supported (reasoning.encrypted_content is: k3 returns the reasoning as text)",
                        short(x)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A field refused unless absent or null.
fn echo_only(o: &Map<String, Value>, key: &str, why: &str) -> Result<(), ApiError> {
    match get(o, key) {
        None => Ok(()),
        Some(_) => Err(bad(key, why)),
    }
}

/// `max_output_tokens`, `temperature`, `top_p`, `seed`, `parallel_tool_calls`.
fn sampling(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    for (ours, theirs) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("seed", "seed"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ] {
        if let Some(v) = get(o, ours) {
            chat.insert(theirs.into(), v.clone());
        }
        if ours != "seed" {
            echo.insert(ours.into(), o.get(ours).cloned().unwrap_or(Value::Null));
        }
    }
    if echo["parallel_tool_calls"].is_null() {
        echo.insert("parallel_tool_calls".into(), json!(true));
    }
    Ok(())
}

/// `reasoning`: `effort` onto K3's efforts (none, low, high, max); `summary` accepted (k3
/// returns the reasoning itself, not a summary).
fn reasoning(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(r) = get(o, "reasoning") else {
        echo.insert("reasoning".into(), json!({"effort": null, "summary": null}));
        return Ok(());
    };
    let r = r.as_object().ok_or_else(|| bad("reasoning", "reasoning is an object {\"effort\", \"summary\"}"))?;
    if let Some(k) = r.keys().find(|k| !matches!(k.as_str(), "effort" | "summary" | "generate_summary")) {
        return Err(bad(&format!("reasoning.{k}"), "not a field of reasoning (effort, summary)"));
    }
    let effort = text_of(r, "effort", "reasoning.effort")?;
    let k3 = match effort {
        None => None,
        Some("none") => Some("none"),
        Some("minimal" | "low") => Some("low"),
        Some("medium" | "high") => Some("high"),
        Some("xhigh" | "max") => Some("max"),
        Some(e) => {
            return Err(bad(
                "reasoning.effort",
                format!("`{e}`: give none, minimal, low, medium, high, xhigh (or K3's max)"),
            ));
        }
    };
    if let Some(e) = k3 {
        chat.insert("reasoning_effort".into(), json!(e));
    }
    for key in ["summary", "generate_summary"] {
        match text_of(r, key, &format!("reasoning.{key}"))? {
            None | Some("auto" | "concise" | "detailed") => {}
            Some(s) => return Err(bad(&format!("reasoning.{key}"), format!("`{s}`: give auto, concise or detailed"))),
        }
    }
    echo.insert("reasoning".into(), json!({"effort": effort, "summary": r.get("summary").cloned()}));
    Ok(())
}

/// `text`: `format` into `response_format`; `verbosity` only at its default (`medium`).
fn text_format(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let default = json!({"format": {"type": "text"}, "verbosity": "medium"});
    let Some(t) = get(o, "text") else {
        echo.insert("text".into(), default);
        return Ok(());
    };
    let t = t.as_object().ok_or_else(|| bad("text", "text is an object {\"format\", \"verbosity\"}"))?;
    if let Some(k) = t.keys().find(|k| !matches!(k.as_str(), "format" | "verbosity")) {
        return Err(bad(&format!("text.{k}"), "not a field of text (format, verbosity)"));
    }
    match text_of(t, "verbosity", "text.verbosity")? {
        None | Some("medium") => {}
        Some(v) => return Err(bad("text.verbosity", format!("`{v}`: k3 does not steer verbosity (only medium)"))),
    }
    let format = match get(t, "format") {
        None => json!({"type": "text"}),
        Some(f) => f.clone(),
    };
    let f = format.as_object().ok_or_else(|| bad("text.format", "format is an object {\"type\", ...}"))?;
    let kind = text_of(f, "type", "text.format.type")?.unwrap_or("");
    let allowed: &[&str] = match kind {
        "text" | "json_object" => &["type"],
        "json_schema" => &["type", "name", "schema", "strict", "description"],
        other => return Err(bad("text.format.type", format!("`{other}`: give text, json_object or json_schema"))),
    };
    if let Some(k) = f.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(bad(&format!("text.format.{k}"), format!("not a field of a `{kind}` format")));
    }
    let response_format = if kind == "json_schema" {
        let mut spec = f.clone();
        spec.remove("type");
        json!({"type": "json_schema", "json_schema": spec})
    } else {
        json!({"type": kind})
    };
    chat.insert("response_format".into(), response_format);
    echo.insert("text".into(), json!({"format": format, "verbosity": "medium"}));
    Ok(())
}

/// The function tools as chat declarations' JSON text; hosted and custom tools refused by name.
fn tools(bytes: &[u8], o: &Map<String, Value>, echo: &mut Map<String, Value>) -> Result<Option<String>, ApiError> {
    let Some(list) = get(o, "tools") else {
        echo.insert("tools".into(), json!([]));
        return Ok(None);
    };
    let list = list.as_array().ok_or_else(|| bad("tools", "tools is a list of tools"))?;
    let raw: RawTools = serde_json::from_slice(bytes).map_err(|e| bad("tools", e.to_string()))?;
    let raw = raw.tools.unwrap_or_default();
    let mut out = Vec::with_capacity(list.len());
    for (i, (t, r)) in list.iter().zip(&raw).enumerate() {
        let at = format!("tools[{i}]");
        let t = t.as_object().ok_or_else(|| bad(&at, "a tool is an object"))?;
        let kind = text_of(t, "type", &format!("{at}.type"))?.unwrap_or("");
        if HOSTED.contains(&kind) {
            return Err(bad(
                &format!("{at}.type"),
                format!("`{kind}` is a tool OpenAI runs on its servers; this server runs no tools: declare a function"),
            ));
        }
        if kind != "function" {
            return Err(bad(
                &format!("{at}.type"),
                format!("`{kind}` tools are not supported (custom and freeform tools too): declare a `function`"),
            ));
        }
        if let Some(k) =
            t.keys().find(|k| !matches!(k.as_str(), "type" | "name" | "description" | "parameters" | "strict"))
        {
            return Err(bad(
                &format!("{at}.{k}"),
                "not a field of a function tool (name, description, parameters, strict)",
            ));
        }
        let strict = match get(t, "strict") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(bad(&format!("{at}.strict"), format!("{} is not true or false", short(v)))),
        };
        let mut f = String::from("{");
        f.push_str(&format!("\"name\":{}", t.get("name").cloned().unwrap_or(json!(""))));
        if let Some(d) = get(t, "description") {
            f.push_str(&format!(",\"description\":{d}"));
        }
        let params: RawParameters = serde_json::from_str(r.get()).map_err(|e| bad(&at, e.to_string()))?;
        if let Some(p) = params.parameters.filter(|p| p.get() != "null") {
            f.push_str(&format!(",\"parameters\":{}", p.get()));
        }
        f.push_str(&format!(",\"strict\":{strict}}}"));
        out.push(format!("{{\"type\":\"function\",\"function\":{f}}}"));
    }
    echo.insert("tools".into(), Value::Array(list.clone()));
    Ok(Some(format!("[{}]", out.join(","))))
}

/// `tool_choice`: auto, none, required, or `{"type": "function", "name"}`.
fn tool_choice(
    o: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    let Some(c) = get(o, "tool_choice") else {
        echo.insert("tool_choice".into(), json!("auto"));
        return Ok(());
    };
    let theirs = match c {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => c.clone(),
        Value::Object(m) if m.get("type").and_then(Value::as_str) == Some("function") => {
            let name =
                m.get("name").and_then(Value::as_str).ok_or_else(|| bad("tool_choice.name", "name the function"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(bad(
                "tool_choice",
                format!("{}: give auto, none, required or {{\"type\": \"function\", \"name\"}}", short(other)),
            ));
        }
    };
    chat.insert("tool_choice".into(), theirs);
    echo.insert("tool_choice".into(), c.clone());
    Ok(())
}

/// `instructions`, the stored conversation and `input` as chat messages, where each came from,
/// and this request's input as items.
fn conversation(
    o: &Map<String, Value>,
    earlier: &[Value],
    echo: &mut Map<String, Value>,
) -> Result<Conversation, ApiError> {
    let mut b = Builder::default();
    let instructions = text_of(o, "instructions", "instructions")?;
    echo.insert("instructions".into(), json!(instructions));
    if let Some(i) = instructions {
        b.push(json!({"role": "system", "content": i}), "instructions".into());
    }
    for item in earlier {
        b.item(item, "previous_response_id")?;
    }
    let input = match get(o, "input") {
        None if earlier.is_empty() => return Err(bad("input", "give input: a string or a list of items")),
        None => Vec::new(),
        Some(Value::String(s)) => vec![json!({"type": "message", "role": "user", "content": s})],
        Some(Value::Array(items)) => items.clone(),
        Some(other) => return Err(bad("input", format!("{}: give a string or a list of items", short(other)))),
    };
    let string_input = matches!(get(o, "input"), Some(Value::String(_)));
    for (i, item) in input.iter().enumerate() {
        let field = if string_input { "input".to_string() } else { format!("input[{i}]") };
        b.item(item, &field)?;
    }
    b.flush_reasoning();
    if b.messages.is_empty() {
        return Err(bad("input", "the input is empty"));
    }
    Ok(Conversation { messages: b.messages, sources: b.sources, input })
}

/// The chat messages, where each came from, and this request's input items.
struct Conversation {
    messages: Vec<Value>,
    sources: Vec<Source>,
    input: Vec<Value>,
}

/// Chat messages built from items in order.
#[derive(Default)]
struct Builder {
    messages: Vec<Value>,
    sources: Vec<Source>,
    /// A reasoning item's text and field, for the assistant turn that follows it.
    reasoning: Option<(String, String)>,
    /// The last message is an assistant turn later calls join.
    open_turn: bool,
    /// Call ids to function names (a tool result names its function, as chat clients write it).
    names: HashMap<String, String>,
}

impl Builder {
    fn push(&mut self, m: Value, field: String) {
        self.messages.push(m);
        self.sources.push(Source { field, calls: Vec::new() });
        self.open_turn = false;
    }

    /// Reasoning no assistant message or call follows (a turn cut while thinking): an assistant
    /// turn of its own, with no text.
    fn flush_reasoning(&mut self) {
        if let Some((_, field)) = &self.reasoning {
            let field = field.clone();
            let m = Map::from_iter([("role".to_string(), json!("assistant")), ("content".to_string(), json!(""))]);
            self.assistant(m, field);
        }
    }

    fn assistant(&mut self, mut m: Map<String, Value>, field: String) {
        if let Some((text, _)) = self.reasoning.take() {
            m.insert("reasoning_content".into(), json!(text));
        }
        self.push(Value::Object(m), field);
        self.open_turn = true;
    }

    /// One item (`field`: where the client wrote it).
    fn item(&mut self, item: &Value, field: &str) -> Result<(), ApiError> {
        let o = item.as_object().ok_or_else(|| bad(field, "an input item is an object"))?;
        let kind = match text_of(o, "type", &format!("{field}.type"))? {
            Some(k) => k,
            None if o.contains_key("role") => "message",
            None => return Err(bad(&format!("{field}.type"), "an item has a type (message, function_call, ...)")),
        };
        match kind {
            "message" => self.message(o, field),
            "function_call" => self.call(o, field),
            "function_call_output" => self.output(o, field),
            "reasoning" => self.reasoning(o, field),
            other => Err(bad(
                &format!("{field}.type"),
                format!("`{other}` items are not supported (message, function_call, function_call_output, reasoning)"),
            )),
        }
    }

    fn message(&mut self, o: &Map<String, Value>, field: &str) -> Result<(), ApiError> {
        only(o, &["type", "role", "content", "id", "status"], field)?;
        let role = text_of(o, "role", &format!("{field}.role"))?.unwrap_or("");
        if !matches!(role, "user" | "assistant" | "system" | "developer") {
            return Err(bad(&format!("{field}.role"), format!("`{role}`: give user, assistant, system or developer")));
        }
        let content = match get(o, "content") {
            Some(Value::String(s)) => json!(s),
            Some(Value::Array(parts)) => {
                let parts = parts.iter().enumerate().map(|(j, p)| part(p, role, &format!("{field}.content[{j}]")));
                Value::Array(parts.collect::<Result<_, _>>()?)
            }
            _ => return Err(bad(&format!("{field}.content"), "content is a string or a list of parts")),
        };
        let mut m = Map::new();
        m.insert("role".into(), json!(role));
        m.insert("content".into(), content);
        if role == "assistant" {
            self.assistant(m, field.into());
            return Ok(());
        }
        self.flush_reasoning();
        self.push(Value::Object(m), field.into());
        Ok(())
    }

    fn call(&mut self, o: &Map<String, Value>, field: &str) -> Result<(), ApiError> {
        only(o, &["type", "id", "call_id", "name", "arguments", "status"], field)?;
        let call_id = text_of(o, "call_id", &format!("{field}.call_id"))?
            .ok_or_else(|| bad(&format!("{field}.call_id"), "a function call has a call_id"))?;
        let name = text_of(o, "name", &format!("{field}.name"))?
            .ok_or_else(|| bad(&format!("{field}.name"), "a function call has a name"))?;
        let arguments = text_of(o, "arguments", &format!("{field}.arguments"))?.unwrap_or("");
        if !self.open_turn || self.reasoning.is_some() {
            let m = Map::from_iter([("role".to_string(), json!("assistant")), ("content".to_string(), Value::Null)]);
            self.assistant(m, field.into());
        }
        let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
        self.names.insert(call_id.into(), name.into());
        let last = self.messages.len() - 1;
        let calls = self.messages[last].as_object_mut().map(|m| m.entry("tool_calls").or_insert(json!([])));
        if let Some(Value::Array(calls)) = calls {
            calls.push(call);
        }
        self.sources[last].calls.push(field.into());
        Ok(())
    }

    fn output(&mut self, o: &Map<String, Value>, field: &str) -> Result<(), ApiError> {
        only(o, &["type", "id", "call_id", "output", "status"], field)?;
        self.flush_reasoning();
        let call_id = text_of(o, "call_id", &format!("{field}.call_id"))?
            .ok_or_else(|| bad(&format!("{field}.call_id"), "a function call's output names its call_id"))?;
        let content = match get(o, "output") {
            Some(Value::String(s)) => json!(s),
            Some(Value::Array(parts)) => {
                let parts = parts.iter().enumerate().map(|(j, p)| part(p, "user", &format!("{field}.output[{j}]")));
                Value::Array(parts.collect::<Result<_, _>>()?)
            }
            _ => return Err(bad(&format!("{field}.output"), "output is a string or a list of parts")),
        };
        let mut m = json!({"role": "tool", "tool_call_id": call_id, "content": content});
        if let Some(name) = self.names.get(call_id) {
            m["name"] = json!(name);
        }
        self.push(m, field.into());
        Ok(())
    }

    /// A reasoning item: its text (`content`, else `summary`) is the next assistant turn's
    /// reasoning; `encrypted_content` is OpenAI's, which k3 cannot read: dropped.
    fn reasoning(&mut self, o: &Map<String, Value>, field: &str) -> Result<(), ApiError> {
        only(o, &["type", "id", "summary", "content", "encrypted_content", "status"], field)?;
        self.flush_reasoning();
        let texts = |key: &str, kind: &str| -> Result<String, ApiError> {
            let Some(list) = get(o, key) else { return Ok(String::new()) };
            let list = list.as_array().ok_or_else(|| bad(&format!("{field}.{key}"), "a list of parts"))?;
            let mut out = String::new();
            for (j, p) in list.iter().enumerate() {
                let at = format!("{field}.{key}[{j}]");
                let p = p.as_object().filter(|p| p.get("type").and_then(Value::as_str) == Some(kind));
                let t = p.and_then(|p| p.get("text")).and_then(Value::as_str);
                out.push_str(t.ok_or_else(|| bad(&at, format!("a part {{\"type\": \"{kind}\", \"text\"}}")))?);
            }
            Ok(out)
        };
        let content = texts("content", "reasoning_text")?;
        let text = if content.is_empty() { texts("summary", "summary_text")? } else { content };
        if !text.is_empty() {
            self.reasoning = Some((text, field.into()));
        }
        self.open_turn = false;
        Ok(())
    }
}

/// `o` has only `fields`.
fn only(o: &Map<String, Value>, fields: &[&str], field: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !fields.contains(&k.as_str())) {
        Some(k) => Err(bad(&format!("{field}.{k}"), format!("not a field of this item ({})", fields.join(", ")))),
        None => Ok(()),
    }
}

/// A content part as the chat route's: text, or an image given as a data URL.
fn part(p: &Value, role: &str, field: &str) -> Result<Value, ApiError> {
    let o = p.as_object().ok_or_else(|| bad(field, "a content part is an object"))?;
    let kind = text_of(o, "type", &format!("{field}.type"))?.unwrap_or("");
    match (kind, role) {
        ("input_text", _) | ("output_text", "assistant") => {
            let keys: &[&str] =
                if kind == "input_text" { &["type", "text"] } else { &["type", "text", "annotations", "logprobs"] };
            only(o, keys, field)?;
            let text = text_of(o, "text", &format!("{field}.text"))?.unwrap_or("");
            Ok(json!({"type": "text", "text": text}))
        }
        ("input_image", _) => {
            only(o, &["type", "image_url", "detail", "file_id"], field)?;
            if get(o, "file_id").is_some() {
                return Err(bad(&format!("{field}.file_id"), "files are not kept here: send the image as a data URL"));
            }
            match text_of(o, "detail", &format!("{field}.detail"))? {
                None | Some("auto" | "high") => {}
                Some(d) => {
                    return Err(bad(
                        &format!("{field}.detail"),
                        format!("`{d}`: k3 reads an image whole (auto or high)"),
                    ));
                }
            }
            let url = text_of(o, "image_url", &format!("{field}.image_url"))?
                .ok_or_else(|| bad(&format!("{field}.image_url"), "give the image as a data URL"))?;
            if !url.starts_with("data:") {
                return Err(bad(
                    &format!("{field}.image_url"),
                    "a remote image is not fetched: send it as a data URL (data:image/png;base64,...)",
                ));
            }
            Ok(json!({"type": "image_url", "image_url": {"url": url}}))
        }
        _ => Err(bad(
            &format!("{field}.type"),
            format!(
                "content part `{kind}` is not supported here (input_text, input_image; output_text in assistant turns)"
            ),
        )),
    }
}

/// An error about the chat body, renamed to the field the client wrote.
pub fn renamed(mut e: ApiError, sources: &[Source]) -> ApiError {
    let Some(p) = e.param.clone() else { return e };
    e.param = Some(rename(&p, sources));
    e
}

fn rename(p: &str, sources: &[Source]) -> String {
    if let Some(rest) = p.strip_prefix("messages[") {
        let (i, tail) = rest.split_once(']').unwrap_or((rest, ""));
        let Some(src) = i.parse::<usize>().ok().and_then(|i| sources.get(i)) else { return "input".into() };
        if let Some(call) = tail.strip_prefix(".tool_calls[") {
            let (k, tail) = call.split_once(']').unwrap_or((call, ""));
            if let Some(f) = k.parse::<usize>().ok().and_then(|k| src.calls.get(k)) {
                return format!("{f}{}", tail.replace(".function.", "."));
            }
        }
        return format!("{}{tail}", src.field);
    }
    if let Some(rest) = p.strip_prefix("tools[") {
        return format!("tools[{}", rest.replacen("].function", "]", 1));
    }
    if let Some(rest) = p.strip_prefix("response_format") {
        return format!("text.format{}", rest.strip_prefix(".json_schema").unwrap_or(rest));
    }
    match p {
        "messages" => "input".into(),
        "max_tokens" | "max_completion_tokens" => "max_output_tokens".into(),
        "reasoning_effort" => "reasoning.effort".into(),
        p => p.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(body: Value) -> Result<Translated, ApiError> {
        translate(body.to_string().as_bytes(), &body, &[])
    }

    fn chat(body: Value) -> Value {
        serde_json::from_str(&tr(body).unwrap().chat).unwrap()
    }

    #[test]
    fn items_become_the_chat_turns_they_stand_for() {
        let v = chat(json!({"instructions": "Be brief.", "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Look it up."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ]}));
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 4, "{v}");
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["reasoning_content"], "Look it up.");
        assert_eq!(m[2]["content"], json!([{"type": "text", "text": "Checking."}]));
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2, "consecutive calls are one turn");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "18 C"}));
        // A turn cut while thinking is an assistant turn of reasoning alone.
        let v = chat(json!({"input": [{"role": "user", "content": "a"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Hm."}]}, {"role": "user", "content": "b"}]}));
        assert_eq!(v["messages"][1], json!({"role": "assistant", "content": "", "reasoning_content": "Hm."}));
    }

    #[test]
    fn tools_keep_their_parameters_as_written() {
        let text = r#"{"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}]}"#;
        let t = translate(text.as_bytes(), &serde_json::from_str(text).unwrap(), &[]).unwrap();
        assert!(t.chat.ends_with(
            r#""tools":[{"type":"function","function":{"name":"f","parameters":{"type": "object", "properties": {"z": {}, "a": {}}},"strict":true}}]}"#
        ), "{}", t.chat);
    }

    #[test]
    fn what_cannot_be_done_is_refused_by_name() {
        for (body, field) in [
            (json!({"input": "x", "bogus": 1}), "bogus"),
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "conversation": "c"}), "conversation"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
            (
                json!({"input": "x", "include": ["reasoning.encrypted_content", "file_search_call.results"]}),
                "include[1]",
            ),
            (json!({"input": "x", "tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"input": "x", "tools": [{"type": "custom", "name": "f"}]}), "tools[0].type"),
            (json!({"input": "x", "text": {"verbosity": "low"}}), "text.verbosity"),
            (json!({"input": "x", "reasoning": {"effort": "huge"}}), "reasoning.effort"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"},
                {"type": "input_image", "image_url": "https://x/y.png"}]}]}),
                "input[0].content[1].image_url",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input[0].content[0].type",
            ),
            (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
        ] {
            assert_eq!(tr(body.clone()).unwrap_err().param.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn chat_errors_name_the_field_the_client_wrote() {
        let sources = vec![
            Source { field: "instructions".into(), calls: vec![] },
            Source { field: "input[2]".into(), calls: vec!["input[3]".into()] },
        ];
        assert_eq!(rename("messages[1].content[0].image_url.url", &sources), "input[2].content[0].image_url.url");
        assert_eq!(rename("messages[1].tool_calls[0].function.arguments", &sources), "input[3].arguments");
        assert_eq!(rename("tools[2].function.name", &sources), "tools[2].name");
        assert_eq!(rename("response_format.json_schema.schema", &sources), "text.format.schema");
        assert_eq!(rename("max_tokens", &sources), "max_output_tokens");
        assert_eq!(rename("reasoning_effort", &sources), "reasoning.effort");
    }
}
