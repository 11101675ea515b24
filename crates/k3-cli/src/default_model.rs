//! The default model travels inside the binary: its files are compiled in, and the first run
//! writes them once to a data directory (`$K3_DATA_DIR`, else `$XDG_DATA_HOME/k3`, else
//! `~/.local/share/k3`), because experts are read from a file with O_DIRECT. The directory's name
//! carries a hash of the model's header, so a binary with another default model never reuses it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

macro_rules! model_file {
    ($name:literal) => {
        ($name, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/default.waste/", $name)) as &[u8])
    };
}

/// Every file of `fixtures/default.waste` (a test checks the list is complete).
pub const FILES: [(&str, &[u8]); 3] =
    [model_file!("header.waste"), model_file!("trunk.waste"), model_file!("experts-00000.waste")];

/// Where the default model's files go (the store's data directory).
pub use k3_cli::store::data_dir;

/// The default model's directory, written on first use.
pub fn path() -> Result<PathBuf> {
    let dir = data_dir()?;
    let hash = xxhash_rust::xxh3::xxh3_64(FILES[0].1);
    let target = dir.join(format!("default-{hash:016x}.waste"));
    if is_complete(&target) {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Written in a temporary directory beside it and renamed into place: a half-written model is
    // never seen, and two first runs at once both end up with one complete copy.
    let tmp = tempfile::Builder::new()
        .prefix(".default-")
        .tempdir_in(&dir)
        .with_context(|| format!("writing the default model to {}", dir.display()))?;
    for (name, bytes) in FILES {
        let p = tmp.path().join(name);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
    }
    if target.exists() && !is_complete(&target) {
        // A damaged or partial copy: the binary's own files, so it is replaced (moved aside
        // first, so the rename below lands on an empty name).
        let aside = dir.join(format!(".default-damaged-{}-{hash:016x}", std::process::id()));
        std::fs::rename(&target, &aside).with_context(|| format!("moving the damaged {} aside", target.display()))?;
        let _ = std::fs::remove_dir_all(&aside);
        eprintln!("note: the default model's copy in {} was damaged; written again", dir.display());
    }
    match std::fs::rename(tmp.path(), &target) {
        Ok(()) => {
            std::mem::forget(tmp);
            Ok(target)
        }
        Err(_) if is_complete(&target) => Ok(target),
        Err(e) => Err(e).with_context(|| format!("writing the default model to {}", target.display())),
    }
}

/// Whether `dir` holds the default model's files, byte for byte (15.7 MB compared: a few ms).
fn is_complete(dir: &Path) -> bool {
    FILES.iter().all(|(name, bytes)| {
        std::fs::metadata(dir.join(name)).is_ok_and(|m| m.len() == bytes.len() as u64)
            && std::fs::read(dir.join(name)).is_ok_and(|b| b == *bytes)
    })
}

/// `--model` (a directory, or a stored model's name: [`k3_cli::store::resolve`]), or the default
/// model.
pub fn or_default(model: Option<PathBuf>) -> Result<PathBuf> {
    match model.map(|m| k3_cli::store::resolve(&m)).transpose()?.flatten() {
        Some(m) => Ok(m),
        None => path(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_file_of_the_default_model_is_compiled_in() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/default.waste");
        let mut on_disk: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        on_disk.sort();
        let mut embedded: Vec<String> = super::FILES.iter().map(|(n, _)| n.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }
}
