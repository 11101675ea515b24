//! Calibration: the trained default model reads text, every routed expert's inputs are sampled,
//! and VQ3 experts encoded with them reproduce the experts' outputs on those inputs (each weighed
//! by the routing weight its output is mixed in with) better than experts encoded for the plain
//! weight error (the point of calibrating).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k3_convert::calibrate::{CalibrationPlan, Walker};
use k3_convert::{ConvertOptions, ExpertFormat, convert};
use k3_engine::weights::{Rotations, expert_matrix};
use k3_format::Model;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// `sum g^2 ||W x - W' x||^2` over `xs` and their gates `g`, matrix `w` of expert (layer, expert)
/// in models `a` and `b`: the error as it reaches the residual stream.
fn output_error(a: &Model, b: &Model, (layer, expert): (u32, u32), w: &str, xs: &[f32], gates: &[f32]) -> f64 {
    let (ra, rb) = (Rotations::for_model(a), Rotations::for_model(b));
    let (mut ba, mut bb) = (Vec::new(), Vec::new());
    let (la, lb) = (a.expert(layer, expert).unwrap(), b.expert(layer, expert).unwrap());
    a.read_expert(&la, &mut ba).unwrap();
    b.read_expert(&lb, &mut bb).unwrap();
    let (va, vb) = (la.parse(&ba, true).unwrap(), lb.parse(&bb, true).unwrap());
    let ma = expert_matrix(w, va.matrix(w).unwrap(), &ra).unwrap();
    let mb = expert_matrix(w, vb.matrix(w).unwrap(), &rb).unwrap();
    let rows = ma.rows();
    let (mut ya, mut yb) = (vec![0f32; rows], vec![0f32; rows]);
    let mut err = 0f64;
    for (x, g) in xs.chunks_exact(xs.len() / gates.len()).zip(gates) {
        ma.matvec(x, &mut ya);
        mb.matvec(x, &mut yb);
        err += f64::from(g * g) * ya.iter().zip(&yb).map(|(p, q)| f64::from(p - q).powi(2)).sum::<f64>();
    }
    err
}

/// The default model (its path and the opened model) and its held-out text's token ids.
fn default_model() -> (PathBuf, Model, Vec<u32>) {
    let source = fixtures().join("default.waste");
    let model = Model::open(&source).unwrap();
    let tok = k3_generate::model_tokenizer(&model).unwrap().unwrap();
    let text = std::fs::read_to_string(fixtures().join("default-model/heldout.txt")).unwrap();
    let ids = tok.encode(&text);
    (source, model, ids)
}

#[test]
fn calibrated_vq3_experts_err_less_on_the_inputs_they_see() {
    let (source, model, ids) = default_model();
    let ids = &ids[..2048];
    let plan = Arc::new(CalibrationPlan { source: source.clone(), ids: ids.to_vec(), window: 256, cap: 256 });
    let mut walker = Walker::new(&model, &plan).unwrap();
    let layers: Vec<_> = model.manifest().architecture.moe_layers.iter().map(|&l| walker.layer(l).unwrap()).collect();
    let inputs: u64 = layers.iter().map(|c| c.report().inputs).sum();
    let moe = layers.len() as u64;
    assert_eq!(inputs, 2048 * 4 * moe, "every token's four experts at every MoE layer");
    // Every kept input has its routing weight: positive, and not one value for all (top-4 of a
    // sigmoid router, renormalized, gives each token's experts different shares).
    let s = layers[0].inputs(0).unwrap();
    assert_eq!(s.gates.len(), s.len());
    assert!(s.gates.iter().all(|g| g.is_finite() && *g > 0.0), "{:?}", s.gates);
    assert!(s.gates.iter().any(|g| *g != s.gates[0]), "{:?}", s.gates);

    let d = tempfile::tempdir().unwrap();
    let plain = ConvertOptions { experts: ExpertFormat::Vq3, ..ConvertOptions::new(&source, d.path().join("plain")) };
    convert(&plain, &mut |_| {}).unwrap();
    let calibrated = ConvertOptions {
        experts: ExpertFormat::Vq3,
        calibration: Some(plan.clone()),
        ..ConvertOptions::new(&source, d.path().join("calibrated"))
    };
    convert(&calibrated, &mut |_| {}).unwrap();
    let (p, c) = (Model::open(d.path().join("plain")).unwrap(), Model::open(d.path().join("calibrated")).unwrap());

    // w1's error on the inputs each expert saw, summed over the experts the text routed to.
    let (mut err_plain, mut err_cal) = (0f64, 0f64);
    for cal in &layers {
        let layer = cal.layer();
        for e in 0..model.manifest().architecture.experts {
            let Some(s) = cal.inputs(e) else { continue };
            err_plain += output_error(&model, &p, (layer, e), "w1", &s.vectors, &s.gates);
            err_cal += output_error(&model, &c, (layer, e), "w1", &s.vectors, &s.gates);
        }
    }
    eprintln!("w1 output error on the calibration inputs: plain {err_plain:.4e}, calibrated {err_cal:.4e}");
    assert!(err_cal < 0.9 * err_plain, "calibrated {err_cal} vs plain {err_plain}");
}

/// A calibrated model says so, and which calibration: converting into its directory again with
/// another calibration, or none, is refused (a resumed conversion is held to the same spec, so it
/// cannot mix experts encoded for two samples); the same calibration finds the model complete.
#[test]
fn a_calibrated_conversion_is_held_to_its_calibration() {
    let (source, _, ids) = default_model();
    let sample = |from: usize| {
        Arc::new(CalibrationPlan { source: source.clone(), ids: ids[from..from + 512].to_vec(), window: 256, cap: 256 })
    };
    let (a, b) = (sample(0), sample(512));
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let opts = |cal: Option<&Arc<CalibrationPlan>>| ConvertOptions {
        experts: ExpertFormat::Vq3,
        calibration: cal.cloned(),
        ..ConvertOptions::new(&source, &out)
    };
    convert(&opts(Some(&a)), &mut |_| {}).unwrap();
    let recorded = Model::open(&out).unwrap().manifest().provenance["options"]["calibration"].clone();
    assert_eq!(recorded, a.provenance(), "the model records its calibration");
    assert_ne!(a.provenance()["ids_xxh3"], b.provenance()["ids_xxh3"], "two samples, two fingerprints");
    for other in [Some(&b), None] {
        let err = convert(&opts(other), &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("converted with other options"), "{err}");
    }
    convert(&opts(Some(&a)), &mut |_| {}).unwrap();
}

/// A calibrated conversion stopped part way resumes to the same bytes as one that ran through:
/// the walk passes the layers already written without encoding them again.
#[test]
fn an_interrupted_calibrated_conversion_resumes_to_identical_bytes() {
    let (source, _, ids) = default_model();
    let plan = Arc::new(CalibrationPlan { source: source.clone(), ids: ids[..1024].to_vec(), window: 256, cap: 256 });
    let d = tempfile::tempdir().unwrap();
    let opts = |out: &str| ConvertOptions {
        experts: ExpertFormat::Vq3,
        calibration: Some(plan.clone()),
        ..ConvertOptions::new(&source, d.path().join(out))
    };
    let whole = convert(&opts("whole"), &mut |_| {}).unwrap();
    assert_eq!(whole.calibrated.len(), 3);
    // Stop two thirds into the experts, after a second (progress is journaled every second).
    let mut slept = false;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        convert(&opts("cut"), &mut |p| {
            if p.phase == "experts" && p.done * 2 > p.total && !slept {
                std::thread::sleep(std::time::Duration::from_millis(1100));
                slept = true;
            }
            if p.phase == "experts" && p.done * 3 > p.total * 2 {
                panic!("interrupted");
            }
        })
    }));
    assert!(r.is_err());
    let resumed = convert(&opts("cut"), &mut |_| {}).unwrap();
    assert!(resumed.resumed_items > 0);
    assert!(resumed.calibrated.len() < 3, "layers already written are not calibrated again: {:?}", resumed.calibrated);
    for f in ["experts-00000.waste", "trunk.waste"] {
        let (a, b) = (
            std::fs::read(d.path().join("whole").join(f)).unwrap(),
            std::fs::read(d.path().join("cut").join(f)).unwrap(),
        );
        assert!(a == b, "{f} differs after resuming");
    }
}
