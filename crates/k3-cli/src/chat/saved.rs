//! `/save` and `/load`: a conversation as JSON messages (`[{"role", "content",
//! "reasoning_content"?}]`, OpenAI's shape), so it can be sent to the server or read back.

use std::path::Path;

use anyhow::{Context, Result};
use k3_engine::chat::{Message, Role};
use serde_json::{Value, json};

/// Writes `messages` to `path`, which must not exist (nothing of the user's is overwritten).
pub fn save(path: &Path, messages: &[Message]) -> Result<()> {
    anyhow::ensure!(!path.exists(), "{} exists: give another name (it is left as it is)", path.display());
    let list: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut v = json!({"role": role_name(m.role), "content": m.content});
            if let Some(t) = &m.thinking {
                v["reasoning_content"] = json!(t);
            }
            v
        })
        .collect();
    let text = serde_json::to_string_pretty(&list)? + "\n";
    k3_engine::write_atomic(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads a conversation written by [`save`] (or by hand): system, user and assistant messages.
pub fn load(path: &Path) -> Result<Vec<Message>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let list = v.as_array().with_context(|| format!("{}: expected a JSON array of messages", path.display()))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = || format!("{}: message {i}", path.display());
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            other => anyhow::bail!("{}: role {other:?} (system, user or assistant)", at()),
        };
        let content = m.get("content").and_then(Value::as_str).with_context(|| format!("{}: no text content", at()))?;
        let mut msg = Message::new(role, content);
        msg.thinking = m.get("reasoning_content").and_then(Value::as_str).map(str::to_string);
        out.push(msg);
    }
    anyhow::ensure!(
        out.iter().any(|m| m.role == Role::User),
        "{}: the conversation has no user message",
        path.display()
    );
    anyhow::ensure!(
        out.iter().skip(1).all(|m| m.role != Role::System),
        "{}: only the first message may be the system's",
        path.display()
    );
    Ok(out)
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_conversation_loads_back_and_is_never_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("c.json");
        let mut answer = Message::new(Role::Assistant, "Light.");
        answer.thinking = Some("hmm".into());
        let conv = vec![Message::new(Role::System, "Be brief."), Message::new(Role::User, "What?"), answer];
        save(&path, &conv).unwrap();
        let back = load(&path).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!((back[2].content.as_str(), back[2].thinking.as_deref()), ("Light.", Some("hmm")));
        let e = save(&path, &conv).unwrap_err().to_string();
        assert!(e.contains("exists"), "{e}");
        std::fs::write(&path, r#"[{"role": "tool", "content": "x"}]"#).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("role"));
    }
}
