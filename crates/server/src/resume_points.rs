//! Where a chat prompt's state is worth keeping while it prefills ([`resume_points`]), found by
//! rendering the conversation's beginnings alone; the render of its first part (the system turn
//! and the tool declarations) is kept for the requests that begin the same way ([`Beginnings`]):
//! every turn of a conversation, and every conversation of a client with one system prompt and
//! one set of tools, would otherwise render and tokenize it again.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k3_text::chat_format::{ChatFormat, Message, PromptOptions, Role, ToolChoice};

/// Renders of beginnings kept at most (the most recently used are kept).
const KEPT: usize = 16;

/// Their tokens kept at most, all together.
const KEPT_TOKENS: usize = 1 << 20;

/// Renders of conversations' beginnings, most recently used first.
#[derive(Debug, Default)]
pub struct Beginnings {
    kept: Mutex<VecDeque<(Beginning, Arc<[u32]>)>>,
}

/// What a beginning's render depends on besides the model's chat format: its messages and the
/// request's options.
#[derive(Debug, PartialEq, Eq)]
struct Beginning {
    messages: Vec<Message>,
    think: bool,
    effort: Option<String>,
    tools: Option<String>,
    tool_choice: ToolChoice,
    json_object: bool,
    json_schema: Option<String>,
}

impl Beginning {
    fn new(messages: &[Message], o: &PromptOptions<'_>) -> Self {
        // Every option named: one added to the format's is added here, or this does not build.
        let PromptOptions { think, effort, tools, tool_choice, json_object, json_schema } = *o;
        Beginning {
            messages: messages.to_vec(),
            think,
            effort: effort.map(str::to_string),
            tools: tools.map(str::to_string),
            tool_choice,
            json_object,
            json_schema: json_schema.map(str::to_string),
        }
    }
}

impl Beginnings {
    /// `messages` rendered with `o` by `format`: a render kept from an earlier request, or a
    /// new one (then kept; one that fails is not).
    fn render(&self, format: &ChatFormat<'_>, messages: &[Message], o: &PromptOptions<'_>) -> Option<Arc<[u32]>> {
        let key = Beginning::new(messages, o);
        if let Ok(mut kept) = self.kept.lock()
            && let Some(at) = kept.iter().position(|(k, _)| *k == key)
        {
            let hit = kept.remove(at)?;
            let tokens = hit.1.clone();
            kept.push_front(hit);
            return Some(tokens);
        }
        let tokens: Arc<[u32]> = format.prompt_with(messages, o).ok()?.into();
        if let Ok(mut kept) = self.kept.lock() {
            kept.push_front((key, tokens.clone()));
            while kept.len() > KEPT || kept.iter().map(|(_, t)| t.len()).sum::<usize>() > KEPT_TOKENS {
                kept.pop_back();
            }
        }
        Some(tokens)
    }
}

/// Where a chat prompt's state is worth keeping while it prefills: after the leading system
/// messages (with the tool declarations; when there are tools or a system message), and after
/// the message before the last (when there are earlier messages). Each is where the prompt
/// rendered up to that message, with the same options, parts from the whole one: the template's
/// own split, whatever its markup. At most two a request (two states' memory); none where
/// the rendering fails or the point is not inside the prompt. The first part's render comes from
/// `beginnings` when a request began the same way.
pub(crate) fn resume_points(
    format: &ChatFormat<'_>,
    messages: &[Message],
    options: &PromptOptions<'_>,
    prompt: &[u32],
    beginnings: &Beginnings,
) -> Vec<usize> {
    let system = messages.iter().take_while(|m| m.role == Role::System).count();
    let mut parts: Vec<Arc<[u32]>> = Vec::new();
    if (system > 0 || options.tools.is_some()) && system < messages.len() {
        parts.extend(beginnings.render(format, &messages[..system], options));
    }
    if messages.len() > system + 1 {
        parts.extend(format.prompt_with(&messages[..messages.len() - 1], options).ok().map(Arc::from));
    }
    let mut at: Vec<usize> = parts
        .iter()
        .map(|part| part.iter().zip(prompt).take_while(|(a, b)| a == b).count())
        .filter(|&n| n > 0 && n < prompt.len())
        .collect();
    at.sort_unstable();
    at.dedup();
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_text::Dialect;

    fn conversation(system: &str, user: &str) -> Vec<Message> {
        vec![
            Message::new(Role::System, system),
            Message::new(Role::User, "Weather in Paris?"),
            Message::new(Role::Assistant, "Sunny."),
            Message::new(Role::User, user),
        ]
    }

    /// The resume points a request gets with its beginning's render kept from an earlier request
    /// are the ones rendering it again gives; the beginning is rendered once for both, and a
    /// different beginning (another system prompt, other options) is rendered on its own.
    #[test]
    fn a_kept_beginning_gives_the_resume_points_a_new_render_gives() {
        let tok = k3_text::tokenizer::k3_test_tokenizer();
        let format = ChatFormat::new(&tok, Dialect::Xtml);
        let tools = r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]"#;
        let o = PromptOptions { tools: Some(tools), ..PromptOptions::default() };
        let shared = Beginnings::default();
        let mut firsts = Vec::new();
        for user in ["And tomorrow?", "And in Rome?"] {
            let messages = conversation("You are brief.", user);
            let prompt = format.prompt_with(&messages, &o).unwrap();
            let kept = resume_points(&format, &messages, &o, &prompt, &shared);
            let fresh = resume_points(&format, &messages, &o, &prompt, &Beginnings::default());
            assert_eq!(kept, fresh, "{user}");
            assert_eq!(kept.len(), 2, "{kept:?}");
            let k = shared.kept.lock().unwrap();
            assert_eq!(k.len(), 1, "one beginning");
            firsts.push(k[0].1.clone());
        }
        assert!(Arc::ptr_eq(&firsts[0], &firsts[1]), "the second request did not render the beginning again");
        let other = conversation("You are verbose.", "And tomorrow?");
        let prompt = format.prompt_with(&other, &o).unwrap();
        resume_points(&format, &other, &o, &prompt, &shared);
        let thinking = PromptOptions { think: true, ..o.clone() };
        let prompt = format.prompt_with(&other, &thinking).unwrap();
        let kept = resume_points(&format, &other, &thinking, &prompt, &shared);
        assert_eq!(kept, resume_points(&format, &other, &thinking, &prompt, &Beginnings::default()));
        assert_eq!(shared.kept.lock().unwrap().len(), 3, "another system prompt, other options: new renders");
    }
}
