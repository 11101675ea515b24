//! `bench decode`'s command line: its switches, and the drive's ceiling measured before the runs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use k3_engine::ActivationPrecision as Activations;
use k3_format::Model;
use k3_generate::sample::SamplerConfig;

use super::{ALL_VARIANTS, Options, run};
use crate::{bounded, reps};

/// `cargo xtask bench decode`.
#[derive(clap::Args)]
pub struct Args {
    /// The WASTE model to decode with (e.g. one made by `cargo xtask synth`).
    #[arg(long)]
    pub model: PathBuf,
    /// Greedy decode steps per run.
    #[arg(long, default_value_t = 8, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
    pub tokens: usize,
    /// Prompt tokens prefilled before the decode.
    #[arg(long, default_value_t = 16, value_parser = |s: &str| bounded(s, 1, 1_000_000))]
    pub prompt: usize,
    /// Memory budget for the engine (e.g. 4G); default: the engine's own small cache.
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
    /// Repetitions of every variant, interleaved (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = reps)]
    pub reps: usize,
    /// Where to draw one decode step's timeline (SVG).
    #[arg(long, default_value = "bench-out/decode-step.svg")]
    pub svg: PathBuf,
    /// Comma-separated subset of: read-then-compute, overlap, overlap+lookahead, lru, lfu,
    /// global-cache (LFRU over the whole cache instead of per layer's share), hobbit (overlap with
    /// `--low-bit-copies`; changes results) [default: all of them but hobbit].
    #[arg(long)]
    pub variants: Option<String>,
    /// Comma-separated compute thread counts to run every variant with [default: one per core].
    #[arg(long, value_name = "N,N,..")]
    pub threads: Option<String>,
    /// Comma-separated numbers of independent sequences decoded together (each distinct expert
    /// is read once per step for all of them).
    #[arg(long, value_name = "N,N,..", default_value = "1")]
    pub batch: String,
    /// Comma-separated numbers of tokens to draft from the context per step (0 = plain decoding;
    /// one sequence only).
    #[arg(long, value_name = "N,N,..", default_value = "0")]
    pub speculate: String,
    /// Comma-separated prefill chunks (prompt tokens per forward call; `auto`: the engine's
    /// choice for the model and budget).
    #[arg(long, value_name = "N,N,..", default_value = "auto")]
    pub chunk: String,
    /// Comma-separated activation precisions (`auto`, `exact`, `int8-experts`, `bf16-trunk`, `int8`) to run each
    /// configuration with.
    #[arg(long, value_name = "P,P,..", default_value = "exact")]
    pub activations: String,
    /// The prompt: this text file, tokenized with the model's tokenizer (default: random ids,
    /// --prompt of them, different for each sequence).
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Sample at this temperature (seeded; default: greedy).
    #[arg(long, default_value_t = 0.0, value_parser = |s: &str| k3_generate::sample::check_temperature(s.parse().map_err(|_| format!("`{s}` is not a number"))?))]
    pub temperature: f32,
    /// Low-bit copies of the model's experts (`convert --experts int2`, or `synth --experts
    /// int2` of the same preset) for the `hobbit` variant: each token's lightest half of its
    /// experts read from them on a miss [default: none; the variant needs them].
    #[arg(long, value_name = "DIR")]
    pub low_bit_copies: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The `hobbit` variant's low-bit copies of `m`'s experts (the lighter half of each token's),
/// opened; refused when the variant is asked for without them.
fn copies(dir: Option<&Path>, m: &Model, variants: &[String]) -> Result<Option<k3_engine::LowBitCopies>> {
    let Some(dir) = dir else {
        anyhow::ensure!(
            !variants.iter().any(|v| v == "hobbit"),
            "the hobbit variant reads low-bit copies: give --low-bit-copies DIR"
        );
        return Ok(None);
    };
    let copies = Model::open(dir).with_context(|| format!("opening low-bit copies {}", dir.display()))?;
    let experts = (m.manifest().architecture.experts_per_token as usize / 2).max(1);
    Ok(Some(k3_engine::LowBitCopies { model: std::sync::Arc::new(copies), experts }))
}

/// A comma-separated list of counts in `lo..=hi`.
fn counts(s: &str, what: &str, lo: usize, hi: usize) -> Result<Vec<usize>> {
    s.split(',')
        .map(|t| match t.trim().parse::<usize>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => anyhow::bail!("`{t}` is not a {what} from {lo} to {hi}"),
        })
        .collect()
}

/// `cargo xtask bench decode`: the drive's ceiling first (for the bound column), then the variants.
pub fn task(args: Args) -> Result<()> {
    let Args {
        model,
        tokens,
        prompt,
        mem,
        reps,
        svg,
        variants,
        threads,
        batch,
        speculate,
        chunk,
        activations,
        prompt_file,
        temperature,
        low_bit_copies,
        json,
    } = args;
    let activations = activations
        .split(',')
        .map(|t| t.trim().parse::<Activations>().map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let chunks = chunk
        .split(',')
        .map(|t| if t.trim() == "auto" { Ok(None) } else { counts(t, "prefill chunk", 1, 1 << 20).map(|c| Some(c[0])) })
        .collect::<Result<Vec<_>>>()?;
    let threads = crate::thread_list(threads.as_deref())?;
    let batches = counts(&batch, "batch size", 1, 256)?;
    let speculate = counts(&speculate, "draft length", 0, 64)?;
    let prompt_ids = match &prompt_file {
        Some(f) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            let m = Model::open(&model)?;
            let tok = k3_generate::model_tokenizer(&m)
                .with_context(|| format!("{} embeds no tokenizer to read --prompt-file with", model.display()))??;
            let ids = tok.encode(&text);
            anyhow::ensure!(!ids.is_empty(), "{} holds no text", f.display());
            anyhow::ensure!(batches == [1], "--prompt-file gives one prompt: use --batch 1");
            Some(ids)
        }
        None => None,
    };
    let variants: Vec<String> = match variants {
        Some(v) => v.split(',').map(|s| s.trim().to_string()).collect(),
        None => ALL_VARIANTS.iter().map(|s| s.to_string()).collect(),
    };
    let mem = mem.map(|m| k3_engine::budget::parse_size(&m)).transpose().map_err(anyhow::Error::msg)?;
    let m = Model::open(&model)?;
    let low_bit_copies = copies(low_bit_copies.as_deref(), &m, &variants)?;
    let record = m.manifest().expert_layouts.iter().map(|l| l.record_bytes).max().unwrap_or(4096) as usize;
    let shard = m.shard_paths().first().cloned().context("the model has no expert shards")?;
    drop(m);
    let io = crate::bench::io::Options {
        file: Some(shard),
        file_bytes: 0,
        record,
        queue_depth: 32,
        // 2 GB per rep whatever the record size: long enough that a throttled drive's burst
        // allowance does not inflate the ceiling (tools/bench/with-read-ceiling.sh).
        reads: (2_000_000_000 / record.max(1)).clamp(400, 200_000),
        reps: 3,
        backend: k3_io::BackendChoice::IoUring,
    };
    let mut ceiling = super::ceiling::Ceiling::default();
    ceiling.measure(&io)?;
    ceiling.before = ceiling.samples.len();
    let o = Options {
        model: &model,
        tokens,
        prompt,
        threads,
        mem,
        reps,
        variants,
        batches,
        speculate,
        chunks,
        activations,
        prompt_ids: prompt_ids.as_deref(),
        sampler: SamplerConfig { temperature, seed: 5, ..SamplerConfig::default() },
        low_bit_copies,
    };
    let mut report = run(&o)?;
    ceiling.measure(&io)?;
    super::ceiling::apply(&mut report, &ceiling);
    if !json {
        super::table::print_table(&o, &report, &ceiling);
    }
    if let Some(dir) = svg.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    crate::bench::timeline::timeline_svg(&Model::open(&model)?, "overlap+lookahead", mem, &svg)?;
    if json {
        println!("{report}");
    } else {
        println!("timeline of one decode step: {}", svg.display());
    }
    Ok(())
}
