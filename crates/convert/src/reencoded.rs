//! What a conversion stored in another encoding than the checkpoint's own, and why, grouped for
//! `convert`'s summary: read from the written model's manifest, so a resumed or already complete
//! conversion reports the same as one run straight through.

use k3_format::{Encoding, Model};
use safetensors::Dtype as StDtype;

use super::plan::{Plan, SourceExperts};
use super::{ConvertOptions, Source, TrunkFormat};

/// Tensors re-encoded alike: from what, to what, why, how many, one of them by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReEncoded {
    pub from: String,
    pub to: String,
    pub why: String,
    pub count: usize,
    pub example: String,
}

/// Every re-encoding in `model` (written from `src` under `opts`), grouped by (from, to, why) in
/// the order first met.
pub(crate) fn list(model: &Model, plan: &Plan, src: &Source, opts: &ConvertOptions) -> Vec<ReEncoded> {
    let mut out: Vec<ReEncoded> = Vec::new();
    let mut add = |from: &str, to: String, why: String, name: &str, count: usize| match out
        .iter_mut()
        .find(|r| r.from == from && r.to == to && r.why == why)
    {
        Some(r) => r.count += count,
        None => out.push(ReEncoded { from: from.into(), to, why, count, example: name.into() }),
    };
    for t in &model.manifest().trunk.tensors {
        let e = &t.tensor;
        let Ok(s) = src.get(&e.name) else { continue };
        let from = dtype_name(s.dtype);
        if same(s.dtype, &e.encoding) {
            continue;
        }
        let why = match (opts.trunk, &e.encoding) {
            (TrunkFormat::Int4, Encoding::Int8Row) if super::encode::int4_trunk_keeps_int8(&e.name) => {
                "--trunk int4: the output matrix and the embedding table keep 8 bits".into()
            }
            (TrunkFormat::Int4, Encoding::Int8Row) => "--trunk int4: its rows do not split into groups of 32".into(),
            (TrunkFormat::Keep, Encoding::F32) if s.dtype == StDtype::F8_E4M3 => {
                "FP8 is run as a matrix only: an embedding table or exact tensor is widened to f32 (exact)".into()
            }
            (fmt, _) => format!("--trunk {}", fmt.name()),
        };
        add(from, e.encoding.label(), why, &e.name, 1);
    }
    for p in &plan.layers {
        if p.target.is_none() {
            continue;
        }
        let Some(layout) = model.manifest().expert_layouts.get(usize::from(p.layout)) else { continue };
        for m in &layout.matrices {
            let name = k3_engine::names::expert(p.layer, 0, &m.name);
            add(
                kind_name(p.kind),
                m.encoding.label(),
                format!("--experts {}", opts.experts.name()),
                &name,
                plan.arch.experts as usize,
            );
        }
    }
    out
}

/// Whether a stored encoding is the checkpoint's own dtype.
fn same(dtype: StDtype, enc: &Encoding) -> bool {
    matches!(
        (dtype, enc),
        (StDtype::F32, Encoding::F32)
            | (StDtype::BF16, Encoding::Bf16)
            | (StDtype::F16, Encoding::F16)
            | (StDtype::U8, Encoding::U8)
            | (StDtype::F8_E4M3, Encoding::Fp8Block { .. })
    )
}

fn dtype_name(d: StDtype) -> &'static str {
    match d {
        StDtype::F32 => "f32",
        StDtype::BF16 => "bf16",
        StDtype::F16 => "f16",
        StDtype::U8 => "u8",
        StDtype::F8_E4M3 => "fp8",
        _ => "other",
    }
}

fn kind_name(k: SourceExperts) -> &'static str {
    match k {
        SourceExperts::Mxfp4 => "mxfp4",
        SourceExperts::Bf16 => "bf16",
        SourceExperts::F32 => "f32",
        SourceExperts::Fp8 { .. } => "fp8",
        SourceExperts::Int4 { .. } => "int4",
    }
}
