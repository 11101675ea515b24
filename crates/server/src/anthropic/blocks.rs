//! Anthropic's messages and their content blocks as OpenAI chat messages: text and images as
//! parts, `tool_use` as `tool_calls`, each `tool_result` as a `tool` message, thinking as
//! `reasoning_content`; `context_management`'s thinking edits applied to the result.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::fields::{Obj, Renames, bad, boolean, join, known_keys, list, object, required_string, string, value};
use crate::error::ApiError;

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
pub enum Content {
    Text(String),
    Blocks(Vec<Obj>),
}

pub fn content(raw: Option<&RawValue>, at: &str) -> Result<Content, ApiError> {
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
pub struct Out {
    pub messages: Vec<Value>,
    pub renames: Renames,
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
                    return Err(bad(&c_at, "a list of blocks"));
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

/// `system` (`at`: the top-level field, or a message of role system): a string or text
/// blocks, as a system message.
pub fn system(c: Content, at: &str, out: &mut Out) -> Result<(), ApiError> {
    match c {
        Content::Text(t) => {
            out.push(json!({"role": "system", "content": t}), at);
        }
        Content::Blocks(blocks) => {
            let (mut parts, mut from) = (Vec::new(), Vec::new());
            for (b, block) in blocks.iter().enumerate() {
                let bat = if at == "system" { format!("system[{b}]") } else { format!("{at}.content[{b}]") };
                if block_type(block, &bat)? != "text" {
                    return Err(bad(&join(&bat, "type"), "system blocks are text blocks"));
                }
                parts.push(json!({"type": "text", "text": block_text(block, &bat)?}));
                from.push(bat);
            }
            let k = out.push(json!({"role": "system", "content": parts}), at);
            out.parts_from(k, &from);
        }
    }
    Ok(())
}

/// `messages`, in order.
pub fn messages(raw: &RawValue, out: &mut Out) -> Result<(), ApiError> {
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
            // Anthropic's system messages within the conversation (Claude Code sends them).
            "system" => system(c, &at, out)?,
            other => return Err(bad(&join(&at, "role"), format!("role `{other}`: user, assistant or system"))),
        }
    }
    Ok(())
}

/// `context_management`: its `clear_thinking_20251015` edit applied (the thinking of all but the
/// last `keep` assistant turns that have any left out of the prompt; `keep` is `"all"` or
/// `{"type": "thinking_turns", "value": N}`, 1 when absent, as Anthropic's default).
pub fn context_management(raw: &RawValue, out: &mut Out) -> Result<(), ApiError> {
    let at = "context_management";
    let cm = object(raw, at)?;
    known_keys(&cm, &["edits"], at)?;
    let Some(edits) = cm.get("edits") else { return Ok(()) };
    for (i, e) in list(edits, &join(at, "edits"))?.iter().enumerate() {
        let eat = format!("{at}.edits[{i}]");
        let e = object(e, &eat)?;
        let kind = required_string(&e, "type", &eat)?;
        if kind != "clear_thinking_20251015" {
            return Err(bad(
                &join(&eat, "type"),
                format!("`{kind}` is not an edit this server makes (it makes clear_thinking_20251015)"),
            ));
        }
        known_keys(&e, &["type", "keep"], &eat)?;
        let keep = match e.get("keep").map(|k| value(k)) {
            None => 1,
            Some(Value::String(s)) if s == "all" => continue,
            Some(Value::Object(o))
                if o.get("type").and_then(Value::as_str) == Some("thinking_turns") && o.len() == 2 =>
            {
                o.get("value")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| bad(&format!("{eat}.keep.value"), "the thinking turns to keep: a whole number"))?
                    as usize
            }
            Some(other) => {
                return Err(bad(
                    &join(&eat, "keep"),
                    format!("{other}: \"all\" or {{\"type\": \"thinking_turns\", \"value\": N}}"),
                ));
            }
        };
        let thinking: Vec<usize> =
            (0..out.messages.len()).filter(|&k| out.messages[k].get("reasoning_content").is_some()).collect();
        for &k in &thinking[..thinking.len().saturating_sub(keep)] {
            if let Some(m) = out.messages[k].as_object_mut() {
                m.remove("reasoning_content");
            }
        }
    }
    Ok(())
}
