//! The int8 attention products against their scalar references (exact integers, so equal) and
//! against plain integer arithmetic on the unpacked rows (the packing is part of what is tested).

mod common;

use common::simd_levels;
use k3_quant::cpu::Level;
use k3_quant::gemm8::{self, BLOCK};
use proptest::prelude::*;

fn bytes(n: usize) -> impl Strategy<Value = Vec<i8>> {
    proptest::collection::vec(any::<i8>(), n)
}

/// `sum_t a[i][t] * b[j][t]` on the unpacked rows, with the packing's -128 -> -127.
fn plain_scores(a: &[i8], k4: usize, rows: &[i8], k: usize) -> Vec<i32> {
    let mut out = Vec::new();
    for ar in a.chunks(k4) {
        for br in rows.chunks(k) {
            out.push((0..k).map(|t| i32::from(ar[t]) * i32::from(br[t].max(-127))).sum());
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn scores_are_the_integer_dots((m, n, k) in (1usize..20, 0usize..=BLOCK, 1usize..600), seed in bytes(4096)) {
        let k4 = k.div_ceil(4) * 4;
        // Queries as `quantize_queries` writes them: zeros past k.
        let mut a = vec![0i8; m * k4];
        for i in 0..m {
            for t in 0..k {
                a[i * k4 + t] = seed[(i * 131 + t * 7) % seed.len()];
            }
        }
        let rows: Vec<i8> = (0..n * k).map(|x| seed[(x * 13 + 5) % seed.len()]).collect();
        let mut keys = gemm8::PackedKeys::default();
        gemm8::pack_keys(&rows, k, &mut keys);
        let want = plain_scores(&a, k4, &rows, k);
        for level in std::iter::once(Level::Scalar).chain(simd_levels()) {
            let mut got = vec![0i32; m * n];
            gemm8::scores_at(level, &a, &keys, k, n, &mut got);
            prop_assert_eq!(&got, &want, "{}", level.name());
        }
    }

    #[test]
    fn weighted_sums_are_the_integer_sums((m, n, k) in (1usize..12, 0usize..=BLOCK, 1usize..600), seed in bytes(4096)) {
        let w: Vec<u8> = (0..m * BLOCK).map(|x| if x % BLOCK < n { seed[(x * 3) % seed.len()] as u8 & 127 } else { 0 }).collect();
        let rows: Vec<i8> = (0..n * k).map(|x| seed[(x * 11 + 1) % seed.len()]).collect();
        let mut values = Vec::new();
        gemm8::pack_values_at(Level::Scalar, &rows, k, &mut values);
        for level in simd_levels() {
            let mut packed = Vec::new();
            gemm8::pack_values_at(level, &rows, k, &mut packed);
            prop_assert_eq!(&packed, &values, "packed at {}", level.name());
        }
        let mut want = vec![0i32; m * k];
        for i in 0..m {
            for t in 0..k {
                want[i * k + t] = (0..n).map(|j| i32::from(w[i * BLOCK + j]) * i32::from(rows[j * k + t])).sum();
            }
        }
        for level in std::iter::once(Level::Scalar).chain(simd_levels()) {
            let mut got = vec![0i32; m * k];
            gemm8::weighted_at(level, &w, &values, k, &mut got);
            prop_assert_eq!(&got, &want, "{}", level.name());
        }
    }
}

/// The extremes every level must hold without saturating: -127 keys against -128 and 127
/// queries, and 127 weights against -128 values, over the longest rows.
#[test]
fn extremes_do_not_saturate() {
    let k = 576;
    let k4 = k;
    let a: Vec<i8> = (0..2 * k4).map(|x| if x < k4 { -128 } else { 127 }).collect();
    let rows = vec![-128i8; BLOCK * k];
    let mut keys = gemm8::PackedKeys::default();
    gemm8::pack_keys(&rows, k, &mut keys);
    let w = vec![127u8; BLOCK];
    let mut values = Vec::new();
    gemm8::pack_values(&rows, k, &mut values);
    for level in std::iter::once(Level::Scalar).chain(simd_levels()) {
        let mut s = vec![0i32; 2 * BLOCK];
        gemm8::scores_at(level, &a, &keys, k, BLOCK, &mut s);
        assert!(s[..BLOCK].iter().all(|v| *v == 128 * 127 * k as i32), "{}: {:?}", level.name(), &s[..4]);
        assert!(s[BLOCK..].iter().all(|v| *v == -127 * 127 * k as i32), "{}", level.name());
        let mut o = vec![0i32; k];
        gemm8::weighted_at(level, &w, &values, k, &mut o);
        assert!(o.iter().all(|v| *v == -128 * 127 * BLOCK as i32), "{}", level.name());
    }
}

/// Queries and weights round to their steps: within half a step of the values they stand for.
#[test]
fn quantizers_round_to_their_steps() {
    let q: Vec<f32> = (0..2 * 10).map(|x| (x as f32 * 0.37).sin() * 3.0).collect();
    let (mut a, mut steps) = (Vec::new(), Vec::new());
    gemm8::quantize_queries(&q, 10, &mut a, &mut steps);
    assert_eq!(a.len(), 2 * 12);
    for i in 0..2 {
        assert_eq!(&a[i * 12 + 10..i * 12 + 12], &[0, 0]);
        for t in 0..10 {
            assert!((f32::from(a[i * 12 + t]) * steps[i] - q[i * 10 + t]).abs() <= steps[i] / 2.0 * 1.0001);
        }
        assert!(a[i * 12..i * 12 + 10].iter().any(|v| v.abs() == 127));
    }
    // A non-finite query row gets step NaN (its scores NaN, as in f32), wherever the value sits.
    for bad in [f32::NAN, f32::INFINITY] {
        let q = [bad, 1.0, 2.0, 3.0, 1.0, bad, 2.0, 0.5];
        gemm8::quantize_queries(&q, 4, &mut a, &mut steps);
        assert!(steps[0].is_nan() && steps[1].is_nan(), "{bad}: {steps:?}");
    }
    let w = [0.5f32, 0.25, 0.0, 1e-3, f32::NAN, 0.125];
    let (mut u, mut ws) = (Vec::new(), Vec::new());
    gemm8::quantize_weights(&w, 6, &mut u, &mut ws);
    assert_eq!(u.len(), BLOCK);
    assert_eq!(&u[..6], &[127, 64, 0, 0, 0, 32]);
    assert!((ws[0] - 0.5 / 127.0).abs() < 1e-9);
}
