//! A job's images on their way to the batch, in slices so the sequences already decoding keep
//! getting tokens: each image is resized and cut into patches on a thread of its own (a
//! 64-megapixel resize is about a second of one core, which on the scheduler's thread paused
//! every stream that long), then goes through the tower a block at a time on the scheduler's
//! thread between steps of the batch (a whole K3 tower is ~20 s on 8 cores; a block is a 27th of
//! it). An image's share of the in-flight pixel budget is given back once its patches are made.
//! When the last image is done the prompt is framed ([`k3_generate::media::expand`]) and the job
//! joins the batch.

use std::sync::mpsc;
use std::time::Duration;

use k3_engine::{Engine, ImageWork, Inserted};
use k3_generate::Finish;
use k3_generate::media::PromptImage;
use k3_text::tokenizer::Tokenizer;
use k3_vision::Patches;
use tokio::sync::mpsc as tmpsc;

use crate::job::{Event, Job};
use k3_generate::cache::Scope;

/// How long a scheduler loop waits for patches still being made before stepping the batch
/// again (it would spin otherwise when nothing else runs; a step waits at most this).
const PATCHES_WAIT: Duration = Duration::from_millis(1);

/// A job and how far its images are.
pub struct Preparing<'e> {
    job: Job,
    done: Vec<PromptImage>,
    /// The job's images' patches, in order, from the thread making them.
    patches: Option<mpsc::Receiver<Result<Patches, String>>>,
    work: Option<ImageWork<'e>>,
    /// Why it cannot go on (told when it is taken out).
    failed: Option<String>,
}

impl<'e> Preparing<'e> {
    pub fn new(job: Job) -> Self {
        Preparing { job, done: Vec::new(), patches: None, work: None, failed: None }
    }

    /// The client went away.
    pub fn closed(&self) -> bool {
        self.job.events.is_closed()
    }

    /// The server is stopping: the job ends before its prompt.
    pub fn cancel(self) {
        let done = Event::Done {
            finish: Finish::Cancelled,
            stop_sequence: None,
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
        };
        let _ = self.job.events.send(done);
    }

    /// One slice: an image's patches taken (or waited for a moment), one tower block, or an
    /// image finished; true when every image is done or the job has failed: it is ready to be
    /// taken out.
    pub fn advance(&mut self, engine: &'e Engine<'_>) -> bool {
        if self.failed.is_some() || self.done.len() == self.job.images.len() {
            return true;
        }
        if let Some(work) = self.work.as_mut() {
            if !engine.advance_image(work)
                && let Some(w) = self.work.take()
            {
                self.done.push(engine.finish_image(w));
            }
            return self.done.len() == self.job.images.len();
        }
        if self.patches.is_none() {
            match self.start_patches(engine) {
                Ok(rx) => self.patches = Some(rx),
                Err(e) => self.failed = Some(e),
            }
        }
        let Some(rx) = &self.patches else { return true };
        match rx.recv_timeout(PATCHES_WAIT) {
            Ok(Ok(p)) => match engine.start_patches(&p, self.job.images[self.done.len()].digest) {
                Ok(w) => self.work = Some(w),
                Err(e) => self.failed = Some(e.to_string()),
            },
            Ok(Err(e)) => self.failed = Some(e),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.failed = Some("the images' preparation stopped before their patches were made".into());
            }
        }
        self.failed.is_some()
    }

    /// Starts the thread that resizes and patches the job's decoded pictures, one at a time
    /// and one ahead of the tower at most; each picture, and its share of the in-flight budget,
    /// is dropped once its patches are made (or when the job is gone).
    fn start_patches(&mut self, engine: &Engine<'_>) -> Result<mpsc::Receiver<Result<Patches, String>>, String> {
        let processor = engine.image_processor().cloned().ok_or("this model reads no images")?;
        let pictures: Vec<_> = self.job.images.iter_mut().filter_map(|i| i.take_picture()).collect();
        if pictures.len() != self.job.images.len() {
            return Err("an image of the request was not decoded".into());
        }
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("k3-image-patches".into())
            .spawn(move || {
                for (picture, lease) in pictures {
                    let patches = k3_vision::patch_image(&picture, &processor).map_err(|e| e.to_string());
                    drop((picture, lease));
                    if tx.send(patches).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("could not start preparing the images: {e}"))?;
        Ok(rx)
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
    let (prompt, inserted) = match k3_generate::media::expand(tok, placeholder, engine.hidden(), &job.prompt, images) {
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
    // The template's resume points counted the unframed prompt: past the first image they move.
    let first = inserted.first().map_or(usize::MAX, |i| i.at);
    job.resume_points.retain(|&c| c < first);
    job.prompt = prompt;
    job.images.clear();
    Ok((job, inserted))
}
