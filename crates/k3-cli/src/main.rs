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
    }
}
