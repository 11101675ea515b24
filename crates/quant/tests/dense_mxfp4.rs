//! Fast kernels against their scalar references, over random shapes and values.

mod common;

use common::{assert_close, fast, sum_tolerance};
use half::bf16;
use k3_quant::cpu::Level;
use k3_quant::{dense, mxfp4};
use proptest::prelude::*;

fn floats(n: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-4.0f32..4.0, n)
}

fn mxfp4_matrix(rows: usize, cols: usize) -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (proptest::collection::vec(any::<u8>(), rows * cols / 2), proptest::collection::vec(100u8..150, rows * cols / 32))
}

/// Row r of an MXFP4 matrix decoded by the reference decoder.
fn decoded(packed: &[u8], scale: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut w = vec![0f32; rows * cols];
    for r in 0..rows {
        mxfp4::decode_row(
            &packed[r * cols / 2..][..cols / 2],
            &scale[r * cols / 32..][..cols / 32],
            &mut w[r * cols..][..cols],
        );
    }
    w
}

fn abs_dot_sums(w: &[f32], x: &[f32]) -> Vec<f64> {
    w.chunks(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| f64::from((a * b).abs())).sum()).collect()
}

#[test]
fn mxfp4_decodes_as_the_spec_says() {
    // Byte 0x72: low nibble 2 (1.0) is column 0, high nibble 7 (6.0) column 1. Byte 0xF9: -0.5, -6.
    let mut packed = vec![0u8; 16];
    packed[0] = 0x72;
    packed[1] = 0xF9;
    let mut out = [0f32; 32];
    mxfp4::decode_row(&packed, &[128], &mut out); // scale 2^(128-127) = 2
    assert_eq!(&out[..4], &[2.0, 12.0, -1.0, -12.0]);
    assert!(out[4..].iter().all(|v| *v == 0.0));
    assert_eq!(mxfp4::e8m0(127), 1.0);
    assert_eq!(mxfp4::e8m0(0), 2f32.powi(-127));
    assert!(mxfp4::e8m0(255).is_nan());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn f32_matvec((rows, cols) in (1usize..9, 1usize..300), seed in any::<u64>()) {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i as u64 ^ seed) % 1000) as f32 / 250.0 - 2.0).collect();
        let x: Vec<f32> = (0..cols).map(|i| ((i as u64 * 7 + seed) % 100) as f32 / 25.0 - 2.0).collect();
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        dense::matvec_f32_at(fast(), &w, &x, &mut a);
        dense::matvec_f32_at(Level::Scalar, &w, &x, &mut b);
        let tol: Vec<f64> = abs_dot_sums(&w, &x).iter().map(|s| sum_tolerance(cols, *s)).collect();
        assert_close(&a, &b, &tol);
    }

    #[test]
    fn bf16_matvec(rows in 1usize..9, (cols, x) in (1usize..300).prop_flat_map(|c| (Just(c), floats(c))), bits in any::<u64>()) {
        let w: Vec<bf16> = (0..rows * cols).map(|i| bf16::from_f32(((i as u64).wrapping_mul(bits | 1) % 997) as f32 / 100.0 - 5.0)).collect();
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        dense::matvec_bf16_at(fast(), &w, &x, &mut a);
        dense::matvec_bf16_at(Level::Scalar, &w, &x, &mut b);
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let tol: Vec<f64> = abs_dot_sums(&wf, &x).iter().map(|s| sum_tolerance(cols, *s)).collect();
        assert_close(&a, &b, &tol);
    }

    #[test]
    fn mxfp4_matvec(((rows, cols), (packed, scale), x) in (1usize..7, 1usize..9)
        .prop_flat_map(|(r, b)| (Just((r, b * 32)), mxfp4_matrix(r, b * 32), floats(b * 32)))) {
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        mxfp4::matvec_at(fast(), &packed, &scale, &x, &mut a);
        mxfp4::matvec_at(Level::Scalar, &packed, &scale, &x, &mut b);
        let w = decoded(&packed, &scale, rows, cols);
        let sums = abs_dot_sums(&w, &x);
        let tol: Vec<f64> = sums.iter().map(|s| sum_tolerance(cols, *s)).collect();
        assert_close(&a, &b, &tol);
        // And the reference is the decoded matrix times x.
        let mut c = vec![0f32; rows];
        dense::matvec_f32_at(Level::Scalar, &w, &x, &mut c);
        assert_close(&b, &c, &tol);
    }

    #[test]
    fn mxfp4_batched_equals_one_at_a_time(((rows, cols), (packed, scale), n) in (1usize..6, 1usize..5)
        .prop_flat_map(|(r, b)| (Just((r, b * 32)), mxfp4_matrix(r, b * 32), 1usize..40)), seed in any::<u32>()) {
        let xs: Vec<f32> = (0..n * cols).map(|i| ((i as u32 ^ seed) % 200) as f32 / 50.0 - 2.0).collect();
        let mut ys = vec![0f32; n * rows];
        mxfp4::matmul_at(fast(), &packed, &scale, cols, &xs, &mut ys);
        let mut want = vec![0f32; n * rows];
        mxfp4::matmul_at(Level::Scalar, &packed, &scale, cols, &xs, &mut want);
        let w = decoded(&packed, &scale, rows, cols);
        let tol: Vec<f64> = xs.chunks(cols).flat_map(|x| abs_dot_sums(&w, x)).map(|s| sum_tolerance(cols, s)).collect();
        assert_close(&ys, &want, &tol);
        // Alone or in a batch, a vector gets bit-identical results (prefill equals decode).
        for (x, yb) in xs.chunks(cols).zip(ys.chunks(rows)) {
            let mut y1 = vec![0f32; rows];
            mxfp4::matvec_at(fast(), &packed, &scale, x, &mut y1);
            prop_assert_eq!(y1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }
}

#[test]
fn mxfp4_quantize_reproduces_grid_values_and_rounds_to_nearest() {
    // Values already on the grid come back exactly.
    let grid: Vec<f32> = (0..64).map(|i| mxfp4::E2M1[i % 16] * 0.25).collect();
    let (p, s) = mxfp4::quantize(&grid, 64);
    let mut back = vec![0f32; 64];
    mxfp4::decode_row(&p, &s, &mut back);
    assert_eq!(back.iter().map(|v| v.abs()).collect::<Vec<_>>(), grid.iter().map(|v| v.abs()).collect::<Vec<_>>());
    // Arbitrary values land on the nearest representable value of their block.
    let w: Vec<f32> = (0..32).map(|i| (i as f32 * 0.77).sin() * 3.0).collect();
    let (p, s) = mxfp4::quantize(&w, 32);
    mxfp4::decode_row(&p, &s, &mut back[..32]);
    let step = mxfp4::e8m0(s[0]);
    for (v, b) in w.iter().zip(&back) {
        let nearest = mxfp4::E2M1
            .iter()
            .map(|m| m * step)
            .fold(f32::INFINITY, |best, c| if (c - v).abs() < (best - v).abs() { c } else { best });
        assert_eq!((b - v).abs(), (nearest - v).abs(), "{v} -> {b}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn vector_ops((a, b) in (0usize..300).prop_flat_map(|n| (floats(n), floats(n))), alpha in -2.0f32..2.0, beta in -2.0f32..2.0) {
        use k3_quant::vecops;
        let abs: f64 = a.iter().zip(&b).map(|(x, y)| f64::from((x * y).abs())).sum();
        assert_close(&[vecops::dot_at(fast(), &a, &b)], &[vecops::dot_at(Level::Scalar, &a, &b)], &[sum_tolerance(a.len(), abs)]);
        let (mut y1, mut y2) = (a.clone(), a.clone());
        vecops::axpby_at(fast(), alpha, &mut y1, beta, &b);
        vecops::axpby_at(Level::Scalar, alpha, &mut y2, beta, &b);
        // FMA rounds once where the reference rounds twice: one ulp of each term.
        let tol: Vec<f64> = a.iter().zip(&b).map(|(x, y)| 2.0 * f64::from(f32::EPSILON) * f64::from((alpha * x).abs() + (beta * y).abs())).collect();
        assert_close(&y1, &y2, &tol);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// The fused delta-rule pass gives, at every level, the bits of its three `axpby`s per row
    /// at that level (column counts off the 8s and 16s exercise the tails); the fast level stays
    /// within FMA's rounding of the scalar one.
    #[test]
    fn the_fused_state_pass_is_its_axpbys((rows, cols) in (1usize..20, 1usize..45), seed in any::<u32>()) {
        use k3_quant::vecops;
        let make = |len: usize, s: u32| -> Vec<f32> { (0..len).map(|i| ((i as u32).wrapping_mul(2654435761) ^ s) as f32 / u32::MAX as f32 - 0.5).collect() };
        let (s0, delta) = (make(rows * cols, seed), make(cols, seed ^ 1));
        let (decay, k, cu, co) = (make(rows, seed ^ 2), make(rows, seed ^ 3), make(rows, seed ^ 4), make(rows, seed ^ 5));
        let (u0, o0) = (make(cols, seed ^ 6), make(cols, seed ^ 7));
        let mut fused = Vec::new();
        for level in k3_quant::cpu::levels() {
            let (mut s, mut u, mut o) = (s0.clone(), u0.clone(), o0.clone());
            vecops::update_then_read_at(level, &mut s, &decay, &k, &delta, (&cu, &co), &mut u, &mut o);
            let (mut s2, mut u2, mut o2) = (s0.clone(), u0.clone(), o0.clone());
            for (r, row) in s2.chunks_exact_mut(cols).enumerate() {
                vecops::axpby_at(level, decay[r], row, k[r], &delta);
                vecops::axpby_at(level, 1.0, &mut u2, cu[r], row);
                vecops::axpby_at(level, 1.0, &mut o2, co[r], row);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&s), bits(&s2), "{:?}: state", level);
            prop_assert_eq!(bits(&u), bits(&u2), "{:?}: u", level);
            prop_assert_eq!(bits(&o), bits(&o2), "{:?}: o", level);
            fused.push(o);
        }
        // Every level against the scalar one: values of magnitude < 1, rows + 1 roundings each.
        let tol = vec![4.0 * (rows as f64 + 1.0) * f64::from(f32::EPSILON) * (rows as f64 + 1.0); cols];
        for o in &fused[1..] {
            assert_close(o, &fused[0], &tol);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// `X W` for a batch gives each vector the bits of `W^T x` alone (f32 and bf16), within f32
    /// summation of the product computed in f64.
    #[test]
    fn transposed_products_batch_bit_for_bit((rows, cols, n) in (1usize..20, 1usize..40, 1usize..7), seed in any::<u32>()) {
        use k3_quant::Matrix;
        let make = |len: usize, s: u32| -> Vec<f32> { (0..len).map(|i| ((i as u32).wrapping_mul(2654435761) ^ s) as f32 / u32::MAX as f32 - 0.5).collect() };
        let (w, xs) = (make(rows * cols, seed), make(n * rows, seed ^ 1));
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        let wbf: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
        for (m, dense) in [(Matrix::f32(&w, rows, cols).unwrap(), &w), (Matrix::bf16(&wb, rows, cols).unwrap(), &wbf)] {
            let mut batch = vec![0f32; n * cols];
            let m = m.dense().unwrap();
            m.matmul_transposed(&xs, &mut batch);
            for (x, yb) in xs.chunks_exact(rows).zip(batch.chunks_exact(cols)) {
                let mut y = vec![0f32; cols];
                m.matvec_transposed(x, &mut y);
                prop_assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
                let want: Vec<f32> = (0..cols).map(|c| (0..rows).map(|r| f64::from(dense[r * cols + c]) * f64::from(x[r])).sum::<f64>() as f32).collect();
                let tol: Vec<f64> = (0..cols).map(|c| sum_tolerance(rows, (0..rows).map(|r| f64::from((dense[r * cols + c] * x[r]).abs())).sum())).collect();
                assert_close(yb, &want, &tol);
            }
        }
        let q: Vec<i8> = vec![1; rows * cols];
        let s = vec![1f32; rows];
        let quantized = Matrix::Int8Row { q: &q, scale: &s, rows, cols, act: k3_quant::Activations::Exact };
        prop_assert!(quantized.dense().is_none());
    }
}
