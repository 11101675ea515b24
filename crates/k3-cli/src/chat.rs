//! `k3-cli chat`: an interactive multi-turn session over `k3_engine::generate::Generator`. Each
//! turn appends only its new tokens to the running session. On a terminal, lines are edited with
//! rustyline (arrows, history kept in the data directory); piped input is read line by line.
//! Ctrl-C stops the current answer and keeps the session; an answer cut short (Ctrl-C,
//! `--max-tokens`) is closed and says so.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use k3_engine::chat::{ChatFormat, DEFAULT_EFFORT, Message, PromptOptions, Role};
use k3_engine::generate::{Finish, GenerateParams, Generator};
use k3_engine::speculate::SpecStats;
use k3_engine::tokenizer::Tokenizer;

use crate::prompt_cache::{PromptCache, PromptCacheArgs};
use crate::run::{EngineArgs, Needs, RUN_ACTIVATIONS, open_model};
use crate::sampling::SamplingArgs;
use crate::signals;

#[derive(clap::Args)]
pub struct ChatArgs {
    /// The model directory (default: the default model compiled into k3-cli).
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Answer without a thinking section (K3).
    #[arg(long, conflicts_with = "show_thinking")]
    no_think: bool,
    /// Show the model's thinking (hidden by default).
    #[arg(long)]
    show_thinking: bool,
    /// The most tokens of one answer.
    #[arg(short = 'n', long, default_value_t = 512)]
    max_tokens: u64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Restores the first turn from DIR (a system prompt computed once), and keeps its states.
    #[command(flatten)]
    prompt_cache: PromptCacheArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Where the user's lines come from.
enum Input {
    /// A terminal: rustyline, with the history file it loads and saves.
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    Piped(std::io::StdinLock<'static>),
}

impl Input {
    fn open() -> Result<Input> {
        if !std::io::stdin().is_terminal() {
            return Ok(Input::Piped(std::io::stdin().lock()));
        }
        let mut ed = rustyline::DefaultEditor::new().context("starting the line editor")?;
        let history = crate::default_model::data_dir().ok().map(|d| d.join("chat-history"));
        // One line per entry; an unreadable history only costs the recall of old lines.
        if let Some(text) = history.as_ref().and_then(|h| std::fs::read_to_string(h).ok()) {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let _ = ed.add_history_entry(line);
            }
        }
        Ok(Input::Editor(Box::new(ed), history))
    }

    /// The next line, `None` at the end of input.
    fn line(&mut self) -> Result<Option<String>> {
        match self {
            Input::Piped(stdin) => {
                eprint!("> ");
                let mut line = String::new();
                if stdin.read_line(&mut line).context("reading standard input")? == 0 {
                    eprintln!();
                    return Ok(None);
                }
                Ok(Some(line.trim_end_matches(['\n', '\r']).to_string()))
            }
            Input::Editor(ed, _) => loop {
                match ed.readline("> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = ed.add_history_entry(line.as_str());
                        }
                        return Ok(Some(line));
                    }
                    // Ctrl-C at the prompt clears the line, as in a shell.
                    Err(rustyline::error::ReadlineError::Interrupted) => continue,
                    Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                    Err(e) => return Err(e).context("reading a line"),
                }
            },
        }
    }

    /// Saves the editor's history (atomically; the data directory made if needed).
    fn save(&mut self) -> Result<()> {
        if let Input::Editor(ed, Some(path)) = self {
            // The last 1,000 lines, one per line.
            let entries: Vec<&String> = ed.history().into_iter().collect();
            let mut text = String::new();
            for entry in entries.iter().skip(entries.len().saturating_sub(1000)) {
                text.push_str(entry);
                text.push('\n');
            }
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            k3_engine::write_atomic(&*path, text.as_bytes())?;
        }
        Ok(())
    }
}

pub fn run(a: ChatArgs) -> Result<ExitCode> {
    let path = crate::default_model::or_default(a.model.clone())?;
    let model = open_model(&path, &a.engine.knobs.shard_dirs)?;
    let tok = Tokenizer::from_model(&model).with_context(|| format!("{} embeds no tokenizer", path.display()))??;
    let engine = a.engine.load(
        &model,
        &path,
        Needs { min_context: 0, chunk: None, activations: RUN_ACTIVATIONS, ..Needs::exact(4096, 1) },
    )?;
    let sampler = a.sampling.config(&model, true, engine.vocab())?;
    a.sampling.say_seed(&sampler, a.engine.stats);
    let family = engine.config().family;
    let format = ChatFormat::new(&tok, family);
    format.check().context("the model's chat template cannot be used")?;
    let end = format.end_of_turn()?;
    let think = !a.no_think && family == k3_engine::config::Family::KimiK3;
    let context = engine.plan().context as usize;
    let cancel = signals::ctrl_c_flag();
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampler,
        stop_ids: vec![end],
        show_thinking: a.show_thinking,
        starts_in_think: think,
        think_tags: if family == k3_engine::config::Family::KimiK3 { None } else { tok.think_tags() },
        close_turn: Some(end),
        cancel: Some(cancel.clone()),
        chunk: None,
        speculate: a.sampling.speculate as usize,
        ..GenerateParams::default()
    };
    let mut cache = a.prompt_cache.open(&engine)?;
    let mut session = engine.session();
    let mut speculation = SpecStats::default();
    // The first turn is the whole conversation so far as the format writes it (K3's thinking
    // effort first; a model's own template's default system turn where it writes it, and only
    // without a system turn of one's own); later turns follow the answers the model gave.
    let opening = PromptOptions { think, effort: think.then_some(DEFAULT_EFFORT), ..PromptOptions::default() };
    let mut input = Input::open()?;
    let mut out = std::io::stdout().lock();
    while let Some(text) = input.line()? {
        if text.trim().is_empty() {
            continue;
        }
        let pending = if session.tokens() == 0 {
            format.first_turn(&opening, a.system.as_deref(), &text)?
        } else {
            format.next_turn(&Message::new(Role::User, &text), think)?
        };
        // Room for the turn and at least one answer token.
        if session.tokens() + pending.len() >= context {
            eprintln!(
                "[the conversation would pass the context of {context} tokens: start a new chat, or raise --context]"
            );
            break;
        }
        cancel.store(false, std::sync::atomic::Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        let first = session.tokens() == 0;
        let (from, kept_logits) = match cache.as_mut().filter(|_| first) {
            Some(c) => {
                let boundary = system_boundary(&format, &opening, a.system.as_deref(), &pending);
                first_turn_from_cache(&engine, c, &mut session, &pending, boundary, a.engine.stats)?
            }
            None => (0, None),
        };
        let turn = match (from == pending.len(), kept_logits) {
            (true, Some(l)) => Generator::resume(&engine, &mut session, l, Some(&tok), params.clone())?,
            _ => Generator::start(&engine, &mut session, &pending[from..], Some(&tok), params.clone(), &mut |_, _| {})?,
        };
        if let Some(c) = cache.as_mut().filter(|_| first)
            && from < pending.len()
            && turn.session().tokens() > 0
            && turn.session().ids().ends_with(&pending)
        {
            c.keep(&engine, turn.session(), Some(turn.last_logits(&engine)));
        }
        let prompt_tokens = pending.len();
        let (answered, finish, spec) = answer(&engine, turn, &mut out)?;
        speculation.add(&spec);
        match finish {
            Some(Finish::Length) => eprintln!("[answer cut at --max-tokens {}]", a.max_tokens),
            Some(Finish::Cancelled) => eprintln!("[stopped]"),
            Some(Finish::ContextFull) => eprintln!("[answer cut: the context of {context} tokens is full]"),
            _ => {}
        }
        if a.engine.stats {
            eprintln!(
                "turn: {prompt_tokens} prompt tokens, {answered} answer tokens in {:.2} s; {} of {context} context tokens used",
                t0.elapsed().as_secs_f64(),
                session.tokens()
            );
        }
    }
    input.save()?;
    drop(out);
    a.engine.report(&engine, &session.stats, Some(&speculation))?;
    a.engine.finish(&session)?;
    Ok(ExitCode::SUCCESS)
}

/// Where the system turn ends in the first turn's tokens (0 without a system prompt): the state
/// a new chat with the same system prompt resumes.
fn system_boundary(format: &ChatFormat<'_>, o: &PromptOptions<'_>, system: Option<&str>, pending: &[u32]) -> usize {
    let Some(system) = system else { return 0 };
    let Ok(part) = format.prompt_with(&[Message::new(Role::System, system)], o) else { return 0 };
    part.iter().zip(pending).take_while(|(a, b)| a == b).count()
}

/// The first turn's start from the prompt cache: the longest kept state `pending` begins with is
/// restored into `session`, then the prompt is run up to the system turn's end and that state
/// kept. Gives where the rest of the prompt starts, and the kept logits when nothing is left.
fn first_turn_from_cache(
    engine: &k3_engine::Engine<'_>,
    cache: &mut PromptCache,
    session: &mut k3_engine::Session,
    pending: &[u32],
    boundary: usize,
    stats: bool,
) -> Result<(usize, Option<Vec<f32>>)> {
    let (restored_session, logits, restored) = crate::prompt_cache::start(Some(&mut *cache), engine, pending);
    *session = restored_session;
    if stats {
        eprintln!("{}", cache.describe(restored, pending.len()));
    }
    let mut from = restored.tokens;
    if boundary > from && boundary < pending.len() {
        for c in pending[from..boundary].chunks(engine.prefill_chunk().max(1)) {
            engine.forward_last(session, c)?;
        }
        cache.keep(engine, session, None);
        from = boundary;
    }
    Ok((from, logits))
}

/// Streams one answer: (tokens generated, why it ended).
fn answer(
    engine: &k3_engine::Engine<'_>,
    mut turn: Generator<'_, '_>,
    out: &mut impl Write,
) -> Result<(u64, Option<Finish>, SpecStats)> {
    while let Some(t) = turn.step(engine)? {
        write!(out, "{}", t.text)?;
        out.flush()?;
    }
    writeln!(out, "{}", turn.flush())?;
    Ok((turn.produced(), turn.finish(), turn.spec))
}
