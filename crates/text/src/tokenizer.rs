//! Kimi's tokenizer: tiktoken rank-BPE (repeatedly merge the adjacent pair whose concatenation has
//! the lowest rank) over the pieces of Kimi's split regex, with special tokens from
//! `tokenizer_config.json`. The BPE itself is `tiktoken-rs`'s `CoreBPE` (the same algorithm as
//! Python tiktoken); this module loads the rank file, the regex and the specials.

use std::collections::HashMap;

use base64::Engine as _;
use tiktoken_rs::CoreBPE;

/// Kimi's split regex (models.md): eight alternatives, in order. `&&` is character-class
/// intersection.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{file}: line {line}: {reason}")]
    Ranks { file: String, line: usize, reason: String },
    #[error("{file}: {reason}")]
    Config { file: String, reason: String },
    #[error("token id {0} is not in the vocabulary")]
    UnknownId(u32),
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
}

/// The encoder behind a [`Tokenizer`].
enum Backend {
    /// Kimi's own: tiktoken ranks and the Kimi regex.
    Tiktoken(CoreBPE),
    /// A Hugging Face `tokenizer.json`, through the `tokenizers` crate: one copy that reads
    /// special-token strings as text (`encode`), one that turns them into their ids.
    HuggingFace { plain: Box<tokenizers::Tokenizer>, specials: Box<tokenizers::Tokenizer> },
}

pub struct Tokenizer {
    bpe: Backend,
    specials: HashMap<String, u32>,
    special_names: HashMap<u32, String>,
    vocab: usize,
    /// Each id's text alone (`None`: a special token, or bytes that are not whole characters),
    /// computed when first asked for.
    texts: std::sync::OnceLock<Vec<Option<String>>>,
    /// Those texts as a trie, for constrained answers' masks, built when first asked for.
    trie: std::sync::OnceLock<std::sync::Arc<crate::mask::TokenTrie>>,
    /// The model's own Jinja chat template, when it ships one.
    chat_template: Option<String>,
}

/// A model's chat template: `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`
/// (a string, or a list of named templates of which `default` or the first is taken).
/// The chat template among a model's files: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (a string, or named templates: the `default` one).
fn chat_template_of(jinja: Option<&[u8]>, tokenizer_config: Option<&[u8]>) -> Option<String> {
    if let Some(t) = jinja {
        return Some(String::from_utf8_lossy(t).into_owned());
    }
    let cfg: serde_json::Value = serde_json::from_slice(tokenizer_config?).ok()?;
    match cfg.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(named) => {
            let pick = named.iter().find(|t| t["name"] == "default").or(named.first())?;
            pick["template"].as_str().map(str::to_string)
        }
        _ => None,
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &self.vocab).field("specials", &self.specials.len()).finish()
    }
}

impl Tokenizer {
    /// From a `tiktoken.model` rank file (`base64(token) rank` per line) and, optionally, a
    /// `tokenizer_config.json` whose `added_tokens_decoder` names the special tokens.
    pub fn from_tiktoken(ranks: &[u8], config: Option<&[u8]>, pattern: &str) -> Result<Tokenizer, TokenizerError> {
        let file = "tiktoken.model".to_string();
        let mut encoder = rustc_hash::FxHashMap::default();
        let text = std::str::from_utf8(ranks).map_err(|e| TokenizerError::Ranks {
            file: file.clone(),
            line: 0,
            reason: e.to_string(),
        })?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad =
                |reason: &str| TokenizerError::Ranks { file: file.clone(), line: i + 1, reason: reason.to_string() };
            let (tok, rank) = line.split_once(' ').ok_or_else(|| bad("expected `base64 rank`"))?;
            let bytes =
                base64::engine::general_purpose::STANDARD.decode(tok).map_err(|_| bad("token is not base64"))?;
            let rank: u32 = rank.trim().parse().map_err(|_| bad("rank is not a number"))?;
            encoder.insert(bytes, rank);
        }
        let vocab = encoder.values().map(|r| *r as usize + 1).max().unwrap_or(0);
        let mut specials = HashMap::new();
        if let Some(cfg) = config {
            let v: serde_json::Value = serde_json::from_slice(cfg)
                .map_err(|e| TokenizerError::Config { file: "tokenizer_config.json".into(), reason: e.to_string() })?;
            if let Some(added) = v.get("added_tokens_decoder").and_then(|a| a.as_object()) {
                for (id, t) in added {
                    let id: u32 = id.parse().map_err(|_| TokenizerError::Config {
                        file: "tokenizer_config.json".into(),
                        reason: format!("added token id `{id}` is not a number"),
                    })?;
                    if let Some(content) = t.get("content").and_then(|c| c.as_str()) {
                        specials.insert(content.to_string(), id);
                    }
                }
            }
        }
        let special_fx: rustc_hash::FxHashMap<String, u32> = specials.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let vocab = vocab.max(specials.values().map(|v| *v as usize + 1).max().unwrap_or(0));
        let bpe = CoreBPE::new(encoder, special_fx, pattern).map_err(|e| TokenizerError::Build(e.to_string()))?;
        Ok(Tokenizer::with(Backend::Tiktoken(bpe), specials, vocab))
    }

    /// A tokenizer over `bpe`, its texts and trie made when first asked for.
    fn with(bpe: Backend, specials: HashMap<String, u32>, vocab: usize) -> Tokenizer {
        let special_names = specials.iter().map(|(k, v)| (*v, k.clone())).collect();
        Tokenizer {
            bpe,
            specials,
            special_names,
            vocab,
            texts: Default::default(),
            trie: Default::default(),
            chat_template: None,
        }
    }

    /// From a Hugging Face `tokenizer.json` (its added tokens are the specials).
    pub fn from_hf_json(json: &[u8]) -> Result<Tokenizer, TokenizerError> {
        let mut t = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| TokenizerError::Config { file: "tokenizer.json".into(), reason: e.to_string() })?;
        // A chat engine wants the ids of the text itself: no padding, no truncation.
        t.with_padding(None);
        t.with_truncation(None).map_err(|e| TokenizerError::Build(e.to_string()))?;
        let specials: HashMap<String, u32> =
            t.get_added_tokens_decoder().into_iter().map(|(id, tok)| (tok.content, id)).collect();
        let vocab = t.get_vocab_size(true);
        // Text that spells a special token (a user pasting `<|im_end|>`) must stay text: it would
        // otherwise forge chat markup.
        let mut plain = t.clone();
        plain.set_encode_special_tokens(true);
        let bpe = Backend::HuggingFace { plain: Box::new(plain), specials: Box::new(t) };
        Ok(Tokenizer::with(bpe, specials, vocab))
    }

    /// The tokenizer (and chat template) among a model's files, as `file(name)` gives them:
    /// `tiktoken.model` with `tokenizer_config.json`, else `tokenizer.json`; `None` when there
    /// is neither.
    pub fn from_files<'a>(file: impl Fn(&str) -> Option<&'a [u8]>) -> Option<Result<Tokenizer, TokenizerError>> {
        let config = file("tokenizer_config.json");
        let tok = match file("tiktoken.model") {
            Some(ranks) => Tokenizer::from_tiktoken(ranks, config, KIMI_PATTERN),
            None => Tokenizer::from_hf_json(file("tokenizer.json")?),
        };
        Some(tok.map(|t| t.with_chat_template(chat_template_of(file("chat_template.jinja"), config))))
    }

    /// The same tokenizer with `template` as its chat template.
    pub fn with_chat_template(mut self, template: Option<String>) -> Self {
        self.chat_template = template;
        self
    }

    /// The model's own Jinja chat template (`chat_template.jinja`, or `tokenizer_config.json`'s
    /// `chat_template`), if it ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Ids of `text`, special-token strings treated as plain text (no post-processing such as
    /// BOS).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        match &self.bpe {
            Backend::Tiktoken(b) => b.encode_ordinary(text),
            Backend::HuggingFace { plain, .. } => {
                plain.encode(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
            }
        }
    }

    /// Ids of `text`, special-token strings (e.g. `<|open|>`) becoming their ids.
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        match &self.bpe {
            Backend::Tiktoken(b) => b.encode_with_special_tokens(text),
            Backend::HuggingFace { specials, .. } => {
                specials.encode(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
            }
        }
    }

    /// Every id's text alone: `None` for special tokens and for ids whose bytes are not whole
    /// UTF-8 characters (what constrained generation can reason about token by token).
    pub fn token_texts(&self) -> &[Option<String>] {
        self.texts.get_or_init(|| {
            (0..self.vocab as u32)
                .map(|id| {
                    if self.special_names.contains_key(&id) {
                        return None;
                    }
                    self.decode_bytes(&[id]).ok().and_then(|b| String::from_utf8(b).ok())
                })
                .collect()
        })
    }

    /// [`token_texts`](Self::token_texts) as a trie (built once, shared by every mask).
    pub fn token_trie(&self) -> std::sync::Arc<crate::mask::TokenTrie> {
        self.trie.get_or_init(|| std::sync::Arc::new(crate::mask::TokenTrie::new(self.token_texts()))).clone()
    }

    pub fn special(&self, name: &str) -> Option<u32> {
        self.specials.get(name).copied()
    }

    pub fn special_name(&self, id: u32) -> Option<&str> {
        self.special_names.get(&id).map(String::as_str)
    }

    /// The id of `text` when it is one token (a special token, or a single vocabulary entry).
    pub fn single_token(&self, text: &str) -> Option<u32> {
        self.special(text).or_else(|| match self.encode(text).as_slice() {
            [id] => Some(*id),
            _ => None,
        })
    }

    /// `<think>` and `</think>` when both are single tokens: a model that reasons between them
    /// (K2-Thinking).
    pub fn think_tags(&self) -> Option<[u32; 2]> {
        Some([self.single_token("<think>")?, self.single_token("</think>")?])
    }

    /// Every special token's text.
    pub fn special_names(&self) -> impl Iterator<Item = &str> {
        self.specials.keys().map(String::as_str)
    }

    /// The bytes of `ids` (may end inside a UTF-8 character).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        match &self.bpe {
            Backend::Tiktoken(b) => b.decode_bytes(ids).map_err(|e| TokenizerError::UnknownId(e.token)),
            Backend::HuggingFace { specials: t, .. } => {
                if let Some(bad) = ids.iter().find(|&&i| t.id_to_token(i).is_none()) {
                    return Err(TokenizerError::UnknownId(*bad));
                }
                t.decode(ids, false).map(String::into_bytes).map_err(|e| TokenizerError::Build(e.to_string()))
            }
        }
    }
}

/// Turns a stream of token ids into text, holding back bytes of a UTF-8 character split over
/// tokens until it is complete.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// The text that `id` completes (possibly empty). An id the tokenizer does not know (a model's
    /// padding rows) shows as U+FFFD rather than ending the stream.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        match tok.decode_bytes(&[id]) {
            Ok(b) => self.pending.extend(b),
            Err(TokenizerError::UnknownId(_)) => self.pending.extend("\u{FFFD}".as_bytes()),
            Err(e) => return Err(e),
        }
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // A cut inside a character at the end: keep it for the next token. Invalid bytes in
            // the middle are replaced (they cannot become valid later).
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let out = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        Ok(out)
    }

    /// Whatever is left at the end (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// For tests (this crate's, and others' through the `test-support` feature): o200k's ranks,
/// read from the repository's fixtures, with K3's chat markers as special tokens.
#[cfg(any(test, feature = "test-support"))]
pub fn k3_test_tokenizer() -> Tokenizer {
    let ranks = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tokenizer/o200k_base.tiktoken"))
        .expect("the tokenizer fixture");
    let names = ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"];
    let added: serde_json::Map<String, serde_json::Value> =
        names.iter().enumerate().map(|(i, n)| ((200_000 + i).to_string(), serde_json::json!({"content": n}))).collect();
    let cfg = serde_json::to_vec(&serde_json::json!({"added_tokens_decoder": added})).expect("json");
    Tokenizer::from_tiktoken(&ranks, Some(&cfg), KIMI_PATTERN).expect("tokenizer")
}
