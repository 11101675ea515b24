//! `k3-cli`: the user's entry point. Thin: argument parsing and presentation; the work is done by
//! the library crates.

mod arrays;
mod chat;
mod default_model;
mod generate;
mod inspect;
mod lookahead;
mod perplexity;
mod prompt;
mod run;
mod serve;
mod signals;
mod text;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use k3_engine::sample::SamplerConfig;

#[derive(Parser)]
#[command(
    name = "k3-cli",
    version,
    about = "k3: run Kimi models by streaming their experts from disk",
    after_help = "Without --model, generate, chat, perplexity and lookahead run the default model compiled \
                  into this binary (written once to $K3_DATA_DIR, else $XDG_DATA_HOME/k3, else ~/.local/share/k3)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a WASTE model: architecture, experts, encodings, sizes, shard layout.
    Inspect {
        /// The model directory.
        model: PathBuf,
        /// Other directories holding expert shards (one per drive); repeat the flag.
        #[arg(long = "shard-dir", value_name = "DIR")]
        shard_dirs: Vec<PathBuf>,
        /// Print one JSON object instead of a table (it lists every trunk tensor too).
        #[arg(long)]
        json: bool,
        /// List every trunk tensor with its stored encoding, shape and size.
        #[arg(long)]
        tensors: bool,
    },
    /// Check every checksum of a WASTE model; exits 1 naming each bad record or tensor.
    Verify {
        /// The model directory.
        model: PathBuf,
        /// Other directories holding expert shards (one per drive); repeat the flag.
        #[arg(long = "shard-dir", value_name = "DIR")]
        shard_dirs: Vec<PathBuf>,
    },
    /// Logits at every position of a prompt: writes f32 [tokens, vocab], row-major, little-endian.
    Logits(arrays::ArrayArgs),
    /// The hidden state after every layer: writes f32 [tokens, layers, hidden], token-major.
    Trace(arrays::ArrayArgs),
    /// Continue a prompt, streaming the new text (or ids, for a model without a tokenizer).
    Generate(generate::GenerateArgs),
    /// An interactive conversation in the model's chat format (line editing and history on a
    /// terminal; Ctrl-C stops an answer; Ctrl-D ends).
    Chat(chat::ChatArgs),
    /// Text on standard input to token ids, printed as a JSON array.
    Tokenize {
        /// A `tiktoken.model` file (its `tokenizer_config.json` alongside, if any), a Hugging Face
        /// `tokenizer.json`, or a WASTE model directory (the tokenizer it embeds).
        #[arg(long, value_name = "PATH")]
        tokenizer: PathBuf,
        /// Turn special-token strings such as `<|open|>` into their ids.
        #[arg(long)]
        specials: bool,
    },
    /// Token ids on standard input (a JSON array, or numbers separated by spaces) to text.
    Detokenize {
        /// A `tiktoken.model` file, a `tokenizer.json`, or a WASTE model directory.
        #[arg(long, value_name = "PATH")]
        tokenizer: PathBuf,
    },
    /// Held-out perplexity of a text: non-overlapping windows, each from an empty state.
    Perplexity(perplexity::PerplexityArgs),
    /// How well the router lookahead would predict each MoE layer's experts on a prompt.
    Lookahead(lookahead::LookaheadArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, streaming, concurrent
    /// requests decoded together); point the `openai` client or Open WebUI at http://HOST:PORT/v1.
    Serve(serve::ServeArgs),
}

/// The sampling switches of `generate` and `chat` (llama.cpp's names and meanings).
#[derive(clap::Args, Debug, Clone)]
struct SamplingArgs {
    /// Softmax temperature: 0 = greedy (reproducible), higher = more varied.
    #[arg(long, value_parser = parse_temperature)]
    temperature: Option<f32>,
    /// Sample only from the most likely tokens whose probabilities sum to this (1 = off).
    #[arg(long, value_parser = parse_top_p)]
    top_p: Option<f32>,
    /// Sample only from this many most likely tokens (0 = off).
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample only from tokens at least this fraction as likely as the most likely one (0 = off).
    #[arg(long, value_parser = parse_min_p)]
    min_p: Option<f32>,
    /// Penalize tokens among the last --repeat-last-n: a positive logit divided by this, a
    /// negative one multiplied (1 = off).
    #[arg(long, value_parser = parse_repeat_penalty)]
    repeat_penalty: Option<f32>,
    /// Subtract this times a token's count among the last --repeat-last-n (0 = off; -2..2).
    #[arg(long, allow_negative_numbers = true, value_parser = |s: &str| parse_penalty("frequency_penalty", s))]
    frequency_penalty: Option<f32>,
    /// Subtract this from every token among the last --repeat-last-n (0 = off; -2..2).
    #[arg(long, allow_negative_numbers = true, value_parser = |s: &str| parse_penalty("presence_penalty", s))]
    presence_penalty: Option<f32>,
    /// How many of the latest tokens (prompt included) the penalties look at (-1 = all).
    #[arg(long, value_name = "N", default_value_t = 64, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    repeat_last_n: i64,
    /// Add BIAS to token ID's logit before sampling, e.g. 13=-inf bans token 13; repeat the flag.
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampler: the same seed and settings give the same text [default: a fresh
    /// one each run, printed with --stats].
    #[arg(long)]
    seed: Option<u64>,
    /// Draft up to N tokens from the context (prompt lookup) and verify them with each token in
    /// one step (0 = off). The text is the same either way; speculation turns itself off while
    /// its drafts are not accepted often enough to pay.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=64))]
    speculate: u16,
}

impl SamplingArgs {
    /// The settings, with a command's own defaults for what was not given; checks that every
    /// biased token is in the vocabulary of `vocab`.
    fn config(&self, default: SamplerConfig, vocab: usize) -> Result<SamplerConfig> {
        if let Some(&(id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            anyhow::bail!("--logit-bias: token {id} is outside the vocabulary of {vocab}");
        }
        Ok(SamplerConfig {
            temperature: self.temperature.unwrap_or(default.temperature),
            top_k: self.top_k.unwrap_or(default.top_k),
            top_p: self.top_p.unwrap_or(default.top_p),
            seed: self.seed.unwrap_or_else(k3_engine::sample::fresh_seed),
            min_p: self.min_p.unwrap_or(default.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(default.repeat_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(default.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(default.presence_penalty),
            penalty_last_n: usize::try_from(self.repeat_last_n).unwrap_or(usize::MAX),
            logit_bias: self.logit_bias.clone(),
        })
    }
}

impl SamplingArgs {
    /// With --stats, the seed a sampled run drew (so it can be repeated).
    fn say_seed(&self, cfg: &SamplerConfig, stats: bool) {
        if stats && cfg.temperature > 0.0 && self.seed.is_none() {
            eprintln!("sampling with seed {} (--seed {} repeats this run)", cfg.seed, cfg.seed);
        }
    }
}

fn parse_min_p(s: &str) -> Result<f32, String> {
    k3_engine::sample::check_min_p(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn parse_repeat_penalty(s: &str) -> Result<f32, String> {
    k3_engine::sample::check_repeat_penalty(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn parse_penalty(name: &str, s: &str) -> Result<f32, String> {
    k3_engine::sample::check_penalty(name, s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

/// `ID=BIAS`, BIAS a number or `-inf`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s.split_once('=').ok_or_else(|| format!("`{s}`: give ID=BIAS, e.g. 13=-inf"))?;
    let id = id.trim().parse().map_err(|_| format!("`{id}` is not a token id"))?;
    let bias: f32 = bias.trim().parse().map_err(|_| format!("`{bias}` is not a number (or -inf)"))?;
    if bias.is_nan() || bias == f32::INFINITY {
        return Err(format!("the bias {bias} is not usable: give a number, or -inf to ban the token"));
    }
    Ok((id, bias))
}

fn parse_temperature(s: &str) -> Result<f32, String> {
    k3_engine::sample::check_temperature(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

fn parse_top_p(s: &str) -> Result<f32, String> {
    k3_engine::sample::check_top_p(s.parse().map_err(|_| format!("`{s}` is not a number"))?)
}

/// A progress bar on standard error in the CLI's one style (`template` is a constant, so it
/// parses); hidden when standard error is not a terminal.
fn progress_bar(len: u64, template: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    pb
}

/// Errors are printed as one tidy chain of causes (no backtrace), then exit status 1.
fn main() -> ExitCode {
    signals::quiet_broken_pipe();
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", tidy(&e));
            ExitCode::FAILURE
        }
    }
}

/// The chain of causes on one line, each said once: library errors often repeat their cause in
/// their own message (`path: No such file (os error 2)`), which the chain would print again.
fn tidy(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain().map(ToString::to_string) {
        if out.contains(&cause) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&cause);
    }
    out
}

fn real_main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Inspect { model, shard_dirs, json, tensors } => inspect::run(&model, &shard_dirs, json, tensors),
        Command::Verify { model, shard_dirs } => inspect::verify(&run::open_model(&model, &shard_dirs)?),
        Command::Tokenize { tokenizer, specials } => text::tokenize(&tokenizer, specials),
        Command::Detokenize { tokenizer } => text::detokenize(&tokenizer),
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Logits(a) => arrays::run(a, false),
        Command::Trace(a) => arrays::run(a, true),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Lookahead(a) => lookahead::run(a),
        Command::Serve(a) => serve::run(a),
    }
}

#[cfg(test)]
#[path = "../tests/common/help.rs"]
mod help_check;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every option and argument of every subcommand says what it is for.
    #[test]
    fn every_option_has_help() {
        let missing = crate::help_check::gaps(&super::Cli::command(), "k3-cli");
        assert!(missing.is_empty(), "no help text: {missing:?}");
        super::Cli::command().debug_assert();
    }
}
