//! Rows split over threads give bit-identical products, for every encoding and thread count.

use half::{bf16, f16};
use k3_quant::{Activations, Matrix, fp8, int4, int8, mxfp4, par};
use proptest::prelude::*;

/// Values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    k3_quant::rng::noise(n, seed, 2.0)
}

/// The same product on a pool of `threads`: (matvec, matmul) outputs.
fn on(threads: usize, m: &Matrix<'_>, x: &[f32], xs: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let n = xs.len() / m.cols();
    let (mut y, mut ys) = (vec![0f32; m.rows()], vec![0f32; n * m.rows()]);
    pool.install(|| {
        par::matvec(m, x, &mut y);
        par::matmul(m, xs, &mut ys);
    });
    (y, ys)
}

/// Every activation precision (int8 runs its VNNI kernels where the CPU has them, bf16 its
/// AVX512-BF16 kernel for more than `q8::FEW` vectors).
fn acts() -> impl Strategy<Value = Activations> {
    prop_oneof![Just(Activations::Exact), Just(Activations::Int8), Just(Activations::Bf16)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]

    #[test]
    fn any_thread_count_gives_the_same_bits(rows in 520usize..1100, cols_blocks in 16usize..33, n in 2usize..9, seed in any::<u64>(), act in acts()) {
        let cols = cols_blocks * 32;
        let w = values(rows * cols, seed);
        let (x, xs) = (values(cols, seed ^ 1), values(n * cols, seed ^ 2));
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        let (q8, s8) = int8::quantize(&w, cols);
        let (q4, s4): (Vec<u8>, Vec<f16>) = int4::quantize(&w, cols, 32);
        let (p, sc) = mxfp4::quantize(&w, cols);
        let (f8, fs) = fp8::quantize(&w, rows, cols, 128);
        let matrices = [
            Matrix::Fp8(fp8::Fp8Ref::new(&f8, &fs, rows, cols, 128, 128).unwrap()),
            Matrix::F32 { w: &w, rows, cols },
            Matrix::Bf16 { w: &wb, rows, cols, act },
            Matrix::Int8Row { q: &q8, scale: &s8, rows, cols, act },
            Matrix::Int4Group { q: &q4, scale: &s4, group: 32, rows, cols, act },
            Matrix::Mxfp4 { packed: &p, scale: &sc, rows, cols, act },
        ];
        for m in &matrices {
            let one = on(1, m, &x, &xs);
            for threads in [2, 3, 7] {
                prop_assert!(par::tasks(m, threads, 1) > 1, "the test must split: {rows}x{cols}");
                prop_assert!(on(threads, m, &x, &xs) == one, "{m:?} on {threads} threads");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Prefill equals decode: a batch through `matmul` gives the same bits as its vectors one by
    /// one through `matvec`, for every encoding (odd column counts exercise the kernels' tails).
    /// Under int8 and bf16 activations this holds up to `q8::FEW` vectors; larger batches take
    /// the scalar references' order instead (tests/q8.rs and tests/bf16dot.rs check them against
    /// those, bit for bit).
    #[test]
    fn a_batch_gives_the_same_bits_as_its_vectors(rows in 1usize..70, cols_blocks in 1usize..6, extra in 0usize..16, n in 1usize..11, seed in any::<u64>(), act in acts()) {
        let cols32 = cols_blocks * 32;
        let cols_any = cols32 + extra;
        let w = values(rows * cols_any, seed);
        let w32 = values(rows * cols32, seed);
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        let (q8, s8) = int8::quantize(&w, cols_any);
        let (q4, s4): (Vec<u8>, Vec<f16>) = int4::quantize(&w32, cols32, 32);
        let (p, sc) = mxfp4::quantize(&w32, cols32);
        let (f8, fs) = fp8::quantize(&w, rows, cols_any, 32);
        let matrices = [
            Matrix::Fp8(fp8::Fp8Ref::new(&f8, &fs, rows, cols_any, 32, 32).unwrap()),
            Matrix::F32 { w: &w, rows, cols: cols_any },
            Matrix::Bf16 { w: &wb, rows, cols: cols_any, act },
            Matrix::Int8Row { q: &q8, scale: &s8, rows, cols: cols_any, act },
            Matrix::Int4Group { q: &q4, scale: &s4, group: 32, rows, cols: cols32, act },
            Matrix::Mxfp4 { packed: &p, scale: &sc, rows, cols: cols32, act },
        ];
        for m in &matrices {
            let n = if m.takes_q8() || m.takes_bf16(n) { n.min(k3_quant::q8::FEW) } else { n };
            let xs = values(n * m.cols(), seed ^ 5);
            let mut batch = vec![0f32; n * rows];
            m.matmul(&xs, &mut batch);
            let mut single = vec![0f32; n * rows];
            for (x, y) in xs.chunks_exact(m.cols()).zip(single.chunks_exact_mut(rows)) {
                m.matvec(x, y);
            }
            prop_assert!(batch == single, "{m:?}: {n} vectors");
            let block = 1 + (seed as usize) % rows;
            let mut blocked = vec![0f32; n * rows];
            m.matmul_in_blocks(&xs, &mut blocked, block);
            prop_assert!(blocked == single, "{m:?}: {n} vectors, {block} rows a block");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    /// A gate and up pair through `matmul_pair` (quantized once) gives each matrix's own product
    /// bits, whatever the two encodings.
    #[test]
    fn a_pair_gives_each_products_bits(rows in 40usize..600, cols_blocks in 1usize..20, n in 1usize..9, seed in any::<u64>(), act in acts()) {
        let cols = cols_blocks * 32;
        let (wa, wb) = (values(rows * cols, seed), values(rows * cols, seed ^ 3));
        let xs = values(n * cols, seed ^ 4);
        let (q8, s8) = int8::quantize(&wa, cols);
        let (p, sc) = mxfp4::quantize(&wb, cols);
        let (q4, s4): (Vec<u8>, Vec<f16>) = int4::quantize(&wb, cols, 32);
        let a = Matrix::Int8Row { q: &q8, scale: &s8, rows, cols, act };
        for b in [Matrix::Mxfp4 { packed: &p, scale: &sc, rows, cols, act }, Matrix::Int4Group { q: &q4, scale: &s4, group: 32, rows, cols, act }, Matrix::F32 { w: &wb, rows, cols }] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
            let (mut ya, mut yb) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            let (mut wa_, mut wb_) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            pool.install(|| {
                par::matmul_pair(&a, &b, &xs, &mut ya, &mut yb);
                par::matmul(&a, &xs, &mut wa_);
                par::matmul(&b, &xs, &mut wb_);
            });
            prop_assert!(ya == wa_ && yb == wb_, "{b:?}");
        }
    }
}
