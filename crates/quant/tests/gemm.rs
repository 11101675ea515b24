//! Attention's small products (`gemm`) at every level against exact (f64) sums, over random
//! shapes: scores over one key or a key in two parts, and weighted sums.

mod common;

use common::{assert_close, simd_levels, sum_tolerance};
use k3_quant::cpu::Level;
use k3_quant::gemm::{self, Part};
use proptest::prelude::*;

fn make(len: usize, seed: u32) -> Vec<f32> {
    (0..len).map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / u32::MAX as f32 - 0.5).collect()
}

fn all_levels() -> Vec<Level> {
    let mut v = simd_levels();
    v.push(Level::Scalar);
    v
}

/// The parts of a random key: `k1` columns, and `k2` more in a second part when non-zero.
fn parts_of<'a>(a: &'a (Vec<f32>, Vec<f32>), b: &'a (Vec<f32>, Vec<f32>), k: (usize, usize)) -> Vec<Part<'a>> {
    let mut parts = vec![Part { a: &a.0, b: &b.0, k: k.0 }];
    if k.1 > 0 {
        parts.push(Part { a: &a.1, b: &b.1, k: k.1 });
    }
    parts
}

/// Row `i` and column `j` of a part alone.
fn cell<'a>(p: &Part<'a>, i: usize, j: usize) -> Part<'a> {
    Part { a: &p.a[i * p.k..(i + 1) * p.k], b: &p.b[j * p.k..(j + 1) * p.k], k: p.k }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// `abt_parts` at every level within rounding of the exact sum over both parts: partial
    /// register blocks (any `m`, `n`), row ends (any `k`), accumulating or not.
    #[test]
    fn scores_match_exact_sums((m, n) in (1usize..19, 1usize..11), k in (1usize..90, 1usize..40), two in any::<bool>(), seed in any::<u32>(), accumulate in any::<bool>()) {
        let k = (k.0, if two { k.1 } else { 0 });
        let a = (make(m * k.0, seed), make(m * k.1, seed ^ 5));
        let b = (make(n * k.0, seed ^ 1), make(n * k.1, seed ^ 6));
        let init = make(m * n, seed ^ 2);
        let parts = parts_of(&a, &b, k);
        let (mut want, mut tol) = (vec![0f32; m * n], vec![0f64; m * n]);
        for i in 0..m {
            for j in 0..n {
                let terms: Vec<f64> = parts.iter().flat_map(|p| (0..p.k).map(move |t| f64::from(p.a[i * p.k + t]) * f64::from(p.b[j * p.k + t]))).collect();
                let base = if accumulate { f64::from(init[i * n + j]) } else { 0.0 };
                want[i * n + j] = (base + terms.iter().sum::<f64>()) as f32;
                tol[i * n + j] = sum_tolerance(terms.len() + 2, terms.iter().map(|t| t.abs()).sum::<f64>() + base.abs());
            }
        }
        for level in all_levels() {
            let mut got = init.clone();
            gemm::abt_parts_at(level, &parts, &mut got, accumulate);
            assert_close(&got, &want, &tol);
        }
    }

    /// Every level: a score's bits are those of its row and column alone, whatever rows and
    /// columns share the call (attention splits heads and positions over threads and relies on it).
    #[test]
    fn scores_do_not_depend_on_their_neighbours((m, n) in (1usize..11, 1usize..19), k in (1usize..70, 1usize..20), two in any::<bool>(), seed in any::<u32>()) {
        let k = (k.0, if two { k.1 } else { 0 });
        let a = (make(m * k.0, seed), make(m * k.1, seed ^ 5));
        let b = (make(n * k.0, seed ^ 1), make(n * k.1, seed ^ 6));
        let parts = parts_of(&a, &b, k);
        for level in all_levels() {
            let mut all = vec![0f32; m * n];
            gemm::abt_parts_at(level, &parts, &mut all, false);
            for i in 0..m {
                for j in 0..n {
                    let single: Vec<Part<'_>> = parts.iter().map(|p| cell(p, i, j)).collect();
                    let mut one = [0f32];
                    gemm::abt_parts_at(level, &single, &mut one, false);
                    prop_assert_eq!(one[0].to_bits(), all[i * n + j].to_bits(), "row {} column {} at {:?}", i, j, level);
                }
            }
        }
    }

    /// `pb_acc` at every level within rounding of the exact sums, and the SIMD levels with the
    /// same bits (the same chains of fused multiply-adds).
    #[test]
    fn weighted_sums_match_exact_sums((m, n, k) in (1usize..19, 1usize..40, 1usize..150), seed in any::<u32>()) {
        let (p, b, acc0) = (make(m * n, seed ^ 3), make(n * k, seed ^ 1), make(m * k, seed ^ 4));
        let mut want = vec![0f32; m * k];
        let mut tol = vec![0f64; m * k];
        for i in 0..m {
            for t in 0..k {
                let terms: Vec<f64> = (0..n).map(|j| f64::from(p[i * n + j]) * f64::from(b[j * k + t])).collect();
                let base = f64::from(acc0[i * k + t]);
                want[i * k + t] = (base + terms.iter().sum::<f64>()) as f32;
                tol[i * k + t] = sum_tolerance(n + 1, terms.iter().map(|t| t.abs()).sum::<f64>() + base.abs());
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut simd_bits = None;
        for level in all_levels() {
            let mut got = acc0.clone();
            gemm::pb_acc_at(level, &p, &b, k, &mut got);
            assert_close(&got, &want, &tol);
            if level != Level::Scalar {
                let b = bits(&got);
                prop_assert_eq!(simd_bits.get_or_insert_with(|| b.clone()), &b, "{:?}", level);
            }
        }
    }
}

/// Parts that do not describe one `[m, n]` product are refused, whatever the level: another
/// `m` or `n`, a zero `k`, no parts, an output of another length, and a `k` so large that
/// `m * k` wraps (`2 * (2^63 + 1) = 2` in 64 bits) where a product check would pass.
#[test]
fn parts_of_other_shapes_are_refused() {
    let (x2, x3, x6, x8, x12) = (make(2, 1), make(3, 2), make(6, 3), make(8, 4), make(12, 5));
    let first = Part { a: &x8, b: &x12, k: 4 }; // two rows, three columns
    let cases: Vec<(&str, Vec<Part<'_>>, usize)> = vec![
        ("another m", vec![first, Part { a: &x6, b: &x6, k: 2 }], 6),
        ("another n", vec![first, Part { a: &x2, b: &x2, k: 1 }], 6),
        ("zero k", vec![Part { a: &x2, b: &x3, k: 0 }], 6),
        ("no parts", vec![], 0),
        ("output length", vec![first], 5),
        ("k that wraps", vec![Part { a: &x2, b: &x2, k: 1 }, Part { a: &x2, b: &x2, k: (1 << 63) + 1 }], 4),
    ];
    for level in all_levels() {
        for (what, parts, len) in &cases {
            let mut out = vec![0f32; *len];
            let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                gemm::abt_parts_at(level, parts, &mut out, false)
            }));
            // Refused by the check, not by an overflow panic on the way (debug builds check).
            let message = refused.err().and_then(|e| {
                e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            });
            assert!(message.is_some_and(|m| m.contains("shapes do not match")), "{what} at {level:?}");
        }
    }
}
