//! Cache-aware routing (WARP's): a token's light experts that the cache does not hold are swapped
//! for the best-scored runners-up it does hold, so fewer reads. Changes results.

use crate::route::Routing;

/// Replaces each of `r`'s `n` lightest experts (by weight; of equal weights the higher id) that
/// `cached` says is not held by the first of `runners_up` (best score first) that is held and
/// not already chosen; the substitute takes the replaced expert's weight, so the token's total
/// is unchanged. Returns how many were replaced.
pub fn prefer_cached(r: &mut Routing, runners_up: &[u32], n: usize, cached: impl Fn(u32) -> bool) -> usize {
    let mut order: Vec<usize> = (0..r.experts.len()).collect();
    order.sort_by(|&a, &b| r.weights[a].total_cmp(&r.weights[b]).then(r.experts[b].cmp(&r.experts[a])));
    let mut swapped = 0;
    for i in order.into_iter().take(n) {
        if cached(r.experts[i]) {
            continue;
        }
        if let Some(&e) = runners_up.iter().find(|&&e| cached(e) && !r.experts.contains(&e)) {
            r.experts[i] = e;
            swapped += 1;
        }
    }
    swapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn light_misses_take_cached_runners_up_in_score_order() {
        let mut r = Routing { experts: vec![1, 2, 3, 4], weights: vec![0.4, 0.3, 0.2, 0.1] };
        let cached = |e: u32| [1, 9, 7].contains(&e);
        // The two lightest (4, then 3) miss: 9 (the best cached runner-up) replaces 4, 7 replaces 3.
        assert_eq!(prefer_cached(&mut r, &[8, 9, 6, 7], 2, cached), 2);
        assert_eq!(r.experts, [1, 2, 7, 9]);
        assert_eq!(r.weights, [0.4, 0.3, 0.2, 0.1]);
        // Heavy experts are never swapped; a cached light one stays; none left to offer: none.
        let mut r = Routing { experts: vec![5, 1, 6], weights: vec![0.5, 0.3, 0.2] };
        assert_eq!(prefer_cached(&mut r, &[9, 1], 2, cached), 1);
        assert_eq!(r.experts, [5, 1, 9]);
        assert_eq!(prefer_cached(&mut r, &[9, 1], 3, |_| false), 0);
    }
}
