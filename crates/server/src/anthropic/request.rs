//! Anthropic's Messages body translated into the OpenAI chat body this server already checks, so
//! both APIs share one set of rules. Every field is honoured or refused by name; an error the
//! chat rules raise about an OpenAI field is renamed to the Anthropic field the client wrote
//! ([`Renames`]). The body is read as raw JSON (`RawValue`) so a tool's `input_schema` and a
//! call's `input` keep the client's key order: the model sees them as written, and a call sent
//! back renders as the model wrote it (the prefix cache resumes it).

use std::collections::{BTreeMap, HashMap};

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// A JSON object with its values as written.
type Obj = BTreeMap<String, Box<RawValue>>;

/// What `POST /v1/messages` takes (`seed` and `chat_template_kwargs` are k3's, as on
/// `/v1/chat/completions`).
const MESSAGES: [&str; 15] = [
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "chat_template_kwargs",
    "seed",
];

/// What `POST /v1/messages/count_tokens` takes.
const COUNT: [&str; 7] = ["model", "messages", "system", "tools", "tool_choice", "thinking", "chat_template_kwargs"];

/// Which route a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Messages,
    CountTokens,
}

/// What `thinking` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// Absent: the model's default (K3 thinks, as on `/v1/chat/completions`).
    Default,
    /// `{"type": "enabled", "budget_tokens": N}`: at most N tokens of thinking, within max_tokens.
    Budget(u64),
    /// `{"type": "disabled"}`.
    Off,
}

/// A translated request.
#[derive(Debug)]
pub struct Translated {
    /// The `/v1/chat/completions` body, as JSON text.
    pub body: String,
    pub thinking: Thinking,
    pub renames: Renames,
}

/// OpenAI field paths and the Anthropic ones they came from.
#[derive(Debug, Default)]
pub struct Renames(Vec<(String, String)>);

impl Renames {
    fn add(&mut self, openai: impl Into<String>, anthropic: impl Into<String>) {
        self.0.push((openai.into(), anthropic.into()));
    }

    /// `e` naming the Anthropic field: the longest translated path the OpenAI one starts with
    /// (whole path segments) is replaced by where it came from.
    pub fn rename(&self, mut e: ApiError) -> ApiError {
        let Some(p) = e.param.clone() else { return e };
        let best = self
            .0
            .iter()
            .filter(|(from, _)| {
                p.strip_prefix(from.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .max_by_key(|(from, _)| from.len());
        if let Some((from, to)) = best {
            e.param = Some(format!("{to}{}", &p[from.len()..]));
        }
        e
    }
}

fn bad(at: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad(at, message)
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_string() } else { format!("{prefix}.{key}") }
}

fn object(raw: &RawValue, at: &str) -> Result<Obj, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| bad(at, "must be an object"))
}

fn list(raw: &RawValue, at: &str) -> Result<Vec<Box<RawValue>>, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| bad(at, "must be a list"))
}

fn value(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// Refuses the first key of `o` not in `known`, by its path.
fn known_keys(o: &Obj, known: &[&str], at: &str) -> Result<(), ApiError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(bad(
            &join(at, k),
            format!("`{k}` is not a field this server takes here (it takes {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn string(o: &Obj, key: &str, at: &str) -> Result<Option<String>, ApiError> {
    match o.get(key).map(|r| value(r)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(bad(&join(at, key), format!("{other} is not a string"))),
    }
}

fn required_string(o: &Obj, key: &str, at: &str) -> Result<String, ApiError> {
    string(o, key, at)?.ok_or_else(|| bad(&join(at, key), format!("`{key}` is required")))
}

fn boolean(o: &Obj, key: &str, at: &str) -> Result<Option<bool>, ApiError> {
    match o.get(key).map(|r| value(r)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(bad(&join(at, key), format!("{other} is not true or false"))),
    }
}

fn whole_number(o: &Obj, key: &str) -> Result<Option<u64>, ApiError> {
    match o.get(key).map(|r| value(r)) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| bad(key, format!("{v} is not a whole number"))),
    }
}

/// The block's `type`, and its keys checked against what that type takes.
fn block_type(block: &Obj, at: &str) -> Result<String, ApiError> {
    let kind = required_string(block, "type", at)?;
    let keys: &[&str] = match kind.as_str() {
        "text" => &["type", "text", "cache_control", "citations"],
        "image" => &["type", "source", "cache_control"],
        "tool_use" => &["type", "id", "name", "input", "cache_control"],
        "tool_result" => &["type", "tool_use_id", "content", "is_error", "cache_control"],
        "thinking" => &["type", "thinking", "signature"],
        "redacted_thinking" => &["type", "data"],
        other => {
            return Err(bad(
                &join(at, "type"),
                format!(
                    "block type `{other}` is not supported (text, image, tool_use, tool_result, thinking, \
                     redacted_thinking)"
                ),
            ));
        }
    };
    known_keys(block, keys, at)?;
    if block.get("citations").is_some_and(|c| !value(c).is_null()) {
        return Err(bad(&join(at, "citations"), "citations are not supported"));
    }
    Ok(kind)
}

/// A `text` block's text.
fn block_text(block: &Obj, at: &str) -> Result<String, ApiError> {
    required_string(block, "text", at)
}

/// Content: a string, or a list of blocks.
enum Content {
    Text(String),
    Blocks(Vec<Obj>),
}

fn content(raw: Option<&RawValue>, at: &str) -> Result<Content, ApiError> {
    let Some(raw) = raw else { return Err(bad(at, "content is required")) };
    match value(raw) {
        Value::String(s) => Ok(Content::Text(s)),
        Value::Array(_) => list(raw, at)?
            .iter()
            .enumerate()
            .map(|(b, r)| object(r, &format!("{at}[{b}]")))
            .collect::<Result<_, _>>()
            .map(Content::Blocks),
        other => Err(bad(at, format!("{other} is not a string or a list of blocks"))),
    }
}

/// An `image` block as an OpenAI `image_url` part: a base64 source as a data URL (a `url` source
/// is refused: nothing is fetched).
fn image(block: &Obj, at: &str) -> Result<Value, ApiError> {
    let src_at = join(at, "source");
    let src = object(block.get("source").ok_or_else(|| bad(&src_at, "source is required"))?, &src_at)?;
    match required_string(&src, "type", &src_at)?.as_str() {
        "base64" => {}
        "url" => return Err(bad(&join(&src_at, "type"), "an image by url is not fetched: send it as base64")),
        other => return Err(bad(&join(&src_at, "type"), format!("source type `{other}` is not supported (base64)"))),
    }
    known_keys(&src, &["type", "media_type", "data"], &src_at)?;
    let media = required_string(&src, "media_type", &src_at)?;
    if !["image/jpeg", "image/png", "image/gif", "image/webp"].contains(&media.as_str()) {
        return Err(bad(
            &join(&src_at, "media_type"),
            format!("`{media}`: give image/jpeg, image/png, image/gif or image/webp"),
        ));
    }
    let data = required_string(&src, "data", &src_at)?;
    Ok(json!({"type": "image_url", "image_url": {"url": format!("data:{media};base64,{data}")}}))
}

/// What a tool result's `is_error` adds before its content: the model sees that the call failed.
pub const TOOL_ERROR: &str = "Error: ";

/// The OpenAI messages being built, and where each part came from.
#[derive(Default)]
struct Out {
    messages: Vec<Value>,
    renames: Renames,
    /// Tool names by the `tool_use` id that called them (a tool result names its tool).
    names: HashMap<String, String>,
}

impl Out {
    /// Pushes `msg`, which came from `from`.
    fn push(&mut self, msg: Value, from: &str) -> usize {
        let k = self.messages.len();
        self.renames.add(format!("messages[{k}]"), from);
        self.messages.push(msg);
        k
    }

    /// `parts[j]` of OpenAI message `k` came from `from[j]`.
    fn parts_from(&mut self, k: usize, from: &[String]) {
        for (j, f) in from.iter().enumerate() {
            let part = format!("messages[{k}].content[{j}]");
            self.renames.add(format!("{part}.image_url.url"), format!("{f}.source.data"));
            self.renames.add(format!("{part}.image_url"), format!("{f}.source"));
            self.renames.add(part, f.clone());
        }
    }

    /// A user message: text and image blocks as parts; each run of tool results as tool
    /// messages, in order.
    fn user(&mut self, i: usize, c: Content) -> Result<(), ApiError> {
        let at = format!("messages[{i}]");
        let blocks = match c {
            Content::Text(t) => {
                self.push(json!({"role": "user", "content": t}), &at);
                return Ok(());
            }
            Content::Blocks(b) => b,
        };
        let (mut parts, mut from) = (Vec::new(), Vec::new());
        let mut pushed = false;
        for (b, block) in blocks.iter().enumerate() {
            let bat = format!("{at}.content[{b}]");
            match block_type(block, &bat)?.as_str() {
                "text" => parts.push(json!({"type": "text", "text": block_text(block, &bat)?})),
                "image" => parts.push(image(block, &bat)?),
                "tool_result" => {
                    self.flush_user(&mut parts, &mut from, &at);
                    self.tool_result(block, &bat)?;
                    pushed = true;
                    continue;
                }
                other => {
                    return Err(bad(&join(&bat, "type"), format!("a `{other}` block belongs in an assistant message")));
                }
            }
            from.push(bat);
        }
        if !parts.is_empty() || !pushed {
            self.flush_user(&mut parts, &mut from, &at);
        }
        Ok(())
    }

    fn flush_user(&mut self, parts: &mut Vec<Value>, from: &mut Vec<String>, at: &str) {
        if parts.is_empty() {
            return;
        }
        let k = self.push(json!({"role": "user", "content": std::mem::take(parts)}), at);
        self.parts_from(k, &std::mem::take(from));
    }

    /// A `tool_result` block as a `tool` message (named after the call it answers when that
    /// call is in the conversation).
    fn tool_result(&mut self, block: &Obj, at: &str) -> Result<(), ApiError> {
        let id = required_string(block, "tool_use_id", at)?;
        let failed = boolean(block, "is_error", at)?.unwrap_or(false);
        let c_at = join(at, "content");
        let (content, from) = match block.get("content").map(|r| value(r)) {
            None | Some(Value::Null) => (json!(if failed { TOOL_ERROR.trim_end() } else { "" }), Vec::new()),
            Some(Value::String(s)) => (json!(if failed { format!("{TOOL_ERROR}{s}") } else { s }), Vec::new()),
            Some(Value::Array(_)) => {
                let (mut parts, mut from) = (Vec::new(), Vec::new());
                if failed {
                    parts.push(json!({"type": "text", "text": TOOL_ERROR}));
                    from.push(c_at.clone());
                }
                let Content::Blocks(blocks) = content(block.get("content").map(|b| &**b), &c_at)? else {
                    unreachable!("a list is blocks")
                };
                for (b, inner) in blocks.iter().enumerate() {
                    let bat = format!("{c_at}[{b}]");
                    match block_type(inner, &bat)?.as_str() {
                        "text" => parts.push(json!({"type": "text", "text": block_text(inner, &bat)?})),
                        "image" => parts.push(image(inner, &bat)?),
                        other => {
                            return Err(bad(
                                &join(&bat, "type"),
                                format!("a tool result holds text and image blocks, not `{other}`"),
                            ));
                        }
                    }
                    from.push(bat);
                }
                (json!(parts), from)
            }
            Some(other) => return Err(bad(&c_at, format!("{other} is not a string or a list of blocks"))),
        };
        let mut msg = json!({"role": "tool", "tool_call_id": id, "content": content});
        if let Some(name) = self.names.get(&id) {
            msg["name"] = json!(name);
        }
        let k = self.push(msg, at);
        self.renames.add(format!("messages[{k}].tool_call_id"), join(at, "tool_use_id"));
        self.parts_from(k, &from);
        Ok(())
    }

    /// An assistant message: its text, its thinking as `reasoning_content`, its `tool_use`
    /// blocks as `tool_calls` (the input's JSON text as the arguments).
    fn assistant(&mut self, i: usize, c: Content) -> Result<(), ApiError> {
        let at = format!("messages[{i}]");
        let blocks = match c {
            Content::Text(t) => {
                self.push(json!({"role": "assistant", "content": t}), &at);
                return Ok(());
            }
            Content::Blocks(b) => b,
        };
        let (mut text, mut reasoning, mut calls, mut call_from) =
            (String::new(), None::<String>, Vec::new(), Vec::new());
        for (b, block) in blocks.iter().enumerate() {
            let bat = format!("{at}.content[{b}]");
            match block_type(block, &bat)?.as_str() {
                "text" => text.push_str(&block_text(block, &bat)?),
                "thinking" => {
                    let t = required_string(block, "thinking", &bat)?;
                    // k3's signatures mark its own thinking; one sent back is not checked.
                    string(block, "signature", &bat)?;
                    reasoning.get_or_insert_default().push_str(&t);
                }
                // k3 never writes one: another model's encrypted thinking, which it cannot read.
                "redacted_thinking" => {}
                "tool_use" => {
                    let id = required_string(block, "id", &bat)?;
                    let name = required_string(block, "name", &bat)?;
                    let input_at = join(&bat, "input");
                    let input = block.get("input").ok_or_else(|| bad(&input_at, "input is required"))?;
                    if !value(input).is_object() {
                        return Err(bad(&input_at, "input is an object"));
                    }
                    self.names.insert(id.clone(), name.clone());
                    calls.push(
                        json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.get()}}),
                    );
                    call_from.push(bat);
                }
                other => return Err(bad(&join(&bat, "type"), format!("a `{other}` block belongs in a user message"))),
            }
        }
        let mut msg = json!({"role": "assistant", "content": text});
        if let Some(r) = reasoning {
            msg["reasoning_content"] = json!(r);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = json!(calls);
        }
        let k = self.push(msg, &at);
        for (n, f) in call_from.into_iter().enumerate() {
            self.renames.add(format!("messages[{k}].tool_calls[{n}].function.arguments"), join(&f, "input"));
            self.renames.add(format!("messages[{k}].tool_calls[{n}]"), f);
        }
        Ok(())
    }
}

/// `system`: a string or text blocks, as the first message.
fn system(raw: &RawValue, out: &mut Out) -> Result<(), ApiError> {
    match content(Some(raw), "system")? {
        Content::Text(t) => {
            out.push(json!({"role": "system", "content": t}), "system");
        }
        Content::Blocks(blocks) => {
            let (mut parts, mut from) = (Vec::new(), Vec::new());
            for (b, block) in blocks.iter().enumerate() {
                let bat = format!("system[{b}]");
                if block_type(block, &bat)? != "text" {
                    return Err(bad(&join(&bat, "type"), "system blocks are text blocks"));
                }
                parts.push(json!({"type": "text", "text": block_text(block, &bat)?}));
                from.push(bat);
            }
            let k = out.push(json!({"role": "system", "content": parts}), "system");
            out.parts_from(k, &from);
        }
    }
    Ok(())
}

/// `messages`, in order.
fn messages(raw: &RawValue, out: &mut Out) -> Result<(), ApiError> {
    let list = list(raw, "messages")?;
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m = object(m, &at)?;
        known_keys(&m, &["role", "content"], &at)?;
        let c = content(m.get("content").map(|c| &**c), &join(&at, "content"))?;
        match required_string(&m, "role", &at)?.as_str() {
            "user" => out.user(i, c)?,
            "assistant" if i + 1 == list.len() => {
                return Err(bad(
                    &at,
                    "a last assistant message (a prefill to continue) is not supported: k3 answers in a new turn",
                ));
            }
            "assistant" => out.assistant(i, c)?,
            other => return Err(bad(&join(&at, "role"), format!("role `{other}`: user or assistant"))),
        }
    }
    Ok(())
}

/// `tools` as OpenAI function tools, as JSON text (each `input_schema` as written).
fn tools(raw: &RawValue, renames: &mut Renames) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for (i, t) in list(raw, "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        let t = object(t, &at)?;
        if let Some(kind) = string(&t, "type", &at)?.filter(|k| k != "custom") {
            return Err(bad(
                &join(&at, "type"),
                format!("`{kind}` is one of Anthropic's server tools, which k3 does not run: declare a custom tool"),
            ));
        }
        known_keys(&t, &["type", "name", "description", "input_schema", "cache_control"], &at)?;
        let name = t.get("name").ok_or_else(|| bad(&join(&at, "name"), "name is required"))?;
        let schema =
            t.get("input_schema").ok_or_else(|| bad(&join(&at, "input_schema"), "input_schema is required"))?;
        let description = t.get("description").map(|d| format!(", \"description\": {}", d.get())).unwrap_or_default();
        texts.push(format!(
            "{{\"type\": \"function\", \"function\": {{\"name\": {}{description}, \"parameters\": {}}}}}",
            name.get(),
            schema.get()
        ));
        for (openai, anthropic) in [("name", "name"), ("description", "description"), ("parameters", "input_schema")] {
            renames.add(format!("{at}.function.{openai}"), join(&at, anthropic));
        }
        renames.add(format!("{at}.function"), at.clone());
        renames.add(format!("{at}.type"), join(&at, "type"));
    }
    Ok(format!("[{}]", texts.join(", ")))
}

/// `tool_choice` as OpenAI's, and `parallel_tool_calls: false` when it disables parallel use.
fn tool_choice(raw: &RawValue, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let c = object(raw, "tool_choice")?;
    let kind = required_string(&c, "type", "tool_choice")?;
    let keys: &[&str] = match kind.as_str() {
        "tool" => &["type", "name", "disable_parallel_tool_use"],
        "none" => &["type"],
        _ => &["type", "disable_parallel_tool_use"],
    };
    known_keys(&c, keys, "tool_choice")?;
    let choice = match kind.as_str() {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => json!({"type": "function", "function": {"name": required_string(&c, "name", "tool_choice")?}}),
        other => return Err(bad("tool_choice.type", format!("`{other}`: auto, any, tool or none"))),
    };
    out.insert("tool_choice".into(), choice);
    if boolean(&c, "disable_parallel_tool_use", "tool_choice")? == Some(true) {
        out.insert("parallel_tool_calls".into(), json!(false));
    }
    Ok(())
}

/// `thinking`: enabled with a budget (below `max_tokens`), or disabled.
fn thinking(raw: &RawValue, max_tokens: Option<u64>, can_think: bool) -> Result<Thinking, ApiError> {
    let t = object(raw, "thinking")?;
    match required_string(&t, "type", "thinking")?.as_str() {
        "enabled" => {
            known_keys(&t, &["type", "budget_tokens"], "thinking")?;
            if !can_think {
                return Err(bad("thinking", "this model does not think (K3 does)"));
            }
            let budget = match t.get("budget_tokens").map(|b| value(b)) {
                Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => n.as_u64().unwrap_or(1),
                Some(other) => {
                    return Err(bad("thinking.budget_tokens", format!("{other} is not a whole number >= 1")));
                }
                None => return Err(bad("thinking.budget_tokens", "budget_tokens is required")),
            };
            if let Some(m) = max_tokens.filter(|&m| budget >= m) {
                return Err(bad(
                    "thinking.budget_tokens",
                    format!("budget_tokens ({budget}) must be less than max_tokens ({m})"),
                ));
            }
            Ok(Thinking::Budget(budget))
        }
        "disabled" => {
            known_keys(&t, &["type"], "thinking")?;
            Ok(Thinking::Off)
        }
        other => Err(bad("thinking.type", format!("`{other}`: enabled or disabled"))),
    }
}

/// Copies the sampling fields, checked for their JSON types.
fn sampling(body: &Obj, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    for key in ["temperature", "top_p"] {
        match body.get(key).map(|r| value(r)) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                out.insert(key.into(), v);
            }
            Some(other) => return Err(bad(key, format!("{other} is not a number"))),
        }
    }
    for key in ["top_k", "seed"] {
        if let Some(n) = whole_number(body, key)? {
            out.insert(key.into(), json!(n));
        }
    }
    if let Some(raw) = body.get("stop_sequences") {
        let stops: Vec<String> = serde_json::from_str(raw.get())
            .map_err(|_| bad("stop_sequences", "stop_sequences is a list of strings"))?;
        if !stops.is_empty() {
            out.insert("stop".into(), json!(stops));
        }
    }
    Ok(())
}

/// Translates a body of `route`. `can_think`: the model writes a thinking section.
pub fn translate(raw: &str, route: Route, can_think: bool) -> Result<Translated, ApiError> {
    let body: Obj = serde_json::from_str(raw).map_err(|_| bad("body", "the request body is not a JSON object"))?;
    known_keys(&body, if route == Route::Messages { &MESSAGES } else { &COUNT }, "")?;
    let mut out = Map::new();
    let mut renames = Renames::default();
    for (openai, anthropic) in [("stop", "stop_sequences"), ("reasoning_effort", "thinking")] {
        renames.add(openai, anthropic);
    }
    if let Some(m) = string(&body, "model", "")? {
        out.insert("model".into(), json!(m));
    }
    let max_tokens = whole_number(&body, "max_tokens")?;
    match (route, max_tokens) {
        (Route::Messages, None) => return Err(bad("max_tokens", "max_tokens is required")),
        (Route::Messages, Some(n)) => {
            out.insert("max_tokens".into(), json!(n));
        }
        // Counting renders the prompt only: one token of room is all it asks of the context.
        (Route::CountTokens, _) => {
            out.insert("max_tokens".into(), json!(1));
        }
    }
    if let Some(s) = boolean(&body, "stream", "")? {
        out.insert("stream".into(), json!(s));
    }
    if let Some(m) = body.get("metadata").filter(|m| !value(m).is_object() && !value(m).is_null()) {
        return Err(bad("metadata", format!("{} is not an object", m.get())));
    }
    sampling(&body, &mut out)?;
    if let Some(k) = body.get("chat_template_kwargs") {
        out.insert("chat_template_kwargs".into(), value(k));
    }
    let thinking = match body.get("thinking") {
        None => Thinking::Default,
        Some(_) if body.contains_key("chat_template_kwargs") => {
            return Err(bad("chat_template_kwargs", "give thinking or chat_template_kwargs, not both"));
        }
        Some(t) => thinking(t, max_tokens, can_think)?,
    };
    if thinking == Thinking::Off {
        out.insert("reasoning_effort".into(), json!("none"));
    }
    if let Some(c) = body.get("tool_choice") {
        tool_choice(c, &mut out)?;
    }
    let mut msgs = Out::default();
    if let Some(s) = body.get("system") {
        system(s, &mut msgs)?;
    }
    messages(body.get("messages").ok_or_else(|| bad("messages", "messages is required"))?, &mut msgs)?;
    out.insert("messages".into(), json!(msgs.messages));
    renames.0.extend(msgs.renames.0);
    let mut text = Value::Object(out).to_string();
    if let Some(t) = body.get("tools") {
        // Spliced in as text: the declarations keep the client's key order.
        text.pop();
        text.push_str(&format!(", \"tools\": {}}}", tools(t, &mut renames)?));
    }
    Ok(Translated { body: text, thinking, renames })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `v` as the client writes it (a call's input with `z` before `a`, as no sorted map has it).
    fn run(v: Value) -> Result<(Value, Translated), ApiError> {
        let text = v.to_string().replace(r#"{"a":2,"z":1}"#, r#"{"z":1,"a":2}"#);
        let t = translate(&text, Route::Messages, true)?;
        Ok((serde_json::from_str(&t.body).unwrap(), t))
    }

    #[test]
    fn blocks_become_openai_messages_in_order() {
        let (v, t) = run(json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "S"}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"z": 1, "a": 2}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C"},
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": true,
                     "content": [{"type": "text", "text": "down"}]},
                    {"type": "text", "text": "And?"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}))
        .unwrap();
        let m = v["messages"].as_array().unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m[0], json!({"role": "system", "content": [{"type": "text", "text": "S"}]}));
        assert_eq!(m[2]["reasoning_content"], "hm");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], r#"{"z":1,"a":2}"#, "input as written");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "t1", "name": "get_weather", "content": "18 C"}));
        assert_eq!(m[4]["content"][0]["text"], TOOL_ERROR);
        assert_eq!(m[5], json!({"role": "user", "content": [{"type": "text", "text": "And?"}]}));
        assert_eq!((v["tool_choice"].as_str(), v["parallel_tool_calls"].as_bool()), (Some("required"), Some(false)));
        assert_eq!(v["tools"][0]["function"]["parameters"], json!({"type": "object", "properties": {}}));
        let e = t.renames.rename(ApiError::bad("messages[4].content[1].text", "x"));
        assert_eq!(e.param.as_deref(), Some("messages[2].content[1].content[0].text"));
        let e = t.renames.rename(ApiError::bad("tools[0].function.parameters", "x"));
        assert_eq!(e.param.as_deref(), Some("tools[0].input_schema"));
    }

    #[test]
    fn refusals_name_the_field_as_written() {
        let user = |content: Value| json!({"max_tokens": 5, "messages": [{"role": "user", "content": content}]});
        let img = |src: Value| user(json!([{"type": "text", "text": "x"}, {"type": "image", "source": src}]));
        for (body, field) in [
            (json!({"messages": []}), "max_tokens"),
            (json!({"max_tokens": 5, "messages": [], "service_tier": "auto"}), "service_tier"),
            (img(json!({"type": "url", "url": "http://x"})), "messages[0].content[1].source.type"),
            (
                img(json!({"type": "base64", "media_type": "image/bmp", "data": ""})),
                "messages[0].content[1].source.media_type",
            ),
            (user(json!([{"type": "document"}])), "messages[0].content[0].type"),
            (user(json!([{"type": "text", "text": "x", "extra": 1}])), "messages[0].content[0].extra"),
            (
                json!({"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "w"}]}),
                "tools[0].type",
            ),
            (
                json!({"max_tokens": 5, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 5}}),
                "thinking.budget_tokens",
            ),
            (json!({"max_tokens": 5, "messages": [{"role": "assistant", "content": "pre"}]}), "messages[0]"),
        ] {
            let e = run(body.clone()).expect_err(&body.to_string());
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e}");
        }
        let e = translate(&json!({"messages": [], "max_tokens": 3}).to_string(), Route::CountTokens, true).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = translate(
            &json!({"messages": [], "max_tokens": 9, "thinking": {"type": "enabled", "budget_tokens": 4}}).to_string(),
            Route::Messages,
            false,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking"));
    }
}
