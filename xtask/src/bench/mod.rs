//! `cargo xtask bench ...`: measurements run side by side in one process, medians reported.

pub mod attn;
pub mod decode;
pub mod io;
pub mod kernels;
pub mod threads;
pub mod verify;

use std::time::Instant;

/// Median of a non-empty sample.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Seconds taken by `f`.
pub fn time(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// The CPU clock the kernel reports (virtual machines report the nominal clock).
pub fn cpu_mhz() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().parse().ok()
}

/// Single-core streaming read bandwidth over `bytes` (far beyond the caches), GB/s, median of `reps`.
pub fn mem_read_gbps(bytes: usize, reps: usize) -> f64 {
    let buf: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut samples = Vec::new();
    for _ in 0..reps {
        let mut acc = [0u64; 8];
        let t = time(|| {
            for c in buf.chunks_exact(8) {
                for (a, v) in acc.iter_mut().zip(c) {
                    *a = a.wrapping_add(*v);
                }
            }
        });
        std::hint::black_box(acc);
        samples.push(bytes as f64 / t / 1e9);
    }
    median(samples)
}
