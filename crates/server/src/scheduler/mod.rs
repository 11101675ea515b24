//! The one thread that owns the engine: requests join the running batch at the next step and
//! leave when they end (continuous batching). Each step feeds every active sequence — a chunk of
//! its prompt while it prefills, else the token sampled after its last step — through one
//! [`Engine::forward_batch`], so trunk weights and shared experts are read once for all of them;
//! each sequence's logits are the bits it would get alone, so what a client receives does not
//! depend on who else is being served. A constrained answer's next mask is computed on the mask
//! threads ([`crate::masks`]) while the batch steps; a sequence whose mask has not landed keeps
//! its logits and sits out the steps until it does, so a costly schema holds up only its own
//! request.

mod prefill;

use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use k3_engine::{Engine, Inserted, Logits, Seq, Session};
use k3_generate::{Decoder, Emit, Finish};
use k3_text::tokenizer::Tokenizer;
use tokio::sync::mpsc as tmpsc;

use crate::job::{Event, Job, Progress, Tally};
use crate::masks::{Landed, MaskPool, PendingMask};
use crate::metrics::Metrics;
use crate::preparing::Preparing;
use crate::reqlog::PrefillLog;
use crate::status::Status;
use k3_generate::cache::Scope;
use k3_generate::cache::{Kept, PromptCache};

pub use prefill::{PREFILL_CHUNK, prefill_rows};

/// A sequence in the running batch.
struct Active<'t> {
    session: Session,
    decoder: Decoder<'t>,
    prompt: Vec<u32>,
    /// Prompt tokens fed so far (from the start: those a kept state already held).
    fed: usize,
    cached: usize,
    /// The token to feed next (after the prompt).
    next: Option<u32>,
    /// Where the prefill stops next to keep the state (ascending, inside the prompt).
    resume_points: Vec<usize>,
    /// Logits to sample from without a step: the whole prompt's, kept with a state that holds
    /// it all, or a step's, kept while the mask they are sampled under is computed.
    pending: Option<Vec<f32>>,
    /// The mask the next token is sampled under, being computed ([`crate::masks`]).
    mask: Option<PendingMask>,
    events: tmpsc::UnboundedSender<Event>,
    /// No tokenizer: each token's id is its text.
    ids_out: bool,
    scope: Scope,
    /// The prompt's images' rows at their positions.
    images: Vec<Inserted>,
    tally: Arc<Tally>,
    log: PrefillLog,
    /// When its prefill started, if it asked for progress events.
    progress: Option<Instant>,
}

impl Active<'_> {
    fn prefilling(&self) -> bool {
        self.fed < self.prompt.len()
    }

    /// Where this prefill stops next: a resume point, or the prompt's end.
    fn stop(&self) -> usize {
        self.resume_points.first().copied().unwrap_or(self.prompt.len())
    }

    /// What this sequence feeds in the coming step: `rows` of its prompt while it prefills (up
    /// to the next stop).
    fn input(&self, rows: usize) -> &[u32] {
        if self.prefilling() {
            &self.prompt[self.fed..(self.fed + rows.max(1)).min(self.stop())]
        } else {
            std::slice::from_ref(self.next.as_ref().expect("a decoding sequence has its next token"))
        }
    }

    /// Whether it cannot go on until its mask lands: it has its logits, not its mask.
    fn waiting(&mut self) -> bool {
        self.pending.is_some() && self.mask.as_mut().is_some_and(|m| matches!(m.poll(), Landed::Waiting))
    }

    /// Starts computing the mask of its next token, when it needs one (without mask threads,
    /// the decoder computes it when it samples).
    fn plan_mask(&mut self, pool: Option<&MaskPool>) {
        self.mask = pool.and_then(|p| self.decoder.mask_job().map(|j| p.submit(j)));
    }

    /// Tells a job that asked how far its prompt has been read.
    fn report_progress(&self) {
        if let Some(start) = self.progress {
            let time_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
            let p = Progress { total: self.prompt.len(), cache: self.cached, processed: self.fed, time_ms };
            self.send(Event::Progress(p));
        }
    }

    fn send(&self, e: Event) {
        // A client that left is noticed at the next step (`is_closed`).
        let _ = self.events.send(e);
    }

    fn done(&mut self, finish: Finish) {
        let text = self.decoder.flush();
        let reasoning = self.decoder.take_reasoning();
        if !text.is_empty() || !reasoning.is_empty() {
            self.send(Event::Delta { text, reasoning, token: u32::MAX, logprob: None });
        }
        let (prompt_tokens, completion_tokens) = (self.prompt.len(), self.decoder.produced());
        let stop_sequence = self.decoder.stop_string().map(str::to_string);
        self.send(Event::Done { finish, stop_sequence, prompt_tokens, cached_tokens: self.cached, completion_tokens });
    }
}

/// Runs until every sender of `jobs` is gone: admits jobs up to `max_batch`, steps the batch,
/// streams what each sequence says.
pub fn run(
    engine: &Engine<'_>,
    tok: Option<&Tokenizer>,
    jobs: &mpsc::Receiver<Job>,
    max_batch: usize,
    cache: &mut PromptCache,
    status: &Status,
    metrics: &Metrics,
) {
    let pool = MaskPool::new()
        .inspect_err(|e| eprintln!("no threads for constrained answers' masks ({e}): the scheduler computes them"))
        .ok();
    let pool = pool.as_ref();
    let mut active: Vec<Active<'_>> = Vec::new();
    // Jobs whose images are going through the tower, a block per loop beside the batch's step.
    let mut preparing: Vec<Preparing<'_>> = Vec::new();
    loop {
        // Wait for work when idle; otherwise take what has arrived, up to the batch size.
        if active.is_empty() && preparing.is_empty() {
            match jobs.recv() {
                Ok(j) => take(engine, tok, j, (&mut active, &mut preparing), cache, (status, pool)),
                Err(_) => return,
            }
        }
        while active.len() + preparing.len() < max_batch {
            match jobs.try_recv() {
                Ok(j) => take(engine, tok, j, (&mut active, &mut preparing), cache, (status, pool)),
                Err(_) => break,
            }
        }
        // The server's drain is over: what still runs ends now, each with its finish.
        if status.cut.load(Ordering::SeqCst) {
            for mut a in active.drain(..) {
                a.decoder.stop(Finish::Cancelled);
                a.done(Finish::Cancelled);
            }
            for p in preparing.drain(..) {
                p.cancel();
            }
        }
        // A client that disconnected stops costing tokens here.
        let before = active.len() + preparing.len();
        preparing.retain(|p| !p.closed());
        active.retain(|a| !a.events.is_closed());
        metrics.cancelled.fetch_add((before - active.len() - preparing.len()) as u64, Ordering::Relaxed);
        // One tower block of the first image being prepared; a finished job joins the batch.
        if let Some(p) = preparing.first_mut()
            && p.advance(engine)
        {
            match preparing.remove(0).into_job(engine, tok) {
                Ok(ready) => admit(engine, tok, ready, &mut active, (cache, pool)),
                Err((events, e)) => {
                    let _ = events.send(Event::Failed(e));
                }
            }
        }
        status.active.store(active.len(), Ordering::Relaxed);
        if active.is_empty() {
            continue;
        }
        if let Some(p) = pool {
            p.forget_landed();
            if preparing.is_empty() && active.iter_mut().all(Active::waiting) {
                // Nothing can step until a mask lands: wait for one, looking at the queue and
                // the clients again at least this often.
                p.wait(Duration::from_millis(20));
                continue;
            }
        }
        step(engine, &mut active, cache, (status, metrics), pool);
        status.active.store(active.len(), Ordering::Relaxed);
        metrics.record_prompt_cache(cache);
        for w in cache.take_warnings() {
            eprintln!("prompt cache: {w}");
        }
    }
}

/// A job from the queue: into the batch, or, with images, to the tower first.
fn take<'t, 'e>(
    engine: &'e Engine<'_>,
    tok: Option<&'t Tokenizer>,
    job: Job,
    (active, preparing): (&mut Vec<Active<'t>>, &mut Vec<Preparing<'e>>),
    cache: &mut PromptCache,
    (status, pool): (&Status, Option<&MaskPool>),
) {
    status.queued.fetch_sub(1, Ordering::Relaxed);
    match job.images.is_empty() {
        true => admit(engine, tok, (job, Vec::new()), active, (cache, pool)),
        false => preparing.push(Preparing::new(job)),
    }
}

fn admit<'t>(
    engine: &Engine<'_>,
    tok: Option<&'t Tokenizer>,
    (job, images): (Job, Vec<Inserted>),
    active: &mut Vec<Active<'t>>,
    (cache, pool): (&mut PromptCache, Option<&MaskPool>),
) {
    match Decoder::new(tok, job.params) {
        Ok(mut decoder) => {
            decoder.observe(&job.prompt);
            let (session, pending) = match cache.lookup(engine, job.scope, &job.prompt) {
                Some(r) => (r.session, r.logits),
                None => (engine.session(), None),
            };
            let cached = session.tokens();
            job.tally.prompt.store(job.prompt.len(), Ordering::Relaxed);
            job.tally.cached.store(cached, Ordering::Relaxed);
            let resume_points = job.resume_points.into_iter().filter(|&c| c > cached && c < job.prompt.len()).collect();
            let mut a = Active {
                session,
                decoder,
                prompt: job.prompt,
                fed: cached,
                cached,
                next: None,
                resume_points,
                pending,
                mask: None,
                events: job.events,
                ids_out: tok.is_none(),
                scope: job.scope,
                images,
                tally: job.tally,
                log: job.log.started(cached),
                progress: job.progress.then(Instant::now),
            };
            // Where it starts: a prompt a kept state holds whole gets no prefill step to report.
            a.report_progress();
            // The first token's mask is computed while the prompt is.
            a.plan_mask(pool);
            active.push(a);
        }
        Err(e) => {
            let _ = job.events.send(Event::Failed(e.to_string()));
        }
    }
}

/// One forward step over the batch, then each decoding sequence's next token.
fn step(
    engine: &Engine<'_>,
    active: &mut Vec<Active<'_>>,
    cache: &mut PromptCache,
    (status, metrics): (&Status, &Metrics),
    pool: Option<&MaskPool>,
) {
    let inputs = inputs(engine, active);
    // Sequences with kept logits (their whole prompt's, or a step's whose mask was not ready)
    // sample from those: no step.
    let stepping = active.iter().filter(|a| a.pending.is_none()).count();
    let mut stepped = forward(engine, active, &inputs, metrics).into_iter();
    if stepping > 0 {
        metrics.record_step(stepping, inputs.iter().map(Vec::len).sum());
    }
    if let (Some(a), Ok(mut c)) = (active.first(), status.cache.lock()) {
        *c = Some(a.session.stats.cache);
    }
    let logits: Vec<Option<Vec<f32>>> = active
        .iter_mut()
        .map(|a| match a.pending.take() {
            Some(row) => Some(row),
            None => stepped.next().flatten(),
        })
        .collect();
    let ended: Vec<bool> = active
        .iter_mut()
        .zip(logits)
        .zip(&inputs)
        .map(|((a, row), ids)| match row {
            Some(row) => advance(engine, a, row, ids.len(), cache, (metrics, pool)),
            None => true,
        })
        .collect();
    let mut ended = ended.into_iter();
    active.retain(|_| !ended.next().unwrap_or(false));
}

/// What each sequence feeds in the coming step (empty for one sampling from kept logits): a
/// share of its prompt by [`prefill_rows`] while it prefills, else its next token.
fn inputs(engine: &Engine<'_>, active: &[Active<'_>]) -> Vec<Vec<u32>> {
    let decoding = active.iter().filter(|a| a.pending.is_none() && !a.prefilling()).count();
    let remaining: Vec<usize> =
        active.iter().filter(|a| a.pending.is_none() && a.prefilling()).map(|a| a.stop() - a.fed).collect();
    let mut rows = prefill_rows(engine.prefill_chunk(), decoding, &remaining).into_iter();
    active
        .iter()
        .map(|a| match (&a.pending, a.prefilling()) {
            (Some(_), _) => Vec::new(),
            (None, true) => a.input(rows.next().unwrap_or(1)).to_vec(),
            (None, false) => a.input(1).to_vec(),
        })
        .collect()
}

/// The batch's forward: each stepping sequence's last logits, in order, `None` for one that
/// failed (and was told). A failed batch is retried one sequence at a time, so only the
/// sequences the failure concerns fail.
fn forward(
    engine: &Engine<'_>,
    active: &mut [Active<'_>],
    inputs: &[Vec<u32>],
    metrics: &Metrics,
) -> Vec<Option<Vec<f32>>> {
    let result = {
        let mut seqs: Vec<Seq<'_>> = active
            .iter_mut()
            .zip(inputs)
            .filter(|(a, _)| a.pending.is_none())
            .map(|(a, ids)| {
                // The session holds the prompt from its start: its length is where the chunk is.
                let from = a.session.tokens();
                Seq::new(&mut a.session, ids, Logits::Last).with_images(&a.images, from)
            })
            .collect();
        if seqs.is_empty() {
            Ok(Vec::new())
        } else {
            guarded(|| engine.forward_batch(&mut seqs).map_err(|e| e.to_string()))
        }
    };
    match result {
        Ok(l) => l.into_iter().map(Some).collect(),
        Err(e) => {
            metrics.failed_steps.fetch_add(1, Ordering::Relaxed);
            eprintln!("a step of {} sequences failed: {e}", active.len());
            // The step's sessions are now in an unknown state: each is rebuilt from its tokens
            // and stepped alone.
            active
                .iter_mut()
                .zip(inputs)
                .filter(|(a, _)| a.pending.is_none())
                .map(|(a, ids)| match alone(engine, &mut a.session, ids, &a.images) {
                    Ok(row) => Some(row),
                    Err(e) => {
                        a.send(Event::Failed(client_message(&e)));
                        None
                    }
                })
                .collect()
        }
    }
}

/// One sequence after a step that fed it `fed` tokens and gave `row`: its prefill advances
/// (keeping the state at resume points and at the prompt's end), or its next token is sampled
/// and sent — once its mask is ready; until then it keeps `row` and sits out the steps. True
/// when the sequence has ended.
fn advance(
    engine: &Engine<'_>,
    a: &mut Active<'_>,
    row: Vec<f32>,
    fed: usize,
    cache: &mut PromptCache,
    (metrics, pool): (&Metrics, Option<&MaskPool>),
) -> bool {
    if a.fed < a.prompt.len() {
        a.fed += fed;
        metrics.prompt_tokens.fetch_add(fed as u64, Ordering::Relaxed);
        a.log.advanced(a.fed, a.prompt.len());
        a.report_progress();
        if a.resume_points.first() == Some(&a.fed) {
            a.resume_points.remove(0);
            cache.insert(engine, a.scope, &a.session, Kept::ResumePoint);
        }
        if a.fed < a.prompt.len() {
            return false;
        }
        // The state after the prompt, with its logits: where the same request again starts
        // sampling at once, and the same conversation's next request resumes.
        cache.insert(engine, a.scope, &a.session, Kept::PromptEnd(&row));
    }
    if let Some(why) = a.decoder.limit() {
        a.decoder.stop(why);
        cache.insert(engine, a.scope, &a.session, Kept::AnswerEnd);
        a.done(why);
        return true;
    }
    let mask = match a.mask.as_mut().map(PendingMask::poll) {
        Some(Landed::Waiting) => {
            a.pending = Some(row);
            return false;
        }
        Some(Landed::Failed) => {
            a.send(Event::Failed("an internal error: the answer's constraint could not be checked".into()));
            return true;
        }
        Some(Landed::Ready(m)) => Some(m),
        None => None,
    };
    let id = a.decoder.sample_with(&row, mask);
    a.mask = None;
    let logprob = a.decoder.logprob(&row, id);
    metrics.completion_tokens.fetch_add(1, Ordering::Relaxed);
    metrics.recent_tokens.add(1);
    let emitted = a.decoder.emit(id, a.session.tokens(), engine.plan().context);
    a.tally.completion.store(a.decoder.produced(), Ordering::Relaxed);
    match emitted {
        Ok(Emit::Continue(text)) => {
            // Without a tokenizer, the ids are the text (as `k3-cli generate` prints them).
            let text = if a.ids_out { format!("{id} ") } else { text };
            let reasoning = a.decoder.take_reasoning();
            a.send(Event::Delta { text, reasoning, token: id, logprob });
            a.next = Some(id);
            // Computed while the batch steps with this token.
            a.plan_mask(pool);
            false
        }
        Ok(Emit::End(text, _)) => {
            let stop_id = a.decoder.params().stop_ids.contains(&id);
            let text = if a.ids_out && !stop_id { format!("{id} ") } else { text };
            let reasoning = a.decoder.take_reasoning();
            // The end-of-turn id is no part of the answer: nor is its log-probability.
            let logprob = logprob.filter(|_| !stop_id);
            if !text.is_empty() || !reasoning.is_empty() || logprob.is_some() {
                a.send(Event::Delta { text, reasoning, token: id, logprob });
            }
            let why = a.decoder.finish().unwrap_or(Finish::Stop);
            // The state after the answer (its end marker unfed): where a follow-up that
            // quotes the answer back token for token resumes.
            cache.insert(engine, a.scope, &a.session, Kept::AnswerEnd);
            a.done(why);
            true
        }
        Err(e) => {
            a.send(Event::Failed(e.to_string()));
            true
        }
    }
}

/// Runs a step, a panic inside it turned into an error (the scheduler and the other sequences
/// go on).
fn guarded<T>(step: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)) {
        Ok(r) => r,
        Err(p) => {
            let what = p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied());
            Err(format!("an internal error: {}", what.unwrap_or("a panic")))
        }
    }
}

/// `session` rebuilt from the tokens it held before a failed step, then `input` fed to it
/// alone: its last logits, or why this sequence cannot go on.
fn alone(engine: &Engine<'_>, session: &mut Session, input: &[u32], images: &[Inserted]) -> Result<Vec<f32>, String> {
    let held = session.ids().to_vec();
    let mut fresh = engine.session();
    let run = |s: &mut Session, ids: &[u32], from: usize| {
        guarded(|| engine.forward_last_with_images(s, ids, images, from).map_err(|e| e.to_string()))
    };
    let chunk = engine.prefill_chunk().max(1);
    for (i, c) in held.chunks(chunk).enumerate() {
        run(&mut fresh, c, i * chunk)?;
    }
    let row = run(&mut fresh, input, held.len())?;
    *session = fresh;
    Ok(row)
}

/// What a client is told of a failure: the model's words without the server's paths.
fn client_message(e: &str) -> String {
    let words: Vec<String> = e
        .split(' ')
        .map(|w| {
            let lead = w.find(|c: char| c.is_alphanumeric() || c == '/' || c == '.').unwrap_or(0);
            let (open, path) = w.split_at(lead);
            match path.rfind('/') {
                Some(i) if path.starts_with('/') || path.starts_with("./") => format!("{open}{}", &path[i + 1..]),
                _ => w.to_string(),
            }
        })
        .collect();
    format!("the model failed: {}", words.join(" "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn client_messages_carry_no_server_paths() {
        let m = super::client_message(
            "reading (/srv/models/k3.waste/experts-00001.waste): expert record (layer 3, expert 7)",
        );
        assert_eq!(m, "the model failed: reading (experts-00001.waste): expert record (layer 3, expert 7)");
        assert!(!super::client_message("`/home/u/m/trunk.waste` bad").contains("/home"));
    }
}
