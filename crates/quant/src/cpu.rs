//! Runtime CPU-feature dispatch: one binary runs everywhere, the fast path where the CPU has it.

use std::sync::OnceLock;

/// The instruction-set level kernels may use.
/// Each level includes the ones below it; kernels without a wider version run their AVX2 code
/// at `Avx512`. Dispatches match every level by name, so a new level cannot silently fall back to
/// the scalar references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Scalar,
    /// AVX2 + FMA + F16C + POPCNT (Haswell, Zen and later).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 plus AVX-512 F, BW, VL, VNNI and VBMI (Ice Lake, Sapphire Rapids, Zen 4 and later).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Level {
    /// The level's name, as `K3_SIMD` takes it (`avx512` is the level's full set above).
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512",
        }
    }
}

/// The level in use: the best the CPU has, unless `K3_SIMD` caps it (`scalar` or `avx2`: for
/// measuring what each level buys, and for debugging).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| match std::env::var("K3_SIMD").as_deref() {
        Ok("scalar") => Level::Scalar,
        #[cfg(target_arch = "x86_64")]
        Ok("avx2") => detect().min(Level::Avx2),
        _ => detect(),
    })
}

/// Every level this CPU runs, lowest first: what the property tests compare with each other.
pub fn levels() -> Vec<Level> {
    #[cfg(target_arch = "x86_64")]
    let all = [Level::Scalar, Level::Avx2, Level::Avx512];
    #[cfg(not(target_arch = "x86_64"))]
    let all = [Level::Scalar];
    all.into_iter().filter(|l| *l <= detect()).collect()
}

/// What the CPU supports, ignoring overrides (probed once: every `*_at` entry point asks).
pub fn detect() -> Level {
    static DETECTED: OnceLock<Level> = OnceLock::new();
    *DETECTED.get_or_init(probe)
}

fn probe() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("popcnt");
        let avx512 = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512vbmi");
        match (avx2, avx512) {
            (true, true) => return Level::Avx512,
            (true, false) => return Level::Avx2,
            _ => {}
        }
    }
    Level::Scalar
}

/// `want`, if the CPU supports it; panics otherwise (running AVX2 code on a CPU without it
/// would be undefined behaviour). Used by the `*_at` entry points that tests and benchmarks call
/// to pick a kernel explicitly.
#[track_caller]
pub fn supported(want: Level) -> Level {
    assert!(want <= detect(), "this CPU does not support {want:?}");
    want
}
