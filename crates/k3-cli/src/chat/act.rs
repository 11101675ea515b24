//! What chat's slash commands do (`commands` reads them): settings, a new conversation, /show,
//! /retry, /save and /load, images.

use std::path::Path;

use anyhow::{Context, Result};
use k3_engine::Engine;
use k3_generate::media::PromptImage;
use k3_text::chat_format::{Message, Role};
use k3_text::tokenizer::Tokenizer;

use super::commands::{self, Command, Setting};
use super::show::Style;
use super::{Chat, saved};

/// What the chat loop does after a command.
#[derive(Debug, PartialEq)]
pub(super) enum Then {
    /// Waits for the next line.
    Wait,
    /// Starts the session over, then waits.
    Restart,
    /// Sends this text as the user's turn (the conversation already cut back to before it).
    Send(String),
}

/// Where the chat runs, for `/show`: the model's directory and the tokens the session holds.
pub(super) struct Here<'a> {
    pub path: &'a Path,
    pub used: usize,
}

/// Carries out a command.
pub(super) fn command(
    cmd: Command,
    chat: &mut Chat<'_>,
    (engine, tok): (&Engine<'_>, &Tokenizer),
    here: &Here<'_>,
    style: Style,
) -> Result<Then> {
    match cmd {
        Command::Help => eprintln!("{}", commands::HELP),
        Command::Clear => {
            chat.restart(Vec::new());
            style.note("[a new conversation]");
            return Ok(Then::Restart);
        }
        Command::System(s) => {
            chat.system = (!s.is_empty()).then_some(s);
            chat.restart(Vec::new());
            style.note(if chat.system.is_some() {
                "[a new conversation under the new system prompt]"
            } else {
                "[a new conversation, no system prompt]"
            });
            return Ok(Then::Restart);
        }
        Command::Settings => eprintln!("{}", settings(chat, engine)),
        Command::Show => show(chat, engine, here),
        Command::Retry => {
            return Ok(retry(chat).map_or_else(
                |why| {
                    style.note(why);
                    Then::Wait
                },
                Then::Send,
            ));
        }
        Command::Set(s) => set(s, chat, style),
        Command::Save(path) => {
            match saved::save(&path, &chat.messages, &chat.image_files[..chat.image_files.len() - chat.queued]) {
                Ok(()) => style.note(&format!(
                    "[saved {} messages{} to {}]",
                    chat.messages.len(),
                    and_images(chat.image_files.len() - chat.queued),
                    path.display()
                )),
                Err(e) => style.note(&format!("[not saved: {}]", crate::tidy(&e))),
            }
        }
        Command::Load(path) => match load(&path, engine, tok) {
            Ok((loaded, images)) => {
                style.note(&format!(
                    "[loaded {} messages{} from {}: a new conversation]",
                    loaded.messages.len(),
                    and_images(images.len()),
                    path.display()
                ));
                print_conversation(&loaded.messages, style);
                chat.system = loaded.messages.first().filter(|m| m.role == Role::System).map(|m| m.content.clone());
                chat.restart(loaded.messages);
                chat.images = images;
                chat.image_files = loaded.images;
                return Ok(Then::Restart);
            }
            Err(e) => style.note(&format!("[not loaded: {}]", crate::tidy(&e))),
        },
        Command::Image(path) => match crate::images::read(engine, tok, &path) {
            Ok(img) => {
                let n = img.prompt.rows.len() / engine.hidden().max(1);
                style.note(&format!(
                    "[{} x {} image, {n} positions: it goes with your next message]",
                    img.prompt.width, img.prompt.height
                ));
                chat.queue(img);
            }
            Err(e) => style.note(&format!("[no image: {}]", crate::tidy(&e))),
        },
        Command::Say(_) | Command::Exit => {}
    }
    Ok(Then::Wait)
}

/// The sampling and length settings in force (`/set` alone).
fn settings(chat: &Chat<'_>, engine: &Engine<'_>) -> String {
    let p = &chat.params;
    format!(
        "{}; seed {}; max_tokens {}; {}; context {} tokens",
        k3_generate::generation_config::describe(&p.sampler),
        p.sampler.seed,
        p.max_tokens,
        match (chat.thinks, chat.think) {
            (false, _) => "this model does not think".to_string(),
            (true, on) =>
                format!("think {}, max_thinking {}", if on { "on" } else { "off" }, p.max_thinking.unwrap_or(0)),
        },
        engine.plan().context
    )
}

/// `/show`: the model, the settings, the system prompt and how much of the context is used.
fn show(chat: &Chat<'_>, engine: &Engine<'_>, here: &Here<'_>) {
    let c = engine.config();
    let context = engine.plan().context.max(1);
    eprintln!(
        "model     {} ({}, {} layers, vocab {})",
        here.path.display(),
        c.family.name(),
        engine.layers(),
        engine.vocab()
    );
    eprintln!("settings  {}", settings(chat, engine));
    eprintln!("system    {}", chat.system.as_deref().map_or_else(|| "none".into(), |s| format!("{s:?}")));
    eprintln!(
        "context   {} of {context} tokens used ({:.1}%) by {} messages{}",
        here.used,
        100.0 * here.used as f64 / context as f64,
        chat.messages.iter().filter(|m| m.role != Role::System).count(),
        if chat.live { "" } else { " (computed again at the next message)" }
    );
}

/// `/retry`: the last user message again, its answer dropped (and its images sent again): the
/// text to send, or why there is nothing to retry.
fn retry(chat: &mut Chat<'_>) -> Result<String, &'static str> {
    if chat.queued > 0 {
        return Err("[an image waits for your next message: send a message, or /clear, before /retry]");
    }
    let Some(at) = chat.messages.iter().rposition(|m| m.role == Role::User) else {
        return Err("[nothing to retry: no message has been sent]");
    };
    let images = chat.messages[at].images.len();
    let later: usize = chat.messages[at + 1..].iter().map(|m| m.images.len()).sum();
    let text = chat.messages[at].content.clone();
    chat.messages.truncate(at);
    // Its images come after every earlier message's, and before those of the messages after it
    // (a loaded conversation may hold some): those go, its own are queued again.
    let keep = chat.images.len().saturating_sub(later);
    chat.images.truncate(keep);
    chat.image_files.truncate(keep);
    chat.queued = images;
    chat.live = false;
    Ok(text)
}

/// A loaded conversation as it reads: each message's role and text, its images and tool calls.
fn print_conversation(messages: &[Message], style: Style) {
    for m in messages {
        let who = match m.role {
            Role::System => "system",
            Role::User => "you",
            Role::Assistant => "model",
            Role::Tool => "tool",
        };
        let mut extra = String::new();
        if !m.images.is_empty() {
            extra.push_str(&format!(" [{} image{}]", m.images.len(), if m.images.len() == 1 { "" } else { "s" }));
        }
        for c in &m.tool_calls {
            extra.push_str(&format!(" [calls {}({})]", c.name, c.arguments));
        }
        eprintln!("{} {}{extra}", style.bold(&format!("{who}:")), m.content);
    }
}

/// " and N images" after a count of messages (nothing without images).
fn and_images(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(" and {n} image{}", if n == 1 { "" } else { "s" }),
    }
}

/// A saved conversation read (within the context's text) and its images embedded.
fn load(path: &Path, engine: &Engine<'_>, tok: &Tokenizer) -> Result<(saved::Saved, Vec<PromptImage>)> {
    let loaded = saved::load(path, &crate::prompt::TextBound::of(tok, engine.plan().context))?;
    if !loaded.images.is_empty() {
        // Once, before any image is decoded: a model without eyes says so for the first.
        engine.check_sees().with_context(|| format!("{}: image 1", path.display()))?;
    }
    let limits = k3_generate::media::DecodeLimits::default();
    let mut images = Vec::with_capacity(loaded.images.len());
    for (i, bytes) in loaded.images.iter().enumerate() {
        let image = crate::images::embed(engine, bytes, &limits);
        images.push(image.with_context(|| format!("{}: image {}", path.display(), i + 1))?);
    }
    if !images.is_empty() {
        k3_generate::media::check_tokenizer(tok)?;
    }
    Ok((loaded, images))
}

fn set(s: Setting, chat: &mut Chat<'_>, style: Style) {
    let p = &mut chat.params;
    match s {
        Setting::Temperature(t) => p.sampler.temperature = t,
        Setting::TopP(v) => p.sampler.top_p = v,
        Setting::TopK(k) => p.sampler.top_k = k,
        Setting::MinP(v) => p.sampler.min_p = v,
        Setting::MaxTokens(n) => p.max_tokens = n,
        Setting::Seed(n) => p.sampler.seed = n,
        Setting::MaxThinking(n) if chat.thinks => p.max_thinking = Some(n),
        Setting::Think(on) if chat.thinks => {
            chat.think = on;
            p.starts_in_think = on && p.think_tags.is_none();
            style.note("[thinking changes from the next conversation: /clear starts one]");
        }
        Setting::MaxThinking(_) | Setting::Think(_) => return style.note("[this model does not think]"),
    }
    style.note("[set]");
}
