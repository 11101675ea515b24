//! Re-encoding tensors at conversion: source bytes (BF16, F32, MXFP4) to f32 values, and f32
//! values to the chosen stored encoding (f32, bf16, int8-row, int4-group, MXFP4, VQ).

use half::{bf16, f16};
use k3_format::{CodebookSource, Encoding};
use std::sync::Arc;

use k3_quant::encode::EncodeOptions;
use k3_quant::rtn::Scale;
use k3_quant::vq::{self, Codec};
use k3_quant::{int4, int8, mxfp4};
use safetensors::Dtype as StDtype;

use super::ConvertError;
use crate::tensors::Storage;
use k3_engine::names::{EMBED, LM_HEAD};

/// Group size of the int4 trunk encoding.
pub const INT4_GROUP: usize = 32;

/// How trunk tensors are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrunkFormat {
    /// As the checkpoint stores them.
    Keep,
    F32,
    Bf16,
    /// Matrices int8 per row, the rest as stored.
    Int8,
    /// Matrices int4 in groups of 32, the rest as stored.
    Int4,
}

impl TrunkFormat {
    pub fn name(self) -> &'static str {
        match self {
            TrunkFormat::Keep => "keep",
            TrunkFormat::F32 => "f32",
            TrunkFormat::Bf16 => "bf16",
            TrunkFormat::Int8 => "int8",
            TrunkFormat::Int4 => "int4",
        }
    }
}

/// The tensors a 4-bit trunk keeps at 8 bits (int8 rows): the output matrix and the embedding
/// table. Q4_K_M keeps the output at 6 bits; on the default model an int4 output matrix cost 30%
/// of the trunk's KL for 8% of its bytes, and int4 rows (symmetric, one scale per 32) lose a
/// trained table's range, 2.7e-3 nats more (docs/EFFICIENCY.md, "A 4-bit trunk").
pub fn int4_trunk_keeps_int8(name: &str) -> bool {
    name == LM_HEAD || name == EMBED
}

/// Whether an FP8 trunk tensor is stored as FP8: as stored (`keep`, and int8 / int4, which keep
/// what they do not quantize) where k3 multiplies it, a projection or MLA's `kv_b_proj`. The
/// embedding table and exact tensors are widened to f32 instead (exact); `f32` / `bf16` widen
/// everything.
pub fn keeps_fp8(fmt: TrunkFormat, storage: Storage) -> bool {
    matches!(
        (fmt, storage),
        (TrunkFormat::Keep, Storage::Matrix | Storage::Dense) | (TrunkFormat::Int8 | TrunkFormat::Int4, Storage::Dense)
    )
}

/// The trunk encoding an FP8 tensor that is not kept as FP8 gets: widened, "as stored" is f32.
pub fn widened_fp8(fmt: TrunkFormat) -> TrunkFormat {
    if fmt == TrunkFormat::Keep { TrunkFormat::F32 } else { fmt }
}

/// FP8 with a checkpoint's square blocks.
pub fn fp8_encoding(block: u32) -> Encoding {
    Encoding::Fp8Block { block_rows: block, block_cols: block }
}

/// Little-endian f32 values of a BF16, F16 or F32 tensor.
pub fn to_f32(name: &str, dtype: StDtype, bytes: &[u8]) -> Result<Vec<f32>, ConvertError> {
    Ok(match dtype {
        StDtype::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(),
        StDtype::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        StDtype::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => {
            return Err(ConvertError::Unsupported(format!(
                "tensor `{name}` is {other:?}; only f32/bf16/f16 can be re-encoded"
            )));
        }
    })
}

/// The f32 weights of an MXFP4 matrix.
pub fn mxfp4_to_f32(packed: &[u8], scale: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
        mxfp4::decode_row(&packed[r * cols / 2..][..cols / 2], &scale[r * cols / 32..][..cols / 32], o);
    }
    out
}

fn le<T: Copy>(v: &[T], f: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    v.iter().flat_map(|x| f(*x)).collect()
}

/// The encoding a trunk tensor is stored in under `fmt`, as its `storage` allows
/// (`crate::tensors::Storage`; `docs/FORMAT.md` §4.3): exact tensors keep their source encoding
/// (or widen to f32, which is exact), the embedding table and `kv_b_proj` stay f32 or bf16,
/// projection matrices take the requested encoding. Decided from the header alone, so a
/// conversion knows what it will write before it reads a weight.
pub fn trunk_encoding(
    name: &str,
    dtype: StDtype,
    shape: &[u64],
    fmt: TrunkFormat,
    storage: Storage,
) -> Result<Encoding, ConvertError> {
    let kept = || match dtype {
        StDtype::F32 => Ok(Encoding::F32),
        StDtype::BF16 => Ok(Encoding::Bf16),
        StDtype::F16 => Ok(Encoding::F16),
        StDtype::U8 => Ok(Encoding::U8),
        other => {
            Err(ConvertError::Unsupported(format!("tensor `{name}` has dtype {other:?}, which k3 does not store")))
        }
    };
    let cols = shape.get(1).copied().unwrap_or(0) as usize;
    Ok(match (fmt, storage) {
        (TrunkFormat::Keep, _) => kept()?,
        (TrunkFormat::F32, _) => Encoding::F32,
        (_, Storage::Exact) => kept()?,
        (TrunkFormat::Bf16, _) => Encoding::Bf16,
        (_, Storage::Dense) => kept()?,
        // The embedding table is quantized as the matrices are (as llama.cpp's Q8_0 and Q4_K
        // files store theirs): it is most of a small model's bytes, and a lookup reads one row.
        (TrunkFormat::Int8, Storage::Matrix | Storage::Table) => Encoding::Int8Row,
        // Another table (none of the families has one) takes int8 rows too, as under an int8
        // trunk; so does a matrix whose rows do not split into int4 groups.
        (TrunkFormat::Int4, Storage::Matrix) if !int4_trunk_keeps_int8(name) && cols.is_multiple_of(INT4_GROUP) => {
            Encoding::Int4Group { group: INT4_GROUP as u32 }
        }
        (TrunkFormat::Int4, Storage::Matrix | Storage::Table) => Encoding::Int8Row,
    })
}

/// The stored encoding and parts of a trunk tensor under `fmt` ([`trunk_encoding`]).
pub fn trunk(
    name: &str,
    dtype: StDtype,
    shape: &[u64],
    bytes: &[u8],
    fmt: TrunkFormat,
    storage: Storage,
) -> Result<(Encoding, Vec<Vec<u8>>), ConvertError> {
    let enc = trunk_encoding(name, dtype, shape, fmt, storage)?;
    let f32s = || to_f32(name, dtype, bytes);
    let cols = shape.get(1).copied().unwrap_or(0) as usize;
    let same = matches!(
        (&enc, dtype),
        (Encoding::F32, StDtype::F32)
            | (Encoding::Bf16, StDtype::BF16)
            | (Encoding::F16, StDtype::F16)
            | (Encoding::U8, StDtype::U8)
    );
    let parts = match &enc {
        _ if same => vec![bytes.to_vec()],
        Encoding::F32 => vec![le(&f32s()?, |v: f32| v.to_le_bytes().to_vec())],
        Encoding::Bf16 => vec![le(&f32s()?, |x: f32| bf16::from_f32(x).to_le_bytes().to_vec())],
        Encoding::Int8Row => {
            let (q, s) = int8::quantize(&f32s()?, cols);
            vec![le(&q, |x: i8| x.to_le_bytes().to_vec()), le(&s, |x: f32| x.to_le_bytes().to_vec())]
        }
        Encoding::Int4Group { .. } => {
            let (q, s) = int4::quantize_bits(&f32s()?, cols, INT4_GROUP, 4, Scale::Fitted);
            vec![q, le(&s, |x: f16| x.to_le_bytes().to_vec())]
        }
        other => {
            return Err(ConvertError::Unsupported(format!("tensor `{name}`: no trunk encoder for {}", other.label())));
        }
    };
    Ok((enc, parts))
}

/// How routed experts are re-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertTarget {
    Mxfp4,
    Bf16,
    Vq(Codec),
    F32,
    Int4,
    /// 3-bit levels in int4's layout.
    Rtn3,
    /// 2-bit levels in groups of [`int2_group`] (HOBBIT's low-bit copies).
    Int2,
    /// FP8 e4m3 in blocks of [`FP8_BLOCK`] by DeepSeek's quantization.
    Fp8,
}

/// The block FP8 re-encoding uses: DeepSeek-V3's and Kimi K2's.
pub const FP8_BLOCK: u32 = 128;

/// Encodes one expert matrix `[rows, cols]` of f32 weights. Returns the encoding and its parts.
/// `calibration` (the inputs the matrix sees, prepared by [`vq_calibration`]) weights a VQ
/// encoding's error by them.
pub fn expert(
    name: &str,
    w: Vec<f32>,
    rows: usize,
    cols: usize,
    target: ExpertTarget,
    calibration: Option<&Arc<k3_quant::encode::Calibration>>,
) -> Result<(Encoding, Vec<Vec<u8>>), ConvertError> {
    match target {
        ExpertTarget::Bf16 => Ok((Encoding::Bf16, vec![le(&w, |x: f32| bf16::from_f32(x).to_le_bytes().to_vec())])),
        ExpertTarget::F32 => Ok((Encoding::F32, vec![le(&w, |x: f32| x.to_le_bytes().to_vec())])),
        ExpertTarget::Int4 | ExpertTarget::Rtn3 => {
            if !cols.is_multiple_of(INT4_GROUP) {
                return Err(ConvertError::Unsupported(format!(
                    "{name}: {cols} columns cannot be int4 groups of {INT4_GROUP}"
                )));
            }
            let bits = if target == ExpertTarget::Rtn3 { 3 } else { 4 };
            let (q, s) = int4::quantize_bits(&w, cols, INT4_GROUP, bits, Scale::Few);
            Ok((Encoding::Int4Group { group: INT4_GROUP as u32 }, vec![q, le(&s, |x: f16| x.to_le_bytes().to_vec())]))
        }
        ExpertTarget::Int2 => {
            let group = int2_group(name, cols)?;
            let (q, s) = k3_quant::int2::quantize(&w, cols, group);
            Ok((Encoding::Int2Group { group: group as u32 }, vec![q, le(&s, |x: f16| x.to_le_bytes().to_vec())]))
        }
        ExpertTarget::Fp8 => {
            let (q, s) = k3_quant::fp8::quantize(&w, rows, cols, FP8_BLOCK as usize);
            Ok((fp8_encoding(FP8_BLOCK), vec![q, le(&s, |x: f32| x.to_le_bytes().to_vec())]))
        }
        ExpertTarget::Mxfp4 => {
            if !cols.is_multiple_of(32) {
                return Err(ConvertError::Unsupported(format!(
                    "{name}: {cols} columns cannot be MXFP4 (multiple of 32 needed)"
                )));
            }
            let (p, s) = mxfp4::quantize(&w, cols);
            Ok((Encoding::Mxfp4, vec![p, s]))
        }
        ExpertTarget::Vq(codec) => {
            let opts = EncodeOptions { calibration: calibration.cloned(), ..EncodeOptions::default() };
            let m = k3_quant::encode::encode_owned(codec, w, cols, &opts)
                .map_err(|e| ConvertError::Unsupported(format!("{name}: {e}")))?;
            let (block, seed) = m.rotation.as_ref().map_or((0, 0), |r| (r.block as u32, r.seed));
            let enc = Encoding::Vq {
                stages: codec.stages() as u32,
                entries: codec.entries() as u32,
                dim: codec.dim() as u32,
                rotation_block: block,
                rotation_seed: seed,
                codebook: CodebookSource::Inline,
                interleave: codec.interleave() as u32,
            };
            debug_assert_eq!(m.rows, rows);
            Ok((
                enc,
                vec![
                    m.codes,
                    le(&m.scale, |x: f16| x.to_le_bytes().to_vec()),
                    le(&m.codebooks, |x: f32| x.to_le_bytes().to_vec()),
                ],
            ))
        }
    }
}

/// The int2 group for rows of `cols`: 32, or 16 or 8 where the row needs them (the engine's
/// measured low-bit approximation rounds in the same groups).
pub fn int2_group(name: &str, cols: usize) -> Result<usize, ConvertError> {
    [32, 16, 8].into_iter().find(|g| cols.is_multiple_of(*g)).ok_or_else(|| {
        ConvertError::Unsupported(format!("{name}: {cols} columns cannot be int2 groups of 8, 16 or 32"))
    })
}

/// Inputs `xs` (`[n, cols]`) prepared once for every VQ matrix of `cols` columns that reads them
/// (an expert's w1 and w3 share theirs), with the settings [`expert`] encodes with.
pub fn vq_calibration(name: &str, xs: &[f32], cols: usize) -> Result<Arc<k3_quant::encode::Calibration>, ConvertError> {
    k3_quant::encode::Calibration::new(xs, cols, &EncodeOptions::default())
        .map(Arc::new)
        .map_err(|e| ConvertError::Unsupported(format!("{name}: {e}")))
}

/// The encoding an expert matrix of `cols` columns will get under `target` (known before any
/// expert is encoded, for the record layout).
pub fn planned(target: ExpertTarget, cols: usize) -> Encoding {
    match target {
        ExpertTarget::Bf16 => Encoding::Bf16,
        ExpertTarget::F32 => Encoding::F32,
        ExpertTarget::Int4 | ExpertTarget::Rtn3 => Encoding::Int4Group { group: INT4_GROUP as u32 },
        // A row no group fits is refused when its expert is encoded.
        ExpertTarget::Int2 => Encoding::Int2Group { group: int2_group("", cols).unwrap_or(32) as u32 },
        ExpertTarget::Mxfp4 => Encoding::Mxfp4,
        ExpertTarget::Fp8 => fp8_encoding(FP8_BLOCK),
        ExpertTarget::Vq(codec) => {
            let o = EncodeOptions::default();
            let block = if o.rotation_block > 1 { vq::Rotation::block_for(cols, o.rotation_block) } else { 0 };
            Encoding::Vq {
                stages: codec.stages() as u32,
                entries: codec.entries() as u32,
                dim: codec.dim() as u32,
                rotation_block: block as u32,
                rotation_seed: if block > 0 { o.seed } else { 0 },
                codebook: CodebookSource::Inline,
                interleave: codec.interleave() as u32,
            }
        }
    }
}
