//! Bf16-activation products against their scalar reference (bit for bit) and against exact
//! activations within the rounding of the activations.

mod common;

use common::{assert_close, exact_products, fast, sum_tolerance};
use half::{bf16, f16};
use k3_quant::bf16dot::{self, Bf16Batch, Weights};
use k3_quant::cpu::Level;
use k3_quant::{dense, int4, int8};
use proptest::prelude::*;

/// Owned parts of a matrix in one of the three encodings.
#[derive(Debug, Clone)]
enum Parts {
    Bf16(Vec<bf16>),
    Int8(Vec<i8>, Vec<f32>),
    Int4(Vec<u8>, Vec<f16>, usize),
}

impl Parts {
    fn weights(&self) -> Weights<'_> {
        match self {
            Parts::Bf16(w) => Weights::Bf16(w),
            Parts::Int8(q, s) => Weights::Int8 { q, scale: s },
            Parts::Int4(q, s, g) => Weights::Int4 { q, scale: s, group: *g },
        }
    }

    /// The weights as f32, through the exact kernels' references (column c of row r is W e_c).
    fn decoded(&self, rows: usize, cols: usize) -> Vec<f32> {
        let mut w = vec![0f32; rows * cols];
        let mut e = vec![0f32; cols];
        let mut y = vec![0f32; rows];
        for c in 0..cols {
            e.fill(0.0);
            e[c] = 1.0;
            match self {
                Parts::Bf16(b) => dense::reference::matvec_bf16(b, &e, &mut y),
                Parts::Int8(q, s) => int8::reference::matvec(q, s, &e, &mut y),
                Parts::Int4(q, s, g) => int4::reference::matvec(q, s, *g, &e, &mut y),
            }
            for r in 0..rows {
                w[r * cols + c] = y[r];
            }
        }
        w
    }
}

fn parts(rows: usize, cols: usize, group: usize) -> impl Strategy<Value = Parts> {
    let n = rows * cols;
    prop_oneof![
        proptest::collection::vec(-2.0f32..2.0, n)
            .prop_map(|w| Parts::Bf16(w.into_iter().map(bf16::from_f32).collect())),
        (proptest::collection::vec(any::<i8>(), n), proptest::collection::vec(0.001f32..0.1, rows))
            .prop_map(|(q, s)| Parts::Int8(q, s)),
        (proptest::collection::vec(any::<u8>(), n / 2), proptest::collection::vec(-2.0f32..2.0, n / group))
            .prop_map(move |(q, s)| Parts::Int4(q, s.into_iter().map(f16::from_f32).collect(), group)),
    ]
}

/// Rows (tails of the 4-row tiles included), columns in whole groups, and 5 to 53 vectors
/// (tails of the 16-vector groups and of the 3-group sets), with outliers as hidden states have.
fn case() -> impl Strategy<Value = (usize, usize, Parts, Vec<f32>)> {
    (1usize..11, prop_oneof![Just(2usize), Just(8), Just(32)], 1usize..5, 5usize..54).prop_flat_map(
        |(rows, group, groups, n)| {
            let cols = group * groups;
            (
                Just(rows),
                Just(cols),
                parts(rows, cols, group),
                proptest::collection::vec(
                    prop_oneof![9 => -3.0f32..3.0, 1 => -80.0f32..80.0, 1 => Just(0.0f32)],
                    n * cols,
                ),
            )
        },
    )
}

fn bits(y: &[f32]) -> Vec<u32> {
    y.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn the_kernel_gives_the_references_bits_and_the_exact_product_within_rounding((rows, cols, p, xs) in case()) {
        let x = Bf16Batch::round(&xs, cols);
        let n = x.vectors();
        let w = p.weights();
        let (mut got, mut want) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        bf16dot::matmul_at(fast(), &w, &x, &mut got);
        bf16dot::matmul_at(Level::Scalar, &w, &x, &mut want);
        prop_assert_eq!(bits(&got), bits(&want));
        // Against f32 activations: each is off by at most 2^-8 of itself (half a unit in its 8th bit), then f32 sums.
        let dense = p.decoded(rows, cols);
        let exact = exact_products(&dense, &xs, rows, cols);
        let bound: Vec<f64> = xs.chunks(cols).flat_map(|xv| {
            let dense = &dense;
            (0..rows).map(move |r| {
                let mag: f64 = dense[r * cols..][..cols].iter().zip(xv).map(|(a, b)| f64::from((a * b).abs())).sum();
                mag * (2f64.powi(-8) * 1.0001) + sum_tolerance(cols, mag) * 4.0
            }).collect::<Vec<_>>()
        }).collect();
        assert_close(&want, &exact, &bound);
    }
}

#[test]
fn rounding_is_to_nearest_even_and_flushes_subnormals() {
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even, 1. Just above it rounds up.
    assert_eq!(bf16dot::round(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(bf16dot::round(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 0x3f81);
    assert_eq!(bf16dot::round(-1e-39), 0x8000);
    assert!(bf16dot::value(bf16dot::round(f32::NAN)).is_nan());
    assert_eq!(bf16dot::value(bf16dot::round(f32::NEG_INFINITY)), f32::NEG_INFINITY);
}

#[test]
fn subnormal_weights_and_sums_count_as_zero_on_every_path() {
    // A subnormal bf16 weight multiplies as zero; a sum that lands below f32's normal range
    // flushes to zero: the kernel (vdpbf16ps) and the reference agree.
    let cols = 2;
    let tiny = bf16::from_bits(0x0001);
    let w = [tiny, bf16::from_f32(1e-30), bf16::ONE, bf16::from_f32(1e-30)];
    let xs: Vec<f32> = (0..8).flat_map(|_| [1e20f32, 1e-10]).collect();
    let x = Bf16Batch::round(&xs, cols);
    let (mut got, mut want) = (vec![0f32; 16], vec![0f32; 16]);
    bf16dot::matmul_at(fast(), &Weights::Bf16(&w), &x, &mut got);
    bf16dot::matmul_at(Level::Scalar, &Weights::Bf16(&w), &x, &mut want);
    assert_eq!(bits(&got), bits(&want));
    // Row 0: the subnormal weight gives nothing; 1e-30 * 1e-10 = 1e-40 is subnormal: zero.
    assert_eq!(want[0], 0.0);
}

#[test]
fn bf16_dots_are_used_where_the_cpu_has_them() {
    // The property test above compares the kernel with the reference only where it runs.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bf16") && fast() >= Level::Avx512 {
        assert!(bf16dot::available_at(fast()));
        assert!(bf16dot::takes(k3_quant::q8::FEW + 1) == (k3_quant::cpu::level() >= Level::Avx512));
    }
    assert!(!bf16dot::takes(k3_quant::q8::FEW));
}
