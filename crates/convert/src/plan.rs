//! What a conversion will write, decided and checked before anything is: the source's tensors
//! sorted into trunk and experts, every name and shape checked against the config's table, one
//! record layout per distinct kind of expert, and the writer's spec.

use std::collections::BTreeMap;

use k3_format::{Architecture, Encoding, ExpertLayout, WriterSpec};
use safetensors::Dtype as StDtype;

use super::encode::{self, ExpertTarget, TrunkFormat};
use super::{ConvertError, ConvertOptions, ExpertFormat, Source};
use crate::tensors::{ExpertShapes, TensorTable};
use k3_engine::config::ModelConfig;
use k3_engine::names::{EXPERT_MATRICES, expert as expert_name};

use super::in_place::{self, InPlace};

/// Files copied into the header verbatim when the checkpoint has them.
pub(super) const EMBEDDED_FILES: [&str; 7] = [
    "config.json",
    "tiktoken.model",
    "tokenizer_config.json",
    "tokenizer.json",
    "chat_template.jinja",
    k3_generate::generation_config::FILE,
    // The image processor's settings (K3).
    "preprocessor_config.json",
];

/// One MoE layer's experts: how the source stores them, their shapes, the record layout they
/// get, and what they are re-encoded to (`None`: copied as stored).
pub(super) struct LayerPlan {
    pub layer: u32,
    pub kind: SourceExperts,
    pub shapes: Vec<Vec<u64>>,
    pub layout: u16,
    pub target: Option<ExpertTarget>,
}

/// A checked conversion.
pub(super) struct Plan {
    pub table: TensorTable,
    pub arch: Architecture,
    pub trunk_names: Vec<String>,
    /// Checkpoint tensors k3 does not run: DeepSeek-V3's multi-token-prediction layers (and a
    /// vision tower whose config has no `vision_config`).
    pub ignored: Vec<String>,
    pub layouts: Vec<ExpertLayout>,
    pub layers: Vec<LayerPlan>,
    /// FP8 checkpoints' block size.
    pub fp8_block: u32,
    /// The experts' activation (calibration computes w2's inputs with it).
    pub activation: k3_engine::config::Activation,
    /// The experts are read from the checkpoint's own files, not copied; else why not.
    pub in_place: Result<InPlace, String>,
}

impl Plan {
    /// Reads the config and checks every tensor of `src` against it; nothing is written.
    pub fn build(opts: &ConvertOptions, src: &Source) -> Result<Plan, ConvertError> {
        let config_path = src.path_of("config.json");
        let config_bytes = src.file("config.json")?.ok_or_else(|| ConvertError::Source {
            path: opts.hf_dir.clone(),
            reason: "no config.json: not a checkpoint or WASTE model directory".into(),
        })?;
        let config = ModelConfig::parse(&config_path, &config_bytes)?;
        check_chat_template(src, config.family)?;
        check_generation_config(src)?;
        let table = crate::tensors::table(&config);
        let arch = config.architecture();
        let (trunk_names, ignored) = sort_tensors(opts, src, &arch, config.vision.is_some())?;
        check_trunk(&table, src, &trunk_names, config.family.name())?;
        let fp8_block = fp8_block(&config_path, &config_bytes)?;
        let (layouts, layers) = plan_experts(opts, src, &arch, &table.experts, fp8_block)?;
        // Every expert tensor's dtype and shape, before anything is written.
        for p in &layers {
            for expert in 0..arch.experts {
                for (m, shape) in EXPERT_MATRICES.iter().zip(&p.shapes) {
                    check_expert_parts(src, p.kind, &expert_name(p.layer, expert, m), shape)?;
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
        k3_format::check_alignment(opts.alignment).map_err(ConvertError::Unsupported)?;
        let in_place = match opts.copy_experts {
            true => Err("asked to copy them (--copy-experts)".to_string()),
            false => in_place::plan(src, &layers, &layouts, arch.experts)?,
        };
        let placed = opts.shards != 1 || !opts.shard_dirs.is_empty() || opts.alignment != k3_format::DEFAULT_ALIGNMENT;
        if in_place.is_ok() && placed {
            return Err(ConvertError::Unsupported(
                "--shards, --shard-dir and --align place copied experts, but these are read in place from the \
                 checkpoint's files; add --copy-experts to copy them"
                    .into(),
            ));
        }
        let activation = config.activation;
        Ok(Plan { table, arch, trunk_names, ignored, layouts, layers, fp8_block, activation, in_place })
    }

    /// The writer's spec: the layout, the encodings in words, and where the model came from.
    pub fn writer_spec(&self, opts: &ConvertOptions, src: &Source) -> WriterSpec {
        let expert_label = self.layouts.first().map_or("none".to_string(), |l| l.matrices[0].encoding.label());
        let trunk_label = match opts.trunk {
            // (Models converted before FP8 was kept say the same without it: header bytes unchanged.)
            TrunkFormat::Keep
                if self.trunk_names.iter().any(|n| src.get(n).is_ok_and(|t| t.dtype == StDtype::F8_E4M3)) =>
            {
                "as stored (fp8 blocks, bf16/f32)".to_string()
            }
            TrunkFormat::Keep => "as stored (bf16/f32)".to_string(),
            t => t.name().to_string(),
        };
        let mut options = serde_json::json!({
            "experts": opts.experts.name(),
            "trunk": opts.trunk.name(),
            "alignment": opts.alignment,
            "shards": opts.shards,
        });
        // Only when read in place: copied models keep the provenance (and header bytes) they had.
        if self.in_place.is_ok() {
            options["experts_in_place"] = true.into();
        }
        // Only when calibrated: uncalibrated models keep the provenance (and header bytes) they had.
        if let Some(c) = &opts.calibration {
            options["calibration"] = c.provenance();
        }
        let (shards, shard_dirs, expert_layouts, checkpoint_files) = match &self.in_place {
            // The experts that cannot be read in place go to one shard of the model's own.
            Ok(ip) => {
                let layouts = self.layouts.iter().chain(&ip.layouts).cloned().collect();
                (u16::from(ip.copied > 0), Vec::new(), layouts, ip.files.clone())
            }
            Err(_) => (opts.shards, opts.shard_dirs.clone(), self.layouts.clone(), Vec::new()),
        };
        WriterSpec {
            architecture: self.arch.clone(),
            alignment: opts.alignment,
            shards,
            shard_dirs,
            expert_layouts,
            checkpoint_files,
            encodings: BTreeMap::from([("experts".to_string(), expert_label), ("trunk".to_string(), trunk_label)]),
            provenance: serde_json::json!({
                "source": opts.hf_dir.display().to_string(),
                "source_files": src.file_sizes().into_iter().collect::<BTreeMap<_, _>>(),
                "converter": concat!("k3 ", env!("CARGO_PKG_VERSION"), " convert"),
                "options": options,
            }),
        }
    }
}

/// The source's tensor names sorted into the trunk's and the ignored ones; an expert the config
/// does not have is an error.
fn sort_tensors(
    opts: &ConvertOptions,
    src: &Source,
    arch: &Architecture,
    vision: bool,
) -> Result<(Vec<String>, Vec<String>), ConvertError> {
    let (mut trunk, mut ignored) = (Vec::new(), Vec::new());
    for name in src.names() {
        match role(name, arch.layers, vision) {
            Role::Expert { layer, expert } => {
                if arch.moe_layers.binary_search(&layer).is_err() || expert >= arch.experts {
                    return Err(ConvertError::Source {
                        path: opts.hf_dir.clone(),
                        reason: format!("tensor `{name}` names an expert the config does not have"),
                    });
                }
            }
            Role::Trunk => trunk.push(name.to_string()),
            Role::Companion => {}
            Role::Ignored => ignored.push(name.to_string()),
        }
    }
    Ok((trunk, ignored))
}

/// One layout per distinct (source kind, shapes) — K3 and Kimi-Linear need one — and each MoE
/// layer's plan.
/// The checkpoint's chat template, if it ships one with a tokenizer, must render a probe
/// conversation within its limits ([`k3_text::chat_format::ChatFormat::check`]).
fn check_chat_template(src: &Source, family: k3_engine::config::Family) -> Result<(), ConvertError> {
    let mut files = std::collections::HashMap::new();
    for name in EMBEDDED_FILES {
        if let Some(bytes) = src.file(name)? {
            files.insert(name, bytes);
        }
    }
    let Some(Ok(tok)) = k3_text::tokenizer::Tokenizer::from_files(|n| files.get(n).map(Vec::as_slice)) else {
        return Ok(());
    };
    let at = if files.contains_key("chat_template.jinja") { "chat_template.jinja" } else { "tokenizer_config.json" };
    k3_text::chat_format::ChatFormat::new(&tok, k3_generate::dialect(family))
        .check()
        .map_err(|e| ConvertError::Source { path: src.path_of(at), reason: e.to_string() })
}

/// Refuses a `generation_config.json` whose sampling settings could not be used, naming the field,
/// before anything is written (generate, chat and serve take their defaults from it).
fn check_generation_config(src: &Source) -> Result<(), ConvertError> {
    let name = k3_generate::generation_config::FILE;
    match src.file(name)? {
        Some(bytes) => k3_generate::generation_config::Recommended::parse(&bytes)
            .map(|_| ())
            .map_err(|e| ConvertError::Source { path: src.path_of(name), reason: e.to_string() }),
        None => Ok(()),
    }
}

fn plan_experts(
    opts: &ConvertOptions,
    src: &Source,
    arch: &Architecture,
    expert_shapes_of: &ExpertShapes,
    fp8_block: u32,
) -> Result<(Vec<ExpertLayout>, Vec<LayerPlan>), ConvertError> {
    let mut layouts: Vec<ExpertLayout> = Vec::new();
    let mut layers = Vec::new();
    let mut keys: Vec<(SourceExperts, Vec<Vec<u64>>)> = Vec::new();
    for &layer in &arch.moe_layers {
        let (kind, shapes) = expert_shapes(src, layer, expert_shapes_of, fp8_block)?;
        let target = match (kind, opts.experts) {
            (SourceExperts::Mxfp4, ExpertFormat::Keep | ExpertFormat::Mxfp4) => None,
            (SourceExperts::Bf16, ExpertFormat::Keep | ExpertFormat::Bf16) => None,
            (SourceExperts::F32, ExpertFormat::Keep | ExpertFormat::F32) => None,
            // INT4 groups are k3's own int4 layout byte for byte (scales bf16 -> f16, checked exact).
            (SourceExperts::Int4 { .. }, ExpertFormat::Keep) => None,
            (SourceExperts::Fp8 { .. }, ExpertFormat::Keep) => None,
            (_, ExpertFormat::F32) => Some(ExpertTarget::F32),
            (SourceExperts::Int4 { group: 32 }, ExpertFormat::Int4) => None,
            (_, ExpertFormat::Int4) => Some(ExpertTarget::Int4),
            (_, ExpertFormat::Rtn3) => Some(ExpertTarget::Rtn3),
            (_, ExpertFormat::Int2) => Some(ExpertTarget::Int2),
            (SourceExperts::Fp8 { block: 128 }, ExpertFormat::Fp8) => None,
            (_, ExpertFormat::Fp8) => Some(ExpertTarget::Fp8),
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
                    (None, SourceExperts::Int4 { group }) => Encoding::Int4Group { group },
                    (None, SourceExperts::Fp8 { block }) => encode::fp8_encoding(block),
                    (None, _) => Encoding::F32,
                    (Some(t), _) => encode::planned(t, s[1] as usize),
                };
                let mats: Vec<(&str, Encoding, Vec<u64>)> =
                    EXPERT_MATRICES.iter().zip(&shapes).map(|(w, s)| (*w, stored(s), s.clone())).collect();
                layouts.push(ExpertLayout::build(opts.alignment, &mats).map_err(ConvertError::Unsupported)?);
                keys.push(key);
                keys.len() - 1
            }
        };
        layers.push(LayerPlan { layer, kind, shapes, layout: id as u16, target });
    }
    Ok((layouts, layers))
}

/// FP8 checkpoints' `quantization_config.weight_block_size` (128 when absent); square only.
fn fp8_block(path: &std::path::Path, config: &[u8]) -> Result<u32, ConvertError> {
    let v: serde_json::Value = serde_json::from_slice(config)
        .map_err(|e| ConvertError::Source { path: path.to_path_buf(), reason: e.to_string() })?;
    let Some(sizes) = v.pointer("/quantization_config/weight_block_size").and_then(|b| b.as_array()) else {
        return Ok(128);
    };
    match sizes.iter().map(serde_json::Value::as_u64).collect::<Option<Vec<u64>>>().as_deref() {
        Some([a, b]) if a == b && *a > 0 && *a <= u64::from(u32::MAX) => Ok(*a as u32),
        _ => Err(ConvertError::Unsupported(format!(
            "{}: quantization_config.weight_block_size {sizes:?}: only square FP8 blocks are supported",
            path.display()
        ))),
    }
}

/// What one source tensor name means.
enum Role {
    Expert {
        layer: u32,
        expert: u32,
    },
    Trunk,
    /// Read with the tensor it scales (an FP8 trunk matrix's `weight_scale_inv`).
    Companion,
    Ignored,
}

/// `layers`: the model's own; DeepSeek-V3's multi-token-prediction layers come after them and are
/// not part of the model k3 runs.
fn role(name: &str, layers: u32, vision: bool) -> Role {
    if vision && (name.starts_with("vision_tower.") || name.starts_with("mm_projector.")) {
        Role::Trunk
    } else if k3_engine::names::layer_of(name).is_some_and(|l| l >= layers) {
        Role::Ignored
    } else if let Some((layer, expert)) = k3_engine::names::parse_expert(name) {
        Role::Expert { layer, expert }
    } else if name.ends_with(".weight_scale_inv") {
        Role::Companion
    } else if name.starts_with("model.") || name.starts_with("lm_head.") {
        Role::Trunk
    } else {
        Role::Ignored
    }
}

/// How a layer's experts are stored in the checkpoint, and their logical shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SourceExperts {
    Mxfp4,
    Bf16,
    F32,
    /// FP8 e4m3 with square blocks of f32 `weight_scale_inv`.
    Fp8 {
        block: u32,
    },
    /// compressed-tensors INT4 in groups along a row.
    Int4 {
        group: u32,
    },
}

/// How a layer's experts are stored, and their logical shapes (from the config, so a misshaped
/// tensor is named itself rather than blamed on its neighbour).
fn expert_shapes(
    src: &Source,
    layer: u32,
    shapes: &ExpertShapes,
    fp8_block: u32,
) -> Result<(SourceExperts, Vec<Vec<u64>>), ConvertError> {
    let first = expert_name(layer, 0, "w1");
    let kind = if let Ok(t) = src.get(&format!("{first}.weight_packed")) {
        if t.dtype == StDtype::I32 {
            // compressed-tensors INT4: the group size from the scales' shape.
            let scale = src.get(&format!("{first}.weight_scale"))?;
            let k = shapes.w1[1];
            let group = k / scale.shape.get(1).copied().unwrap_or(0).max(1);
            if group == 0 || !k.is_multiple_of(group) || !k.is_multiple_of(8) {
                return Err(ConvertError::Unsupported(format!(
                    "`{first}.weight_scale` is {:?}: not INT4 groups of a {k}-column row",
                    scale.shape
                )));
            }
            SourceExperts::Int4 { group: group as u32 }
        } else {
            SourceExperts::Mxfp4
        }
    } else if let Ok(t) = src.get(&format!("{first}.weight")) {
        match t.dtype {
            StDtype::BF16 => SourceExperts::Bf16,
            StDtype::F32 => SourceExperts::F32,
            StDtype::F8_E4M3 => SourceExperts::Fp8 { block: fp8_block },
            other => {
                return Err(ConvertError::Unsupported(format!(
                    "`{first}.weight` is {other:?}; routed experts must be BF16, F32, FP8 e4m3 (block-scaled), \
                     MXFP4 or INT4 (compressed-tensors)"
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
pub(super) fn expert_sources(kind: SourceExperts, base: &str, shape: &[u64]) -> Vec<(String, StDtype, Vec<u64>)> {
    match kind {
        SourceExperts::Mxfp4 => vec![
            (format!("{base}.weight_packed"), StDtype::U8, vec![shape[0], shape[1] / 2]),
            (format!("{base}.weight_scale"), StDtype::U8, vec![shape[0], shape[1] / 32]),
        ],
        SourceExperts::Bf16 => vec![(format!("{base}.weight"), StDtype::BF16, shape.to_vec())],
        SourceExperts::F32 => vec![(format!("{base}.weight"), StDtype::F32, shape.to_vec())],
        SourceExperts::Fp8 { block } => {
            let b = u64::from(block);
            vec![
                (format!("{base}.weight"), StDtype::F8_E4M3, shape.to_vec()),
                (format!("{base}.weight_scale_inv"), StDtype::F32, vec![shape[0].div_ceil(b), shape[1].div_ceil(b)]),
            ]
        }
        SourceExperts::Int4 { group } => vec![
            (format!("{base}.weight_packed"), StDtype::I32, vec![shape[0], shape[1] / 8]),
            (format!("{base}.weight_scale"), StDtype::BF16, vec![shape[0], shape[1] / u64::from(group)]),
        ],
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
pub(super) fn expert_parts<'a>(
    src: &'a Source,
    kind: SourceExperts,
    base: &str,
    shape: &[u64],
) -> Result<Vec<&'a [u8]>, ConvertError> {
    expert_sources(kind, base, shape).iter().map(|(name, dtype, shape)| src.expect(name, *dtype, shape)).collect()
}
