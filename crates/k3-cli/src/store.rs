//! The model store: models by name, as Ollama keeps them. A stored model is a WASTE model
//! directory `<data dir>/models/NAME` (`convert --name NAME` writes one); `--model NAME` finds
//! it wherever a model directory is taken (a path that exists wins), `list`, `show` and `rm`
//! work on it, and `serve` offers every stored model by its name.
//!
//! The store holds only what k3 wrote: `rm` removes a stored model's directory and nothing
//! outside it (a checkpoint whose experts it read in place, or shards written to `--shard-dir`
//! directories elsewhere, stay where they are, and `rm` names them).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The name `list` and `serve` give the model compiled into the binary.
pub const DEFAULT_NAME: &str = "default";

/// Where k3 keeps its files: `$K3_DATA_DIR`, else `$XDG_DATA_HOME/k3`, else `~/.local/share/k3`.
pub fn data_dir() -> Result<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("K3_DATA_DIR") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_DATA_HOME") {
        return Ok(d.join("k3"));
    }
    var("HOME")
        .map(|h| h.join(".local/share/k3"))
        .context("no data directory for k3's models: set K3_DATA_DIR (or HOME), or give a model's path")
}

/// The store's directory.
pub fn models_dir() -> Result<PathBuf> {
    Ok(data_dir()?.join("models"))
}

/// A name the store takes: 1-64 of letters, digits, `.`, `_`, `-` and `:`, starting with a letter
/// or digit (so never `.`, `..` or a path), and not `default` (the built-in model's).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'));
    if !ok {
        return Err(format!(
            "{name:?} is not a model name: 1-64 letters, digits, '.', '_', '-' or ':', starting with a letter or digit"
        ));
    }
    if untagged(name) == DEFAULT_NAME {
        return Err(format!("`{DEFAULT_NAME}` names the model built into k3-cli; choose another name"));
    }
    if name.ends_with(":latest") {
        return Err(format!("{name:?}: `:latest` is what Ollama's clients add to a name; leave it out"));
    }
    Ok(())
}

/// [`check_name`] as clap's value parser.
pub fn parse_name(name: &str) -> Result<String, String> {
    check_name(name).map(|()| name.to_string())
}

/// Ollama's clients name a model `NAME:latest` when no tag was given.
pub fn untagged(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// A stored model's directory, if `name` names one (`NAME:latest` finds `NAME`).
pub fn find(name: &str) -> Result<Option<PathBuf>> {
    let dir = models_dir()?;
    for n in [name, untagged(name)] {
        if check_name(n).is_ok() && is_model(&dir.join(n)) {
            return Ok(Some(dir.join(n)));
        }
    }
    Ok(None)
}

/// A WASTE model's directory (its header is there), not followed through a link.
fn is_model(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) && dir.join("header.waste").is_file()
}

/// One stored model.
#[derive(Debug, Clone)]
pub struct Stored {
    pub name: String,
    pub dir: PathBuf,
    /// Bytes of the files in its directory (experts read in place are the checkpoint's).
    pub bytes: u64,
    /// When its header was written (Unix seconds).
    pub modified: u64,
}

/// Every stored model, by name. A directory under the store that is not a model (a conversion
/// under way leaves no header until it ends) is skipped.
pub fn list() -> Result<Vec<Stored>> {
    let dir = models_dir()?;
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading the model store {}", dir.display())),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if check_name(&name).is_err() || !is_model(&path) {
            continue;
        }
        let modified = std::fs::metadata(path.join("header.waste"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        out.push(Stored { name, bytes: dir_bytes(&path), dir: path, modified });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Bytes of the regular files directly in `dir` (links not followed).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map_or(0, |rd| rd.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
}

/// Where `convert --name NAME` writes.
pub fn target(name: &str) -> Result<PathBuf> {
    check_name(name).map_err(anyhow::Error::msg)?;
    Ok(models_dir()?.join(name))
}

/// Removes a stored model's directory; returns it. Files it names outside that directory (expert
/// shards in other directories, a checkpoint read in place) are not touched.
pub fn remove(name: &str) -> Result<PathBuf> {
    if untagged(name) == DEFAULT_NAME {
        bail!("`{DEFAULT_NAME}` is built into k3-cli: there is nothing to remove");
    }
    let Some(dir) = find(name)? else {
        bail!("no stored model is named `{name}` (`k3-cli list` shows them)");
    };
    // Renamed aside first, so a name is either whole or gone, never half removed.
    let aside = dir.with_file_name(format!(
        ".removing-{}-{}",
        dir.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id()
    ));
    std::fs::rename(&dir, &aside).with_context(|| format!("removing {}", dir.display()))?;
    std::fs::remove_dir_all(&aside).with_context(|| format!("removing {}", aside.display()))?;
    Ok(dir)
}

/// `--model VALUE`: a path that exists; else a stored model's name; else `default`; else an
/// error naming both readings.
pub fn resolve(value: &Path) -> Result<Option<PathBuf>> {
    if value.exists() {
        return Ok(Some(value.to_path_buf()));
    }
    let Some(name) = value.to_str().filter(|s| !s.contains('/')) else {
        bail!("{}: no such model directory", value.display());
    };
    if untagged(name) == DEFAULT_NAME {
        return Ok(None);
    }
    match find(name)? {
        Some(dir) => Ok(Some(dir)),
        None => bail!("`{name}` is neither a model directory nor a stored model (`k3-cli list` shows them)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_words() {
        for good in ["k3", "kimi-k3.1-pro", "k3:int4", "K2_thinking"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "../x",
            "-x",
            "default",
            "default:latest",
            "k3:latest",
            "a b",
            &"x".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(untagged("k3:latest"), "k3");
        assert_eq!(untagged("k3:int4"), "k3:int4");
    }
}
