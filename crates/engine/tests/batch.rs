//! Several sequences in one step, and speculative drafts verified then partly accepted: each
//! sequence's logits are the same bits as when it runs alone, and a session after `accept(j)` is
//! the session that ran only those `j` rows.

use std::path::{Path, PathBuf};

use k3_engine::{Engine, EngineOptions, Logits, Seq, Session};
use k3_format::Model;

mod common;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// The golden K3 and Kimi-Linear, and a synthetic K2 (MLA with RoPE on every layer, INT4 experts).
const MODELS: [&str; 3] = ["tiny-k3", "tiny-kimi-linear", "k2-tiny"];

fn model_path(name: &str) -> PathBuf {
    if name != "k2-tiny" {
        return fixtures().join(format!("{name}.waste"));
    }
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    common::synthetic(&DIR, "k2-tiny")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Token ids drawn from the model's vocabulary (bit-identity needs no particular text).
fn tokens(engine: &Engine<'_>, seed: u64, n: usize) -> Vec<u32> {
    let mut rng = k3_quant::rng::XorShift::new(seed);
    (0..n).map(|_| (rng.next_u64() % engine.vocab() as u64) as u32).collect()
}

/// One step of every session with its ids, each one's logits' bits appended to its output.
fn batch_step(engine: &Engine<'_>, sessions: &mut [Session], ids: &[&[u32]], outs: &mut [Vec<u32>]) {
    let mut seqs: Vec<Seq<'_>> = sessions.iter_mut().zip(ids).map(|(s, ids)| Seq::new(s, ids, Logits::All)).collect();
    for (out, l) in outs.iter_mut().zip(engine.forward_batch(&mut seqs).unwrap()) {
        out.extend(bits(&l));
    }
}

#[test]
fn a_batch_of_sequences_gives_each_the_bits_it_gets_alone() {
    for name in MODELS {
        let model = Model::open(model_path(name)).unwrap();
        for threads in [1, 2] {
            let engine = Engine::load_with(&model, EngineOptions { threads, ..EngineOptions::default() }).unwrap();
            // Three prompts of different lengths, then four decode steps of one token each.
            let prompts: Vec<Vec<u32>> =
                [5, 1, 9].iter().enumerate().map(|(i, &n)| tokens(&engine, i as u64 + 1, n)).collect();
            let steps: Vec<Vec<u32>> = (0..3).map(|i| tokens(&engine, 50 + i, 4)).collect();
            let alone: Vec<Vec<u32>> = (0..3)
                .map(|i| {
                    let mut s = engine.session();
                    let mut out = bits(&engine.forward(&mut s, &prompts[i], None).unwrap());
                    for &t in &steps[i] {
                        out.extend(bits(&engine.forward(&mut s, &[t], None).unwrap()));
                    }
                    out
                })
                .collect();
            let mut sessions: Vec<Session> = (0..3).map(|_| engine.session()).collect();
            let mut together: Vec<Vec<u32>> = vec![Vec::new(); 3];
            let prompt_refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            batch_step(&engine, &mut sessions, &prompt_refs, &mut together);
            for k in 0..4 {
                let step: Vec<&[u32]> = steps.iter().map(|s| std::slice::from_ref(&s[k])).collect();
                batch_step(&engine, &mut sessions, &step, &mut together);
            }
            for i in 0..3 {
                assert!(together[i] == alone[i], "{name}, {threads} threads: sequence {i} differs in a batch");
                assert_eq!(sessions[i].tokens(), prompts[i].len() + 4);
            }
            // `Last` is the last row of `All`.
            let mut s = engine.session();
            let mut seqs = [Seq::new(&mut s, &prompts[2], Logits::Last)];
            let last = engine.forward_batch(&mut seqs).unwrap().pop().unwrap();
            assert!(
                bits(&last) == alone[2][(prompts[2].len() - 1) * engine.vocab()..prompts[2].len() * engine.vocab()]
            );
        }
    }
}

#[test]
fn accepting_part_of_a_verified_chunk_is_running_only_that_part() {
    for name in MODELS {
        let model = Model::open(model_path(name)).unwrap();
        let engine = Engine::load(&model).unwrap();
        let v = engine.vocab();
        let prompt = tokens(&engine, 7, 6);
        let chunk = tokens(&engine, 8, 5);
        let after = tokens(&engine, 9, 3);
        for keep in 0..=chunk.len() {
            let mut spec = engine.session();
            engine.forward_last(&mut spec, &prompt).unwrap();
            let verified = engine.forward_drafts(&mut spec, &chunk).unwrap();
            engine.accept_drafts(&mut spec, keep).unwrap();
            let spec_after = engine.forward(&mut spec, &after, None).unwrap();

            let mut plain = engine.session();
            engine.forward_last(&mut plain, &prompt).unwrap();
            let ran = if keep > 0 { engine.forward(&mut plain, &chunk[..keep], None).unwrap() } else { Vec::new() };
            let plain_after = engine.forward(&mut plain, &after, None).unwrap();

            assert!(bits(&verified[..keep * v]) == bits(&ran), "{name}: the verified rows before {keep} differ");
            assert!(bits(&spec_after) == bits(&plain_after), "{name}: after accepting {keep} rows the logits differ");
            assert_eq!(spec.tokens(), prompt.len() + keep + after.len(), "{name}: position after accepting {keep}");
            assert_eq!(spec.stats.tokens, plain.stats.tokens, "{name}: tokens counted after accepting {keep}");
        }
    }
}

#[test]
fn a_session_awaiting_acceptance_refuses_other_steps() {
    let model = Model::open(fixtures().join("tiny-k3.waste")).unwrap();
    let engine = Engine::load(&model).unwrap();
    let mut s = engine.session();
    let err = engine.accept_drafts(&mut s, 1).unwrap_err().to_string();
    assert!(err.contains("no chunk of drafts"), "{err}");
    engine.forward_drafts(&mut s, &[1, 2, 3]).unwrap();
    let err = engine.forward(&mut s, &[4], None).unwrap_err().to_string();
    assert!(err.contains("awaiting `accept_drafts`"), "{err}");
    let err = engine.forward_drafts(&mut s, &[4]).unwrap_err().to_string();
    assert!(err.contains("awaiting `accept_drafts`"), "{err}");
    engine.accept_drafts(&mut s, 2).unwrap();
    assert_eq!(s.tokens(), 2);
    engine.forward(&mut s, &[4], None).unwrap();
}

#[test]
fn the_routing_trace_has_the_accepted_rows_only() {
    let model = Model::open(fixtures().join("tiny-k3.waste")).unwrap();
    let engine = Engine::load(&model).unwrap();
    let ids = tokens(&engine, 3, 6);
    let mut plain = engine.session();
    plain.routing_trace = Some(Vec::new());
    engine.forward(&mut plain, &ids[..4], None).unwrap();
    let mut spec = engine.session();
    spec.routing_trace = Some(Vec::new());
    engine.forward(&mut spec, &ids[..2], None).unwrap();
    engine.forward_drafts(&mut spec, &ids[2..]).unwrap();
    engine.accept_drafts(&mut spec, 2).unwrap();
    // A chunk's trace is layer by layer; compare position by position.
    let sorted = |s: &Session| {
        let mut t = s.routing_trace.clone().unwrap();
        t.sort_by_key(|r| (r.position, r.layer));
        t
    };
    assert!(!sorted(&plain).is_empty());
    assert_eq!(sorted(&spec), sorted(&plain));
}
