//! The VQ encoder's pipeline for one matrix: rotation, row normalization, codebook training on a
//! sample, the encoding pass (GPTQ's when calibrated), energy-matching row scales, packing.

use std::sync::Arc;

use half::f16;

use super::distance::Data;
use super::train;
use super::{descent, gptq, linalg, search};
use crate::vq::{Codec, Rotation, VqMatrix, fastscan};

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
    /// The inputs the matrix sees ([`EncodeOptions::calibrated`]): codebook training weighs each
    /// input column by `E[x^2]` (and GPTQ's search by its own loss), so the error that reaches
    /// the outputs is what gets minimized.
    pub calibration: Option<Arc<Calibration>>,
    /// With calibration: encode rows GPTQ-style, pushing each chunk's error onto the columns not
    /// yet encoded through the inverse second-moment matrix of the activations (output-aware).
    pub gptq: bool,
    /// With GPTQ: the vectors (as whole rows, evenly spread) its refinement rounds encode to
    /// refit the codebooks; only the last pass encodes every row. A codebook of 48 entries is
    /// fitted about as well from ~300 K3 rows as from 3,072 (output error 1.0005x), at a tenth of
    /// the passes' cost (docs/EFFICIENCY.md).
    pub refine_sample: usize,
    /// After GPTQ: sweeps of coordinate descent on the output error (`super::descent`).
    pub descent_rounds: usize,
    /// The search width of those sweeps (16: every first-stage entry of the fast-scan codec).
    /// Narrower is cheaper but costs quality: 8 took the default model's KL from 0.000631 to
    /// 0.000643, 4 to 0.000650 (docs/EFFICIENCY.md).
    pub descent_width: usize,
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
            refine_sample: 1 << 18,
            descent_rounds: 2,
            descent_width: 16,
        }
    }
}

impl EncodeOptions {
    /// Cheap settings for tests and benchmarks of the kernels (quality is not the point there).
    pub fn fast() -> Self {
        EncodeOptions { kmeans_iters: 4, sample: 1 << 12, refine_rounds: 0, beam: 1, ..Self::default() }
    }

    /// These settings with calibration inputs `xs` (`[n, cols]`) prepared for them.
    pub fn calibrated(self, xs: &[f32], cols: usize) -> Result<Self, String> {
        let c = Calibration::new(xs, cols, &self)?;
        Ok(EncodeOptions { calibration: Some(Arc::new(c)), ..self })
    }

    /// The rotation a `cols`-column matrix gets.
    fn rotation(&self, cols: usize) -> Option<Rotation> {
        (self.rotation_block > 1)
            .then(|| Rotation::new(cols, Rotation::block_for(cols, self.rotation_block), self.seed))
    }
}

/// The inputs a matrix sees, prepared once for every matrix that reads them (an expert's w1 and
/// w3 share one): their per-column importance in the encoding's rotated basis and, for GPTQ,
/// the factor of their second-moment matrix (the costly part: `cols^3`).
#[derive(Debug)]
pub struct Calibration {
    cols: usize,
    /// The rotation's (block, seed) the inputs were prepared in.
    rotation: Option<(usize, u64)>,
    /// Each column's `E[x^2]` relative to the mean column's, floored at 1e-4.
    importance: Vec<f32>,
    /// The output metric; `None` without GPTQ, or when the damped second-moment matrix is not
    /// positive definite (the encoder then only weighs by importance).
    output: Option<OutputMetric>,
}

/// The inputs' damped second-moment matrix `H` and GPTQ's factor of it, both `cols x cols`.
#[derive(Debug)]
struct OutputMetric {
    /// `H` itself: descent's objective and the output energy the row scales keep.
    moment: Vec<f64>,
    /// GPTQ's `U` ([`gptq::gptq_factor`]), in f32 (as GPTQ's own runs it): its products move
    /// f32 weights.
    factor: Vec<f32>,
}

impl Calibration {
    /// `xs` (`[n, cols]`, the original basis) prepared for `cols`-column matrices encoded with
    /// `opts`' rotation, and for GPTQ if `opts.gptq`.
    pub fn new(xs: &[f32], cols: usize, opts: &EncodeOptions) -> Result<Self, String> {
        if cols == 0 || xs.is_empty() || !xs.len().is_multiple_of(cols) {
            return Err(format!("{} calibration values are not whole {cols}-wide inputs", xs.len()));
        }
        let rotation = opts.rotation(cols);
        let inputs = rotated_inputs(xs, cols, rotation.as_ref());
        let mut moment = linalg::second_moment(&inputs, cols);
        // `gptq_factor` damps `moment` in place.
        let factor = opts.gptq.then(|| gptq::gptq_factor(&mut moment, cols, 0.01)).flatten();
        let output = factor.map(|u| OutputMetric { moment, factor: u.iter().map(|&v| v as f32).collect() });
        Ok(Calibration {
            cols,
            rotation: rotation.map(|r| (r.block, r.seed)),
            importance: importance(&inputs, cols),
            output,
        })
    }
}

/// Encodes `w` (`[rows, cols]`, row-major) with `codec`.
pub fn encode(codec: Codec, w: &[f32], cols: usize, opts: &EncodeOptions) -> Result<VqMatrix, String> {
    encode_owned(codec, w.to_vec(), cols, opts)
}

/// [`encode`], working in `w`'s own memory: a caller that has the weights as a vector of its
/// own (a converter decoding them) saves a copy of the matrix and the first touch of new memory
/// (~20 ms of a K3 matrix's encoding here: docs/EFFICIENCY.md).
pub fn encode_owned(codec: Codec, w: Vec<f32>, cols: usize, opts: &EncodeOptions) -> Result<VqMatrix, String> {
    let rows = w.len() / cols.max(1);
    if rows * cols != w.len() {
        return Err(format!("{} values are not whole rows of {cols}", w.len()));
    }
    codec.check_shape(rows, cols)?;
    let (d, s_n) = (codec.dim(), codec.stages());
    let rotation = opts.rotation(cols);
    let calibration = opts.calibration.as_deref();
    if let Some(c) = calibration
        && (c.cols != cols || c.rotation != rotation.as_ref().map(|r| (r.block, r.seed)))
    {
        return Err(format!("calibration prepared for {} columns under another rotation, not these {cols}", c.cols));
    }
    let mut work = w;
    // Rows rotated and normalized to unit RMS (one codebook then fits every row), each while it
    // is in cache.
    let mut scale: Vec<f32> = work
        .chunks_exact_mut(cols)
        .map(|row| {
            if let Some(r) = &rotation {
                r.apply(row);
            }
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / cols as f32).sqrt();
            let rms = if rms > 0.0 { rms } else { 1.0 };
            row.iter_mut().for_each(|v| *v /= rms);
            rms
        })
        .collect();
    let importance = calibration.map(|c| c.importance.as_slice());
    let weights: Option<Vec<f32>> = importance.map(|imp| imp.repeat(rows));
    let data = Data { dim: d, vecs: &work, weights: weights.as_deref() };
    // Codebooks are trained on a sample (48 codewords need far fewer vectors than a matrix
    // has), then every vector is encoded once.
    let (sample, sample_weights) = train::subsample(data, opts.sample);
    let sample = Data { dim: d, vecs: &sample, weights: sample_weights.as_deref() };
    let mut cb = train::init_residual(sample, s_n, codec.entries(), opts.kmeans_iters, opts.seed);
    let mut codes = Vec::new();
    for _ in 0..opts.refine_rounds {
        search::encode(sample, &cb, opts.beam.max(1), &mut codes);
        train::refit(sample, &codes, &mut cb);
    }
    if let Some(c) = calibration.filter(|_| opts.gptq)
        && let Some(OutputMetric { moment: h, factor: u }) = &c.output
    {
        let original = work.clone();
        if opts.refine_rounds > 0 {
            let picked = refine_rows(rows, cols / d, opts.refine_sample);
            let sub: Vec<f32> = picked.iter().flat_map(|&r| &original[r * cols..][..cols]).copied().collect();
            let sub_weights = importance.map(|imp| imp.repeat(picked.len()));
            for _ in 0..opts.refine_rounds {
                // The compensated targets GPTQ actually quantizes: the codebooks refitted to them.
                let mut targets = sub.clone();
                gptq::gptq_encode(&mut targets, cols, u, &cb, opts.beam.max(1), &mut codes);
                train::refit(Data { dim: d, vecs: &targets, weights: sub_weights.as_deref() }, &codes, &mut cb);
            }
        }
        gptq::gptq_encode(&mut work, cols, u, &cb, opts.beam.max(1), &mut codes);
        let energies = descent::descend(&original, cols, h, &cb, opts.descent_width, opts.descent_rounds, &mut codes);
        match_output_energy(&mut scale, &energies);
        return Ok(finish(codec, rows, cols, &codes, scale, cb.values, rotation));
    }
    search::encode(data, &cb, opts.beam.max(1), &mut codes);
    match_energy(&mut scale, &work, &codes, &cb, importance, cols);
    Ok(finish(codec, rows, cols, &codes, scale, cb.values, rotation))
}

/// The rows GPTQ's refinement rounds encode: `sample` vectors' worth of whole rows (each
/// `chunks` vectors), evenly spread; every row if that is all of them.
fn refine_rows(rows: usize, chunks: usize, sample: usize) -> Vec<usize> {
    let n = sample.div_ceil(chunks.max(1)).clamp(1, rows.max(1));
    (0..n).map(|i| i * rows / n).collect()
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
    let per_row = cols / d * s_n;
    // Unweighted, a chunk's energy depends on its code alone: with few codes (the fast-scan
    // codec's 4,096), one table lookup per chunk instead of rebuilding the row.
    let few = cb.entries.checked_pow(s_n as u32).is_some_and(|n| n <= 4096);
    let norms = (importance.is_none() && few).then(|| code_norms(cb));
    let ones = vec![1f32; cols];
    let importance = importance.unwrap_or(&ones);
    let mut rec = vec![0f32; cols];
    for (r, s) in scale.iter_mut().enumerate() {
        let row = &target[r * cols..][..cols];
        let row_codes = &codes[r * per_row..][..per_row];
        let num = weighted_squares(row, importance);
        let den = match &norms {
            Some(norms) => {
                rec.iter_mut().zip(row_codes.chunks_exact(s_n)).for_each(|(n, c)| *n = norms[code_index(cb, c)]);
                lane_sum(&rec[..cols / d])
            }
            None => {
                train::reconstruct_all(cb, row_codes, &mut rec);
                weighted_squares(&rec, importance)
            }
        };
        if den > 0.0 && num > 0.0 {
            *s *= (num / den).sqrt() as f32;
        }
    }
}

/// [`match_energy`] in the output basis: each row's scale keeps `w^T H w`, its output energy
/// over the calibration inputs (`energies` from [`descent::descend`]: the row's and its
/// reconstruction's). On the default model this took next-token KL from 0.00081 to 0.00074 nats
/// against the per-column weighting (docs/LEARNED.md, "Descent and output energy").
fn match_output_energy(scale: &mut [f32], energies: &[(f64, f64)]) {
    for (s, &(num, den)) in scale.iter_mut().zip(energies) {
        if den > 0.0 && num > 0.0 {
            *s *= (num / den).sqrt() as f32;
        }
    }
}

/// `sum_i m_i x_i²` in eight f32 running sums side by side, added in a fixed order (the same
/// bits on every CPU). Each sums a row's ~450 terms of one sign at most (relative error ~1e-5
/// at worst), far inside the f16 a scale is stored in.
fn weighted_squares(x: &[f32], m: &[f32]) -> f64 {
    let mut lanes = [0f32; 8];
    let (xs, ms) = (x.chunks_exact(8), m.chunks_exact(8));
    let tail = xs.remainder().iter().zip(ms.remainder()).map(|(x, m)| m * x * x).sum::<f32>();
    for (x, m) in xs.zip(ms) {
        for l in 0..8 {
            lanes[l] += m[l] * x[l] * x[l];
        }
    }
    lanes.iter().map(|v| f64::from(*v)).sum::<f64>() + f64::from(tail)
}

/// `sum_i x_i` as [`weighted_squares`] sums.
fn lane_sum(x: &[f32]) -> f64 {
    let mut lanes = [0f32; 8];
    let xs = x.chunks_exact(8);
    let tail = xs.remainder().iter().sum::<f32>();
    for x in xs {
        for l in 0..8 {
            lanes[l] += x[l];
        }
    }
    lanes.iter().map(|v| f64::from(*v)).sum::<f64>() + f64::from(tail)
}

/// A code's position in [`code_norms`]: its stages' entries as digits.
fn code_index(cb: &train::Codebooks, code: &[u16]) -> usize {
    code.iter().fold(0, |i, &c| i * cb.entries + usize::from(c))
}

/// `|reconstruction|²` of every code ([`train::reconstruct`]'s sums, then squares in order).
fn code_norms(cb: &train::Codebooks) -> Vec<f32> {
    let n = cb.entries.pow(cb.stages as u32);
    let (mut code, mut rec) = (vec![0u16; cb.stages], vec![0f32; cb.dim]);
    (0..n)
        .map(|i| {
            for (s, c) in code.iter_mut().enumerate() {
                *c = (i / cb.entries.pow((cb.stages - 1 - s) as u32) % cb.entries) as u16;
            }
            train::reconstruct(cb, &code, &mut rec);
            rec.iter().map(|v| v * v).sum()
        })
        .collect()
}

/// The calibration vectors (`[n, cols]`) rotated into the encoding's basis.
fn rotated_inputs(xs: &[f32], cols: usize, rotation: Option<&Rotation>) -> Vec<f32> {
    let mut out = xs.to_vec();
    if let Some(r) = rotation {
        out.chunks_exact_mut(cols).for_each(|x| r.apply(x));
    }
    out
}

/// Each column's `E[x^2]` relative to the mean column's (floored at 1e-4): the encoder's
/// per-column distance weights.
fn importance(xs: &[f32], cols: usize) -> Vec<f32> {
    let mut imp = vec![0f64; cols];
    for x in xs.chunks_exact(cols) {
        for (m, v) in imp.iter_mut().zip(x) {
            *m += f64::from(*v) * f64::from(*v);
        }
    }
    let mean = imp.iter().sum::<f64>() / cols as f64;
    imp.iter().map(|v| ((v / mean.max(1e-30)) as f32).max(1e-4)).collect()
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
