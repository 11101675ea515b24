//! What a person sees of the generated tokens: UTF-8 across tokens, K3's markup and (unless
//! asked) thinking hidden, stop strings cut.

use k3_text::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

use crate::GenerateError;
use crate::params::GenerateParams;

/// Token ids to the text a person sees: UTF-8 across tokens, K3's markup and (unless asked)
/// thinking hidden, stop strings cut.
#[derive(Debug)]
pub(super) struct TextOut<'t> {
    tok: &'t Tokenizer,
    decoder: StreamDecoder,
    visibility: Visibility,
    stops: Vec<String>,
    /// Visible text not yet returned: it could be the start of a stop string.
    held: String,
    /// K3's thinking, when it is kept apart from the answer (`reasoning_apart`), not yet taken.
    pub(super) reasoning: String,
    /// The stop string that ended the text, once one has (Anthropic's `stop_sequence`).
    pub(super) stopped_by: Option<String>,
}

impl<'t> TextOut<'t> {
    pub(super) fn new(tok: &'t Tokenizer, p: &GenerateParams) -> Self {
        TextOut {
            tok,
            decoder: StreamDecoder::default(),
            visibility: Visibility::new(p.show_thinking, p.reasoning_apart, p.starts_in_think, p.think_tags),
            stops: p.stop_strings.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
            reasoning: String::new(),
            stopped_by: None,
        }
    }

    /// The visible text `id` adds, and whether a stop string was reached (the text before it is
    /// returned, the stop string and anything after it are not).
    pub(super) fn push(&mut self, id: u32) -> Result<(String, bool), GenerateError> {
        let piece = self.decoder.push(self.tok, id)?;
        match self.visibility.show(self.tok, id)? {
            Shown::Hidden => return Ok((String::new(), false)),
            // Stop strings end the answer; the reasoning is not searched for them.
            Shown::Reasoning => {
                self.reasoning.push_str(&piece);
                return Ok((String::new(), false));
            }
            Shown::Content => {}
        }
        self.held.push_str(&piece);
        // The earliest match; of two starting there, the one listed first.
        let found = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s))).min_by_key(|m| m.0);
        if let Some((at, stop)) = found {
            self.stopped_by = Some(stop.clone());
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

    /// Whether the next token's text is the answer (not thinking, not markup): what a JSON
    /// constraint applies to.
    pub(super) fn answering(&self) -> bool {
        let v = &self.visibility;
        v.tag.is_none() && !v.in_think && v.state == Shown::Content
    }

    /// Whether the model is thinking (inside `think`, or between `<think>` tokens).
    pub(super) fn thinking(&self) -> bool {
        self.visibility.in_think
    }

    pub(super) fn flush(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        let rest = self.decoder.finish();
        if self.visibility.tag.is_none() {
            match self.visibility.state {
                Shown::Content => out.push_str(&rest),
                Shown::Reasoning => self.reasoning.push_str(&rest),
                Shown::Hidden => {}
            }
        }
        out
    }
}

/// Where a token's text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    Content,
    /// K3's thinking, kept apart from the answer.
    Reasoning,
    Hidden,
}

/// Decides what of K3's output a person sees: text inside `think` only when asked, text inside
/// `response` always, markup and special tokens never. The same for text between a model's
/// `<think>` and `</think>` tokens (K2-Thinking). (Kimi-Linear has no such markup: all its
/// ordinary text is visible.)
#[derive(Debug)]
struct Visibility {
    /// Where text inside `think` goes.
    thinking: Shown,
    /// `<think>` and `</think>` ids, for models that reason between them.
    tags: Option<[u32; 2]>,
    /// Inside the tag name after `<|open|>` / `<|close|>`: the bytes so far, and whether opening.
    tag: Option<(Vec<u8>, bool)>,
    /// Where ordinary text goes now.
    state: Shown,
    /// Inside `think` (or `<think>`): the text is thinking, whether shown or not.
    in_think: bool,
}

impl Visibility {
    fn new(show_thinking: bool, reasoning_apart: bool, starts_in_think: bool, tags: Option<[u32; 2]>) -> Self {
        let thinking = match (show_thinking, reasoning_apart) {
            (true, _) => Shown::Content,
            (false, true) => Shown::Reasoning,
            (false, false) => Shown::Hidden,
        };
        let state = if starts_in_think { thinking } else { Shown::Content };
        Visibility { thinking, tags, tag: None, state, in_think: starts_in_think }
    }

    /// Where token `id`'s text goes.
    fn show(&mut self, tok: &Tokenizer, id: u32) -> Result<Shown, GenerateError> {
        match self.tags {
            Some([open, _]) if id == open => {
                self.state = self.thinking;
                self.in_think = true;
                return Ok(Shown::Hidden);
            }
            Some([_, close]) if id == close => {
                self.state = Shown::Content;
                self.in_think = false;
                return Ok(Shown::Hidden);
            }
            _ => {}
        }
        match tok.special_name(id) {
            Some("<|open|>") => self.tag = Some((Vec::new(), true)),
            Some("<|close|>") => self.tag = Some((Vec::new(), false)),
            Some("<|sep|>") => {
                if let Some((name, opening)) = self.tag.take() {
                    let name = String::from_utf8_lossy(&name).into_owned();
                    self.in_think = name == "think" && opening;
                    self.state = match (name.as_str(), opening) {
                        ("think", true) => self.thinking,
                        ("response", true) => Shown::Content,
                        _ => Shown::Hidden,
                    };
                }
            }
            Some(_) => {}
            None => {
                if let Some((name, _)) = &mut self.tag {
                    // An id the tokenizer has no text for (a hole in a small vocabulary, a
                    // model's padding rows) is U+FFFD in a tag's name, as in the text: the
                    // sampled markup is the model's, never a reason to fail the request.
                    match tok.decode_bytes(&[id]) {
                        Ok(bytes) => name.extend(bytes),
                        Err(TokenizerError::UnknownId(_)) => name.extend("\u{FFFD}".as_bytes()),
                        Err(e) => return Err(e.into()),
                    }
                    return Ok(Shown::Hidden);
                }
                return Ok(self.state);
            }
        }
        Ok(Shown::Hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k3_text::tokenizer::KIMI_PATTERN;

    fn k3_tokenizer() -> Tokenizer {
        k3_text::tokenizer::k3_test_tokenizer()
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
    fn thinking_kept_apart_is_the_reasoning_and_the_rest_the_answer() {
        let tok = k3_tokenizer();
        let p = GenerateParams { starts_in_think: true, reasoning_apart: true, ..GenerateParams::default() };
        let mut out = TextOut::new(&tok, &p);
        let mut answer = String::new();
        for id in tok.encode_with_specials(ANSWER) {
            answer.push_str(&out.push(id).expect("decodes").0);
        }
        answer.push_str(&out.flush());
        assert_eq!((answer.as_str(), out.reasoning.as_str()), ("Let there be light.", "hmm, light"));
    }

    /// K2-Thinking's `<think>` / `</think>` tokens: the reasoning between them hidden, shown or
    /// kept apart, the tags themselves never shown.
    #[test]
    fn think_tags_split_reasoning_from_the_answer() {
        let ranks = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tokenizer/o200k_base.tiktoken"))
            .expect("the tokenizer fixture");
        let added = serde_json::json!({"200000": {"content": "<think>"}, "200001": {"content": "</think>"}});
        let cfg = serde_json::to_vec(&serde_json::json!({"added_tokens_decoder": added})).expect("json");
        let tok = Tokenizer::from_tiktoken(&ranks, Some(&cfg), KIMI_PATTERN).expect("tokenizer");
        let tags = Some([200_000, 200_001]);
        let answer = "<think>weigh it</think>Yes.";
        let hidden = GenerateParams { think_tags: tags, ..GenerateParams::default() };
        assert_eq!(visible(&tok, &hidden, answer).0, "Yes.");
        let shown = GenerateParams { think_tags: tags, show_thinking: true, ..GenerateParams::default() };
        assert_eq!(visible(&tok, &shown, answer).0, "weigh itYes.");
        let apart = GenerateParams { think_tags: tags, reasoning_apart: true, ..GenerateParams::default() };
        let mut out = TextOut::new(&tok, &apart);
        let mut text = String::new();
        for id in tok.encode_with_specials(answer) {
            text.push_str(&out.push(id).expect("decodes").0);
        }
        assert_eq!((text.as_str(), out.reasoning.as_str()), ("Yes.", "weigh it"));
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

    /// Which stop string ended the text (Anthropic's `stop_sequence`): the earliest to appear,
    /// not the first listed (both are in the held text when " light" comes).
    #[test]
    fn the_stop_string_that_ended_the_text_is_named() {
        let tok = k3_tokenizer();
        let p = GenerateParams { stop_strings: vec!["light".into(), "be light".into()], ..GenerateParams::default() };
        let mut out = TextOut::new(&tok, &p);
        for id in tok.encode("Let there be light.") {
            if out.push(id).expect("decodes").1 {
                break;
            }
        }
        assert_eq!(out.stopped_by.as_deref(), Some("be light"));
    }

    /// An id the tokenizer has no text for, sampled inside K3's markup (a tag's name), hides as
    /// the markup does instead of failing the request (it failed with "token id N is not in the
    /// vocabulary", a 500, on a tiny K3 whose vocabulary has holes).
    #[test]
    fn an_unknown_id_inside_a_tag_is_hidden_not_an_error() {
        let tok = k3_tokenizer();
        let mut out = TextOut::new(&tok, &GenerateParams::default());
        let open = tok.encode_with_specials("<|open|>")[0];
        let unknown = tok.vocab() as u32 + 7;
        assert!(tok.decode_bytes(&[unknown]).is_err());
        out.push(open).expect("markup");
        assert_eq!(out.push(unknown).expect("an unknown id in a tag's name is not an error").0, "");
    }
}
