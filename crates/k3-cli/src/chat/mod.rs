//! `k3-cli chat`: an interactive multi-turn session over `k3_generate::Generator`. Each
//! turn appends only its new tokens to the running session. On a terminal: a banner, line editing
//! (`input`, with `"""` for a message of several lines), slash commands (`commands` reads them,
//! `act` carries them out: /help, /clear, /system, /set, /show, /retry, /save, /load, /bye), a
//! counting thinking line or the thinking shown dimmed and apart, tool calls as name and
//! arguments (`show`), colour unless `NO_COLOR`. Ctrl-C stops the current answer and keeps the
//! session; an answer cut short is closed and says so. An answer that fails (the engine's error,
//! standard output gone) keeps the conversation: the user's turn and what was said stay, the
//! error is said, and the next turn is computed afresh from the messages.

mod act;
mod commands;
mod input;
mod saved;
mod show;
mod turn;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use k3_engine::config::Family;
use k3_engine::{Engine, Session};
use k3_generate::GenerateParams;
use k3_generate::media::PromptImage;
use k3_generate::speculate::SpecStats;
use k3_text::chat_format::{Call, ChatFormat, DEFAULT_EFFORT, Message, PromptOptions, Role};
use k3_text::tokenizer::Tokenizer;

use crate::prompt_cache::PromptCacheArgs;
use crate::run::{EngineArgs, Needs, RUN_ACTIVATIONS, open_model};
use crate::sampling::SamplingArgs;
use crate::signals;
use commands::Command;
use input::Input;
use show::Style;
use turn::Turn;

#[derive(clap::Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: crate::ModelPath,
    /// One message: its answer is printed and the command ends (`ollama run NAME MESSAGE`)
    /// [default: none: a conversation].
    #[arg(value_name = "MESSAGE")]
    message: Option<String>,
    /// A system prompt (/system TEXT changes it in the chat) [default: none, or the template's own].
    #[arg(long)]
    system: Option<String>,
    /// Answer without a thinking section (K3 and thinking models; /set think off).
    #[arg(long, conflicts_with = "show_thinking")]
    no_think: bool,
    /// Show the model's thinking, dimmed and apart from the answer [default: hidden, a line on
    /// standard error counts its tokens].
    #[arg(long)]
    show_thinking: bool,
    /// The most tokens of one answer, thinking not counted, at least 1 (/set max_tokens N).
    #[arg(short = 'n', long, default_value_t = 512, value_parser = crate::prompt::max_tokens)]
    max_tokens: u64,
    /// An image sent with the first message (K3; repeat for several; /image FILE sends one with
    /// a later message) [default: none].
    #[arg(long = "image", value_name = "FILE")]
    images: Vec<PathBuf>,
    /// The most tokens of thinking before the model is made to answer (/set max_thinking N).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    max_thinking: u64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Restores the first turn from DIR (a system prompt computed once), and keeps its states.
    #[command(flatten)]
    prompt_cache: PromptCacheArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// The conversation and what the next turn is generated with.
struct Chat<'t> {
    format: ChatFormat<'t>,
    params: GenerateParams,
    /// The model can think (K3, or `<think>` tags), and whether it does.
    thinks: bool,
    think: bool,
    system: Option<String>,
    /// What was said, for /save (and, after /load, what the next turn renders first).
    messages: Vec<Message>,
    /// The session holds `messages` (false after /load, /clear and /system).
    live: bool,
    /// Every image of the conversation in order, the last `queued` waiting for the next message.
    images: Vec<PromptImage>,
    /// The files' bytes of `images`, in the same order (what `/save` writes).
    image_files: Vec<Vec<u8>>,
    queued: usize,
}

impl Chat<'_> {
    fn opening(&self) -> PromptOptions<'static> {
        let think = self.think;
        PromptOptions { think, effort: think.then_some(DEFAULT_EFFORT), ..PromptOptions::default() }
    }

    /// The tokens of the next user turn: the whole conversation when the session is fresh.
    fn pending(&self, session: &Session, text: &str) -> Result<Vec<u32>> {
        let user = self.user(text);
        Ok(match (session.tokens(), self.messages.is_empty()) {
            (0, true) => self.format.first_turn(&self.opening(), self.system.as_deref(), &user)?,
            (0, false) => {
                let mut all = self.messages.clone();
                all.push(user);
                self.format.prompt_with(&all, &self.opening())?
            }
            _ => self.format.next_turn(&user, self.think)?,
        })
    }

    /// The user's message, the queued images first.
    fn user(&self, text: &str) -> Message {
        let mut m = Message::new(Role::User, text);
        m.images = vec![0; self.queued];
        m
    }

    /// The images `pending` holds: all of them when it renders the whole conversation.
    fn images_of(&self, session: &Session) -> &[PromptImage] {
        if session.tokens() == 0 { &self.images } else { &self.images[self.images.len() - self.queued..] }
    }

    /// A new conversation: `messages` from the start (the system prompt's message first).
    fn restart(&mut self, messages: Vec<Message>) {
        self.images.clear();
        self.image_files.clear();
        self.queued = 0;
        self.messages = messages;
        if self.messages.is_empty()
            && let Some(s) = &self.system
        {
            self.messages.push(Message::new(Role::System, s.clone()));
        }
        self.live = false;
    }

    /// An image for the next message.
    fn queue(&mut self, image: crate::images::Image) {
        self.images.push(image.prompt);
        self.image_files.push(image.bytes);
        self.queued += 1;
    }

    /// The conversation goes on with the user's `text` and what the answer `a` said (the user's
    /// turn alone when it failed before a word, or before it started: `None`); tool calls the
    /// model gave no id are named as the server names them.
    fn record(&mut self, text: &str, a: Option<&show::Answered>) {
        self.messages.push(self.user(text));
        self.queued = 0;
        let Some(a) =
            a.filter(|a| a.failed.is_none() || !(a.text.is_empty() && a.thinking.is_empty() && a.calls.is_empty()))
        else {
            return;
        };
        let index = self.messages.len();
        let mut said = Message::new(Role::Assistant, a.text.clone());
        said.thinking = (!a.thinking.is_empty()).then(|| a.thinking.clone());
        said.tool_calls = a
            .calls
            .iter()
            .enumerate()
            .map(|(j, c)| Call {
                id: Some(if c.id.is_empty() { format!("call-{index}-{j}") } else { c.id.clone() }),
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        self.messages.push(said);
    }
}

pub fn run(a: ChatArgs) -> Result<ExitCode> {
    let path = a.model.clone().resolve()?;
    let model = open_model(&path, &a.engine.knobs.shard_dirs)?;
    let tok =
        k3_generate::model_tokenizer(&model).with_context(|| format!("{} embeds no tokenizer", path.display()))??;
    let engine = a.engine.load(
        &model,
        &path,
        Needs {
            min_context: 0,
            fit: true,
            chunk: None,
            activations: RUN_ACTIVATIONS,
            ..Needs::exact(crate::prompt::LONGEST_CONTEXT, 1)
        },
    )?;
    let cancel = signals::ctrl_c_flag();
    let mut chat = open_chat(&a, &model, &engine, &tok, cancel.clone())?;
    let mut cache = a.prompt_cache.open(&engine)?;
    let mut session = engine.session();
    let mut speculation = SpecStats::default();
    let style = Style::detect();
    let mut input = match &a.message {
        Some(m) => Input::Once(Some(m.clone())),
        None => Input::open()?,
    };
    if let Input::Editor(..) = input {
        banner(&engine, &path, &chat, input.history(), style);
    }
    let mut out = std::io::stdout().lock();
    while let Some(line) = input.line()? {
        if line.trim().is_empty() {
            continue;
        }
        let text = match commands::parse(&line) {
            Ok(Command::Say(text)) => text,
            Ok(Command::Exit) => break,
            Ok(cmd) => {
                let here = act::Here { path: &path, used: session.tokens() };
                match act::command(cmd, &mut chat, (&engine, &tok), &here, style)? {
                    act::Then::Wait => continue,
                    act::Then::Restart => {
                        session = engine.session();
                        continue;
                    }
                    act::Then::Send(text) => text,
                }
            }
            Err(e) => {
                style.note(&e);
                continue;
            }
        };
        if !chat.live {
            session = engine.session();
            chat.live = true;
        }
        let turn = Turn { cache: cache.as_mut(), stats: a.engine.stats, cancel: &cancel };
        let before = chat.messages.len();
        match turn.run(&engine, &tok, &mut chat, &mut session, &text, style, a.show_thinking, &mut out) {
            Ok(said) => speculation.add(&said),
            Err(e) => style.note(&failure_note(&chat, before, &e)),
        }
        // What the turn kept is on disk before chat waits again: a signal there ends the process
        // at once, and nothing may be left half written.
        if let Some(c) = cache.as_mut() {
            c.settle();
        }
    }
    input.save()?;
    drop(out);
    a.engine.report(&engine, &session.stats, Some(&speculation))?;
    a.engine.finish(&session)?;
    Ok(ExitCode::SUCCESS)
}

/// The chat's format, generation settings and opening state (system prompt, `--image`s queued)
/// for `model` on `engine`.
fn open_chat<'t>(
    a: &ChatArgs,
    model: &k3_engine::Model,
    engine: &Engine<'_>,
    tok: &'t Tokenizer,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<Chat<'t>> {
    let sampler = a.sampling.config(model, true, engine.vocab())?;
    a.sampling.say_seed(&sampler, a.engine.stats);
    let family = engine.config().family;
    let format = ChatFormat::new(tok, k3_generate::dialect(family));
    format.check().context("the model's chat template cannot be used")?;
    let end = format.end_of_turn()?;
    let think_tags = if family == Family::KimiK3 { None } else { tok.think_tags() };
    let thinks = family == Family::KimiK3 || think_tags.is_some();
    let think = thinks && !a.no_think;
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        max_thinking: thinks.then_some(a.max_thinking),
        sampler,
        stop_ids: vec![end],
        reasoning_apart: true,
        starts_in_think: think && family == Family::KimiK3,
        think_tags,
        close_turn: Some(end),
        cancel: Some(cancel),
        chunk: None,
        speculate: a.sampling.speculate as usize,
        ..GenerateParams::default()
    };
    let mut chat = Chat {
        format,
        params,
        thinks,
        think,
        system: a.system.clone(),
        messages: Vec::new(),
        live: true,
        images: Vec::new(),
        image_files: Vec::new(),
        queued: 0,
    };
    chat.restart(Vec::new());
    for image in crate::images::read_all(engine, tok, &a.images)? {
        chat.queue(image);
    }
    Ok(chat)
}

/// The line a person sees first: the model, its context, sampling, where history is kept, help.
fn banner(
    engine: &Engine<'_>,
    path: &std::path::Path,
    chat: &Chat<'_>,
    history: Option<&std::path::Path>,
    style: Style,
) {
    let name = path.file_stem().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let c = engine.config();
    eprintln!(
        "{} {name} ({}, {} layers) · context {} tokens · {}{}",
        style.bold("k3 chat ·"),
        c.family.name(),
        engine.layers(),
        engine.plan().context,
        k3_generate::generation_config::describe(&chat.params.sampler),
        if chat.thinks { format!(" · thinking {}", if chat.think { "on" } else { "off" }) } else { String::new() },
    );
    let kept = history.map_or_else(|| "not kept".into(), |h| format!("kept in {}", h.display()));
    eprintln!("line history {kept} · /help for commands · Ctrl-C stops an answer · Ctrl-D or /bye quits");
}

/// What chat says of a turn that failed, `before` the number of messages it started with: nothing
/// ran (the conversation is as it was), or what was kept.
fn failure_note(chat: &Chat<'_>, before: usize, e: &anyhow::Error) -> String {
    if chat.messages.len() == before {
        return format!("[not sent: {}]", crate::tidy(e));
    }
    let said = chat.messages.last().is_some_and(|m| m.role == Role::Assistant);
    format!(
        "[the answer failed: {}; the conversation is kept (your message{}): the next message goes on from it]",
        crate::tidy(e),
        if said { " and what was said" } else { "" }
    )
}
