//! Generation: a prompt (ids) in, a stream of tokens and visible text out. One [`Generator`] runs
//! one turn over a caller's [`Session`]: prefill (with progress and cancellation), then one token
//! per [`Generator::step`] — sampled, checked against the stops (end-of-message ids, stop strings,
//! `max_tokens`, the planned context, a cancellation flag), decoded, filtered for visibility
//! (K3's thinking), and fed back. With `speculate`, the token fed is followed by drafts from the
//! context, verified in the same step ([`crate::speculate`]): the accepted ones come out of the
//! following `step`s without a forward pass. `k3-cli generate` and `chat` are thin callers; a
//! server is the next.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::sample::{Sampler, SamplerConfig};
use crate::speculate::{self, Governor, SpecStats};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Engine, EngineError, RunStats, Session};

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
    /// K3: the prompt ends inside an open `think` element (generation starts thinking).
    pub starts_in_think: bool,
    /// Leave the session ready for the next turn: the end-of-message id is in it however the
    /// turn ended (`chat`).
    pub close_turn: Option<u32>,
    /// Set from elsewhere (Ctrl-C, a client gone) to stop at the next token.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Prompt tokens per forward call.
    pub chunk: usize,
    /// Tokens to draft from the context and verify with each token fed (0 = off). The output is
    /// the same tokens either way; a governor turns drafting off while it does not pay.
    pub speculate: usize,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 64,
            sampler: SamplerConfig::default(),
            stop_ids: Vec::new(),
            stop_strings: Vec::new(),
            show_thinking: false,
            starts_in_think: false,
            close_turn: None,
            cancel: None,
            chunk: 32,
            speculate: 0,
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
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub id: u32,
    /// The visible text it completes (empty for markup, hidden thinking, a partial character or a
    /// possible stop string held back).
    pub text: String,
    /// Whether it was fed back (a decode step ran; `stats` are that step's). The token that ends a
    /// turn is not.
    pub fed: bool,
    /// A drafted token the step before verified: it cost no step of its own (`stats` are zero).
    pub drafted: bool,
    pub stats: StepStats,
}

/// What one decode step cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    pub seconds: f64,
    pub bytes_read: u64,
    pub hits: u64,
    pub misses: u64,
    pub io_wait_seconds: f64,
}

impl StepStats {
    fn between(seconds: f64, before: &RunStats, after: &RunStats) -> Self {
        StepStats {
            seconds,
            bytes_read: after.cache.bytes_read - before.cache.bytes_read,
            hits: after.cache.hits - before.cache.hits,
            misses: after.cache.misses - before.cache.misses,
            io_wait_seconds: after.io_wait_seconds - before.io_wait_seconds,
        }
    }
}

/// One turn of generation over a session.
#[derive(Debug)]
pub struct Generator<'s, 't> {
    session: &'s mut Session,
    params: GenerateParams,
    sampler: Sampler,
    /// The next position's logits.
    logits: Vec<f32>,
    /// The next token, when a verify step already sampled it (a draft it did not match).
    next: Option<u32>,
    /// Tokens decided but not yet returned (a verify step decides several).
    ready: VecDeque<Token>,
    produced: u64,
    text: Option<TextOut<'t>>,
    finish: Option<Finish>,
    governor: Governor,
    /// What speculation did this turn.
    pub spec: SpecStats,
    /// Prefill (tokens, seconds).
    pub prefill: (usize, f64),
}

/// What a sampled token does to the turn.
enum Emit {
    /// The turn goes on with the token fed; its visible text.
    Continue(String),
    /// The turn ended ([`Generator::finish`] says why): the token's text, and the id to feed so
    /// the session is ready for another turn, if any.
    End(String, Option<u32>),
}

impl<'s, 't> Generator<'s, 't> {
    /// Runs `prompt` into `session` (`progress(done, total)` after each chunk). Ends at once,
    /// [`Finish::Cancelled`], when the flag is set during the prefill.
    pub fn start(
        engine: &Engine<'_>,
        session: &'s mut Session,
        prompt: &[u32],
        tok: Option<&'t Tokenizer>,
        params: GenerateParams,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Generator<'s, 't>, EngineError> {
        let sampler = Sampler::new(params.sampler)?;
        if prompt.is_empty() {
            return Err(EngineError::Input("the prompt is empty".into()));
        }
        let context = engine.plan().context as usize;
        if session.tokens() + prompt.len() >= context {
            return Err(EngineError::Input(format!(
                "the prompt is {} tokens, which leaves no room in a context of {context} tokens",
                session.tokens() + prompt.len()
            )));
        }
        let text = tok.map(|t| TextOut::new(t, &params));
        let mut g = Generator {
            session,
            params,
            sampler,
            logits: Vec::new(),
            next: None,
            ready: VecDeque::new(),
            produced: 0,
            text,
            finish: None,
            governor: Governor::default(),
            spec: SpecStats::default(),
            prefill: (prompt.len(), 0.0),
        };
        let t0 = Instant::now();
        let chunk = g.params.chunk.max(1);
        for (i, c) in prompt.chunks(chunk).enumerate() {
            if g.cancelled() {
                g.finish = Some(Finish::Cancelled);
                break;
            }
            g.logits = engine.forward_last(g.session, c)?;
            progress(((i + 1) * chunk).min(prompt.len()), prompt.len());
        }
        g.prefill.1 = t0.elapsed().as_secs_f64();
        Ok(g)
    }

    fn cancelled(&self) -> bool {
        self.params.cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst))
    }

    /// Why the turn ended, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// The session the turn runs in.
    pub fn session(&self) -> &Session {
        self.session
    }

    /// How many tokens were generated.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// The next token, or `None` once the turn has ended ([`finish`](Self::finish) says why).
    pub fn step(&mut self, engine: &Engine<'_>) -> Result<Option<Token>, EngineError> {
        if self.ready.is_empty() && self.finish.is_none() {
            self.advance(engine)?;
        }
        Ok(self.ready.pop_front())
    }

    /// Why the turn must end before another token is sampled, if it must.
    fn limit(&self) -> Option<Finish> {
        if self.produced >= self.params.max_tokens {
            Some(Finish::Length)
        } else if self.cancelled() {
            Some(Finish::Cancelled)
        } else {
            None
        }
    }

    /// Samples the next token and feeds it (or ends the turn).
    fn advance(&mut self, engine: &Engine<'_>) -> Result<(), EngineError> {
        if let Some(f) = self.limit() {
            // Held-back text is kept by `flush` for the caller.
            self.finish = Some(f);
            return self.feed_end(engine, self.params.close_turn);
        }
        let v = engine.vocab();
        let id = match self.next.take() {
            Some(id) => id,
            None => self.sampler.sample(&self.logits[self.logits.len() - v..]),
        };
        match self.emit(id, self.session.tokens(), engine.plan().context)? {
            Emit::End(text, feed) => {
                self.feed_end(engine, feed)?;
                self.ready.push_back(Token { id, text, fed: false, drafted: false, stats: StepStats::default() });
                Ok(())
            }
            Emit::Continue(text) => self.feed(engine, id, text),
        }
    }

    /// Counts a sampled token at `position` and checks it against the stops.
    fn emit(&mut self, id: u32, position: usize, context: u64) -> Result<Emit, EngineError> {
        self.produced += 1;
        if self.params.stop_ids.contains(&id) {
            self.finish = Some(Finish::Stop);
            // The end of the message belongs to the conversation.
            return Ok(Emit::End(self.flush(), self.params.close_turn.map(|_| id)));
        }
        let (text, stopped) = match &mut self.text {
            Some(t) => t.push(id)?,
            None => (String::new(), false),
        };
        if stopped {
            self.finish = Some(Finish::StopString);
            return Ok(Emit::End(text, self.params.close_turn));
        }
        if position as u64 >= context {
            self.finish = Some(Finish::ContextFull);
            return Ok(Emit::End(text + &self.flush(), None));
        }
        Ok(Emit::Continue(text))
    }

    /// Feeds `id` after the turn ended, when the session must be ready for another turn and
    /// has room.
    fn feed_end(&mut self, engine: &Engine<'_>, id: Option<u32>) -> Result<(), EngineError> {
        if let Some(id) = id
            && (self.session.tokens() as u64) < engine.plan().context
        {
            engine.forward(self.session, &[id], None)?;
        }
        Ok(())
    }

    /// Feeds `id` — alone, or followed by drafts verified in the same step.
    fn feed(&mut self, engine: &Engine<'_>, id: u32, text: String) -> Result<(), EngineError> {
        let (t0, before) = (Instant::now(), self.session.stats);
        let drafts = self.drafts(engine, id);
        if drafts.is_empty() {
            self.logits = engine.forward(self.session, &[id], None)?;
            let seconds = t0.elapsed().as_secs_f64();
            self.governor.plain_step(seconds);
            let stats = StepStats::between(seconds, &before, &self.session.stats);
            self.ready.push_back(Token { id, text, fed: true, drafted: false, stats });
            return Ok(());
        }
        let start = self.session.tokens();
        let chunk: Vec<u32> = std::iter::once(id).chain(drafts.iter().copied()).collect();
        let rows = engine.verify(self.session, &chunk)?;
        let stats = StepStats::between(t0.elapsed().as_secs_f64(), &before, &self.session.stats);
        self.ready.push_back(Token { id, text, fed: true, drafted: false, stats });
        // Row i's token, sampled as plain decoding would; a draft stays while it is that token.
        let v = engine.vocab();
        let mut kept = 1;
        let mut end_feed = None;
        for (i, &d) in drafts.iter().enumerate() {
            if self.limit().is_some() {
                break;
            }
            let x = self.sampler.sample(&rows[i * v..(i + 1) * v]);
            if x != d {
                self.next = Some(x);
                break;
            }
            self.spec.accepted += 1;
            let zero = StepStats::default();
            match self.emit(x, start + kept, engine.plan().context)? {
                Emit::Continue(text) => {
                    kept += 1;
                    self.ready.push_back(Token { id: x, text, fed: true, drafted: true, stats: zero });
                }
                Emit::End(text, feed) => {
                    // A draft that ends the turn but belongs to the conversation is its own row.
                    end_feed = match feed {
                        Some(f) if f == x => {
                            kept += 1;
                            None
                        }
                        other => other,
                    };
                    self.ready.push_back(Token { id: x, text, fed: false, drafted: true, stats: zero });
                    break;
                }
            }
        }
        engine.accept(self.session, kept)?;
        self.logits = rows[(kept - 1) * v..kept * v].to_vec();
        self.spec.verifies += 1;
        self.spec.drafted += drafts.len() as u64;
        self.governor.verify_step(t0.elapsed().as_secs_f64(), drafts.len(), kept - 1);
        self.spec.switched_off = self.governor.switched_off;
        if self.finish.is_some() {
            self.feed_end(engine, end_feed)?;
        }
        Ok(())
    }

    /// The drafts to verify after `id`: none when speculation is off, resting, or would pass
    /// the context.
    fn drafts(&mut self, engine: &Engine<'_>, id: u32) -> Vec<u32> {
        if self.params.speculate == 0 {
            return Vec::new();
        }
        let room = (engine.plan().context as usize).saturating_sub(self.session.tokens() + 1);
        let k = self.governor.draft_len(self.params.speculate.min(room));
        if k == 0 {
            return Vec::new();
        }
        let mut history = Vec::with_capacity(self.session.tokens() + 1);
        history.extend_from_slice(self.session.ids());
        history.push(id);
        speculate::draft(&history, k)
    }

    /// Text still held back (an incomplete character, the start of what might have been a stop
    /// string): the caller prints it when the turn ends.
    pub fn flush(&mut self) -> String {
        self.text.as_mut().map(TextOut::flush).unwrap_or_default()
    }
}

/// Token ids to the text a person sees: UTF-8 across tokens, K3's markup and (unless asked)
/// thinking hidden, stop strings cut.
#[derive(Debug)]
struct TextOut<'t> {
    tok: &'t Tokenizer,
    decoder: StreamDecoder,
    visibility: Visibility,
    stops: Vec<String>,
    /// Visible text not yet returned: it could be the start of a stop string.
    held: String,
}

impl<'t> TextOut<'t> {
    fn new(tok: &'t Tokenizer, p: &GenerateParams) -> Self {
        TextOut {
            tok,
            decoder: StreamDecoder::default(),
            visibility: Visibility::new(p.show_thinking, p.starts_in_think),
            stops: p.stop_strings.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// The visible text `id` adds, and whether a stop string was reached (the text before it is
    /// returned, the stop string and anything after it are not).
    fn push(&mut self, id: u32) -> Result<(String, bool), EngineError> {
        let piece = self.decoder.push(self.tok, id)?;
        if !self.visibility.show(self.tok, id)? {
            return Ok((String::new(), false));
        }
        self.held.push_str(&piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return Ok((out, true));
        }
        // Keep back the longest tail that is the start of a stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k)).map(move |k| &s[..k]))
            .filter(|prefix| self.held.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Ok((out, false))
    }

    fn flush(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        let rest = self.decoder.finish();
        if self.visibility.visible && self.visibility.tag.is_none() {
            out.push_str(&rest);
        }
        out
    }
}

/// Decides what of K3's output a person sees: text inside `think` only when asked, text inside
/// `response` always, markup and special tokens never. (Kimi-Linear has no such markup: all its
/// ordinary text is visible.)
#[derive(Debug)]
struct Visibility {
    show_thinking: bool,
    /// Inside the tag name after `<|open|>` / `<|close|>`: the bytes so far, and whether opening.
    tag: Option<(Vec<u8>, bool)>,
    visible: bool,
}

impl Visibility {
    fn new(show_thinking: bool, starts_in_think: bool) -> Self {
        Visibility { show_thinking, tag: None, visible: !starts_in_think || show_thinking }
    }

    /// Whether token `id` is shown.
    fn show(&mut self, tok: &Tokenizer, id: u32) -> Result<bool, EngineError> {
        match tok.special_name(id) {
            Some("<|open|>") => self.tag = Some((Vec::new(), true)),
            Some("<|close|>") => self.tag = Some((Vec::new(), false)),
            Some("<|sep|>") => {
                if let Some((name, opening)) = self.tag.take() {
                    let name = String::from_utf8_lossy(&name).into_owned();
                    self.visible = match (name.as_str(), opening) {
                        ("think", true) => self.show_thinking,
                        ("response", true) => true,
                        _ => false,
                    };
                }
            }
            Some(_) => {}
            None => {
                if let Some((name, _)) = &mut self.tag {
                    name.extend(tok.decode_bytes(&[id])?);
                    return Ok(false);
                }
                return Ok(self.visible);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::KIMI_PATTERN;

    /// o200k ranks with K3's chat markers as specials (as in tests/chat.rs).
    fn k3_tokenizer() -> Tokenizer {
        let ranks = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tokenizer/o200k_base.tiktoken"))
            .expect("the tokenizer fixture");
        let names = ["<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"];
        let added: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .enumerate()
            .map(|(i, n)| ((200_000 + i).to_string(), serde_json::json!({"content": n})))
            .collect();
        let cfg = serde_json::to_vec(&serde_json::json!({"added_tokens_decoder": added})).expect("json");
        Tokenizer::from_tiktoken(&ranks, Some(&cfg), KIMI_PATTERN).expect("tokenizer")
    }

    fn visible(tok: &Tokenizer, params: &GenerateParams, text: &str) -> (String, bool) {
        let mut out = TextOut::new(tok, params);
        let mut shown = String::new();
        for id in tok.encode_with_specials(text) {
            let (piece, stopped) = out.push(id).expect("decodes");
            shown.push_str(&piece);
            if stopped {
                return (shown, true);
            }
        }
        shown.push_str(&out.flush());
        (shown, false)
    }

    const ANSWER: &str =
        "hmm, light<|close|>think<|sep|><|open|>response<|sep|>Let there be light.<|close|>response<|sep|>";

    #[test]
    fn thinking_is_hidden_unless_asked_and_markup_never_shows() {
        let tok = k3_tokenizer();
        let hidden = GenerateParams { starts_in_think: true, ..GenerateParams::default() };
        assert_eq!(visible(&tok, &hidden, ANSWER).0, "Let there be light.");
        let shown = GenerateParams { starts_in_think: true, show_thinking: true, ..GenerateParams::default() };
        assert_eq!(visible(&tok, &shown, ANSWER).0, "hmm, lightLet there be light.");
    }

    #[test]
    fn stop_strings_cut_the_visible_text_and_are_held_back_while_they_may_come() {
        let tok = k3_tokenizer();
        let p = GenerateParams { stop_strings: vec!["be light".into()], ..GenerateParams::default() };
        assert_eq!(visible(&tok, &p, "Let there be light. And"), ("Let there ".to_string(), true));
        // A prefix of a stop string that never completes comes out in the end.
        let p = GenerateParams { stop_strings: vec!["there is".into()], ..GenerateParams::default() };
        assert_eq!(visible(&tok, &p, "Let there be"), ("Let there be".to_string(), false));
    }
}
