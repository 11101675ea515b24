//! The sampler against a reference written here from the definitions (llama.cpp's
//! `llama_sampler_penalties_apply`, `min_p` and OpenAI's `logit_bias`), on random logits and
//! histories: the distribution a token is drawn from, and greedy's choice, must be the
//! reference's. The reference takes the long way (a full softmax, explicit counts, sorting by
//! probability), so agreement is not the code agreeing with itself.

use k3_generate::sample::{Sampler, SamplerConfig, logprobs};
use k3_quant::rng::XorShift;

/// The reference: the adjusted logits, then the distribution over candidates.
fn reference(cfg: &SamplerConfig, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
    let mut l: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
    for &(id, b) in &cfg.logit_bias {
        l[id as usize] += f64::from(b);
    }
    let window = &history[history.len().saturating_sub(cfg.penalty_last_n)..];
    for (t, x) in l.iter_mut().enumerate() {
        let count = window.iter().filter(|&&h| h as usize == t).count();
        if count == 0 {
            continue;
        }
        let r = f64::from(cfg.repeat_penalty);
        // llama.cpp: logits <= 0 are multiplied by the penalty, others divided.
        *x = if *x <= 0.0 { *x * r } else { *x / r };
        *x -= count as f64 * f64::from(cfg.frequency_penalty) + f64::from(cfg.presence_penalty);
    }
    // f32 rounding as the sampler works in f32 for the adjusted logits.
    let l: Vec<f64> = l.iter().map(|&x| f64::from(x as f32)).collect();
    let mut order: Vec<u32> = (0..l.len() as u32).filter(|&i| l[i as usize] > f64::NEG_INFINITY).collect();
    order.sort_by(|&a, &b| l[b as usize].partial_cmp(&l[a as usize]).unwrap().then(a.cmp(&b)));
    if cfg.temperature == 0.0 {
        return vec![(order[0], 1.0)];
    }
    if cfg.top_k > 0 {
        order.truncate(cfg.top_k);
    }
    // min-p on the untempered softmax: p_i >= min_p * p_max.
    let z: f64 = order.iter().map(|&i| l[i as usize].exp()).sum();
    let p = |i: u32| l[i as usize].exp() / z;
    let pmax = p(order[0]);
    let kept: Vec<u32> =
        order.iter().copied().filter(|&i| p(i) >= f64::from(cfg.min_p) * pmax * (1.0 - 1e-12)).collect();
    let t = f64::from(cfg.temperature);
    let zt: f64 = kept.iter().map(|&i| (l[i as usize] / t).exp()).sum();
    let mut d: Vec<(u32, f64)> = kept.iter().map(|&i| (i, (l[i as usize] / t).exp() / zt)).collect();
    if cfg.top_p < 1.0 {
        let mut acc = 0.0;
        let mut n = d.len();
        for (k, &(_, q)) in d.iter().enumerate() {
            acc += q;
            if acc >= f64::from(cfg.top_p) {
                n = k + 1;
                break;
            }
        }
        d.truncate(n);
        let s: f64 = d.iter().map(|x| x.1).sum();
        d.iter_mut().for_each(|x| x.1 /= s);
    }
    d
}

fn random_case(rng: &mut XorShift, case: u64) -> (SamplerConfig, Vec<f32>, Vec<u32>) {
    let vocab = 8 + (rng.uniform() * 56.0) as usize;
    let logits: Vec<f32> = (0..vocab).map(|_| (rng.uniform() * 12.0 - 6.0) as f32).collect();
    let history: Vec<u32> =
        (0..(rng.uniform() * 100.0) as usize).map(|_| (rng.uniform() * vocab as f64) as u32).collect();
    let pick = |rng: &mut XorShift, p: f64| rng.uniform() < p;
    let mut cfg = SamplerConfig { seed: case, ..SamplerConfig::default() };
    cfg.temperature = if pick(rng, 0.2) { 0.0 } else { (0.2 + rng.uniform() * 1.5) as f32 };
    if pick(rng, 0.5) {
        cfg.top_k = 1 + (rng.uniform() * vocab as f64) as usize;
    }
    if pick(rng, 0.5) {
        cfg.top_p = (0.1 + rng.uniform() * 0.9) as f32;
    }
    if pick(rng, 0.5) {
        cfg.min_p = (rng.uniform() * 0.5) as f32;
    }
    if pick(rng, 0.6) {
        cfg.repeat_penalty = (0.5 + rng.uniform() * 1.5) as f32;
    }
    if pick(rng, 0.5) {
        cfg.frequency_penalty = (rng.uniform() * 4.0 - 2.0) as f32;
    }
    if pick(rng, 0.5) {
        cfg.presence_penalty = (rng.uniform() * 4.0 - 2.0) as f32;
    }
    cfg.penalty_last_n = [0, 1, 16, 64, usize::MAX][(rng.uniform() * 5.0) as usize % 5];
    for _ in 0..(rng.uniform() * 4.0) as usize {
        let id = (rng.uniform() * vocab as f64) as u32;
        let b = if pick(rng, 0.2) { f32::NEG_INFINITY } else { (rng.uniform() * 20.0 - 10.0) as f32 };
        if !cfg.logit_bias.iter().any(|(i, _)| *i == id) {
            cfg.logit_bias.push((id, b));
        }
    }
    (cfg, logits, history)
}

#[test]
fn the_distribution_is_the_references_on_random_cases() {
    let mut rng = XorShift::new(7);
    for case in 0..3000 {
        let (cfg, logits, history) = random_case(&mut rng, case);
        let mut s = Sampler::new(cfg.clone()).unwrap();
        s.observe(&history);
        let got = s.distribution(&logits);
        let want = reference(&cfg, &logits, &history);
        assert_eq!(
            got.iter().map(|x| x.0).collect::<Vec<_>>(),
            want.iter().map(|x| x.0).collect::<Vec<_>>(),
            "case {case}: candidates differ ({cfg:?})"
        );
        for ((_, g), (id, w)) in got.iter().zip(&want) {
            // The sampler adjusts logits in f32 (a rounding per operation, |logit| < 40 here: a few
            // 1e-6 absolute), the reference in f64; at temperature >= 0.2 that moves a
            // probability by at most ~2e-5.
            assert!((g - w).abs() <= 2e-5, "case {case}: p({id}) {g} vs {w}");
        }
        // A draw is one of the candidates.
        let drawn = s.sample(&logits);
        assert!(want.iter().any(|x| x.0 == drawn), "case {case}: drew {drawn}");
    }
}

#[test]
fn a_banned_token_is_never_drawn_and_the_window_slides() {
    let logits = [5.0f32, 4.0, 3.0, 2.0];
    let cfg = SamplerConfig { temperature: 1.0, logit_bias: vec![(0, f32::NEG_INFINITY)], ..SamplerConfig::default() };
    let mut s = Sampler::new(cfg).unwrap();
    assert!((0..500).all(|_| s.sample(&logits) != 0));
    // Token 0 was seen once, 70 tokens ago: outside the default 64-token window, unpenalized.
    let cfg = SamplerConfig { repeat_penalty: 100.0, ..SamplerConfig::default() };
    let mut s = Sampler::new(cfg).unwrap();
    let mut history = vec![0u32];
    history.extend(std::iter::repeat_n(3, 69));
    s.observe(&history);
    assert_eq!(s.sample(&logits), 0);
    s.observe(&[0]);
    assert_eq!(s.sample(&logits), 1, "now 0 is in the window: 5 / 100 < 4");
}

#[test]
fn logprobs_are_the_log_softmax_of_the_raw_logits() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
    let z: f64 = logits.iter().map(|&x| f64::from(x).exp()).sum();
    let (lp, top) = logprobs(&logits, 2, 3);
    assert!((f64::from(lp) - (2.0 - z.ln())).abs() < 1e-6);
    assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2], "highest first, ties to the lower id");
    for (id, l) in top {
        assert!((f64::from(l) - (f64::from(logits[id as usize]) - z.ln())).abs() < 1e-6);
    }
}
