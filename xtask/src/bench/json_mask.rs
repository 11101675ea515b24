//! `cargo xtask bench json-mask`: what constrained JSON costs per generated token — the mask over
//! the whole vocabulary (every token's text tried against the answer so far) for `json_object`
//! and for a `json_schema` (pydantic's, from fixtures/json-schema/cases.json), at positions
//! along a valid answer, next to the sampling the step does anyway, timed in the same run, on a
//! 200k-token vocabulary (o200k; K3's is 164k) and on the default model's 4,096; each mask two
//! ways, every token's text tried alone and the vocabulary walked as a trie (what the decoder
//! does), the same allowed count asserted.

use std::sync::Arc;

use anyhow::{Context, Result};
use k3_generate::sample::{Sampler, SamplerConfig};
use k3_text::json_prefix::JsonPrefix;
use k3_text::json_schema::{JsonSchema, SchemaLimits};
use k3_text::mask::{MaskJob, TokenTrie};
use k3_text::tokenizer::{KIMI_PATTERN, Tokenizer};
use serde_json::{Value, json};

use super::{median, time};

/// Positions along the answer where a mask is timed.
const POSITIONS: usize = 8;

/// Median seconds of `f` over `reps` runs.
fn timed(reps: usize, mut f: impl FnMut()) -> f64 {
    median((0..reps).map(|_| time(&mut f)).collect())
}

fn vocab(texts: &[Option<String>], reps: usize, schema: &Arc<JsonSchema>, doc: &str) -> Value {
    let trie = Arc::new(TokenTrie::new(texts));
    let cuts: Vec<usize> = (0..POSITIONS)
        .map(|i| i * doc.len() / POSITIONS)
        .map(|mut c| {
            while !doc.is_char_boundary(c) {
                c += 1;
            }
            c
        })
        .collect();
    let (mut object, mut schema_s, mut object_t, mut schema_t) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &c in &cuts {
        let mut o = JsonPrefix::for_generation();
        let mut s = schema.prefix();
        assert!(o.push_str(&doc[..c]) && s.push_str(&doc[..c]), "the document is valid");
        let mask =
            |accepts: &dyn Fn(&str) -> bool| texts.iter().flatten().filter(|t| !t.is_empty() && accepts(t)).count();
        object.push(timed(reps, || {
            std::hint::black_box(mask(&|t| o.accepts(t)));
        }));
        schema_s.push(timed(reps, || {
            std::hint::black_box(mask(&|t| s.accepts(t)));
        }));
        let (oj, sj) = (MaskJob::for_object(o.clone(), trie.clone()), MaskJob::for_schema(s.clone(), trie.clone()));
        assert_eq!(oj.run_now().count(), mask(&|t| o.accepts(t)), "the trie allows what the loop allows");
        assert_eq!(sj.run_now().count(), mask(&|t| s.accepts(t)), "the trie allows what the loop allows");
        object_t.push(timed(reps, || {
            std::hint::black_box(oj.run_now());
        }));
        schema_t.push(timed(reps, || {
            std::hint::black_box(sj.run_now());
        }));
    }
    let logits: Vec<f32> = (0..texts.len()).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let mut sampler =
        Sampler::new(SamplerConfig { temperature: 0.6, top_p: 0.95, seed: 1, ..SamplerConfig::default() })
            .expect("valid settings");
    let sample = timed(reps, || {
        std::hint::black_box(sampler.sample(&logits));
    });
    let (object, schema_s) = (median(object), median(schema_s));
    let (object_t, schema_t) = (median(object_t), median(schema_t));
    json!({"vocab": texts.len(), "json_object_ms": object * 1e3, "json_schema_ms": schema_s * 1e3,
           "json_object_trie_ms": object_t * 1e3, "json_schema_trie_ms": schema_t * 1e3,
           "sample_ms": sample * 1e3, "json_schema_over_sample": schema_t / sample,
           "trie_over_loop": schema_t / schema_s})
}

pub fn run(reps: usize, json_out: bool) -> Result<Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cases: Value = serde_json::from_slice(&std::fs::read(root.join("fixtures/json-schema/cases.json"))?)?;
    let case =
        cases.as_array().and_then(|c| c.iter().find(|c| c["name"] == "work/openai-strict")).context("the case")?;
    let schema =
        Arc::new(JsonSchema::compile(&case["schema"], &SchemaLimits::new(128 << 10, 16)).map_err(anyhow::Error::msg)?);
    let doc =
        case["docs"].as_array().and_then(|d| d.iter().find(|d| d["valid"] == true)).context("a valid document")?;
    let doc = doc["text"].as_str().context("text")?;
    let ranks = std::fs::read(root.join("fixtures/tokenizer/o200k_base.tiktoken"))?;
    let big = Tokenizer::from_tiktoken(&ranks, None, KIMI_PATTERN)?;
    let m = k3_engine::Model::open(root.join("fixtures/default.waste"))?;
    let small = k3_generate::model_tokenizer(&m).context("the default model's tokenizer")??;
    let rows = vec![vocab(big.token_texts(), reps, &schema, doc), vocab(small.token_texts(), reps, &schema, doc)];
    if !json_out {
        println!(
            "mask per generated token (median over {POSITIONS} positions along a {}-byte answer, {reps} reps)",
            doc.len()
        );
        println!(
            "{:>8} {:>22} {:>22} {:>11} {:>13} {:>16}",
            "vocab", "json_object ms (trie)", "json_schema ms (trie)", "sample ms", "trie / loop", "trie / sample"
        );
        let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(0.0);
        for r in &rows {
            println!(
                "{:>8} {:>13.2} ({:>6.2}) {:>13.2} ({:>6.2}) {:>11.3} {:>12.2}x {:>15.1}x",
                r["vocab"],
                f(r, "json_object_ms"),
                f(r, "json_object_trie_ms"),
                f(r, "json_schema_ms"),
                f(r, "json_schema_trie_ms"),
                f(r, "sample_ms"),
                f(r, "trie_over_loop"),
                f(r, "json_schema_over_sample")
            );
        }
    }
    Ok(json!({"rows": rows, "document_bytes": doc.len()}))
}
