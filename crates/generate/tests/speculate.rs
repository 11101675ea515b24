//! Speculative decoding changes nothing but speed: with drafts from the context verified in one
//! step, every turn gives the same tokens, text, finish and session state as plain decoding —
//! greedy or sampled, on both golden models and the trained default model, whatever ends the turn.

use std::path::{Path, PathBuf};

use k3_engine::{Engine, EngineOptions, Model, Session};
use k3_generate::sample::SamplerConfig;
use k3_generate::speculate::SpecStats;
use k3_generate::{Finish, GenerateParams, Generator};
use k3_text::tokenizer::Tokenizer;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

struct Turn {
    ids: Vec<u32>,
    text: String,
    finish: Finish,
    session: Session,
    spec: SpecStats,
}

fn turn(engine: &Engine<'_>, tok: Option<&Tokenizer>, prompt: &[u32], params: GenerateParams) -> Turn {
    let mut session = engine.session();
    let mut g = Generator::start(engine, &mut session, prompt, tok, params, &mut |_, _| {}).unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(t) = g.step(engine).unwrap() {
        ids.push(t.id);
        text.push_str(&t.text);
    }
    text.push_str(&g.flush());
    let (finish, spec) = (g.finish().unwrap(), g.spec);
    drop(g);
    Turn { ids, text, finish, session, spec }
}

/// The turn with and without speculation: the same in every respect; the speculative one's
/// statistics.
fn same_either_way(engine: &Engine<'_>, tok: Option<&Tokenizer>, prompt: &[u32], params: GenerateParams) -> SpecStats {
    let plain = turn(engine, tok, prompt, GenerateParams { speculate: 0, ..params.clone() });
    let spec = turn(engine, tok, prompt, GenerateParams { speculate: 4, ..params });
    assert_eq!(spec.ids, plain.ids, "tokens");
    assert_eq!(spec.text, plain.text, "text");
    assert_eq!(spec.finish, plain.finish, "finish");
    assert!(spec.session == plain.session, "session state after the turn");
    assert_eq!(spec.session.ids(), plain.session.ids());
    assert_eq!(plain.spec, SpecStats::default());
    spec.spec
}

/// A passage said twice and begun a third time: copying is the natural continuation.
const COPY: &str = "In the beginning God created the heaven and the earth. And the earth was without form, and void; \
and darkness was upon the face of the deep. In the beginning God created the heaven and the earth. And the earth \
was without form, and void; and darkness was upon the face of the deep. In the beginning God created";

#[test]
fn greedy_speculation_is_plain_decoding_on_the_default_model() {
    let m = Model::open(fixtures().join("default.waste")).unwrap();
    let engine = Engine::load(&m).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let s = same_either_way(
        &engine,
        Some(&tok),
        &tok.encode(COPY),
        GenerateParams { max_tokens: 48, ..Default::default() },
    );
    eprintln!("copy-heavy: {s:?}");
    assert!(s.verifies > 0 && s.accepted > 0, "drafts were verified and some accepted: {s:?}");
    let free = tok.encode("And God said");
    let s = same_either_way(&engine, Some(&tok), &free, GenerateParams { max_tokens: 48, ..Default::default() });
    eprintln!("free text: {s:?}");
}

#[test]
fn sampled_speculation_draws_the_same_tokens_for_a_seed() {
    let m = Model::open(fixtures().join("default.waste")).unwrap();
    let engine = Engine::load(&m).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let prompt = tok.encode(COPY);
    let mut total = SpecStats::default();
    for seed in 0..4 {
        let sampler = SamplerConfig { temperature: 0.8, top_k: 40, top_p: 0.95, seed, ..SamplerConfig::default() };
        let s = same_either_way(
            &engine,
            Some(&tok),
            &prompt,
            GenerateParams { max_tokens: 32, sampler, ..Default::default() },
        );
        total.accepted += s.accepted;
        total.drafted += s.drafted;
    }
    assert!(total.accepted > 0, "some sampled drafts were accepted: {total:?}");
}

#[test]
fn every_stop_ends_a_speculative_turn_where_a_plain_one_ends() {
    let m = Model::open(fixtures().join("default.waste")).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let prompt = tok.encode(COPY);
    let engine = Engine::load(&m).unwrap();
    let full = turn(&engine, Some(&tok), &prompt, GenerateParams { max_tokens: 40, ..Default::default() });
    // A stop string from the middle of what the model copies, a stop id (its first occurrence
    // after a few tokens), max tokens, a chat turn's close: each lands inside a verified chunk.
    let stop: String = full.text.chars().skip(full.text.chars().count() / 2).take(5).collect();
    let fresh = (4..full.ids.len()).find(|&i| !full.ids[..i].contains(&full.ids[i])).unwrap();
    let mid = full.ids[fresh];
    let cases = [
        GenerateParams { max_tokens: 40, stop_strings: vec![stop], ..Default::default() },
        GenerateParams { max_tokens: 40, stop_ids: vec![mid], ..Default::default() },
        GenerateParams { max_tokens: 40, stop_ids: vec![mid], close_turn: Some(mid), ..Default::default() },
        GenerateParams { max_tokens: 13, ..Default::default() },
        GenerateParams { max_tokens: 13, close_turn: Some(7), ..Default::default() },
    ];
    for (i, params) in cases.into_iter().enumerate() {
        let s = same_either_way(&engine, Some(&tok), &prompt, params);
        assert!(s.accepted > 0, "case {i}: drafts were accepted ({s:?})");
    }
    // The context ends inside a verified chunk: it is never passed.
    for extra in [3, 6] {
        let opts = EngineOptions { context: prompt.len() as u64 + extra, ..EngineOptions::default() };
        let engine = Engine::load_with(&m, opts).unwrap();
        let params = GenerateParams { max_tokens: 100, ..Default::default() };
        same_either_way(&engine, Some(&tok), &prompt, params);
    }
}

#[test]
fn greedy_speculation_is_plain_decoding_on_the_golden_models() {
    for name in ["tiny-k3", "tiny-kimi-linear"] {
        let m = Model::open(fixtures().join(format!("{name}.waste"))).unwrap();
        let engine = Engine::load(&m).unwrap();
        // A repeated pattern gives the drafter something to find; random weights decide what is
        // accepted.
        let prompt: Vec<u32> = (0..30).map(|i| [5, 9, 13, 2, 7][i % 5]).collect();
        let s = same_either_way(&engine, None, &prompt, GenerateParams { max_tokens: 24, ..Default::default() });
        assert!(s.verifies > 0, "{name}: drafts were verified ({s:?})");
    }
}

/// The acceptance rule, statistically: a draft `d` is kept when it is the token sampled, so it
/// is kept with probability p(d) (the standard rule's min(1, p/q) for a draft with q(d) = 1), and
/// the token that replaces a rejected draft follows p with `d` taken out, renormalized (the
/// standard rule's residual). p is computed here in f64 from the logits, not by the sampler.
/// Seeded, so the test is deterministic; the bounds are 4.5 standard errors and the chi-square
/// 99.99% point, so a correct sampler passes for any seed.
#[test]
fn a_draft_is_kept_with_its_probability_and_a_rejection_draws_the_residual() {
    let logits = [1.2f32, 0.3, -0.5, 2.0, 0.9, -1.5, 0.0, 1.6];
    let temperature = 0.7;
    let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / temperature).exp()).collect();
    let z: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|x| x / z).collect();
    let n = 60_000;
    for d in [3u32, 0, 5] {
        let cfg =
            SamplerConfig { temperature: temperature as f32, seed: 17 + u64::from(d), ..SamplerConfig::default() };
        let mut sampler = k3_generate::sample::Sampler::new(cfg).unwrap();
        let (mut kept, mut residual) = (0usize, [0usize; 8]);
        for _ in 0..n {
            let x = sampler.sample(&logits);
            if x == d {
                kept += 1;
            } else {
                residual[x as usize] += 1;
            }
        }
        let pd = p[d as usize];
        let se = (pd * (1.0 - pd) / n as f64).sqrt();
        let rate = kept as f64 / n as f64;
        assert!((rate - pd).abs() < 4.5 * se, "draft {d}: kept {rate:.4}, p(d) {pd:.4}");
        let rejected = (n - kept) as f64;
        let chi2: f64 = (0..8)
            .filter(|&i| i != d as usize)
            .map(|i| {
                let want = rejected * p[i] / (1.0 - pd);
                (residual[i] as f64 - want).powi(2) / want
            })
            .sum();
        // 6 degrees of freedom: P(chi2 > 27.9) = 1e-4.
        assert!(chi2 < 27.9, "draft {d}: the residual's chi-square {chi2:.1}");
    }
}
