//! One user turn of a chat: its prompt run (the first from the prompt cache, up to the system
//! turn's end kept for the next chat), the answer streamed and recorded.

use anyhow::Result;
use k3_cli::progress::{Progress, Unit};
use k3_engine::{Engine, Session};
use k3_generate::speculate::SpecStats;
use k3_generate::{Finish, Generator};
use k3_text::chat_format::{ChatFormat, Message, PromptOptions, Role};
use k3_text::tokenizer::Tokenizer;

use super::Chat;
use super::show::{self, Style};
use crate::prompt_cache::PromptCache;
use crate::signals;

/// One user turn: its prompt run (from the prompt cache on the first), the answer streamed.
pub(super) struct Turn<'a, 'c> {
    pub(super) cache: Option<&'a mut PromptCache>,
    pub(super) stats: bool,
    pub(super) cancel: &'c std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Turn<'_, '_> {
    /// Runs the turn; an error after the session was touched keeps the user's turn (and what
    /// was said) in `chat` and has the next turn computed afresh from the messages.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        self,
        engine: &Engine<'_>,
        tok: &Tokenizer,
        chat: &mut Chat<'_>,
        session: &mut Session,
        text: &str,
        style: Style,
        show_thinking: bool,
        out: &mut impl std::io::Write,
    ) -> Result<SpecStats> {
        let context = engine.plan().context as usize;
        let pending = chat.pending(session, text)?;
        let (pending, images) = match engine.image_placeholder() {
            Some(p) if !chat.images_of(session).is_empty() => {
                k3_generate::media::expand(tok, p, engine.hidden(), &pending, chat.images_of(session))?
            }
            _ => (pending, Vec::new()),
        };
        // Room for the turn and at least one answer token.
        if session.tokens() + pending.len() >= context {
            style.note(&format!(
                "[this turn would pass the context of {context} tokens: /clear starts a new conversation, or raise --context]"
            ));
            return Ok(SpecStats::default());
        }
        self.cancel.store(false, std::sync::atomic::Ordering::SeqCst);
        let _armed = signals::arm();
        let t0 = std::time::Instant::now();
        let stats = self.stats;
        let turn = match self.start(engine, tok, chat, session, &pending, &images) {
            Ok(turn) => turn,
            Err(e) => {
                chat.record(text, None);
                chat.live = false;
                return Err(e);
            }
        };
        let calls = k3_text::toolcall::ToolCallReader::new(tok, k3_generate::dialect(engine.config().family));
        let mut a = show::answer(engine, turn, tok, calls, style, show_thinking, out);
        chat.record(text, Some(&a));
        if let Some(e) = a.failed.take() {
            chat.live = false;
            return Err(e);
        }
        match a.finish {
            Some(Finish::Length) => style.note(&format!(
                "[answer cut at --max-tokens {}: /set max_tokens N allows more]",
                chat.params.max_tokens
            )),
            Some(Finish::Cancelled) => style.note("[stopped]"),
            Some(Finish::ContextFull) => style.note(&format!(
                "[answer cut: the context of {context} tokens is full: /clear starts a new conversation]"
            )),
            _ => {}
        }
        if stats {
            eprintln!(
                "turn: {} prompt tokens, {} answer tokens in {:.2} s; {} of {context} context tokens used",
                pending.len(),
                a.tokens,
                t0.elapsed().as_secs_f64(),
                session.tokens()
            );
        }
        Ok(a.spec)
    }

    /// The turn's prompt run (from the prompt cache on the first turn), ready to answer.
    fn start<'s, 'e>(
        self,
        engine: &'e Engine<'_>,
        tok: &'e Tokenizer,
        chat: &Chat<'_>,
        session: &'s mut Session,
        pending: &[u32],
        images: &[k3_engine::Inserted],
    ) -> Result<Generator<'s, 'e>> {
        let first = session.tokens() == 0 && chat.messages.iter().all(|m| m.role == Role::System);
        // Token states do not say which image a prompt held: a prompt with images is computed.
        let mut cache = self.cache.filter(|_| first && images.is_empty());
        let (from, kept_logits) = match cache.as_deref_mut() {
            Some(c) => {
                let resume_point = system_resume_point(&chat.format, &chat.opening(), chat.system.as_deref(), pending);
                first_turn_from_cache(engine, c, session, pending, resume_point, self.stats)?
            }
            None => (0, None),
        };
        // A long turn shows its prefill.
        let rest = pending.len() - from;
        let pb = (rest > 256).then(|| Progress::new("prompt", rest as u64, Unit::Items("tokens")));
        let params = chat.params.clone();
        let turn = match (from == pending.len(), kept_logits) {
            (true, Some(l)) => Generator::resume(engine, session, l, Some(tok), params)?,
            _ => Generator::start_with_images(
                engine,
                session,
                &pending[from..],
                images,
                Some(tok),
                params,
                &mut |done, _| {
                    if let Some(pb) = &pb {
                        pb.set_position(done as u64);
                    }
                },
            )?,
        };
        if let Some(pb) = pb {
            pb.finish();
        }
        if let Some(c) = cache
            && from < pending.len()
            && turn.session().tokens() > 0
            && turn.session().ids().ends_with(pending)
        {
            c.keep(engine, turn.session(), Some(turn.last_logits(engine)));
        }
        Ok(turn)
    }
}

/// Where the system turn ends in the first turn's tokens (0 without a system prompt): the state
/// a new chat with the same system prompt resumes.
fn system_resume_point(format: &ChatFormat<'_>, o: &PromptOptions<'_>, system: Option<&str>, pending: &[u32]) -> usize {
    let Some(system) = system else { return 0 };
    let Ok(part) = format.prompt_with(&[Message::new(Role::System, system)], o) else { return 0 };
    part.iter().zip(pending).take_while(|(a, b)| a == b).count()
}

/// The first turn's start from the prompt cache: the longest kept state `pending` begins with is
/// restored into `session`, then the prompt is run up to the system turn's end and that state
/// kept. Gives where the rest of the prompt starts, and the kept logits when nothing is left.
fn first_turn_from_cache(
    engine: &Engine<'_>,
    cache: &mut PromptCache,
    session: &mut Session,
    pending: &[u32],
    resume_point: usize,
    stats: bool,
) -> Result<(usize, Option<Vec<f32>>)> {
    let (restored_session, logits, restored) = crate::prompt_cache::start(Some(&mut *cache), engine, pending);
    *session = restored_session;
    if stats {
        eprintln!("{}", cache.describe(restored, pending.len()));
    }
    let mut from = restored.tokens;
    if resume_point > from && resume_point < pending.len() {
        for c in pending[from..resume_point].chunks(engine.prefill_chunk().max(1)) {
            engine.forward_last(session, c)?;
        }
        cache.keep(engine, session, None);
        from = resume_point;
    }
    Ok((from, logits))
}
