//! ~3-bit vector quantization of expert matrices (the WASTE codec), two candidates:
//!
//! - **A, fast-scan additive** ([`Codec::FastScan`]): 3 codebooks x 16 entries x 4 dims, 3.0
//!   bits/weight. A matvec builds, per input vector, a table of `codeword . x_chunk` quantized to
//!   u8 and sums table entries with `pshufb`, 32 rows at once (FAISS fast-scan). Codes are stored
//!   interleaved in blocks of 32 rows.
//! - **B, residual** ([`Codec::Residual`]): 3 codebooks x 256 entries x 8 dims, 3.0 bits/weight.
//!   A matvec decodes each 8-chunk as the sum of three codewords (codebooks stay in L1) and FMAs.
//!
//! Both reconstruct a row as `scale[r] * sum_s C_s[code]` per chunk, in the basis of an optional
//! randomized block-Hadamard rotation of the input dimension. Encoders: residual k-means and joint
//! refinement (re-encode + least-squares codebook refit) on a sample, then one encoding pass
//! (fast-scan: [`joint`]'s search, otherwise a beam search); optional activation-weighted
//! distance and GPTQ; see [`train`].

pub mod fastscan;
pub mod hadamard;
pub mod joint;
pub mod residual;
pub mod train;

use half::f16;

use crate::cpu::{Level, level};
pub use hadamard::Rotation;
use train::Data;

/// The VQ codec candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// A: 3 x 16 x 4 additive, fast-scan kernel.
    FastScan,
    /// B: 3 x 256 x 8 residual, codeword-gather kernel.
    Residual,
}

impl Codec {
    pub const ALL: [Codec; 2] = [Codec::FastScan, Codec::Residual];

    pub fn name(self) -> &'static str {
        match self {
            Codec::FastScan => "vq_a_3x16x4",
            Codec::Residual => "vq_b_3x256x8",
        }
    }

    pub const fn stages(self) -> usize {
        3
    }

    pub const fn entries(self) -> usize {
        match self {
            Codec::FastScan => 16,
            Codec::Residual => 256,
        }
    }

    pub const fn dim(self) -> usize {
        match self {
            Codec::FastScan => 4,
            Codec::Residual => 8,
        }
    }

    /// Rows per interleaved code block (1 = row-major).
    pub const fn interleave(self) -> usize {
        match self {
            Codec::FastScan => 32,
            Codec::Residual => 1,
        }
    }

    /// Why a `[rows, cols]` matrix cannot use this codec, if it cannot.
    pub fn check_shape(self, rows: usize, cols: usize) -> Result<(), String> {
        let col_multiple = match self {
            Codec::FastScan => 8, // an even number of (chunk, stage) items per row
            Codec::Residual => 8,
        };
        if rows == 0 || !rows.is_multiple_of(self.interleave()) || cols == 0 || !cols.is_multiple_of(col_multiple) {
            return Err(format!(
                "{} needs rows in multiples of {} and columns in multiples of {col_multiple}, got [{rows}, {cols}]",
                self.name(),
                self.interleave()
            ));
        }
        Ok(())
    }
}

/// Encoder settings.
#[derive(Debug, Clone)]
pub struct EncodeOptions {
    /// Block size of the randomized Hadamard rotation (0 = none); the largest power of two up to
    /// this that divides the columns is used.
    pub rotation_block: usize,
    pub seed: u64,
    /// k-means iterations per stage.
    pub kmeans_iters: usize,
    /// Vectors sampled to train the codebooks (k-means and the refinement rounds).
    pub sample: usize,
    /// Rounds of joint refinement on the sample (re-encode, refit codebooks).
    pub refine_rounds: usize,
    /// Width of the search: for 3 x 16-entry codebooks (fast-scan), the nearest first-stage
    /// entries each searched with all 256 pairs of the other two stages (16 = exhaustive);
    /// otherwise the beam of a stage-by-stage search.
    pub beam: usize,
    /// Calibration activations `[n, cols]` (original basis): when present, distances weigh each
    /// input column by `E[x^2]`, so the error that reaches the outputs is what gets minimized.
    pub calibration: Option<Vec<f32>>,
    /// With calibration: encode rows GPTQ-style, pushing each chunk's error onto the columns not
    /// yet encoded through the inverse second-moment matrix of the activations (output-aware).
    pub gptq: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            rotation_block: 128,
            seed: 0x5EED,
            kmeans_iters: 12,
            sample: 1 << 16,
            refine_rounds: 2,
            beam: 4,
            calibration: None,
            gptq: true,
        }
    }
}

impl EncodeOptions {
    /// Cheap settings for tests and benchmarks of the kernels (quality is not the point there).
    pub fn fast() -> Self {
        EncodeOptions { kmeans_iters: 4, sample: 1 << 12, refine_rounds: 0, beam: 1, ..Self::default() }
    }
}

/// An encoded matrix, owning its parts.
#[derive(Debug, Clone)]
pub struct VqMatrix {
    pub codec: Codec,
    pub rows: usize,
    pub cols: usize,
    /// Codes in the codec's storage layout (see the codec modules).
    pub codes: Vec<u8>,
    pub scale: Vec<f16>,
    /// `stages x entries x dim` f32.
    pub codebooks: Vec<f32>,
    pub rotation: Option<Rotation>,
}

/// A borrowed encoded matrix: what the kernels run on (parts may live in an expert record).
#[derive(Debug, Clone, Copy)]
pub struct VqRef<'a> {
    pub codec: Codec,
    pub rows: usize,
    pub cols: usize,
    pub codes: &'a [u8],
    pub scale: &'a [f16],
    pub codebooks: &'a [f32],
    pub rotation: Option<&'a Rotation>,
}

/// Per-thread working memory of the VQ kernels, reused across calls.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    table: Vec<f32>,
    lut: Vec<u8>,
    sums: Vec<u32>,
    /// A batch's rotated vectors and their tables.
    xs: Vec<f32>,
    luts: Vec<u8>,
}

/// Encodes `w` (`[rows, cols]`, row-major) with `codec`.
pub fn encode(codec: Codec, w: &[f32], cols: usize, opts: &EncodeOptions) -> Result<VqMatrix, String> {
    let rows = w.len() / cols.max(1);
    if rows * cols != w.len() {
        return Err(format!("{} values are not whole rows of {cols}", w.len()));
    }
    codec.check_shape(rows, cols)?;
    let (d, s_n) = (codec.dim(), codec.stages());
    let rotation = (opts.rotation_block > 1)
        .then(|| Rotation::new(cols, Rotation::block_for(cols, opts.rotation_block), opts.seed));
    let mut work = w.to_vec();
    if let Some(r) = &rotation {
        work.chunks_exact_mut(cols).for_each(|row| r.apply(row));
    }
    // Importance per (rotated) input column, mean 1.
    let importance: Option<Vec<f32>> = opts.calibration.as_ref().map(|xs| {
        let mut imp = vec![0f64; cols];
        let mut buf = vec![0f32; cols];
        for x in xs.chunks_exact(cols) {
            buf.copy_from_slice(x);
            if let Some(r) = &rotation {
                r.apply(&mut buf);
            }
            for (m, v) in imp.iter_mut().zip(&buf) {
                *m += f64::from(*v) * f64::from(*v);
            }
        }
        let mean = imp.iter().sum::<f64>() / cols as f64;
        imp.iter().map(|v| ((v / mean.max(1e-30)) as f32).max(1e-4)).collect()
    });
    // Rows normalized to unit RMS: one codebook then fits every row.
    let mut scale: Vec<f32> = work
        .chunks_exact(cols)
        .map(|r| {
            let rms = (r.iter().map(|v| v * v).sum::<f32>() / cols as f32).sqrt();
            if rms > 0.0 { rms } else { 1.0 }
        })
        .collect();
    for (row, s) in work.chunks_exact_mut(cols).zip(&scale) {
        row.iter_mut().for_each(|v| *v /= s);
    }
    let weights: Option<Vec<f32>> = importance.as_ref().map(|imp| imp.repeat(rows));
    let data = Data { dim: d, vecs: &work, weights: weights.as_deref() };
    // Codebooks are trained on a sample (48 codewords need far fewer vectors than a matrix
    // has), then every vector is encoded once.
    let (sample, sample_weights) = train::subsample(data, opts.sample);
    let sample = Data { dim: d, vecs: &sample, weights: sample_weights.as_deref() };
    let mut cb = train::init_residual(sample, s_n, codec.entries(), opts.kmeans_iters, opts.seed);
    let mut codes = Vec::new();
    for _ in 0..opts.refine_rounds {
        train::encode(sample, &cb, opts.beam.max(1), &mut codes);
        train::refit(sample, &codes, &mut cb);
    }
    if let (true, Some(xs)) = (opts.gptq, &opts.calibration) {
        let mut h = second_moment(xs, cols, rotation.as_ref());
        if let Some(u) = train::gptq_factor(&mut h, cols, 0.01) {
            let original = work.clone();
            train::gptq_encode(&mut work, cols, &u, importance.as_deref(), &cb, opts.beam.max(1), &mut codes);
            for _ in 0..opts.refine_rounds {
                // The compensated targets GPTQ actually quantized: refit the codebooks to them,
                // then encode again from the original rows.
                train::refit(Data { dim: d, vecs: &work, weights: weights.as_deref() }, &codes, &mut cb);
                work.copy_from_slice(&original);
                train::gptq_encode(&mut work, cols, &u, importance.as_deref(), &cb, opts.beam.max(1), &mut codes);
            }
            match_energy(&mut scale, &original, &codes, &cb, importance.as_deref(), cols);
            return Ok(finish(codec, rows, cols, &codes, scale, cb.values, rotation));
        }
    }
    train::encode(data, &cb, opts.beam.max(1), &mut codes);
    match_energy(&mut scale, &work, &codes, &cb, importance.as_deref(), cols);
    Ok(finish(codec, rows, cols, &codes, scale, cb.values, rotation))
}

/// Sets each row's scale so that its reconstruction keeps the (importance-weighted) energy of
/// `target` (the normalized rows). Least-squares scales shrink a reconstruction (codewords are
/// conditional means), and the model loses more to that shrinkage than it gains from the
/// smaller weight error: on the default model, next-token KL 0.00144 against 0.00194 nats
/// uncalibrated (docs/LEARNED.md).
fn match_energy(
    scale: &mut [f32],
    target: &[f32],
    codes: &[u16],
    cb: &train::Codebooks,
    importance: Option<&[f32]>,
    cols: usize,
) {
    let (d, s_n) = (cb.dim, cb.stages);
    let chunks = cols / d;
    let mut rec = vec![0f32; d];
    for (r, s) in scale.iter_mut().enumerate() {
        let (mut num, mut den) = (0f64, 0f64);
        for k in 0..chunks {
            let i = r * chunks + k;
            train::reconstruct(cb, &codes[i * s_n..][..s_n], &mut rec);
            for j in 0..d {
                let imp = importance.map_or(1.0, |m| f64::from(m[k * d + j]));
                num += imp * f64::from(target[i * d + j]).powi(2);
                den += imp * f64::from(rec[j]) * f64::from(rec[j]);
            }
        }
        if den > 0.0 && num > 0.0 {
            *s *= (num / den).sqrt() as f32;
        }
    }
}

/// `E[x x^T]` of the calibration vectors in the rotated basis, `cols x cols` f64.
fn second_moment(xs: &[f32], cols: usize, rotation: Option<&Rotation>) -> Vec<f64> {
    use rayon::prelude::*;
    let n = xs.len() / cols;
    let rotated: Vec<f32> = xs
        .chunks_exact(cols)
        .flat_map(|x| {
            let mut v = x.to_vec();
            if let Some(r) = rotation {
                r.apply(&mut v);
            }
            v
        })
        .collect();
    let mut h = vec![0f64; cols * cols];
    h.par_chunks_exact_mut(cols).enumerate().for_each(|(i, row)| {
        for x in rotated.chunks_exact(cols) {
            let xi = f64::from(x[i]);
            for (hv, xj) in row.iter_mut().zip(x) {
                *hv += xi * f64::from(*xj);
            }
        }
        row.iter_mut().for_each(|v| *v /= n as f64);
    });
    h
}

fn finish(
    codec: Codec,
    rows: usize,
    cols: usize,
    codes: &[u16],
    scale: Vec<f32>,
    codebooks: Vec<f32>,
    rotation: Option<Rotation>,
) -> VqMatrix {
    let items = cols / codec.dim() * codec.stages();
    let packed = match codec {
        Codec::FastScan => fastscan::pack(codes, rows, items),
        Codec::Residual => codes.iter().map(|&c| c as u8).collect(),
    };
    VqMatrix {
        codec,
        rows,
        cols,
        codes: packed,
        scale: scale.iter().map(|&s| f16::from_f32(s)).collect(),
        codebooks,
        rotation,
    }
}

impl VqMatrix {
    pub fn as_ref(&self) -> VqRef<'_> {
        VqRef {
            codec: self.codec,
            rows: self.rows,
            cols: self.cols,
            codes: &self.codes,
            scale: &self.scale,
            codebooks: &self.codebooks,
            rotation: self.rotation.as_ref(),
        }
    }

    pub fn decode(&self) -> Vec<f32> {
        self.as_ref().decode()
    }

    pub fn matvec(&self, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        self.as_ref().matvec(x, y, scratch)
    }

    /// Bits per weight, codes and row scales (codebooks are per matrix or shared).
    pub fn bits_per_weight(&self) -> f64 {
        (self.codes.len() * 8 + self.scale.len() * 16) as f64 / (self.rows * self.cols) as f64
    }
}

impl VqRef<'_> {
    fn items(&self) -> usize {
        self.cols / self.codec.dim() * self.codec.stages()
    }

    /// The code of item `j` (chunk `j / stages`, stage `j % stages`) of row `r`.
    pub fn code(&self, r: usize, j: usize) -> usize {
        match self.codec {
            Codec::FastScan => fastscan::code(self.codes, self.items(), r, j),
            Codec::Residual => usize::from(self.codes[r * self.items() + j]),
        }
    }

    /// The matrix in the original basis (rotation undone), `[rows, cols]`.
    pub fn decode(&self) -> Vec<f32> {
        let (d, s_n, e_n) = (self.codec.dim(), self.codec.stages(), self.codec.entries());
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            let s = self.scale[r].to_f32();
            for (k, chunk) in row.chunks_exact_mut(d).enumerate() {
                for st in 0..s_n {
                    let e = self.code(r, k * s_n + st);
                    let cw = &self.codebooks[(st * e_n + e) * d..][..d];
                    chunk.iter_mut().zip(cw).for_each(|(o, c)| *o += c);
                }
                chunk.iter_mut().for_each(|v| *v *= s);
            }
            if let Some(rot) = self.rotation {
                rot.apply_inverse(row);
            }
        }
        out
    }

    /// `y = W x` with the kernel the CPU supports.
    pub fn matvec(&self, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        self.matvec_at(level(), x, y, scratch)
    }

    /// [`matvec`](Self::matvec) with an explicit kernel level.
    pub fn matvec_at(&self, level: Level, x: &[f32], y: &mut [f32], scratch: &mut Scratch) {
        assert_eq!(x.len(), self.cols, "x has {} entries for {} columns", x.len(), self.cols);
        assert_eq!(y.len(), self.rows, "y has {} entries for {} rows", y.len(), self.rows);
        scratch.x.clear();
        scratch.x.extend_from_slice(x);
        if let Some(r) = self.rotation {
            r.apply(&mut scratch.x);
        }
        match self.codec {
            Codec::FastScan => fastscan::matvec(level, self, scratch, y),
            Codec::Residual => residual::matvec(level, self, &scratch.x, y),
        }
    }

    /// `Y = W X` for a batch (`xs` `[n, cols]`, `ys` `[n, rows]`), the same bits as
    /// [`matvec`](Self::matvec) per vector; fast-scan scans the codes once per pair of vectors.
    pub fn matmul(&self, xs: &[f32], ys: &mut [f32], scratch: &mut Scratch) {
        self.matmul_at(level(), xs, ys, scratch)
    }

    /// [`matmul`](Self::matmul) with an explicit kernel level.
    pub fn matmul_at(&self, level: Level, xs: &[f32], ys: &mut [f32], scratch: &mut Scratch) {
        let n = xs.len() / self.cols;
        assert_eq!(xs.len(), n * self.cols, "xs is not whole {}-vectors", self.cols);
        assert_eq!(ys.len(), n * self.rows, "ys is not {n} vectors of {}", self.rows);
        if self.codec != Codec::FastScan || n < 2 {
            for (x, y) in xs.chunks_exact(self.cols).zip(ys.chunks_exact_mut(self.rows)) {
                self.matvec_at(level, x, y, scratch);
            }
            return;
        }
        scratch.xs.clear();
        scratch.xs.extend_from_slice(xs);
        if let Some(r) = self.rotation {
            scratch.xs.chunks_exact_mut(self.cols).for_each(|x| r.apply(x));
        }
        fastscan::matmul(level, self, scratch, ys);
    }
}

/// The codec WASTE uses for experts unless told otherwise; chosen by measured quality and speed
/// (docs/LEARNED.md, docs/EFFICIENCY.md).
pub const DEFAULT_CODEC: Codec = Codec::FastScan;
