//! The generation API on the trained default model: what it streams is what the model computes,
//! and every stop (end of message, stop strings, max tokens, the context, cancellation) ends the
//! turn where it should.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k3_engine::{Engine, EngineOptions, Model};
use k3_generate::{Finish, GenerateParams, Generator};
use k3_text::tokenizer::Tokenizer;

fn default_model() -> Model {
    Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")).unwrap()
}

/// Runs one turn: (ids, text, finish).
fn turn(engine: &Engine<'_>, tok: &Tokenizer, prompt: &[u32], params: GenerateParams) -> (Vec<u32>, String, Finish) {
    let mut s = engine.session();
    let mut g = Generator::start(engine, &mut s, prompt, Some(tok), params, &mut |_, _| {}).unwrap();
    let (mut ids, mut text) = (Vec::new(), String::new());
    while let Some(t) = g.step(engine).unwrap() {
        ids.push(t.id);
        text.push_str(&t.text);
    }
    text.push_str(&g.flush());
    (ids, text, g.finish().unwrap())
}

#[test]
fn greedy_generation_is_the_models_argmax_and_its_text_is_the_tokens() {
    let m = default_model();
    let engine = Engine::load(&m).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let prompt = tok.encode("And God said");
    let params = GenerateParams { max_tokens: 12, ..GenerateParams::default() };
    let (ids, text, finish) = turn(&engine, &tok, &prompt, params);
    assert_eq!(finish, Finish::Length);
    assert_eq!(ids.len(), 12);
    // The same tokens, one forward at a time by hand.
    let mut s = engine.session();
    let mut logits = engine.forward(&mut s, &prompt, None).unwrap();
    let v = engine.vocab();
    for &want in &ids {
        let row = &logits[logits.len() - v..];
        let argmax = row.iter().enumerate().fold(0, |b, (i, x)| if *x > row[b] { i } else { b }) as u32;
        assert_eq!(argmax, want);
        logits = engine.forward(&mut s, &[want], None).unwrap();
    }
    assert_eq!(text, String::from_utf8_lossy(&tok.decode_bytes(&ids).unwrap()));
}

#[test]
fn a_stop_string_ends_the_text_before_it() {
    let m = default_model();
    let engine = Engine::load(&m).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let prompt = tok.encode("And God said");
    let (_, full, _) = turn(&engine, &tok, &prompt, GenerateParams { max_tokens: 40, ..GenerateParams::default() });
    // A stop string from the middle of what the model says.
    let at = full.char_indices().map(|(i, _)| i).find(|&i| i >= full.len() / 2).unwrap();
    let stop: String = full[at..].chars().take(4).collect();
    let first = full.find(&stop).unwrap();
    let params = GenerateParams { max_tokens: 40, stop_strings: vec![stop.clone()], ..GenerateParams::default() };
    let (_, text, finish) = turn(&engine, &tok, &prompt, params);
    assert_eq!(finish, Finish::StopString);
    assert_eq!(text, full[..first], "stops before {stop:?}");
}

#[test]
fn end_of_message_context_and_cancellation_end_the_turn() {
    let m = default_model();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let prompt = tok.encode("In the beginning");
    // The context: the prompt and five more tokens.
    let opts = EngineOptions { context: prompt.len() as u64 + 5, ..EngineOptions::default() };
    let engine = Engine::load_with(&m, opts).unwrap();
    let (ids, _, finish) =
        turn(&engine, &tok, &prompt, GenerateParams { max_tokens: 100, ..GenerateParams::default() });
    assert_eq!(finish, Finish::ContextFull);
    assert_eq!(ids.len(), 6, "five fed, the sixth printed but not fed");

    let engine = Engine::load(&m).unwrap();
    // An end-of-message id: the model's first greedy choice.
    let (first, _, _) = turn(&engine, &tok, &prompt, GenerateParams { max_tokens: 1, ..GenerateParams::default() });
    let params = GenerateParams { max_tokens: 10, stop_ids: first.clone(), ..GenerateParams::default() };
    let (ids, text, finish) = turn(&engine, &tok, &prompt, params);
    assert_eq!((ids, text.as_str(), finish), (first, "", Finish::Stop));

    let cancel = Arc::new(AtomicBool::new(false));
    let params = GenerateParams { max_tokens: 100, cancel: Some(cancel.clone()), ..GenerateParams::default() };
    let mut s = engine.session();
    let mut g = Generator::start(&engine, &mut s, &prompt, Some(&tok), params, &mut |_, _| {}).unwrap();
    for _ in 0..3 {
        g.step(&engine).unwrap().unwrap();
    }
    cancel.store(true, Ordering::SeqCst);
    assert!(g.step(&engine).unwrap().is_none());
    assert_eq!((g.finish(), g.produced()), (Some(Finish::Cancelled), 3));
}

/// A chat turn closes itself: the end-of-message id ends up in the session however the turn
/// ended, so the next turn starts where a finished one would.
#[test]
fn a_closed_turn_leaves_the_end_of_message_in_the_session() {
    let m = default_model();
    let engine = Engine::load(&m).unwrap();
    let tok = k3_generate::model_tokenizer(&m).unwrap().unwrap();
    let prompt = tok.encode("In the beginning");
    let end = 7;
    let params = GenerateParams { max_tokens: 4, close_turn: Some(end), ..GenerateParams::default() };
    let mut s = engine.session();
    let mut g = Generator::start(&engine, &mut s, &prompt, Some(&tok), params, &mut |_, _| {}).unwrap();
    let mut ids = Vec::new();
    while let Some(t) = g.step(&engine).unwrap() {
        ids.push(t.id);
    }
    assert_eq!(g.finish(), Some(Finish::Length));
    drop(g);
    // The same state by hand: prompt, the four tokens, then the end id.
    let mut by_hand = engine.session();
    engine.forward(&mut by_hand, &prompt, None).unwrap();
    for &id in ids.iter().chain([end].iter()) {
        engine.forward(&mut by_hand, &[id], None).unwrap();
    }
    assert!(s == by_hand, "the same recurrent state");
}

/// A prefill's last logits are the last row of the full logits, bit for bit.
#[test]
fn the_last_logits_are_the_last_row_of_all_logits() {
    for name in ["tiny-k3.waste", "tiny-kimi-linear.waste", "default.waste"] {
        let m = Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)).unwrap();
        let engine = Engine::load(&m).unwrap();
        let ids: Vec<u32> = (1..40).map(|i| i * 7 % 500).collect();
        let all = engine.forward(&mut engine.session(), &ids, None).unwrap();
        let last = engine.forward_last(&mut engine.session(), &ids).unwrap();
        assert!(last == all[all.len() - engine.vocab()..], "{name}");
    }
}
