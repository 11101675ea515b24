//! `generate`: continue a prompt, streaming the new text. Stops at end of message, at
//! `--max-tokens`, when the context is full, or on Ctrl-C — and says which, on standard error;
//! statistics are written in every case.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use k3_engine::sample::{Sampler, SamplerConfig};
use k3_engine::tokenizer::{StreamDecoder, Tokenizer};
use k3_engine::{Engine, Session};

use crate::prompt::PromptArgs;
use crate::run::{EngineArgs, Needs, open_model};
use crate::{SamplingArgs, signals};

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The model directory (default: the default model compiled into k3-cli).
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    prompt: PromptArgs,
    /// The most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: u64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Prompt tokens per forward call (prefill chunk).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
    #[command(flatten)]
    engine: EngineArgs,
}

/// The default context: 4096 tokens, or room for the prompt and up to 4096 new tokens.
const DEFAULT_CONTEXT: u64 = 4096;

pub fn run(a: GenerateArgs) -> Result<ExitCode> {
    let path = crate::default_model::or_default(a.model.clone())?;
    let sampler = Sampler::new(a.sampling.config(SamplerConfig::default()))?;
    let model = open_model(&path, &a.engine.shard_dirs)?;
    let tok = Tokenizer::from_model(&model).transpose()?;
    let prompt = a.prompt.ids(tok.as_ref(), &path)?;
    let n = prompt.len() as u64;
    if let Some(c) = a.engine.context.filter(|&c| n >= c) {
        anyhow::bail!("the prompt is {n} tokens, which leaves no room in a context of {c} tokens: raise --context");
    }
    let needs = Needs {
        context: DEFAULT_CONTEXT.max(n.saturating_add(a.max_tokens.min(DEFAULT_CONTEXT))),
        min_context: 0,
        chunk: a.chunk as usize,
        reserved_bytes: 0,
    };
    let engine = a.engine.load(&model, &path, needs)?;
    signals::catch_ctrl_c();
    let mut g = Generation { engine: &engine, session: engine.session(), args: &a, per_token: Vec::new() };
    let Some((mut logits, prefill)) = g.prefill(&prompt)? else {
        eprintln!("[interrupted during the prompt]");
        return g.report((n as usize, 0.0), (0, 0.0));
    };
    let t1 = std::time::Instant::now();
    let (produced, end) = g.decode(&mut logits, sampler, tok.as_ref(), engine.config().eos.clone())?;
    match end {
        End::Message | End::MaxTokens => {}
        End::ContextFull => eprintln!(
            "[stopped: the context of {} tokens is full; raise --context for longer generations]",
            engine.plan().context
        ),
        End::Interrupted => eprintln!("[interrupted]"),
    }
    g.report(prefill, (produced, t1.elapsed().as_secs_f64()))
}

/// Tokens and seconds of a phase.
type Timed = (usize, f64);

/// Why generation ended.
enum End {
    Message,
    MaxTokens,
    ContextFull,
    Interrupted,
}

struct Generation<'a, 'm> {
    engine: &'a Engine<'m>,
    session: Session,
    args: &'a GenerateArgs,
    per_token: Vec<serde_json::Value>,
}

impl Generation<'_, '_> {
    /// Runs the prompt, with a progress bar when it takes several chunks. Returns the last logits
    /// and (tokens, seconds), or `None` when interrupted.
    fn prefill(&mut self, prompt: &[u32]) -> Result<Option<(Vec<f32>, Timed)>> {
        let t0 = std::time::Instant::now();
        let chunk = self.args.chunk as usize;
        let pb = (prompt.len() > 4 * chunk)
            .then(|| crate::progress_bar(prompt.len() as u64, "prompt [{bar:40}] {pos}/{len} tokens ETA {eta}"));
        let mut logits = Vec::new();
        for (i, c) in prompt.chunks(chunk).enumerate() {
            if signals::interrupted() {
                return Ok(None);
            }
            logits = self.engine.forward(&mut self.session, c, None)?;
            if let Some(pb) = &pb {
                pb.set_position(((i + 1) * chunk).min(prompt.len()) as u64);
            }
        }
        if let Some(pb) = pb {
            pb.finish_and_clear();
        }
        Ok(Some((logits, (prompt.len(), t0.elapsed().as_secs_f64()))))
    }

    /// Samples, prints and feeds back tokens until one of the stops. Returns how many were made.
    fn decode(
        &mut self,
        logits: &mut Vec<f32>,
        mut sampler: Sampler,
        tok: Option<&Tokenizer>,
        eos: Vec<u32>,
    ) -> Result<(usize, End)> {
        let mut stream = StreamDecoder::default();
        let mut out = std::io::stdout().lock();
        let (v, context) = (self.engine.vocab(), self.engine.plan().context);
        let mut produced = 0usize;
        let end = loop {
            if produced as u64 >= self.args.max_tokens {
                break End::MaxTokens;
            }
            if signals::interrupted() {
                break End::Interrupted;
            }
            let next = sampler.sample(&logits[logits.len() - v..]);
            produced += 1;
            match tok {
                Some(t) => write!(out, "{}", stream.push(t, next)?)?,
                None => write!(out, "{next} ")?,
            }
            out.flush()?;
            if eos.contains(&next) {
                break End::Message;
            }
            if self.session.tokens as u64 >= context {
                break End::ContextFull;
            }
            let (t_step, before) = (std::time::Instant::now(), self.session.stats);
            *logits = self.engine.forward(&mut self.session, &[next], None)?;
            self.per_token.push(step_stats(next, t_step, &before, &self.session.stats));
        };
        if tok.is_some() {
            write!(out, "{}", stream.finish())?;
        }
        writeln!(out)?;
        Ok((produced, end))
    }

    fn report(self, prefill: Timed, decode: Timed) -> Result<ExitCode> {
        let ea = &self.args.engine;
        ea.report_split(self.engine, &self.session.stats, prefill, decode, self.per_token)?;
        ea.finish(&self.session)?;
        Ok(ExitCode::SUCCESS)
    }
}

/// One decode step's numbers for `--stats-json`.
fn step_stats(
    token: u32,
    started: std::time::Instant,
    before: &k3_engine::RunStats,
    after: &k3_engine::RunStats,
) -> serde_json::Value {
    serde_json::json!({
        "token": token,
        "seconds": started.elapsed().as_secs_f64(),
        "bytes_read": after.cache.bytes_read - before.cache.bytes_read,
        "hits": after.cache.hits - before.cache.hits,
        "misses": after.cache.misses - before.cache.misses,
        "io_wait_seconds": after.io_wait_seconds - before.io_wait_seconds,
    })
}
