//! An OpenAI-compatible HTTP server over the k3 engine (`k3-cli serve`).
//!
//! Shape (as in mistral.rs: an HTTP front talking to the engine over a request channel): axum
//! handlers on tokio check and tokenize each request ([`api`]) and send it to one scheduler
//! thread that owns the engine ([`scheduler`]); that thread steps every running sequence in one
//! batched forward pass and streams each one's text back over its own channel ([`routes`] turns
//! those events into JSON or SSE). `/health` answers 503 until the model is loaded.

pub mod about;
pub mod answer;
pub mod anthropic;
pub mod api;
pub mod boundary;
pub mod catalog;
pub mod error;
pub mod histogram;
pub mod image_budget;
pub mod images;
pub mod job;
pub mod listen;
pub mod logprobs;
mod masks;
pub mod metrics;
pub mod ollama;
pub mod page;
mod preparing;
pub mod reqlog;
pub mod request;
pub mod response_store;
pub mod responses;
pub mod resume_points;
pub mod routes;
pub mod scheduler;
pub mod state;
pub mod status;
pub mod tokens;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use k3_engine::{EngineOptions, OpenOptions, OwnedEngine};
use k3_text::tokenizer::Tokenizer;

use crate::boundary::Boundary;
use crate::job::{Handle, Job, ModelInfo, Status};
pub use crate::listen::{Limits, ServeError};
use crate::metrics::Metrics;
use crate::state::AppState;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub model: PathBuf,
    /// The id clients name the model by (default: the model directory's name).
    pub model_id: Option<String>,
    pub open: OpenOptions,
    pub engine: EngineOptions,
    /// Sequences stepped together at most.
    pub max_batch: usize,
    /// Requests waiting beyond the batch at most; more get a 429.
    pub queue: usize,
    /// Who may reach the server and from where: `Host` names, CORS origins, API keys.
    pub boundary: Boundary,
    /// Largest request body accepted (413 beyond).
    pub body_limit: usize,
    /// Bytes of kept states the prompt cache may hold (0: off).
    pub prompt_cache_ram: usize,
    /// A directory for kept states on disk (the prompt cache's second tier; they outlive the
    /// server), and the bytes its files may take.
    pub prompt_cache_dir: Option<PathBuf>,
    pub prompt_cache_disk: u64,
    /// Timeouts, the connection cap, the drain at a stop.
    pub limits: Limits,
    /// Total bytes of a request's stop strings at most.
    pub stop_bytes: usize,
    /// How the ready line and the request lines are written on standard error.
    pub log_format: reqlog::LogFormat,
    /// Image pixels a request may bring and how many may be decoded at once across the server.
    pub images: image_budget::ImageLimits,
    /// Responses `/v1/responses` stores (in memory, per API key): how many, and their bytes.
    pub responses: response_store::StoreLimits,
}

impl ServerOptions {
    pub fn new(model: PathBuf) -> Self {
        ServerOptions {
            model,
            model_id: None,
            open: OpenOptions::default(),
            engine: EngineOptions::default(),
            max_batch: 8,
            queue: 64,
            boundary: Boundary::default(),
            body_limit: 20 << 20,
            prompt_cache_ram: 1 << 30,
            prompt_cache_dir: None,
            prompt_cache_disk: 10 << 30,
            limits: Limits::default(),
            stop_bytes: 4096,
            log_format: reqlog::LogFormat::Text,
            images: image_budget::ImageLimits::default(),
            responses: response_store::StoreLimits::default(),
        }
    }
}

/// Starts loading the model on the scheduler thread and returns the routes at once (they answer
/// 503 until it is loaded, or with the reason it failed).
pub fn app(opts: ServerOptions) -> (Router, AppState) {
    let (router, state) = model_app(opts);
    let router = router.layer(axum::middleware::from_fn_with_state(state.boundary.clone(), boundary::check));
    (router, state)
}

/// [`app`] without the boundary's checks: the routes of one model behind [`catalog`], which
/// checks every request once before it picks the model.
pub(crate) fn model_app(opts: ServerOptions) -> (Router, AppState) {
    let (jobs, rx) = mpsc::sync_channel(opts.queue.max(1));
    let body_limit = opts.body_limit;
    let status = Arc::new(Status::default());
    let state = AppState {
        handle: Handle::new(jobs, status.clone()),
        info: Arc::new(OnceLock::new()),
        tok: Arc::new(OnceLock::new()),
        image_processor: Arc::new(OnceLock::new()),
        metrics: Arc::new(Metrics::default()),
        beginnings: Arc::default(),
        boundary: Arc::new(opts.boundary.clone()),
        body_limit,
        body_timeout: opts.limits.body_timeout,
        stop_bytes: opts.stop_bytes,
        log_format: opts.log_format,
        image_limits: opts.images,
        images_in_flight: image_budget::InFlight::new(opts.images.in_flight.max(opts.images.per_request)),
        responses: Arc::new(response_store::Store::new(opts.responses)),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
    };
    // The loader holds no sender of `jobs`: once the HTTP side is gone, the scheduler's channel
    // closes, it returns, and the prompt cache is written out (see [`serve`]).
    let loader = Loader {
        status: status.clone(),
        metrics: state.metrics.clone(),
        info: state.info.clone(),
        tok: state.tok.clone(),
        image_processor: state.image_processor.clone(),
    };
    let spawned = std::thread::Builder::new().name("k3-scheduler".into()).spawn(move || {
        let _ended = Ended(loader.status.clone());
        load_and_run(&opts, &loader, &rx);
    });
    if let Err(e) = spawned {
        fail(&status, format!("could not start the scheduler thread: {e}"));
        // No thread to end: nothing waits for one.
        status.ended.store(true, Ordering::SeqCst);
    }
    let router = Router::new()
        .merge(page::routes())
        .route("/health", get(routes::health))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{id}", get(routes::model))
        .route("/v1/chat/completions", post(routes::chat))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/version", get(ollama::version))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::disable())
        .with_state(state.clone());
    (router, state)
}

fn fail(status: &Status, why: String) {
    if let Ok(mut f) = status.failed.lock() {
        *f = Some(why);
    }
}

/// How long a stop may take writing the prompt cache's states out, once the drain is over
/// (states go out at about the drive's rate: a gigabyte of RAM tier takes seconds).
pub const STOP_FLUSH: Duration = Duration::from_secs(30);

/// Serves as [`listen::serve`] does, then, at a stop, waits for the scheduler to end and the
/// prompt cache's states to be on disk (at most [`STOP_FLUSH`] and a little more): a state kept
/// before the stop is there after it. A second stop signal (during the drain or this wait)
/// means now, as it does for the drain.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    state: AppState,
    limits: Limits,
) -> Result<(), ServeError> {
    let status = state.handle.status.clone();
    let signals = Arc::new(AtomicUsize::new(0));
    let counting = tokio::spawn(count_signals(signals.clone()).map_err(ServeError::Signals)?);
    // The router and the state hold the scheduler's channel: both go with `listen::serve`.
    drop(state);
    let served = listen::serve(listener, router, status.clone(), limits).await;
    if served.is_ok() && status.ready.load(Ordering::SeqCst) {
        let ended = async {
            while !status.ended.load(Ordering::SeqCst) && signals.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(STOP_FLUSH + Duration::from_secs(5), ended).await.is_err() {
            eprintln!("stopping: the prompt cache's states were not all written within {} s", STOP_FLUSH.as_secs());
        } else if !status.ended.load(Ordering::SeqCst) {
            eprintln!("stopping now (another signal): the prompt cache's writes are cut short");
        }
    }
    counting.abort();
    served
}

/// Counts SIGINT, SIGTERM and SIGHUP into `count` (`listen::serve` acts on them; this only
/// tells a first from a second).
pub(crate) fn count_signals(count: Arc<AtomicUsize>) -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut int, mut hup) =
        (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?);
    Ok(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = hup.recv() => {}
            }
            count.fetch_add(1, Ordering::SeqCst);
        }
    })
}

/// What the scheduler thread shares with the HTTP side (not its channel's sender).
struct Loader {
    status: Arc<Status>,
    metrics: Arc<Metrics>,
    info: Arc<OnceLock<ModelInfo>>,
    tok: Arc<OnceLock<Tokenizer>>,
    image_processor: Arc<OnceLock<k3_vision::ProcessorConfig>>,
}

/// Says the scheduler thread has ended, however it ends (the model failed, the channel closed,
/// a panic).
struct Ended(Arc<Status>);

impl Drop for Ended {
    fn drop(&mut self) {
        // A load that ended without a word (a panic before the scheduler's own guard) says so:
        // requests waiting for the model hear why instead of waiting on.
        if !self.0.ready.load(Ordering::SeqCst) && self.0.failure().is_none() {
            fail(&self.0, "the model's loading stopped on an internal error".into());
        }
        self.0.ended.store(true, Ordering::SeqCst);
    }
}

fn load_and_run(opts: &ServerOptions, state: &Loader, jobs: &mpsc::Receiver<Job>) {
    let status = &state.status;
    let loading = std::time::Instant::now();
    // The memory plan holds a full batch (each request's state and a prompt chunk) and the
    // prompt cache's kept states; a budget too small for them is refused at load, naming them.
    // Left open, the chunk is the plan's (at least a prompt chunk per sequence of the batch).
    let batch = opts.max_batch.max(1) as u64;
    let engine_opts = EngineOptions {
        sequences: opts.engine.sequences.max(batch),
        chunk: opts.engine.chunk.map(|c| c.max(scheduler::PREFILL_CHUNK as u64 * batch)),
        reserved_bytes: opts.engine.reserved_bytes.saturating_add(opts.prompt_cache_ram as u64),
        ..opts.engine.clone()
    };
    let owned = match OwnedEngine::open(&opts.model, &opts.open, engine_opts) {
        Ok(e) => e,
        Err(e) => return fail(status, format!("the model at {} did not load: {e}", opts.model.display())),
    };
    // A model without a tokenizer is served token ids in, token ids out (`/v1/completions`).
    let load_tok = || k3_generate::model_tokenizer(owned.model()).transpose();
    let (tok, shared_tok) = match (load_tok(), load_tok()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail(status, format!("the model's tokenizer did not load: {e}")),
    };
    let engine = owned.engine();
    // A chat template that fails or runs past its limits is refused here, not at a request.
    if let Some(t) = &tok
        && let Err(e) = k3_text::chat_format::ChatFormat::new(t, k3_generate::dialect(engine.config().family)).check()
    {
        return fail(status, format!("the model's chat template cannot be used: {e}"));
    }
    let sampling = match k3_generate::generation_config::defaults(owned.model(), true) {
        Ok(s) => s,
        Err(e) => return fail(status, format!("{}: {e}", opts.model.display())),
    };
    let id = opts
        .model_id
        .clone()
        .unwrap_or_else(|| opts.model.file_stem().map_or_else(|| "k3".into(), |n| n.to_string_lossy().into_owned()));
    let asked_context = engine.plan().asked_context;
    let info = ModelInfo {
        id,
        family: engine.config().family,
        context: engine.plan().context,
        vocab: engine.vocab(),
        layers: engine.layers(),
        hidden: engine.hidden(),
        eos: engine.config().eos.clone(),
        sees: engine.sees(),
        max_token_bytes: ModelInfo::longest_token(shared_tok.as_ref()),
        sampling,
        about: about::About::of(owned.model(), shared_tok.as_ref(), engine.config().family),
    };
    if let Some(t) = shared_tok {
        let _ = state.tok.set(t);
    }
    if let Some(p) = engine.image_processor() {
        let _ = state.image_processor.set(p.clone());
    }
    reqlog::ready(opts.log_format, &info, asked_context, loading.elapsed().as_secs_f64());
    let _ = state.info.set(info);
    status.ready.store(true, Ordering::SeqCst);
    let mut cache = match &opts.prompt_cache_dir {
        None => k3_generate::cache::PromptCache::new(opts.prompt_cache_ram),
        Some(dir) => match k3_generate::cache::disk::DiskTier::open(dir, opts.prompt_cache_disk, engine) {
            Ok(store) => k3_generate::cache::PromptCache::with_disk(opts.prompt_cache_ram, store),
            Err(e) => return fail(status, e.to_string()),
        },
    };
    for w in cache.take_warnings() {
        eprintln!("prompt cache: {w}");
    }
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scheduler::run(engine, tok.as_ref(), jobs, opts.max_batch.max(1), &mut cache, status, &state.metrics)
    }));
    if let Err(p) = ran {
        // A bug, not an input: /health and every later request say so; nothing hangs.
        let what = p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied());
        status.ready.store(false, Ordering::SeqCst);
        fail(status, format!("the scheduler stopped on an internal error: {}", what.unwrap_or("a panic")));
        return;
    }
    // Every sender is gone (the server stops): what RAM holds goes to disk.
    let left = cache.flush(engine, STOP_FLUSH);
    for w in cache.take_warnings() {
        eprintln!("prompt cache: {w}");
    }
    if left > 0 {
        eprintln!("prompt cache: {left} kept states were not written within {} s", STOP_FLUSH.as_secs());
    }
}
