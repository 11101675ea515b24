//! `serve`: an OpenAI-compatible HTTP server (`k3_server`) on a model, or the default model.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use k3_engine::OpenOptions;
use k3_engine::budget::parse_size;
use std::time::Duration;

use k3_server::boundary::Boundary;
use k3_server::catalog::Offer;
use k3_server::image_budget::ImageLimits;
use k3_server::reqlog::LogFormat;
use k3_server::{Limits, ServerOptions};

use crate::run::{EngineKnobs, Needs, RUN_ACTIVATIONS};

#[derive(clap::Args)]
#[command(mut_arg("context", |a| a.help(
    "Tokens of context each conversation may hold: a longer prompt is refused \
     (`context_length_exceeded`), an answer stops there (finish_reason `length`) [default: the \
     model's own longest context (max_position_embeddings) as far as memory allows beside the \
     expert cache for every batched conversation; the ready line says how much]"
)))]
pub struct ServeArgs {
    /// Serve this one model (a directory, or a stored model's name), loaded at start [default:
    /// none: every model in k3's store (`k3-cli list`) and the built-in one, `default`, each
    /// loaded when a request names it, one in memory at a time].
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// The --model's id in the API (`/v1/models`, the `model` of answers) [default: the model
    /// directory's name].
    #[arg(short = 'a', long, value_name = "NAME", value_parser = parse_alias, requires = "model")]
    alias: Option<String>,
    /// How the ready line and the line per request (id, prompt and cached tokens, time to first
    /// token, tok/s, finish reason) are written on standard error: `text` for a person, `json`
    /// (one object a line) for a log collector.
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// The address to listen on: 127.0.0.1 keeps the server to this machine; 0.0.0.0 opens it to
    /// the network (give --api-key then).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health; repeat for one key per
    /// user or app (each key's prompt-cache entries are its own) [default: none: no key is
    /// asked for, so keep the server on 127.0.0.1].
    #[arg(long, value_name = "KEY")]
    api_key: Vec<String>,
    /// Read API keys from this file, one per line (blank lines and `#` comments skipped): keeps
    /// them out of the process list [default: none].
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// A further name clients may reach the server by (the `Host` they send); repeat the flag.
    /// Loopback names (and, on an address bind, the address) are always allowed; others are
    /// refused, which stops DNS-rebinding pages. `*` turns the check off [default: loopback names
    /// and the bound address only].
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Let web pages from ORIGIN (e.g. http://localhost:3000) call the API from a browser;
    /// repeat the flag. `*` lets every site the user visits use the model. Off by default: pages
    /// of other sites are refused.
    #[arg(long = "cors", value_name = "ORIGIN")]
    cors: Vec<String>,
    /// Share the prompt cache between API keys: faster repeated prompts across users, but a
    /// client can then tell from `cached_tokens` whether another client sent a prompt.
    #[arg(long, alias = "prefix-cache-shared")]
    pub(crate) prompt_cache_shared: bool,
    /// Requests decoded together in one step at most.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    max_batch: u16,
    /// Requests waiting for a place in the batch at most; more are answered 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    queue: u16,
    /// The largest request body accepted (413 beyond), e.g. 4M; images arrive base64 in the body.
    #[arg(long, value_name = "SIZE", default_value = "20M")]
    max_body: String,
    /// Responses `/v1/responses` stores (`store: true`, for `previous_response_id` and `GET
    /// /v1/responses/ID`), per API key, in memory only: at most this many, the oldest dropped first.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    responses_kept: usize,
    /// Memory the stored responses and their conversations may take at most, e.g. 512M.
    #[arg(long, value_name = "BYTES", default_value = "256M")]
    responses_memory: String,
    /// Memory for the prompt cache's RAM tier: states after prompts (with their logits),
    /// answers, system turns and the message before the last, so a next turn, a regenerate or a
    /// new conversation with the same system prompt prefills only what is new (0 = off), e.g. 2G.
    #[arg(long, value_name = "BYTES", default_value = "1G", alias = "prefix-cache")]
    pub(crate) prompt_cache_ram: String,
    /// Keep prompt states on disk in DIR too (created private to you if missing): states at
    /// the chat template's resume points and at prompts' ends are written as they are kept, the
    /// others when RAM drops them, and a restarted server resumes from them. Files of another
    /// model or version are left alone; a damaged one is removed and its prompt computed
    /// [default: none: states are kept in RAM only].
    #[arg(long, value_name = "DIR")]
    prompt_cache_dir: Option<PathBuf>,
    /// The most bytes the state files in --prompt-cache-dir may take; the least recently used
    /// go first, e.g. 50G.
    #[arg(long, value_name = "SIZE", default_value = "10G", requires = "prompt_cache_dir")]
    prompt_cache_disk: String,
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection stays open.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout: u64,
    /// Seconds a client has to send a request's body (408 beyond).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    body_timeout: u64,
    /// Open connections at most; at the cap a new one takes the place of the oldest holding no
    /// request (still sending its headers, or idle), and is answered 503 only when all hold one.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// Seconds answers under way may run on after SIGINT, SIGTERM or SIGHUP before they are
    /// ended (each with its finish chunk and [DONE]); new requests get 503 meanwhile.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    drain_timeout: u64,
    /// Megapixels of images one request may bring, counted from their headers before any is
    /// decoded (400 naming the image beyond). Decoding takes 3 to 3.4 MB a megapixel (measured on
    /// 64-megapixel PNGs and JPEGs), so the default, two of the largest images the decoder takes
    /// (64 megapixels each), is ~400 MB.
    #[arg(long, value_name = "MEGAPIXELS", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_image_megapixels: u64,
    /// Megapixels of images decoded and not yet resized across the server at once (at least
    /// --max-image-megapixels): four of the largest images by default, ~800 MB. A request
    /// waits --image-wait seconds for room, then gets 503.
    #[arg(long, value_name = "MEGAPIXELS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    image_megapixels_in_flight: u64,
    /// Seconds a request with images waits for room in --image-megapixels-in-flight before it
    /// is answered 503.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    image_wait: u64,
    #[command(flatten)]
    engine: EngineKnobs,
}

/// Raises the soft limit on open files to the hard one (as nginx-style servers do): each
/// connection is a descriptor, and the usual soft limit of 1,024 would let idle sockets deny
/// service. Returns the limit in force.
fn raise_open_files() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed, which outlives the calls.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
    }
    r.rlim_cur
}

/// The keys given on the command line and in the key file.
fn api_keys(a: &ServeArgs) -> Result<Vec<String>> {
    let mut keys = a.api_key.clone();
    if let Some(p) = &a.api_key_file {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading the API keys in {}", p.display()))?;
        keys.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from));
        if keys.is_empty() {
            bail!("{} holds no API key (one per line)", p.display());
        }
    }
    if let Some(bad) = keys.iter().find(|k| k.is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control())) {
        bail!("an API key must be non-empty and without spaces (got {:?})", bad.chars().take(4).collect::<String>());
    }
    Ok(keys)
}

/// A model id a client can send back: printable, no spaces or slashes at its ends, not too long.
fn parse_alias(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 256
        && s.chars().all(|c| !c.is_control() && !c.is_whitespace())
        && !s.starts_with('/')
        && !s.ends_with('/');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a usable model id (1-256 printable characters, no spaces)"))
    }
}

/// Without --model, the store's models and the built-in one, by name (the catalog).
fn offers(a: &ServeArgs) -> Result<Option<Vec<Offer>>> {
    if a.model.is_some() {
        return Ok(None);
    }
    let mut offers: Vec<Offer> =
        k3_cli::store::list()?.into_iter().map(|m| Offer { id: m.name, path: m.dir }).collect();
    offers.push(Offer { id: k3_cli::store::DEFAULT_NAME.into(), path: crate::default_model::path()? });
    Ok(Some(offers))
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let offers = offers(&a)?;
    let model_id = a.alias.clone().or_else(|| {
        let named = a.model.as_ref().and_then(|m| m.to_str()).filter(|m| !std::path::Path::new(m).exists());
        named.map(str::to_string)
    });
    // The catalog's template model is its built-in one (the last offer), found once.
    let model = match offers.as_ref().and_then(|o| o.last()) {
        Some(default) => default.path.clone(),
        None => crate::default_model::or_default(a.model.clone())?,
    };
    let body_limit = usize::try_from(parse_size(&a.max_body).map_err(anyhow::Error::msg)?)?;
    let prompt_cache_ram = usize::try_from(parse_size(&a.prompt_cache_ram).map_err(anyhow::Error::msg)?)?;
    let needs = Needs {
        context: crate::prompt::LONGEST_CONTEXT,
        fit: true,
        min_context: 0,
        chunk: None,
        reserved_bytes: 0,
        activations: RUN_ACTIVATIONS,
    };
    let engine = a.engine.options(needs)?;
    let mut opts = ServerOptions {
        model,
        model_id,
        open: OpenOptions { shard_dirs: a.engine.shard_dirs.clone() },
        engine,
        max_batch: usize::from(a.max_batch),
        queue: usize::from(a.queue),
        boundary: Boundary {
            bind: None,
            allowed_hosts: a.allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            cors: a.cors.clone(),
            api_keys: api_keys(&a)?,
            shared_cache: a.prompt_cache_shared,
        },
        body_limit,
        prompt_cache_ram,
        prompt_cache_dir: a.prompt_cache_dir.clone(),
        prompt_cache_disk: parse_size(&a.prompt_cache_disk).map_err(anyhow::Error::msg)?,
        limits: Limits {
            header_timeout: Duration::from_secs(a.header_timeout),
            body_timeout: Duration::from_secs(a.body_timeout),
            max_connections: a.max_connections as usize,
            drain: Duration::from_secs(a.drain_timeout),
        },
        stop_bytes: 4096,
        log_format: if a.log_format == "json" { LogFormat::Json } else { LogFormat::Text },
        images: ImageLimits {
            per_request: a.max_image_megapixels * 1_000_000,
            in_flight: a.image_megapixels_in_flight.max(a.max_image_megapixels) * 1_000_000,
            wait: Duration::from_secs(a.image_wait),
        },
        responses: k3_server::response_store::StoreLimits {
            count: a.responses_kept,
            bytes: usize::try_from(parse_size(&a.responses_memory).map_err(anyhow::Error::msg)?)?,
        },
    };
    let files = raise_open_files();
    if files > 0 && (files as usize) < opts.limits.max_connections + 64 {
        opts.limits.max_connections = (files as usize).saturating_sub(64).max(1);
        eprintln!("warning: this process may open {files} files: at most {} connections", opts.limits.max_connections);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the server's runtime")?;
    rt.block_on(async {
        let addr = format!("{}:{}", a.host, a.port);
        let listener =
            tokio::net::TcpListener::bind((a.host.as_str(), a.port)).await.with_context(|| format!("listening on {addr}"))?;
        let local = listener.local_addr().context("the listening address")?;
        opts.boundary.bind = Some(local.ip());
        if opts.boundary.cors.iter().any(|c| c == "*") {
            eprintln!("warning: --cors '*' lets every web page this machine's browsers open use the model");
        }
        if opts.boundary.bind.is_some_and(|ip| !ip.is_loopback()) && opts.boundary.api_keys.is_empty() {
            eprintln!("warning: listening beyond this machine with no --api-key: anyone who can reach {addr} can use the model");
        }
        let key = if opts.boundary.api_keys.is_empty() { "" } else { "; API key required" };
        let limits = opts.limits;
        if let Some(offers) = offers {
            let names: Vec<&str> = offers.iter().map(|o| o.id.as_str()).collect();
            eprintln!(
                "serving {} at http://{local}/v1 (OpenAI API; Ollama's at /api): each loads when a request names it, one in memory at a time{key}",
                names.join(", ")
            );
            // One model offered (an empty store): loaded at once, as with --model.
            let first = (offers.len() == 1).then_some(0);
            let (router, status, board) = k3_server::catalog::app(opts, offers, first);
            return k3_server::catalog::serve(listener, router, status, board, limits).await.map_err(anyhow::Error::new);
        }
        eprintln!(
            "serving {} at http://{local}/v1 (OpenAI API; Ollama's at /api; /health answers 503 until the model is loaded){key}",
            opts.model.display(),
        );
        let (router, state) = k3_server::app(opts);
        // A model that cannot load ends the server with the reason, not a server answering 503.
        k3_server::serve(listener, router, state, limits).await.map_err(anyhow::Error::new)
    })?;
    Ok(ExitCode::SUCCESS)
}
