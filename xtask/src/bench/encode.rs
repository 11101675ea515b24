//! `cargo xtask bench encode`: the VQ3 encoder on one K3-shaped expert matrix (3072 x 3584,
//! weights on MXFP4's grid, as K3's experts arrive, handed over as the converter does), in
//! core-seconds (a one-thread pool), with the encoding's relative weight error, and the
//! full-model conversions that rate implies; with `--calibrated N`, as a calibrated conversion
//! encodes it (N sampled inputs prepared, then GPTQ and descent).

use k3_quant::encode::{EncodeOptions, products};
use k3_quant::mxfp4;
use k3_quant::rng::noise;
use k3_quant::vq::{self, Codec};
use serde_json::{Value, json};

use super::{median, time};

const ROWS: usize = 3072;
const COLS: usize = 3584;
/// K3: 82,432 routed experts (92 MoE layers x 896), K2: 23,040 (60 x 384); three matrices each.
const K3_MATRICES: f64 = 82_432.0 * 3.0;
const K2_MATRICES: f64 = 23_040.0 * 3.0;
/// A K2 expert matrix (2048 x 7168) against the K3 one measured.
const K2_SIZE: f64 = (2048.0 * 7168.0) / (ROWS as f64 * COLS as f64);

/// Gaussian weights of about K3's scale, rounded to the MXFP4 grid.
fn k3_like() -> Vec<f32> {
    let w: Vec<f32> = noise(ROWS * COLS, 11, 0.02);
    let (packed, scale) = mxfp4::quantize(&w, COLS);
    let mut out = vec![0f32; ROWS * COLS];
    for (r, o) in out.chunks_exact_mut(COLS).enumerate() {
        mxfp4::decode_row(&packed[r * COLS / 2..][..COLS / 2], &scale[r * COLS / 32..][..COLS / 32], o);
    }
    out
}

/// `n` inputs like an expert's: unit Gaussian channels, every 64th eight times larger (the few
/// large channels of real hidden states), so the second moments are far from a multiple of I.
fn inputs(n: usize) -> Vec<f32> {
    let mut xs = noise(n * COLS, 12, 1.0);
    xs.chunks_exact_mut(COLS).for_each(|x| x.iter_mut().step_by(64).for_each(|v| *v *= 8.0));
    xs
}

/// `|a - b| / |a|` over all entries.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(a, b)| f64::from(a - b).powi(2)).sum();
    let den: f64 = a.iter().map(|a| f64::from(*a).powi(2)).sum();
    (num / den).sqrt()
}

/// The encoding's relative weight error and, given the calibration inputs, its relative output
/// error `|X (W - Q)^T| / |X W^T|`: what calibration minimizes, at K3's shape.
fn errors(w: &[f32], m: &vq::VqMatrix, xs: Option<&[f32]>) -> (f64, Option<f64>) {
    let q = m.decode();
    let out = xs.map(|xs| rel_l2(&products(xs, w, COLS), &products(xs, &q, COLS)));
    (rel_l2(w, &q), out)
}

pub fn run(reps: usize, opts: &EncodeOptions, calibrated: Option<usize>, json: bool) -> anyhow::Result<Value> {
    let w = k3_like();
    let xs = calibrated.map(inputs);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let (mut secs, mut prep_secs) = (Vec::new(), Vec::new());
    let (mut err, mut out_err) = (0.0, None);
    for rep in 0..reps {
        if !json {
            eprintln!("  rep {rep}");
        }
        let mut opts = opts.clone();
        if let Some(xs) = &xs {
            let mut c = None;
            prep_secs.push(time(|| c = Some(one.install(|| opts.clone().calibrated(xs, COLS)))));
            opts = c.expect("ran").map_err(anyhow::Error::msg)?;
        }
        // The matrix as a converter hands it over: decoded into memory of its own, which the
        // encoder works in (the copy is the decoder's, outside the timing).
        let (mut m, own) = (None, w.clone());
        secs.push(time(|| m = Some(one.install(|| k3_quant::encode::encode_owned(Codec::FastScan, own, COLS, &opts)))));
        (err, out_err) = errors(&w, &m.expect("ran").map_err(anyhow::Error::msg)?, xs.as_deref());
    }
    let t = median(secs);
    // An expert's inputs are prepared twice: once for w1 and w3, once for w2.
    let prep = if prep_secs.is_empty() { 0.0 } else { median(prep_secs) };
    let per_matrix = t + prep * 2.0 / 3.0;
    let project = |matrices: f64, size: f64, cores: f64| matrices * size * per_matrix / cores / 3600.0;
    // Calibrated, the cost grows as rows x cols^2 (and the preparation as cols^3), not with the
    // size: K2's 2048 x 7168 matrices are not this one scaled, so only K3 is projected (its w2,
    // 3584 x 3072, costs ~0.86x of this shape's rows x cols^2).
    let k2 = |cores: f64| calibrated.is_none().then(|| project(K2_MATRICES, K2_SIZE, cores));
    let cores = [2.0, 8.0, 16.0, 64.0];
    let report = json!({
        "matrix": format!("{ROWS}x{COLS}"),
        "codec": Codec::FastScan.name(),
        "beam": opts.beam, "refine_rounds": opts.refine_rounds, "kmeans_iters": opts.kmeans_iters,
        "calibration_samples": calibrated,
        "core_seconds": t,
        "prepare_core_seconds": prep,
        "relative_weight_error": err,
        "relative_output_error": out_err,
        "hours": cores.iter().map(|&c| json!({
            "cores": c, "k3": project(K3_MATRICES, 1.0, c), "k2": k2(c),
        })).collect::<Vec<Value>>(),
    });
    if json {
        return Ok(report);
    }
    let mut out = format!(
        "VQ3 ({}, beam {}, {} refinement rounds, {} k-means iterations) encode of one {ROWS}x{COLS} matrix: \
         {t:.2} core-seconds (median of {reps}), relative weight error {err:.4}\n",
        Codec::FastScan.name(),
        opts.beam,
        opts.refine_rounds,
        opts.kmeans_iters
    );
    if let Some(n) = calibrated {
        out.push_str(&format!(
            "calibrated on {n} inputs: their preparation {prep:.2} core-seconds (one per w1+w3, one per w2); \
             relative output error {:.4}\n",
            out_err.unwrap_or(f64::NAN)
        ));
    }
    out.push_str("full conversion, hours:   cores      K3 (247,296 matrices)   K2 (69,120 matrices)\n");
    for c in cores {
        let k2 = k2(c).map_or("(not projected)".to_string(), |h| format!("{h:>10.1}"));
        out.push_str(&format!(
            "                         {c:>5}      {:>10.1}              {k2}\n",
            project(K3_MATRICES, 1.0, c)
        ));
    }
    print!("{out}");
    Ok(report)
}
