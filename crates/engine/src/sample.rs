//! Choosing the next token from logits: greedy, or temperature with top-k and top-p, from a
//! seeded generator (the same seed gives the same text).

use k3_quant::rng::XorShift;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy (argmax, lower id on ties).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the most likely tokens until their probability reaches `top_p` (1 = all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplerConfig {
    /// Refuses settings that would sample garbage: a temperature that is negative or not a
    /// number, a top-p outside (0, 1].
    pub fn check(&self) -> Result<(), String> {
        check_temperature(self.temperature)?;
        check_top_p(self.top_p)?;
        Ok(())
    }
}

/// A temperature: finite and >= 0 (0 = greedy).
pub fn check_temperature(t: f32) -> Result<f32, String> {
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err(format!("{t} is not a temperature: give a number >= 0 (0 = greedy)"))
    }
}

/// A nucleus mass: in (0, 1] (1 = every token).
pub fn check_top_p(p: f32) -> Result<f32, String> {
    if p > 0.0 && p <= 1.0 {
        Ok(p)
    } else {
        Err(format!("{p} is not a top-p: give a probability mass in (0, 1] (1 = off)"))
    }
}

#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: XorShift,
}

impl Sampler {
    /// A sampler for valid settings ([`SamplerConfig::check`]).
    pub fn new(cfg: SamplerConfig) -> Result<Self, crate::EngineError> {
        cfg.check().map_err(crate::EngineError::Input)?;
        Ok(Sampler { cfg, rng: XorShift::new(cfg.seed) })
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let argmax = || logits.iter().enumerate().fold(0, |b, (i, v)| if *v > logits[b] { i } else { b }) as u32;
        if self.cfg.temperature <= 0.0 {
            return argmax();
        }
        // Candidates by probability, highest first (ties: lower id).
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        if self.cfg.top_k > 0 {
            idx.truncate(self.cfg.top_k);
        }
        let t = f64::from(self.cfg.temperature);
        let m = f64::from(logits[idx[0] as usize]);
        let mut p: Vec<f64> = idx.iter().map(|&i| ((f64::from(logits[i as usize]) - m) / t).exp()).collect();
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= z);
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = p.iter().position(|v| {
                acc += v;
                acc >= f64::from(self.cfg.top_p)
            });
            let keep = keep.map_or(p.len(), |k| k + 1);
            idx.truncate(keep);
            p.truncate(keep);
            let z: f64 = p.iter().sum();
            p.iter_mut().for_each(|v| *v /= z);
        }
        let mut u = self.rng.uniform();
        for (i, v) in idx.iter().zip(&p) {
            if u < *v {
                return *i;
            }
            u -= v;
        }
        *idx.last().expect("at least one candidate")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_sampling_respects_top_k_and_seed() {
        let logits = [0.1f32, 2.0, 2.0, -1.0, 1.5];
        assert_eq!(Sampler::new(SamplerConfig::default()).unwrap().sample(&logits), 1, "ties go to the lower id");
        let cfg = SamplerConfig { temperature: 1.0, top_k: 2, top_p: 1.0, seed: 9 };
        let (mut a, mut b) = (Sampler::new(cfg).unwrap(), Sampler::new(cfg).unwrap());
        let xs: Vec<u32> = (0..200).map(|_| a.sample(&logits)).collect();
        let ys: Vec<u32> = (0..200).map(|_| b.sample(&logits)).collect();
        assert_eq!(xs, ys, "same seed, same draws");
        assert!(xs.iter().all(|&t| t == 1 || t == 2), "only the top 2");
        assert!(xs.contains(&1) && xs.contains(&2));
        let nucleus = SamplerConfig { temperature: 1.0, top_k: 0, top_p: 0.3, seed: 1 };
        let mut s = Sampler::new(nucleus).unwrap();
        assert!((0..100).all(|_| s.sample(&logits) == 1), "p=0.3 keeps only the single most likely token");
    }
}
