//! Writing a planned conversion: the trunk tensor by tensor, then the experts record by record
//! (re-encoded on every core a few at a time), the embedded files, and a full verification.

use std::sync::Arc;

use k3_format::{Model, ModelWriter, OpenOptions};

use k3_quant::encode::products;
use rayon::prelude::*;
use safetensors::Dtype as StDtype;

use super::in_place::{self, InPlace};
use super::plan::{LayerPlan, Plan, SourceExperts, expert_parts};
use super::{ConvertError, ConvertOptions, ConvertReport, Progress, Source, TrunkFormat, Unit};
use super::{dequant, encode};
use crate::calibrate::{Calibration, CalibrationPlan, Walker};
use crate::tensors::Storage;
use k3_engine::names::{EXPERT_MATRICES, expert as expert_name};

/// Every trunk tensor the writer does not have yet, encoded as `trunk` asks.
pub(super) fn trunk(
    w: &mut ModelWriter,
    plan: &Plan,
    src: &Source,
    trunk: TrunkFormat,
    report: &mut ConvertReport,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ConvertError> {
    // Trunk and experts have their own totals: trunk bytes go by fast, experts (re-encoded,
    // perhaps) slowly, and one bar over both would promise an ETA the experts never keep.
    let total: u64 = plan.trunk_names.iter().map(|n| src.get(n).map_or(0, |t| src.bytes(t).len() as u64)).sum();
    let resumed: u64 = plan
        .trunk_names
        .iter()
        .filter(|n| w.has_tensor(n))
        .map(|n| src.get(n).map_or(0, |t| src.bytes(t).len() as u64))
        .sum();
    let mut done = 0u64;
    for name in &plan.trunk_names {
        let t = src.get(name)?;
        let bytes = src.bytes(t);
        if !w.has_tensor(name) {
            let storage = plan.table.get(name).map_or(Storage::Exact, |e| e.storage);
            let (enc, parts) = if t.dtype == StDtype::F8_E4M3 {
                fp8_trunk(src, name, &t.shape, bytes, plan.fp8_block, trunk, storage)?
            } else {
                encode::trunk(name, t.dtype, &t.shape, bytes, trunk, storage)?
            };
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            w.write_tensor(name, enc, &t.shape, &refs)?;
            report.written_items += 1;
            // What was written (an int8 / int4 trunk is smaller than its source).
            report.written_bytes += refs.iter().map(|p| p.len() as u64).sum::<u64>();
        }
        done += bytes.len() as u64;
        progress(Progress { phase: "trunk", done, total, resumed, unit: Unit::Bytes });
    }
    Ok(())
}

/// An FP8 trunk tensor: kept as stored (bytes and block scales) where k3 multiplies it, else
/// widened exactly to f32 through its `weight_scale_inv` and encoded as `trunk` asks.
fn fp8_trunk(
    src: &Source,
    name: &str,
    shape: &[u64],
    bytes: &[u8],
    block: u32,
    trunk: TrunkFormat,
    storage: Storage,
) -> Result<(k3_format::Encoding, Vec<Vec<u8>>), ConvertError> {
    let [rows, cols] = shape else {
        return Err(ConvertError::Unsupported(format!("`{name}` is FP8 but not a matrix: {shape:?}")));
    };
    let b = u64::from(block);
    let scale_name = format!("{}_scale_inv", name);
    let scale = src.expect(&scale_name, StDtype::F32, &[rows.div_ceil(b), cols.div_ceil(b)])?;
    if encode::keeps_fp8(trunk, storage) {
        dequant::check_fp8(name, bytes, scale)?;
        return Ok((encode::fp8_encoding(block), vec![bytes.to_vec(), scale.to_vec()]));
    }
    let f = dequant::fp8_blocks(bytes, scale, *rows as usize, *cols as usize, block as usize);
    let f: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
    // Widening is exact: "as stored" becomes f32 for what k3 cannot multiply as FP8.
    encode::trunk(name, StDtype::F32, shape, &f, encode::widened_fp8(trunk), storage)
}

/// Every expert record the writer does not have yet, in (layer, expert) order; with a
/// calibration plan, each MoE layer's experts weighted by the inputs the source model's walk
/// gives that layer (held only while the layer is encoded).
pub(super) fn experts(
    w: &mut ModelWriter,
    plan: &Plan,
    src: &Source,
    calibration: Option<&CalibrationPlan>,
    report: &mut ConvertReport,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ConvertError> {
    let record_bytes: Vec<u64> = w.spec().expert_layouts.iter().map(|l| l.record_bytes).collect();
    let experts = plan.arch.experts;
    let total: u64 = plan.layers.iter().map(|p| record_bytes[usize::from(p.layout)] * u64::from(experts)).sum();
    let resumed: u64 = plan
        .layers
        .iter()
        .map(|p| {
            record_bytes[usize::from(p.layout)] * (0..experts).filter(|e| w.has_expert(p.layer, *e)).count() as u64
        })
        .sum();
    let source = match calibration {
        Some(c) if resumed < total => Some((Model::open(&c.source)?, c)),
        _ => None,
    };
    let mut walker = match &source {
        Some((model, c)) => Some(Walker::new(model, c).map_err(|e| ConvertError::Calibration(Box::new(e)))?),
        None => None,
    };
    report.calibration_peak = walker.as_ref().map(Walker::peak);
    let mut done = 0u64;
    for (at, p) in plan.layers.iter().enumerate() {
        let rb = record_bytes[usize::from(p.layout)];
        let todo: Vec<u32> = (0..experts).filter(|e| !w.has_expert(p.layer, *e)).collect();
        done += rb * u64::from(experts - todo.len() as u32);
        if todo.is_empty() {
            continue;
        }
        if walker.is_some() {
            let (done, total) = (at as u64 + 1, plan.layers.len() as u64);
            progress(Progress { phase: "calibrate", done, total, resumed: 0, unit: Unit::Layers });
        }
        let layer_cal = match (walker.as_mut(), p.target) {
            (Some(walker), Some(encode::ExpertTarget::Vq(_))) => {
                Some(walker.layer(p.layer).map_err(|e| ConvertError::Calibration(Box::new(e)))?)
            }
            _ => None,
        };
        report.calibrated.extend(layer_cal.as_ref().map(Calibration::report));
        // Re-encoding runs on every core, a few experts at a time (bounded memory); records are
        // still written in (layer, expert) order.
        let batch = if p.target.is_some() { rayon::current_num_threads().max(1) * 2 } else { 1 };
        for chunk in todo.chunks(batch) {
            let encoded: Vec<Result<Vec<Vec<u8>>, ConvertError>> =
                chunk.par_iter().map(|&expert| record(src, plan, p, expert, layer_cal.as_ref())).collect();
            for (&expert, parts) in chunk.iter().zip(encoded) {
                let parts = parts?;
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                w.write_expert(p.layer, expert, p.layout, &refs)?;
                report.written_items += 1;
                report.written_bytes += rb;
                done += rb;
                progress(Progress { phase: "experts", done, total, resumed, unit: Unit::Bytes });
            }
        }
    }
    Ok(())
}

/// Every expert the writer does not have yet, read in place: its aligned read in its checkpoint
/// file checksummed (a few experts at a time on every core), FP8 scales checked as a copy would;
/// an expert that cannot be read in place copied as stored into the model's shard.
pub(super) fn experts_in_place(
    w: &mut ModelWriter,
    plan: &Plan,
    ip: &InPlace,
    src: &Source,
    report: &mut ConvertReport,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ConvertError> {
    // Progress counts the experts' bytes read: a run, or a copied record.
    let bytes = |p: &LayerPlan, r: &Option<in_place::Run>| match r {
        Some(r) => ip.layout(r).payload_bytes,
        None => plan.layouts[usize::from(p.layout)].record_bytes,
    };
    let (mut total, mut resumed) = (0, 0);
    for (p, runs) in plan.layers.iter().zip(&ip.runs) {
        for (e, r) in runs.iter().enumerate() {
            total += bytes(p, r);
            resumed += if w.has_expert(p.layer, e as u32) { bytes(p, r) } else { 0 };
        }
    }
    let mut done = resumed;
    for (p, runs) in plan.layers.iter().zip(&ip.runs) {
        let todo: Vec<u32> = (0..plan.arch.experts).filter(|e| !w.has_expert(p.layer, *e)).collect();
        for chunk in todo.chunks(rayon::current_num_threads().max(1) * 4) {
            let got: Vec<Result<Placed, ConvertError>> = chunk
                .par_iter()
                .map(|&e| match &runs[e as usize] {
                    Some(r) => {
                        if let SourceExperts::Fp8 { .. } = p.kind {
                            check_fp8_expert(src, p, e)?;
                        }
                        let file = src.file_at(ip.sources[usize::from(r.file)]).1;
                        Ok(Placed::InPlace(*r, in_place::read(file, r.start, ip.layout(r))))
                    }
                    None => record(src, plan, p, e, None).map(Placed::Copied),
                })
                .collect();
            for (&e, got) in chunk.iter().zip(got) {
                let r = &runs[e as usize];
                match got? {
                    Placed::InPlace(r, read) => {
                        let (layer, layout) = (p.layer, ip.layout_id(&r));
                        w.expert_in_place((layer, e), layout, r.file, read.offset, read.length, read.phase, read.xxh3)?
                    }
                    Placed::Copied(parts) => {
                        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                        w.write_expert(p.layer, e, p.layout, &refs)?;
                        report.written_bytes += bytes(p, r);
                    }
                }
                report.written_items += 1;
                done += bytes(p, r);
                progress(Progress { phase: "experts", done, total, resumed, unit: Unit::Bytes });
            }
        }
    }
    Ok(())
}

/// An expert as the conversion leaves it.
enum Placed {
    InPlace(in_place::Run, in_place::Read),
    Copied(Vec<Vec<u8>>),
}

/// An FP8 expert's blocks and scales checked as a copy checks them.
fn check_fp8_expert(src: &Source, p: &LayerPlan, expert: u32) -> Result<(), ConvertError> {
    for (m, shape) in EXPERT_MATRICES.iter().zip(&p.shapes) {
        let base = expert_name(p.layer, expert, m);
        let raw = expert_parts(src, p.kind, &base, shape)?;
        dequant::check_fp8(&format!("{base}.weight"), raw[0], raw[1])?;
    }
    Ok(())
}

/// One expert's record parts: its matrices as stored, or re-encoded to the layer's target (VQ
/// weighted by the inputs calibration saw: the expert's own for w1 and w3, their activations
/// through the source weights for w2).
fn record(
    src: &Source,
    plan: &Plan,
    p: &LayerPlan,
    expert: u32,
    calibration: Option<&Calibration>,
) -> Result<Vec<Vec<u8>>, ConvertError> {
    let mut parts = Vec::with_capacity(9);
    let Some(t) = p.target else {
        for (m, shape) in EXPERT_MATRICES.iter().zip(&p.shapes) {
            let base = expert_name(p.layer, expert, m);
            let raw = expert_parts(src, p.kind, &base, shape)?;
            match p.kind {
                // The packed words are k3's int4 bytes as they are; the scales become f16.
                SourceExperts::Int4 { .. } => {
                    parts.push(raw[0].to_vec());
                    parts.push(dequant::bf16_scales_to_f16(&format!("{base}.weight_scale"), raw[1])?);
                }
                SourceExperts::Fp8 { .. } => {
                    dequant::check_fp8(&format!("{base}.weight"), raw[0], raw[1])?;
                    parts.extend(raw.iter().map(|b| b.to_vec()));
                }
                _ => parts.extend(raw.iter().map(|b| b.to_vec())),
            }
        }
        return Ok(parts);
    };
    let mut mats = Vec::with_capacity(3);
    for (m, shape) in EXPERT_MATRICES.iter().zip(&p.shapes) {
        let base = expert_name(p.layer, expert, m);
        let raw = expert_parts(src, p.kind, &base, shape)?;
        let (rows, cols) = (shape[0] as usize, shape[1] as usize);
        let f = match p.kind {
            SourceExperts::Mxfp4 => encode::mxfp4_to_f32(raw[0], raw[1], rows, cols),
            SourceExperts::Bf16 => encode::to_f32(&base, StDtype::BF16, raw[0])?,
            SourceExperts::F32 => encode::to_f32(&base, StDtype::F32, raw[0])?,
            SourceExperts::Fp8 { block } => dequant::fp8_blocks(raw[0], raw[1], rows, cols, block as usize),
            SourceExperts::Int4 { group } => dequant::int4_groups(raw[0], raw[1], rows, cols, group as usize),
        };
        mats.push((base, rows, cols, f));
    }
    let inputs = match (t, calibration) {
        (encode::ExpertTarget::Vq(_), Some(c)) => expert_inputs(c, plan, p, expert, &mats)?,
        _ => None,
    };
    for (i, (base, rows, cols, f)) in mats.into_iter().enumerate() {
        // w1 and w3 see the expert's input, w2 the activation.
        let calib = inputs.as_ref().map(|c| if EXPERT_MATRICES[i] == "w2" { &c.activation } else { &c.input });
        let (enc, encoded) = encode::expert(&base, f, rows, cols, t, calib)?;
        if enc != encode::planned(t, cols) {
            return Err(ConvertError::Unsupported(format!(
                "{base}: encoder produced {} not the planned layout",
                enc.label()
            )));
        }
        parts.extend(encoded);
    }
    Ok(parts)
}

/// One expert's calibration, prepared for encoding: what w1 and w3 read, and what w2 reads.
struct ExpertCalibration {
    input: Arc<k3_quant::encode::Calibration>,
    activation: Arc<k3_quant::encode::Calibration>,
}

/// The calibration inputs of one expert's matrices, prepared for encoding: `g x` for w1 and w3,
/// and `g act(w1 x, w3 x)` for w2, from the source weights `mats` (w1, w2, w3), where `g` is the
/// routing weight the expert's output was mixed in with: the second moments the encoder weighs
/// errors by are then `E[g^2 x x^T]`, the error's cost where it lands (in the residual stream).
fn expert_inputs(
    c: &Calibration,
    plan: &Plan,
    p: &LayerPlan,
    expert: u32,
    mats: &[(String, usize, usize, Vec<f32>)],
) -> Result<Option<ExpertCalibration>, ConvertError> {
    let Some(sample) = c.inputs(expert) else { return Ok(None) };
    let (w1, w3) = (&mats[0], &mats[2]);
    if sample.dim != w1.2 {
        return Err(ConvertError::Unsupported(format!(
            "calibration inputs of layer {} are {}-wide, but `{}` takes {}: calibrated on another model?",
            p.layer, sample.dim, w1.0, w1.2
        )));
    }
    let (inter, n) = (w1.1, sample.len());
    // Every input through w1 and w3 at once (`products`: a matrix-vector product per input was a
    // fifth of a K3-shaped proxy's calibrated conversion).
    let (g, u) = (products(&sample.vectors, &w1.3, w1.2), products(&sample.vectors, &w3.3, w3.2));
    let mut h = Vec::with_capacity(n * inter);
    for ((g, u), gate) in g.chunks_exact(inter).zip(u.chunks_exact(inter)).zip(&sample.gates) {
        h.extend(g.iter().zip(u).map(|(g, u)| gate * k3_engine::activate(plan.activation, *g, *u)));
    }
    let xs: Vec<f32> = sample
        .vectors
        .chunks_exact(sample.dim)
        .zip(&sample.gates)
        .flat_map(|(x, g)| x.iter().map(move |v| g * v))
        .collect();
    // Prepared once each: w1 and w3 share their inputs' (costly) second-moment factor.
    let (w2_name, w2_cols) = (&mats[1].0, mats[1].2);
    Ok(Some(ExpertCalibration {
        input: encode::vq_calibration(&w1.0, &xs, w1.2)?,
        activation: encode::vq_calibration(w2_name, &h, w2_cols)?,
    }))
}

/// The written model, opened with its shard directories.
pub(super) fn open(opts: &ConvertOptions) -> Result<Model, ConvertError> {
    Ok(Model::open_with(&opts.out_dir, &OpenOptions { shard_dirs: opts.shard_dirs.clone() })?)
}

/// Embeds the checkpoint's config and tokenizer files, seals the model, then reads every byte
/// it wrote back against its checksum (experts read in place were checksummed in the checkpoint
/// moments ago and are not read again). Returns the model, verified.
pub(super) fn finish(
    w: ModelWriter,
    src: &Source,
    opts: &ConvertOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Model, ConvertError> {
    let mut blobs = Vec::new();
    for name in super::plan::EMBEDDED_FILES {
        if let Some(bytes) = src.file(name)? {
            blobs.push((name, bytes));
        }
    }
    let blob_refs: Vec<(&str, &[u8])> = blobs.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    w.finish(&blob_refs)?;

    let model = open(opts)?;
    let total = model.verify_bytes_of(false);
    let problems = model.verify_of(false, &mut |done| {
        progress(Progress { phase: "verify", done, total, resumed: 0, unit: Unit::Bytes })
    });
    if let Some(first) = problems.first() {
        return Err(ConvertError::Verify { count: problems.len(), first: first.error.to_string() });
    }
    Ok(model)
}
