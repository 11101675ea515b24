//! `cargo xtask <task>`: project tasks that are not part of the engine. Thin: the work is done by
//! library crates; this parses arguments and shows progress.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use k3_engine::convert::{ConvertOptions, ExpertFormat, Progress, TrunkFormat, convert};

mod bench;
mod quality;

#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "k3 project tasks: convert, synth, quality, bench")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Clone, Copy, ValueEnum)]
enum Experts {
    Keep,
    Mxfp4,
    Bf16,
    Vq3,
}

#[derive(Clone, Copy, ValueEnum)]
enum Trunk {
    Keep,
    F32,
    Bf16,
    Int8,
    Int4,
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

#[derive(Subcommand)]
enum BenchWhat {
    /// The engine decoding: read-then-compute, overlap, overlap + lookahead, cache policies.
    Decode {
        /// The WASTE model to decode with (e.g. one made by `cargo xtask synth`).
        #[arg(long)]
        model: PathBuf,
        /// Greedy decode steps per run.
        #[arg(long, default_value_t = 8, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
        tokens: usize,
        /// Prompt tokens prefilled before the decode.
        #[arg(long, default_value_t = 16, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
        prompt: usize,
        /// Memory budget for the engine (e.g. 4G); default: the engine's own small cache.
        #[arg(long, value_name = "SIZE")]
        mem: Option<String>,
        /// Repetitions of every variant, interleaved (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = reps)]
        reps: usize,
        /// Where to draw one decode step's timeline (SVG).
        #[arg(long, default_value = "bench-out/decode-step.svg")]
        svg: PathBuf,
        /// Comma-separated subset of: read-then-compute, overlap, overlap+lookahead, lru, lfu.
        #[arg(long)]
        variants: Option<String>,
        /// Comma-separated compute thread counts to run every variant with [default: one per core].
        #[arg(long, value_name = "N,N,..")]
        threads: Option<String>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The expert reader against the drive's O_DIRECT rate (fio's, or a raw io_uring loop's),
    /// same read size and queue depth.
    Io {
        /// File to read (default: bench-out/io-test.bin, created if missing).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Size of the created test file, GB (only when it is created).
        #[arg(long, default_value_t = 4.0, value_parser = size_gb)]
        size_gb: f64,
        /// Bytes per read (default: a K3 MXFP4 expert record); rounded up to 4 KiB.
        #[arg(long, default_value_t = bench::io::K3_RECORD, value_parser = |s: &str| bounded(s, 1, 1 << 30))]
        record: usize,
        /// Reads in flight at once.
        #[arg(long, default_value_t = 32, value_parser = |s: &str| bounded(s, 1, 4096))]
        queue_depth: usize,
        /// Reads per repetition.
        #[arg(long, default_value_t = 96, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
        reads: usize,
        /// Repetitions, interleaved (medians are reported).
        #[arg(long, default_value_t = 3, value_parser = reps)]
        reps: usize,
        /// Use the pread thread pool instead of io_uring.
        #[arg(long)]
        pread: bool,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// KDA and MLA decode at K3's dimensions next to their memory-traffic bounds.
    Attn {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 7, value_parser = reps)]
        reps: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// What checking the trunk's checksums at load costs: xxh3 on 1 and every thread, a model's
    /// load with and without the check, and the projection for K3's trunk.
    Verify {
        /// A WASTE model to load with and without the check.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 5, value_parser = reps)]
        reps: usize,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Every k3-quant kernel on K3's expert shapes, hot and cold, next to memory bandwidth; with
    /// --threads, trunk and expert matvecs split over 1..N threads against the bandwidth.
    Kernels {
        /// Repetitions (medians are reported).
        #[arg(long, default_value_t = 7, value_parser = reps)]
        reps: usize,
        /// Measure thread scaling on 1..N threads instead (the decode step's products).
        #[arg(long, value_name = "N", value_parser = |s: &str| bounded(s, 1, 1024))]
        threads: Option<usize>,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
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
        /// k3-tiny (seconds), k3-proxy (27 GB, larger than memory) or k3-proxy-routed.
        #[arg(long)]
        preset: String,
        /// The model directory to create (must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
        /// Routed expert encoding.
        #[arg(long, value_enum, default_value = "mxfp4")]
        experts: Experts,
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
        what: BenchWhat,
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
    Convert {
        /// The source: a Hugging Face checkpoint (config.json, *.safetensors, perhaps
        /// model.safetensors.index.json, tokenizer files), or a WASTE model to re-encode (f32 / bf16
        /// trunk, BF16 or MXFP4 experts; checked whole first).
        #[arg(long, visible_alias = "from")]
        hf: PathBuf,
        /// The WASTE model directory to create (or to resume).
        #[arg(long)]
        out: PathBuf,
        /// Routed expert encoding; `keep` stores what the checkpoint has (MXFP4 for K3, BF16 for Kimi-Linear).
        #[arg(long, value_enum, default_value = "keep")]
        experts: Experts,
        /// Trunk encoding; int8 / int4 quantize the projection matrices (not the embedding table,
        /// the router gates or MLA's kv_b_proj) and keep the rest as stored.
        #[arg(long, value_enum, default_value = "keep")]
        trunk: Trunk,
        /// Expert record alignment in bytes: a power of two from 4096 (the default) to 1 GiB
        /// (2097152 for huge pages).
        #[arg(long, default_value_t = k3_format::DEFAULT_ALIGNMENT)]
        align: u64,
        /// Number of expert shard files (at most one per expert record).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        shards: u16,
        /// Stripe the shards over these directories (one per drive; created if missing); repeat the flag.
        #[arg(long = "shard-dir")]
        shard_dirs: Vec<PathBuf>,
    },
}

fn bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
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
        Task::Bench { what: BenchWhat::Io { file, size_gb, record, queue_depth, reads, reps, pread, json } } => {
            let o = bench::io::Options {
                file,
                file_bytes: (size_gb * 1e9) as u64 / 4096 * 4096,
                record: record.next_multiple_of(4096),
                queue_depth,
                reads,
                reps,
                backend: if pread { k3_io::BackendChoice::Pread } else { k3_io::BackendChoice::IoUring },
            };
            let report = bench::io::run(&o, json)?;
            if json {
                println!("{report}");
            }
            Ok(())
        }
        Task::Synth { preset, out, experts } => {
            let p = k3_engine::synth::preset(&preset).with_context(|| {
                let names: Vec<&str> = k3_engine::synth::PRESETS.iter().map(|p| p.name).collect();
                format!("unknown preset `{preset}` (one of {})", names.join(", "))
            })?;
            let e = match experts {
                Experts::Vq3 => k3_engine::synth::SynthExperts::Vq3,
                Experts::Mxfp4 | Experts::Keep => k3_engine::synth::SynthExperts::Mxfp4,
                Experts::Bf16 => bail!("synthetic models have MXFP4 or vq3 experts"),
            };
            let pb = bar(0);
            pb.set_message("synth");
            k3_engine::synth::synth(&p, e, &out, &mut |done, total| {
                pb.set_length(total);
                pb.set_position(done);
            })?;
            pb.finish_and_clear();
            let m = k3_format::Model::open(&out)?;
            let shard: u64 = m.manifest().shards.iter().map(|s| s.bytes).sum();
            println!(
                "wrote {} to {}: trunk {:.1} MB, expert shards {:.2} GB",
                p.name,
                out.display(),
                m.manifest().trunk.bytes as f64 / 1e6,
                shard as f64 / 1e9
            );
            Ok(())
        }
        Task::Bench { what: BenchWhat::Decode { model, tokens, prompt, mem, reps, svg, variants, threads, json } } => {
            let threads = thread_list(threads.as_deref())?;
            let variants: Vec<String> = match variants {
                Some(v) => v.split(',').map(|s| s.trim().to_string()).collect(),
                None => bench::decode::ALL_VARIANTS.iter().map(|s| s.to_string()).collect(),
            };
            let mem = mem.map(|m| k3_engine::budget::parse_size(&m)).transpose().map_err(anyhow::Error::msg)?;
            let m = k3_format::Model::open(&model)?;
            let record = m.manifest().expert_layouts.iter().map(|l| l.record_bytes).max().unwrap_or(4096) as usize;
            let shard = m.shard_paths().first().cloned().context("the model has no expert shards")?;
            drop(m);
            let io = bench::io::Options {
                file: Some(shard),
                file_bytes: 0,
                record,
                queue_depth: 32,
                // 2 GB per rep: long enough that a throttled drive's burst allowance does not
                // inflate the ceiling (tools/bench/with-read-ceiling.sh).
                reads: 400,
                reps: 3,
                backend: k3_io::BackendChoice::IoUring,
            };
            let ceiling = bench::io::run(&io, true)?["ceiling_gbps"].as_f64().unwrap_or(0.0);
            let o = bench::decode::Options { model: &model, tokens, prompt, threads, mem, reps, variants };
            let report = bench::decode::run(&o, ceiling, json)?;
            if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            bench::decode::timeline_svg(&k3_format::Model::open(&model)?, "overlap+lookahead", mem, &svg)?;
            if json {
                println!("{report}");
            } else {
                println!("timeline of one decode step: {}", svg.display());
            }
            Ok(())
        }
        Task::Bench { what: BenchWhat::Attn { reps, json } } => {
            let report = bench::attn::run(reps, json);
            if json {
                println!("{report}");
            }
            Ok(())
        }
        Task::Bench { what: BenchWhat::Verify { model, reps, json } } => {
            let report = bench::verify::run(model.as_deref(), reps, json)?;
            if json {
                println!("{report}");
            }
            Ok(())
        }
        Task::Bench { what: BenchWhat::Kernels { reps, threads, json } } => {
            let report = match threads {
                Some(n) => bench::threads::run(n, reps, json),
                None => bench::kernels::run(reps, json),
            };
            if json {
                println!("{report}");
            }
            Ok(())
        }
        Task::Export { model, out } => {
            let src = k3_engine::convert::Source::open(&model)?;
            let pb = bar(0);
            pb.set_message("export");
            let r = k3_engine::convert::export(&src, &out, &mut |done, total| {
                pb.set_length(total);
                pb.set_position(done);
            })
            .with_context(|| format!("exporting {} to {}", model.display(), out.display()))?;
            pb.finish_and_clear();
            println!(
                "wrote {} tensors ({:.1} MB) to {}: {}",
                r.tensors,
                r.bytes as f64 / 1e6,
                out.display(),
                r.files.join(", ")
            );
            Ok(())
        }
        Task::Convert { hf, out, experts, trunk, align, shards, shard_dirs } => {
            let experts = match experts {
                Experts::Keep => ExpertFormat::Keep,
                Experts::Mxfp4 => ExpertFormat::Mxfp4,
                Experts::Bf16 => ExpertFormat::Bf16,
                Experts::Vq3 => ExpertFormat::Vq3,
            };
            let trunk = match trunk {
                Trunk::Keep => TrunkFormat::Keep,
                Trunk::F32 => TrunkFormat::F32,
                Trunk::Bf16 => TrunkFormat::Bf16,
                Trunk::Int8 => TrunkFormat::Int8,
                Trunk::Int4 => TrunkFormat::Int4,
            };
            let opts = ConvertOptions {
                hf_dir: hf.clone(),
                out_dir: out.clone(),
                experts,
                trunk,
                alignment: align,
                shards,
                shard_dirs,
            };
            let pb = bar(0);
            let mut phase = "";
            let report = convert(&opts, &mut |p: Progress| {
                if p.phase != phase {
                    // A new phase: its own total, and an ETA from its own rate (resumed work
                    // excluded).
                    phase = p.phase;
                    pb.reset();
                    pb.set_length(p.total);
                    pb.set_message(p.phase);
                    pb.set_position(p.done);
                    pb.reset_eta();
                }
                pb.set_position(p.done);
            })
            .with_context(|| format!("converting {} to {}", hf.display(), out.display()))?;
            pb.finish_and_clear();
            if report.already_complete {
                println!("{} already holds this model, converted with these options; nothing to do.", out.display());
                return Ok(());
            }
            if report.resumed_items > 0 {
                println!("resumed: kept {} items written by the interrupted run", report.resumed_items);
            }
            println!(
                "wrote {} items ({:.1} MB) to {}; verified {:.1} MB",
                report.written_items,
                report.written_bytes as f64 / 1e6,
                out.display(),
                report.verified_bytes as f64 / 1e6
            );
            if !report.ignored.is_empty() {
                println!("ignored {} non-text tensors (e.g. {})", report.ignored.len(), report.ignored[0]);
            }
            Ok(())
        }
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
