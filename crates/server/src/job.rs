//! What the HTTP side and the scheduler exchange: a [`Job`] in, [`Event`]s back, through a
//! [`Handle`], with the job's [`Tally`] as it runs; and the [`ModelInfo`] requests are checked
//! against. Both sides import this; it imports neither.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use k3_generate::{Finish, GenerateParams};
use tokio::sync::mpsc as tmpsc;

pub use crate::status::Status;
use k3_generate::cache::Scope;

/// One request for the scheduler.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub events: tmpsc::UnboundedSender<Event>,
    /// Whose kept states it may start from and leave behind.
    pub scope: Scope,
    /// Prompt lengths (ascending) at which to stop the prefill and keep the state: where the
    /// prompts of later requests are likely to part from this one's (the chat template's
    /// resume points, `ChatRequest::prepare` in the OpenAI api).
    pub resume_points: Vec<usize>,
    /// Decoded images, one per placeholder of `prompt`, in order: their rows are computed and
    /// the prompt framed ([`k3_generate::media::expand`]) when the job is admitted.
    pub images: Vec<crate::images::RequestImage>,
    /// Its counts as they grow, for its log line however it ends.
    pub tally: Arc<Tally>,
    /// Lines while its prompt is read, when that takes a while.
    pub log: crate::reqlog::PrefillLog,
    /// Send [`Event::Progress`] after each prefill step (`return_progress: true`).
    pub progress: bool,
}

pub use k3_generate::sample::TokenLogprob;

/// A request's counts as the scheduler knows them, shared with its log line: what the line says
/// when the request fails or its client leaves before an answer's usage comes back.
#[derive(Debug, Default)]
pub struct Tally {
    pub prompt: AtomicUsize,
    pub cached: AtomicUsize,
    /// Tokens sampled.
    pub completion: AtomicU64,
}

/// How far a prompt's prefill has got, as llama-server reports it (`prompt_progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Prompt tokens in all.
    pub total: usize,
    /// Those a kept state already held.
    pub cache: usize,
    /// Those read so far, the cached ones included.
    pub processed: usize,
    /// Since the prefill started.
    pub time_ms: u64,
}

/// What a request hears back, in order: prefill progress (only for a job that asked), text
/// deltas, then one `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Text of the answer and (K3 thinking) of the reasoning; `token` is `u32::MAX` for text
    /// flushed at the end.
    Delta {
        text: String,
        reasoning: String,
        token: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish: Finish,
        /// The stop string that ended it ([`Finish::StopString`]).
        stop_sequence: Option<String>,
        prompt_tokens: usize,
        cached_tokens: usize,
        completion_tokens: u64,
    },
    Failed(String),
    Progress(Progress),
}

/// The model's shape, for `/v1/models`, and what requests are checked against.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub id: String,
    pub family: k3_engine::config::Family,
    pub context: u64,
    pub vocab: usize,
    pub layers: usize,
    pub hidden: usize,
    pub eos: Vec<u32>,
    /// The model reads images.
    pub sees: bool,
    /// The longest token's text in bytes (1 without a tokenizer).
    pub max_token_bytes: usize,
    /// The sampling settings of a request that states none: the model's recommended ones
    /// (`generation_config.json`), else temperature 0.6 and top-p 0.95.
    pub sampling: k3_generate::sample::SamplerConfig,
    /// Size, parameters, template and abilities, for Ollama's `/api/tags` and `/api/show`.
    pub about: crate::about::About,
}

impl ModelInfo {
    /// The longest token's text in bytes (1 without a tokenizer): what bounds a text by tokens.
    pub fn longest_token(tok: Option<&k3_text::tokenizer::Tokenizer>) -> usize {
        tok.and_then(|t| t.token_texts().iter().flatten().map(String::len).max()).unwrap_or(1)
    }
}

#[derive(Debug, Clone)]
pub struct Handle {
    jobs: mpsc::SyncSender<Job>,
    pub status: Arc<Status>,
}

/// Why a job was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full (429).
    Busy,
    /// The scheduler is gone (the model failed to load, or the server is stopping).
    Gone,
}

impl Handle {
    pub fn new(jobs: mpsc::SyncSender<Job>, status: Arc<Status>) -> Self {
        Handle { jobs, status }
    }

    /// Queues a job, or says why not.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        self.status.queued.fetch_add(1, Ordering::Relaxed);
        self.jobs.try_send(job).map_err(|e| {
            self.status.queued.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::TrySendError::Full(_) => Refused::Busy,
                mpsc::TrySendError::Disconnected(_) => Refused::Gone,
            }
        })
    }
}
