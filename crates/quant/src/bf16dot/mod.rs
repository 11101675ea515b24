//! Bf16 activations: a batch of vectors rounded to bf16 (round to nearest even, as
//! `vcvtneps2bf16`) and the products of the trunk's weight encodings with them as `vdpbf16ps`
//! (AVX512-BF16): 32 multiply-adds an instruction, twice f32 FMA's rate on the same registers.
//!
//! The weights stay exact: bf16, and int8 and int4 levels, are all whole bf16 values (a level
//! `|q| <= 128` has at most 8 significant bits), and their scales are applied in f32 afterwards.
//! Only the activations are rounded, each by at most half a unit in its 8th significant bit
//! (2^-8 of itself): int8 blocks round every value by up to 2^-8 of its block's largest, so a
//! value k times smaller than that is rounded about k times finer here. What that costs a model is measured (`k3-cli perplexity --activations
//! bf16-trunk --against`, docs/EFFICIENCY.md).
//!
//! Used for batches of more than [`FEW`](crate::q8::FEW) vectors (prefill chunks, verifies): a
//! decode step's lone vector stays exact. Layout of a batch: groups of [`LANES`] vectors, each
//! group `[cols / 2][LANES]` 32-bit words, a vector's word `p` its values `2p` (low half) and
//! `2p + 1` (high half); a last group short of vectors padded with zeros. One broadcast weight
//! word and one `vdpbf16ps` thus advance sixteen (row, vector) dots by two columns, and each dot
//! stays whole in its lane.
//!
//! Subnormal inputs count as zero (`vdpbf16ps` treats them so): the rounding here flushes them,
//! and so does the decoding of bf16 weights. Sums that fall below f32's normal range flush to
//! zero likewise; the reference does the same, so the two agree bit for bit.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod reference;

use std::cell::Cell;

use half::{bf16, f16};

use crate::cpu::{Level, level, supported};
use crate::q8::FEW;

/// Vectors per group of the lane layout (a 512-bit register of 32-bit lanes).
pub const LANES: usize = 16;

/// `n` vectors of `cols` values (`cols` even) rounded to bf16, in the lane layout.
#[derive(Debug, Clone, Default)]
pub struct Bf16Batch {
    cols: usize,
    n: usize,
    words: Vec<u32>,
}

/// `x` as bf16 bits: round to nearest even (NaN stays NaN), subnormal results flushed to a zero
/// of the same sign.
pub fn round(x: f32) -> u16 {
    flush(bf16::from_f32(x).to_bits())
}

/// A bf16 subnormal as a zero of its sign; other values unchanged.
fn flush(b: u16) -> u16 {
    if b & 0x7f80 == 0 { b & 0x8000 } else { b }
}

/// bf16 bits as the f32 they stand for.
pub fn value(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl Bf16Batch {
    /// Rounds `xs` (`[n, cols]`, `cols` even and non-zero), reusing the buffers.
    pub fn round_into(&mut self, xs: &[f32], cols: usize) {
        assert!(cols > 0 && cols.is_multiple_of(2), "bf16 activations need an even number of columns, got {cols}");
        assert!(xs.len().is_multiple_of(cols), "xs is not whole {cols}-vectors");
        let (n, pairs) = (xs.len() / cols, cols / 2);
        (self.cols, self.n) = (cols, n);
        self.words.clear();
        self.words.resize(n.div_ceil(LANES) * pairs * LANES, 0);
        for (v, x) in xs.chunks_exact(cols).enumerate() {
            let group = &mut self.words[v / LANES * pairs * LANES..][..pairs * LANES];
            for (p, two) in x.chunks_exact(2).enumerate() {
                group[p * LANES + v % LANES] = u32::from(round(two[0])) | u32::from(round(two[1])) << 16;
            }
        }
    }

    pub fn round(xs: &[f32], cols: usize) -> Bf16Batch {
        let mut b = Bf16Batch::default();
        b.round_into(xs, cols);
        b
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Vectors in the batch.
    pub fn vectors(&self) -> usize {
        self.n
    }

    /// Vector `v`'s values `2p` (low half) and `2p + 1` (high half), as bf16 bits.
    pub fn word(&self, v: usize, p: usize) -> u32 {
        self.words[v / LANES * (self.cols / 2) * LANES + p * LANES + v % LANES]
    }

    /// Group `g`'s words, `[cols / 2][LANES]`.
    fn group(&self, g: usize) -> &[u32] {
        let len = self.cols / 2 * LANES;
        &self.words[g * len..][..len]
    }
}

/// A weight matrix as these products read it: rows of whole bf16 values, and the scale that
/// turns them into the stored weights.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// bf16 as stored (`[rows, cols]`).
    Bf16(&'a [bf16]),
    /// int8 levels with one f32 scale per row.
    Int8 { q: &'a [i8], scale: &'a [f32] },
    /// int4 levels (`nibble - 8`, the low nibble the even column) with an f16 scale per `group`
    /// columns of a row (`group` even).
    Int4 { q: &'a [u8], scale: &'a [f16], group: usize },
}

/// The bf16 bits of whole number `v` (exact for `|v| <= 256`: the top half of its f32 bits).
const fn whole(v: i32) -> u16 {
    ((v as f32).to_bits() >> 16) as u16
}
/// bf16 bits of each int8 level, indexed by its byte.
const INT8_LEVELS: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = whole(i as u8 as i8 as i32);
        i += 1;
    }
    t
};
/// bf16 bits of each int4 nibble's level (`nibble - 8`).
const INT4_LEVELS: [u16; 16] = {
    let mut t = [0u16; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = whole(i as i32 - 8);
        i += 1;
    }
    t
};

/// [`INT4_LEVELS`] twice: a 512-bit table of 32 words for `vpermw`.
#[cfg(target_arch = "x86_64")]
const INT4_LEVELS_X2: [u16; 32] = {
    let mut t = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = INT4_LEVELS[i % 16];
        i += 1;
    }
    t
};

impl Weights<'_> {
    /// Rows of `cols` columns (checked against the parts; panics naming the mismatch).
    #[track_caller]
    fn rows(&self, cols: usize) -> usize {
        match *self {
            Weights::Bf16(w) => {
                assert!(w.len().is_multiple_of(cols), "bf16 weights are not whole rows of {cols}");
                w.len() / cols
            }
            Weights::Int8 { q, scale } => {
                assert_eq!(q.len(), scale.len() * cols, "int8 weights for [{}, {cols}]", scale.len());
                scale.len()
            }
            Weights::Int4 { q, scale, group } => {
                assert!(group >= 2 && group.is_multiple_of(2) && cols.is_multiple_of(group), "int4 groups of {group}");
                let rows = scale.len() / (cols / group);
                assert!(
                    q.len() == rows * cols / 2 && scale.len() == rows * cols / group,
                    "int4 parts for [{rows}, {cols}]"
                );
                rows
            }
        }
    }

    /// Row `r`'s values as pair words (value `2p` the low half of word `p`), subnormals flushed.
    pub fn decode_row(&self, r: usize, cols: usize, out: &mut [u32]) {
        self.decode_tail(r, cols, 0, out)
    }

    /// [`decode_row`](Self::decode_row) from column `from` (even) on.
    fn decode_tail(&self, r: usize, cols: usize, from: usize, out: &mut [u32]) {
        let pair = |lo: u16, hi: u16| u32::from(lo) | u32::from(hi) << 16;
        let out = &mut out[from / 2..cols / 2];
        match *self {
            Weights::Bf16(w) => {
                for (o, two) in out.iter_mut().zip(w[r * cols + from..][..cols - from].chunks_exact(2)) {
                    *o = pair(flush(two[0].to_bits()), flush(two[1].to_bits()));
                }
            }
            Weights::Int8 { q, .. } => {
                for (o, two) in out.iter_mut().zip(q[r * cols + from..][..cols - from].chunks_exact(2)) {
                    *o = pair(INT8_LEVELS[two[0] as u8 as usize], INT8_LEVELS[two[1] as u8 as usize]);
                }
            }
            Weights::Int4 { q, .. } => {
                for (o, b) in out.iter_mut().zip(&q[(r * cols + from) / 2..][..(cols - from) / 2]) {
                    *o = pair(INT4_LEVELS[usize::from(b & 15)], INT4_LEVELS[usize::from(b >> 4)]);
                }
            }
        }
    }

    /// Whether each group of columns has its own scale (int4), applied to its dot.
    fn grouped(&self) -> bool {
        matches!(self, Weights::Int4 { .. })
    }

    /// Pair words per scale group (the whole row when the scale is per row or absent).
    fn group_pairs(&self, cols: usize) -> usize {
        match *self {
            Weights::Int4 { group, .. } => group / 2,
            _ => cols / 2,
        }
    }

    /// The scale of row `r`'s group `g` for int4 (applied to each group's dot with one
    /// multiply-add); `None` for the others.
    fn group_scale(&self, r: usize, g: usize, cols: usize) -> Option<f32> {
        match *self {
            Weights::Int4 { scale, group, .. } => Some(scale[r * (cols / group) + g].to_f32()),
            _ => None,
        }
    }

    /// Row `r`'s scale for int8 (multiplying its whole dot); `None` for the others.
    fn row_scale(&self, r: usize) -> Option<f32> {
        match *self {
            Weights::Int8 { scale, .. } => Some(scale[r]),
            _ => None,
        }
    }
}

thread_local! {
    /// A batch's buffers, kept per thread between products (taken out while in use).
    static SCRATCH: Cell<Option<Bf16Batch>> = const { Cell::new(None) };
}

/// Runs `f` on `xs` (`[n, cols]`) rounded, in buffers reused across calls on this thread.
pub(crate) fn with_rounded<R>(xs: &[f32], cols: usize, f: impl FnOnce(&Bf16Batch) -> R) -> R {
    crate::scratch::with_taken(&SCRATCH, |b| {
        b.round_into(xs, cols);
        f(b)
    })
}

/// Whether a batch of `n` vectors takes these products on this CPU (AVX-512 with BF16, and more
/// than [`FEW`] vectors).
pub fn takes(n: usize) -> bool {
    n > FEW && available_at(level())
}

pub fn available_at(level: Level) -> bool {
    #[cfg(target_arch = "x86_64")]
    if level >= Level::Avx512 {
        return bf16_dot();
    }
    let _ = level;
    false
}

#[cfg(target_arch = "x86_64")]
fn bf16_dot() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512bf16"))
}

/// `ys` `[n, rows]` = `W X` with the kernel the CPU has (its reference's bits on every CPU).
pub fn matmul(w: &Weights<'_>, x: &Bf16Batch, ys: &mut [f32]) {
    matmul_at(level(), w, x, ys)
}

pub fn matmul_at(level: Level, w: &Weights<'_>, x: &Bf16Batch, ys: &mut [f32]) {
    let rows = w.rows(x.cols);
    assert_eq!(ys.len(), x.n * rows, "ys is not {} vectors of {rows}", x.n);
    if available_at(supported(level)) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available_at` is true only at the AVX-512 level (F, BW, VL among its features)
        // on a CPU with BF16; the parts
        // were checked against `rows` and `x.cols` above, and `ys` against both.
        return unsafe { avx512::matmul(w, rows, x, ys) };
    }
    reference::matmul(w, x, ys)
}
