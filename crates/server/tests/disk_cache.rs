//! The prompt cache's disk tier over HTTP on the default model: a restarted server resumes the
//! states an earlier one kept (Regenerate, a new conversation under the same system prompt), and
//! damaged or other-version state files never change an answer — each answer is a server
//! without any cache's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use axum::Router;
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{ask, cached, call, content, get, server};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

const SYSTEM: &str = "You are a careful storyteller. Every answer is one short paragraph in the style of an old \
    chronicle, with plain words, no lists and no headings, and it never repeats the question.";

fn body(user: &str) -> Value {
    json!({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
           "max_tokens": 12, "temperature": 0})
}

fn on_disk(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "k3state"))
        .collect();
    v.sort();
    v
}

/// The file holding a cache directory's naming key (`k3_generate::cache::disk::owner::KEY_FILE`).
const KEY_FILE: &str = "k3state.key";

/// The directory's naming key, copied (files are named by it: a copy of the files without it is
/// found under no name).
fn copy_key(from: &Path, to: &Path) {
    let key = from.join(KEY_FILE);
    if key.exists() {
        std::fs::copy(key, to.join(KEY_FILE)).unwrap();
    }
}

/// A server with the disk tier in `dir` (and `ram` bytes of RAM tier).
async fn with_dir(dir: &Path, ram: usize) -> Router {
    server(ServerOptions {
        prompt_cache_ram: ram,
        prompt_cache_dir: Some(dir.to_path_buf()),
        ..ServerOptions::new(default_model())
    })
    .await
}

/// A first server answers two requests and keeps their states on disk as it goes: the system
/// turn's end and each prompt's end (those its writer had room for); when it stops (its router
/// dropped), what it held in RAM only is written too, the answers' ends among them (five files).
async fn first_server(dir: &Path) {
    let first = with_dir(dir, 1 << 30).await;
    ask(&first, &body("And God said")).await;
    ask(&first, &body("Tell of the flood")).await;
    drop(first);
    wait_for_files(dir, 5).await;
}

async fn wait_for_files(dir: &Path, n: usize) {
    for _ in 0..3000 {
        if on_disk(dir).len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the states were not written: {:?}", on_disk(dir));
}

#[tokio::test]
async fn a_restarted_server_resumes_what_an_earlier_one_kept() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    first_server(dir.path()).await;
    let fresh = server(ServerOptions { prompt_cache_ram: 0, ..ServerOptions::new(default_model()) }).await;
    // The RAM tier off: what resumes can only come from disk.
    for ram in [0, 1 << 30] {
        let restarted = with_dir(dir.path(), ram).await;
        let again = ask(&restarted, &body("And God said")).await;
        let reference = ask(&fresh, &body("And God said")).await;
        assert_eq!(cached(&again), again["usage"]["prompt_tokens"].as_u64().unwrap(), "Regenerate: the whole prompt");
        assert_eq!(content(&again), content(&reference));
        let other = ask(&restarted, &body("What came after the light?")).await;
        let reference = ask(&fresh, &body("What came after the light?")).await;
        assert!(cached(&other) > 30, "the shared system turn: {}", other["usage"]);
        assert_eq!(content(&other), content(&reference));
        let (_, m) = call(&restarted, get("/metrics")).await;
        assert!(m.contains("k3_prompt_cache_disk_hits_total 2"), "{m}");
    }
}

#[tokio::test]
async fn damaged_and_other_version_files_never_change_an_answer() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    first_server(dir.path()).await;
    let fresh = server(ServerOptions { prompt_cache_ram: 0, ..ServerOptions::new(default_model()) }).await;
    let good: Vec<(PathBuf, Vec<u8>)> =
        on_disk(dir.path()).into_iter().map(|f| (f.clone(), std::fs::read(f).unwrap())).collect();
    type Spoil = fn(&mut Vec<u8>);
    let spoils: [(&str, Spoil, bool); 3] = [
        (
            "a flipped byte",
            |b| {
                let at = b.len() / 2;
                b[at] ^= 0x40;
            },
            true,
        ),
        ("another format version", |b| b[8] = 9, false),
        ("cut short", |b| b.truncate(b.len() - 100), true),
    ];
    for (what, spoil, damaged) in spoils {
        // The first server's files, spoiled, in a directory of their own.
        let spoiled = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        copy_key(dir.path(), spoiled.path());
        for (f, g) in &good {
            let mut b = g.clone();
            spoil(&mut b);
            std::fs::write(spoiled.path().join(f.file_name().unwrap()), b).unwrap();
        }
        let restarted = with_dir(spoiled.path(), 1 << 30).await;
        // The first request can only have resumed a bad file; the second may resume what the
        // first computed and kept.
        for (i, q) in ["And God said", "What came after the light?"].into_iter().enumerate() {
            let v = ask(&restarted, &body(q)).await;
            if i == 0 {
                assert_eq!(cached(&v), 0, "{what}: nothing resumed from a bad file");
            }
            assert_eq!(content(&v), content(&ask(&fresh, &body(q)).await), "{what}");
        }
        let (_, m) = call(&restarted, get("/metrics")).await;
        let refused = m.lines().find_map(|l| l.strip_prefix("k3_prompt_cache_disk_refused_total ")).unwrap();
        assert_eq!(refused != "0", damaged, "{what}: damaged files are refused, another version's not read: {m}");
    }
}

/// A directory holding what `first_server` kept, each state file made by `make(original, name)`
/// in a fresh directory (with the key, so the names are the ones looked up).
fn remade(kept: &Path, make: impl Fn(&Path, &Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    copy_key(kept, dir.path());
    for f in on_disk(kept) {
        make(&f, &dir.path().join(f.file_name().unwrap()));
    }
    dir
}

fn mtime(p: &Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

#[tokio::test]
async fn a_symlink_in_the_directory_is_not_followed() {
    let outside = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    first_server(outside.path()).await;
    let before: Vec<_> = on_disk(outside.path()).iter().map(|f| mtime(f)).collect();
    let dir = remade(outside.path(), |f, name| std::os::unix::fs::symlink(f, name).unwrap());
    let restarted = with_dir(dir.path(), 1 << 30).await;
    let v = ask(&restarted, &body("And God said")).await;
    assert_eq!(cached(&v), 0, "nothing resumed through a symbolic link: {}", v["usage"]);
    drop(restarted);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after: Vec<_> = on_disk(outside.path()).iter().map(|f| mtime(f)).collect();
    assert_eq!(before, after, "the files outside are untouched");
    for f in on_disk(outside.path()) {
        let link = dir.path().join(f.file_name().unwrap());
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is left as it is");
    }
}

#[tokio::test]
async fn a_fifo_with_a_state_files_name_does_not_hang_a_request() {
    let kept = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    first_server(kept.path()).await;
    let dir = remade(kept.path(), |_, name| {
        assert!(std::process::Command::new("mkfifo").arg(name).status().unwrap().success());
    });
    // Generous: an answer takes well under a second here; a hang is forever.
    let asked = tokio::time::timeout(Duration::from_secs(120), async {
        let restarted = with_dir(dir.path(), 1 << 30).await;
        ask(&restarted, &body("And God said")).await
    });
    let v = asked.await.expect("the request was answered, not held by a FIFO");
    assert_eq!(cached(&v), 0, "{}", v["usage"]);
    for f in on_disk(kept.path()) {
        let fifo = std::fs::symlink_metadata(dir.path().join(f.file_name().unwrap())).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()), "the FIFO is left as it is");
    }
}

#[tokio::test]
async fn the_directory_and_its_files_are_private_whatever_was_there() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A temporary of a write whose process is gone (no such pid), and a file k3 did not make.
    let dead = dir.path().join(".0000000000000001-0000000000000002.k3state.999999999.1f.k3tmp");
    let theirs = dir.path().join(".notes.k3tmp");
    std::fs::write(&dead, b"half a state").unwrap();
    std::fs::write(&theirs, b"not ours").unwrap();
    first_server(dir.path()).await;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.path()), 0o700);
    let files = on_disk(dir.path());
    assert!(!files.is_empty());
    for f in files.iter().chain([&dir.path().join(KEY_FILE)]) {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    assert!(!dead.exists(), "a dead write's temporary is removed at open");
    assert!(theirs.exists(), "a file k3 did not name is left");
}

#[tokio::test]
async fn file_names_do_not_carry_the_api_keys_hash() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let key = "sesame";
    let mut opts = ServerOptions {
        prompt_cache_ram: 1 << 30,
        prompt_cache_dir: Some(dir.path().to_path_buf()),
        ..ServerOptions::new(default_model())
    };
    opts.boundary.api_keys = vec![key.into()];
    let s = server(opts).await;
    let mut req = common::post("/v1/chat/completions", &body("And God said"));
    req.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    let (status, v) = common::json_call(&s, req).await;
    assert_eq!(status, 200, "{v}");
    drop(s);
    for _ in 0..1000 {
        if on_disk(dir.path()).len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let names: Vec<String> =
        on_disk(dir.path()).iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert!(names.len() >= 2, "{names:?}");
    // The scope the server computes for a key (`Scope::of_key`): fast and unsalted.
    let raw = format!("{:016x}", xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), 0x6b33_5f73_636f_7065) | 1);
    assert_eq!(raw, format!("{:016x}", k3_generate::cache::Scope::of_key(key).0));
    assert!(names.iter().all(|n| !n.contains(&raw)), "{raw} in {names:?}");
}

/// The process's peak resident memory, in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

#[tokio::test]
async fn a_state_file_with_a_huge_sparse_tail_is_refused_unread() {
    let kept = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    first_server(kept.path()).await;
    const TAIL: u64 = 3 << 30;
    let dir = remade(kept.path(), |f, name| {
        std::fs::copy(f, name).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(name).unwrap();
        file.set_len(file.metadata().unwrap().len() + TAIL).unwrap();
    });
    let before = peak_kib();
    let restarted = with_dir(dir.path(), 1 << 30).await;
    let v = ask(&restarted, &body("And God said")).await;
    assert_eq!(cached(&v), 0, "{}", v["usage"]);
    let (_, m) = call(&restarted, get("/metrics")).await;
    let refused = m.lines().find_map(|l| l.strip_prefix("k3_prompt_cache_disk_refused_total ")).unwrap();
    assert_ne!(refused, "0", "{m}");
    // Reading one tail would take 3 GiB; the other tests of this binary share the process, so
    // the bound is loose (they load a small model).
    let grown = peak_kib().saturating_sub(before);
    assert!(grown < 1 << 20, "peak memory grew {grown} KiB");
}
