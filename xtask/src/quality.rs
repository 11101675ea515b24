//! `cargo xtask quality`: how much each 3-4 bit encoding loses, on (a) the linear layers of a real
//! trained transformer with its activations on real text (captured by
//! `tools/quality/minilm_capture.py`) and (b) MXFP4-grid matrices shaped like K3's experts,
//! re-encoded from MXFP4 (the error that matters for K3 is against the MXFP4 weights).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use k3_quant::encode::EncodeOptions;
use k3_quant::rng::gaussian;
use k3_quant::vq::Codec;
use k3_quant::{dense, mxfp4, rtn};
use rayon::prelude::*;
use serde_json::{Value, json};

/// An encoding under test: turns `w` into its reconstruction, given calibration activations.
struct Method {
    name: &'static str,
    apply: fn(&[f32], usize, &[f32]) -> Vec<f32>,
}

fn vq_with(codec: Codec, w: &[f32], cols: usize, calib: Option<&[f32]>) -> Vec<f32> {
    let mut opts = EncodeOptions::default();
    if let Some(b) = std::env::var("K3_VQ_BEAM").ok().and_then(|v| v.parse().ok()) {
        opts.beam = b;
    }
    if let Some(r) = std::env::var("K3_VQ_ROTATION").ok().and_then(|v| v.parse().ok()) {
        opts.rotation_block = r;
    }
    if let Some(r) = std::env::var("K3_VQ_ROUNDS").ok().and_then(|v| v.parse().ok()) {
        opts.refine_rounds = r;
    }
    if let Some(xs) = calib {
        opts = opts.calibrated(xs, cols).expect("shapes were checked");
    }
    k3_quant::encode::encode(codec, w, cols, &opts).expect("shapes were checked").decode()
}

fn mx(w: &[f32], cols: usize) -> Vec<f32> {
    let (p, s) = mxfp4::quantize(w, cols);
    let mut out = vec![0f32; w.len()];
    for (r, o) in out.chunks_exact_mut(cols).enumerate() {
        mxfp4::decode_row(&p[r * cols / 2..][..cols / 2], &s[r * cols / 32..][..cols / 32], o);
    }
    out
}

const METHODS: [Method; 6] = [
    Method { name: "mxfp4", apply: |w, c, _| mx(w, c) },
    Method { name: "rtn3_g32_f16", apply: |w, c, _| rtn::roundtrip(w, c, 3, 32, rtn::Scale::Few) },
    Method { name: "vq_a", apply: |w, c, _| vq_with(Codec::FastScan, w, c, None) },
    Method { name: "vq_a+act", apply: |w, c, x| vq_with(Codec::FastScan, w, c, Some(x)) },
    Method { name: "vq_b", apply: |w, c, _| vq_with(Codec::Residual, w, c, None) },
    Method { name: "vq_b+act", apply: |w, c, x| vq_with(Codec::Residual, w, c, Some(x)) },
];

fn read_f32(path: &Path) -> Result<Vec<f32>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

/// `(||W - V||_F / ||W||_F, ||(W - V) X|| / ||W X||)` over the rows of `xs`.
fn errors(w: &[f32], v: &[f32], cols: usize, xs: &[f32]) -> (f64, f64) {
    let frob = (w.iter().zip(v).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>()
        / w.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>())
    .sqrt();
    let diff: Vec<f32> = w.iter().zip(v).map(|(a, b)| a - b).collect();
    let rows = w.len() / cols;
    let (num, den) = xs
        .par_chunks_exact(cols)
        .map(|x| {
            let (mut yd, mut yw) = (vec![0f32; rows], vec![0f32; rows]);
            dense::matvec_f32(&diff, x, &mut yd);
            dense::matvec_f32(w, x, &mut yw);
            (
                yd.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>(),
                yw.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>(),
            )
        })
        .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
    (frob, (num / den).sqrt())
}

/// (a): every captured layer; calibration on the first half of the tokens, errors on the second.
fn real_model(dir: &Path, max_layers: usize) -> Result<Value> {
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).with_context(|| {
        format!("{}: run `python3 tools/quality/minilm_capture.py {}` first", dir.display(), dir.display())
    })?)?;
    let all = manifest["layers"].as_array().context("manifest has no layers")?;
    // Spread a subset over the depth rather than taking the first layers.
    let step = all.len().div_ceil(max_layers.max(1)).max(1);
    let layers: Vec<&Value> = all.iter().step_by(step).collect();
    let mut sums = vec![(0f64, 0f64); METHODS.len()];
    let mut per_layer = Vec::new();
    for l in &layers {
        let cols = l["cols"].as_u64().context("cols")? as usize;
        let tokens = l["tokens"].as_u64().context("tokens")? as usize;
        let w = read_f32(&dir.join(l["w"].as_str().context("w")?))?;
        let x = read_f32(&dir.join(l["x"].as_str().context("x")?))?;
        let (calib, eval) = x.split_at(tokens / 2 * cols);
        let mut row = serde_json::Map::new();
        for (m, sum) in METHODS.iter().zip(sums.iter_mut()) {
            let v = (m.apply)(&w, cols, calib);
            let (f, o) = errors(&w, &v, cols, eval);
            sum.0 += f;
            sum.1 += o;
            row.insert(m.name.to_string(), json!({"rel_frobenius": f, "rel_output": o}));
        }
        eprintln!("  {}", l["name"].as_str().unwrap_or_default());
        per_layer.push(json!({"name": l["name"], "errors": row}));
    }
    let n = layers.len() as f64;
    let mean: serde_json::Map<String, Value> = METHODS
        .iter()
        .zip(&sums)
        .map(|(m, s)| (m.name.to_string(), json!({"rel_frobenius": s.0 / n, "rel_output": s.1 / n})))
        .collect();
    Ok(
        json!({"source": manifest["model"], "text": manifest["text"], "layers": layers.len(), "mean": mean, "per_layer": per_layer}),
    )
}

/// (b): Gaussian weights put on the MXFP4 grid, then re-encoded; errors against the MXFP4 weights,
/// outputs on Gaussian activations; encoder wall time per matrix.
fn k3_shaped(rows: usize, cols: usize) -> Value {
    let g = gaussian(rows * cols, 42);
    let w = mx(&g, cols);
    let xs = gaussian(64 * cols, 43);
    let mut out = serde_json::Map::new();
    for m in METHODS.iter().filter(|m| !m.name.ends_with("+act") && m.name != "mxfp4") {
        let t = Instant::now();
        let v = (m.apply)(&w, cols, &[]);
        let secs = t.elapsed().as_secs_f64();
        let (f, o) = errors(&w, &v, cols, &xs);
        eprintln!("  {rows}x{cols} {}: {secs:.1} s", m.name);
        out.insert(m.name.to_string(), json!({"rel_frobenius": f, "rel_output": o, "encode_seconds": secs}));
    }
    json!({"shape": [rows, cols], "threads": rayon::current_num_threads(), "errors": out})
}

pub fn run(data: &Path, max_layers: usize, k3: bool, json_out: bool) -> Result<()> {
    let mut report = serde_json::Map::new();
    if data.join("manifest.json").exists() || !k3 {
        eprintln!("real model ({}):", data.display());
        report.insert("real_model".into(), real_model(data, max_layers)?);
    }
    if k3 {
        eprintln!("K3-shaped MXFP4 matrices:");
        report.insert("k3_mxfp4_grid".into(), json!([k3_shaped(3072, 3584)]));
    }
    let report = Value::Object(report);
    if json_out {
        println!("{report}");
        return Ok(());
    }
    if let Some(r) = report.get("real_model") {
        println!(
            "(a) {} on {}: {} layers, mean relative errors (output error on held-out tokens)",
            r["source"], r["text"], r["layers"]
        );
        let rtn = r["mean"]["rtn3_g32_f16"]["rel_output"].as_f64().unwrap_or(1.0);
        println!("{:<14} {:>10} {:>10} {:>12}", "method", "frobenius", "output", "output/rtn3");
        for m in METHODS {
            let e = &r["mean"][m.name];
            let o = e["rel_output"].as_f64().unwrap_or(0.0);
            println!(
                "{:<14} {:>10.4} {:>10.4} {:>12.3}",
                m.name,
                e["rel_frobenius"].as_f64().unwrap_or(0.0),
                o,
                o / rtn
            );
        }
    }
    if let Some(list) = report.get("k3_mxfp4_grid").and_then(Value::as_array) {
        for k in list {
            println!("(b) MXFP4-grid matrix {} re-encoded ({} threads):", k["shape"], k["threads"]);
            println!("{:<14} {:>10} {:>10} {:>12}", "method", "frobenius", "output", "encode s");
            for (name, e) in k["errors"].as_object().into_iter().flatten() {
                println!(
                    "{name:<14} {:>10.4} {:>10.4} {:>12.1}",
                    e["rel_frobenius"].as_f64().unwrap_or(0.0),
                    e["rel_output"].as_f64().unwrap_or(0.0),
                    e["encode_seconds"].as_f64().unwrap_or(0.0)
                );
            }
        }
    }
    Ok(())
}
