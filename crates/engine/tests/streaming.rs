//! Streaming decode: the logits never depend on how the expert reads are scheduled.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k3_engine::{Engine, EngineOptions};
use k3_format::Model;
use k3_io::Policy;
use k3_io::reader::Fault;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn ids(name: &str) -> Vec<u32> {
    let p = fixtures().join(format!("golden/{name}/golden/ids.txt"));
    std::fs::read_to_string(p).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect()
}

fn run(model: &Model, opts: EngineOptions, ids: &[u32], chunk: usize) -> Vec<u32> {
    let engine = Engine::load_with(model, opts).unwrap();
    let mut s = engine.session();
    let mut out = Vec::new();
    // Twice over, so the second pass meets a warm cache.
    for _ in 0..2 {
        for c in ids.chunks(chunk) {
            out.extend(engine.forward(&mut s, c, None).unwrap().iter().map(|v| v.to_bits()));
        }
    }
    out
}

fn slot_budget(model: &Model, slots: u64) -> u64 {
    let engine = Engine::load(model).unwrap();
    let p = *engine.plan();
    p.fixed_bytes() + slots * p.slot_bytes
}

#[test]
fn logits_are_bit_identical_however_reads_are_scheduled() {
    for name in ["tiny-k3", "tiny-kimi-linear"] {
        let model = Model::open(fixtures().join(format!("{name}.waste"))).unwrap();
        let ids = ids(name);
        let base = run(&model, EngineOptions::default(), &ids, 32);
        let delays = Arc::new(AtomicU64::new(7));
        let d = delays.clone();
        let variants: Vec<(&str, EngineOptions, usize)> = vec![
            ("no overlap", EngineOptions { overlap: false, ..EngineOptions::default() }, 32),
            ("no lookahead", EngineOptions { lookahead: false, ..EngineOptions::default() }, 32),
            ("lru", EngineOptions { policy: Policy::Lru, ..EngineOptions::default() }, 32),
            ("lfu", EngineOptions { policy: Policy::Lfu, ..EngineOptions::default() }, 32),
            ("two slots", EngineOptions { mem_budget: Some(slot_budget(&model, 2)), ..EngineOptions::default() }, 32),
            (
                "five slots, depth 1",
                EngineOptions { mem_budget: Some(slot_budget(&model, 5)), queue_depth: 1, ..EngineOptions::default() },
                32,
            ),
            ("chunks of 3", EngineOptions::default(), 3),
            (
                "random read delays",
                EngineOptions {
                    fault: Some(Arc::new(move |_, _, _| {
                        let mut x = d.fetch_add(0x9E37_79B9, Ordering::Relaxed);
                        x ^= x << 13;
                        x ^= x >> 7;
                        std::thread::sleep(std::time::Duration::from_micros(x % 3000));
                        None::<Fault>
                    })),
                    ..EngineOptions::default()
                },
                32,
            ),
        ];
        for (what, opts, chunk) in variants {
            assert!(run(&model, opts, &ids, chunk) == base, "{name}: {what} changed the logits");
        }
        // Any number of compute threads, prefilled at once or decoded token by token, with reads
        // overlapped, the lookahead on and reads landing late at random.
        for threads in [1, 2, 3, 7] {
            for chunk in [32, 1] {
                let d = delays.clone();
                let opts = EngineOptions {
                    threads,
                    fault: Some(Arc::new(move |_, _, _| {
                        let mut x = d.fetch_add(0x9E37_79B9, Ordering::Relaxed);
                        x ^= x << 13;
                        x ^= x >> 7;
                        std::thread::sleep(std::time::Duration::from_micros(x % 2000));
                        None::<Fault>
                    })),
                    ..EngineOptions::default()
                };
                assert!(run(&model, opts, &ids, chunk) == base, "{name}: {threads} threads, chunks of {chunk}");
            }
        }
        drop(delays);
    }
}

#[test]
fn an_io_error_mid_decode_ends_the_run_with_a_clear_error() {
    let model = Model::open(fixtures().join("tiny-k3.waste")).unwrap();
    let reads = Arc::new(AtomicU64::new(0));
    let r = reads.clone();
    let opts = EngineOptions {
        fault: Some(Arc::new(move |_, _, _| (r.fetch_add(1, Ordering::Relaxed) == 9).then_some(Fault::Errno(5)))),
        lookahead: false,
        ..EngineOptions::default()
    };
    let engine = Engine::load_with(&model, opts).unwrap();
    let err = engine.forward(&mut engine.session(), &ids("tiny-k3"), None).unwrap_err().to_string();
    assert!(err.contains("experts-00000.waste") && err.contains("Input/output error"), "{err}");
}

#[test]
fn a_budget_too_small_names_the_minimum() {
    let model = Model::open(fixtures().join("tiny-k3.waste")).unwrap();
    let need = slot_budget(&model, 2);
    let err = Engine::load_with(&model, EngineOptions { mem_budget: Some(need - 1), ..EngineOptions::default() })
        .unwrap_err()
        .to_string();
    assert!(err.contains("too small") && err.contains("needs at least"), "{err}");
    assert!(Engine::load_with(&model, EngineOptions { mem_budget: Some(need), ..EngineOptions::default() }).is_ok());
}

#[test]
fn statistics_count_what_happened() {
    let model = Model::open(fixtures().join("tiny-k3.waste")).unwrap();
    // Room for every expert of the model: the second pass must not read anything.
    let engine = Engine::load_with(
        &model,
        EngineOptions { mem_budget: Some(slot_budget(&model, 160)), ..EngineOptions::default() },
    )
    .unwrap();
    let mut s = engine.session();
    let ids = ids("tiny-k3");
    engine.forward(&mut s, &ids, None).unwrap();
    let first = s.stats;
    assert_eq!(first.tokens, 8);
    assert!(first.cache.misses > 0 && first.cache.bytes_read > 0);
    // The same prompt again, from the start (a new session over the same engine and cache).
    let mut s2 = engine.session();
    engine.forward(&mut s2, &ids, None).unwrap();
    let second = s2.stats;
    assert_eq!(second.tokens, 8);
    assert!(second.cache.hits > first.cache.hits, "the same prompt again hits the cache");
    assert_eq!(second.cache.misses, first.cache.misses, "{second:?}");
    assert_eq!(second.cache.bytes_read, first.cache.bytes_read);
}

#[test]
fn synthetic_k3_and_k2_tiny_run_in_every_expert_encoding() {
    use k3_convert::synth::{SynthExperts, preset, synth};
    for (name, experts) in [
        ("k3-tiny", SynthExperts::Mxfp4),
        ("k3-tiny", SynthExperts::Vq3),
        ("k2-tiny", SynthExperts::Int4),
        ("k2-tiny", SynthExperts::Mxfp4),
    ] {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("m");
        synth(&preset(name).unwrap(), experts, &dir, &mut |_| {}).unwrap();
        let model = Model::open(&dir).unwrap();
        assert!(model.verify(&mut |_| {}).is_empty());
        let engine = Engine::load(&model).unwrap();
        let logits = engine.forward(&mut engine.session(), &[1, 2, 3, 4, 5], None).unwrap();
        assert_eq!(logits.len(), 5 * 512);
        assert!(logits.iter().all(|v| v.is_finite()), "{experts:?}");
        let spread = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(spread > 1e-3 && spread < 1e3, "{name} {experts:?}: logits of magnitude {spread}");
        // Token by token (RoPE positions for K2) gives the chunk's last row bit for bit.
        let mut s = engine.session();
        let mut last = Vec::new();
        for id in 1..=5 {
            last = engine.forward(&mut s, &[id], None).unwrap();
        }
        assert_eq!(last, logits[4 * 512..], "{name} {experts:?}");
    }
}
