//! `serve`: an OpenAI-compatible HTTP server (`k3_server`) on a model, or the default model.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use k3_engine::OpenOptions;
use k3_engine::budget::parse_size;
use k3_server::ServerOptions;

use crate::run::{EngineArgs, Needs};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The model directory (default: the default model compiled into k3-cli).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The address to listen on: 127.0.0.1 keeps the server to this machine; 0.0.0.0 opens it to
    /// the network (give --api-key then).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Requests decoded together in one step at most.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    max_batch: u16,
    /// Requests waiting for a place in the batch at most; more are answered 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    queue: u16,
    /// The largest request body accepted (413 beyond), e.g. 4M.
    #[arg(long, value_name = "SIZE", default_value = "4M")]
    max_body: String,
    /// Memory for the prefix cache: states after prompts and answers, so a conversation's next
    /// turn prefills only what is new (0 = off), e.g. 2G.
    #[arg(long, value_name = "BYTES", default_value = "1G")]
    prefix_cache: String,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    let model_id = a.model.is_none().then(|| "default".to_string());
    let model = crate::default_model::or_default(a.model.clone())?;
    let body_limit = usize::try_from(parse_size(&a.max_body).map_err(anyhow::Error::msg)?)?;
    let prefix_cache = usize::try_from(parse_size(&a.prefix_cache).map_err(anyhow::Error::msg)?)?;
    let needs = Needs { context: 4096, min_context: 0, chunk: k3_server::scheduler::PREFILL_CHUNK, reserved_bytes: 0 };
    let engine = a.engine.options(needs)?;
    let opts = ServerOptions {
        model,
        model_id,
        open: OpenOptions { shard_dirs: a.engine.shard_dirs.clone() },
        engine,
        max_batch: usize::from(a.max_batch),
        queue: usize::from(a.queue),
        api_key: a.api_key.clone(),
        body_limit,
        prefix_cache,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the server's runtime")?;
    rt.block_on(async {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("listening on {addr}"))?;
        eprintln!(
            "serving {} at http://{addr}/v1 (OpenAI API; /health answers 503 until the model is loaded){}",
            opts.model.display(),
            if opts.api_key.is_some() { "; API key required" } else { "" }
        );
        let (router, _) = k3_server::app(opts);
        k3_server::serve(listener, router).await.context("serving")
    })?;
    Ok(ExitCode::SUCCESS)
}
