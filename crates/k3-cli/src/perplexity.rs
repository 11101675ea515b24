//! `perplexity`: held-out perplexity of a text, as a trainer reports it.

use k3_cli::progress::{Progress, Unit};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::run::{EngineArgs, Needs, open_model};

#[derive(clap::Args)]
pub struct PerplexityArgs {
    /// The model directory (default: the default model compiled into k3-cli).
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// The text file to score (default, or `-`: standard input).
    file: Option<PathBuf>,
    /// Tokens per window (each window starts from an empty state).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(2..))]
    window: u32,
    /// Tokens per forward call (prefill chunk).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
    /// Predictions at each window's first N positions are context only, not scored (0: every
    /// one is, as a trainer counts). `llama-perplexity` scores a window's second half: `--skip`
    /// half the window counts the same positions.
    #[arg(long, value_name = "N", default_value_t = 0)]
    skip: u32,
    /// Also compare with this model's predictions (the same text and windows): how often both
    /// models' most likely next token agree, and the mean KL divergence from it. The reference
    /// runs with exact activations, an f32 MLA cache, every routed expert and nothing
    /// approximated, so `--activations int8 --against` (or `--experts-per-token N`,
    /// `--measure-deferral N`, `--low-bit-copies DIR`, `--kv-cache bf16` ... `--against`) the
    /// same model measures what that option costs [default: none].
    #[arg(long, value_name = "MODEL")]
    against: Option<PathBuf>,
    /// Measure HOBBIT's bound: each token's N lightest routed experts are computed from a copy
    /// rounded to `--measure-low-bit-bits` integers (groups of 32 along a row, f16 scales), as if
    /// every one of them missed the cache (`--low-bit-copies` reads copies on real misses only).
    /// Changes results [default: off].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    measure_low_bit: Option<u16>,
    /// Bits of the measured low-bit copies (2-8).
    #[arg(long, value_name = "B", default_value_t = 2, requires = "measure_low_bit")]
    measure_low_bit_bits: u32,
    /// Measure Expert Deferral: each token's N lightest routed experts are added to the
    /// residual stream one layer late (the last layer defers nothing). Changes results; only
    /// measured here, not a switch of generation: at the drive's bound it has nothing to overlap
    /// (docs/EFFICIENCY.md) [default: off].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    measure_deferral: Option<u16>,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(a: PerplexityArgs) -> Result<ExitCode> {
    let path = crate::default_model::or_default(a.model)?;
    let text = match a.file.as_deref().filter(|f| f.as_os_str() != "-") {
        Some(f) => k3_cli::text_file::read_text(f, "perplexity reads")?,
        None => crate::prompt::read_stdin("perplexity reads")?,
    };
    let model = open_model(&path, &a.engine.knobs.shard_dirs)?;
    let tok =
        k3_generate::model_tokenizer(&model).with_context(|| format!("{} embeds no tokenizer", path.display()))??;
    let ids = tok.encode(&text);
    let (window, chunk) = (a.window as usize, (a.chunk as usize).min(a.window as usize));
    let cut = k3_generate::eval::Windows { window, chunk, skip: a.skip as usize };
    // A window never holds more than `window` tokens of context, nor more than the text.
    let context = ids.len().clamp(2, window) as u64;
    let approx = k3_engine::ExpertApprox {
        low_bit_copies: a
            .measure_low_bit
            .map(|n| k3_engine::RoundedCopies { experts: usize::from(n), bits: a.measure_low_bit_bits }),
        defer: a.measure_deferral.map_or(0, usize::from),
    };
    let engine = a.engine.load_with(&model, &path, Needs::exact(context, chunk), |o| o.approx = approx)?;
    let windows = ids.len().div_ceil(window);
    let pb = Progress::new("perplexity", windows as u64, Unit::Items("windows"));
    let t0 = std::time::Instant::now();
    let r = k3_generate::eval::perplexity(&engine, &ids, &cut, &mut |done| pb.set_position(done as u64))?;
    let seconds = t0.elapsed().as_secs_f64();
    pb.finish();
    a.engine.report(&engine, &r.stats, None)?;
    let window_nll: Vec<f64> = r.windows.iter().map(|w| w.nll).collect();
    let agreement = match &a.against {
        Some(reference) => {
            let rm = open_model(reference, &a.engine.knobs.shard_dirs)?;
            let mut exact = a.engine.clone();
            exact.knobs.activations = None;
            exact.knobs.experts_per_token = None;
            exact.knobs.expert_top_p = None;
            exact.knobs.low_bit_copies = None;
            exact.knobs.cache_aware_experts = None;
            exact.knobs.kv_cache = Some("f32".into());
            let re = exact.load(&rm, reference, Needs::exact(context, chunk))?;
            let pb = Progress::new("compare", windows as u64, Unit::Items("windows"));
            let g = k3_generate::eval::agreement(&engine, &re, &ids, &cut, &mut |d| pb.set_position(d as u64))?;
            pb.finish();
            Some(g)
        }
        None => None,
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "perplexity": r.perplexity(), "mean_nll": r.mean_nll(), "tokens": ids.len(),
                "scored_tokens": r.scored(), "window": window, "windows": r.windows.len(),
                "window_nll": window_nll, "seconds": seconds, "tok_per_s": ids.len() as f64 / seconds,
                "against": agreement.map(|g| serde_json::json!({
                    "positions": g.positions, "top1_agreement": g.top1_rate(), "mean_kl": g.mean_kl(),
                    "mean_entropy": g.mean_entropies().0, "reference_mean_entropy": g.mean_entropies().1,
                })),
            })
        );
    } else {
        println!(
            "perplexity {:.4} (mean NLL {:.5} nats) over {} scored tokens in {} windows of {window}; {:.0} tok/s",
            r.perplexity(),
            r.mean_nll(),
            r.scored(),
            r.windows.len(),
            ids.len() as f64 / seconds
        );
        if let Some(g) = agreement {
            let (h, hr) = g.mean_entropies();
            println!(
                "against the reference: top-1 agreement {:.4}, mean KL {:.5} nats, mean entropy {h:.5} nats (the reference's {hr:.5}) over {} positions",
                g.top1_rate(),
                g.mean_kl(),
                g.positions
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
