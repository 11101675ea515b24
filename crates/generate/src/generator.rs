//! Generation: a prompt (ids) in, a stream of tokens and visible text out. One [`Generator`] runs
//! one turn over a caller's [`Session`]: prefill (with progress and cancellation), then one token
//! per [`Generator::step`] — sampled, checked against the stops (end-of-message ids, stop strings,
//! `max_tokens`, the planned context, a cancellation flag), decoded, filtered for visibility
//! (K3's thinking), and fed back. With `speculate`, the token fed is followed by drafts from the
//! context, verified in the same step ([`crate::speculate`]): the accepted ones come out of the
//! following `step`s without a forward pass. `k3-cli generate` and `chat` are thin callers; a
//! server is the next.

use std::collections::VecDeque;
use std::time::Instant;

use crate::params::{Finish, GenerateParams};
use crate::sample::TokenLogprob;
use crate::speculate::{self, Governor, SpecStats};
use k3_engine::{Engine, RunStats, Session};
use k3_text::Tokenizer;

use crate::GenerateError;
use crate::decoder::{Decoder, Emit};

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
    /// Its log-probability, when `logprobs` was asked.
    pub logprob: Option<TokenLogprob>,
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
    decoder: Decoder<'t>,
    /// The next position's logits.
    logits: Vec<f32>,
    /// The next token, when a verify step already sampled it (a draft it did not match), with
    /// its log-probability.
    next: Option<(u32, Option<TokenLogprob>)>,
    /// Tokens decided but not yet returned (a verify step decides several).
    ready: VecDeque<Token>,
    governor: Governor,
    /// What speculation did this turn.
    pub spec: SpecStats,
    /// Prefill (tokens, seconds).
    pub prefill: (usize, f64),
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
    ) -> Result<Generator<'s, 't>, GenerateError> {
        Self::start_with_images(engine, session, prompt, &[], tok, params, progress)
    }

    /// As [`start`](Self::start), with images' rows at their positions in `prompt`
    /// ([`crate::media::expand`] gives both).
    pub fn start_with_images(
        engine: &Engine<'_>,
        session: &'s mut Session,
        prompt: &[u32],
        images: &[k3_engine::Inserted],
        tok: Option<&'t Tokenizer>,
        params: GenerateParams,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Generator<'s, 't>, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::Input("the prompt is empty".into()));
        }
        let context = engine.plan().context as usize;
        let tokens = session.tokens() + prompt.len();
        if tokens >= context {
            return Err(GenerateError::NoRoom { tokens, context });
        }
        let chunk = params.chunk.unwrap_or_else(|| engine.prefill_chunk()).max(1);
        let mut g = Generator::new(session, Vec::new(), tok, params)?;
        g.decoder.observe(prompt);
        g.prefill = (prompt.len(), 0.0);
        let t0 = Instant::now();
        for (i, c) in prompt.chunks(chunk).enumerate() {
            if g.decoder.cancelled() {
                // Nothing of the turn was said: nothing to close.
                let _ = g.decoder.stop(Finish::Cancelled);
                break;
            }
            g.logits = engine.forward_last_with_images(g.session, c, images, i * chunk)?;
            progress(((i + 1) * chunk).min(prompt.len()), prompt.len());
        }
        g.prefill.1 = t0.elapsed().as_secs_f64();
        Ok(g)
    }

    /// A turn that starts sampling from `logits`, the ones after `session`'s last token (kept
    /// with its state): no prompt to run.
    pub fn resume(
        engine: &Engine<'_>,
        session: &'s mut Session,
        logits: Vec<f32>,
        tok: Option<&'t Tokenizer>,
        params: GenerateParams,
    ) -> Result<Generator<'s, 't>, GenerateError> {
        if logits.len() != engine.vocab() || session.tokens() == 0 {
            return Err(GenerateError::Input(format!(
                "{} logits after {} tokens: a resumed turn needs the logits of its last token",
                logits.len(),
                session.tokens()
            )));
        }
        if session.tokens() >= engine.plan().context as usize {
            return Err(GenerateError::Input("the context is full".into()));
        }
        Generator::new(session, logits, tok, params)
    }

    fn new(
        session: &'s mut Session,
        logits: Vec<f32>,
        tok: Option<&'t Tokenizer>,
        params: GenerateParams,
    ) -> Result<Generator<'s, 't>, GenerateError> {
        let mut decoder = Decoder::new(tok, params)?;
        decoder.observe(session.ids());
        Ok(Generator {
            session,
            decoder,
            logits,
            next: None,
            ready: VecDeque::new(),
            governor: Governor::default(),
            spec: SpecStats::default(),
            prefill: (0, 0.0),
        })
    }

    /// The logits after the session's last token (before any is sampled: the prompt's).
    pub fn last_logits(&self, engine: &Engine<'_>) -> &[f32] {
        &self.logits[self.logits.len().saturating_sub(engine.vocab())..]
    }

    /// Why the turn ended, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.decoder.finish()
    }

    /// The session the turn runs in.
    pub fn session(&self) -> &Session {
        self.session
    }

    /// How many tokens were generated.
    pub fn produced(&self) -> u64 {
        self.decoder.produced()
    }

    /// The next token, or `None` once the turn has ended ([`finish`](Self::finish) says why).
    pub fn step(&mut self, engine: &Engine<'_>) -> Result<Option<Token>, GenerateError> {
        if self.ready.is_empty() && self.decoder.finish().is_none() {
            self.advance(engine)?;
        }
        Ok(self.ready.pop_front())
    }

    /// Samples the next token and feeds it (or ends the turn).
    fn advance(&mut self, engine: &Engine<'_>) -> Result<(), GenerateError> {
        if let Some(f) = self.decoder.limit() {
            // Held-back text is kept by `flush` for the caller.
            let feed = self.decoder.stop(f);
            return self.feed_end(engine, feed);
        }
        let v = engine.vocab();
        let (id, logprob) = match self.next.take() {
            Some(x) => x,
            None => {
                let row = &self.logits[self.logits.len() - v..];
                let id = self.decoder.sample(row);
                (id, self.decoder.logprob(row, id))
            }
        };
        match self.decoder.emit(id, self.session.tokens(), engine.plan().context)? {
            Emit::End(text, feed) => {
                self.feed_end(engine, feed)?;
                let stats = StepStats::default();
                self.ready.push_back(Token { id, text, fed: false, drafted: false, stats, logprob });
                Ok(())
            }
            Emit::Continue(text) => self.feed(engine, id, text, logprob),
        }
    }

    /// Feeds `id` after the turn ended, when the session must be ready for another turn and
    /// has room.
    fn feed_end(&mut self, engine: &Engine<'_>, id: Option<u32>) -> Result<(), GenerateError> {
        if let Some(id) = id
            && (self.session.tokens() as u64) < engine.plan().context
        {
            engine.forward(self.session, &[id], None)?;
        }
        Ok(())
    }

    /// Feeds `id` — alone, or followed by drafts verified in the same step.
    fn feed(
        &mut self,
        engine: &Engine<'_>,
        id: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Result<(), GenerateError> {
        let (t0, before) = (Instant::now(), self.session.stats);
        let drafts = self.drafts(engine, id);
        if drafts.is_empty() {
            self.logits = engine.forward(self.session, &[id], None)?;
            let seconds = t0.elapsed().as_secs_f64();
            self.governor.plain_step(seconds);
            let stats = StepStats::between(seconds, &before, &self.session.stats);
            self.ready.push_back(Token { id, text, fed: true, drafted: false, stats, logprob });
            return Ok(());
        }
        let start = self.session.tokens();
        let chunk: Vec<u32> = std::iter::once(id).chain(drafts.iter().copied()).collect();
        let rows = engine.forward_drafts(self.session, &chunk)?;
        let stats = StepStats::between(t0.elapsed().as_secs_f64(), &before, &self.session.stats);
        self.ready.push_back(Token { id, text, fed: true, drafted: false, stats, logprob });
        // Row i's token, sampled as plain decoding would; a draft stays while it is that token.
        let v = engine.vocab();
        let mut kept = 1;
        let mut end_feed = None;
        for (i, &d) in drafts.iter().enumerate() {
            if self.decoder.limit().is_some() {
                break;
            }
            let row = &rows[i * v..(i + 1) * v];
            let x = self.decoder.sample(row);
            let logprob = self.decoder.logprob(row, x);
            if x != d {
                self.next = Some((x, logprob));
                break;
            }
            self.spec.accepted += 1;
            let zero = StepStats::default();
            match self.decoder.emit(x, start + kept, engine.plan().context)? {
                Emit::Continue(text) => {
                    kept += 1;
                    self.ready.push_back(Token { id: x, text, fed: true, drafted: true, stats: zero, logprob });
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
                    self.ready.push_back(Token { id: x, text, fed: false, drafted: true, stats: zero, logprob });
                    break;
                }
            }
        }
        engine.accept_drafts(self.session, kept)?;
        self.logits = rows[(kept - 1) * v..kept * v].to_vec();
        self.spec.verifies += 1;
        self.spec.drafted += drafts.len() as u64;
        self.governor.verify_step(t0.elapsed().as_secs_f64(), drafts.len(), kept - 1);
        self.spec.switched_off = self.governor.switched_off;
        if self.decoder.finish().is_some() {
            self.feed_end(engine, end_feed)?;
        }
        Ok(())
    }

    /// The drafts to verify after `id`: none when speculation is off, resting, or would pass
    /// the context.
    fn drafts(&mut self, engine: &Engine<'_>, id: u32) -> Vec<u32> {
        let speculate = self.decoder.params().speculate;
        if speculate == 0 {
            return Vec::new();
        }
        let room = (engine.plan().context as usize).saturating_sub(self.session.tokens() + 1);
        let k = self.governor.draft_len(speculate.min(room));
        if k == 0 {
            return Vec::new();
        }
        let mut history = Vec::with_capacity(self.session.tokens() + 1);
        history.extend_from_slice(self.session.ids());
        history.push(id);
        speculate::draft(&history, k)
    }

    /// The thinking written since the last call (with `reasoning_apart`).
    pub fn take_reasoning(&mut self) -> String {
        self.decoder.take_reasoning()
    }

    /// Whether the model is thinking (inside `think`, or between `<think>` tokens).
    pub fn thinking(&self) -> bool {
        self.decoder.thinking()
    }

    /// Thinking tokens written so far this turn.
    pub fn thought(&self) -> u64 {
        self.decoder.thought()
    }

    /// Text still held back (an incomplete character, the start of what might have been a stop
    /// string): the caller prints it when the turn ends.
    pub fn flush(&mut self) -> String {
        self.decoder.flush()
    }
}
