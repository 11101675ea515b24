//! `cargo xtask <task>`: project tasks that are not part of the engine. Thin: the work is done by
//! library crates; this parses arguments and shows progress.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod models;
mod quality;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    version,
    about = "k3 project tasks: convert, synth, quality, bench"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

/// A count of repetitions: at least 1, at most 1,000 (medians settle long before).
fn reps(s: &str) -> Result<usize, String> {
    bounded(s, 1, 1000)
}

/// An integer within `[lo, hi]`, refused with the range otherwise.
fn bounded(s: &str, lo: usize, hi: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a whole number from {lo} to {hi}")),
    }
}

/// `1,2,4` as thread counts (each 1..=1024); none: one per core.
fn thread_list(s: Option<&str>) -> Result<Vec<usize>> {
    let Some(s) = s else { return Ok(vec![std::thread::available_parallelism().map_or(1, |n| n.get())]) };
    s.split(',')
        .map(|t| match t.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => bail!("`{t}` is not a thread count from 1 to 1024"),
        })
        .collect()
}

/// A test file size in GB: more than 0, at most 16 TB.
fn size_gb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 16e3 => Ok(v),
        _ => Err(format!("`{s}` is not a size in GB from 0 to 16000")),
    }
}

#[derive(Subcommand)]
enum Task {
    /// Write a random-weight WASTE model with K3's architecture (presets k3-tiny, k3-proxy,
    /// k3-proxy-routed: k3-proxy with routing a lookahead can predict).
    Synth {
        /// k3-tiny (seconds), k3-proxy (27 GB, larger than memory), k3-proxy-routed, k3-medium, k2-proxy
        /// (K2-Thinking's INT4 expert records, 19 GB), or tool-caller (a tiny Kimi-Linear scripted to call
        /// a tool, for testing clients).
        #[arg(long)]
        preset: String,
        /// The model directory to create (must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Routed expert encoding [default: the preset's: int4 for k2-proxy, else mxfp4].
        #[arg(long, value_enum)]
        experts: Option<k3_cli::convert::Experts>,
        /// How the MoE layers route: `weights` (the random router; the preset's own) or
        /// `k3-like` (a seeded process with K3's published reuse statistics: next-token reuse,
        /// union factors, weight by rank, flat usage; see `cargo xtask bench routing`).
        #[arg(long, default_value = "weights", value_parser = ["weights", "k3-like"])]
        routing: String,
        /// Fewer layers than the preset's (the first stays dense), for a smaller model of the
        /// same shape [default: the preset's].
        #[arg(long, value_name = "N")]
        layers: Option<u32>,
    },
    /// Encoding error of MXFP4, RTN 3-bit and the VQ codecs on real and K3-shaped weights.
    Quality {
        /// Directory written by tools/quality/minilm_capture.py.
        #[arg(long, default_value = "bench-out/minilm")]
        data: PathBuf,
        /// Measure at most this many layers, spread over the depth [default: all].
        #[arg(long, value_parser = |s: &str| bounded(s, 1, usize::MAX))]
        max_layers: Option<usize>,
        /// Also re-encode an MXFP4-grid matrix of K3's expert shape (slow: minutes).
        #[arg(long)]
        k3: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measurements, side by side in one run (see docs/EFFICIENCY.md).
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
    /// Write a WASTE model back out as a Hugging Face checkpoint (safetensors, config, tokenizer):
    /// exact for f32 / bf16 trunks and BF16 or MXFP4 experts.
    Export {
        /// The WASTE model directory.
        #[arg(long)]
        model: PathBuf,
        /// The checkpoint directory to create (new or empty).
        #[arg(long)]
        out: PathBuf,
    },
    /// Convert a Hugging Face checkpoint directory to a WASTE model directory (resumable).
    Convert(k3_cli::convert::ConvertArgs),
}

/// Errors are printed as one tidy chain of causes (no backtrace), then exit status 1.
fn main() -> std::process::ExitCode {
    // A closed standard output (`cargo xtask bench io | head -1`) ends the program quietly, as
    // Unix tools do: Rust ignores SIGPIPE, which would turn `println!` into a panic.
    // SAFETY: setting a signal's disposition to its default has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<()> {
    match Cli::parse().task {
        Task::Quality { data, max_layers, k3, json } => quality::run(&data, max_layers.unwrap_or(usize::MAX), k3, json),
        Task::Bench { what } => bench::run(what),
        Task::Synth { preset, out, experts, routing, layers } => {
            models::synth(&preset, &out, experts, routing == "k3-like", layers)
        }
        Task::Export { model, out } => models::export(&model, &out),
        Task::Convert(args) => k3_cli::convert::run(args),
    }
}

#[cfg(test)]
#[path = "../../crates/k3-cli/tests/common/help.rs"]
mod help_check;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every option and argument of every subcommand says what it is for.
    #[test]
    fn every_option_has_help() {
        let missing = crate::help_check::gaps(&super::Cli::command(), "cargo xtask");
        assert!(missing.is_empty(), "no help text: {missing:?}");
        super::Cli::command().debug_assert();
        let usage = super::Cli::command().render_usage().to_string();
        assert!(usage.contains("cargo xtask"), "{usage}");
    }
}
