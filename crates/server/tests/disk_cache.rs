//! The prefix cache's disk tier over HTTP on the default model: a restarted server resumes the
//! states an earlier one kept (Regenerate, a new conversation under the same system prompt), and
//! damaged or other-version state files never change an answer — each answer is a server
//! without any cache's.

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// A server with the disk tier in `dir` (and `ram` bytes of RAM tier).
async fn with_dir(dir: &Path, ram: usize) -> Router {
    server(ServerOptions {
        prefix_cache: ram,
        prompt_cache_dir: Some(dir.to_path_buf()),
        ..ServerOptions::new(default_model())
    })
    .await
}

/// A first server answers two requests and keeps their states on disk as it goes: the system
/// turn's end and each prompt's end (three files once its writer is done).
async fn first_server(dir: &Path) {
    let first = with_dir(dir, 1 << 30).await;
    ask(&first, &body("And God said")).await;
    ask(&first, &body("Tell of the flood")).await;
    for _ in 0..1000 {
        if on_disk(dir).len() >= 3 {
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
    let fresh = server(ServerOptions { prefix_cache: 0, ..ServerOptions::new(default_model()) }).await;
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
        assert!(m.contains("k3_prefix_cache_disk_hits_total 2"), "{m}");
    }
}

#[tokio::test]
async fn damaged_and_other_version_files_never_change_an_answer() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    first_server(dir.path()).await;
    let fresh = server(ServerOptions { prefix_cache: 0, ..ServerOptions::new(default_model()) }).await;
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
        let refused = m.lines().find_map(|l| l.strip_prefix("k3_prefix_cache_disk_refused_total ")).unwrap();
        assert_eq!(refused != "0", damaged, "{what}: damaged files are refused, another version's not read: {m}");
    }
}
