//! How a turn is generated ([`GenerateParams`]) and why it ended ([`Finish`]): what the caller,
//! the decoder and the visibility filter share, apart from the loop that runs the turn.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::sample::SamplerConfig;

/// How a turn is generated.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: u64,
    pub sampler: SamplerConfig,
    /// Ids that end the message (the config's `eos_token_id`, a chat format's end of turn).
    pub stop_ids: Vec<u32>,
    /// Texts that end the message; the text stops before them (as OpenAI's `stop`).
    pub stop_strings: Vec<String>,
    /// K3: show what the model writes inside `think` (hidden by default).
    pub show_thinking: bool,
    /// K3: keep what the model writes inside `think` apart from the answer, for
    /// [`Decoder::take_reasoning`] (a server's `reasoning_content`).
    pub reasoning_apart: bool,
    /// The answer is one JSON object: tokens that cannot continue one are never sampled, and the
    /// turn ends when it is complete (`response_format: json_object`). Needs a tokenizer.
    pub json_object: bool,
    /// The answer is a value this schema allows (`response_format: json_schema`), checked as
    /// `json_object` is; takes the place of `json_object`. Needs a tokenizer.
    pub json_schema: Option<Arc<k3_text::json_schema::JsonSchema>>,
    /// Strict tools: each function's name and parameter schema; a call's arguments are
    /// constrained to it as they are written (`im_` markup). Needs a tokenizer.
    pub strict_tools: Vec<(String, Arc<k3_text::json_schema::JsonSchema>)>,
    /// Thinking tokens at most; then the thinking is closed for the model (K3's markup, or the
    /// `</think>` token) and it answers. With a budget, `max_tokens` counts the answer only.
    pub max_thinking: Option<u64>,
    /// With a thinking budget, `max_tokens` still counts the thinking too: Anthropic's
    /// `max_tokens` bounds everything a turn writes, `budget_tokens` the thinking within it.
    pub max_tokens_counts_thinking: bool,
    /// K3: the prompt ends inside an open `think` element (generation starts thinking).
    pub starts_in_think: bool,
    /// K2-Thinking and its kind: the `<think>` and `</think>` token ids between which the model
    /// reasons (shown, hidden or kept apart as K3's `think` is).
    pub think_tags: Option<[u32; 2]>,
    /// Leave the session ready for the next turn: the end-of-message id is in it however the
    /// turn ended (`chat`).
    pub close_turn: Option<u32>,
    /// Set from elsewhere (Ctrl-C, a client gone) to stop at the next token.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Prompt tokens per forward call; `None`: the engine's (`Engine::prefill_chunk`).
    pub chunk: Option<usize>,
    /// Tokens to draft from the context and verify with each token fed (0 = off). The output is
    /// the same tokens either way; a governor turns drafting off while it does not pay.
    pub speculate: usize,
    /// Report each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 64,
            sampler: SamplerConfig::default(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            show_thinking: false,
            reasoning_apart: false,
            json_object: false,
            json_schema: None,
            strict_tools: Vec::new(),
            max_thinking: None,
            max_tokens_counts_thinking: false,
            starts_in_think: false,
            think_tags: None,
            close_turn: None,
            cancel: None,
            chunk: None,
            speculate: 0,
            logprobs: None,
        }
    }
}

/// Why a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-message id.
    Stop,
    /// A stop string.
    StopString,
    /// `max_tokens` reached.
    Length,
    /// The planned context is full.
    ContextFull,
    /// The cancellation flag was set.
    Cancelled,
    /// No token of the vocabulary continues a constrained answer (`json_object`, `json_schema`)
    /// that is not whole yet: it is cut short, not complete.
    Unfinished,
}
