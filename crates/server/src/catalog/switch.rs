//! Which model is resident, and the switch from one to another: one switch at a time (a FIFO
//! lock, so requests for other models queue in arrival order), the old model's scheduler ended
//! before the new one loads (one model's memory at a time), and a switch runs as its own task,
//! so a client that leaves while it waits cannot stop it half way.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use serde_json::Value;

use super::Offer;
use crate::ServerOptions;
use crate::error::ApiError;
use crate::job::ModelInfo;
use crate::state::AppState;
use crate::status::Status;

/// A model loaded (or loading): its routes and their state.
#[derive(Debug)]
pub struct Resident {
    pub(crate) id: String,
    pub(crate) router: Router,
    pub(crate) state: AppState,
}

impl Resident {
    /// Its shape, once it is ready.
    pub(crate) fn ready_info(&self) -> Option<ModelInfo> {
        self.state.ready().ok().map(|(i, _)| i.clone())
    }

    fn status(&self) -> &Arc<Status> {
        &self.state.handle.status
    }

    /// Loaded, or failed to, or its thread has ended: nothing more to wait for.
    fn settled(&self) -> bool {
        let s = self.status();
        s.ready.load(Ordering::SeqCst) || s.failure().is_some() || s.ended.load(Ordering::SeqCst)
    }

    async fn settle(&self) {
        while !self.settled() {
            tokio::time::sleep(POLL).await;
        }
    }

    /// Loaded or loading, neither failed nor ended: a request naming it need not load it again.
    fn usable(&self) -> bool {
        self.status().failure().is_none() && !self.status().ended.load(Ordering::SeqCst)
    }

    /// Why it cannot serve, once it cannot.
    pub(crate) fn failure(&self) -> Option<String> {
        self.status().failure()
    }
}

#[derive(Debug, Default)]
struct Now {
    current: Option<Arc<Resident>>,
    /// Schedulers of models let go whose threads have not yet ended.
    retiring: Vec<Arc<Status>>,
}

/// The models offered and the one resident.
#[derive(Debug)]
pub struct Board {
    opts: ServerOptions,
    offers: Vec<Offer>,
    /// What each offer's files say, read once.
    listed: Vec<OnceLock<Option<Described>>>,
    /// The server's own status: the listener's stop sets `draining` and `cut` here, and
    /// [`Board::propagate`] passes them on to the resident model.
    status: Arc<Status>,
    now: Mutex<Now>,
    switching: tokio::sync::Mutex<()>,
}

/// How often a waiter looks at a loading model or a retiring scheduler.
const POLL: Duration = Duration::from_millis(20);

impl Board {
    /// The board, with `offers[first]` starting to load if given (else none until asked for).
    pub(crate) fn new(opts: ServerOptions, offers: Vec<Offer>, first: Option<usize>) -> Arc<Board> {
        let listed = offers.iter().map(|_| OnceLock::new()).collect();
        let board = Board {
            opts,
            offers,
            listed,
            status: Arc::new(Status::default()),
            now: Mutex::default(),
            switching: tokio::sync::Mutex::new(()),
        };
        if let Some(first) = first.filter(|&f| f < board.offers.len()) {
            let r = board.load(first);
            board.now().current = Some(r);
        }
        // The listener's status is ready from the start: a model's load failing answers its
        // requests with the reason, not the whole server.
        board.status.ready.store(true, Ordering::SeqCst);
        Arc::new(board)
    }

    pub(crate) fn status(&self) -> Arc<Status> {
        self.status.clone()
    }

    pub(crate) fn offers(&self) -> &[Offer] {
        &self.offers
    }

    fn now(&self) -> std::sync::MutexGuard<'_, Now> {
        self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The resident model, loaded or loading.
    pub(crate) fn loaded(&self) -> Option<Arc<Resident>> {
        self.now().current.clone()
    }

    /// The offer `name` means; with `tagged` (Ollama's routes, whose clients add the tag),
    /// `NAME:latest` is `NAME`.
    pub(crate) fn find(&self, name: &str, tagged: bool) -> Option<usize> {
        let bare = name.strip_suffix(":latest").filter(|_| tagged).unwrap_or(name);
        self.offers.iter().position(|o| o.id == name || o.id == bare)
    }

    /// A 404 naming what is offered.
    pub(crate) fn unknown(&self, name: &str) -> ApiError {
        let ids: Vec<&str> = self.offers.iter().map(|o| o.id.as_str()).collect();
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model '{name}' not found; this server offers: {}", ids.join(", ")),
        )
        .with_code("model_not_found")
    }

    fn load(&self, i: usize) -> Arc<Resident> {
        let o = &self.offers[i];
        // Several models keep their prompt states apart, each within its own disk budget.
        let prompt_cache_dir = match &self.opts.prompt_cache_dir {
            Some(d) if self.offers.len() > 1 => Some(d.join(&o.id)),
            d => d.clone(),
        };
        let opts = ServerOptions {
            model: o.path.clone(),
            model_id: Some(o.id.clone()),
            prompt_cache_dir,
            ..self.opts.clone()
        };
        let (router, state) = crate::model_app(opts);
        if self.status.draining.load(Ordering::SeqCst) {
            state.handle.status.draining.store(true, Ordering::SeqCst);
        }
        Arc::new(Resident { id: o.id.clone(), router, state })
    }

    /// The model to answer a request naming `name`, once it has loaded or failed to (its routes
    /// then say why); another model is switched to first. A request that names none goes to the
    /// resident model (after a switch under way), and never loads one.
    pub(crate) async fn resident(
        self: &Arc<Self>,
        name: Option<&str>,
        tagged: bool,
    ) -> Result<Arc<Resident>, ApiError> {
        let Some(n) = name else { return self.unnamed().await };
        let i = self.find(n, tagged).ok_or_else(|| self.unknown(n))?;
        // The old model is not held while waiting: its scheduler ends only once nothing holds it.
        let r = match self.loaded().filter(|r| r.id == self.offers[i].id && r.usable()) {
            Some(r) => r,
            None => {
                let board = self.clone();
                tokio::spawn(async move { board.switch_to(i).await })
                    .await
                    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "switching models failed"))??
            }
        };
        r.settle().await;
        Ok(r)
    }

    /// The resident model for a request that names none: after any switch under way.
    async fn unnamed(&self) -> Result<Arc<Resident>, ApiError> {
        let r = match self.loaded() {
            Some(r) => r,
            None => {
                drop(self.switching.lock().await);
                self.loaded().ok_or_else(|| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "no model is loaded: name one in the request's `model` (GET /v1/models lists them)",
                    )
                })?
            }
        };
        r.settle().await;
        Ok(r)
    }

    /// Makes `offers[i]` the resident model: the old one's scheduler ends first.
    async fn switch_to(self: Arc<Self>, i: usize) -> Result<Arc<Resident>, ApiError> {
        let _one_at_a_time = self.switching.lock().await;
        if let Some(r) = self.loaded().filter(|r| r.id == self.offers[i].id && r.usable()) {
            return Ok(r);
        }
        if self.status.draining.load(Ordering::SeqCst) {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
        }
        {
            let mut now = self.now();
            if let Some(old) = now.current.take() {
                eprintln!("unloading {} to load {}", old.id, self.offers[i].id);
                now.retiring.push(old.status().clone());
            }
        }
        // Answers under way on the old model finish; its prompt cache goes to disk.
        self.retired().await;
        let r = self.load(i);
        self.now().current = Some(r.clone());
        Ok(r)
    }

    /// Lets the model `id` go if it is the resident one (after a switch under way), its
    /// answers under way finishing first; waits until its scheduler has ended.
    pub(crate) async fn unload(&self, id: &str) {
        {
            let _one_at_a_time = self.switching.lock().await;
            let mut now = self.now();
            if now.current.as_ref().is_some_and(|r| r.id == id)
                && let Some(old) = now.current.take()
            {
                eprintln!("unloading {id}: asked to");
                now.retiring.push(old.status().clone());
            }
        }
        self.retired().await;
    }

    /// Waits until every scheduler let go has ended.
    async fn retired(&self) {
        loop {
            let left = {
                let mut now = self.now();
                now.retiring.retain(|s| !s.ended.load(Ordering::SeqCst));
                now.retiring.len()
            };
            if left == 0 {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Passes the listener's stop on to the resident model and to those being let go, until
    /// the server ends.
    pub(crate) async fn propagate(&self) {
        loop {
            // Copied out under the lock, set after it: the resident model and those let go.
            let targets: Vec<Arc<Status>> = {
                let now = self.now();
                now.current.iter().map(|r| r.status().clone()).chain(now.retiring.iter().cloned()).collect()
            };
            for t in targets {
                for (from, to) in [(&self.status.draining, &t.draining), (&self.status.cut, &t.cut)] {
                    if from.load(Ordering::SeqCst) {
                        to.store(true, Ordering::SeqCst);
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// At a stop: lets the resident model go and waits (at most `within`) for its scheduler to
    /// end; false if it did not.
    pub(crate) async fn stop(&self, within: Duration) -> bool {
        let current = self.now().current.take();
        if let Some(old) = current {
            let loaded = old.status().ready.load(Ordering::SeqCst);
            let status = old.status().clone();
            drop(old);
            if loaded {
                self.now().retiring.push(status);
            }
        }
        tokio::time::timeout(within, self.retired()).await.is_ok()
    }

    /// What `offers[i]`'s files say (read once; a model that cannot be read says why, once, in
    /// the log, and is left out of the listings).
    fn described(&self, i: usize) -> Option<&Described> {
        let o = &self.offers[i];
        self.listed[i]
            .get_or_init(|| match describe(o, &self.opts.open) {
                Ok(d) => Some(d),
                Err(e) => {
                    eprintln!("warning: {} ({}) is not listed: {e}", o.id, o.path.display());
                    None
                }
            })
            .as_ref()
    }

    /// `/api/tags`' entries: the resident model's from what it loaded, the others' from their
    /// files.
    pub(crate) fn listings(&self) -> Vec<Value> {
        let ready = self.loaded().and_then(|r| r.ready_info());
        let mut out = Vec::new();
        for (i, o) in self.offers.iter().enumerate() {
            match ready.as_ref().filter(|info| info.id == o.id) {
                Some(info) => out.push(crate::ollama::listing_of(&info.id, info.family, &info.about)),
                None => out.extend(self.described(i).map(|d| crate::ollama::listing_of(&o.id, d.0.family, &d.0.about))),
            }
        }
        out
    }

    /// `offers[i]`'s shape: the loaded one's, else what its files say.
    pub(crate) fn info(&self, i: usize) -> Option<ModelInfo> {
        let id = &self.offers[i].id;
        match self.loaded().and_then(|r| r.ready_info()).filter(|info| &info.id == id) {
            Some(info) => Some(info),
            None => self.described(i).map(|d| d.0.clone()),
        }
    }

    /// `/v1/models`' entry for `offers[i]`: its family and whether it reads images from its
    /// files; the shape it loaded with (context, sizes) when it is the resident model.
    pub(crate) fn model_object(&self, i: usize, created: u64) -> Value {
        let id = &self.offers[i].id;
        let mut v = serde_json::json!({"id": id, "object": "model", "created": created, "owned_by": "k3"});
        if let Some(d) = self.described(i) {
            v["family"] = d.0.family.name().into();
            v["vision"] = d.0.sees.into();
        }
        if let Some(info) = self.loaded().and_then(|r| r.ready_info()).filter(|info| &info.id == id) {
            v["context_length"] = info.context.into();
            v["vocab_size"] = info.vocab.into();
            v["layers"] = info.layers.into();
            v["hidden_size"] = info.hidden.into();
        }
        v
    }
}

/// What a model's files say about it, without loading it: its shape as `ModelInfo`, with the
/// model's own longest context (a loaded model's is what the memory plan left).
#[derive(Debug)]
struct Described(ModelInfo);

/// Reads a model's header, config, tokenizer and generation config.
fn describe(o: &Offer, open: &k3_engine::OpenOptions) -> Result<Described, String> {
    let model = k3_engine::Model::open_with(&o.path, open).map_err(|e| e.to_string())?;
    let raw = model.blob("config.json").ok_or("the model embeds no config.json")?;
    let cfg =
        k3_engine::config::ModelConfig::parse(std::path::Path::new("config.json"), raw).map_err(|e| e.to_string())?;
    let tok = k3_generate::model_tokenizer(&model).transpose().map_err(|e| e.to_string())?;
    let sampling = k3_generate::generation_config::defaults(&model, true).map_err(|e| e.to_string())?;
    Ok(Described(ModelInfo {
        id: o.id.clone(),
        family: cfg.family,
        context: cfg.max_positions.unwrap_or(0),
        vocab: cfg.vocab as usize,
        layers: cfg.layers as usize,
        hidden: cfg.hidden as usize,
        eos: cfg.eos.clone(),
        sees: cfg.vision.is_some(),
        max_token_bytes: ModelInfo::longest_token(tok.as_ref()),
        sampling,
        about: crate::about::About::of(&model, tok.as_ref(), cfg.family),
    }))
}
