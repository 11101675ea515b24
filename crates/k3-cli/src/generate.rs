//! `generate`: continue a prompt, streaming the new text. Stops at end of message, at
//! `--max-tokens`, when the context is full, or on Ctrl-C — and says which, on standard error;
//! statistics are written in every case. The work is `k3_generate::Generator`'s.

use k3_cli::progress::{Progress, Unit};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use k3_generate::{Finish, GenerateError, GenerateParams, Generator};
use k3_text::tokenizer::Tokenizer;

use crate::prompt::PromptArgs;
use crate::prompt_cache::PromptCacheArgs;
use crate::run::{EngineArgs, Needs, RUN_ACTIVATIONS, Turn, open_model};
use crate::sampling::SamplingArgs;
use crate::signals;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The model directory (default: the default model compiled into k3-cli).
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    prompt: PromptArgs,
    /// An image for a model that sees (K3; repeat for several): placed where the prompt spells
    /// `<|kimi_image_placeholder|>`, else before the prompt [default: none].
    #[arg(long = "image", value_name = "FILE")]
    images: Vec<PathBuf>,
    /// The most tokens to generate (at least 1).
    #[arg(short = 'n', long, default_value_t = 64, value_parser = crate::prompt::max_tokens)]
    max_tokens: u64,
    /// Stop before this text (repeat the flag for several); the text is not printed [default:
    /// none: the end of the message, --max-tokens or a full context stops].
    #[arg(long = "stop", value_name = "TEXT")]
    stop: Vec<String>,
    /// Go on past the end-of-message token, to exactly --max-tokens (for benchmarks).
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Write each generated token's log-probability, with the N most likely alternatives, into
    /// --stats-json's `logprobs` (the model's log-softmax, before any sampling setting; 0..=20)
    /// [default: off].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=20), requires = "stats_json")]
    logprobs: Option<u16>,
    /// Prompt tokens per forward call (prefill chunk) [default: the engine's choice: small for a
    /// model whose experts all fit in memory, up to 4096 for one whose experts stream from disk,
    /// so each chunk reads its experts once for many tokens; --verbose prints it]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: Option<u32>,
    #[command(flatten)]
    prompt_cache: PromptCacheArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// The default context: 4096 tokens, or room for the prompt and up to 4096 new tokens.
const DEFAULT_CONTEXT: u64 = 4096;

pub fn run(a: GenerateArgs) -> Result<ExitCode> {
    let path = crate::default_model::or_default(a.model.clone())?;
    let model = open_model(&path, &a.engine.knobs.shard_dirs)?;
    let tok = k3_generate::model_tokenizer(&model).transpose()?;
    let most = crate::prompt::RunContext::of(&model, a.engine.knobs.context);
    let prompt = a.prompt.ids(tok.as_ref(), &path, &most.text())?;
    let n = prompt.len() as u64;
    anyhow::ensure!(
        n < most.tokens,
        "the prompt is {n} tokens, which leaves no room in a context of {} tokens: {}",
        most.tokens,
        most.remedy
    );
    let needs = Needs {
        context: DEFAULT_CONTEXT.max(n.saturating_add(a.max_tokens.min(DEFAULT_CONTEXT))),
        fit: false,
        min_context: 0,
        chunk: a.chunk.map(|c| c as usize),
        reserved_bytes: 0,
        activations: RUN_ACTIVATIONS,
    };
    let engine = a.engine.load(&model, &path, needs)?;
    let sampler = a.sampling.config(&model, false, engine.vocab())?;
    a.sampling.say_seed(&sampler, a.engine.stats);
    let mut params = GenerateParams {
        max_tokens: a.max_tokens,
        sampler,
        stop_ids: if a.ignore_eos { Vec::new() } else { engine.config().eos.clone() },
        stop_strings: a.stop.clone(),
        chunk: Some(engine.prefill_chunk()),
        speculate: a.sampling.speculate as usize,
        logprobs: a.logprobs.map(usize::from),
        ..GenerateParams::default()
    };
    let (prompt, images) = with_images(&engine, tok.as_ref(), prompt, &a.images)?;
    anyhow::ensure!(
        images.is_empty() || a.prompt_cache.is_off(),
        "--prompt-cache keeps token states, which do not say which image a prompt held: give one or the other"
    );
    // Every input is read: from here a signal stops the run at the next token, which writes
    // what it has (before, it ends the process, as nothing would look at the flag).
    params.cancel = Some(signals::end_flag());
    let _armed = signals::arm();
    let mut cache = a.prompt_cache.open(&engine)?;
    let (mut session, kept_logits, restored) = crate::prompt_cache::start(cache.as_mut(), &engine, &prompt);
    let rest = &prompt[restored.tokens..];
    // A long prompt shows its progress; a chunk of a streaming model can take minutes, so the
    // elapsed time ticks between chunks.
    let pb = (rest.len() > 256 || rest.len() > 4 * engine.prefill_chunk())
        .then(|| Progress::new("prompt", rest.len() as u64, Unit::Items("tokens")));
    let started = match (rest.is_empty(), kept_logits) {
        // The whole prompt was kept, with its logits: sampling starts at once.
        (true, Some(logits)) => Generator::resume(&engine, &mut session, logits, tok.as_ref(), params),
        _ => {
            Generator::start_with_images(&engine, &mut session, rest, &images, tok.as_ref(), params, &mut |done, _| {
                if let Some(pb) = &pb {
                    pb.set_position(done as u64);
                }
            })
        }
    };
    if let Some(pb) = pb {
        pb.finish();
    }
    let mut g = started.map_err(no_room)?;
    if let Some(c) = cache.as_mut() {
        if !rest.is_empty() && g.session().tokens() == prompt.len() {
            c.keep(&engine, g.session(), Some(g.last_logits(&engine)));
        }
        if a.engine.stats {
            eprintln!("{}", c.describe(restored, prompt.len()));
        }
    }
    let t1 = std::time::Instant::now();
    let Streamed { per_token, logprobs, lost } = stream(&engine, &mut g, tok.is_some())?;
    say_stop(g.finish(), g.produced(), engine.plan().context, a.engine.stats.then_some(a.max_tokens));
    let (prefill, produced, spec) = (g.prefill, g.produced() as usize, g.spec);
    drop(g);
    let decode = (produced, t1.elapsed().as_secs_f64());
    let logprobs = a.logprobs.is_some().then_some(logprobs);
    a.engine.report_split(&engine, &session.stats, Turn { prefill, decode, per_token, logprobs }, Some(&spec))?;
    a.engine.finish(&session)?;
    match lost {
        Some(e) => Err(anyhow::Error::new(e).context("writing the generated text")),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The generator's context check, the one the prompt with its images gets: the text alone was
/// bounded before the engine was planned (a longer prompt is then only images' positions).
fn no_room(e: GenerateError) -> anyhow::Error {
    match e {
        GenerateError::NoRoom { tokens, context } => anyhow::anyhow!(
            "the prompt with its images is {tokens} tokens, which leaves no room in a context of {context}: raise --context"
        ),
        e => e.into(),
    }
}

/// Says on standard error why a run stopped before its end, when it did; with `--stats`
/// (`max_tokens` given), why it stopped whatever the reason.
fn say_stop(finish: Option<Finish>, produced: u64, context: u64, max_tokens: Option<u64>) {
    match finish {
        Some(Finish::Length) if let Some(n) = max_tokens => eprintln!("[stopped: --max-tokens {n} reached]"),
        Some(Finish::Stop) if max_tokens.is_some() => eprintln!("[stopped: the model ended its message]"),
        Some(Finish::ContextFull) => {
            eprintln!("[stopped: the context of {context} tokens is full; raise --context for longer generations]")
        }
        Some(Finish::Cancelled) if produced == 0 => eprintln!("[interrupted during the prompt]"),
        Some(Finish::Cancelled) => eprintln!("[interrupted]"),
        _ => {}
    }
}

/// The prompt with `--image` files framed in it, and where their rows go.
fn with_images(
    engine: &k3_engine::Engine<'_>,
    tok: Option<&Tokenizer>,
    prompt: Vec<u32>,
    paths: &[PathBuf],
) -> Result<(Vec<u32>, Vec<k3_engine::Inserted>)> {
    if paths.is_empty() {
        return Ok((prompt, Vec::new()));
    }
    let tok = tok.ok_or_else(|| anyhow::anyhow!("--image needs a model with a tokenizer"))?;
    engine.check_sees().context("--image")?;
    let placeholder = engine.image_placeholder().context("--image: the model has no image placeholder")?;
    let images: Vec<_> = crate::images::read_files(engine, tok, paths)?.into_iter().map(|i| i.prompt).collect();
    let ids = k3_generate::media::place_in_raw(&prompt, placeholder, images.len())?;
    Ok(k3_generate::media::expand(tok, placeholder, engine.hidden(), &ids, &images)?)
}

/// What streaming a turn's text gave: per-token statistics, logprobs, and the write error that
/// ended it early, if one did.
struct Streamed {
    per_token: Vec<serde_json::Value>,
    logprobs: Vec<serde_json::Value>,
    lost: Option<std::io::Error>,
}

/// Writes each token of the turn to standard output as it comes (its id without a tokenizer).
/// A terminal that went away (SIGHUP) fails writes: generation stops, but the statistics are
/// still written before the error is reported.
fn stream(engine: &k3_engine::Engine<'_>, g: &mut Generator<'_, '_>, text: bool) -> Result<Streamed> {
    let mut out = std::io::stdout().lock();
    let (mut per_token, mut logprobs, mut lost) = (Vec::new(), Vec::new(), None);
    while let Some(t) = g.step(engine)? {
        let wrote = if text { write!(out, "{}", t.text) } else { write!(out, "{} ", t.id) };
        if let Err(e) = wrote.and_then(|()| out.flush()) {
            lost = Some(e);
            break;
        }
        if let Some(l) = &t.logprob {
            let top: Vec<serde_json::Value> =
                l.top.iter().map(|&(id, lp)| serde_json::json!({"token": id, "logprob": lp})).collect();
            logprobs
                .push(serde_json::json!({"token": l.id, "text": t.text, "logprob": l.logprob, "top_logprobs": top}));
        }
        if t.fed && !t.drafted {
            per_token.push(serde_json::json!({
                "token": t.id, "seconds": t.stats.seconds, "bytes_read": t.stats.bytes_read,
                "hits": t.stats.hits, "misses": t.stats.misses, "io_wait_seconds": t.stats.io_wait_seconds,
            }));
        }
    }
    if lost.is_none() {
        lost = writeln!(out, "{}", g.flush()).err();
    }
    Ok(Streamed { per_token, logprobs, lost })
}
