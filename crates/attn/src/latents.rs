//! How an MLA cache stores its rows (a position's latent, or its shared key): f32 as computed,
//! bf16 (half the bytes), or int8 with one f32 scale a row (about a quarter). The rows are
//! rounded once, when appended. The absorbed form reads an int8 cache in integers (`mla::int8`:
//! the query and the block's weights rounded too, 1.85-2.4x f32's decode at K3's dimensions);
//! otherwise attention widens a block of rows back to f32 once for every head and runs the f32
//! kernels.

use std::str::FromStr;

/// The encoding of an MLA cache's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheType {
    /// As computed (the reference).
    #[default]
    F32,
    /// Rounded to bf16 (to nearest, ties to even): half the bytes.
    Bf16,
    /// Each row scaled by its largest magnitude / 127 and rounded to int8: a quarter of the bytes,
    /// plus four for the scale.
    Int8,
}

impl KvCacheType {
    pub const NAMES: [&'static str; 3] = ["f32", "bf16", "int8"];

    pub fn name(self) -> &'static str {
        match self {
            KvCacheType::F32 => "f32",
            KvCacheType::Bf16 => "bf16",
            KvCacheType::Int8 => "int8",
        }
    }

    /// Bytes a row of `width` values takes.
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvCacheType::F32 => 4 * width,
            KvCacheType::Bf16 => 2 * width,
            KvCacheType::Int8 if width == 0 => 0,
            KvCacheType::Int8 => width + 4,
        }
    }
}

impl FromStr for KvCacheType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvCacheType::F32),
            "bf16" => Ok(KvCacheType::Bf16),
            "int8" => Ok(KvCacheType::Int8),
            _ => Err(format!("`{s}` is not a cache type (f32, bf16 or int8)")),
        }
    }
}

/// Rows of one width in one encoding.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Rows {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
    Int8 { q: Vec<i8>, scale: Vec<f32> },
}

impl Default for Rows {
    fn default() -> Self {
        Rows::F32(Vec::new())
    }
}

fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

fn from_bf16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl Rows {
    pub(crate) fn new(kind: KvCacheType) -> Rows {
        match kind {
            KvCacheType::F32 => Rows::F32(Vec::new()),
            KvCacheType::Bf16 => Rows::Bf16(Vec::new()),
            KvCacheType::Int8 => Rows::Int8 { q: Vec::new(), scale: Vec::new() },
        }
    }

    pub(crate) fn kind(&self) -> KvCacheType {
        match self {
            Rows::F32(_) => KvCacheType::F32,
            Rows::Bf16(_) => KvCacheType::Bf16,
            Rows::Int8 { .. } => KvCacheType::Int8,
        }
    }

    /// Appends `row`, rounded to the encoding.
    pub(crate) fn push(&mut self, row: &[f32]) {
        match self {
            Rows::F32(v) => v.extend_from_slice(row),
            Rows::Bf16(v) => v.extend(row.iter().map(|x| to_bf16(*x))),
            Rows::Int8 { q, scale } => {
                let most = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                // A zero (or non-finite) row keeps scale 0: its values widen to 0 (a NaN row,
                // which a damaged model could make, must not poison other positions).
                let s = if most.is_finite() && most > 0.0 { most / 127.0 } else { 0.0 };
                let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                q.extend(row.iter().map(|x| (x * inv).round().clamp(-127.0, 127.0) as i8));
                scale.push(s);
            }
        }
    }

    /// Rows `from..from + n` of `width` values, as f32 into `out` (`n * width` values).
    pub(crate) fn widen(&self, from: usize, n: usize, width: usize, out: &mut [f32]) {
        let r = from * width..(from + n) * width;
        match self {
            Rows::F32(v) => out.copy_from_slice(&v[r]),
            Rows::Bf16(v) => out.iter_mut().zip(&v[r]).for_each(|(o, b)| *o = from_bf16(*b)),
            Rows::Int8 { q, scale } => {
                for (i, (o, qr)) in out.chunks_exact_mut(width).zip(q[r].chunks_exact(width)).enumerate() {
                    let s = scale[from + i];
                    o.iter_mut().zip(qr).for_each(|(o, q)| *o = f32::from(*q) * s);
                }
            }
        }
    }

    /// The int8 rows and their steps, when stored so.
    pub(crate) fn int8(&self) -> Option<(&[i8], &[f32])> {
        match self {
            Rows::Int8 { q, scale } => Some((q, scale)),
            _ => None,
        }
    }

    /// The f32 rows themselves, when stored so (attention reads them in place).
    pub(crate) fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Rows::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Values held (rows times width).
    pub(crate) fn values(&self) -> usize {
        match self {
            Rows::F32(v) => v.len(),
            Rows::Bf16(v) => v.len(),
            Rows::Int8 { q, .. } => q.len(),
        }
    }

    /// Values there is room for without reallocating.
    pub(crate) fn capacity(&self) -> usize {
        match self {
            Rows::F32(v) => v.capacity(),
            Rows::Bf16(v) => v.capacity(),
            Rows::Int8 { q, .. } => q.capacity(),
        }
    }

    /// Bytes allocated.
    pub(crate) fn held_bytes(&self) -> usize {
        match self {
            Rows::F32(v) => 4 * v.capacity(),
            Rows::Bf16(v) => 2 * v.capacity(),
            Rows::Int8 { q, scale } => q.capacity() + 4 * scale.capacity(),
        }
    }

    /// Room for `rows` rows of `width` in all.
    pub(crate) fn reserve_rows(&mut self, rows: usize, width: usize) {
        let more = rows.saturating_mul(width).saturating_sub(self.values());
        match self {
            Rows::F32(v) => v.reserve_exact(more),
            Rows::Bf16(v) => v.reserve_exact(more),
            Rows::Int8 { q, scale } => {
                q.reserve_exact(more);
                scale.reserve_exact(rows.saturating_sub(scale.len()));
            }
        }
    }

    /// The first `rows` rows of `width` only.
    pub(crate) fn truncate(&mut self, rows: usize, width: usize) {
        match self {
            Rows::F32(v) => v.truncate(rows * width),
            Rows::Bf16(v) => v.truncate(rows * width),
            Rows::Int8 { q, scale } => {
                q.truncate(rows * width);
                scale.truncate(rows);
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.truncate(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each encoding's rows widen to within its rounding: bf16 half an ulp at 8 bits (2^-9
    /// relative), int8 half a step (the row's largest magnitude / 254).
    #[test]
    fn rows_widen_within_their_rounding() {
        let rows: Vec<Vec<f32>> = (0..5).map(|r| k3_quant::rng::noise(40, r, 3.0)).collect();
        for kind in [KvCacheType::F32, KvCacheType::Bf16, KvCacheType::Int8] {
            let mut s = Rows::new(kind);
            rows.iter().for_each(|r| s.push(r));
            let mut out = vec![0f32; 3 * 40];
            s.widen(1, 3, 40, &mut out);
            for (i, o) in out.chunks(40).enumerate() {
                let want = &rows[1 + i];
                let most = want.iter().fold(0f32, |m, x| m.max(x.abs()));
                for (o, w) in o.iter().zip(want) {
                    let tol = match kind {
                        KvCacheType::F32 => 0.0,
                        KvCacheType::Bf16 => w.abs() / 256.0,
                        KvCacheType::Int8 => most / 254.0 * 1.0001,
                    };
                    assert!((o - w).abs() <= tol, "{kind:?}: {o} for {w}");
                }
            }
            assert!(s.held_bytes() >= 5 * kind.row_bytes(40), "{kind:?}");
        }
        // A zero row and a NaN row widen to zeros, not NaNs.
        let mut s = Rows::new(KvCacheType::Int8);
        s.push(&[0.0; 4]);
        s.push(&[f32::NAN, 1.0, 2.0, 3.0]);
        let mut out = [1f32; 8];
        s.widen(0, 2, 4, &mut out);
        assert!(out[..4].iter().all(|x| *x == 0.0) && out[4..].iter().all(|x| x.is_finite()), "{out:?}");
    }
}
