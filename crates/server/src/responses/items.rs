//! A Responses conversation as chat messages: `instructions` a system message first, then the
//! stored conversation `previous_response_id` names, then `input`'s items in order: messages
//! (text and data-URL images), `function_call`s joining the assistant turn before them (a turn's
//! calls together), `function_call_output`s as tool messages naming their function, and
//! `reasoning` items as the reasoning of the assistant turn they go before (a turn of its own
//! when none follows: one cut while thinking). `encrypted_content` is OpenAI's, which k3 cannot
//! read: accepted and dropped.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::fields::{bad, get, only, text_of};
use super::tools::NAMESPACE_JOIN;
use crate::error::{ApiError, short};

/// Where a chat message came from: its field (`input[3]`, `instructions`, ...) and its calls'.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub field: String,
    pub calls: Vec<String>,
}

/// `instructions`, the stored conversation and `input` as chat messages, where each came from,
/// and this request's input as items.
pub fn conversation(
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
pub struct Conversation {
    pub messages: Vec<Value>,
    pub sources: Vec<Source>,
    pub input: Vec<Value>,
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
        only(o, &["type", "id", "call_id", "name", "arguments", "status", "namespace"], field)?;
        let call_id = text_of(o, "call_id", &format!("{field}.call_id"))?
            .ok_or_else(|| bad(&format!("{field}.call_id"), "a function call has a call_id"))?;
        let name = text_of(o, "name", &format!("{field}.name"))?
            .ok_or_else(|| bad(&format!("{field}.name"), "a function call has a name"))?;
        let arguments = text_of(o, "arguments", &format!("{field}.arguments"))?.unwrap_or("");
        // A namespaced function's call, named as it was declared to the model.
        let name = match text_of(o, "namespace", &format!("{field}.namespace"))? {
            Some(ns) => format!("{ns}{NAMESPACE_JOIN}{name}"),
            None => name.to_string(),
        };
        if !self.open_turn || self.reasoning.is_some() {
            let m = Map::from_iter([("role".to_string(), json!("assistant")), ("content".to_string(), Value::Null)]);
            self.assistant(m, field.into());
        }
        let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
        self.names.insert(call_id.into(), name);
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
