#![recursion_limit = "256"]
// The engine's error is returned as the engine returns it: conversion fails once, not in a hot loop.
#![allow(clippy::result_large_err)]
//! # k3-convert
//!
//! Conversion, apart from the runtime (as llama.cpp keeps `convert_hf_to_gguf.py` outside its
//! library): Hugging Face checkpoint -> WASTE model. Experts are grouped into one record per
//! (layer, expert); every other text tensor goes to the trunk. Resumable (the writer's journal),
//! refuses to touch a directory it did not start, verifies everything at the end. Also here: the
//! table of tensors a config implies ([`tensors`]), calibration for VQ3 ([`calibrate`]) and the
//! random-weight models of the benchmarks and tests ([`synth`]).

pub mod calibrate;
pub mod synth;
pub mod tensors;

mod dequant;
mod encode;
mod export;
mod in_place;
mod needs;
mod plan;
mod reencoded;
mod source;
mod write;

use std::path::{Path, PathBuf};

use k3_format::{FormatError, ModelWriter, Opened};

pub use encode::{ExpertTarget, TrunkFormat};
pub use export::{ExportReport, export};
use k3_engine::config::ConfigError;
pub use needs::{Needs, Target};
use plan::Plan;
pub use reencoded::ReEncoded;
pub use source::{Source, SourceTensor};

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: {reason}")]
    Source { path: PathBuf, reason: String },
    #[error("the checkpoint has no tensor `{name}`")]
    MissingTensor { name: String },
    #[error("tensor `{name}` is {found}, expected {expected}")]
    Shape { name: String, expected: String, found: String },
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The calibration pass (the source model reading the calibration tokens) failed.
    #[error("calibration: {0}")]
    Calibration(Box<k3_engine::EngineError>),
    #[error("verification after conversion found {count} bad item(s); first: {first}")]
    Verify { count: usize, first: String },
    #[error(
        "not enough free space in {dir}: the conversion writes {} GB more there and {} GB are free; \
         free some space, or write to another drive (--out, --shard-dir)", gb(*need), gb(*free)
    )]
    NoSpace { dir: PathBuf, need: u64, free: u64 },
}

/// Bytes as decimal gigabytes with enough digits for a small model.
fn gb(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / 1e9)
}

impl ConvertError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        ConvertError::Io { path: path.to_path_buf(), source }
    }
}

/// How routed experts are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertFormat {
    /// Whatever the checkpoint stores (MXFP4 for K3, BF16 for Kimi-Linear), byte for byte.
    Keep,
    Mxfp4,
    Bf16,
    Vq3,
    /// Exact f32 (4 bytes a weight): for checking a quantized checkpoint's parity, not for use.
    F32,
    /// k3's int4 in groups of 32 (round to nearest; INT4 checkpoints' own groups are kept).
    Int4,
    /// 3-bit round to nearest in groups of 32, stored as int4: the baseline VQ3 is measured
    /// against (int4's bytes; for quality comparisons, not for use).
    Rtn3,
    /// 2-bit round to nearest in groups of 32 (16 or 8 where a row needs them): HOBBIT's
    /// low-bit copies of the experts, read instead of a light expert's record on a cache miss.
    Int2,
    /// FP8 e4m3 in 128 x 128 blocks by DeepSeek's quantization (`amax / 448` per block): how
    /// K2-Instruct and DeepSeek-V3 were made, for measuring what FP8 costs; FP8 checkpoints keep
    /// their own with `keep`.
    Fp8,
}

impl ExpertFormat {
    pub fn name(self) -> &'static str {
        match self {
            ExpertFormat::Keep => "keep",
            ExpertFormat::Mxfp4 => "mxfp4",
            ExpertFormat::Bf16 => "bf16",
            ExpertFormat::Vq3 => "vq3",
            ExpertFormat::F32 => "f32",
            ExpertFormat::Int4 => "int4",
            ExpertFormat::Rtn3 => "rtn3",
            ExpertFormat::Int2 => "int2",
            ExpertFormat::Fp8 => "fp8",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub hf_dir: PathBuf,
    pub out_dir: PathBuf,
    pub experts: ExpertFormat,
    pub trunk: TrunkFormat,
    /// Expert record alignment: 4096 (default) or 2 MiB.
    pub alignment: u64,
    pub shards: u16,
    /// Directories (one per drive) the shards are striped over; empty = the output directory.
    pub shard_dirs: Vec<PathBuf>,
    /// Re-encoded VQ experts minimize the error on the inputs the source model gives them
    /// reading these tokens (`crate::calibrate`), a layer at a time.
    pub calibration: Option<std::sync::Arc<calibrate::CalibrationPlan>>,
    /// Copy experts kept as stored into the model's shards instead of reading them in place
    /// from the checkpoint's files (which must then stay as they are).
    pub copy_experts: bool,
    /// Check and plan only: the report's `needs` says what would be written where; nothing is
    /// written or created.
    pub dry_run: bool,
}

impl ConvertOptions {
    /// `hf_dir` to `out_dir`, experts and trunk as stored, one shard, the default alignment.
    pub fn new(hf_dir: impl Into<PathBuf>, out_dir: impl Into<PathBuf>) -> Self {
        ConvertOptions {
            hf_dir: hf_dir.into(),
            out_dir: out_dir.into(),
            experts: ExpertFormat::Keep,
            trunk: TrunkFormat::Keep,
            alignment: k3_format::DEFAULT_ALIGNMENT,
            shards: 1,
            shard_dirs: Vec::new(),
            calibration: None,
            copy_experts: false,
            dry_run: false,
        }
    }
}

/// What a [`Progress`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Model layers (`synth`'s trunk, whose bytes are not known before it is written).
    Layers,
}

/// Progress of a conversion (or of `synth`), by phase (`trunk`, `experts`, `verify`), each with
/// its own total; a calibrated conversion also says `calibrate` (MoE layer `done` of `total`)
/// as the walk starts on each layer's samples, within the `experts` phase.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
    /// What `done` and `total` count.
    pub unit: Unit,
    /// How much of `total` an interrupted run had already written (counted in `done`): a rate or
    /// an ETA is this run's `done - resumed`.
    pub resumed: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ConvertReport {
    pub already_complete: bool,
    pub resumed_items: usize,
    pub written_items: usize,
    pub written_bytes: u64,
    /// Experts read in place from the checkpoint's files: how many files; else why they were
    /// all copied, when they are kept as stored.
    pub in_place: Option<Result<usize, String>>,
    /// Experts copied beside those read in place (that could not be), and why the first was.
    pub copied_experts: Option<(usize, String)>,
    /// What the conversion writes where, and the space free there (checked before writing).
    pub needs: Option<Needs>,
    /// Checkpoint tensors k3 does not run: a vision tower, DeepSeek-V3's multi-token-prediction layers.
    pub ignored: Vec<String>,
    pub verified_bytes: u64,
    /// Tensors stored in another encoding than the checkpoint's, grouped, with why.
    pub re_encoded: Vec<ReEncoded>,
    /// Per MoE layer this run calibrated: how its experts' inputs were weighted.
    pub calibrated: Vec<calibrate::LayerCalibration>,
    /// The calibration walk's peak memory by part, as checked before it ran.
    pub calibration_peak: Option<calibrate::PeakMemory>,
}

/// The options with every path in one spelling (so a resumed conversion is recognised however
/// its paths were typed). A shard directory yet to be made is spelled as its nearest existing
/// ancestor's canonical path and the rest; nothing is created here.
fn canonical(opts: &ConvertOptions) -> Result<ConvertOptions, ConvertError> {
    let canon = |p: &Path| std::fs::canonicalize(p).map_err(|e| ConvertError::io(p, e));
    let mut shard_dirs = Vec::with_capacity(opts.shard_dirs.len());
    for d in &opts.shard_dirs {
        let base = d.ancestors().find(|a| !a.as_os_str().is_empty() && a.exists()).unwrap_or(Path::new("."));
        let rest = d.strip_prefix(base).unwrap_or(d);
        shard_dirs.push(canon(base)?.join(rest));
    }
    Ok(ConvertOptions { hf_dir: canon(&opts.hf_dir)?, shard_dirs, ..opts.clone() })
}

/// Converts `opts.hf_dir` (a checkpoint or a WASTE model) to a WASTE model in `opts.out_dir`:
/// everything checked first, then written (resuming a conversion this directory already holds),
/// then verified. `progress` hears each phase.
pub fn convert(opts: &ConvertOptions, progress: &mut dyn FnMut(Progress)) -> Result<ConvertReport, ConvertError> {
    let opts = &canonical(opts)?;
    let src = Source::open(&opts.hf_dir)?;
    let plan = Plan::build(opts, &src)?;
    let mut report = ConvertReport { ignored: plan.ignored.clone(), ..ConvertReport::default() };
    report.in_place = Some(plan.in_place.as_ref().map(|ip| ip.files.len()).map_err(Clone::clone));
    if let Ok(ip) = &plan.in_place {
        report.copied_experts = ip.why_copied.clone().map(|why| (ip.copied, why));
    }
    let needs = needs::needs(&plan, &src, opts)?;
    let short = needs.short().map(|t| (t.dirs[0].clone(), t.bytes, t.free));
    report.needs = Some(needs);
    if opts.dry_run {
        return Ok(report);
    }
    if let Some((dir, need, free)) = short {
        return Err(ConvertError::NoSpace { dir, need, free });
    }
    for d in &opts.shard_dirs {
        std::fs::create_dir_all(d).map_err(|e| ConvertError::io(d, e))?;
    }
    let mut w = match ModelWriter::open(&opts.out_dir, plan.writer_spec(opts, &src))? {
        Opened::Complete => {
            report.already_complete = true;
            report.re_encoded = reencoded::list(&write::open(opts)?, &plan, &src, opts);
            return Ok(report);
        }
        Opened::Writer(w) => w,
    };
    report.resumed_items = w.resumed_items();
    write::trunk(&mut w, &plan, &src, opts.trunk, &mut report, progress)?;
    match &plan.in_place {
        Ok(ip) => write::experts_in_place(&mut w, &plan, ip, &src, &mut report, progress)?,
        Err(_) => write::experts(&mut w, &plan, &src, opts.calibration.as_deref(), &mut report, progress)?,
    }
    let model = write::finish(*w, &src, opts, progress)?;
    report.verified_bytes = model.verify_bytes_of(false);
    report.re_encoded = reencoded::list(&model, &plan, &src, opts);
    Ok(report)
}
