//! int8 per-row and int4 grouped trunk quantization: encoders bounded, kernels equal to references.

mod common;

use common::{assert_close, fast, sum_tolerance};
use k3_quant::cpu::Level;
use k3_quant::{int2, int4, int8, rtn};
use proptest::prelude::*;

/// Values in [-2, 2).
fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    k3_quant::rng::noise(rows * cols, seed, 4.0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn int8_rows(rows in 1usize..8, cols in 1usize..200, seed in any::<u64>()) {
        let w = matrix(rows, cols, seed);
        let x = matrix(1, cols, seed ^ 99);
        let (q, s) = int8::quantize(&w, cols);
        for (r, row) in w.chunks(cols).enumerate() {
            for (c, v) in row.iter().enumerate() {
                let back = f32::from(q[r * cols + c]) * s[r];
                prop_assert!((back - v).abs() <= s[r] * 0.5001, "row {r} col {c}: {v} -> {back}");
            }
        }
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        int8::matvec_at(fast(), &q, &s, &x, &mut a);
        int8::matvec_at(Level::Scalar, &q, &s, &x, &mut b);
        let tol: Vec<f64> = (0..rows).map(|r| {
            let sum: f64 = (0..cols).map(|c| f64::from((f32::from(q[r * cols + c]) * s[r] * x[c]).abs())).sum();
            sum_tolerance(cols, sum)
        }).collect();
        assert_close(&a, &b, &tol);
    }

    /// Rows past a tile of four and more than sixteen groups a row (the AVX-512 kernel converts
    /// scales sixteen at a time) are covered.
    /// The AVX-512 int8 kernel gives the AVX2 kernel's bits, alone and in batches of every width.
    #[test]
    fn int8_simd_levels_give_the_same_bits(rows in 1usize..11, cols in 1usize..300, n in 1usize..7, seed in any::<u64>()) {
        let (q, s) = int8::quantize(&matrix(rows, cols, seed), cols);
        let xs = matrix(n, cols, seed ^ 3);
        let simd: Vec<Level> = k3_quant::cpu::levels().into_iter().filter(|l| *l != Level::Scalar).collect();
        let outputs: Vec<(Vec<f32>, Vec<f32>)> = simd.iter().map(|&level| {
            let mut y = vec![0f32; rows];
            int8::matvec_at(level, &q, &s, &xs[..cols], &mut y);
            let mut ys = vec![0f32; n * rows];
            int8::matmul_at(level, &q, &s, cols, &xs, &mut ys);
            (y, ys)
        }).collect();
        for (level, out) in simd.iter().zip(&outputs) {
            prop_assert!(out == &outputs[0], "{level:?} against {:?}", simd[0]);
            prop_assert!(out.0[..] == out.1[..rows], "{level:?}: a batch's first vector alone");
        }
    }

    #[test]
    fn int4_groups(rows in 1usize..10, groups in prop_oneof![1usize..6, 15usize..40], group in prop::sample::select(vec![16usize, 32, 64, 128]), fitted in any::<bool>(), seed in any::<u64>()) {
        let cols = groups * group;
        let w = matrix(rows, cols, seed);
        let x = matrix(1, cols, seed ^ 7);
        let scale = if fitted { rtn::Scale::Fitted } else { rtn::Scale::Few };
        let (q, s) = int4::quantize_bits(&w, cols, group, 4, scale);
        let back = rtn::roundtrip(&w, cols, 4, group, scale);
        // The packed nibbles decode to exactly what the round-to-nearest reference produces.
        for (i, want) in back.iter().enumerate() {
            let byte = q[i / 2];
            let nib = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
            prop_assert_eq!((f32::from(nib) - 8.0) * s[i / group].to_f32(), *want);
        }
        // Every value is within half a step of its original, or clipped to an end level (the
        // error-minimizing scale may clip the largest magnitude; a negative scale puts a positive
        // value's end at level -8).
        for (i, (v, b)) in w.iter().zip(&back).enumerate() {
            let st = s[i / group].to_f32();
            let clipped = [-8.0 * st, 7.0 * st].iter().any(|end| b == end && v * b > 0.0 && v.abs() > b.abs());
            prop_assert!((v - b).abs() <= st.abs() * 0.5001 || clipped, "value {i}: {v} -> {b} (step {st})");
        }
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        int4::matvec_at(fast(), &q, &s, group, &x, &mut a);
        int4::matvec_at(Level::Scalar, &q, &s, group, &x, &mut b);
        let tol: Vec<f64> = (0..rows).map(|r| {
            sum_tolerance(cols, (0..cols).map(|c| f64::from((back[r * cols + c] * x[c]).abs())).sum())
        }).collect();
        assert_close(&a, &b, &tol);
    }

    /// HOBBIT's 2-bit copies: the crumbs decode to exactly the 2-bit round-to-nearest reference;
    /// the SIMD kernel equals the scalar reference within summation order, one vector alone or
    /// in a batch (the same bits either way).
    #[test]
    fn int2_groups(rows in 1usize..10, groups in prop_oneof![1usize..6, 15usize..40], group in prop::sample::select(vec![16usize, 32, 64]), n in 1usize..7, seed in any::<u64>()) {
        let cols = groups * group;
        let w = matrix(rows, cols, seed);
        let xs = matrix(n, cols, seed ^ 7);
        let (q, s) = int2::quantize(&w, cols, group);
        let back = rtn::roundtrip(&w, cols, 2, group, rtn::Scale::Few);
        for (i, want) in back.iter().enumerate() {
            let crumb = (q[i / 4] >> (2 * (i % 4))) & 3;
            prop_assert_eq!((f32::from(crumb) - 2.0) * s[i / group].to_f32(), *want);
        }
        let x = &xs[..cols];
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        int2::matvec_at(fast(), &q, &s, group, x, &mut a);
        int2::matvec_at(Level::Scalar, &q, &s, group, x, &mut b);
        let tol: Vec<f64> = (0..rows).map(|r| {
            sum_tolerance(cols, (0..cols).map(|c| f64::from((back[r * cols + c] * x[c]).abs())).sum())
        }).collect();
        assert_close(&a, &b, &tol);
        let mut batch = vec![0f32; n * rows];
        int2::matmul_at(fast(), &q, &s, group, cols, &xs, &mut batch);
        prop_assert!(batch[..rows] == a[..], "a batch's first vector against the vector alone");
        for (t, y) in batch.chunks(rows).enumerate() {
            let mut single = vec![0f32; rows];
            int2::matvec_at(fast(), &q, &s, group, &xs[t * cols..(t + 1) * cols], &mut single);
            prop_assert!(y == &single[..], "vector {t} of the batch");
        }
    }

    /// 3-bit levels stored as int4 decode to exactly the 3-bit round-to-nearest reference, and
    /// use only the 3-bit levels -4..=3.
    #[test]
    fn rtn3_in_the_int4_layout(rows in 1usize..4, groups in 1usize..4, seed in any::<u64>()) {
        let cols = groups * 32;
        let w = matrix(rows, cols, seed);
        let (q, s) = int4::quantize_bits(&w, cols, 32, 3, rtn::Scale::Few);
        let back = rtn::roundtrip(&w, cols, 3, 32, rtn::Scale::Few);
        for (i, want) in back.iter().enumerate() {
            let nib = if i % 2 == 0 { q[i / 2] & 15 } else { q[i / 2] >> 4 };
            prop_assert!((4..=11).contains(&nib), "value {i}: level {}", i32::from(nib) - 8);
            prop_assert_eq!((f32::from(nib) - 8.0) * s[i / 32].to_f32(), *want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// A table lookup reads the weights the exact products multiply: row `r`'s value in column
    /// `c` is the product's output `r` for the unit vector `e_c` (every other term a zero), for
    /// int8 rows and int4 groups; rows past the end and outputs of another length are refused.
    #[test]
    fn table_rows_are_the_weights_the_products_multiply(rows in 1usize..6, groups in 1usize..5, seed in any::<u64>()) {
        let cols = 32 * groups;
        let w = matrix(rows, cols, seed);
        let (q8, s8) = int8::quantize(&w, cols);
        let (q4, s4) = int4::quantize(&w, cols, 32);
        let exact = k3_quant::Activations::Exact;
        let tables = [
            k3_quant::Matrix::Int8Row { q: &q8, scale: &s8, rows, cols, act: exact },
            k3_quant::Matrix::Int4Group { q: &q4, scale: &s4, group: 32, rows, cols, act: exact },
        ];
        for m in tables {
            prop_assert!(m.reads_rows());
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                prop_assert!(m.row_values(r, &mut row));
                for c in 0..cols {
                    let mut e = vec![0f32; cols];
                    e[c] = 1.0;
                    let mut y = vec![0f32; rows];
                    m.matvec(&e, &mut y);
                    prop_assert_eq!(row[c], y[r], "{:?} row {} col {}", m.rows(), r, c);
                }
            }
            prop_assert!(!m.row_values(rows, &mut row));
            prop_assert!(!m.row_values(0, &mut row[1..]));
        }
    }
}

#[test]
fn rtn3_levels_and_error() {
    // 3-bit: levels -4..=3; a ramp is reproduced within half a step.
    let w: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    let back = rtn::roundtrip(&w, 32, 3, 32, rtn::Scale::Few);
    let distinct: std::collections::BTreeSet<i64> = back.iter().map(|v| (v * 1e4) as i64).collect();
    assert!(distinct.len() <= 8, "{distinct:?}");
    let err: f32 = w.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum::<f32>().sqrt()
        / w.iter().map(|a| a * a).sum::<f32>().sqrt();
    assert!(err < 0.2, "relative error {err}");
}
