//! Checkpoint encodings k3 reads but does not store, widened to f32 at conversion:
//! - FP8 e4m3 (`float8_e4m3fn`) with a per-block f32 `weight_scale_inv` (K2-Instruct,
//!   DeepSeek-V3/R1: blocks of 128x128, edge blocks partial): `w = fp8 * scale_inv[r/B][c/B]`;
//! - compressed-tensors `pack-quantized` INT4 (K2-Thinking's routed experts): `weight_packed`
//!   int32 `[N, K/8]`, nibble = q + 8, least significant first; `weight_scale` bf16 `[N, K/G]`:
//!   `w = (nibble - 8) * scale`.

use half::{bf16, f16};

use super::ConvertError;

pub use k3_quant::fp8::e4m3;

/// `[rows, cols]` FP8 weights times their `[ceil(rows/B), ceil(cols/B)]` block scales.
pub fn fp8_blocks(weight: &[u8], scale_inv: &[u8], rows: usize, cols: usize, block: usize) -> Vec<f32> {
    let table: Vec<f32> = (0..=255u8).map(e4m3).collect();
    let bc = cols.div_ceil(block);
    let scale = |r: usize, c: usize| {
        let i = (r / block * bc + c / block) * 4;
        f32::from_le_bytes(scale_inv[i..i + 4].try_into().expect("4 bytes"))
    };
    let mut out = vec![0f32; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = table[usize::from(weight[r * cols + c])] * scale(r, c);
        }
    }
    out
}

/// FP8 weights kept as stored must be numbers: no NaN byte (DeepSeek's quantization never makes
/// one; the kernels would read it as 480), and finite scales that stay finite times 256 (the
/// kernels' weights are `e4m3 / 256`, the 256 moved into the scale).
pub fn check_fp8(name: &str, weight: &[u8], scale_inv: &[u8]) -> Result<(), ConvertError> {
    if let Some(i) = weight.iter().position(|b| k3_quant::fp8::is_nan(*b)) {
        return Err(ConvertError::Unsupported(format!("`{name}`: weight {i} is an FP8 NaN (byte {:#04x})", weight[i])));
    }
    for (i, c) in scale_inv.chunks_exact(4).enumerate() {
        let s = f32::from_le_bytes(c.try_into().expect("4 bytes"));
        if !(s * 256.0).is_finite() {
            return Err(ConvertError::Unsupported(format!("`{name}_scale_inv`: block scale {i} is {s:e}")));
        }
    }
    Ok(())
}

/// `[rows, cols]` INT4 weights from their packed int32 words and bf16 group scales.
pub fn int4_groups(packed: &[u8], scale: &[u8], rows: usize, cols: usize, group: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            let w = (r * cols + c) / 8;
            let word = u32::from_le_bytes(packed[w * 4..w * 4 + 4].try_into().expect("4 bytes"));
            let q = ((word >> (4 * (c % 8))) & 0xF) as i32 - 8;
            let s = (r * (cols / group) + c / group) * 2;
            *v = q as f32 * bf16::from_le_bytes([scale[s], scale[s + 1]]).to_f32();
        }
    }
    out
}

/// bf16 group scales as f16 (k3's int4 scale type), each checked to convert exactly.
pub fn bf16_scales_to_f16(name: &str, scale: &[u8]) -> Result<Vec<u8>, ConvertError> {
    let mut out = Vec::with_capacity(scale.len());
    for (i, c) in scale.chunks_exact(2).enumerate() {
        let v = bf16::from_le_bytes([c[0], c[1]]).to_f32();
        let h = f16::from_f32(v);
        if h.to_f32() != v {
            return Err(ConvertError::Unsupported(format!(
                "`{name}`: scale {i} ({v:e}) has no exact f16; convert with --experts mxfp4, vq3, bf16 or f32"
            )));
        }
        out.extend(h.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_blocks_take_their_own_scale_and_nibbles_unpack_lsb_first() {
        // 3x3 weights of 1.0 in blocks of 2: four scales 1, 2, 3, 4.
        let scales: Vec<u8> = [1f32, 2.0, 3.0, 4.0].iter().flat_map(|s| s.to_le_bytes()).collect();
        let w = fp8_blocks(&[0x38; 9], &scales, 3, 3, 2);
        assert_eq!(w, [1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0]);
        // One row of 8: q = -8..7 by twos (nibbles 0, 2, ..., 14), scale 0.5.
        let word: u32 = (0..8).map(|i| (2 * i as u32) << (4 * i)).sum();
        let w = int4_groups(&word.to_le_bytes(), &bf16::from_f32(0.5).to_le_bytes(), 1, 8, 8);
        assert_eq!(w, [-4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0]);
        // The same word is k3's int4 layout (low nibble = even column) with the scale as f16.
        let scale = bf16_scales_to_f16("s", &bf16::from_f32(0.5).to_le_bytes()).unwrap();
        let mut y = [0f32];
        k3_quant::int4::matvec(&word.to_le_bytes(), &[f16::from_le_bytes([scale[0], scale[1]])], 8, &[1.0; 8], &mut y);
        assert_eq!(y[0], w.iter().sum::<f32>());
        assert!(bf16_scales_to_f16("s", &bf16::from_f32(1e-9).to_le_bytes()).is_err(), "below f16's range");
    }
}
