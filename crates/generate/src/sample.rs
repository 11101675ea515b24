//! Choosing the next token from logits, in llama.cpp's order: the logit bias, the repetition
//! penalties over the latest tokens, then greedy, or top-k, min-p, temperature, top-p and a
//! draw from a seeded generator (the same seed gives the same text).
//!
//! - `logit_bias` (OpenAI): added to a token's logit (`-inf` bans it).
//! - `repeat_penalty` (llama.cpp): a seen token's logit is divided by it when positive,
//!   multiplied when not; `frequency_penalty` / `presence_penalty` (OpenAI, llama.cpp) subtract
//!   `count * frequency + presence` from it. "Seen" means among the last `penalty_last_n`
//!   tokens of the sequence, prompt included (llama.cpp's `repeat_last_n`, default 64).
//! - `min_p` (llama.cpp): keeps the tokens at least `min_p` times as likely as the most likely,
//!   on the distribution before temperature.

use std::collections::HashMap;

use k3_quant::rng::XorShift;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy (argmax, lower id on ties).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the most likely tokens until their probability reaches `top_p` (1 = all).
    pub top_p: f32,
    pub seed: u64,
    /// Keep tokens at least this fraction as likely as the most likely one (0 = off).
    pub min_p: f32,
    /// Divide a seen token's positive logit by this, multiply a negative one (1 = off).
    pub repeat_penalty: f32,
    /// Subtract this times a token's count in the window (0 = off).
    pub frequency_penalty: f32,
    /// Subtract this from every token in the window (0 = off).
    pub presence_penalty: f32,
    /// The latest tokens the penalties look at (`usize::MAX`: the whole sequence).
    pub penalty_last_n: usize,
    /// Added to the logits first, per token id.
    pub logit_bias: Vec<(u32, f32)>,
}

/// A seed from the operating system's randomness, for a request that names none: each
/// regenerate differs, and the seed is reported so a run can be repeated.
pub fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    h.finish() >> 11
}

/// llama.cpp's `repeat_last_n` default.
pub const PENALTY_LAST_N: usize = 64;

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: PENALTY_LAST_N,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerConfig {
    /// Refuses settings that would sample garbage, naming the setting.
    pub fn check(&self) -> Result<(), String> {
        check_temperature(self.temperature)?;
        check_top_p(self.top_p)?;
        check_min_p(self.min_p)?;
        check_repeat_penalty(self.repeat_penalty)?;
        check_penalty("frequency_penalty", self.frequency_penalty)?;
        check_penalty("presence_penalty", self.presence_penalty)?;
        for &(id, b) in &self.logit_bias {
            if b.is_nan() || b == f32::INFINITY {
                return Err(format!("logit_bias for token {id} is {b}: give a number (-inf bans the token)"));
            }
        }
        Ok(())
    }

    fn penalizes(&self) -> bool {
        self.penalty_last_n > 0
            && (self.repeat_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0)
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

/// A min-p: in [0, 1] (0 = off).
pub fn check_min_p(p: f32) -> Result<f32, String> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{p} is not a min-p: give a fraction in [0, 1] (0 = off)"))
    }
}

/// A repetition penalty: finite and > 0 (1 = off).
pub fn check_repeat_penalty(p: f32) -> Result<f32, String> {
    if p.is_finite() && p > 0.0 {
        Ok(p)
    } else {
        Err(format!("{p} is not a repetition penalty: give a number > 0 (1 = off)"))
    }
}

/// A frequency or presence penalty: in [-2, 2], OpenAI's range.
pub fn check_penalty(name: &str, p: f32) -> Result<f32, String> {
    if (-2.0..=2.0).contains(&p) { Ok(p) } else { Err(format!("{name} {p} is outside [-2, 2]")) }
}

#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: XorShift,
    /// The sequence's latest tokens, for the penalties (only kept when they are on).
    history: Vec<u32>,
}

impl Sampler {
    /// A sampler for valid settings ([`SamplerConfig::check`]).
    pub fn new(cfg: SamplerConfig) -> Result<Self, crate::GenerateError> {
        cfg.check().map_err(crate::GenerateError::Input)?;
        let rng = XorShift::new(cfg.seed);
        Ok(Sampler { cfg, rng, history: Vec::new() })
    }

    /// Counts `ids` as the sequence's latest tokens (the prompt, then each token chosen).
    pub fn observe(&mut self, ids: &[u32]) {
        if !self.cfg.penalizes() {
            return;
        }
        self.history.extend_from_slice(ids);
        let keep = self.cfg.penalty_last_n;
        if self.history.len() > keep.saturating_mul(2).max(1024) {
            let cut = self.history.len() - keep;
            self.history.drain(..cut);
        }
    }

    /// The logits after the bias and the penalties: what greedy takes the argmax of.
    pub fn adjusted(&self, logits: &[f32]) -> Vec<f32> {
        let mut l = logits.to_vec();
        for &(id, b) in &self.cfg.logit_bias {
            if let Some(x) = l.get_mut(id as usize) {
                *x += b;
            }
        }
        if self.cfg.penalizes() {
            let from = self.history.len().saturating_sub(self.cfg.penalty_last_n);
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &t in &self.history[from..] {
                *counts.entry(t).or_default() += 1;
            }
            for (&t, &n) in &counts {
                let Some(x) = l.get_mut(t as usize) else { continue };
                *x = if *x <= 0.0 { *x * self.cfg.repeat_penalty } else { *x / self.cfg.repeat_penalty };
                *x -= n as f32 * self.cfg.frequency_penalty + self.cfg.presence_penalty;
            }
        }
        l
    }

    /// The distribution a draw is made from: candidates and their probabilities, most likely
    /// first (ties: lower id). Greedy: the argmax alone, with probability 1.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let l = if self.cfg.logit_bias.is_empty() && !self.cfg.penalizes() {
            std::borrow::Cow::Borrowed(logits)
        } else {
            std::borrow::Cow::Owned(self.adjusted(logits))
        };
        let l = &l[..];
        if self.cfg.temperature <= 0.0 {
            return vec![(argmax(l), 1.0)];
        }
        // Candidates by logit, highest first (ties: lower id); banned tokens are none.
        let mut idx: Vec<u32> = (0..l.len() as u32).filter(|&i| l[i as usize] > f32::NEG_INFINITY).collect();
        if idx.is_empty() {
            return vec![(0, 1.0)];
        }
        idx.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]).then(a.cmp(&b)));
        if self.cfg.top_k > 0 {
            idx.truncate(self.cfg.top_k);
        }
        let m = f64::from(l[idx[0] as usize]);
        if self.cfg.min_p > 0.0 {
            // p_i / p_max = exp(l_i - l_max) >= min_p, before temperature.
            let floor = m + f64::from(self.cfg.min_p).ln();
            let keep = idx.iter().take_while(|&&i| f64::from(l[i as usize]) >= floor).count().max(1);
            idx.truncate(keep);
        }
        let t = f64::from(self.cfg.temperature);
        let mut p: Vec<f64> = idx.iter().map(|&i| ((f64::from(l[i as usize]) - m) / t).exp()).collect();
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
        idx.into_iter().zip(p).collect()
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 && self.cfg.logit_bias.is_empty() && !self.cfg.penalizes() {
            // Plain greedy, the common case per decoded token: no copy, no candidate list.
            return argmax(logits);
        }
        let d = self.distribution(logits);
        if let [(id, _)] = d[..] {
            return id;
        }
        let mut u = self.rng.uniform();
        for &(i, v) in &d {
            if u < v {
                return i;
            }
            u -= v;
        }
        d.last().map_or(0, |&(i, _)| i)
    }
}

/// A sampled token's log-probability under the model, and the most likely alternatives'.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// Highest first.
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprob {
    /// `id`'s at a position whose logits are `logits`, with the `top` most likely tokens'.
    pub fn of(logits: &[f32], id: u32, top: usize) -> Self {
        let (logprob, top) = logprobs(logits, id, top);
        TokenLogprob { id, logprob, top }
    }
}

/// The most likely token (the lower id on ties; 0 for no logits).
pub fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold(0, |b, (i, v)| if *v > l[b] { i } else { b }) as u32
}

/// A position's log-probabilities under the model (log-softmax of the raw logits, before any
/// sampling setting): `id`'s, and the `top` most likely tokens' (highest first, ties: lower id).
pub fn logprobs(logits: &[f32], id: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = logits.iter().map(|&x| f64::from(x - m).exp()).sum();
    let lz = z.ln();
    let lp = |i: u32| (f64::from(logits.get(i as usize).map_or(f32::NEG_INFINITY, |&x| x - m)) - lz) as f32;
    let mut best: Vec<u32> = Vec::new();
    if top > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = top.min(idx.len());
        let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, cmp);
            idx.truncate(k);
        }
        idx.sort_by(cmp);
        best = idx;
    }
    (lp(id), best.into_iter().map(|i| (i, lp(i))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_sampling_respects_top_k_and_seed() {
        let logits = [0.1f32, 2.0, 2.0, -1.0, 1.5];
        assert_eq!(Sampler::new(SamplerConfig::default()).unwrap().sample(&logits), 1, "ties go to the lower id");
        let cfg = SamplerConfig { temperature: 1.0, top_k: 2, seed: 9, ..SamplerConfig::default() };
        let (mut a, mut b) = (Sampler::new(cfg.clone()).unwrap(), Sampler::new(cfg).unwrap());
        let xs: Vec<u32> = (0..200).map(|_| a.sample(&logits)).collect();
        let ys: Vec<u32> = (0..200).map(|_| b.sample(&logits)).collect();
        assert_eq!(xs, ys, "same seed, same draws");
        assert!(xs.iter().all(|&t| t == 1 || t == 2), "only the top 2");
        assert!(xs.contains(&1) && xs.contains(&2));
        let nucleus = SamplerConfig { temperature: 1.0, top_p: 0.3, seed: 1, ..SamplerConfig::default() };
        let mut s = Sampler::new(nucleus).unwrap();
        assert!((0..100).all(|_| s.sample(&logits) == 1), "p=0.3 keeps only the single most likely token");
    }
}
