//! KDA and MLA give the same bits on any number of threads: heads (or, in a prefill, MLA's
//! tokens) are split over the pool, never one reduction. The layers are large enough that every
//! parallel path runs (a K3-sized head dimension; MLA over more than a hundred positions).

use k3_attn::{Kda, KdaConfig, KdaGate, KdaWeights, Mla, MlaConfig, MlaWeights, OutputGate, PositionEmbedding, QPath};
use k3_quant::Matrix;

fn rand(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    k3_quant::rng::noise(n, seed, 2.0 * scale)
}

fn m(w: &[f32], rows: usize, cols: usize) -> Matrix<'_> {
    Matrix::f32(w, rows, cols).unwrap()
}

const D: usize = 512;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prefill `prompt` tokens, then `steps` single tokens, on a pool of `threads`: every output.
fn run<S>(
    threads: usize,
    state: S,
    mut step: impl FnMut(&mut S, &[f32], &mut [f32]) + Send,
    prompt: usize,
    steps: usize,
) -> Vec<u32>
where
    S: Send,
{
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let xs = rand((prompt + steps) * D, 77, 1.0);
    let mut out = vec![0f32; (prompt + steps) * D];
    let mut state = state;
    pool.install(|| {
        step(&mut state, &xs[..prompt * D], &mut out[..prompt * D]);
        for t in prompt..prompt + steps {
            step(&mut state, &xs[t * D..(t + 1) * D], &mut out[t * D..(t + 1) * D]);
        }
    });
    bits(&out)
}

#[test]
fn kda_gives_the_same_bits_on_any_pool() {
    let (h, hd, k) = (16, 128, 4);
    let c = h * hd;
    let w: Vec<Vec<f32>> = [c * D, c * D, c * D, c * k, c * k, c * k, h, c, hd * D, c * hd, h * D, hd, c * D, D * c]
        .iter()
        .enumerate()
        .map(|(i, n)| rand(*n, 10 + i as u64, 0.1))
        .collect();
    let layer = Kda::new(
        "layer 0 (KDA)",
        KdaConfig {
            hidden: D,
            heads: h,
            head_dim: hd,
            conv_kernel: k,
            gate: KdaGate::LowerBound(-5.0),
            norm_eps: 1e-5,
        },
        KdaWeights {
            q_proj: m(&w[0], c, D),
            k_proj: m(&w[1], c, D),
            v_proj: m(&w[2], c, D),
            q_conv: w[3].clone(),
            k_conv: w[4].clone(),
            v_conv: w[5].clone(),
            a_log: w[6].clone(),
            dt_bias: w[7].clone(),
            f_a: m(&w[8], hd, D),
            f_b: m(&w[9], c, hd),
            b_proj: m(&w[10], h, D),
            o_norm: w[11].iter().map(|v| 1.0 + v).collect(),
            gate: OutputGate::FullRank(m(&w[12], c, D)),
            o_proj: m(&w[13], D, c),
        },
    )
    .unwrap();
    let go = |threads| run(threads, layer.state(), |s, x, o| layer.prefill(s, x, o), 8, 3);
    let one = go(1);
    for threads in [2, 3, 7] {
        assert!(go(threads) == one, "KDA on {threads} threads");
    }
}

#[test]
fn mla_gives_the_same_bits_on_any_pool() {
    let (h, l, nope, rope, v, ql) = (16, 128, 64, 32, 64, 192);
    let qd = h * (nope + rope);
    let w: Vec<Vec<f32>> = [ql * D, ql, qd * ql, (l + rope) * D, l, h * (nope + v) * l, h * v * D, D * h * v]
        .iter()
        .enumerate()
        .map(|(i, n)| rand(*n, 40 + i as u64, 0.1))
        .collect();
    let layer = Mla::new(
        "layer 3 (MLA)",
        MlaConfig {
            hidden: D,
            heads: h,
            kv_lora: l,
            nope,
            rope,
            v_dim: v,
            lowrank_eps: 1e-6,
            positions: PositionEmbedding::None,
        },
        MlaWeights {
            q: QPath::LowRank { a: m(&w[0], ql, D), norm: w[1].iter().map(|x| 1.0 + x).collect(), b: m(&w[2], qd, ql) },
            kv_a: m(&w[3], l + rope, D),
            kv_a_norm: w[4].iter().map(|x| 1.0 + x).collect(),
            kv_b: m(&w[5], h * (nope + v), l),
            g_proj: Some(m(&w[6], h * v, D)),
            o_proj: m(&w[7], D, h * v),
        },
    )
    .unwrap();
    // 128 positions of prompt, then single tokens over them (heads split).
    let go = |threads| run(threads, layer.cache(), |c, x, o| layer.prefill(c, x, o), 128, 3);
    let one = go(1);
    for threads in [2, 3, 7] {
        assert!(go(threads) == one, "MLA on {threads} threads");
    }
}
