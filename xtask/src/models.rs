//! The tasks that write model files: `convert`, `export` and `synth`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use k3_convert::{ConvertOptions, ExpertFormat, Progress, TrunkFormat, convert as run_convert};

use crate::bar;

#[derive(Clone, Copy, ValueEnum)]
pub enum Experts {
    Keep,
    Mxfp4,
    Bf16,
    Vq3,
    /// Exact f32: for checking an FP8 or INT4 checkpoint's parity (8x the size of INT4).
    F32,
    /// Round-to-nearest INT4 in groups of 32 (K2-Thinking's encoding; INT4 checkpoints keep theirs).
    Int4,
    /// 3-bit round-to-nearest in groups of 32 stored as int4: the baseline VQ3 is measured against.
    Rtn3,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Trunk {
    Keep,
    F32,
    Bf16,
    Int8,
    Int4,
}

/// `cargo xtask convert`.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// The source: a Hugging Face checkpoint (config.json, *.safetensors, perhaps
    /// model.safetensors.index.json, tokenizer files), or a WASTE model to re-encode (f32 / bf16
    /// trunk, BF16 or MXFP4 experts; checked whole first).
    #[arg(long, visible_alias = "from")]
    pub hf: PathBuf,
    /// The WASTE model directory to create (or to resume).
    #[arg(long)]
    pub out: PathBuf,
    /// Routed expert encoding; `keep` stores what the checkpoint has (MXFP4 for K3, BF16 for Kimi-Linear).
    #[arg(long, value_enum, default_value = "keep")]
    pub experts: Experts,
    /// Trunk encoding; int8 / int4 quantize the projection matrices (not the embedding table,
    /// the router gates or MLA's kv_b_proj) and keep the rest as stored.
    #[arg(long, value_enum, default_value = "keep")]
    pub trunk: Trunk,
    /// Expert record alignment in bytes: a power of two from 4096 (the default) to 1 GiB
    /// (2097152 for huge pages).
    #[arg(long, default_value_t = k3_format::DEFAULT_ALIGNMENT)]
    pub align: u64,
    /// Number of expert shard files (at most one per expert record).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub shards: u16,
    /// Stripe the shards over these directories (one per drive; created if missing); repeat the flag.
    #[arg(long = "shard-dir")]
    pub shard_dirs: Vec<PathBuf>,
    /// Calibrate VQ experts on this text: the source model reads it (a checkpoint is converted as
    /// stored first, beside the output), each expert's inputs are sampled, and its matrices are
    /// encoded to minimize the error on them.
    #[arg(long)]
    pub calibrate: Option<PathBuf>,
    /// Tokens of the calibration text to run (in 256-token windows spread evenly over the text).
    #[arg(long, default_value_t = 16384, requires = "calibrate")]
    pub calibrate_tokens: usize,
    /// Inputs sampled per expert (a larger sample estimates an expert's input statistics better;
    /// memory is checked before the run).
    #[arg(long, default_value_t = 4096, requires = "calibrate")]
    pub calibrate_samples: usize,
}

/// Tokens per calibration window, each read from an empty state (as `k3-cli perplexity` scores).
const CALIBRATION_WINDOW: usize = 256;

pub fn convert(args: ConvertArgs) -> Result<()> {
    let calibration = match &args.calibrate {
        Some(text) => Some(std::sync::Arc::new(calibrate(&args, text)?)),
        None => None,
    };
    let ConvertArgs { hf, out, experts, trunk, align, shards, shard_dirs, .. } = args;
    let experts = match experts {
        Experts::Keep => ExpertFormat::Keep,
        Experts::Mxfp4 => ExpertFormat::Mxfp4,
        Experts::Bf16 => ExpertFormat::Bf16,
        Experts::Vq3 => ExpertFormat::Vq3,
        Experts::F32 => ExpertFormat::F32,
        Experts::Int4 => ExpertFormat::Int4,
        Experts::Rtn3 => ExpertFormat::Rtn3,
    };
    let trunk = match trunk {
        Trunk::Keep => TrunkFormat::Keep,
        Trunk::F32 => TrunkFormat::F32,
        Trunk::Bf16 => TrunkFormat::Bf16,
        Trunk::Int8 => TrunkFormat::Int8,
        Trunk::Int4 => TrunkFormat::Int4,
    };
    let opts = ConvertOptions {
        experts,
        trunk,
        alignment: align,
        shards,
        shard_dirs,
        calibration,
        ..ConvertOptions::new(&hf, &out)
    };
    let pb = bar(0);
    let mut phase = "";
    let report = run_convert(&opts, &mut |p: Progress| {
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
        println!(
            "ignored {} tensors k3 does not run (a vision tower, multi-token-prediction layers; e.g. {})",
            report.ignored.len(),
            report.ignored[0]
        );
    }
    Ok(())
}

pub fn export(model: &Path, out: &Path) -> Result<()> {
    let src = k3_convert::Source::open(model)?;
    let pb = bar(0);
    pb.set_message("export");
    let r = k3_convert::export(&src, out, &mut |done, total| {
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

pub fn synth(preset: &str, out: &PathBuf, experts: Option<Experts>) -> Result<()> {
    if preset == TOOL_CALLER {
        return tool_caller(out);
    }
    let p = k3_convert::synth::preset(preset).with_context(|| {
        let names: Vec<&str> = k3_convert::synth::PRESETS.iter().map(|p| p.name).chain([TOOL_CALLER]).collect();
        format!("unknown preset `{preset}` (one of {})", names.join(", "))
    })?;
    let e = match experts {
        None | Some(Experts::Keep) => p.experts_default,
        Some(Experts::Vq3) => k3_convert::synth::SynthExperts::Vq3,
        Some(Experts::Mxfp4) => k3_convert::synth::SynthExperts::Mxfp4,
        Some(Experts::Int4) => k3_convert::synth::SynthExperts::Int4,
        Some(Experts::Bf16 | Experts::F32 | Experts::Rtn3) => bail!("synthetic models have MXFP4, INT4 or vq3 experts"),
    };
    let pb = bar(0);
    pb.set_message("synth");
    k3_convert::synth::synth(&p, e, out, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    })?;
    pb.finish_and_clear();
    let m = k3_format::Model::open(out)?;
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

const TOOL_CALLER: &str = "tool-caller";

/// The scripted Kimi-Linear model that answers every turn with a `get_weather` call
/// (`k3_convert::synth::scripted`), made from the golden tiny Kimi-Linear's shapes and converted.
fn tool_caller(out: &Path) -> Result<()> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden/tiny-kimi-linear");
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let hf = tempfile::tempdir_in(parent).with_context(|| format!("a scratch directory in {}", parent.display()))?;
    k3_convert::synth::scripted::tool_caller(&base, hf.path())?;
    run_convert(&ConvertOptions::new(hf.path(), out), &mut |_| {})?;
    println!("wrote {TOOL_CALLER} to {}", out.display());
    Ok(())
}

/// The calibration pass: the source model reads the text and its experts' inputs are sampled.
fn calibrate(args: &ConvertArgs, text: &Path) -> Result<k3_convert::calibrate::Calibration> {
    if !matches!(args.experts, Experts::Vq3) {
        bail!("--calibrate weights VQ encodings: use it with --experts vq3");
    }
    // The engine runs WASTE models: a checkpoint is converted as stored first, into a scratch
    // directory beside the output (removed afterwards).
    let scratch;
    let source = if args.hf.join(k3_format::HEADER_FILE).exists() {
        args.hf.clone()
    } else {
        let parent = args.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        scratch =
            tempfile::tempdir_in(parent).with_context(|| format!("a scratch directory in {}", parent.display()))?;
        let as_stored = scratch.path().join("as-stored");
        println!("calibration runs the model: converting {} as stored first", args.hf.display());
        run_convert(&ConvertOptions::new(&args.hf, &as_stored), &mut |_| {})?;
        as_stored
    };
    let model = k3_format::Model::open(&source)?;
    let tok = k3_engine::tokenizer::Tokenizer::from_model(&model)
        .with_context(|| format!("{} embeds no tokenizer to read the calibration text with", args.hf.display()))??;
    let words = std::fs::read_to_string(text).with_context(|| format!("reading {}", text.display()))?;
    let all = tok.encode(&words);
    let ids = k3_convert::calibrate::spread(&all, args.calibrate_tokens, CALIBRATION_WINDOW);
    if ids.is_empty() {
        bail!("{} has no text to calibrate on", text.display());
    }
    let pb = bar(ids.len() as u64);
    pb.set_message("calibrate");
    let cal =
        k3_convert::calibrate::collect(&model, &ids, CALIBRATION_WINDOW, args.calibrate_samples, &mut |done, _| {
            pb.set_position(done as u64)
        })?;
    pb.finish_and_clear();
    let (experts, inputs) = cal.coverage();
    println!(
        "calibrated on {} of the {} tokens of {} (windows spread over it): {experts} experts saw {inputs} inputs",
        ids.len(),
        all.len(),
        text.display()
    );
    Ok(cal)
}
