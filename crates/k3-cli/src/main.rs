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
mod prompt_cache;
mod run;
mod sampling;
mod serve;
mod signals;
mod text;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

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
    /// Convert a Hugging Face checkpoint (or re-encode a WASTE model) to a WASTE model directory:
    /// everything checked first, resumable after an interruption, verified at the end.
    Convert(k3_cli::convert::ConvertArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, streaming, concurrent
    /// requests decoded together); point the `openai` client or Open WebUI at http://HOST:PORT/v1.
    Serve(serve::ServeArgs),
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
        Command::Convert(a) => k3_cli::convert::run(a).map(|()| ExitCode::SUCCESS),
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
