//! Tensor encodings and the byte parts each one stores.
//!
//! The format only knows the *layout* of an encoding: which parts it has, their element types and
//! shapes, hence their byte sizes. The arithmetic lives in `k3-quant`. Knowing the layout lets the
//! reader reject a tensor whose bytes cannot be what its manifest says, before any kernel sees it.

use serde::{Deserialize, Serialize};

/// Element type of one stored part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32,
    F16,
    Bf16,
    I8,
    U8,
    U16,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 | Dtype::U16 => 2,
            Dtype::I8 | Dtype::U8 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::I8 => "i8",
            Dtype::U8 => "u8",
            Dtype::U16 => "u16",
        }
    }
}

/// Where a VQ tensor's codebooks live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "in", rename_all = "snake_case")]
pub enum CodebookSource {
    /// A `codebooks` part of the tensor itself (inside the expert record for experts).
    Inline,
    /// A trunk tensor (F32 `[stages, entries, dim]`) shared by several tensors, e.g. per layer.
    Trunk { tensor: String },
}

/// How a tensor's values are stored. Quantized encodings apply to 2-D `[rows, cols]` matrices,
/// quantized along `cols` (the input dimension of `y = W x`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Encoding {
    /// Little-endian IEEE f32; any shape.
    F32,
    /// Little-endian bfloat16 bits; any shape.
    Bf16,
    /// Little-endian IEEE binary16; any shape.
    F16,
    /// Raw bytes, any shape (e.g. index tables).
    U8,
    /// Parts `q` i8 `[rows, cols]`, `scale` f32 `[rows]`; `w = q * scale`.
    Int8Row,
    /// Parts `q` u8 `[rows, cols/2]` (low nibble = even column, value `nibble - 8`),
    /// `scale` f16 `[rows, cols/group]`; `w = (nibble - 8) * scale`.
    Int4Group { group: u32 },
    /// Parts `q` u8 `[rows, cols/4]` (byte `i` of a row holds columns `4i..4i+3`, two bits each
    /// from the lowest, value `crumb - 2`), `scale` f16 `[rows, cols/group]`; `w = (crumb - 2) *
    /// scale`. HOBBIT's low-bit copies of routed experts.
    Int2Group { group: u32 },
    /// OCP MXFP4 in the compressed-tensors layout: `packed` u8 `[rows, cols/2]` (low nibble = even
    /// column, E2M1), `scale` u8 `[rows, cols/32]` (E8M0).
    Mxfp4,
    /// FP8 e4m3 (`float8_e4m3fn`) in blocks with an f32 scale each, as DeepSeek-V3/R1 and Kimi
    /// K2-Instruct ship their weights: parts `q` u8 `[rows, cols]` (the e4m3 bytes as stored),
    /// `scale` f32 `[ceil(rows/block_rows), ceil(cols/block_cols)]` (the checkpoint's
    /// `weight_scale_inv`); `w = e4m3(q) * scale[r/block_rows][c/block_cols]`, edge blocks partial.
    /// `block_cols` is a multiple of 32 (the kernels' lanes never straddle a block).
    Fp8Block { block_rows: u32, block_cols: u32 },
    /// Additive / residual vector quantization. Each row is cut into `cols/dim` chunks of `dim`
    /// values; each chunk stores one code per stage. Parts: `codes` `[rows, cols/dim * stages]`
    /// (u8 holding two 4-bit codes when `entries <= 16`, low nibble first; u8 when `entries <= 256`;
    /// u16 otherwise), `scale` f16 `[rows]`, and `codebooks` f32 `[stages, entries, dim]` when
    /// `codebook` is `Inline`. `rotation`: the block size of the randomized Hadamard rotation applied
    /// to the input dimension before encoding (0 = none) and its seed. `interleave`: rows per code
    /// block (1 = row-major; 32 = the fast-scan layout, see docs/FORMAT.md).
    Vq {
        stages: u32,
        entries: u32,
        dim: u32,
        rotation_block: u32,
        rotation_seed: u64,
        codebook: CodebookSource,
        #[serde(default = "row_major")]
        interleave: u32,
    },
}

fn row_major() -> u32 {
    1
}

/// One part an encoding stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartLayout {
    pub name: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl PartLayout {
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size()
    }
}

impl Encoding {
    /// Short name for tables and messages.
    pub fn label(&self) -> String {
        match self {
            Encoding::F32 => "f32".into(),
            Encoding::Bf16 => "bf16".into(),
            Encoding::F16 => "f16".into(),
            Encoding::U8 => "u8".into(),
            Encoding::Int8Row => "int8-row".into(),
            Encoding::Int4Group { group } => format!("int4-g{group}"),
            Encoding::Int2Group { group } => format!("int2-g{group}"),
            Encoding::Mxfp4 => "mxfp4".into(),
            Encoding::Fp8Block { block_rows, block_cols } => format!("fp8-e4m3-{block_rows}x{block_cols}"),
            Encoding::Vq { stages, entries, dim, .. } => format!("vq{stages}x{entries}x{dim}"),
        }
    }

    /// The parts a tensor of `shape` stores in this encoding, in storage order, or why the shape
    /// cannot be stored this way.
    pub fn parts(&self, shape: &[u64]) -> Result<Vec<PartLayout>, String> {
        let plain = |dtype| Ok(vec![PartLayout { name: "data", dtype, shape: shape.to_vec() }]);
        let matrix = || -> Result<(u64, u64), String> {
            match shape {
                [r, c] if *r > 0 && *c > 0 => Ok((*r, *c)),
                _ => Err(format!("{} needs a non-empty 2-D shape, got {shape:?}", self.label())),
            }
        };
        if shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none_or(|n| n > 1 << 48) {
            return Err(format!("shape {shape:?} is implausibly large"));
        }
        match self {
            Encoding::F32 => plain(Dtype::F32),
            Encoding::Bf16 => plain(Dtype::Bf16),
            Encoding::F16 => plain(Dtype::F16),
            Encoding::U8 => plain(Dtype::U8),
            Encoding::Int8Row => {
                let (r, c) = matrix()?;
                Ok(vec![
                    PartLayout { name: "q", dtype: Dtype::I8, shape: vec![r, c] },
                    PartLayout { name: "scale", dtype: Dtype::F32, shape: vec![r] },
                ])
            }
            Encoding::Int4Group { group } => {
                let (r, c) = matrix()?;
                let groups = self.divides(c, u64::from(*group), "group size")?;
                self.divides(c, 2, "nibble pair")?;
                // The kernels take a group's nibbles in whole bytes: a group of odd size would
                // split a byte between two scales.
                if group % 2 == 1 {
                    return Err(format!(
                        "{}: an int4 group of {group} columns is odd (groups hold whole nibble pairs)",
                        self.label()
                    ));
                }
                Ok(vec![
                    PartLayout { name: "q", dtype: Dtype::U8, shape: vec![r, c / 2] },
                    PartLayout { name: "scale", dtype: Dtype::F16, shape: vec![r, groups] },
                ])
            }
            Encoding::Int2Group { group } => {
                let (r, c) = matrix()?;
                let groups = self.divides(c, u64::from(*group), "group size")?;
                // A group's crumbs fill whole bytes, so no byte is split between two scales.
                if group % 4 != 0 {
                    return Err(format!("{}: an int2 group of {group} columns is not whole bytes", self.label()));
                }
                Ok(vec![
                    PartLayout { name: "q", dtype: Dtype::U8, shape: vec![r, c / 4] },
                    PartLayout { name: "scale", dtype: Dtype::F16, shape: vec![r, groups] },
                ])
            }
            Encoding::Mxfp4 => {
                let (r, c) = matrix()?;
                let blocks = self.divides(c, 32, "MXFP4 block size")?;
                Ok(vec![
                    PartLayout { name: "packed", dtype: Dtype::U8, shape: vec![r, c / 2] },
                    PartLayout { name: "scale", dtype: Dtype::U8, shape: vec![r, blocks] },
                ])
            }
            Encoding::Fp8Block { block_rows, block_cols } => {
                let (r, c) = matrix()?;
                self.fp8_parts(r, c, *block_rows, *block_cols)
            }
            Encoding::Vq { .. } => {
                let (r, c) = matrix()?;
                self.vq_parts(r, c)
            }
        }
    }

    /// `cols / by`, or why `cols` columns do not split into `by`s.
    fn divides(&self, cols: u64, by: u64, what: &str) -> Result<u64, String> {
        if by == 0 || !cols.is_multiple_of(by) {
            Err(format!("{}: {cols} columns are not a multiple of the {what} {by}", self.label()))
        } else {
            Ok(cols / by)
        }
    }

    /// The parts of an `fp8_block` matrix of `r x c`.
    fn fp8_parts(&self, r: u64, c: u64, block_rows: u32, block_cols: u32) -> Result<Vec<PartLayout>, String> {
        if block_rows == 0 || block_cols == 0 || !block_cols.is_multiple_of(32) {
            return Err(format!("{}: blocks must be non-empty and a multiple of 32 columns wide", self.label()));
        }
        Ok(vec![
            PartLayout { name: "q", dtype: Dtype::U8, shape: vec![r, c] },
            PartLayout {
                name: "scale",
                dtype: Dtype::F32,
                shape: vec![r.div_ceil(u64::from(block_rows)), c.div_ceil(u64::from(block_cols))],
            },
        ])
    }

    /// The parts of a `vq` matrix of `r x c`.
    fn vq_parts(&self, r: u64, c: u64) -> Result<Vec<PartLayout>, String> {
        let Encoding::Vq { stages, entries, dim, rotation_block, codebook, interleave, .. } = self else {
            return Err(format!("{} is not a VQ encoding", self.label()));
        };
        if *interleave == 0 || !r.is_multiple_of(u64::from(*interleave)) || (*interleave > 1 && *entries > 16) {
            return Err(format!(
                "{}: {r} rows cannot be interleaved in blocks of {interleave} (4-bit codes only)",
                self.label()
            ));
        }
        let (stages, entries, dim) = (u64::from(*stages), u64::from(*entries), u64::from(*dim));
        if stages == 0 || !(2..=65536).contains(&entries) {
            return Err(format!("{}: needs 1+ stages and 2..=65536 entries", self.label()));
        }
        let chunks = self.divides(c, dim, "vector dimension")?;
        if *rotation_block != 0 {
            self.divides(c, u64::from(*rotation_block), "rotation block")?;
        }
        let codes = if entries <= 16 {
            let n = chunks * stages;
            if n % 2 != 0 {
                return Err(format!("{}: an odd number of 4-bit codes per row ({n})", self.label()));
            }
            PartLayout { name: "codes", dtype: Dtype::U8, shape: vec![r, n / 2] }
        } else if entries <= 256 {
            PartLayout { name: "codes", dtype: Dtype::U8, shape: vec![r, chunks * stages] }
        } else {
            PartLayout { name: "codes", dtype: Dtype::U16, shape: vec![r, chunks * stages] }
        };
        let mut parts = vec![codes, PartLayout { name: "scale", dtype: Dtype::F16, shape: vec![r] }];
        if *codebook == CodebookSource::Inline {
            parts.push(PartLayout { name: "codebooks", dtype: Dtype::F32, shape: vec![stages, entries, dim] });
        }
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mxfp4_parts_match_k3_expert_sizes() {
        // K3 expert: w1, w3 [3072, 3584], w2 [3584, 3072]; the release stores 17,547,264 bytes per expert.
        let w13 = Encoding::Mxfp4.parts(&[3072, 3584]).unwrap();
        let w2 = Encoding::Mxfp4.parts(&[3584, 3072]).unwrap();
        let total: u64 = w13.iter().chain(w13.iter()).chain(w2.iter()).map(PartLayout::bytes).sum();
        assert_eq!(total, 17_547_264);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(Encoding::Mxfp4.parts(&[4, 33]).is_err());
        assert!(Encoding::Mxfp4.parts(&[128]).is_err());
        assert!(Encoding::Int4Group { group: 0 }.parts(&[4, 64]).is_err());
        let odd = Encoding::Int4Group { group: 3 }.parts(&[4, 6]).unwrap_err();
        assert!(odd.contains("odd"), "{odd}");
        // int2: the kernels' shape checks can only hold for groups of whole bytes dividing a row.
        assert!(Encoding::Int2Group { group: 0 }.parts(&[4, 64]).is_err());
        let split = Encoding::Int2Group { group: 6 }.parts(&[4, 12]).unwrap_err();
        assert!(split.contains("not whole bytes"), "{split}");
        assert!(Encoding::Int2Group { group: 32 }.parts(&[4, 48]).is_err());
        assert_eq!(Encoding::Int2Group { group: 16 }.parts(&[4, 48]).unwrap()[0].shape, [4, 12]);
        assert!(Encoding::F32.parts(&[u64::MAX, 2]).is_err());
    }

    #[test]
    fn fp8_blocks_take_partial_edges() {
        // K2-Instruct's hidden 7168 = 56 blocks; the golden model's 192 = one and a half.
        let p = Encoding::Fp8Block { block_rows: 128, block_cols: 128 }.parts(&[40, 192]).unwrap();
        assert_eq!((p[0].bytes(), p[1].shape.clone(), p[1].bytes()), (40 * 192, vec![1, 2], 8));
        assert!(Encoding::Fp8Block { block_rows: 128, block_cols: 100 }.parts(&[4, 200]).is_err());
        assert!(Encoding::Fp8Block { block_rows: 0, block_cols: 128 }.parts(&[4, 200]).is_err());
        let json = serde_json::to_string(&Encoding::Fp8Block { block_rows: 128, block_cols: 128 }).unwrap();
        assert_eq!(json, r#"{"kind":"fp8_block","block_rows":128,"block_cols":128}"#);
    }

    #[test]
    fn vq_code_widths() {
        let vq = |entries| Encoding::Vq {
            stages: 3,
            entries,
            dim: 4,
            rotation_block: 0,
            rotation_seed: 0,
            codebook: CodebookSource::Inline,
            interleave: 1,
        };
        // 3 stages x 4-bit codes over 4-dim chunks = 3 bits/weight.
        let p = vq(16).parts(&[8, 64]).unwrap();
        assert_eq!(p[0].bytes(), 8 * 64 / 4 * 3 / 2);
        assert_eq!(p[2].shape, vec![3, 16, 4]);
        assert_eq!(vq(256).parts(&[8, 64]).unwrap()[0].dtype, Dtype::U8);
        assert_eq!(vq(4096).parts(&[8, 64]).unwrap()[0].dtype, Dtype::U16);
    }
}
