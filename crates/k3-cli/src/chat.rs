//! `k3-cli chat`: an interactive multi-turn session. Each turn appends only its new tokens to the
//! running session; Ctrl-C stops the current answer and keeps the session.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use k3_engine::chat::{ChatFormat, Message, Role};
use k3_engine::sample::{Sampler, SamplerConfig};
use k3_engine::tokenizer::{StreamDecoder, Tokenizer};

use crate::run::EngineArgs;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_ctrl_c() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}

/// Decides what of the model's output a person sees: K3 text inside `think` only when asked,
/// text inside `response` always, markup and special tokens never.
struct Visibility<'t> {
    tok: &'t Tokenizer,
    show_thinking: bool,
    /// Inside the tag name after `<|open|>` / `<|close|>`: the bytes so far, and whether opening.
    tag: Option<(Vec<u8>, bool)>,
    visible: bool,
}

impl<'t> Visibility<'t> {
    fn new(tok: &'t Tokenizer, show_thinking: bool, starts_in_think: bool) -> Self {
        Visibility { tok, show_thinking, tag: None, visible: !starts_in_think || show_thinking }
    }

    /// Whether token `id` is shown.
    fn show(&mut self, id: u32) -> Result<bool> {
        match self.tok.special_name(id) {
            Some("<|open|>") => self.tag = Some((Vec::new(), true)),
            Some("<|close|>") => self.tag = Some((Vec::new(), false)),
            Some("<|sep|>") => {
                if let Some((name, opening)) = self.tag.take() {
                    let name = String::from_utf8_lossy(&name).into_owned();
                    self.visible = match (name.as_str(), opening) {
                        ("think", true) => self.show_thinking,
                        ("response", true) => true,
                        _ => false,
                    };
                }
            }
            Some(_) => {}
            None => {
                if let Some((name, _)) = &mut self.tag {
                    name.extend(self.tok.decode_bytes(&[id])?);
                    return Ok(false);
                }
                return Ok(self.visible);
            }
        }
        Ok(false)
    }
}

pub struct ChatArgs<'a> {
    pub system: Option<&'a str>,
    pub think: bool,
    pub show_thinking: bool,
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
}

pub fn run(path: &Path, a: ChatArgs<'_>, ea: &EngineArgs) -> Result<ExitCode> {
    let model = k3_format::Model::open_with(path, &k3_format::OpenOptions { shard_dirs: ea.shard_dirs.clone() })
        .with_context(|| format!("opening {}", path.display()))?;
    let tok = Tokenizer::from_model(&model).with_context(|| format!("{} embeds no tokenizer", path.display()))??;
    let engine =
        k3_engine::Engine::load_with(&model, ea.options()?).with_context(|| format!("loading {}", path.display()))?;
    ea.start(&engine)?;
    let family = engine.config().family;
    let format = ChatFormat::new(&tok, family);
    let end = format.end_of_turn()?;
    let think = a.think && family == k3_engine::config::Family::KimiK3;
    let mut session = engine.session();
    let mut sampler = Sampler::new(a.sampler);
    let mut pending: Vec<u32> = match a.system {
        Some(s) => format.turn(&Message::new(Role::System, s))?,
        None => Vec::new(),
    };
    catch_ctrl_c();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let v = engine.vocab();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            break;
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        pending.extend(format.turn(&Message::new(Role::User, text))?);
        pending.extend(format.generation_prompt(think)?);
        INTERRUPTED.store(false, Ordering::SeqCst);
        let mut logits = Vec::new();
        for c in pending.chunks(32) {
            logits = engine.forward(&mut session, c, None)?;
        }
        pending.clear();
        let mut vis = Visibility::new(&tok, a.show_thinking, think);
        let mut stream = StreamDecoder::default();
        let mut ended = false;
        for _ in 0..a.max_tokens {
            if INTERRUPTED.load(Ordering::SeqCst) {
                write!(out, " [stopped]")?;
                break;
            }
            let next = sampler.sample(&logits[logits.len() - v..]);
            if next == end {
                ended = true;
                logits = engine.forward(&mut session, &[next], None)?;
                break;
            }
            let piece = stream.push(&tok, next)?;
            if vis.show(next)? {
                write!(out, "{piece}")?;
                out.flush()?;
            }
            logits = engine.forward(&mut session, &[next], None)?;
        }
        writeln!(out, "{}", stream.finish())?;
        if !ended {
            // The answer was cut short: close the turn before the next one.
            pending.push(end);
        }
    }
    ea.finish(&session)?;
    Ok(ExitCode::SUCCESS)
}
