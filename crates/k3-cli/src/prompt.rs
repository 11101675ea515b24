//! Where a prompt comes from: text on the command line, `-` for standard input, a file, or token
//! ids; and turning it into ids with the model's tokenizer. Text read from a file or standard
//! input is bounded by what the context can hold, so a huge input is refused before any work.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_cli::text_file::TEXT_LIMIT;
use k3_text::tokenizer::Tokenizer;

#[derive(clap::Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct PromptArgs {
    /// The prompt text (`-` reads it from standard input); needs a model with a tokenizer.
    pub prompt: Option<String>,
    /// The prompt text, as a switch (llama.cpp's `-p`): the same as giving it as the argument.
    #[arg(short = 'p', long = "prompt", value_name = "TEXT")]
    pub prompt_text: Option<String>,
    /// Read the prompt text from this file (for prompts longer than a command line takes).
    #[arg(short = 'f', long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// The prompt as token ids, separated by spaces or commas.
    #[arg(long)]
    pub ids: Option<String>,
}

/// The most prompt text a context holds: `context` tokens of at most the tokenizer's longest
/// piece each; `what` says so in a refusal.
#[derive(Debug, Clone)]
pub struct TextBound {
    pub bytes: u64,
    pub what: String,
}

/// The context a prompt may fill when `--context` does not say: K3's trained context, the
/// longest of the models k3 runs, for a model whose config names none.
pub(crate) const LONGEST_CONTEXT: u64 = 1 << 20;

/// The most tokens a run's prompt may take, and what set it (said in a refusal).
#[derive(Debug, Clone, Copy)]
pub struct RunContext {
    pub tokens: u64,
    pub remedy: &'static str,
}

impl RunContext {
    /// `--context`, else the model's own longest context (`max_position_embeddings`), else
    /// [`LONGEST_CONTEXT`]: a prompt sizes the context it is planned with, so without a bound a
    /// huge one plans (and allocates) a context no memory holds.
    pub fn of(model: &k3_engine::Model, flag: Option<u64>) -> RunContext {
        if let Some(tokens) = flag {
            return RunContext { tokens, remedy: "raise --context" };
        }
        let config = model
            .blob("config.json")
            .and_then(|raw| k3_engine::config::ModelConfig::parse(Path::new("config.json"), raw).ok());
        match config.and_then(|c| c.max_positions) {
            Some(tokens) => RunContext { tokens, remedy: "the model's max_position_embeddings: give a shorter prompt" },
            None => {
                RunContext { tokens: LONGEST_CONTEXT, remedy: "give a shorter prompt, or --context to plan for more" }
            }
        }
    }

    /// The text bound for a tokenizer, as [`PromptArgs::ids`] takes it.
    pub fn text(self) -> impl Fn(&Tokenizer) -> TextBound {
        move |tok: &Tokenizer| TextBound::of(tok, self.tokens)
    }
}

impl TextBound {
    pub fn of(tok: &Tokenizer, context: u64) -> TextBound {
        let longest = tok.token_texts().iter().flatten().map(String::len).max().unwrap_or(1).max(1) as u64;
        TextBound {
            bytes: context.saturating_mul(longest),
            what: format!("a prompt for a context of {context} tokens (of at most {longest} bytes each) holds"),
        }
    }
}

impl PromptArgs {
    /// The prompt's token ids; `model` names the model in errors, `bound` limits text read from a
    /// file or standard input.
    pub fn ids(
        &self,
        tok: Option<&Tokenizer>,
        model: &Path,
        bound: &dyn Fn(&Tokenizer) -> TextBound,
    ) -> Result<Vec<u32>> {
        if let Some(ids) = &self.ids {
            return parse_ids(ids);
        }
        let tok = tok.with_context(|| format!("{} embeds no tokenizer: give the prompt as --ids", model.display()))?;
        let text = match (self.prompt.as_ref().or(self.prompt_text.as_ref()), &self.prompt_file) {
            (Some(p), _) if p == "-" => read_stdin_bounded(&bound(tok))?,
            (Some(p), _) => p.clone(),
            (_, Some(f)) => {
                let b = bound(tok);
                let bytes = k3_format::read_input(f, &b.what, b.bytes)?;
                String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", f.display()))?
            }
            _ => anyhow::bail!("give a prompt: text, `-` for standard input, --prompt-file or --ids"),
        };
        let ids = tok.encode_with_specials(&text);
        anyhow::ensure!(!ids.is_empty(), "the prompt is empty");
        Ok(ids)
    }
}

/// Standard input as the prompt, refused past `bound` (read to the bound plus one byte, never
/// more).
fn read_stdin_bounded(bound: &TextBound) -> Result<String> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(bound.bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .context("reading standard input")?;
    anyhow::ensure!(
        bytes.len() as u64 <= bound.bytes,
        "standard input holds more than {} bytes; {} at most that",
        bound.bytes,
        bound.what
    );
    String::from_utf8(bytes).context("standard input is not UTF-8 text")
}

/// Standard input as text, within [`TEXT_LIMIT`]; `what` reads "tokenize reads".
pub fn read_stdin(what: &str) -> Result<String> {
    read_stdin_bounded(&TextBound { bytes: TEXT_LIMIT, what: what.into() })
}

/// Token ids separated by whitespace or commas.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    let ids: Vec<u32> = s
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("`{t}` is not a token id")))
        .collect::<Result<_>>()?;
    anyhow::ensure!(!ids.is_empty(), "no token ids given");
    Ok(ids)
}

/// `--max-tokens` / `-n`: a count of at least 1 (llama.cpp's `-n 0` generates nothing, which no
/// one asks for on purpose: refused rather than a run that exits saying nothing).
pub fn max_tokens(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("0 generates nothing: give at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{s}` is not a count of tokens: {e}")),
    }
}
