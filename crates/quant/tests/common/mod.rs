//! Shared helpers for the kernel property tests.
#![allow(dead_code)]

use k3_quant::cpu::{Level, detect, levels};

/// The fastest level, which these tests compare against the references. On x86_64 CI machines it
/// must be at least AVX2: a test run that silently compared the references with themselves would
/// prove nothing.
pub fn fast() -> Level {
    let l = detect();
    if cfg!(target_arch = "x86_64") && std::env::var_os("K3_ALLOW_NO_SIMD").is_none() {
        assert!(levels().len() > 1, "these tests need AVX2+FMA+F16C (set K3_ALLOW_NO_SIMD=1 to run without)");
    }
    l
}

/// Every SIMD level this CPU runs (AVX2, and AVX-512 where present): kernels with a version
/// per level are compared with the reference at each.
pub fn simd_levels() -> Vec<Level> {
    fast();
    levels().into_iter().filter(|l| *l != Level::Scalar).collect()
}

/// Worst-case bound on the difference of two f32 sums of the same `n` terms in different orders:
/// each is within `(n-1) eps sum|t|` of the exact sum.
pub fn sum_tolerance(n: usize, abs_sum: f64) -> f64 {
    2.0 * n as f64 * f64::from(f32::EPSILON) * abs_sum + 1e-30
}

#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], tol: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, ((g, w), t)) in got.iter().zip(want).zip(tol).enumerate() {
        let d = (f64::from(*g) - f64::from(*w)).abs();
        assert!(d <= *t, "element {i}: {g} vs {w} (diff {d:e} > tolerance {t:e})");
    }
}

/// `W x` for each of `xs`' vectors with f32 activations as given, through the scalar f32
/// reference (`dense` the decoded weights, `[rows, cols]`): what rounded activations are
/// compared with.
pub fn exact_products(dense: &[f32], xs: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut exact = vec![0f32; xs.len() / cols * rows];
    for (xv, y) in xs.chunks(cols).zip(exact.chunks_mut(rows)) {
        k3_quant::dense::matvec_f32_at(Level::Scalar, dense, xv, y);
    }
    exact
}
