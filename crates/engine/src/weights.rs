//! WASTE tensors as the kernels want them: `Matrix` views and small f32 vectors.

use half::bf16;
use k3_format::{Encoding, Model, TensorView};
use k3_quant::{Activations, Matrix};

use crate::EngineError;

fn dims2(name: &str, t: &TensorView<'_>) -> Result<(usize, usize), EngineError> {
    match t.shape {
        [r, c] => Ok((*r as usize, *c as usize)),
        // A [1, D] row or [D] vector used as a matrix of one row.
        [c] => Ok((1, *c as usize)),
        s => Err(EngineError::Shape(format!("tensor `{name}` has shape {s:?}, expected a matrix"))),
    }
}

/// A trunk tensor as a matrix, in whatever encoding it is stored.
pub fn matrix<'m>(m: &'m Model, name: &str) -> Result<Matrix<'m>, EngineError> {
    let t = m.tensor(name)?;
    view_matrix(name, &t)
}

/// Views start exact; the engine applies its activation precision (`Matrix::with_activations`).
const EXACT: Activations = Activations::Exact;

/// A tensor view (trunk or expert record) as a matrix.
pub(crate) fn view_matrix<'m>(name: &str, t: &TensorView<'m>) -> Result<Matrix<'m>, EngineError> {
    let (rows, cols) = dims2(name, t)?;
    Ok(match t.encoding {
        Encoding::F32 => Matrix::F32 { w: t.typed::<f32>("data")?, rows, cols },
        Encoding::Bf16 => Matrix::Bf16 { w: t.typed::<bf16>("data")?, rows, cols, act: Activations::Exact },
        Encoding::Int8Row => {
            Matrix::Int8Row { q: t.typed::<i8>("q")?, scale: t.typed::<f32>("scale")?, rows, cols, act: EXACT }
        }
        Encoding::Int4Group { group } => Matrix::Int4Group {
            q: t.typed::<u8>("q")?,
            scale: t.typed::<half::f16>("scale")?,
            group: *group as usize,
            rows,
            cols,
            act: EXACT,
        },
        Encoding::Int2Group { group } => Matrix::Int2Group {
            q: t.typed::<u8>("q")?,
            scale: t.typed::<half::f16>("scale")?,
            group: *group as usize,
            rows,
            cols,
        },
        Encoding::Mxfp4 => {
            Matrix::Mxfp4 { packed: t.typed::<u8>("packed")?, scale: t.typed::<u8>("scale")?, rows, cols, act: EXACT }
        }
        Encoding::Fp8Block { block_rows, block_cols } => Matrix::Fp8(
            k3_quant::fp8::Fp8Ref::new(
                t.typed::<u8>("q")?,
                t.typed::<f32>("scale")?,
                rows,
                cols,
                *block_rows as usize,
                *block_cols as usize,
            )
            .map_err(|e| EngineError::Shape(format!("tensor `{name}`: {e}")))?,
        ),
        other => {
            return Err(EngineError::Shape(format!(
                "tensor `{name}` is stored as {}, which k3 cannot multiply yet",
                other.label()
            )));
        }
    })
}

/// The input rotations of the VQ-encoded matrices of a model, built once: `(cols, block, seed)`.
#[derive(Debug, Default)]
pub struct Rotations(std::collections::HashMap<(usize, usize, u64), k3_quant::vq::Rotation>);

impl Rotations {
    /// Every rotation the model's expert layouts use.
    pub fn for_model(m: &Model) -> Self {
        let mut r = Rotations::default();
        for l in &m.manifest().expert_layouts {
            for t in &l.matrices {
                if let (Encoding::Vq { rotation_block, rotation_seed, .. }, [_, cols]) =
                    (&t.encoding, t.shape.as_slice())
                {
                    let key = (*cols as usize, *rotation_block as usize, *rotation_seed);
                    if key.1 > 1 && key.0.is_multiple_of(key.1) && key.1.is_power_of_two() {
                        r.0.entry(key).or_insert_with(|| k3_quant::vq::Rotation::new(key.0, key.1, key.2));
                    }
                }
            }
        }
        r
    }
}

/// An expert-record matrix as a `Matrix`, VQ encodings included (their rotation from `rot`).
pub fn expert_matrix<'a>(name: &str, t: &TensorView<'a>, rot: &'a Rotations) -> Result<Matrix<'a>, EngineError> {
    let Encoding::Vq { rotation_block, rotation_seed, codebook, .. } = t.encoding else {
        return view_matrix(name, t);
    };
    let (rows, cols) = dims2(name, t)?;
    let codec = codec_of(t.encoding).ok_or_else(|| {
        EngineError::Shape(format!("matrix `{name}` uses a VQ layout k3 has no kernel for ({})", t.encoding.label()))
    })?;
    if *codebook != k3_format::CodebookSource::Inline {
        return Err(EngineError::Shape(format!("matrix `{name}`: shared codebooks are not supported yet")));
    }
    let rotation = if *rotation_block > 1 {
        Some(rot.0.get(&(cols, *rotation_block as usize, *rotation_seed)).ok_or_else(|| {
            EngineError::Shape(format!("matrix `{name}`: rotation block {rotation_block} does not fit {cols} columns"))
        })?)
    } else {
        None
    };
    Ok(Matrix::Vq(k3_quant::vq::VqRef {
        codec,
        rows,
        cols,
        codes: t.typed::<u8>("codes")?,
        scale: t.typed::<half::f16>("scale")?,
        codebooks: t.typed::<f32>("codebooks")?,
        rotation,
    }))
}

/// A small tensor (norm weights, biases, conv taps) as f32 values, from f32 or bf16 storage.
pub fn vector(m: &Model, name: &str) -> Result<(Vec<f32>, Vec<u64>), EngineError> {
    let t = m.tensor(name)?;
    let v = match t.encoding {
        Encoding::F32 => t.typed::<f32>("data")?.to_vec(),
        Encoding::Bf16 => t.typed::<bf16>("data")?.iter().map(|x| x.to_f32()).collect(),
        Encoding::F16 => t.typed::<half::f16>("data")?.iter().map(|x| x.to_f32()).collect(),
        other => {
            return Err(EngineError::Shape(format!(
                "tensor `{name}` is stored as {}, expected f32 or bf16",
                other.label()
            )));
        }
    };
    Ok((v, t.shape.to_vec()))
}

/// A vector that must have `len` values.
pub(crate) fn vector_of(m: &Model, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
    let (v, shape) = vector(m, name)?;
    if v.len() != len {
        return Err(EngineError::Shape(format!("tensor `{name}` has shape {shape:?}, expected {len} values")));
    }
    Ok(v)
}

/// The codec a stored VQ encoding describes (the runtime reads it; conversion writes it).
pub(crate) fn codec_of(enc: &Encoding) -> Option<k3_quant::vq::Codec> {
    match enc {
        Encoding::Vq { stages: 3, entries: 16, dim: 4, interleave: 32, .. } => Some(k3_quant::vq::Codec::FastScan),
        Encoding::Vq { stages: 3, entries: 256, dim: 8, interleave: 1, .. } => Some(k3_quant::vq::Codec::Residual),
        _ => None,
    }
}
