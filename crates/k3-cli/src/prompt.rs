//! Where a prompt comes from: text on the command line, `-` for standard input, a file, or token
//! ids; and turning it into ids with the model's tokenizer.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_engine::tokenizer::Tokenizer;

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

impl PromptArgs {
    /// The prompt's token ids; `model` names the model in errors.
    pub fn ids(&self, tok: Option<&Tokenizer>, model: &Path) -> Result<Vec<u32>> {
        let text = match (&self.ids, self.prompt.as_ref().or(self.prompt_text.as_ref()), &self.prompt_file) {
            (Some(ids), _, _) => return parse_ids(ids),
            (_, Some(p), _) if p == "-" => read_stdin()?,
            (_, Some(p), _) => p.clone(),
            (_, _, Some(f)) => std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
            _ => anyhow::bail!("give a prompt: text, `-` for standard input, --prompt-file or --ids"),
        };
        let tok = tok.with_context(|| format!("{} embeds no tokenizer: give the prompt as --ids", model.display()))?;
        let ids = tok.encode_with_specials(&text);
        anyhow::ensure!(!ids.is_empty(), "the prompt is empty");
        Ok(ids)
    }
}

pub fn read_stdin() -> Result<String> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).context("reading standard input")?;
    Ok(s)
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
