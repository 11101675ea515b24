//! The disk tier of kept states: what is saved is found again by a store opened later (a
//! restart) and resumes as the session it was; the budget drops the least recently used; damaged,
//! foreign, stale and swapped files are refused (and recomputed by the caller), never restored.

use std::path::Path;
use std::time::Duration;

use k3_engine::{Engine, Model};
use k3_generate::cache::disk::DiskTier;

fn open(name: &str) -> Model {
    Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)).unwrap()
}

const PROMPT: [u32; 9] = [5, 77, 300, 120, 9, 44, 200, 301, 17];
const SETTLE: Duration = Duration::from_secs(20);

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "k3state"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_saved_state_is_restored_after_a_restart() {
    let model = open("default.waste");
    let engine = Engine::load(&model).unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut s = engine.session();
    let logits = engine.forward_last(&mut s, &PROMPT[..6]).unwrap();
    {
        let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
        store.save(&engine, 7, &s, Some(&logits));
        store.settle(SETTLE);
        assert_eq!(store.stats().writes, 1);
    }
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!(store.stats().entries, 1);
    assert_eq!(store.best(7, &PROMPT), 6);
    assert_eq!(store.best(8, &PROMPT), 0, "another scope's state is not offered");
    assert_eq!(store.best(7, &PROMPT[..6]), 6, "the whole prompt, with its logits");
    assert_eq!(store.best(7, &PROMPT[..5]), 0, "a state longer than the prompt");
    let back = store.restore(&engine, 7, &PROMPT).expect("restored");
    assert!(back.session == s);
    assert_eq!(back.logits.as_deref(), Some(&logits[..]));
    let (mut a, mut b) = (back.session, engine.fork(&s).unwrap());
    let want = engine.forward_last(&mut b, &PROMPT[6..]).unwrap();
    assert_eq!(engine.forward_last(&mut a, &PROMPT[6..]).unwrap(), want);
    assert_eq!(store.stats().hits, 1);
}

#[test]
fn the_budget_drops_the_least_recently_used() {
    let model = open("default.waste");
    let engine = Engine::load(&model).unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let states: Vec<_> = (3..6)
        .map(|n| {
            let mut s = engine.session();
            engine.forward_last(&mut s, &PROMPT[..n]).unwrap();
            s
        })
        .collect();
    let one = engine.state_file(&states[2], None).len() as u64;
    let mut store = DiskTier::open(dir.path(), 2 * one + 100, &engine).unwrap();
    store.save(&engine, 0, &states[0], None);
    store.settle(SETTLE);
    store.save(&engine, 0, &states[1], None);
    store.settle(SETTLE);
    assert!(store.restore(&engine, 0, &PROMPT[..4]).is_some(), "the oldest, now used");
    store.save(&engine, 0, &states[2], None);
    store.settle(SETTLE);
    assert_eq!(files(dir.path()).len(), 2);
    assert_eq!(store.best(0, &PROMPT[..5]), 3, "the 4-token state was dropped, the used 3-token one kept");
    drop(store);
    let store = DiskTier::open(dir.path(), one + 100, &engine).unwrap();
    assert_eq!(store.stats().entries, 1, "a smaller budget at open drops the oldest");
}

#[test]
fn bad_files_are_refused_never_restored() {
    let (model, other) = (open("default.waste"), open("tiny-kimi-linear.waste"));
    let (engine, foreign) = (Engine::load(&model).unwrap(), Engine::load(&other).unwrap());
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut s = engine.session();
    engine.forward_last(&mut s, &PROMPT[..4]).unwrap();
    let mut t = engine.session();
    engine.forward_last(&mut t, &PROMPT[..6]).unwrap();
    {
        let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
        store.save(&engine, 0, &s, None);
        store.settle(SETTLE);
        let mut f = foreign.session();
        foreign.forward_last(&mut f, &PROMPT[..3]).unwrap();
        let mut theirs = DiskTier::open(dir.path(), 1 << 30, &foreign).unwrap();
        theirs.save(&foreign, 0, &f, None);
        theirs.settle(SETTLE);
    }
    let all = files(dir.path());
    assert_eq!(all.len(), 2);
    let ours = all.into_iter().find(|p| std::fs::read(p).unwrap() == engine.state_file(&s, None)).unwrap();
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!(store.stats().entries, 1);
    assert_eq!(store.best(0, &PROMPT), 4);
    assert!(store.take_warnings().iter().any(|w| w.contains("another model")), "foreign files are named");
    drop(store);

    // Damaged after the scan: refused at the restore, removed.
    let good = std::fs::read(&ours).unwrap();
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    let mut bad = good.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    std::fs::write(&ours, &bad).unwrap();
    assert!(store.restore(&engine, 0, &PROMPT).is_none(), "a damaged file");
    assert!(!ours.exists(), "and removed");
    assert!(store.take_warnings().iter().any(|w| w.contains("checksum")));
    assert_eq!(store.stats().refused, 1);

    // Swapped after the scan for another state of this model: its tokens are not the index's.
    std::fs::write(&ours, &good).unwrap();
    let mut store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    std::fs::write(&ours, engine.state_file(&t, None)).unwrap();
    assert!(store.restore(&engine, 0, &PROMPT).is_none(), "a swapped file");
    assert!(ours.exists(), "a whole file of this model is not removed");

    // Another format version: left alone, not indexed; truncated: removed at open.
    let mut newer = good.clone();
    newer[8] = 2;
    std::fs::write(&ours, &newer).unwrap();
    let store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!(store.stats().entries, 0);
    assert!(ours.exists());
    drop(store);
    std::fs::write(&ours, &good[..20]).unwrap();
    let store = DiskTier::open(dir.path(), 1 << 30, &engine).unwrap();
    assert_eq!((store.stats().entries, store.stats().refused), (0, 1));
    assert!(!ours.exists());
    assert_eq!(files(dir.path()).len(), 1, "the other model's file is still there");
}
