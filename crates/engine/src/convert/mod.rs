//! Hugging Face checkpoint -> WASTE model. Experts are grouped into one record per (layer, expert);
//! every other text tensor goes to the trunk. Resumable (the writer's journal), refuses to touch a
//! directory it did not start, verifies everything at the end.

mod encode;
mod export;
mod source;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k3_format::{Encoding, ExpertLayout, FormatError, Model, ModelWriter, OpenOptions, Opened, WriterSpec};
use rayon::prelude::*;
use safetensors::Dtype as StDtype;

use crate::config::{ConfigError, ModelConfig};
use crate::tensors::{ExpertShapes, Storage, TensorTable};
pub use encode::{ExpertTarget, TrunkFormat, codec_of};
pub use export::{ExportReport, export};
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
    #[error("verification after conversion found {count} bad item(s); first: {first}")]
    Verify { count: usize, first: String },
}

impl ConvertError {
    fn io(path: &Path, source: std::io::Error) -> Self {
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
}

impl ExpertFormat {
    pub fn name(self) -> &'static str {
        match self {
            ExpertFormat::Keep => "keep",
            ExpertFormat::Mxfp4 => "mxfp4",
            ExpertFormat::Bf16 => "bf16",
            ExpertFormat::Vq3 => "vq3",
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
}

/// Progress of a conversion, by phase (`trunk`, `experts`, `verify`), each with its own total.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub phase: &'static str,
    pub done: u64,
    pub total: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ConvertReport {
    pub already_complete: bool,
    pub resumed_items: usize,
    pub written_items: usize,
    pub written_bytes: u64,
    /// Checkpoint tensors that are not part of the text model (the vision tower).
    pub ignored: Vec<String>,
    pub verified_bytes: u64,
}

/// What one source tensor name means.
enum Role {
    Expert { layer: u32, expert: u32 },
    Trunk,
    Ignored,
}

fn role(name: &str) -> Role {
    if let Some((layer, expert)) = crate::names::parse_expert(name) {
        Role::Expert { layer, expert }
    } else if name.starts_with("model.") || name.starts_with("lm_head.") {
        Role::Trunk
    } else {
        Role::Ignored
    }
}

use crate::names::{EXPERT_MATRICES, expert as expert_name};

/// How a layer's experts are stored in the checkpoint, and their logical shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceExperts {
    Mxfp4,
    Bf16,
    F32,
}

/// How a layer's experts are stored, and their logical shapes (from the config, so a misshaped
/// tensor is named itself rather than blamed on its neighbour).
fn expert_shapes(
    src: &Source,
    layer: u32,
    shapes: &ExpertShapes,
) -> Result<(SourceExperts, Vec<Vec<u64>>), ConvertError> {
    let first = expert_name(layer, 0, "w1");
    let kind = if src.get(&format!("{first}.weight_packed")).is_ok() {
        SourceExperts::Mxfp4
    } else if let Ok(t) = src.get(&format!("{first}.weight")) {
        match t.dtype {
            StDtype::BF16 => SourceExperts::Bf16,
            StDtype::F32 => SourceExperts::F32,
            other => {
                return Err(ConvertError::Unsupported(format!(
                    "`{first}.weight` is {other:?}; routed experts must be BF16, F32 or MXFP4"
                )));
            }
        }
    } else {
        return Err(ConvertError::MissingTensor { name: format!("{first}.weight_packed (or .weight)") });
    };
    let shapes = [shapes.w1, shapes.w2, shapes.w3].iter().map(|s| s.to_vec()).collect();
    Ok((kind, shapes))
}

/// Every trunk tensor of the checkpoint against the config's table: the first misshaped,
/// unknown or missing one is the error, before anything is written.
fn check_trunk(table: &TensorTable, src: &Source, names: &[String], family: &str) -> Result<(), ConvertError> {
    for name in names {
        let t = src.get(name)?;
        match table.get(name) {
            Some(e) if e.expect.accepts(&t.shape) => {}
            Some(e) => {
                return Err(ConvertError::Shape {
                    name: name.clone(),
                    expected: e.expect.to_string(),
                    found: format!("shape {:?}", t.shape),
                });
            }
            None => {
                return Err(ConvertError::Unsupported(format!(
                    "tensor `{name}` is not part of a {family} model with this config.json; \
                     is the config the checkpoint's own?"
                )));
            }
        }
    }
    if let Some(e) = table.trunk.iter().find(|e| !names.contains(&e.name)) {
        return Err(ConvertError::MissingTensor { name: e.name.clone() });
    }
    Ok(())
}

/// The source tensors of one expert matrix: name, dtype and shape, in the order they are stored.
fn expert_sources(kind: SourceExperts, base: &str, shape: &[u64]) -> Vec<(String, StDtype, Vec<u64>)> {
    match kind {
        SourceExperts::Mxfp4 => vec![
            (format!("{base}.weight_packed"), StDtype::U8, vec![shape[0], shape[1] / 2]),
            (format!("{base}.weight_scale"), StDtype::U8, vec![shape[0], shape[1] / 32]),
        ],
        SourceExperts::Bf16 => vec![(format!("{base}.weight"), StDtype::BF16, shape.to_vec())],
        SourceExperts::F32 => vec![(format!("{base}.weight"), StDtype::F32, shape.to_vec())],
    }
}

/// Checks one expert matrix's tensors against the layer's shape without reading them.
fn check_expert_parts(src: &Source, kind: SourceExperts, base: &str, shape: &[u64]) -> Result<(), ConvertError> {
    for (name, dtype, shape) in expert_sources(kind, base, shape) {
        src.check(&name, dtype, &shape)?;
    }
    Ok(())
}

/// The stored parts of one expert matrix, checked against the layer's shape.
fn expert_parts<'a>(
    src: &'a Source,
    kind: SourceExperts,
    base: &str,
    shape: &[u64],
) -> Result<Vec<&'a [u8]>, ConvertError> {
    expert_sources(kind, base, shape).iter().map(|(name, dtype, shape)| src.expect(name, *dtype, shape)).collect()
}

/// The options with every path in one spelling (so a resumed conversion is recognised however
/// its paths were typed), the shard directories created.
fn canonical(opts: &ConvertOptions) -> Result<ConvertOptions, ConvertError> {
    let canon = |p: &Path| std::fs::canonicalize(p).map_err(|e| ConvertError::io(p, e));
    let mut shard_dirs = Vec::with_capacity(opts.shard_dirs.len());
    for d in &opts.shard_dirs {
        std::fs::create_dir_all(d).map_err(|e| ConvertError::io(d, e))?;
        shard_dirs.push(canon(d)?);
    }
    Ok(ConvertOptions { hf_dir: canon(&opts.hf_dir)?, shard_dirs, ..opts.clone() })
}

/// Files copied into the header verbatim when the checkpoint has them.
const EMBEDDED_FILES: [&str; 4] = ["config.json", "tiktoken.model", "tokenizer_config.json", "tokenizer.json"];

pub fn convert(opts: &ConvertOptions, progress: &mut dyn FnMut(Progress)) -> Result<ConvertReport, ConvertError> {
    let opts = &canonical(opts)?;
    let src = Source::open(&opts.hf_dir)?;
    let config_path = src.path_of("config.json");
    let config_bytes = src.file("config.json")?.ok_or_else(|| ConvertError::Source {
        path: opts.hf_dir.clone(),
        reason: "no config.json: not a checkpoint or WASTE model directory".into(),
    })?;
    let config = ModelConfig::parse(&config_path, &config_bytes)?;
    let table = crate::tensors::table(&config);
    let arch = config.architecture();

    let mut report = ConvertReport::default();
    let mut trunk_names = Vec::new();
    for name in src.names() {
        match role(name) {
            Role::Expert { layer, expert } => {
                if arch.moe_layers.binary_search(&layer).is_err() || expert >= arch.experts {
                    return Err(ConvertError::Source {
                        path: opts.hf_dir.clone(),
                        reason: format!("tensor `{name}` names an expert the config does not have"),
                    });
                }
            }
            Role::Trunk => trunk_names.push(name.to_string()),
            Role::Ignored => report.ignored.push(name.to_string()),
        }
    }
    check_trunk(&table, &src, &trunk_names, config.family.name())?;

    // One layout per distinct (source kind, shapes); K3 and Kimi-Linear need one.
    let mut layouts: Vec<ExpertLayout> = Vec::new();
    let mut layer_plan = Vec::new();
    let mut keys: Vec<(SourceExperts, Vec<Vec<u64>>)> = Vec::new();
    for &layer in &arch.moe_layers {
        let (kind, shapes) = expert_shapes(&src, layer, &table.experts)?;
        let target = match (kind, opts.experts) {
            (SourceExperts::Mxfp4, ExpertFormat::Keep | ExpertFormat::Mxfp4) => None,
            (SourceExperts::Bf16, ExpertFormat::Keep | ExpertFormat::Bf16) => None,
            (SourceExperts::F32, ExpertFormat::Keep) => None,
            (_, ExpertFormat::Mxfp4) => Some(ExpertTarget::Mxfp4),
            (_, ExpertFormat::Bf16) => Some(ExpertTarget::Bf16),
            (_, ExpertFormat::Vq3) => Some(ExpertTarget::Vq(k3_quant::vq::DEFAULT_CODEC)),
        };
        let key = (kind, shapes.clone());
        let id = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                let stored = |s: &[u64]| match (target, kind) {
                    (None, SourceExperts::Mxfp4) => Encoding::Mxfp4,
                    (None, SourceExperts::Bf16) => Encoding::Bf16,
                    (None, SourceExperts::F32) => Encoding::F32,
                    (Some(t), _) => encode::planned(t, s[1] as usize),
                };
                let mats: Vec<(&str, Encoding, Vec<u64>)> =
                    EXPERT_MATRICES.iter().zip(&shapes).map(|(w, s)| (*w, stored(s), s.clone())).collect();
                layouts.push(ExpertLayout::build(opts.alignment, &mats).map_err(ConvertError::Unsupported)?);
                keys.push(key);
                keys.len() - 1
            }
        };
        layer_plan.push((layer, kind, shapes, id as u16, target));
    }

    // Every expert tensor's dtype and shape, before anything is written.
    for (layer, kind, shapes, ..) in &layer_plan {
        for expert in 0..arch.experts {
            for (m, shape) in EXPERT_MATRICES.iter().zip(shapes) {
                check_expert_parts(&src, *kind, &expert_name(*layer, expert, m), shape)?;
            }
        }
    }

    let records = arch.moe_layers.len() as u64 * u64::from(arch.experts);
    if u64::from(opts.shards) > records.max(1) {
        return Err(ConvertError::Unsupported(format!(
            "{} expert shards for {records} expert records would leave shards empty; give at most {}",
            opts.shards,
            records.max(1)
        )));
    }
    k3_format::manifest::check_alignment(opts.alignment).map_err(ConvertError::Unsupported)?;

    let expert_label = layouts.first().map_or("none".to_string(), |l| l.matrices[0].encoding.label());
    let spec = WriterSpec {
        architecture: arch.clone(),
        alignment: opts.alignment,
        shards: opts.shards,
        shard_dirs: opts.shard_dirs.clone(),
        expert_layouts: layouts,
        encodings: BTreeMap::from([
            ("experts".to_string(), expert_label),
            (
                "trunk".to_string(),
                match opts.trunk {
                    TrunkFormat::Keep => "as stored (bf16/f32)".to_string(),
                    t => t.name().to_string(),
                },
            ),
        ]),
        provenance: serde_json::json!({
            "source": opts.hf_dir.display().to_string(),
            "source_files": src.file_sizes().into_iter().collect::<BTreeMap<_, _>>(),
            "converter": concat!("k3 ", env!("CARGO_PKG_VERSION"), " convert"),
            "options": {
                "experts": opts.experts.name(),
                "trunk": opts.trunk.name(),
                "alignment": opts.alignment,
                "shards": opts.shards,
            },
        }),
    };

    let mut w = match ModelWriter::open(&opts.out_dir, spec)? {
        Opened::Complete => {
            report.already_complete = true;
            return Ok(report);
        }
        Opened::Writer(w) => w,
    };
    report.resumed_items = w.resumed_items();

    let record_bytes: Vec<u64> = w.spec().expert_layouts.iter().map(|l| l.record_bytes).collect();
    // Two phases with their own totals: trunk bytes go by fast, experts (re-encoded, perhaps)
    // slowly, and one bar over both would promise an ETA the experts never keep.
    let trunk_total: u64 = trunk_names.iter().map(|n| src.get(n).map_or(0, |t| src.bytes(t).len() as u64)).sum();
    let expert_total: u64 = layer_plan.iter().map(|p| record_bytes[usize::from(p.3)] * u64::from(arch.experts)).sum();
    let mut done = 0u64;
    let mut tick = |done: u64| progress(Progress { phase: "trunk", done, total: trunk_total });

    for name in &trunk_names {
        let t = src.get(name)?;
        let bytes = src.bytes(t);
        if !w.has_tensor(name) {
            let storage = table.get(name).map_or(Storage::Exact, |e| e.storage);
            let (enc, parts) = encode::trunk(name, t.dtype, &t.shape, bytes, opts.trunk, storage)?;
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            w.write_tensor(name, enc, &t.shape, &refs)?;
            report.written_items += 1;
            // What was written (an int8 / int4 trunk is smaller than its source).
            report.written_bytes += refs.iter().map(|p| p.len() as u64).sum::<u64>();
        }
        done += bytes.len() as u64;
        tick(done);
    }
    let mut done = 0u64;
    let mut tick = |done: u64| progress(Progress { phase: "experts", done, total: expert_total });
    for (layer, kind, shapes, layout, target) in &layer_plan {
        let rb = record_bytes[usize::from(*layout)];
        let todo: Vec<u32> = (0..arch.experts).filter(|e| !w.has_expert(*layer, *e)).collect();
        done += rb * u64::from(arch.experts - todo.len() as u32);
        // Re-encoding runs on every core, a few experts at a time (bounded memory); records are
        // still written in (layer, expert) order.
        let batch = if target.is_some() { rayon::current_num_threads().max(1) * 2 } else { 1 };
        for chunk in todo.chunks(batch) {
            let encoded: Vec<Result<Vec<Vec<u8>>, ConvertError>> = chunk
                .par_iter()
                .map(|&expert| {
                    let mut parts = Vec::with_capacity(9);
                    for (m, shape) in EXPERT_MATRICES.iter().zip(shapes) {
                        let base = expert_name(*layer, expert, m);
                        let raw = expert_parts(&src, *kind, &base, shape)?;
                        match target {
                            None => parts.extend(raw.iter().map(|b| b.to_vec())),
                            Some(t) => {
                                let (rows, cols) = (shape[0] as usize, shape[1] as usize);
                                let f = match kind {
                                    SourceExperts::Mxfp4 => encode::mxfp4_to_f32(raw[0], raw[1], rows, cols),
                                    SourceExperts::Bf16 => encode::to_f32(&base, StDtype::BF16, raw[0])?,
                                    SourceExperts::F32 => encode::to_f32(&base, StDtype::F32, raw[0])?,
                                };
                                let (enc, p) = encode::expert(&base, &f, rows, cols, *t)?;
                                if enc != encode::planned(*t, cols) {
                                    return Err(ConvertError::Unsupported(format!(
                                        "{base}: encoder produced {} not the planned layout",
                                        enc.label()
                                    )));
                                }
                                parts.extend(p);
                            }
                        }
                    }
                    Ok(parts)
                })
                .collect();
            for (&expert, parts) in chunk.iter().zip(encoded) {
                let parts = parts?;
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                w.write_expert(*layer, expert, *layout, &refs)?;
                report.written_items += 1;
                report.written_bytes += rb;
                done += rb;
                tick(done);
            }
        }
    }

    let mut blobs = Vec::new();
    for name in EMBEDDED_FILES {
        if let Some(bytes) = src.file(name)? {
            blobs.push((name, bytes));
        }
    }
    let blob_refs: Vec<(&str, &[u8])> = blobs.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    w.finish(&blob_refs)?;

    let model = Model::open_with(&opts.out_dir, &OpenOptions { shard_dirs: opts.shard_dirs.clone() })?;
    let total = model.verify_bytes();
    let problems = model.verify(&mut |done| progress(Progress { phase: "verify", done, total }));
    if let Some(first) = problems.first() {
        return Err(ConvertError::Verify { count: problems.len(), first: first.error.to_string() });
    }
    report.verified_bytes = total;
    Ok(report)
}
