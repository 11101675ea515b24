//! The drive's ceiling that `bench decode`'s "vs bound" column divides by, and whether it can be
//! trusted: measured with the engine's read size and queue depth before the runs and again after
//! them (a host-cached or throttled drive drifts: the same 800 MiB/s throttle once measured 0.26
//! and once 0.77 GB/s), each time in repetitions of 2 GB. The ratio is reported only when every
//! sample lies within [`MAX_SPREAD`] of the median.

use anyhow::Result;
use serde_json::{Value, json};

use crate::bench::io;

/// Largest (max - min) / median of the ceiling's samples for a ratio to be reported.
pub const MAX_SPREAD: f64 = 0.10;

#[derive(Debug, Clone, Default)]
pub struct Ceiling {
    /// GB/s, in the order measured (before the runs, then after).
    pub samples: Vec<f64>,
    /// Samples taken before the runs.
    pub before: usize,
}

impl Ceiling {
    /// Adds `o.reps` samples of the O_DIRECT ceiling (fio, or the raw io_uring loop without it).
    pub fn measure(&mut self, o: &io::Options) -> Result<()> {
        let got = io::ceiling_samples(o)?;
        anyhow::ensure!(!got.is_empty(), "the drive's ceiling could not be measured");
        self.samples.extend(got);
        Ok(())
    }

    pub fn median(&self) -> f64 {
        crate::bench::median(self.samples.clone())
    }

    /// (max - min) / median of the samples.
    pub fn spread(&self) -> f64 {
        let max = self.samples.iter().copied().fold(f64::MIN, f64::max);
        let min = self.samples.iter().copied().fold(f64::MAX, f64::min);
        (max - min) / self.median()
    }

    pub fn stable(&self) -> bool {
        self.samples.len() >= 2 && self.spread() <= MAX_SPREAD
    }

    pub fn to_json(&self) -> Value {
        json!({
            "median_gbps": self.median(), "samples_gbps": self.samples, "samples_before_runs": self.before,
            "spread": self.spread(), "max_spread": MAX_SPREAD, "stable": self.stable(),
        })
    }

    /// One line for a person: the ceiling and its spread, and the verdict.
    pub fn describe(&self) -> String {
        let verdict = if self.stable() {
            "stable".to_string()
        } else {
            format!("NOT stable (over {:.0}%): the vs-bound column is withheld", MAX_SPREAD * 100.0)
        };
        format!(
            "O_DIRECT ceiling {:.3} GB/s (median of {} samples, {} before and {} after the runs), spread {:.1}%: {verdict}",
            self.median(),
            self.samples.len(),
            self.before,
            self.samples.len() - self.before,
            self.spread() * 100.0
        )
    }
}

/// Withholds every variant's I/O-bound figures when the ceiling is not stable.
pub fn apply(report: &mut Value, c: &Ceiling) {
    report["ceiling_gbps"] = json!(c.median());
    report["ceiling"] = c.to_json();
    let Some(variants) = report["variants"].as_object_mut() else { return };
    for v in variants.values_mut() {
        let bpt = v["bytes_per_token"].as_f64().unwrap_or(0.0);
        let tps = v["tok_per_s"].as_f64().unwrap_or(0.0);
        if c.stable() && bpt > 0.0 {
            let bound = c.median() * 1e9 / bpt;
            v["io_bound_tok_per_s"] = json!(bound);
            v["io_bound_ratio"] = json!(tps / bound);
        } else {
            v["io_bound_tok_per_s"] = Value::Null;
            v["io_bound_ratio"] = Value::Null;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drifting_ceiling_withholds_the_ratio() {
        let mut report = json!({"variants": {"overlap": {"bytes_per_token": 1e9, "tok_per_s": 0.5}}});
        let steady = Ceiling { samples: vec![0.80, 0.82, 0.79, 0.81], before: 2 };
        apply(&mut report, &steady);
        assert!((report["variants"]["overlap"]["io_bound_ratio"].as_f64().unwrap() - 0.5 / 0.805).abs() < 1e-9);
        let drifting = Ceiling { samples: vec![0.77, 0.78, 0.26, 0.30], before: 2 };
        assert!(!drifting.stable());
        apply(&mut report, &drifting);
        assert!(report["variants"]["overlap"]["io_bound_ratio"].is_null());
        assert_eq!(report["ceiling"]["stable"], json!(false));
        assert!(!Ceiling { samples: vec![0.8], before: 1 }.stable(), "one sample says nothing of its spread");
    }
}
