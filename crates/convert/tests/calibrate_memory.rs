//! The calibration walk's memory bound, held: a calibrated conversion of a K3-shaped model
//! (`k3-tiny`: AttnRes, LatentMoE, 3 MoE layers) grows this process's peak resident memory by no
//! more than its `calibrate::PeakMemory` (and a fixed 64 MiB allowance for the allocator and the
//! written records), which is less than the old pass's samples of every layer at once.
//! Its own test binary: the peak is the process's.

use std::path::Path;
use std::sync::Arc;

use k3_convert::calibrate::{CalibrationPlan, Walker};
use k3_convert::{ConvertOptions, ExpertFormat, convert};

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
}

#[test]
fn a_calibrated_conversion_stays_within_its_bound() {
    let d = tempfile::tempdir().unwrap();
    let source = d.path().join("k3-tiny");
    let preset = k3_convert::synth::preset("k3-tiny").unwrap();
    k3_convert::synth::synth(&preset, k3_convert::synth::SynthExperts::Mxfp4, &source, &mut |_| {}).unwrap();
    // 32 K tokens: 131,072 routed inputs a layer, 128-wide (the latent).
    let ids: Vec<u32> = (0..32768u32).map(|i| i.wrapping_mul(2_654_435_761) % 512).collect();
    let cap = 4096;
    let plan = Arc::new(CalibrationPlan { source: source.clone(), ids, window: 256, cap });
    let model = k3_format::Model::open(&source).unwrap();
    let arch = model.manifest().architecture.clone();
    let peak = Walker::new(&model, &plan).unwrap().peak();
    assert_eq!(peak.samples, (32768 * 4 + cap as u64) * 129 * 4, "one layer: every routed input, and the pool");
    let bound = peak.total() + (64 << 20);
    // The same run holding every layer's samples at once (the old pass) would need more: the
    // bound can tell the two apart.
    let every_layer = arch.moe_layers.len() as u64 * peak.samples;
    let old = peak.total() - peak.samples + every_layer;
    assert!(bound < old, "the bound {bound} must be below the old pass's {old}");

    // Reset the high-water mark to what the process holds now (Linux: "5" to clear_refs).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = status_kb("VmRSS:") * 1024;
    let opts = ConvertOptions {
        experts: ExpertFormat::Vq3,
        calibration: Some(plan),
        ..ConvertOptions::new(&source, d.path().join("vq3"))
    };
    let report = convert(&opts, &mut |_| {}).unwrap();
    let grew = (status_kb("VmHWM:") * 1024).saturating_sub(before);
    eprintln!("peak grew {grew} bytes; bound {bound} ({peak:?}); every layer's samples at once {every_layer}");
    assert_eq!(report.calibrated.len(), arch.moe_layers.len());
    assert!(grew <= bound, "peak resident memory grew {grew} bytes, over the bound {bound}");
    assert!(Path::new(&d.path().join("vq3")).exists());
}
