//! Shared by the engine's tests.

use std::path::Path;

/// A synthetic preset written once per test binary into cargo's per-target scratch directory
/// (not a `TempDir` held by a static: statics are never dropped, so that leaked into /tmp), at
/// `cell`'s first use.
#[allow(dead_code)]
pub fn synthetic(cell: &'static std::sync::OnceLock<std::path::PathBuf>, name: &str) -> std::path::PathBuf {
    cell.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("synth-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        let p = k3_convert::synth::preset(name).unwrap();
        k3_convert::synth::synth(&p, p.experts_default, &dir, &mut |_| {}).unwrap();
        dir
    })
    .clone()
}

/// The relative L2 error of `a` against the reference `b` (the golden references' measure).
#[allow(dead_code)]
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}
