//! Which tokens may come next in a constrained answer (`json_object`, `json_schema`, a strict
//! call's arguments): the vocabulary's texts as a trie, walked with the checker's state cloned
//! per node, so a prefix the checker refuses prunes every token that starts with it (one check
//! of `"` instead of one per token beginning with a quote). The trie is built once per tokenizer
//! ([`crate::tokenizer::Tokenizer::token_trie`]) and shared; a [`MaskJob`] owns all it needs, so
//! a server computes the next mask on another thread while the batch steps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::json_prefix::JsonPrefix;
use crate::json_schema::SchemaPrefix;

/// What an answer is checked against, character by character.
#[derive(Debug, Clone)]
pub enum Shape {
    Object(JsonPrefix),
    Schema(Box<SchemaPrefix>),
}

impl Shape {
    #[cfg(test)]
    fn accepts(&self, s: &str) -> bool {
        match self {
            Shape::Object(p) => p.accepts(s),
            Shape::Schema(p) => p.accepts(s),
        }
    }

    pub fn push_str(&mut self, s: &str) -> bool {
        match self {
            Shape::Object(p) => p.push_str(s),
            Shape::Schema(p) => p.push_str(s),
        }
    }

    pub fn complete(&self) -> bool {
        match self {
            Shape::Object(p) => p.complete(),
            Shape::Schema(p) => p.complete(),
        }
    }

    /// Takes `c`, or spoils the state (the trie walk pushes onto a copy it drops on a refusal).
    fn push_char(&mut self, c: char) -> bool {
        match self {
            Shape::Object(p) => p.push_char(c),
            Shape::Schema(p) => p.push_char(c),
        }
    }
}

/// A trie node: the character on the edge into it, its children (contiguous: the nodes are
/// numbered breadth first) and the ids whose text ends here.
#[derive(Debug, Clone, Copy)]
struct Node {
    ch: char,
    kids: (u32, u32),
    ids: (u32, u32),
}

/// Every token's text (those with a non-empty text) as a trie; node 0 is the root.
#[derive(Debug)]
pub struct TokenTrie {
    nodes: Vec<Node>,
    ids: Vec<u32>,
    /// Ids the tokenizer knows (texts or not): the mask's length.
    vocab: usize,
}

impl TokenTrie {
    /// The trie of `texts` (id `i`'s text alone; `None` or empty: never allowed by a mask).
    pub fn new(texts: &[Option<String>]) -> TokenTrie {
        // Built with per-node child lists, then renumbered breadth first so children are
        // contiguous.
        let mut kids: Vec<Vec<(char, usize)>> = vec![Vec::new()];
        let mut ends: Vec<Vec<u32>> = vec![Vec::new()];
        for (id, text) in texts.iter().enumerate() {
            let Some(text) = text.as_deref().filter(|t| !t.is_empty()) else { continue };
            let mut at = 0;
            for c in text.chars() {
                at = match kids[at].iter().find(|(k, _)| *k == c) {
                    Some(&(_, n)) => n,
                    None => {
                        kids.push(Vec::new());
                        ends.push(Vec::new());
                        let n = kids.len() - 1;
                        kids[at].push((c, n));
                        n
                    }
                };
            }
            ends[at].push(id as u32);
        }
        let mut order = vec![(0usize, '\0')];
        let mut nodes = Vec::with_capacity(kids.len());
        let mut ids = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let (old, ch) = order[i];
            let first = order.len() as u32;
            order.extend(kids[old].iter().map(|&(c, n)| (n, c)));
            let start = ids.len() as u32;
            ids.extend_from_slice(&ends[old]);
            nodes.push(Node { ch, kids: (first, order.len() as u32), ids: (start, ids.len() as u32) });
            i += 1;
        }
        TokenTrie { nodes, ids, vocab: texts.len() }
    }

    /// The ids whose whole text `shape` takes from its state, or `None` once `abandon` is set
    /// (checked every few hundred nodes: a mask no one waits for stops early).
    fn allowed(&self, shape: &Shape, abandon: &AtomicBool) -> Option<Vec<bool>> {
        let mut allowed = vec![false; self.vocab];
        let mut todo = vec![(0usize, shape.clone())];
        let mut visited = 0usize;
        while let Some((n, state)) = todo.pop() {
            let (first, end) = self.nodes[n].kids;
            for k in first..end {
                visited += 1;
                if visited.is_multiple_of(256) && abandon.load(Ordering::Relaxed) {
                    return None;
                }
                let kid = self.nodes[k as usize];
                let mut next = state.clone();
                if !next.push_char(kid.ch) {
                    continue;
                }
                for &id in &self.ids[kid.ids.0 as usize..kid.ids.1 as usize] {
                    allowed[id as usize] = true;
                }
                if kid.kids.0 < kid.kids.1 {
                    todo.push((k as usize, next));
                }
            }
        }
        Some(allowed)
    }
}

/// The tokens allowed at one point of a sequence: `allowed[id]`, for the decoder whose
/// `produced()` count was `at` (a mask is used only at the point it was made for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub at: u64,
    pub allowed: Vec<bool>,
}

impl Mask {
    /// Whether `id` may be sampled.
    pub fn allows(&self, id: u32) -> bool {
        self.allowed.get(id as usize).copied().unwrap_or(false)
    }

    /// How many ids may be sampled.
    pub fn count(&self) -> usize {
        self.allowed.iter().filter(|a| **a).count()
    }
}

/// Everything one mask needs, owned: it may run on any thread ([`run`](Self::run)).
#[derive(Debug, Clone)]
pub struct MaskJob {
    pub shape: Shape,
    pub trie: Arc<TokenTrie>,
    /// Ids allowed whatever their text (the marker that ends a whole strict call).
    pub keep: Vec<u32>,
    pub at: u64,
}

impl MaskJob {
    /// The mask of a `json_schema` answer written up to `prefix`, outside a decoder (benchmarks).
    pub fn for_schema(prefix: SchemaPrefix, trie: Arc<TokenTrie>) -> MaskJob {
        MaskJob { shape: Shape::Schema(Box::new(prefix)), trie, keep: Vec::new(), at: 0 }
    }

    /// The mask of a `json_object` answer written up to `prefix`, outside a decoder.
    pub fn for_object(prefix: JsonPrefix, trie: Arc<TokenTrie>) -> MaskJob {
        MaskJob { shape: Shape::Object(prefix), trie, keep: Vec::new(), at: 0 }
    }

    /// The mask, or `None` when `abandon` was set before it was done.
    pub fn run(&self, abandon: &AtomicBool) -> Option<Mask> {
        let mut allowed = self.trie.allowed(&self.shape, abandon)?;
        for &k in &self.keep {
            if let Some(a) = allowed.get_mut(k as usize) {
                *a = true;
            }
        }
        Some(Mask { at: self.at, allowed })
    }

    /// The mask, computed to the end.
    pub fn run_now(&self) -> Mask {
        let never = AtomicBool::new(false);
        self.run(&never).expect("a mask no one abandons is finished")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_schema::{JsonSchema, SchemaLimits};

    fn texts(words: &[&str]) -> Vec<Option<String>> {
        words.iter().map(|w| (!w.is_empty()).then(|| w.to_string())).collect()
    }

    fn job(shape: Shape, texts: &[Option<String>]) -> MaskJob {
        MaskJob { shape, trie: Arc::new(TokenTrie::new(texts)), keep: Vec::new(), at: 0 }
    }

    fn allowed(m: &Mask) -> Vec<u32> {
        (0..m.allowed.len() as u32).filter(|&i| m.allows(i)).collect()
    }

    /// A small schema's mask, by hand: at the start only `{`-led texts, then only the key.
    #[test]
    fn a_small_schemas_masks_are_the_texts_it_allows() {
        let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"], "additionalProperties": false});
        let schema = Arc::new(JsonSchema::compile(&schema, &SchemaLimits::new(1 << 17, 16)).unwrap());
        // 0 `{`, 1 `{"`, 2 `{"ok"`, 3 `"`, 4 `"ok":`, 5 `"no"`, 6 none, 7 `x`, 8 `{"x`, 9 `{"ok"` again
        // (two ids may share a text), 10 `tr`, 11 `true}`, 12 `ok`.
        let t =
            texts(&["{", "{\"", "{\"ok\"", "\"", "\"ok\":", "\"no\"", "", "x", "{\"x", "{\"ok\"", "tr", "true}", "ok"]);
        let start = job(Shape::Schema(Box::new(schema.prefix())), &t);
        assert_eq!(allowed(&start.run_now()), [0, 1, 2, 9]);
        let mut after = schema.prefix();
        assert!(after.push_str("{"));
        let key = job(Shape::Schema(Box::new(after.clone())), &t);
        assert_eq!(allowed(&key.run_now()), [3, 4]);
        assert!(after.push_str("\"ok\":"));
        let value = job(Shape::Schema(Box::new(after)), &t);
        assert_eq!(allowed(&value.run_now()), [10, 11]);
        // json_object: any key.
        let object = job(Shape::Object(JsonPrefix::for_generation()), &t);
        assert_eq!(allowed(&object.run_now()), [0, 1, 2, 8, 9]);
    }

    #[test]
    fn kept_ids_are_allowed_and_an_abandoned_mask_stops() {
        let t = texts(&["{", "x", "y"]);
        let mut j = job(Shape::Object(JsonPrefix::for_generation()), &t);
        j.keep = vec![2, 99];
        assert_eq!(allowed(&j.run_now()), [0, 2]);
        let many: Vec<Option<String>> = (0..2000).map(|i| Some(format!("{{\"k{i}\""))).collect();
        let j = job(Shape::Object(JsonPrefix::for_generation()), &many);
        assert!(j.run(&AtomicBool::new(true)).is_none());
    }

    fn default_tokenizer() -> crate::tokenizer::Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste");
        let model = k3_format::Model::open(path).unwrap();
        crate::tokenizer::Tokenizer::from_files(|n| model.blob(n)).unwrap().unwrap()
    }

    /// Today's algorithm before the trie: one check per token.
    fn per_token(shape: &Shape, texts: &[Option<String>]) -> Vec<bool> {
        texts.iter().map(|t| t.as_deref().is_some_and(|t| !t.is_empty() && shape.accepts(t))).collect()
    }

    /// An `anyOf` of 64 objects of 24 properties each, each an `enum` of long strings: allowed,
    /// but every character moves 64 paths.
    pub(crate) fn costly_schema() -> serde_json::Value {
        let alts: Vec<serde_json::Value> = (0..64)
            .map(|a| {
                let props: serde_json::Map<String, serde_json::Value> = (0..24)
                    .map(|p| {
                        let values: Vec<String> =
                            (0..8).map(|v| format!("the value number {v} of property {p} in {a}")).collect();
                        match p % 2 {
                            0 => (format!("p{p}"), serde_json::json!({"enum": values})),
                            _ => (format!("p{p}"), serde_json::json!({"type": "string", "maxLength": 200 + a})),
                        }
                    })
                    .collect();
                serde_json::json!({"type": "object", "properties": props, "additionalProperties": false})
            })
            .collect();
        serde_json::json!({"anyOf": alts})
    }

    /// The trie's masks are the per-token loop's, on the default model's vocabulary, along valid
    /// answers of the fixture schemas, `json_object` and a costly schema.
    #[test]
    fn masks_by_the_trie_are_the_per_token_masks() {
        let tok = default_tokenizer();
        let (texts, trie) = (tok.token_texts(), tok.token_trie());
        let cases: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/json-schema/cases.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let mut shapes: Vec<(Shape, String)> = Vec::new();
        for case in cases.as_array().unwrap() {
            let schema = Arc::new(JsonSchema::compile(&case["schema"], &SchemaLimits::new(1 << 17, 16)).unwrap());
            let doc = case["docs"].as_array().unwrap().iter().find(|d| d["valid"] == true).unwrap();
            shapes.push((Shape::Schema(Box::new(schema.prefix())), doc["text"].as_str().unwrap().to_string()));
        }
        let object = "{ \"a\": [1, -2.5e3, true, null], \"b\\u00e9\": {\"c\": \"x y\"} }";
        shapes.push((Shape::Object(JsonPrefix::for_generation()), object.to_string()));
        let costly = Arc::new(JsonSchema::compile(&costly_schema(), &SchemaLimits::new(1 << 17, 16)).unwrap());
        let answer = "{\"p0\": \"the value number 3 of property 0 in 7\", \"p5\": \"the value";
        shapes.push((Shape::Schema(Box::new(costly.prefix())), answer.to_string()));
        let mut compared = 0;
        for (mut shape, text) in shapes {
            for (n, (i, c)) in text.char_indices().enumerate() {
                if n % 3 == 0 {
                    let job = MaskJob { shape: shape.clone(), trie: trie.clone(), keep: Vec::new(), at: 0 };
                    let mask = job.run_now();
                    assert_eq!(mask.allowed, per_token(&shape, texts), "after {:?}", &text[..i]);
                    assert!(mask.allowed.iter().any(|a| *a), "something continues {:?}", &text[..i]);
                    compared += 1;
                }
                assert!(shape.push_char(c), "{text} at {i}");
            }
        }
        assert!(compared > 100);
    }

    /// Per-token mask time before (one check per token) and after (the trie), at points along an
    /// answer of the costly schema, on the default model's vocabulary. Prints; asserts nothing
    /// of time. `cargo test -p k3-text --release --lib mask_time -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn mask_time() {
        let tok = default_tokenizer();
        let (texts, trie) = (tok.token_texts(), tok.token_trie());
        let costly = Arc::new(JsonSchema::compile(&costly_schema(), &SchemaLimits::new(1 << 17, 16)).unwrap());
        let points = [
            "",
            "{",
            "{\"p1",
            "{\"p1\": \"the val",
            "{\"p1\": \"the val\", \"p2\": \"the value number 2 of property 2 in 9\",",
        ];
        for point in points {
            let mut p = costly.prefix();
            assert!(p.push_str(point));
            let shape = Shape::Schema(Box::new(p));
            let t0 = std::time::Instant::now();
            let before = per_token(&shape, texts);
            let loop_s = t0.elapsed().as_secs_f64();
            let t1 = std::time::Instant::now();
            let job = MaskJob { shape, trie: trie.clone(), keep: Vec::new(), at: 0 };
            let after = job.run_now();
            let trie_s = t1.elapsed().as_secs_f64();
            assert_eq!(before, after.allowed);
            let n = after.allowed.iter().filter(|a| **a).count();
            println!("after {point:?}: {n} allowed; per-token loop {loop_s:.4} s, trie {trie_s:.4} s");
        }
    }
}
