//! What a store does to its directory: makes it private, names its files, writes them (0600,
//! durable, atomic), cleans up the temporaries of a crash, and opens a file only if it is a
//! regular file of this user's whose length is the one its head implies.

use std::fs::{File, Metadata};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use k3_io::whole::{is_mine, kind, open_regular};

use k3_engine::{StateFileError, StateFileLayout, StateHeader, read_state_header, state_ids_bytes};

use super::DiskTierError;

pub const EXT: &str = "k3state";
/// The key file's name in the directory (the naming key `owner` keeps).
pub const KEY_FILE: &str = "k3state.key";
const TMP_EXT: &str = "k3tmp";

/// Makes `dir` the store's: created 0700 if missing; an existing one must be a directory of this
/// user's and is made 0700 if it was open to others (it holds conversations). Says what it
/// changed.
pub fn make_private(dir: &Path) -> Result<Option<String>, DiskTierError> {
    let dir_err = |source| DiskTierError::Dir { path: dir.to_path_buf(), source };
    if std::fs::symlink_metadata(dir).is_err() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(dir_err)?;
    }
    let meta = std::fs::metadata(dir).map_err(dir_err)?;
    if !meta.is_dir() {
        return Err(DiskTierError::NotDir(dir.to_path_buf()));
    }
    if !is_mine(&meta) {
        return Err(DiskTierError::NotMine { path: dir.to_path_buf(), uid: meta.uid() });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o1000 != 0 {
        // A sticky directory (/tmp) is shared by design: made private, it would fail the others.
        return Err(DiskTierError::Shared(dir.to_path_buf()));
    }
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
    Ok(Some(format!("{}: was mode {mode:04o}, made 0700 (kept states are private)", dir.display())))
}

/// A store file's name: `{owner:016x}-{tokens:016x}.k3state`.
pub fn name(owner: u64, tokens: u64) -> String {
    format!("{owner:016x}-{tokens:016x}.{EXT}")
}

/// The owner a store file's name gives.
pub fn parse_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?.strip_suffix(&format!(".{EXT}"))?;
    let (owner, tokens) = name.split_once('-')?;
    let hex = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(owner) && hex(tokens)).then(|| u64::from_str_radix(owner, 16).ok()).flatten()
}

/// A temporary for `target`: `.{name}.{pid}.{unique}.k3tmp` beside it, created 0600 and
/// exclusively (O_EXCL: never a file, or a link, that was there).
fn temporary(target: &Path) -> std::io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = target.parent().unwrap_or(Path::new("."));
    let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let unique = (u64::from(nanos) << 20) ^ NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{unique:x}.{TMP_EXT}", std::process::id()));
    let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    Ok((tmp, file))
}

/// Writes `bytes` as `target`, 0600: into a temporary, synced, then renamed over `target` (a
/// reader sees the whole file or the one before), and the directory synced. `replace: false`
/// leaves a `target` that exists (another process made it first) and is not an error. A
/// `target` that is not a regular file is not replaced: an error saying what it is.
pub fn write_private(target: &Path, bytes: &[u8], replace: bool) -> std::io::Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(target)
        && !m.is_file()
    {
        return Err(std::io::Error::other(format!("{} is {}; left as it is", target.display(), kind(&m))));
    }
    let (tmp, mut file) = temporary(target)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all()).and_then(|()| match replace {
        true => std::fs::rename(&tmp, target),
        false => match std::fs::hard_link(&tmp, target) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => std::fs::remove_file(&tmp),
        },
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    if let Some(dir) = target.parent() {
        // The rename is durable once the directory is.
        File::open(dir).and_then(|d| d.sync_all())?;
    }
    Ok(())
}

/// Removes `path` if it is a temporary of a write that cannot finish: named as [`temporary`]
/// names them (or as the older `write_atomic` did), a regular file of this user's, and left by
/// a process that is gone (or over an hour old). Anything else is left as it is.
pub fn remove_dead_temporary(path: &Path, meta: &Metadata) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
    let Some(stem) = name.strip_prefix('.').and_then(|n| n.strip_suffix(&format!(".{TMP_EXT}"))) else {
        return false;
    };
    if !(stem.contains(&format!(".{EXT}.")) || stem.starts_with(KEY_FILE)) {
        return false;
    }
    if !meta.is_file() || !is_mine(meta) {
        return false;
    }
    let mut parts = stem.rsplitn(3, '.');
    let (_unique, pid) = (parts.next(), parts.next().and_then(|p| p.parse::<u32>().ok()));
    let gone = pid.is_some_and(|p| p != std::process::id() && !Path::new("/proc").join(p.to_string()).exists());
    let old = meta.modified().is_ok_and(|t| t.elapsed().is_ok_and(|a| a > Duration::from_secs(3600)));
    (gone || old) && std::fs::remove_file(path).is_ok()
}

/// Why a file named as a state was not indexed.
pub enum Unread {
    /// Not a regular file of this user's: left as it is, with a warning.
    NotOurs(String),
    /// Another model's or format version's: left as it is.
    Foreign,
    /// Larger than the whole budget: left as it is, with a warning.
    TooLarge(String),
    /// This model's, damaged (its length is not the one its head implies, or its head is bad).
    Damaged(StateFileError),
}

/// `path` opened for reading if it is a regular file of this user's.
pub fn open_own(path: &Path) -> Result<(File, Metadata), String> {
    let (file, meta) = open_regular(path).map_err(|e| e.to_string())?;
    if !is_mine(&meta) {
        return Err(format!("{}: owned by user {}, not this one", path.display(), meta.uid()));
    }
    Ok((file, meta))
}

/// The head of the state file `path` and its length, read only if it is a regular file of this
/// user's, of `fingerprint`'s model, whose length is the one `layout` gives for the head's
/// token count, and within `budget`: the token ids are read only once their count fits the
/// file, and nothing past them.
pub fn index_file(
    path: &Path,
    fingerprint: u64,
    layout: &StateFileLayout,
    budget: u64,
) -> Result<(StateHeader, u64), Unread> {
    let (file, meta) = open_own(path).map_err(Unread::NotOurs)?;
    let size = meta.len();
    let mut at = 0u64;
    let read = |n: usize| -> std::io::Result<Vec<u8>> {
        let n = n.min(usize::try_from(size.saturating_sub(at)).unwrap_or(usize::MAX));
        let mut buf = vec![0u8; n];
        file.read_exact_at(&mut buf, at)?;
        at += n as u64;
        Ok(buf)
    };
    let mut too_large = None;
    let fits = |found: u64, tokens: u64| {
        if found != fingerprint {
            return Err(StateFileError::Model { found, want: fingerprint });
        }
        let want = [layout.len(tokens, false), layout.len(tokens, true)];
        if state_ids_bytes(tokens).is_none() || !want.contains(&Some(size)) {
            return Err(StateFileError::Invalid(format!(
                "{size} bytes, where its head's {tokens} tokens make {} (or {} with logits)",
                want[0].map_or("too many".into(), |b| b.to_string()),
                want[1].map_or("too many".into(), |b| b.to_string()),
            )));
        }
        if size > budget {
            too_large = Some(format!("{}: {size} bytes, more than the whole budget of {budget}", path.display()));
            return Err(StateFileError::Invalid(String::new()));
        }
        Ok(())
    };
    let head = read_state_header(read, fits);
    if let Some(why) = too_large {
        return Err(Unread::TooLarge(why));
    }
    match head {
        Ok(h) if layout.len(h.ids.len() as u64, h.logits) == Some(size) => Ok((h, size)),
        Ok(h) => Err(Unread::Damaged(StateFileError::Invalid(format!(
            "{size} bytes, which its head ({} tokens, logits {}) does not make",
            h.ids.len(),
            if h.logits { "kept" } else { "not kept" }
        )))),
        Err(StateFileError::Model { .. } | StateFileError::Version { .. }) => Err(Unread::Foreign),
        Err(e) => Err(Unread::Damaged(e)),
    }
}
