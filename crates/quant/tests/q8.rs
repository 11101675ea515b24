//! Int8-activation products against their scalar references, against exact activations within
//! the rounding of the activations, and alone versus in a batch (bit for bit).

mod common;

use common::{assert_close, exact_products, fast, sum_tolerance};
use half::f16;
use k3_quant::cpu::Level;
use k3_quant::q8::{self, Q8Batch};
use k3_quant::{int4, mxfp4};
use proptest::prelude::*;

/// A weight matrix in one of the three encodings, with its decoded f32 values.
#[derive(Debug, Clone)]
enum Weights {
    Mxfp4(Vec<u8>, Vec<u8>),
    Int4(Vec<u8>, Vec<f16>, usize),
    Int8(Vec<i8>, Vec<f32>),
}

impl Weights {
    fn product(&self, level: Level, x: &Q8Batch, ys: &mut [f32]) {
        match self {
            Weights::Mxfp4(p, s) => q8::matmul_mxfp4_at(level, p, s, x, ys),
            Weights::Int4(q, s, g) => q8::matmul_int4_at(level, q, s, *g, x, ys),
            Weights::Int8(q, s) => q8::matmul_int8_at(level, q, s, x, ys),
        }
    }

    fn decoded(&self, rows: usize, cols: usize) -> Vec<f32> {
        let mut w = vec![0f32; rows * cols];
        let mut e = vec![0f32; cols];
        for r in 0..rows {
            // Column c of row r is W e_c; decode through the exact f32 kernels' references.
            for c in 0..cols {
                e.fill(0.0);
                e[c] = 1.0;
                let mut y = vec![0f32; rows];
                match self {
                    Weights::Mxfp4(p, s) => mxfp4::reference::matvec(p, s, &e, &mut y),
                    Weights::Int4(q, s, g) => int4::reference::matvec(q, s, *g, &e, &mut y),
                    Weights::Int8(q, s) => k3_quant::int8::reference::matvec(q, s, &e, &mut y),
                }
                w[r * cols + c] = y[r];
            }
        }
        w
    }
}

fn weights(rows: usize, cols: usize) -> impl Strategy<Value = Weights> {
    let n = rows * cols;
    prop_oneof![
        // Exponents below 2 are subnormal halves (the kernels take them apart from the rest).
        (
            proptest::collection::vec(any::<u8>(), n / 2),
            proptest::collection::vec(prop_oneof![8 => 100u8..150, 1 => 0u8..4, 1 => 180u8..200], n / 32)
        )
            .prop_map(|(p, s)| Weights::Mxfp4(p, s)),
        // Groups of 32 (the trunk's) and wider ones where the columns allow.
        (
            proptest::collection::vec(any::<u8>(), n / 2),
            proptest::collection::vec(-2.0f32..2.0, n / 32),
            prop_oneof![Just(32usize), Just(64), Just(128)].prop_map(move |g| if cols.is_multiple_of(g) {
                g
            } else {
                32
            })
        )
            .prop_map(move |(q, s, g)| { Weights::Int4(q, s.into_iter().take(n / g).map(f16::from_f32).collect(), g) }),
        (proptest::collection::vec(-127i8..=127, n), proptest::collection::vec(0.001f32..0.1, rows))
            .prop_map(|(q, s)| Weights::Int8(q, s)),
    ]
}

/// Rows, 32-blocks per row, a matrix, and `n` vectors with outliers (as hidden states have).
fn case() -> impl Strategy<Value = (usize, usize, Weights, Vec<f32>)> {
    (1usize..10, 1usize..6, 1usize..11).prop_flat_map(|(rows, blocks, n)| {
        let cols = blocks * 32;
        (
            Just(rows),
            Just(cols),
            weights(rows, cols),
            proptest::collection::vec(prop_oneof![9 => -3.0f32..3.0, 1 => -80.0f32..80.0], n * cols),
        )
    })
}

/// The SIMD levels this CPU runs (at least one: `fast` insists on AVX2 unless told otherwise).
fn simd_levels() -> Vec<Level> {
    let _ = fast();
    k3_quant::cpu::levels().into_iter().filter(|l| *l != Level::Scalar).collect()
}

/// Sum over blocks of |dot| * |scale|: the magnitude the reference's float sums work on.
fn abs_sums(w: &[f32], x: &Q8Batch, rows: usize) -> Vec<f64> {
    let cols = x.cols();
    (0..x.vectors())
        .flat_map(|v| {
            let xv = x.dequantize(v);
            (0..rows)
                .map(move |r| w[r * cols..][..cols].iter().zip(&xv).map(|(a, b)| f64::from((a * b).abs())).sum::<f64>())
                .collect::<Vec<_>>()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Every SIMD level (AVX-512 VNNI and AVX2 where the CPU has them): the reference's bits for a
    /// batch, within rounding of them for a few vectors.
    #[test]
    fn fast_kernels_match_the_reference_and_exact_activations((rows, cols, w, xs) in case()) {
        let x = Q8Batch::quantize(&xs, cols);
        let n = x.vectors();
        let mut want = vec![0f32; n * rows];
        w.product(Level::Scalar, &x, &mut want);
        let dense = w.decoded(rows, cols);
        for level in simd_levels() {
            let mut got = vec![0f32; n * rows];
            w.product(level, &x, &mut got);
            if n > q8::FEW {
                // Batches follow the reference's order (exact block dots, one fused multiply-add
                // per block in order): the same bits.
                let bits = |y: &[f32]| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want), "{:?}", level);
            } else {
                // A few vectors sum the same exact block dots in another order.
                let tol: Vec<f64> =
                    abs_sums(&dense, &x, rows).iter().map(|s| sum_tolerance(cols, *s) * 2.0).collect();
                assert_close(&got, &want, &tol);
            }
        }
        // Against f32 activations: each activation is off by at most half its block's step.
        let exact = exact_products(&dense, &xs, rows, cols);
        let bound: Vec<f64> = xs.chunks(cols).flat_map(|xv| {
            let dense = &dense;
            (0..rows).map(move |r| {
                let row = &dense[r * cols..][..cols];
                let q: f64 = xv.chunks(32).zip(row.chunks(32)).map(|(xb, wb)| {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    wb.iter().map(|v| f64::from(v.abs())).sum::<f64>() * f64::from(amax) / 254.0 * 1.0001
                }).sum();
                let mag: f64 = row.iter().zip(xv).map(|(a, b)| f64::from((a * b).abs())).sum();
                q + sum_tolerance(cols, mag + q) * 2.0
            }).collect::<Vec<_>>()
        }).collect();
        assert_close(&want, &exact, &bound);
    }

    /// Alone or among a few (decode, a few sequences' steps, a short verify): the same bits.
    /// Larger batches give the reference's bits (above).
    #[test]
    fn a_vector_gets_the_same_bits_alone_or_among_a_few((rows, cols, w, xs) in case()) {
        let cols_n = xs.len() / cols;
        let xs = &xs[..cols_n.min(q8::FEW) * cols];
        let x = Q8Batch::quantize(xs, cols);
        let n = x.vectors();
        for level in simd_levels() {
            let mut batch = vec![0f32; n * rows];
            w.product(level, &x, &mut batch);
            for (v, yb) in batch.chunks(rows).enumerate() {
                let one = Q8Batch::quantize(&xs[v * cols..][..cols], cols);
                let mut y = vec![0f32; rows];
                w.product(level, &one, &mut y);
                let bits = |y: &[f32]| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&y), bits(yb), "{:?}", level);
            }
        }
    }
}

/// The extremes through AVX2's pair sums (`vpmaddubsw` saturates at 16 bits): int8 weights of
/// -128 and 127 against activations of -127 and 127, for one vector (the few-vector order) and a
/// batch (the reference's order), agree with the reference: saturation would be off by thousands.
#[test]
fn avx2_pair_sums_do_not_saturate_at_the_extremes() {
    #[cfg(target_arch = "x86_64")]
    if k3_quant::cpu::levels().contains(&Level::Avx2) {
        let cols = 64;
        let one: Vec<f32> = (0..cols).map(|c| if c % 3 == 0 { -1.0 } else { 1.0 }).collect();
        let mut q: Vec<i8> = (0..cols).map(|c| if c % 3 == 0 { -128 } else { 127 }).collect();
        q.extend((0..cols).map(|c| if c % 2 == 0 { 127 } else { -128 }));
        let scale = [0.5f32, 0.25];
        for n in [1, q8::FEW + 1] {
            let x = Q8Batch::quantize(&one.repeat(n), cols);
            let (mut got, mut want) = (vec![0f32; 2 * n], vec![0f32; 2 * n]);
            q8::matmul_int8_at(Level::Avx2, &q, &scale, &x, &mut got);
            q8::matmul_int8_at(Level::Scalar, &q, &scale, &x, &mut want);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{n} vectors: {got:?} against {want:?}");
            }
            // The integer dot (the output over step 1/127 and scale 1/2): far past 16 bits, as
            // are the pairs' sums (-128 * -127 + 127 * 127) within it.
            assert!(want[0] * 127.0 / 0.5 > 1e6, "{want:?}");
        }
    }
}

/// A batch of no vectors is an empty product at every level, not a panic.
#[test]
fn no_vectors_give_an_empty_product_at_every_level() {
    let x = Q8Batch::quantize(&[], 64);
    let (packed, scale) = (vec![0x21u8; 2 * 32], vec![127u8; 2 * 2]);
    for level in k3_quant::cpu::levels() {
        let mut ys: Vec<f32> = Vec::new();
        q8::matmul_mxfp4_at(level, &packed, &scale, &x, &mut ys);
        assert!(ys.is_empty(), "{level:?}");
    }
}

/// Values with ties (x.5 steps), infinities, NaNs, zeros and tiny blocks, to reach each branch.
fn activations() -> impl Strategy<Value = (usize, Vec<f32>)> {
    (1usize..4, 1usize..5).prop_flat_map(|(blocks, n)| {
        let value = prop_oneof![
            6 => -8.0f32..8.0,
            1 => (-254i32..=254).prop_map(|k| k as f32 * 0.5),
            1 => Just(0.0f32),
            1 => Just(-0.0f32),
            1 => -1e-37f32..1e-37,
            1 => prop_oneof![Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(f32::NAN)],
        ];
        (Just(blocks * 32), proptest::collection::vec(value, blocks * 32 * n))
    })
}

proptest! {
    #[test]
    fn every_level_quantizes_to_the_same_bits((cols, xs) in activations()) {
        let mut want = Q8Batch::default();
        want.quantize_into_at(Level::Scalar, &xs, cols);
        for level in k3_quant::cpu::levels() {
            let mut got = Q8Batch::default();
            got.quantize_into_at(level, &xs, cols);
            prop_assert_eq!(got.values(), want.values(), "{:?}", level);
            let bits = |q: &Q8Batch| q.steps().iter().map(|d| d.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&got), bits(&want), "{:?}", level);
        }
    }
}

#[test]
fn quantization_rounds_to_the_nearest_step_and_keeps_nan() {
    let mut x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
    x[40] = f32::NAN;
    let q = Q8Batch::quantize(&x, 64);
    let back = q.dequantize(0);
    // Block 0: max |x| = 20, step 20/127; every value within half a step.
    for (a, b) in x[..32].iter().zip(&back[..32]) {
        assert!((a - b).abs() <= 20.0 / 254.0 * 1.0001, "{a} came back as {b}");
    }
    assert_eq!(back[0], -20.0);
    // Block 1 holds a NaN: its step is NaN, so the NaN reaches every product as in f32.
    assert!(q.steps()[1].is_nan());
    let w = vec![1i8; 64];
    let mut y = [0f32];
    q8::matmul_int8(&w, &[1.0], &q, &mut y);
    assert!(y[0].is_nan());
}

#[test]
fn vnni_is_used_where_the_cpu_has_it() {
    // The property tests compare the VNNI kernels with the references only where the kernels are
    // chosen; on a CPU with the instructions (and no K3_SIMD cap) they must be.
    #[cfg(target_arch = "x86_64")]
    if std::env::var_os("K3_SIMD").is_none()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vbmi")
    {
        assert!(q8::available(), "this CPU has VNNI but the int8 kernels are not chosen");
    }
    eprintln!("q8 VNNI kernels available: {}", q8::available());
}

/// Shapes the int8 kernels do not take (a model file may hold them: int4 groups of 16, rows of
/// 48) run exact when int8 activations are asked for, never reaching the kernels' shape checks.
#[test]
fn shapes_the_kernels_do_not_take_run_exact() {
    use k3_quant::{Activations, Matrix, int4, int8};
    let (rows, cols) = (5, 48);
    let w = k3_quant::rng::noise(rows * cols, 9, 1.0);
    let xs = k3_quant::rng::noise(3 * cols, 10, 1.0);
    let (q4, s4) = int4::quantize(&w, cols, 16);
    let (q8, s8) = int8::quantize(&w, cols);
    for m in [
        Matrix::Int4Group { q: &q4, scale: &s4, group: 16, rows, cols, act: Activations::Exact },
        Matrix::Int8Row { q: &q8, scale: &s8, rows, cols, act: Activations::Exact },
    ] {
        let int8 = m.with_activations(Activations::Int8);
        assert!(!int8.takes_q8(), "{m:?}");
        let (mut a, mut b) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        m.matmul(&xs, &mut a);
        int8.matmul(&xs, &mut b);
        assert_eq!(a, b);
        k3_quant::par::matmul(&int8, &xs, &mut b);
        assert_eq!(a, b);
    }
    // No columns (a matrix built by hand; files refuse empty shapes): exact, zeros, no panic.
    let empty = Matrix::Int8Row { q: &[], scale: &[1.0, 1.0], rows: 2, cols: 0, act: Activations::Int8 };
    assert!(!empty.takes_q8());
    let mut y = [f32::NAN; 2];
    empty.matvec(&[], &mut y);
    assert_eq!(y, [0.0, 0.0]);
}

/// MXFP4 blocks whose E8M0 exponents are 0 and 1 (subnormal halves: the fast kernels take them
/// apart from the rest) and 255 (NaN), at every SIMD level and batch size, against the reference.
/// Their products are ~1e-36: the tolerance is relative to them, not the absolute floor of the
/// proptests'.
#[test]
fn mxfp4_special_exponents_match_the_reference() {
    let (rows, cols) = (6, 160);
    // Row 4 (the NaN's) all positive, as are the activations.
    let packed: Vec<u8> =
        (0..rows * cols / 2).map(|i| if i / (cols / 2) == 4 { 0x22 } else { (i * 37 % 251) as u8 }).collect();
    // A row's five blocks: all 0, all 1, both, 0 to 3, a NaN among normal ones, 1 and 2.
    let scale: Vec<u8> =
        [[0u8; 5], [1; 5], [0, 1, 0, 1, 0], [0, 1, 2, 3, 1], [2, 255, 127, 2, 3], [1, 2, 1, 2, 1]].concat();
    let w = Weights::Mxfp4(packed, scale.clone());
    let dense = w.decoded(rows, cols);
    for n in [1, 3, q8::FEW + 1] {
        // Only each block's first 8 columns: the kernels' lanes holding them carry the whole
        // dot (and the offset's sum), so a wrong huge scale gives +inf, not inf - inf.
        let xs: Vec<f32> =
            (0..n * cols).map(|i| if i % 32 < 8 { ((i * 29 % 61) as f32 + 1.0) / 7.0 } else { 0.0 }).collect();
        let x = Q8Batch::quantize(&xs, cols);
        let mut want = vec![0f32; n * rows];
        w.product(Level::Scalar, &x, &mut want);
        let mags = abs_sums(&dense, &x, rows);
        for level in simd_levels() {
            let mut got = vec![0f32; n * rows];
            w.product(level, &x, &mut got);
            for (i, ((g, w), m)) in got.iter().zip(&want).zip(&mags).enumerate() {
                if w.is_nan() {
                    assert!(g.is_nan(), "{level:?} n={n} element {i}: {g} where the reference has NaN");
                } else {
                    let tol = 4.0 * cols as f64 * f64::from(f32::EPSILON) * m;
                    assert!((f64::from(*g) - f64::from(*w)).abs() <= tol, "{level:?} n={n} element {i}: {g} vs {w}");
                }
            }
        }
    }
}
