//! One sequence's choices, apart from the forward passes: the sampler, the stops (end-of-message
//! ids, stop strings, max tokens, the context, cancellation) and the visible text. A
//! [`Generator`](super::Generator) drives one with its own steps (and drafts); a server drives
//! many in one batched step.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use k3_text::Tokenizer;
use k3_text::json_prefix::JsonPrefix;
use k3_text::mask::{Mask, MaskJob, Shape, TokenTrie};
use k3_text::strict::StrictCalls;

use crate::GenerateError;
use crate::params::{Finish, GenerateParams};
use crate::sample::{Sampler, TokenLogprob};
use crate::visible::TextOut;

/// What a sampled token does to the turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emit {
    /// The turn goes on with the token fed; its visible text.
    Continue(String),
    /// The turn ended ([`Decoder::finish`] says why): the token's text, and the id to feed so the
    /// session is ready for another turn, if any.
    End(String, Option<u32>),
}

/// One sequence's sampling, stops and text.
#[derive(Debug)]
pub struct Decoder<'t> {
    params: GenerateParams,
    sampler: Sampler,
    text: Option<TextOut<'t>>,
    produced: u64,
    /// Of those, written while thinking.
    thought: u64,
    /// Tokens the decoder writes for the model next (the close of a thinking budget spent).
    forced: std::collections::VecDeque<u32>,
    /// The markup that closes thinking, when there is a thinking budget.
    close_think: Vec<u32>,
    finish: Option<Finish>,
    /// With `json_object` or `json_schema`: the answer so far, checked.
    json: Option<Shape>,
    /// Strict tools' arguments, constrained as they are written.
    calls: Option<StrictCalls>,
    /// Every token's text (empty without a tokenizer): what a constrained answer is fed.
    texts: &'t [Option<String>],
    /// The tokenizer's texts as a trie, with a constrained answer.
    trie: Option<Arc<TokenTrie>>,
    /// Ids the tokenizer can decode (`None`: no tokenizer, the ids are the output): logits past
    /// these (a model whose vocabulary is padded) are never sampled.
    decodable: Option<usize>,
    /// No token continued a constrained answer: the turn ends, cut short.
    dead_end: bool,
}

impl<'t> Decoder<'t> {
    /// A decoder for valid settings; `tok` (when given) turns ids into visible text.
    pub fn new(tok: Option<&'t Tokenizer>, params: GenerateParams) -> Result<Self, GenerateError> {
        let sampler = Sampler::new(params.sampler.clone())?;
        let text = tok.map(|t| TextOut::new(t, &params));
        let shape = match (&params.json_schema, params.json_object) {
            (Some(s), _) => Some(Shape::Schema(Box::new(s.prefix()))),
            (None, true) => Some(Shape::Object(JsonPrefix::for_generation())),
            (None, false) => None,
        };
        if shape.is_some() && tok.is_none() {
            return Err(GenerateError::Input("a JSON answer needs the model's tokenizer".into()));
        }
        let calls = match (params.strict_tools.is_empty(), tok) {
            (true, _) => None,
            (false, Some(t)) => StrictCalls::new(t, &params.strict_tools)?,
            (false, None) => return Err(GenerateError::Input("strict tools need the model's tokenizer".into())),
        };
        let constrained = shape.is_some() || calls.is_some();
        let trie = tok.filter(|_| constrained).map(Tokenizer::token_trie);
        let texts = tok.map_or(&[][..], Tokenizer::token_texts);
        let close_think = match (params.max_thinking, tok) {
            (None, _) | (_, None) => Vec::new(),
            (Some(_), Some(t)) => close_think(t, &params)?,
        };
        let forced = Default::default();
        Ok(Decoder {
            params,
            sampler,
            text,
            produced: 0,
            thought: 0,
            forced,
            close_think,
            finish: None,
            json: shape,
            calls,
            texts,
            trie,
            decodable: tok.map(Tokenizer::vocab),
            dead_end: false,
        })
    }

    /// Counts `ids` (the sequence so far: the prompt) for the repetition penalties.
    pub fn observe(&mut self, ids: &[u32]) {
        self.sampler.observe(ids);
    }

    /// With `logprobs` asked: `id`'s log-probability at a position whose logits are `logits`,
    /// and the most likely tokens' (under the model, before any sampling setting).
    pub fn logprob(&self, logits: &[f32], id: u32) -> Option<TokenLogprob> {
        self.params.logprobs.map(|top| TokenLogprob::of(logits, id, top))
    }

    pub fn params(&self) -> &GenerateParams {
        &self.params
    }

    /// Why the turn ended, once it has.
    pub fn finish(&self) -> Option<Finish> {
        self.finish
    }

    /// The stop string that ended the turn ([`Finish::StopString`]).
    pub fn stop_string(&self) -> Option<&str> {
        self.text.as_ref().and_then(|t| t.stopped_by.as_deref())
    }

    /// How many tokens were sampled.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// Whether the cancellation flag is set.
    pub fn cancelled(&self) -> bool {
        self.params.cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst))
    }

    /// Whether the model is thinking.
    pub fn thinking(&self) -> bool {
        self.text.as_ref().is_some_and(TextOut::thinking)
    }

    /// Tokens written while thinking.
    pub fn thought(&self) -> u64 {
        self.thought
    }

    /// Why the turn must end before another token is sampled, if it must.
    pub fn limit(&self) -> Option<Finish> {
        // With a thinking budget, max_tokens bounds the answer (unless it is asked to bound all).
        let answer_only = self.params.max_thinking.is_some() && !self.params.max_tokens_counts_thinking;
        let counted = if answer_only { self.produced - self.thought } else { self.produced };
        if counted >= self.params.max_tokens {
            Some(Finish::Length)
        } else if self.cancelled() {
            Some(Finish::Cancelled)
        } else {
            None
        }
    }

    /// Ends the turn for `why`; returns the id to feed so the session is ready for another turn
    /// (`close_turn`), if any. Held-back text stays for [`flush`](Self::flush).
    pub fn stop(&mut self, why: Finish) -> Option<u32> {
        self.finish = Some(why);
        self.params.close_turn
    }

    /// Whether the next token is the answer's (not thinking or markup): what JSON is checked in.
    fn answering(&self) -> bool {
        self.text.as_ref().is_none_or(TextOut::answering)
    }

    /// The next token from a position's logits `[vocab]` (with `json_object` or `json_schema`,
    /// once the answer begins, among the tokens that keep it an allowed JSON value in the making;
    /// when none can, the turn ends cut short: [`Finish::Unfinished`]). Never an id the
    /// tokenizer cannot decode.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_with(logits, None)
    }

    /// As [`sample`](Self::sample), with the mask [`mask_job`](Self::mask_job) made for this
    /// point, when it was computed elsewhere (one made for another point is not used).
    pub fn sample_with(&mut self, logits: &[f32], ready: Option<&Mask>) -> u32 {
        if let Some(id) = self.take_forced() {
            return id;
        }
        let Some(job) = self.mask_job() else {
            return match self.decodable.filter(|&n| n < logits.len()) {
                Some(n) => self.sampler.sample(&masked(logits, |id| id < n)),
                None => self.sampler.sample(logits),
            };
        };
        let computed;
        let mask = match ready.filter(|m| m.at == job.at) {
            Some(m) => m,
            None => {
                computed = job.run_now();
                &computed
            }
        };
        let allowed = masked(logits, |id| mask.allows(id as u32));
        if allowed.iter().any(|m| *m != f32::NEG_INFINITY) {
            return self.sampler.sample(&allowed);
        }
        // No token continues the answer (it cannot be finished in this vocabulary): the turn
        // ends with an end-of-message id (what closes the turn in the conversation), the answer
        // reported as cut short, not as complete.
        self.dead_end = true;
        let stops = masked(logits, |id| self.params.stop_ids.contains(&(id as u32)));
        match self.params.stop_ids.is_empty() {
            true => self.params.close_turn.unwrap_or(0),
            false => self.sampler.sample(&stops),
        }
    }

    /// The token the decoder writes for the model next, if any (the close of a thinking budget
    /// spent, strict calls' markup).
    fn take_forced(&mut self) -> Option<u32> {
        if self.forced.is_empty() && self.budget_spent() {
            // The thinking budget is spent: close the thinking for the model.
            self.forced.extend(self.close_think.iter().copied());
        }
        self.forced.pop_front()
    }

    fn budget_spent(&self) -> bool {
        self.params.max_thinking.is_some_and(|m| self.thought >= m) && self.thinking()
    }

    /// The mask the next [`sample`](Self::sample) needs, as a job that may run on any thread:
    /// `None` when it needs none (no constraint is active, or the next token is written for the
    /// model).
    pub fn mask_job(&self) -> Option<MaskJob> {
        if !self.forced.is_empty() || (self.budget_spent() && !self.close_think.is_empty()) {
            return None;
        }
        let trie = self.trie.clone()?;
        let at = self.produced;
        if let Some((prefix, end)) = self.calls.as_ref().and_then(StrictCalls::active) {
            // A strict call's arguments; once whole, only the marker that ends the call.
            let keep = end.filter(|_| prefix.complete()).into_iter().collect();
            return Some(MaskJob { shape: Shape::Schema(Box::new(prefix.clone())), trie, keep, at });
        }
        let shape = self.json.as_ref().filter(|_| self.answering())?;
        Some(MaskJob { shape: shape.clone(), trie, keep: Vec::new(), at })
    }

    /// Counts a sampled token at `position` and checks it against the stops.
    pub fn emit(&mut self, id: u32, position: usize, context: u64) -> Result<Emit, GenerateError> {
        let answering = self.answering();
        if self.thinking() {
            self.thought += 1;
        }
        let texts = self.texts;
        let text_of = |id: u32| texts.get(id as usize).and_then(Option::as_deref).unwrap_or("");
        if let Some(calls) = &mut self.calls {
            let forced = calls.observe(id, text_of(id));
            self.forced.extend(forced);
        }
        self.produced += 1;
        self.sampler.observe(&[id]);
        if self.dead_end {
            // Cut short: the id is the end of the message (fed when it is a stop id), no text.
            self.finish = Some(Finish::Unfinished);
            let feed = self.params.close_turn.map(|c| if self.params.stop_ids.contains(&id) { id } else { c });
            return Ok(Emit::End(self.flush(), feed));
        }
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
        if let Some(prefix) = self.json.as_mut().filter(|_| answering) {
            prefix.push_str(text_of(id));
            if prefix.complete() {
                // The object is whole: the answer ends here.
                self.finish = Some(Finish::Stop);
                return Ok(Emit::End(text + &self.flush(), self.params.close_turn));
            }
        }
        Ok(Emit::Continue(text))
    }

    /// The reasoning written since the last call (with `reasoning_apart`).
    pub fn take_reasoning(&mut self) -> String {
        self.text.as_mut().map(|t| std::mem::take(&mut t.reasoning)).unwrap_or_default()
    }

    /// Text still held back (an incomplete character, the start of what might have been a stop
    /// string): the caller shows it when the turn ends.
    pub fn flush(&mut self) -> String {
        self.text.as_mut().map(TextOut::flush).unwrap_or_default()
    }
}

/// `logits` with every id `keep` refuses at minus infinity.
fn masked(logits: &[f32], keep: impl Fn(usize) -> bool) -> Vec<f32> {
    logits.iter().enumerate().map(|(id, &l)| if keep(id) { l } else { f32::NEG_INFINITY }).collect()
}

/// The tokens that close a thinking section: `</think>` for models that think between tags, K3's
/// `<|close|>think<|sep|><|open|>response<|sep|>` otherwise.
fn close_think(tok: &Tokenizer, params: &GenerateParams) -> Result<Vec<u32>, GenerateError> {
    if let Some([_, close]) = params.think_tags {
        return Ok(vec![close]);
    }
    let special = |name: &str| {
        tok.special(name)
            .ok_or_else(|| GenerateError::Input(format!("a thinking budget needs `{name}`, which the tokenizer lacks")))
    };
    let (open, close, sep) = (special("<|open|>")?, special("<|close|>")?, special("<|sep|>")?);
    let mut ids = vec![close];
    ids.extend(tok.encode("think"));
    ids.extend([sep, open]);
    ids.extend(tok.encode("response"));
    ids.push(sep);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::SamplerConfig;

    fn default_tokenizer() -> Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/default.waste");
        crate::model_tokenizer(&k3_format::Model::open(path).unwrap()).unwrap().unwrap()
    }

    /// Logits over a padded vocabulary (64 rows past the tokenizer's ids, the likeliest by far):
    /// greedy and sampled draws alike stay among the ids the tokenizer decodes.
    #[test]
    fn padded_ids_are_never_sampled() {
        let tok = default_tokenizer();
        let n = tok.vocab();
        let mut logits: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1).collect();
        logits.extend(std::iter::repeat_n(50.0, 64));
        for temperature in [0.0, 1.0] {
            let sampler = SamplerConfig { temperature, seed: 3, ..SamplerConfig::default() };
            let mut d = Decoder::new(Some(&tok), GenerateParams { sampler, ..GenerateParams::default() }).unwrap();
            for _ in 0..50 {
                let id = d.sample(&logits);
                assert!((id as usize) < n, "{id} is past the tokenizer's {n} ids");
            }
        }
        // Without a tokenizer the ids are the output: every row may be drawn.
        let mut bare = Decoder::new(None, GenerateParams::default()).unwrap();
        assert!(bare.sample(&logits) as usize >= n);
    }

    /// A mask made elsewhere is used only at the point it was made for, and gives what the
    /// decoder computes itself.
    #[test]
    fn a_mask_from_elsewhere_samples_as_the_decoders_own() {
        let tok = default_tokenizer();
        let params = GenerateParams { json_object: true, ..GenerateParams::default() };
        let logits: Vec<f32> = (0..tok.vocab()).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let (mut a, mut b) =
            (Decoder::new(Some(&tok), params.clone()).unwrap(), Decoder::new(Some(&tok), params).unwrap());
        let mut stale = None;
        for step in 0..12 {
            let job = b.mask_job().expect("a JSON answer is masked");
            let mask = job.run_now();
            let id = b.sample_with(&logits, Some(&mask));
            assert_eq!(id, a.sample(&logits), "step {step}");
            // A stale mask (the first one) is not used.
            let other = a.sample_with(&logits, stale.as_ref());
            assert_eq!(other, id, "step {step}");
            stale.get_or_insert(mask);
            let (ea, eb) = (a.emit(id, step, 1000).unwrap(), b.emit(id, step, 1000).unwrap());
            assert_eq!(ea, eb);
            if matches!(ea, Emit::End(..)) {
                break;
            }
        }
    }
}
