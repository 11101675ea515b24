//! A job's images on their way through the tower: a block at a time, on the scheduler's thread
//! between steps of the batch (a whole K3 tower is ~20 s on 8 cores; a block is a 27th of it), so
//! the sequences already decoding keep getting tokens. When the last image is done the prompt is
//! framed ([`k3_engine::media::expand`]) and the job joins the batch.

use k3_engine::generate::Finish;
use k3_engine::media::PromptImage;
use k3_engine::tokenizer::Tokenizer;
use k3_engine::{Engine, ImageWork, Inserted};
use tokio::sync::mpsc as tmpsc;

use crate::prefix::Scope;
use crate::scheduler::{Event, Job};

/// A job and how far its images are.
pub struct Preparing<'e> {
    job: Job,
    done: Vec<PromptImage>,
    work: Option<ImageWork<'e>>,
    /// Why it cannot go on (told when it is taken out).
    failed: Option<String>,
}

impl<'e> Preparing<'e> {
    pub fn new(job: Job) -> Self {
        Preparing { job, done: Vec::new(), work: None, failed: None }
    }

    /// The client went away.
    pub fn closed(&self) -> bool {
        self.job.events.is_closed()
    }

    /// The server is stopping: the job ends before its prompt.
    pub fn cancel(self) {
        let done = Event::Done { finish: Finish::Cancelled, prompt_tokens: 0, cached_tokens: 0, completion_tokens: 0 };
        let _ = self.job.events.send(done);
    }

    /// One tower block (or an image started or finished); true when every image is done or the
    /// job has failed: it is ready to be taken out.
    pub fn advance(&mut self, engine: &'e Engine<'_>) -> bool {
        if self.failed.is_some() {
            return true;
        }
        let Some(work) = self.work.as_mut() else {
            let Some(img) = self.job.images.get(self.done.len()) else { return true };
            match engine.start_image(&img.picture, img.digest) {
                Ok(w) => self.work = Some(w),
                Err(e) => self.failed = Some(e.to_string()),
            }
            return self.failed.is_some();
        };
        if !engine.advance_image(work)
            && let Some(w) = self.work.take()
        {
            self.done.push(engine.finish_image(w));
        }
        self.done.len() == self.job.images.len()
    }

    /// The job with its prompt framed and where its images' rows go, or the error to send.
    pub fn into_job(
        self,
        engine: &Engine<'_>,
        tok: Option<&Tokenizer>,
    ) -> Result<(Job, Vec<Inserted>), (tmpsc::UnboundedSender<Event>, String)> {
        let Preparing { job, done, failed, .. } = self;
        match failed {
            Some(e) => Err((job.events, e)),
            None => frame(engine, tok, job, &done),
        }
    }
}

/// The prompt framed with its images. A prompt with images keeps and resumes states under a
/// scope that also names the images (their positions and file hashes): identical image bytes
/// resume, others never.
fn frame(
    engine: &Engine<'_>,
    tok: Option<&Tokenizer>,
    mut job: Job,
    images: &[PromptImage],
) -> Result<(Job, Vec<Inserted>), (tmpsc::UnboundedSender<Event>, String)> {
    let (Some(tok), Some(placeholder)) = (tok, engine.image_placeholder()) else {
        return Err((job.events, "this model reads no images".into()));
    };
    let (prompt, inserted) = match k3_engine::media::expand(tok, placeholder, engine.hidden(), &job.prompt, images) {
        Ok(p) => p,
        Err(e) => return Err((job.events, e.to_string())),
    };
    let context = engine.plan().context as usize;
    if prompt.len() >= context {
        let e = format!(
            "the prompt with its images is {} tokens, which leaves no room in a context of {context}",
            prompt.len()
        );
        return Err((job.events, e));
    }
    let mut key = job.scope.0.to_le_bytes().to_vec();
    for (i, img) in inserted.iter().zip(images) {
        key.extend((i.at as u64).to_le_bytes());
        key.extend(img.digest.to_le_bytes());
    }
    job.scope = Scope(xxhash_rust::xxh3::xxh3_64(&key) | 1);
    // The template's checkpoints counted the unframed prompt: past the first image they move.
    let first = inserted.first().map_or(usize::MAX, |i| i.at);
    job.checkpoints.retain(|&c| c < first);
    job.prompt = prompt;
    job.images.clear();
    Ok((job, inserted))
}
