//! The expert cache under random request sequences, and the policies on crafted ones.

use std::collections::HashSet;
use std::path::Path;

use k3_io::{BackendChoice, ExpertCache, Key, Location, Policy, Priority, Reader, ReaderOptions, Status};
use proptest::prelude::*;

const PAGE: usize = 4096;
const REC: usize = 2 * PAGE;
const LAYERS: u32 = 4;
const EXPERTS: u32 = 8;

fn byte_at(p: u64) -> u8 {
    (p.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

fn index(k: Key) -> u64 {
    u64::from(k.0 * EXPERTS + k.1)
}

fn record(k: Key) -> Vec<u8> {
    let off = index(k) * REC as u64;
    (off..off + REC as u64).map(byte_at).collect()
}

fn setup(dir: &Path, slots: usize, policy: Policy) -> (ExpertCache, k3_io::FileId) {
    let path = dir.join("experts.bin");
    let data: Vec<u8> = (0..u64::from(LAYERS * EXPERTS) * REC as u64).map(byte_at).collect();
    std::fs::write(&path, data).unwrap();
    let mut r =
        Reader::new(ReaderOptions { backend: BackendChoice::Auto, queue_depth: 4, ..ReaderOptions::new(REC, slots) })
            .unwrap();
    let f = r.open(&path).unwrap();
    (ExpertCache::new(r, policy), f)
}

fn loc(f: k3_io::FileId, k: Key) -> Location {
    Location { file: f, offset: index(k) * REC as u64, len: REC, xxh3: Some(xxhash_rust::xxh3::xxh3_64(&record(k))) }
}

fn fetch(c: &mut ExpertCache, f: k3_io::FileId, k: Key) {
    match c.request(k, loc(f, k), Priority::Demand).unwrap() {
        Status::Hit => {}
        Status::Issued | Status::Pending => {
            let (got, r) = c.wait_any(&[k]).unwrap();
            assert_eq!(got, k);
            r.unwrap();
        }
        Status::NoRoom => panic!("no room"),
    }
}

#[test]
fn lru_and_lfu_give_up_different_records() {
    let dir = tempfile::tempdir().unwrap();
    for (policy, evicted) in [(Policy::Lru, (0, 0)), (Policy::Lfu, (0, 1)), (Policy::Lfru, (0, 1))] {
        let (mut c, f) = setup(dir.path(), 2, policy);
        fetch(&mut c, f, (0, 0));
        fetch(&mut c, f, (0, 0));
        fetch(&mut c, f, (0, 0)); // (0,0): used 3 times, long ago
        fetch(&mut c, f, (0, 1)); // (0,1): used once, recently
        fetch(&mut c, f, (1, 0)); // needs a slot
        assert!(!c.contains(evicted), "{policy:?} kept {evicted:?}");
        assert_eq!(c.stats().evictions, 1);
        assert_eq!(c.stats().hits, 2);
        assert_eq!(c.get((1, 0)).unwrap(), record((1, 0)).as_slice());
    }
}

/// Decode's pattern: layers in turn, each token reusing its layer's experts. A cache of 4 slots
/// for 3 layers of 2 experts each: over the whole cache every record is given up before its
/// layer comes back (no hits); by layer shares each layer keeps some of its own.
#[test]
fn layer_shares_keep_each_layers_experts_across_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let hits = |shares: bool| {
        let (c, f) = setup(dir.path(), 4, Policy::Lru);
        let mut c = c.with_layer_shares(shares);
        for _token in 0..6 {
            for layer in 0..3 {
                for e in 0..2 {
                    fetch(&mut c, f, (layer, e));
                }
            }
        }
        c.stats().hits
    };
    assert_eq!(hits(false), 0, "the whole cache cycles");
    assert!(hits(true) >= 6, "each layer keeps a share: {}", hits(true));
}

#[test]
fn prefetches_are_counted_used_or_wasted() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, f) = setup(dir.path(), 3, Policy::Lru);
    assert_eq!(c.request((1, 1), loc(f, (1, 1)), Priority::Prefetch { layer: 1 }).unwrap(), Status::Issued);
    assert_eq!(c.request((1, 2), loc(f, (1, 2)), Priority::Prefetch { layer: 1 }).unwrap(), Status::Issued);
    c.drain();
    fetch(&mut c, f, (1, 1)); // used
    fetch(&mut c, f, (2, 0));
    fetch(&mut c, f, (2, 1)); // evicts (1, 2), never used
    let s = c.stats();
    assert_eq!((s.prefetches_issued, s.prefetches_used, s.prefetches_wasted), (2, 1, 1), "{s:?}");
}

#[test]
fn pinned_records_stay() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, f) = setup(dir.path(), 4, Policy::Lru);
    assert_eq!(c.pin(&[(0, 3), (0, 4), (0, 5)]), 2, "at most half the slots");
    fetch(&mut c, f, (0, 3));
    for e in 0..EXPERTS {
        fetch(&mut c, f, (2, e));
    }
    assert!(c.contains((0, 3)));
    assert_eq!(c.get((0, 3)).unwrap(), record((0, 3)).as_slice());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_random_requests(
        ops in proptest::collection::vec((0u8..10, 0..LAYERS, 0..EXPERTS), 1..200),
        slots in 2usize..7,
        policy in prop::sample::select(vec![Policy::Lru, Policy::Lfu, Policy::Lfru]),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, f) = setup(dir.path(), slots, policy);
        c.pin(&[(0, 0)]);
        let mut layer = 0;
        let mut pinned_loaded = false;
        let (mut hits, mut issued, mut pending) = (0u64, 0u64, 0u64);
        let mut requested: HashSet<Key> = HashSet::new();
        for (op, l, e) in ops {
            let k = (l, e);
            match op {
                0..=4 => {
                    match c.request(k, loc(f, k), Priority::Demand).unwrap() {
                        Status::Hit => hits += 1,
                        Status::Issued => issued += 1,
                        Status::Pending => pending += 1,
                        Status::NoRoom => {}
                    }
                    requested.insert(k);
                }
                5..=6 => {
                    if c.request(k, loc(f, k), Priority::Prefetch { layer: l }).unwrap() != Status::NoRoom {
                        requested.insert(k);
                    }
                }
                7 => {
                    let keys: Vec<Key> = requested.iter().copied().collect();
                    if let Some((got, r)) = c.wait_any(&keys) {
                        prop_assert!(keys.contains(&got));
                        if r.is_ok() {
                            prop_assert!(c.get(got).unwrap() == record(got).as_slice());
                        }
                    }
                }
                8 => {
                    layer += 1;
                    c.set_layer(layer);
                }
                _ => {
                    if let Some(b) = c.get(k) {
                        prop_assert!(b == record(k).as_slice());
                    }
                }
            }
            prop_assert!(c.occupied() <= c.capacity());
            if c.get((0, 0)).is_some() {
                pinned_loaded = true;
            }
            if pinned_loaded {
                prop_assert!(c.contains((0, 0)), "a pinned record was evicted");
            }
        }
        c.drain();
        let s = c.stats();
        // Every demand hit is counted; a miss is a demand read issued, or a demand for a record a
        // prefetch was already fetching.
        prop_assert_eq!(s.hits, hits);
        prop_assert!(s.misses >= issued && s.misses <= issued + pending, "{:?}", s);
        for l in 0..LAYERS {
            for e in 0..EXPERTS {
                if let Some(b) = c.get((l, e)) {
                    prop_assert!(b == record((l, e)).as_slice());
                }
            }
        }
    }
}

#[test]
fn a_pinned_expert_survives_a_sweep_through_every_other() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, f) = setup(dir.path(), 4, Policy::Lfru);
    assert_eq!(c.pin(&[(3, 7)]), 1);
    fetch(&mut c, f, (3, 7));
    for e in 0..EXPERTS {
        fetch(&mut c, f, (1, e));
        fetch(&mut c, f, (2, e));
    }
    assert!(c.contains((3, 7)));
}

/// A leased record is used on another thread while the cache goes on: its slot is neither evicted
/// nor read into until the lease is dropped, and its bytes stay the record's throughout.
#[test]
fn a_leased_slot_is_never_reused_while_the_lease_lives() {
    let dir = tempfile::tempdir().unwrap();
    let (mut cache, f) = setup(dir.path(), 2, Policy::Lru);
    let a: Key = (0, 1);
    assert_eq!(cache.request(a, loc(f, a), Priority::Demand).unwrap(), Status::Issued);
    let (k, r) = cache.wait_any(&[a]).unwrap();
    assert!(k == a && r.is_ok());
    let lease = cache.lease(a).unwrap();
    let worker = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(lease.bytes(), record(a).as_slice(), "the bytes stay the record's");
    });
    // Every other key wants a slot; only the one free slot can take them.
    for e in 2..EXPERTS {
        let k = (0, e);
        match cache.request(k, loc(f, k), Priority::Demand).unwrap() {
            Status::Issued | Status::Pending => {
                let _ = cache.wait_any(&[k]);
            }
            Status::Hit => {}
            Status::NoRoom => panic!("one slot is free"),
        }
        assert!(cache.contains(a), "the leased record is not evicted");
    }
    worker.join().unwrap();
    // The lease is gone: its slot can be taken again.
    let mut evicted = false;
    for e in 2..EXPERTS {
        let k = (1, e);
        if cache.request(k, loc(f, k), Priority::Demand).unwrap() == Status::Issued {
            let _ = cache.wait_any(&[k]);
        }
        evicted |= !cache.contains(a);
    }
    assert!(evicted, "after the lease the slot is reused");
}
