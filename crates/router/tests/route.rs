//! Routing against a plain reference written from the equations (full sorts, no shortcuts).

use k3_router::lookahead::{LookaheadStats, Predictor, predict};
use k3_router::{RouterConfig, Routing, route};
use proptest::prelude::*;

/// models.md, LatentMoE: s = sigmoid(logits); choose top-k of s + bias (within the best groups,
/// a group scored by the sum of its two best biased scores); weights = s[chosen] (or s + bias for
/// the biased variant), w / (sum w + 1e-20), times the scaling factor.
fn reference(cfg: &RouterConfig, logits: &[f32], bias: &[f32]) -> Routing {
    let s: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
    let b: Vec<f32> = s.iter().zip(bias).map(|(x, y)| x + y).collect();
    let per = cfg.experts / cfg.groups;
    let mut groups: Vec<(f32, usize)> = (0..cfg.groups)
        .map(|g| {
            let mut v: Vec<f32> = b[g * per..(g + 1) * per].to_vec();
            v.sort_by(|x, y| y.total_cmp(x));
            (v.iter().take(2).sum(), g)
        })
        .collect();
    groups.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let keep: Vec<usize> = groups.iter().take(cfg.top_groups).map(|g| g.1).collect();
    let mut cand: Vec<(f32, usize)> =
        (0..cfg.experts).filter(|e| keep.contains(&(e / per))).map(|e| (b[e], e)).collect();
    cand.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    cand.truncate(cfg.top_k);
    let experts: Vec<u32> = cand.iter().map(|c| c.1 as u32).collect();
    let mut weights: Vec<f32> = cand.iter().map(|c| if cfg.biased_weights { b[c.1] } else { s[c.1] }).collect();
    if cfg.renormalize {
        let sum: f32 = weights.iter().sum::<f32>() + 1e-20;
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    weights.iter_mut().for_each(|w| *w *= cfg.scaling);
    Routing { experts, weights }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    /// Random configurations, with logits drawn from few values so that ties are common.
    #[test]
    fn matches_the_reference(
        (groups, per, top_groups, top_k) in (1usize..5, 2usize..9).prop_flat_map(|(g, p)| (Just(g), Just(p), 1..=g, 1..=p)),
        levels in proptest::collection::vec(0u8..5, 32),
        bias_levels in proptest::collection::vec(0u8..3, 32),
        biased in any::<bool>(), renormalize in any::<bool>(), scaling in prop::sample::select(vec![1.0f32, 2.446]),
    ) {
        let experts = groups * per;
        let logits: Vec<f32> = levels.iter().take(experts).map(|l| f32::from(*l) - 2.0).collect();
        let bias: Vec<f32> = bias_levels.iter().take(experts).map(|b| f32::from(*b) * 0.01).collect();
        let cfg = RouterConfig { experts, top_k, groups, top_groups, renormalize, scaling, biased_weights: biased, top_p: None, keep: None };
        let mut got = Routing::default();
        route(&cfg, &logits, &bias, &mut got);
        let want = reference(&cfg, &logits, &bias);
        prop_assert_eq!(&got.experts, &want.experts);
        for (a, b) in got.weights.iter().zip(&want.weights) {
            prop_assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{:?} vs {:?}", got.weights, want.weights);
        }
    }
}

#[test]
fn ties_go_to_the_lower_index() {
    let cfg = RouterConfig::new(8, 3);
    let mut r = Routing::default();
    route(&cfg, &[0.5; 8], &[0.0; 8], &mut r);
    assert_eq!(r.experts, vec![0, 1, 2]);
    assert!(r.weights.iter().all(|w| (w - 1.0 / 3.0).abs() < 1e-6));
}

#[test]
fn selection_uses_the_bias_and_weights_do_not() {
    let cfg = RouterConfig { scaling: 2.0, ..RouterConfig::new(4, 1) };
    let mut r = Routing::default();
    // Expert 0 has the best score, expert 3 wins on score + bias.
    route(&cfg, &[3.0, 0.0, 0.0, 1.0], &[0.0, 0.0, 0.0, 0.5], &mut r);
    assert_eq!(r.experts, vec![3]);
    assert!((r.weights[0] - 2.0).abs() < 1e-6, "renormalized to 1, scaled by 2");
    let cfg = RouterConfig { renormalize: false, ..RouterConfig::new(4, 1) };
    route(&cfg, &[3.0, 0.0, 0.0, 1.0], &[0.0, 0.0, 0.0, 0.5], &mut r);
    assert!((r.weights[0] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6, "unbiased sigmoid score");
    let cfg = RouterConfig { renormalize: false, biased_weights: true, ..RouterConfig::new(4, 1) };
    route(&cfg, &[3.0, 0.0, 0.0, 1.0], &[0.0, 0.0, 0.0, 0.5], &mut r);
    assert!((r.weights[0] - (0.5 + 1.0 / (1.0 + (-1.0f32).exp()))).abs() < 1e-6, "Moonshot remote-code variant");
}

#[test]
fn grouping_restricts_the_choice_to_the_best_groups() {
    // Two groups of 4; group 1 holds the two best scores, so with one group kept all picks come
    // from it even though group 0 has the third-best expert.
    let cfg = RouterConfig { groups: 2, top_groups: 1, ..RouterConfig::new(8, 3) };
    let logits = [2.0, 0.0, 0.0, 0.0, 3.0, 2.5, -1.0, -2.0];
    let mut r = Routing::default();
    route(&cfg, &logits, &[0.0; 8], &mut r);
    assert_eq!(r.experts, vec![4, 5, 6]);
}

#[test]
fn top_p_keeps_the_heaviest_experts_and_renormalizes() {
    let cfg = RouterConfig { top_p: Some(0.6), ..RouterConfig::new(4, 4) };
    let logits = [2.0f32, 1.0, 0.0, -1.0];
    let mut r = Routing::default();
    route(&cfg, &logits, &[0.0; 4], &mut r);
    let s: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
    let total: f32 = s.iter().sum();
    // 0.881 + 0.731 = 1.612 of 2.500 (64%) reaches 0.6: two experts kept.
    assert_eq!(r.experts, vec![0, 1]);
    assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!((r.weights[0] - s[0] / (s[0] + s[1])).abs() < 1e-6, "{:?} {total}", r.weights);
}

/// Top-k reduction: the `keep` heaviest of the chosen, weights scaled to the total of all chosen
/// (hand-computed from the sigmoid scores); a `keep` at or above top-k changes nothing.
#[test]
fn keep_takes_the_heaviest_and_keeps_the_total() {
    let logits = [0.5f32, 2.0, -1.0, 1.0, 0.0, -3.0];
    let s: Vec<f32> = logits.iter().map(|l| 1.0 / (1.0 + (-l).exp())).collect();
    let cfg = RouterConfig { keep: Some(2), scaling: 2.0, ..RouterConfig::new(6, 4) };
    let mut r = Routing::default();
    route(&cfg, &logits, &[0.0; 6], &mut r);
    // Chosen: 1, 3, 0, 4 (sum 0.881 + 0.731 + 0.622 + 0.5); kept: the two heaviest, 1 and 3.
    assert_eq!(r.experts, vec![1, 3]);
    let chosen = s[1] + s[3] + s[0] + s[4];
    assert!((r.weights[0] - 2.0 * s[1] / chosen * chosen / (s[1] + s[3])).abs() < 1e-6, "{:?}", r.weights);
    assert!((r.weights.iter().sum::<f32>() - 2.0).abs() < 1e-5);
    let mut whole = Routing::default();
    route(&RouterConfig { keep: Some(4), ..cfg }, &logits, &[0.0; 6], &mut whole);
    let mut plain = Routing::default();
    route(&RouterConfig { keep: None, ..cfg }, &logits, &[0.0; 6], &mut plain);
    assert_eq!(whole, plain);
    assert_eq!(plain.experts.len(), 4);
}

#[test]
fn lookahead_predictions_are_scored() {
    let cfg = RouterConfig::new(8, 2);
    let logits = [0.0, 3.0, 2.0, 1.0, 0.5, -1.0, -2.0, -3.0];
    let predicted = predict(&cfg, &logits, &[0.0; 8], 2);
    assert_eq!(predicted, vec![1, 2, 3, 4]);
    let mut stats = LookaheadStats::new(3);
    stats.record(Predictor::AfterAttention, 1, &predicted, &[2, 7]);
    stats.record(Predictor::AfterAttention, 1, &predicted, &[1, 3]);
    stats.record(Predictor::PreviousToken, 2, &[7, 6], &[5, 6]);
    let c = stats.counts(Predictor::AfterAttention, 1);
    assert_eq!((c.tokens, c.hits, c.chosen, c.wasted), (2, 3, 4, 5));
    assert!((c.recall() - 0.75).abs() < 1e-12);
    assert!((c.wasted_per_token() - 2.5).abs() < 1e-12);
    assert_eq!(stats.total(Predictor::PreviousToken).hits, 1);
    assert_eq!(stats.total(Predictor::AfterMoe).tokens, 0);
}
#[test]
fn usage_history_round_trips_and_names_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = k3_router::UsageHistory::default();
    for (k, n) in [((1, 7), 5), ((0, 2), 9), ((3, 3), 5), ((2, 0), 1)] {
        for _ in 0..n {
            h.record(k);
        }
    }
    let p = dir.path().join("usage.txt");
    h.save(&p).unwrap();
    let back = k3_router::UsageHistory::load(&p).unwrap();
    assert_eq!(back, h);
    assert_eq!(back.hottest(3), vec![(0, 2), (1, 7), (3, 3)]);
    std::fs::write(&p, "# k3 expert usage v1\n1 2 3\n1 two 3\n").unwrap();
    let e = k3_router::UsageHistory::load(&p).unwrap_err().to_string();
    assert!(e.contains("usage.txt: line 3: not numbers"), "{e}");
    std::fs::write(&p, "hello\n").unwrap();
    assert!(k3_router::UsageHistory::load(&p).unwrap_err().to_string().contains("not a k3 expert usage file"));
}
