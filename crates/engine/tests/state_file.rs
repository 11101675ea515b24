//! A session's state written to a state file and read back is the same state, and resumes to the
//! same logits; a damaged, truncated, foreign or other-version file is refused with its reason.

use std::path::Path;

use k3_engine::{ActivationPrecision, Engine, Model, StateFileError};

fn open(name: &str) -> Model {
    Model::open(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(name)).unwrap()
}

const PROMPT: [u32; 9] = [5, 77, 300, 120, 9, 44, 200, 301, 17];

#[test]
fn a_saved_state_resumes_as_the_session_it_was() {
    for name in ["default.waste", "tiny-k3.waste"] {
        let model = open(name);
        let engine = Engine::load(&model).unwrap();
        let mut s = engine.session();
        let logits = engine.forward_last(&mut s, &PROMPT[..6]).unwrap();
        let bytes = engine.state_file(&s, Some(&logits));
        let back = engine.read_state_file(&bytes).unwrap();
        assert!(back.session == s, "{name}: the same layers and tokens");
        assert_eq!(back.logits.as_deref(), Some(&logits[..]), "{name}");
        // Both go on to the same logits (a fork is what the prompt cache resumes today).
        let (mut a, mut b) = (back.session, engine.fork(&s).unwrap());
        let (la, lb) =
            (engine.forward_last(&mut a, &PROMPT[6..]).unwrap(), engine.forward_last(&mut b, &PROMPT[6..]).unwrap());
        assert_eq!(la, lb, "{name}");
        // Without logits.
        let none = engine.read_state_file(&engine.state_file(&s, None)).unwrap();
        assert!(none.logits.is_none() && none.session == s);
    }
}

#[test]
fn a_damaged_or_truncated_file_is_refused() {
    let model = open("default.waste");
    let engine = Engine::load(&model).unwrap();
    let mut s = engine.session();
    engine.forward_last(&mut s, &PROMPT).unwrap();
    let bytes = engine.state_file(&s, None);
    for at in [bytes.len() / 3, bytes.len() / 2, bytes.len() - 20] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        assert!(matches!(engine.read_state_file(&bad), Err(StateFileError::Checksum)), "byte {at} flipped");
    }
    for len in [0, 5, 8, 12, 20, 40, bytes.len() / 2, bytes.len() - 1] {
        let err = engine.read_state_file(&bytes[..len]).expect_err("a truncated file");
        assert!(
            matches!(err, StateFileError::Magic | StateFileError::Truncated { .. } | StateFileError::Checksum),
            "{len} bytes: {err}"
        );
    }
    let mut newer = bytes.clone();
    newer[8] = 2;
    assert!(matches!(engine.read_state_file(&newer), Err(StateFileError::Version { found: 2 })));
}

#[test]
fn another_models_state_is_refused() {
    let (a, b) = (open("default.waste"), open("tiny-kimi-linear.waste"));
    let (ea, eb) = (Engine::load(&a).unwrap(), Engine::load(&b).unwrap());
    assert_ne!(ea.fingerprint(), eb.fingerprint());
    let mut s = eb.session();
    eb.forward_last(&mut s, &PROMPT[..3]).unwrap();
    let err = ea.read_state_file(&eb.state_file(&s, None)).expect_err("another model's state");
    assert!(matches!(err, StateFileError::Model { .. }), "{err}");
    assert!(err.to_string().contains("another model"), "{err}");
}

/// A state saved with fewer experts per token (its layers computed from other experts) is not
/// resumed by an engine routing to all of them, nor the other way round.
#[test]
fn a_state_saved_under_other_routing_options_is_refused() {
    let model = open("default.waste");
    let full = Engine::load(&model).unwrap();
    let opts = k3_engine::EngineOptions { experts_per_token: Some(2), ..Default::default() };
    let fewer = Engine::load_with(&model, opts).unwrap();
    assert_ne!(full.fingerprint(), fewer.fingerprint());
    let mut s = fewer.session();
    fewer.forward_last(&mut s, &PROMPT[..4]).unwrap();
    let err = full.read_state_file(&fewer.state_file(&s, None)).expect_err("saved with 2 experts a token");
    assert!(err.to_string().contains("other routing options"), "{err}");
    let mut t = full.session();
    full.forward_last(&mut t, &PROMPT[..4]).unwrap();
    assert!(fewer.read_state_file(&full.state_file(&t, None)).is_err());
    assert!(fewer.read_state_file(&fewer.state_file(&s, None)).is_ok());
}

/// A compact MLA cache and rounded activations compute other states: their fingerprints differ
/// from the exact engine's, so a kept state is never resumed under the other setting; under its
/// own, a bf16 cache's state resumes with the bits of continuing the session itself.
#[test]
fn a_state_saved_with_another_cache_type_or_precision_is_refused() {
    let model = open("default.waste");
    let exact = Engine::load(&model).unwrap();
    let opts = |kv, activations| k3_engine::EngineOptions { kv_cache: Some(kv), activations, ..Default::default() };
    let bf16 = Engine::load_with(&model, opts(k3_engine::KvCacheType::Bf16, ActivationPrecision::Exact)).unwrap();
    let int8 = Engine::load_with(&model, opts(k3_engine::KvCacheType::Int8, ActivationPrecision::Exact)).unwrap();
    let rounded = Engine::load_with(&model, opts(k3_engine::KvCacheType::F32, ActivationPrecision::All)).unwrap();
    let prints = [&exact, &bf16, &int8, &rounded].map(|e| e.fingerprint());
    for i in 0..4 {
        for j in i + 1..4 {
            assert_ne!(prints[i], prints[j], "engines {i} and {j}");
        }
    }
    let mut s = bf16.session();
    bf16.forward_last(&mut s, &PROMPT[..4]).unwrap();
    assert!(exact.read_state_file(&bf16.state_file(&s, None)).is_err());
    let mut resumed = bf16.read_state_file(&bf16.state_file(&s, None)).unwrap().session;
    let a = bf16.forward_last(&mut s, &PROMPT[4..6]).unwrap();
    let b = bf16.forward_last(&mut resumed, &PROMPT[4..6]).unwrap();
    assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
}
