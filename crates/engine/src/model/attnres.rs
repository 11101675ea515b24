//! K3's AttnRes: the residual stream as a learned mix of block snapshots.

/// Softmax over the candidates `[blocks.., p]` of `(v . w) / sqrt(mean(v^2) + eps)` (in f64), and
/// the weighted sum of the raw candidates.
pub(crate) fn mix(blocks: &[Vec<f32>], p: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let cands: Vec<&[f32]> = blocks.iter().map(Vec::as_slice).chain(std::iter::once(p)).collect();
    let scores: Vec<f64> = cands
        .iter()
        .map(|v| {
            let dot: f64 = v.iter().zip(w).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            let ms = v.iter().map(|a| f64::from(*a) * f64::from(*a)).sum::<f64>() / v.len() as f64;
            dot / (ms + f64::from(eps)).sqrt()
        })
        .collect();
    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut out = vec![0f64; p.len()];
    for (c, wgt) in cands.iter().zip(&e) {
        let f = wgt / z;
        for (o, v) in out.iter_mut().zip(c.iter()) {
            *o += f * f64::from(*v);
        }
    }
    out.into_iter().map(|v| v as f32).collect()
}
