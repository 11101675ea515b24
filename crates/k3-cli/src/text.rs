//! `tokenize` and `detokenize`: a tokenizer from a file or a model, text to ids and back.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use k3_text::tokenizer::{KIMI_PATTERN, Tokenizer};

use crate::prompt::{parse_ids, read_stdin};

/// The most bytes of a tokenizer file: o200k's ranks are 3.6 MB, the largest `tokenizer.json`
/// files a few tens of MB.
const TOKENIZER_LIMIT: u64 = 256 << 20;

fn read_tokenizer_file(path: &Path) -> Result<Vec<u8>> {
    Ok(k3_format::read_input(path, "a tokenizer file is", TOKENIZER_LIMIT)?)
}

pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    if path.is_dir() {
        let m = crate::run::open_model(path, &[])?;
        return Ok(k3_generate::model_tokenizer(&m)
            .with_context(|| format!("{} embeds no tiktoken.model or tokenizer.json", path.display()))??);
    }
    if path.extension().is_some_and(|e| e == "json") {
        let json = read_tokenizer_file(path)?;
        return Tokenizer::from_hf_json(&json).with_context(|| format!("loading {}", path.display()));
    }
    let ranks = read_tokenizer_file(path)?;
    let cfg_path = path.with_file_name("tokenizer_config.json");
    let cfg = if cfg_path.exists() { Some(read_tokenizer_file(&cfg_path)?) } else { None };
    Tokenizer::from_tiktoken(&ranks, cfg.as_deref(), KIMI_PATTERN)
        .with_context(|| format!("loading {}", path.display()))
}

pub fn tokenize(tokenizer: &Path, specials: bool, pieces: bool) -> Result<ExitCode> {
    let tok = load_tokenizer(tokenizer)?;
    let text = read_stdin("tokenize reads")?;
    let ids = if specials { tok.encode_with_specials(&text) } else { tok.encode(&text) };
    if !pieces {
        println!("{}", serde_json::to_string(&ids)?);
        return Ok(ExitCode::SUCCESS);
    }
    // A piece that is not whole UTF-8 (part of a character split over tokens) shows its bytes
    // replaced, as llama-tokenize shows them.
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let piece = String::from_utf8_lossy(&tok.decode_bytes(&[id])?).into_owned();
        out.push(serde_json::json!({"id": id, "piece": piece}));
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}

pub fn detokenize(tokenizer: &Path) -> Result<ExitCode> {
    let tok = load_tokenizer(tokenizer)?;
    let input = read_stdin("detokenize reads")?;
    let ids = parse_ids(input.trim().trim_start_matches('[').trim_end_matches(']'))?;
    let bytes = tok.decode_bytes(&ids)?;
    print!("{}", String::from_utf8_lossy(&bytes));
    Ok(ExitCode::SUCCESS)
}
