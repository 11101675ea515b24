//! Runtime CPU-feature dispatch: one binary runs everywhere, the fast path where the CPU has it.

use std::sync::OnceLock;

/// The instruction-set level kernels may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Scalar,
    /// AVX2 + FMA + F16C (Haswell, Zen and later).
    Avx2,
}

/// The level in use: the best the CPU has, unless `K3_SIMD=scalar` forces the scalar references
/// (for measuring what SIMD buys, and for debugging).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        if std::env::var("K3_SIMD").is_ok_and(|v| v == "scalar") {
            return Level::Scalar;
        }
        detect()
    })
}

/// What the CPU supports, ignoring overrides.
pub fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
            return Level::Avx2;
        }
    }
    Level::Scalar
}

/// `want`, if the CPU supports it; panics otherwise (running AVX2 code on a CPU without it
/// would be undefined behaviour). Used by the `*_at` entry points that tests and benchmarks call
/// to pick a kernel explicitly.
#[track_caller]
pub fn supported(want: Level) -> Level {
    assert!(want == Level::Scalar || detect() == want, "this CPU does not support {want:?}");
    want
}
