//! `k3-cli`: the user's entry point. Thin: argument parsing and presentation; the work is done by
//! the library crates.

mod arrays;
mod chat;
mod default_model;
mod generate;
mod images;
mod inspect;
mod llama_switches;
mod lookahead;
mod models;
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
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "k3-cli",
    version,
    about = "k3: run Kimi models by streaming their experts from disk",
    after_help = "Without --model, every command runs the default model compiled \
                  into this binary (written once to $K3_DATA_DIR, else $XDG_DATA_HOME/k3, else ~/.local/share/k3)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// No progress on standard error (bars on a terminal, lines every few seconds elsewhere).
    #[arg(short, long, global = true)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a WASTE model: architecture, experts, encodings, sizes, shard layout (`show
    /// NAME` for a stored model, as Ollama's users type it).
    #[command(visible_alias = "show")]
    Inspect {
        #[command(flatten)]
        model: ModelPath,
        /// Other directories holding expert shards (one per drive); repeat the flag [default: none:
        /// shards are looked for beside the model's header].
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
        #[command(flatten)]
        model: ModelPath,
        /// Other directories holding expert shards (one per drive); repeat the flag [default: none:
        /// shards are looked for beside the model's header].
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
    /// terminal; Ctrl-C stops an answer; Ctrl-D ends). `run NAME [MESSAGE]` as in Ollama: a
    /// stored model by name, and one message answered without a conversation.
    #[command(visible_alias = "run")]
    Chat(chat::ChatArgs),
    /// The models in k3's store (`convert --name NAME` keeps one there), and the built-in one.
    #[command(visible_alias = "ls")]
    List {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove stored models by name (their directories in the store only: a checkpoint whose
    /// experts they read in place is left as it is).
    Rm {
        /// The stored models to remove.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
    /// The model a running `k3-cli serve` has loaded (its `/api/ps`).
    Ps {
        #[command(flatten)]
        server: models::Server,
        /// Print the server's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Have a running `k3-cli serve` (serving the store) let a model go from memory, once its
    /// answers under way finish (`ollama stop`).
    Stop {
        /// The model to unload.
        #[arg(value_name = "NAME")]
        name: String,
        #[command(flatten)]
        server: models::Server,
    },
    /// Text on standard input to token ids, printed as a JSON array (of `{"id", "piece"}`
    /// objects with --pieces).
    Tokenize {
        #[command(flatten)]
        source: TokenizerSource,
        /// Turn special-token strings such as `<|open|>` into their ids.
        #[arg(long)]
        specials: bool,
        /// Print each token's text beside its id.
        #[arg(long)]
        pieces: bool,
    },
    /// Token ids on standard input (a JSON array, or numbers separated by spaces) to text.
    Detokenize {
        #[command(flatten)]
        source: TokenizerSource,
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
    /// A request's sampling fields default to the model's generation_config.json (see
    /// `k3-cli inspect`), else temperature 0.6 and top-p 0.95.
    Serve(serve::ServeArgs),
    /// Print a shell completion script, e.g. `k3-cli completions bash > ~/.local/share/bash-completion/completions/k3-cli`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

/// A model directory, as the argument or as `--model` like every other command (the default
/// model when neither is given).
#[derive(clap::Args, Clone)]
pub(crate) struct ModelPath {
    /// The model directory or a stored model's name (default: the default model compiled into k3-cli).
    #[arg(value_name = "MODEL")]
    path: Option<PathBuf>,
    /// The model directory or stored name, as a switch (the same as the argument) [default: the default model].
    #[arg(short = 'm', long = "model", value_name = "MODEL", conflicts_with = "path")]
    model: Option<PathBuf>,
}

impl ModelPath {
    pub(crate) fn resolve(self) -> Result<PathBuf> {
        default_model::or_default(self.model.or(self.path))
    }
}

/// Where a tokenizer comes from: a file, a model, or the default model.
#[derive(clap::Args)]
struct TokenizerSource {
    /// A `tiktoken.model` file (its `tokenizer_config.json` alongside, if any), a Hugging Face
    /// `tokenizer.json`, or a WASTE model directory (the tokenizer it embeds) [default: --model's].
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// The model whose tokenizer to use (default: the default model compiled into k3-cli).
    #[arg(short = 'm', long, value_name = "MODEL", conflicts_with = "tokenizer")]
    model: Option<PathBuf>,
}

impl TokenizerSource {
    fn resolve(self) -> Result<PathBuf> {
        default_model::or_default(self.tokenizer.or(self.model))
    }
}

/// Errors are printed as one tidy chain of causes (no backtrace), then exit status 1.
fn main() -> ExitCode {
    signals::quiet_broken_pipe();
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    if let Some(why) = llama_switches::refusal(&args) {
        eprintln!("error: {why}");
        return ExitCode::from(2);
    }
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
    let cli = Cli::parse();
    k3_cli::progress::set_quiet(cli.quiet);
    match cli.command {
        Command::Inspect { model, shard_dirs, json, tensors } => {
            inspect::run(&model.resolve()?, &shard_dirs, json, tensors)
        }
        Command::Verify { model, shard_dirs } => inspect::verify(&run::open_model(&model.resolve()?, &shard_dirs)?),
        Command::Tokenize { source, specials, pieces } => text::tokenize(&source.resolve()?, specials, pieces),
        Command::Detokenize { source } => text::detokenize(&source.resolve()?),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "k3-cli", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Logits(a) => arrays::run(a, false),
        Command::Trace(a) => arrays::run(a, true),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Lookahead(a) => lookahead::run(a),
        Command::Serve(a) => serve::run(a),
        Command::List { json } => models::list(json),
        Command::Rm { names } => models::rm(&names),
        Command::Ps { server, json } => models::ps(&server, json),
        Command::Stop { name, server } => models::stop(&name, &server),
        Command::Convert(a) => k3_cli::convert::run(a).map(|()| ExitCode::SUCCESS),
    }
}

#[cfg(test)]
#[path = "../tests/common/help.rs"]
mod help_check;

#[cfg(test)]
#[path = "../tests/common/docs.rs"]
mod docs_check;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The user documents against the parsers: every `k3-cli` command line shown parses, every
    /// `--switch` named is one of k3-cli's (or one of llama.cpp's it refuses, or another
    /// program's shown beside it), and every default stated is the parser's.
    #[test]
    fn the_documents_agree_with_the_parsers() {
        use crate::docs_check::{Doc, normal, stated_defaults, switches, words};
        use clap::Parser;
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        let mut known = std::collections::BTreeMap::new();
        switches(&super::Cli::command(), "k3-cli", &mut known);
        // Other programs' switches the documents show (curl, cargo, hf, pip, claude, npm, python).
        let others = [
            "--fail-with-body",
            "--retry",
            "--retry-connrefused",
            "--retry-delay",
            "--locked",
            "--path",
            "--local-dir",
            "--bare",
            "--workspace",
            "--release",
            "--no-deps",
            "--check",
            "--lib",
            "--test",
            "--help",
            "--version",
        ];
        let mut wrong = Vec::new();
        for name in ["README.md", "docs/SERVING.md"] {
            let doc = Doc::read(&std::fs::read_to_string(format!("{root}{name}")).unwrap());
            // The documents were read: their fences close, and they show commands and switches.
            assert!(!doc.open_fence, "{name} ends inside a code block");
            let (commands, spans) = (doc.commands(), doc.spans());
            assert!(
                commands.len() >= 8 && spans.len() >= 100,
                "{name}: {} commands, {} spans",
                commands.len(),
                spans.len()
            );
            for line in commands {
                let Err(e) = super::Cli::try_parse_from(words(&line)) else { continue };
                // A command named in passing (its required arguments left out), or a placeholder
                // such as N or DIR where a value goes, is not a wrong line.
                let first = e.to_string().lines().next().unwrap_or("").to_string();
                let placeholder = e.kind() == clap::error::ErrorKind::ValueValidation
                    && first.split('\'').nth(1).is_some_and(|v| v.chars().all(|c| c.is_ascii_uppercase()));
                if e.kind() != clap::error::ErrorKind::MissingRequiredArgument && !placeholder {
                    wrong.push(format!("{name}: `{line}` does not parse: {first}"));
                }
            }
            for span in spans {
                let first = span.split_whitespace().next().unwrap_or_default();
                let Some(flag) = first.split('=').next().filter(|f| f.starts_with("--") && f.len() > 2) else {
                    continue;
                };
                let refused = crate::llama_switches::refusal(&["k3-cli".into(), flag.into()]).is_some();
                if !known.contains_key(flag) && !refused && !others.contains(&flag) {
                    wrong.push(format!("{name}: `{flag}` is no switch of k3-cli"));
                }
            }
            for (flag, value) in stated_defaults(&doc.prose) {
                let Some(args) = known.get(&flag) else { continue };
                // A default in the help's words ends there: `1` is not `10`.
                let in_help = |help: &str, v: &str| {
                    help.match_indices(&format!("[default: {v}"))
                        .any(|(at, m)| help[at + m.len()..].starts_with([']', ',', ' ', ';', ')', ':']))
                };
                let ok = args.iter().any(|(_, defaults, help)| {
                    defaults.iter().any(|d| normal(d) == normal(&value))
                        || in_help(help, &value)
                        || in_help(help, &normal(&value))
                });
                if !ok {
                    let said: Vec<String> = args.iter().map(|(p, d, _)| format!("{p}: {d:?}")).collect();
                    wrong.push(format!("{name}: says `{flag}` defaults to {value}; the parser's: {}", said.join("; ")));
                }
            }
        }
        assert!(wrong.is_empty(), "the documents disagree with the binary:\n{}", wrong.join("\n"));
    }

    /// Every option and argument of every subcommand says what it is for.
    #[test]
    fn every_option_has_help() {
        let missing = crate::help_check::gaps(&super::Cli::command(), "k3-cli");
        assert!(missing.is_empty(), "no help text: {missing:?}");
        super::Cli::command().debug_assert();
    }

    /// The prompt cache's flags as they were spelled before issue #55 still parse, to the same
    /// fields as today's.
    #[test]
    fn the_prefix_cache_spellings_still_parse() {
        use clap::Parser;
        let spellings =
            [["--prefix-cache", "2G", "--prefix-cache-shared"], ["--prompt-cache-ram", "2G", "--prompt-cache-shared"]];
        for flags in spellings {
            let cli = super::Cli::try_parse_from(["k3-cli", "serve"].into_iter().chain(flags)).unwrap();
            let super::Command::Serve(a) = cli.command else { panic!("not serve") };
            assert_eq!((a.prompt_cache_ram.as_str(), a.prompt_cache_shared), ("2G", true), "{flags:?}");
        }
    }
}
