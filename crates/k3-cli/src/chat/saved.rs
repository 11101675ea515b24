//! `/save` and `/load`: a conversation as JSON messages in OpenAI's shape, the one the server
//! reads, so it can be sent there or read back: `{"role", "content", "reasoning_content"?}`; a
//! message with images has `content` as parts (`{"type": "image_url", "image_url": {"url":
//! "data:image/png;base64,…"}}` where each image sits, `{"type": "text", "text"}` between); an
//! assistant's tool calls are `tool_calls: [{"id", "type": "function", "function": {"name",
//! "arguments"}}]` and a tool's result is `{"role": "tool", "tool_call_id", "content"}`. Nothing
//! a message holds is dropped or flattened; `/load` restores the same messages and images.

use std::path::Path;

use anyhow::{Context, Result};
use base64::Engine as _;
use k3_text::chat_format::{Call, Message, Role};
use serde_json::{Value, json};

use crate::prompt::TextBound;

/// The most bytes `/load` reads: one image at the decoder's 64 MiB limit is 86 MiB as base64,
/// and the text a context holds is far less than the rest; a real conversation, photos and
/// all, is a few MiB.
pub const LOAD_LIMIT: u64 = 128 << 20;

/// A conversation as saved: its messages, and the bytes of its images in the order the
/// messages hold them.
#[derive(Debug, Default, PartialEq)]
pub struct Saved {
    pub messages: Vec<Message>,
    pub images: Vec<Vec<u8>>,
}

/// Writes the conversation to `path`, which must not exist (nothing of the user's is
/// overwritten); `images` are the bytes of every image `messages` holds, in order.
pub fn save(path: &Path, messages: &[Message], images: &[Vec<u8>]) -> Result<()> {
    anyhow::ensure!(!path.exists(), "{} exists: give another name (it is left as it is)", path.display());
    let held: usize = messages.iter().map(|m| m.images.len()).sum();
    anyhow::ensure!(
        held == images.len(),
        "the conversation holds {held} images but {} are kept: it cannot be saved whole",
        images.len()
    );
    let mut pictures = images.iter();
    let list: Vec<Value> = messages.iter().enumerate().map(|(i, m)| to_json(i, m, &mut pictures)).collect();
    let text = serde_json::to_string_pretty(&list)? + "\n";
    k3_engine::write_atomic(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One message in OpenAI's shape; its images taken from `pictures`.
fn to_json<'a>(index: usize, m: &Message, pictures: &mut impl Iterator<Item = &'a Vec<u8>>) -> Value {
    let content = if m.images.is_empty() {
        json!(m.content)
    } else {
        let mut parts = Vec::new();
        let mut from = 0;
        for &at in &m.images {
            if at > from {
                parts.push(json!({"type": "text", "text": &m.content[from..at]}));
            }
            let bytes = pictures.next().map_or(&[][..], Vec::as_slice);
            parts.push(json!({"type": "image_url", "image_url": {"url": data_url(bytes)}}));
            from = at;
        }
        if from < m.content.len() || m.content.is_empty() {
            parts.push(json!({"type": "text", "text": &m.content[from..]}));
        }
        Value::Array(parts)
    };
    let mut v = json!({"role": m.role.name(), "content": content});
    if let Some(t) = &m.thinking {
        v["reasoning_content"] = json!(t);
    }
    if let Some(n) = &m.name {
        v["name"] = json!(n);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let id = c.id.clone().unwrap_or_else(|| format!("call-{index}-{j}"));
                json!({"id": id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        v["tool_calls"] = Value::Array(calls);
    }
    v
}

/// `data:image/…;base64,…`, the type read from the bytes' signature.
fn data_url(bytes: &[u8]) -> String {
    let kind = match bytes {
        [0x89, b'P', b'N', b'G', ..] => "png",
        [0xFF, 0xD8, 0xFF, ..] => "jpeg",
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => "webp",
        [b'G', b'I', b'F', b'8', ..] => "gif",
        _ => "*",
    };
    format!("data:image/{kind};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Reads a conversation written by [`save`] (or by hand, or sent to the server): at most
/// [`LOAD_LIMIT`] bytes of file, its text at most what `text` allows.
pub fn load(path: &Path, text: &TextBound) -> Result<Saved> {
    let bytes = k3_format::read_input(path, "/load reads", LOAD_LIMIT)?;
    let v: Value = serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", path.display()))?;
    drop(bytes);
    let list = v.as_array().with_context(|| format!("{}: expected a JSON array of messages", path.display()))?;
    let mut saved = Saved::default();
    for (i, m) in list.iter().enumerate() {
        let msg = from_json(m, &mut saved.images).with_context(|| format!("{}: message {i}", path.display()))?;
        saved.messages.push(msg);
    }
    let bytes: usize = saved
        .messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.thinking.as_ref().map_or(0, String::len)
                + m.tool_calls.iter().map(|c| c.name.len() + c.arguments.len()).sum::<usize>()
        })
        .sum();
    anyhow::ensure!(
        bytes as u64 <= text.bytes,
        "{} holds {bytes} bytes of text; {} at most {}",
        path.display(),
        text.what,
        text.bytes
    );
    anyhow::ensure!(
        saved.messages.iter().any(|m| m.role == Role::User),
        "{}: the conversation has no user message",
        path.display()
    );
    anyhow::ensure!(
        saved.messages.iter().skip(1).all(|m| m.role != Role::System),
        "{}: only the first message may be the system's",
        path.display()
    );
    Ok(saved)
}

/// One message; its images' bytes appended to `images`.
fn from_json(m: &Value, images: &mut Vec<Vec<u8>>) -> Result<Message> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        other => anyhow::bail!("role {other:?} (system, user, assistant or tool)"),
    };
    let text = |key: &str| -> Result<Option<String>> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => anyhow::bail!("`{key}` is not a string"),
        }
    };
    let mut msg = Message::new(role, "");
    match m.get("content") {
        Some(Value::String(s)) => msg.content = s.clone(),
        Some(Value::Array(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                part(p, &mut msg, images).with_context(|| format!("content[{j}]"))?;
            }
        }
        None | Some(Value::Null) if role == Role::Assistant => {}
        _ => anyhow::bail!("`content` is not text or a list of parts"),
    }
    msg.thinking = text("reasoning_content")?;
    msg.name = text("name")?;
    msg.tool_call_id = text("tool_call_id")?;
    anyhow::ensure!(role != Role::Tool || msg.tool_call_id.is_some(), "a tool's result needs `tool_call_id`");
    if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
        let calls = calls.as_array().context("`tool_calls` is not a list")?;
        anyhow::ensure!(role == Role::Assistant || calls.is_empty(), "only an assistant's message has tool calls");
        for (j, c) in calls.iter().enumerate() {
            msg.tool_calls.push(call(c).with_context(|| format!("tool_calls[{j}]"))?);
        }
    }
    Ok(msg)
}

/// A content part: text, or an image as a data URL (nothing is fetched).
fn part(p: &Value, msg: &mut Message, images: &mut Vec<Vec<u8>>) -> Result<()> {
    match p.get("type").and_then(Value::as_str) {
        Some("text") => msg.content.push_str(p.get("text").and_then(Value::as_str).context("no `text`")?),
        Some("image_url") => {
            let url = p.pointer("/image_url/url").and_then(Value::as_str).context("no `image_url.url`")?;
            let bytes = k3_server::api::images::data_url(url, "image_url.url").map_err(anyhow::Error::msg)?;
            images.push(bytes);
            msg.images.push(msg.content.len());
        }
        other => anyhow::bail!("part type {other:?} (text, image_url)"),
    }
    Ok(())
}

/// A tool call: `{"id"?, "function": {"name", "arguments"}}`, the arguments a JSON text.
fn call(c: &Value) -> Result<Call> {
    let name = c.pointer("/function/name").and_then(Value::as_str).context("no `function.name`")?;
    let arguments = match c.pointer("/function/arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(v @ Value::Object(_)) => v.to_string(),
        _ => anyhow::bail!("`function.arguments` is not a JSON text"),
    };
    Ok(Call { id: c.get("id").and_then(Value::as_str).map(str::to_string), name: name.to_string(), arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> TextBound {
        TextBound { bytes: 1 << 20, what: "a test holds".into() }
    }

    #[test]
    fn a_saved_conversation_loads_back_and_is_never_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c.json");
        let mut answer = Message::new(Role::Assistant, "Light.");
        answer.thinking = Some("hmm".into());
        let conv = vec![Message::new(Role::System, "Be brief."), Message::new(Role::User, "What?"), answer];
        save(&path, &conv, &[]).unwrap();
        let back = load(&path, &bound()).unwrap();
        assert_eq!(back.messages, conv);
        let e = save(&path, &conv, &[]).unwrap_err().to_string();
        assert!(e.contains("exists"), "{e}");
        std::fs::write(&path, r#"[{"role": "robot", "content": "x"}]"#).unwrap();
        assert!(format!("{:#}", load(&path, &bound()).unwrap_err()).contains("role"));
    }

    /// Images (as data URLs, where they sit in the text) and tool calls (structured, with a
    /// tool's result answering one) come back as they were.
    #[test]
    fn images_and_tool_calls_are_kept_whole() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c.json");
        let mut user = Message::new(Role::User, "What is this? And this?");
        user.images = vec![0, 14];
        let mut asked = Message::new(Role::Assistant, "Let me check.");
        asked.tool_calls = vec![
            Call { id: None, name: "look".into(), arguments: r#"{"what": "cat"}"#.into() },
            Call { id: Some("c7".into()), name: "weigh".into(), arguments: "{}".into() },
        ];
        let mut result = Message::new(Role::Tool, "a cat");
        result.tool_call_id = Some("call-1-0".into());
        let conv = vec![user, asked, result, Message::new(Role::Assistant, "A cat.")];
        let pictures = vec![b"\x89PNG\r\n\x1a\nfirst".to_vec(), b"\xff\xd8\xffsecond".to_vec()];
        save(&path, &conv, &pictures).unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(v[0]["content"][0]["image_url"]["url"].as_str().unwrap().starts_with("data:image/png;base64,"));
        assert_eq!(v[0]["content"][1], json!({"type": "text", "text": "What is this? "}));
        assert!(v[0]["content"][2]["image_url"]["url"].as_str().unwrap().starts_with("data:image/jpeg;base64,"));
        assert_eq!(v[1]["tool_calls"][0]["function"], json!({"name": "look", "arguments": "{\"what\": \"cat\"}"}));
        assert_eq!(v[1]["tool_calls"][0]["id"], "call-1-0");
        assert_eq!(v[2], json!({"role": "tool", "tool_call_id": "call-1-0", "content": "a cat"}));
        let back = load(&path, &bound()).unwrap();
        assert_eq!(back.images, pictures);
        assert_eq!(back.messages[0], conv[0]);
        assert_eq!(back.messages[1].tool_calls[0].id.as_deref(), Some("call-1-0"));
        assert_eq!(back.messages[1].tool_calls[1], conv[1].tool_calls[1]);
        assert_eq!(back.messages[2..], conv[2..]);
        // An image whose bytes are gone is said, not dropped.
        let other = d.path().join("other.json");
        let e = save(&other, &conv, &pictures[..1]).unwrap_err().to_string();
        assert!(e.contains("holds 2 images but 1 are kept"), "{e}");
        assert!(!other.exists());
    }

    #[test]
    fn load_refuses_more_text_than_the_context_holds() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c.json");
        save(&path, &[Message::new(Role::User, "x".repeat(100))], &[]).unwrap();
        let small = TextBound { bytes: 99, what: "a context of 9 tokens holds".into() };
        let e = load(&path, &small).unwrap_err().to_string();
        assert!(e.contains("holds 100 bytes of text; a context of 9 tokens holds at most 99"), "{e}");
    }
}
