//! The VQ codecs: kernels against references, table quantization bounded, encoders sane.

mod common;

use common::{assert_close, fast, simd_levels, sum_tolerance};
use half::f16;
use k3_quant::cpu::{Level, levels};
use k3_quant::encode::EncodeOptions;
use k3_quant::rng::gaussian;
use k3_quant::vq::{self, Codec, Rotation, Scratch, fastscan};
use proptest::prelude::*;

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
    (num / den).sqrt()
}

/// A random encoded matrix (random codes, codebooks and scales), no encoder involved.
fn random_matrix(codec: Codec, rows: usize, cols: usize, seed: u64, rotate: bool) -> vq::VqMatrix {
    let items = cols / codec.dim() * codec.stages();
    let raw: Vec<u16> =
        gaussian(rows * items, seed).iter().map(|g| ((g.abs() * 1e4) as usize % codec.entries()) as u16).collect();
    let codes = match codec {
        Codec::FastScan => fastscan::pack(&raw, rows, items),
        Codec::Residual => raw.iter().map(|&c| c as u8).collect(),
    };
    vq::VqMatrix {
        codec,
        rows,
        cols,
        codes,
        scale: gaussian(rows, seed ^ 1).iter().map(|v| f16::from_f32(0.5 + v.abs())).collect(),
        codebooks: gaussian(codec.stages() * codec.entries() * codec.dim(), seed ^ 2),
        rotation: rotate.then(|| Rotation::new(cols, Rotation::block_for(cols, 64), seed)),
    }
}

fn dense_matvec(w: &[f32], x: &[f32]) -> (Vec<f32>, Vec<f64>) {
    let y = w.chunks(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum()).collect();
    let abs = w.chunks(x.len()).map(|r| r.iter().zip(x).map(|(a, b)| f64::from((a * b).abs())).sum()).collect();
    (y, abs)
}

#[test]
fn fastscan_pack_round_trips() {
    let m = random_matrix(Codec::FastScan, 64, 24, 3, false);
    let items = 24 / 4 * 3;
    let raw: Vec<usize> = (0..64 * items).map(|i| m.as_ref().code(i / items, i % items)).collect();
    assert_eq!(fastscan::pack(&raw.iter().map(|&c| c as u16).collect::<Vec<_>>(), 64, items), m.codes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// The SIMD fast-scan kernels (AVX2, and AVX-512 where present) sum the same table entries
    /// as the reference: bit-identical integer sums for any codes and table, including tables of
    /// an odd number of item pairs (AVX-512's last step is half a vector), row counts on either
    /// side of the kernels' groups of blocks (two on AVX2, four on AVX-512) and scans longer than
    /// the AVX2 kernel's 256-step runs between widenings.
    #[test]
    fn fastscan_sums_are_bit_identical(blocks in 1usize..11, cols8 in 1usize..140, seed in any::<u64>()) {
        let (rows, cols) = (32 * blocks, 8 * cols8);
        let items = cols / 4 * 3;
        let m = random_matrix(Codec::FastScan, rows, cols, seed, false);
        let lut: Vec<u8> = gaussian(items * 16, seed ^ 4).iter().map(|g| (g.abs() * 1e4) as u32 as u8).collect();
        let mut b = vec![0u32; rows];
        fastscan::sums_at(Level::Scalar, &m.codes, items, &lut, &mut b);
        let r = (seed % rows as u64) as usize;
        let direct: u32 = (0..items).map(|j| u32::from(lut[j * 16 + m.as_ref().code(r, j)])).sum();
        prop_assert_eq!(b[r], direct);
        for level in simd_levels() {
            let mut a = vec![0u32; rows];
            fastscan::sums_at(level, &m.codes, items, &lut, &mut a);
            prop_assert_eq!(&a, &b, "{:?}", level);
        }
    }

    /// A batch gives every vector the bits `matvec` gives it (fast-scan scans the codes once per
    /// pair of vectors), with either kernel level; the paired scan equals two single scans.
    #[test]
    fn a_vq_batch_gives_the_bits_of_its_vectors(blocks in 1usize..3, cols8 in 1usize..40, n in 1usize..6, seed in any::<u64>(), rotate in any::<bool>()) {
        let (rows, cols) = (32 * blocks, 8 * cols8);
        for codec in Codec::ALL {
            let m = random_matrix(codec, rows, cols, seed, rotate);
            let xs = gaussian(n * cols, seed ^ 9);
            let mut scratch = Scratch::default();
            for level in levels() {
                let mut batch = vec![0f32; n * rows];
                m.as_ref().matmul_at(level, &xs, &mut batch, &mut scratch);
                let mut single = vec![0f32; n * rows];
                for (x, y) in xs.chunks_exact(cols).zip(single.chunks_exact_mut(rows)) {
                    m.as_ref().matvec_at(level, x, y, &mut scratch);
                }
                prop_assert!(batch == single, "{codec:?} at {level:?}: {n} vectors");
            }
        }
        let items = cols / 4 * 3;
        let m = random_matrix(Codec::FastScan, rows, cols, seed, false);
        let lut = |k: u64| -> Vec<u8> { gaussian(items * 16, seed ^ k).iter().map(|g| (g.abs() * 1e4) as u32 as u8).collect() };
        let (la, lb) = (lut(4), lut(5));
        let (mut wa, mut wb) = (vec![0u32; rows], vec![0u32; rows]);
        fastscan::sums_at(Level::Scalar, &m.codes, items, &la, &mut wa);
        fastscan::sums_at(Level::Scalar, &m.codes, items, &lb, &mut wb);
        for level in simd_levels() {
            let (mut a, mut b) = (vec![0u32; rows], vec![0u32; rows]);
            fastscan::sums2_at(level, &m.codes, items, [&la, &lb], [&mut a, &mut b]);
            prop_assert_eq!((&a, &b), (&wa, &wb), "{:?}", level);
        }
    }

    /// The vectorized table builds (each SIMD level) agree with the reference to within one
    /// table step.
    #[test]
    fn fastscan_tables_agree(cols8 in 1usize..200, seed in any::<u64>(), scale in 0.001f32..1000.0) {
        let cols = 8 * cols8;
        let cb = gaussian(192, seed);
        let x: Vec<f32> = gaussian(cols, seed ^ 8).iter().map(|v| v * scale).collect();
        let (mut l1, mut l2) = (Vec::new(), Vec::new());
        let d2 = fastscan::build_lut_at(Level::Scalar, &cb, &x, &mut Vec::new(), &mut l2);
        for level in simd_levels() {
            let d1 = fastscan::build_lut_at(level, &cb, &x, &mut Vec::new(), &mut l1);
            prop_assert!((d1 - d2).abs() <= d2 * 1e-5, "{:?}: {} vs {}", level, d1, d2);
            prop_assert!(l1.iter().zip(&l2).all(|(a, b)| a.abs_diff(*b) <= 1), "{:?}", level);
        }
    }

    /// The u8 table moves each item's term by at most half a step: the result stays within
    /// `scale * items * delta / 2` of the exact product with the decoded matrix.
    #[test]
    fn fastscan_table_error_is_bounded(blocks in 1usize..3, cols8 in 1usize..100, seed in any::<u64>()) {
        let (rows, cols) = (32 * blocks, 8 * cols8);
        let m = random_matrix(Codec::FastScan, rows, cols, seed, false);
        let x = gaussian(cols, seed ^ 5);
        let (exact, abs) = dense_matvec(&m.decode(), &x);
        for level in levels() {
            let mut y = vec![0f32; rows];
            m.as_ref().matvec_at(level, &x, &mut y, &mut Scratch::default());
            let (table, mut lut) = (fastscan::table(&m.codebooks, &x), Vec::new());
            let delta = fastscan::build_lut_at(level, &m.codebooks, &x, &mut Vec::new(), &mut lut);
            let items = cols / 4 * 3;
            let tol: Vec<f64> = (0..rows).map(|r| {
                let s = f64::from(m.scale[r].to_f32());
                let t_abs: f64 = table.iter().map(|v| f64::from(v.abs())).sum();
                s * items as f64 * f64::from(delta) * 0.5001 + 4.0 * sum_tolerance(cols + items, abs[r] + s * t_abs)
            }).collect();
            assert_close(&y, &exact, &tol);
        }
    }

    #[test]
    fn residual_kernel_matches_reference(rows in 1usize..20, cols8 in 1usize..80, seed in any::<u64>(), rotate in any::<bool>()) {
        let cols = 8 * cols8;
        let m = random_matrix(Codec::Residual, rows, cols, seed, rotate && cols % 64 == 0);
        let x = gaussian(cols, seed ^ 3);
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        m.as_ref().matvec_at(fast(), &x, &mut a, &mut Scratch::default());
        m.as_ref().matvec_at(Level::Scalar, &x, &mut b, &mut Scratch::default());
        let (exact, abs) = dense_matvec(&m.decode(), &x);
        // Decoding three codewords adds 2 roundings per weight on top of the summation order.
        let tol: Vec<f64> = abs.iter().map(|s| 2.0 * sum_tolerance(cols + 3, *s * 3.0)).collect();
        assert_close(&a, &b, &tol);
        assert_close(&b, &exact, &tol);
    }
}

fn encode_err(codec: Codec, w: &[f32], cols: usize, opts: &EncodeOptions) -> (f64, vq::VqMatrix) {
    let m = k3_quant::encode::encode(codec, w, cols, opts).unwrap();
    (rel_err(w, &m.decode()), m)
}

#[test]
fn encoders_reach_three_bit_quality_on_gaussian_weights() {
    // A Gaussian source at R bits/weight cannot beat relative error 2^-R (rate-distortion); R
    // counts the codes, the row scales and the f32 codebooks, which are large for a small matrix.
    let (rows, cols) = (128, 512);
    let w = gaussian(rows * cols, 11);
    for codec in Codec::ALL {
        let (coarse, _) =
            encode_err(codec, &w, cols, &EncodeOptions { refine_rounds: 0, beam: 1, ..EncodeOptions::default() });
        let (fine, m) = encode_err(codec, &w, cols, &EncodeOptions::default());
        assert!(
            (m.bits_per_weight() - (3.0 + 16.0 / cols as f64)).abs() < 1e-9,
            "{}: {} bits",
            codec.name(),
            m.bits_per_weight()
        );
        let rate = m.bits_per_weight() + (m.codebooks.len() * 32) as f64 / (rows * cols) as f64;
        assert!(fine > 2f64.powf(-rate), "{}: {fine} beats the rate-distortion bound at {rate} bits", codec.name());
        assert!(fine < 0.30, "{}: relative error {fine}", codec.name());
        assert!(fine <= coarse * 1.001, "{}: refinement made it worse ({coarse} -> {fine})", codec.name());
        // The encoded matrix computes what it decodes to.
        let x = gaussian(cols, 5);
        let mut y = vec![0f32; rows];
        m.matvec(&x, &mut y, &mut Scratch::default());
        let (want, _) = dense_matvec(&m.decode(), &x);
        assert!(rel_err(&want, &y) < 0.02, "{}: kernel vs decode {}", codec.name(), rel_err(&want, &y));
    }
}

/// Row scales keep each row's energy (the rotation is orthogonal), so a row decodes as long as
/// the original, to the f16 scale's rounding (relative 2^-11) and f32 sums.
#[test]
fn rows_keep_their_energy() {
    let (rows, cols) = (64, 256);
    let w = gaussian(rows * cols, 31);
    for codec in Codec::ALL {
        let d = k3_quant::encode::encode(codec, &w, cols, &EncodeOptions::fast()).unwrap().decode();
        for (r, (a, b)) in w.chunks_exact(cols).zip(d.chunks_exact(cols)).enumerate() {
            let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            let ratio = norm(b) / norm(a);
            assert!((ratio - 1.0).abs() < 1e-3, "{} row {r}: decoded norm / original {ratio}", codec.name());
        }
    }
}

#[test]
fn activation_weighting_lowers_the_output_error() {
    // Activations with a few dominant channels: weighting by E[x^2] should protect them.
    let (rows, cols, n) = (64, 256, 64);
    let w = gaussian(rows * cols, 21);
    let mut xs = gaussian(n * cols, 22);
    for x in xs.chunks_mut(cols) {
        for c in (0..cols).step_by(16) {
            x[c] *= 8.0;
        }
    }
    let out_err = |m: &vq::VqMatrix| {
        let d = m.decode();
        let (mut num, mut den) = (0f64, 0f64);
        for x in xs.chunks(cols) {
            let (a, _) = dense_matvec(&w, x);
            let (b, _) = dense_matvec(&d, x);
            num += a.iter().zip(&b).map(|(p, q)| f64::from(p - q).powi(2)).sum::<f64>();
            den += a.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>();
        }
        (num / den).sqrt()
    };
    for codec in Codec::ALL {
        let plain =
            k3_quant::encode::encode(codec, &w, cols, &EncodeOptions { rotation_block: 0, ..EncodeOptions::default() })
                .unwrap();
        let calibrated = |gptq, descent_rounds| {
            EncodeOptions { rotation_block: 0, gptq, descent_rounds, ..EncodeOptions::default() }
                .calibrated(&xs, cols)
                .unwrap()
        };
        let weighted = k3_quant::encode::encode(codec, &w, cols, &calibrated(false, 0)).unwrap();
        let gptq = k3_quant::encode::encode(codec, &w, cols, &calibrated(true, 0)).unwrap();
        let descended = k3_quant::encode::encode(codec, &w, cols, &calibrated(true, 3)).unwrap();
        let (p, q, g, e) = (out_err(&plain), out_err(&weighted), out_err(&gptq), out_err(&descended));
        assert!(q < p * 0.95, "{}: weighted {q} vs plain {p}", codec.name());
        assert!(g < q * 0.95, "{}: GPTQ {g} vs weighted {q}", codec.name());
        // Measured 0.59x (VQ-A) and 0.74x (VQ-B) here.
        assert!(e < g * 0.9, "{}: descent {e} vs GPTQ alone {g}", codec.name());
    }
}

#[test]
fn bad_shapes_are_refused() {
    assert!(k3_quant::encode::encode(Codec::FastScan, &[0.0; 16 * 64], 64, &EncodeOptions::fast()).is_err(), "16 rows");
    assert!(
        k3_quant::encode::encode(Codec::Residual, &[0.0; 4 * 12], 12, &EncodeOptions::fast()).is_err(),
        "12 columns"
    );
}

#[test]
fn calibration_for_other_matrices_is_refused() {
    let xs = gaussian(8 * 64, 41);
    let w = gaussian(32 * 128, 42);
    assert!(EncodeOptions::fast().calibrated(&xs[..100], 64).is_err(), "not whole inputs");
    // Prepared for 64 columns, used on 128.
    let opts = EncodeOptions::fast().calibrated(&xs, 64).unwrap();
    let err = k3_quant::encode::encode(Codec::FastScan, &w, 128, &opts).unwrap_err();
    assert!(err.contains("64 columns"), "{err}");
    // Prepared under another rotation.
    let xs = gaussian(8 * 128, 43);
    let opts = EncodeOptions { seed: 7, ..EncodeOptions::fast() }.calibrated(&xs, 128).unwrap();
    let opts = EncodeOptions { seed: 8, ..opts };
    assert!(k3_quant::encode::encode(Codec::FastScan, &w, 128, &opts).is_err(), "another rotation seed");
}
