//! `k3-cli`: the user's entry point. Thin: argument parsing and presentation; the work is done by
//! the library crates.

mod inspect;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use k3_format::{Model, OpenOptions};

#[derive(Parser)]
#[command(name = "k3-cli", version, about = "k3: run Kimi models by streaming experts from disk")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a WASTE model: architecture, experts, encodings, sizes, shard layout.
    Inspect {
        /// The model directory.
        model: PathBuf,
        /// Other directories holding expert shards (one per drive); repeat the flag.
        #[arg(long = "shard-dir")]
        shard_dirs: Vec<PathBuf>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check every checksum of a WASTE model; exits 1 naming each bad record or tensor.
    Verify {
        model: PathBuf,
        #[arg(long = "shard-dir")]
        shard_dirs: Vec<PathBuf>,
    },
    /// Logits at every position of a prompt: writes f32 [tokens, vocab], row-major, little-endian.
    Logits(RunArgs),
    /// The hidden state after every layer: writes f32 [tokens, layers, hidden], token-major.
    Trace(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The model directory.
    #[arg(long)]
    model: PathBuf,
    /// Token ids, separated by spaces (or commas).
    #[arg(long)]
    ids: String,
    /// Where to write the f32 array.
    #[arg(long)]
    out: PathBuf,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 32)]
    chunk: usize,
    #[arg(long = "shard-dir")]
    shard_dirs: Vec<PathBuf>,
}

fn run(args: RunArgs, trace: bool) -> Result<ExitCode> {
    let ids: Vec<u32> = args
        .ids
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("`{t}` is not a token id")))
        .collect::<Result<_>>()?;
    anyhow::ensure!(!ids.is_empty(), "--ids holds no token ids");
    let model = open(&args.model, args.shard_dirs)?;
    let engine = k3_engine::Engine::load(&model).with_context(|| format!("loading {}", args.model.display()))?;
    let mut session = engine.session();
    let (mut logits, mut layers) = (Vec::new(), Vec::new());
    let mut chunk_trace = Vec::new();
    for chunk in ids.chunks(args.chunk.max(1)) {
        logits.extend(engine.forward(&mut session, chunk, trace.then_some(&mut chunk_trace))?);
        layers.extend_from_slice(&chunk_trace);
    }
    let data = if trace { &layers } else { &logits };
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    // Write next to the target and rename: a reader never sees half an array.
    let tmp = args.out.with_extension("partial");
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    let v = engine.vocab();
    let shape = if trace {
        format!("[{}, {}, {}]", ids.len(), engine.layers(), engine.hidden())
    } else {
        format!("[{}, {v}]", ids.len())
    };
    let argmax: Vec<usize> =
        logits.chunks(v).map(|r| r.iter().enumerate().fold(0, |b, (i, x)| if *x > r[b] { i } else { b })).collect();
    println!("wrote f32 {shape} to {}; next-token argmax per position: {argmax:?}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

fn open(model: &PathBuf, shard_dirs: Vec<PathBuf>) -> Result<Model> {
    Model::open_with(model, &OpenOptions { shard_dirs }).with_context(|| format!("opening {}", model.display()))
}

fn verify(model: &Model) -> ExitCode {
    let total = model.verify_bytes();
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("verify [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let problems = model.verify(&mut |done| pb.set_position(done));
    pb.finish_and_clear();
    let m = model.manifest();
    if problems.is_empty() {
        println!(
            "ok: {} embedded files, {} trunk tensors and {} expert records verified ({:.1} MB)",
            m.blobs.len(),
            m.trunk.tensors.len(),
            model.header().index.len(),
            total as f64 / 1e6
        );
        ExitCode::SUCCESS
    } else {
        for p in &problems {
            eprintln!("BAD {}: {}", p.place, p.error);
        }
        eprintln!("{} problem(s) found in {}", problems.len(), model.dir().display());
        ExitCode::FAILURE
    }
}

fn main() -> Result<ExitCode> {
    match Cli::parse().command {
        Command::Inspect { model, shard_dirs, json } => {
            let m = open(&model, shard_dirs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&inspect::summary(&m))?);
            } else {
                print!("{}", inspect::table(&m));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { model, shard_dirs } => Ok(verify(&open(&model, shard_dirs)?)),
        Command::Logits(args) => run(args, false),
        Command::Trace(args) => run(args, true),
    }
}
