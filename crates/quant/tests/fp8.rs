//! FP8 e4m3 widening: the reference gives the OCP standard's values, and every kernel level gives
//! the reference's bits for every byte, at every length and offset.

use k3_quant::Matrix;
use k3_quant::cpu::levels;
use k3_quant::fp8::{self, Fp8Ref, e4m3, is_nan, to_e4m3, widen_at};
use proptest::prelude::*;

#[test]
fn e4m3_values_are_the_standards() {
    // OCP FP8 e4m3fn: max 448, min normal 2^-6, min subnormal 2^-9, NaN at 0x7F / 0xFF.
    assert_eq!(e4m3(0x7E), 448.0);
    assert_eq!(e4m3(0xFE), -448.0);
    assert_eq!(e4m3(0x08), 2f32.powi(-6));
    assert_eq!(e4m3(0x07), 7.0 * 2f32.powi(-9));
    assert_eq!(e4m3(0x01), 2f32.powi(-9));
    assert_eq!(e4m3(0x38), 1.0);
    assert_eq!(e4m3(0x00), 0.0);
    assert!(e4m3(0x80) == 0.0 && e4m3(0x80).is_sign_negative());
    assert!(e4m3(0x7F).is_nan() && e4m3(0xFF).is_nan());
}

fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

#[test]
fn every_byte_widens_to_the_references_bits_at_every_level() {
    let all: Vec<u8> = (0..=255u8).collect();
    for level in levels() {
        let mut out = vec![0f32; 256];
        widen_at(level, &all, &mut out);
        for (b, v) in all.iter().zip(&out) {
            assert!(same(*v, e4m3(*b)), "{level:?}: byte {b:#04x} gave {v}, not {}", e4m3(*b));
        }
    }
}

proptest! {
    #[test]
    fn any_slice_widens_as_the_reference(bytes in proptest::collection::vec(any::<u8>(), 0..100), skip in 0usize..8) {
        let bytes = &bytes[skip.min(bytes.len())..];
        for level in levels() {
            let mut out = vec![0f32; bytes.len()];
            widen_at(level, bytes, &mut out);
            for (b, v) in bytes.iter().zip(&out) {
                prop_assert!(same(*v, e4m3(*b)), "{:?}: byte {:#04x}", level, b);
            }
        }
    }
}

/// Weights, scales and vectors for a product test: random bytes without the NaN pair, scales
/// spanning a few orders of magnitude.
fn fp8_case(
    rows: usize,
    cols: usize,
    block_rows: usize,
    block_cols: usize,
    n: usize,
    seed: u64,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let mut rng = k3_quant::rng::XorShift::new(seed);
    let q: Vec<u8> = (0..rows * cols)
        .map(|_| {
            loop {
                let b = rng.next_u64() as u8;
                if !is_nan(b) {
                    break b;
                }
            }
        })
        .collect();
    let blocks = rows.div_ceil(block_rows) * cols.div_ceil(block_cols);
    let scale: Vec<f32> = k3_quant::rng::noise(blocks, seed ^ 7, 6.0).iter().map(|e| 2f32.powf(*e - 12.0)).collect();
    (q, scale, k3_quant::rng::noise(n * cols, seed ^ 9, 2.0))
}

/// `W x` in f64 from the format's definition (`e4m3 * scale`), and each row's sum of the
/// terms' magnitudes (what f32 rounding errors scale with).
fn exact(q: &[u8], scale: &[f32], cols: usize, br: usize, bc: usize, x: &[f32]) -> Vec<(f64, f64)> {
    let blocks = cols.div_ceil(bc);
    q.chunks(cols)
        .enumerate()
        .map(|(r, row)| {
            row.iter().enumerate().fold((0.0, 0.0), |(sum, abs), (c, b)| {
                let t = f64::from(e4m3(*b)) * f64::from(scale[r / br * blocks + c / bc]) * f64::from(x[c]);
                (sum + t, abs + t.abs())
            })
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Every level gives the reference's bits for every vector of a batch, a batch gives the bits
    /// of its vectors one by one, and the reference is the format's product to f32 rounding.
    #[test]
    fn block_products_match_the_reference_bit_for_bit(
        rows in 1usize..40, cols in 1usize..300, br in 1usize..50, bcw in 1usize..5, n in 1usize..7, seed in any::<u64>(),
    ) {
        let bc = bcw * 32;
        let (q, scale, xs) = fp8_case(rows, cols, br, bc, n, seed);
        let m = Fp8Ref::new(&q, &scale, rows, cols, br, bc).unwrap();
        let mut want = vec![0f32; n * rows];
        for (x, y) in xs.chunks(cols).zip(want.chunks_mut(rows)) {
            fp8::reference::matvec(&m, x, y);
            // f32 sums of at most 300 terms: within 300 x 2^-24 of the terms' magnitude.
            for (got, (e, abs)) in y.iter().zip(exact(&q, &scale, cols, br, bc, x)) {
                prop_assert!((f64::from(*got) - e).abs() <= 2e-5 * abs + 1e-30, "{got} vs {e}");
            }
        }
        for level in levels() {
            let mut ys = vec![0f32; n * rows];
            m.matmul_at(level, &xs, &mut ys);
            prop_assert!(bits(&ys) == bits(&want), "{:?}: a batch of {}", level, n);
            for (x, y) in xs.chunks(cols).zip(want.chunks(rows)) {
                let mut one = vec![0f32; rows];
                m.matmul_at(level, x, &mut one);
                prop_assert!(bits(&one) == bits(y), "{:?}: one vector", level);
            }
        }
    }

    /// A view of some rows takes its own rows' block scales (`row0`), and a transposed product
    /// widens each row to the dequantized f32 weights.
    #[test]
    fn row_views_and_transposed_products_take_their_rows_scales(
        rows in 2usize..60, cols in 1usize..200, br in 1usize..20, start in 0usize..60, seed in any::<u64>(),
    ) {
        let start = start % rows;
        let (q, scale, x) = fp8_case(rows, cols, br, 32, 1, seed);
        let m = Fp8Ref::new(&q, &scale, rows, cols, br, 32).unwrap();
        let mut whole = vec![0f32; rows];
        m.matvec(&x, &mut whole);
        let v = m.rows_view(start, rows - start).unwrap();
        let mut part = vec![0f32; rows - start];
        v.matvec(&x, &mut part);
        prop_assert!(bits(&part) == bits(&whole[start..]));
        // Transposed: x' (rows long) through W^T against the dequantized weights in f64.
        let xt = k3_quant::rng::noise(rows - start, seed ^ 3, 2.0);
        let dense = Matrix::Fp8(v).dense().unwrap();
        let mut y = vec![0f32; cols];
        dense.matvec_transposed(&xt, &mut y);
        let blocks = cols.div_ceil(32);
        for (c, got) in y.iter().enumerate() {
            let want: f64 = (0..rows - start).map(|r| {
                let rr = r + start;
                f64::from(e4m3(q[rr * cols + c]) * scale[rr / br * blocks + c / 32]) * f64::from(xt[r])
            }).sum();
            let norm: f64 = (0..rows - start).map(|r| f64::from((e4m3(q[(r + start) * cols + c]) * scale[(r + start) / br * blocks + c / 32] * xt[r]).abs())).sum();
            prop_assert!((f64::from(*got) - want).abs() <= 1e-6 * norm.max(1e-30), "column {c}: {got} vs {want}");
        }
    }

    /// Quantization picks the nearest e4m3 value, and DeepSeek's blocks keep every value within
    /// half a step of the original.
    #[test]
    fn quantization_rounds_to_nearest(v in -500f32..500.0) {
        let b = to_e4m3(v);
        let got = e4m3(b);
        for c in (0..=255u8).filter(|c| !is_nan(*c)) {
            prop_assert!((e4m3(c) - v).abs() >= (got - v).abs() || v.abs() > 448.0, "{v}: {got} but {} is nearer", e4m3(c));
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn deepseek_block_quantization_scales_each_block_to_448() {
    let (rows, cols) = (130, 200);
    let w = k3_quant::rng::noise(rows * cols, 5, 2.0);
    let (q, scale) = fp8::quantize(&w, rows, cols, 128);
    assert_eq!(scale.len(), 2 * 2);
    // Each block's largest weight lands on ±448 (up to rounding), every weight within e4m3's
    // half step (2^-4 relative) of its value.
    assert!(q.iter().any(|b| b & 0x7F == 0x7E));
    for (i, (b, v)) in q.iter().zip(&w).enumerate() {
        let s = scale[i / cols / 128 * 2 + i % cols / 128];
        let back = e4m3(*b) * s;
        assert!((back - v).abs() <= v.abs() / 16.0 + 2f32.powi(-10) * s, "{v} -> {back}");
    }
}
