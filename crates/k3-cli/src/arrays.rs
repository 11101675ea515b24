//! `logits` and `trace`: run the model on token ids and write what it computed as f32 arrays.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use k3_engine::OutputFile;

use crate::prompt::parse_ids;
use crate::run::{EngineArgs, Needs, open_model};

#[derive(clap::Args)]
pub struct ArrayArgs {
    /// The model directory.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Token ids, separated by spaces (or commas).
    #[arg(long)]
    ids: String,
    /// Where to write the f32 array (replaced atomically; checked before the run).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Prompt tokens per forward call (prefill chunk).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    chunk: u32,
    #[command(flatten)]
    engine: EngineArgs,
}

pub fn run(args: ArrayArgs, trace: bool) -> Result<ExitCode> {
    let ids = parse_ids(&args.ids)?;
    // The output is checked (and its temporary made) before the run, not after it.
    let out = OutputFile::create(&args.out)?;
    let model = open_model(&args.model, &args.engine.knobs.shard_dirs)?;
    let a = &model.manifest().architecture;
    let n = ids.len() as u64;
    let width = if trace { u64::from(a.layers) * a.hidden } else { a.vocab };
    // What this command collects: every position's row, as f32 and as the bytes it writes.
    let needs =
        Needs { reserved_bytes: n.saturating_mul(width).saturating_mul(8), ..Needs::exact(n, args.chunk as usize) };
    let engine = args.engine.load(&model, &args.model, needs)?;
    let mut session = engine.session();
    let (mut logits, mut layers) = (Vec::new(), Vec::new());
    let mut chunk_trace = Vec::new();
    for chunk in ids.chunks(args.chunk as usize) {
        logits.extend(engine.forward(&mut session, chunk, trace.then_some(&mut chunk_trace))?);
        layers.extend_from_slice(&chunk_trace);
    }
    args.engine.report(&engine, &session.stats, None)?;
    args.engine.finish(&session)?;
    let data = if trace { &layers } else { &logits };
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    out.commit(&bytes)?;
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
