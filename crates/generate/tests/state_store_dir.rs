//! The disk tier's directory holds only what k3 made: a file grown after it was indexed is
//! refused at its restore without being read, another user's file is left unread, and another
//! user's directory is refused with a reason, and so is a shared (sticky) one such as /tmp.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k3_engine::{Engine, Model};
use k3_generate::cache::disk::DiskTier;

const PROMPT: [u32; 9] = [5, 77, 300, 120, 9, 44, 200, 301, 17];

fn model() -> Model {
    Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")).unwrap()
}

fn states(dir: &Path) -> Vec<PathBuf> {
    let all = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
    all.filter(|p| p.extension().is_some_and(|e| e == "k3state")).collect()
}

/// Whether this process runs as root (only root can give a file to another user).
fn root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().nth(1) == Some("0")
}

/// A directory with one state of `PROMPT[..6]` in it (scope 0).
fn one_state(engine: &Engine<'_>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut s = engine.session();
    engine.forward_last(&mut s, &PROMPT[..6]).unwrap();
    let mut store = DiskTier::open(dir.path(), 1 << 30, engine).unwrap();
    assert!(store.save(engine, 0, &s, None));
    store.settle(Duration::from_secs(20));
    drop(store);
    let file = states(dir.path()).pop().unwrap();
    (dir, file)
}

#[test]
fn a_file_grown_after_it_was_indexed_is_refused_unread() {
    let model = model();
    let engine = Engine::load(&model).unwrap();
    let (dir, file) = one_state(&engine);
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!(store.best(0, &PROMPT), 6);
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(f.metadata().unwrap().len() + (1 << 30)).unwrap();
    assert!(store.restore(&engine, 0, &PROMPT).is_none());
    let stats = store.stats();
    assert_eq!((stats.refused, stats.bytes_read, stats.hits), (1, 0, 0));
    assert!(store.take_warnings().iter().any(|w| w.contains("changed since")), "the reason is given");
    drop(store);
    // At the next open its length is not the one its head implies: damaged, removed.
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!(store.stats().entries, 0);
    assert!(store.take_warnings().iter().any(|w| w.contains("bytes, where its head's 6 tokens make")));
    assert!(!file.exists());
}

#[test]
fn another_users_file_and_directory_are_not_used() {
    if !root() {
        eprintln!("skipped: only root can give a file to another user");
        return;
    }
    let model = model();
    let engine = Engine::load(&model).unwrap();
    let (dir, file) = one_state(&engine);
    std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!(store.stats().entries, 0);
    assert!(store.take_warnings().iter().any(|w| w.contains("owned by user 65534")));
    assert!(file.exists(), "left as it is");
    drop(store);
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    let err = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap_err();
    assert!(err.to_string().contains("owned by user 65534, not this one"), "{err}");
}

#[test]
fn a_shared_sticky_directory_is_refused_not_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let model = model();
    let engine = Engine::load(&model).unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap_err();
    assert!(err.to_string().contains("shared with other users"), "{err}");
    let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o1777, "left as it was");
}
