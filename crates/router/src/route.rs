//! `noaux_tc` routing, exactly as models.md states it.

/// How a MoE layer routes (from the model config).
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    pub experts: usize,
    /// `num_experts_per_token`.
    pub top_k: usize,
    /// `num_expert_group` (1 for the Kimi models; implemented generally).
    pub groups: usize,
    /// `topk_group`: groups kept before choosing experts.
    pub top_groups: usize,
    /// `moe_renormalize`.
    pub renormalize: bool,
    /// `routed_scaling_factor`.
    pub scaling: f32,
    /// Moonshot's Kimi-Linear remote code adds the correction bias in place, so its weights
    /// include it; transformers, vLLM and SGLang (and the golden data) do not. Off by default.
    pub biased_weights: bool,
    /// Keep experts (heaviest first) until their weights sum to `p`, then renormalize. Changes
    /// results, so off (`None`) by default.
    pub top_p: Option<f32>,
    /// Keep only the `n` heaviest of the `top_k` chosen, their weights scaled to the total of all
    /// `top_k` (top-k reduction: fewer expert reads a token). Changes results: off by default.
    pub keep: Option<usize>,
}

impl RouterConfig {
    pub fn new(experts: usize, top_k: usize) -> Self {
        RouterConfig {
            experts,
            top_k,
            groups: 1,
            top_groups: 1,
            renormalize: true,
            scaling: 1.0,
            biased_weights: false,
            top_p: None,
            keep: None,
        }
    }
}

/// The experts of one token and their weights, in selection order (highest biased score first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Routing {
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Higher value first, lower index on ties.
fn better(a: (f32, usize), b: (f32, usize)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// The `k` best indices of `v` among those `allowed`, best first (ties: lower index).
fn top(v: &[f32], k: usize, allowed: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, &x) in v.iter().enumerate() {
        if !allowed(i) || x.is_nan() {
            continue;
        }
        let pos = out.iter().position(|&j| better((x, i), (v[j], j))).unwrap_or(out.len());
        if pos < k {
            out.insert(pos, i);
            out.truncate(k);
        }
    }
    out
}

/// The experts selected for `logits` (no weights): `width` best by biased score within the best
/// groups. The lookahead uses it with a width above `top_k`.
pub fn select(cfg: &RouterConfig, logits: &[f32], bias: &[f32], width: usize) -> Vec<u32> {
    let biased: Vec<f32> = logits.iter().zip(bias).map(|(l, b)| sigmoid(*l) + b).collect();
    select_biased(cfg, &biased, width)
}

fn select_biased(cfg: &RouterConfig, biased: &[f32], width: usize) -> Vec<u32> {
    let groups = cfg.groups.max(1);
    let per = cfg.experts / groups;
    let allowed_groups: Vec<usize> = if groups > 1 && cfg.top_groups < groups {
        // A group's score is the sum of its two best biased scores (DeepSeek-V3).
        let gs: Vec<f32> = (0..groups)
            .map(|g| {
                let slice = &biased[g * per..(g + 1) * per];
                top(slice, 2, |_| true).iter().map(|&i| slice[i]).sum()
            })
            .collect();
        top(&gs, cfg.top_groups, |_| true)
    } else {
        (0..groups).collect()
    };
    top(biased, width, |i| allowed_groups.contains(&(i / per.max(1)))).into_iter().map(|i| i as u32).collect()
}

/// Applies `cfg.top_p` and `cfg.keep` to a token's routing: the heaviest experts kept (ties: the
/// lower index) until their weight reaches `top_p` of the total and at most `keep` of them, their
/// weights scaled so they sum to the total of all chosen. Nothing changes when both are off.
pub fn trim(cfg: &RouterConfig, out: &mut Routing) {
    if cfg.top_p.is_none() && cfg.keep.is_none_or(|k| k >= out.experts.len()) {
        return;
    }
    let mut order: Vec<usize> = (0..out.experts.len()).collect();
    order.sort_by(|&a, &b| out.weights[b].total_cmp(&out.weights[a]).then(out.experts[a].cmp(&out.experts[b])));
    let total: f32 = out.weights.iter().sum();
    let (p, most) = (cfg.top_p.unwrap_or(1.0), cfg.keep.unwrap_or(usize::MAX).max(1));
    let mut kept = Vec::new();
    let mut acc = 0.0;
    for i in order {
        if kept.len() == most || (!kept.is_empty() && cfg.top_p.is_some() && acc >= p * total) {
            break;
        }
        kept.push(i);
        acc += out.weights[i];
    }
    let sum: f32 = kept.iter().map(|&i| out.weights[i]).sum::<f32>() + 1e-20;
    let experts = kept.iter().map(|&i| out.experts[i]).collect();
    let weights = kept.iter().map(|&i| out.weights[i] / sum * total).collect();
    out.experts = experts;
    out.weights = weights;
}

/// Routes one token: fills `out` with the chosen experts and their weights.
pub fn route(cfg: &RouterConfig, logits: &[f32], bias: &[f32], out: &mut Routing) {
    assert_eq!(logits.len(), cfg.experts, "{} gate logits for {} experts", logits.len(), cfg.experts);
    assert_eq!(bias.len(), cfg.experts, "{} correction biases for {} experts", bias.len(), cfg.experts);
    assert!(
        cfg.groups >= 1 && cfg.experts.is_multiple_of(cfg.groups),
        "{} experts in {} groups",
        cfg.experts,
        cfg.groups
    );
    let scores: Vec<f32> = logits.iter().map(|l| sigmoid(*l)).collect();
    let biased: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    out.experts = select_biased(cfg, &biased, cfg.top_k);
    let source = if cfg.biased_weights { &biased } else { &scores };
    out.weights = out.experts.iter().map(|&e| source[e as usize]).collect();
    if cfg.renormalize {
        let sum: f32 = out.weights.iter().sum::<f32>() + 1e-20;
        out.weights.iter_mut().for_each(|w| *w /= sum);
    }
    trim(cfg, out);
    out.weights.iter_mut().for_each(|w| *w *= cfg.scaling);
}
