//! States kept where later requests part from a prompt, over HTTP on the default model: the same
//! request again (Regenerate), a new conversation with the same system prompt, and the last
//! message edited and sent again each resume from a kept state (`cached_tokens`), and answer as a
//! server without a prompt cache does.

use std::path::{Path, PathBuf};

use axum::Router;
use k3_engine::Model;
use k3_server::ServerOptions;
use serde_json::{Value, json};

mod common;
use common::{ask, cached, content, server};

fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste")
}

const SYSTEM: &str = "You are a careful storyteller. Every answer is one short paragraph in the style of an old \
    chronicle, with plain words, no lists and no headings, and it never repeats the question.";

/// Both servers: with the prompt cache, and without one (the reference answers).
async fn servers() -> (Router, Router) {
    let cached = server(ServerOptions::new(default_model())).await;
    let fresh = server(ServerOptions { prompt_cache_ram: 0, ..ServerOptions::new(default_model()) }).await;
    (cached, fresh)
}

fn system_and(user: &str) -> Value {
    json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
}

/// The same request twice: the second starts from the state after the whole prompt and its
/// logits, so it prefills nothing, and a seeded sample is the one a fresh prefill gives.
#[tokio::test]
async fn the_same_request_again_prefills_nothing() {
    let (cached_server, fresh) = servers().await;
    for body in [
        json!({"messages": system_and("And God said"), "max_tokens": 16, "temperature": 0}),
        json!({"messages": system_and("Tell of the flood"), "max_tokens": 16, "temperature": 0.9, "seed": 7}),
    ] {
        let first = ask(&cached_server, &body).await;
        let again = ask(&cached_server, &body).await;
        let reference = ask(&fresh, &body).await;
        let prompt = again["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(cached(&again), prompt, "the whole prompt was kept: {}", again["usage"]);
        assert_eq!(content(&again), content(&reference), "{body}");
        assert_eq!(content(&first), content(&reference), "{body}");
        assert_eq!(cached(&reference), 0);
    }
}

/// A new conversation with the same system prompt resumes the state kept at the end of the
/// system turn: at least the system prompt's tokens are not prefilled again.
#[tokio::test]
async fn a_new_conversation_with_the_same_system_prompt_resumes_it() {
    let (cached_server, fresh) = servers().await;
    let tok = k3_generate::model_tokenizer(&Model::open(default_model()).unwrap()).unwrap().unwrap();
    let system_tokens = tok.encode(SYSTEM).len() as u64;
    let first =
        ask(&cached_server, &json!({"messages": system_and("And God said"), "max_tokens": 8, "temperature": 0})).await;
    assert_eq!(cached(&first), 0);
    let body = json!({"messages": system_and("What came after the light?"), "max_tokens": 16, "temperature": 0});
    let second = ask(&cached_server, &body).await;
    let hit = cached(&second);
    assert!(hit >= system_tokens, "the system turn ({system_tokens} tokens of text) was resumed: {hit}");
    assert!(hit < second["usage"]["prompt_tokens"].as_u64().unwrap(), "the new question was prefilled");
    assert_eq!(content(&second), content(&ask(&fresh, &body).await));
}

/// The last message edited and sent again resumes the state kept after the message before it.
#[tokio::test]
async fn an_edited_last_message_resumes_the_conversation_before_it() {
    let (cached_server, fresh) = servers().await;
    let history = |last: &str| {
        json!({"messages": [
            {"role": "user", "content": "And God said"},
            {"role": "assistant", "content": "Let there be light: and there was light."},
            {"role": "user", "content": last},
        ], "max_tokens": 16, "temperature": 0})
    };
    let first = ask(&cached_server, &history("What did God see?")).await;
    assert_eq!(cached(&first), 0);
    let edited = history("What did God call the light?");
    let second = ask(&cached_server, &edited).await;
    let earlier =
        ask(&fresh, &json!({"messages": [{"role": "user", "content": "And God said"}], "max_tokens": 1})).await;
    let hit = cached(&second);
    assert!(
        hit > earlier["usage"]["prompt_tokens"].as_u64().unwrap(),
        "the first two messages were resumed: {hit} of {}",
        second["usage"]
    );
    assert!(hit < second["usage"]["prompt_tokens"].as_u64().unwrap());
    assert_eq!(content(&second), content(&ask(&fresh, &edited).await));
}
