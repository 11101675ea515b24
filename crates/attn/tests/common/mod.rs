//! Random-weight KDA and MLA layers of realistic shape, shared by the integration tests.
#![allow(dead_code)]

use k3_attn::{Kda, KdaConfig, KdaGate, KdaWeights, Mla, MlaConfig, MlaWeights, OutputGate, PositionEmbedding, QPath};
use k3_quant::Matrix;

/// The layers' hidden size.
pub const D: usize = 512;

pub fn rand(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    k3_quant::rng::noise(n, seed, 2.0 * scale)
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn m(w: &[f32], rows: usize, cols: usize) -> Matrix<'_> {
    Matrix::f32(w, rows, cols).unwrap()
}

/// KDA weights: 16 heads of K3's head dimension (128), kernel 4; held so layers can borrow them.
pub struct KdaParts {
    w: Vec<Vec<f32>>,
}

pub const KDA_HEADS: usize = 16;
pub const KDA_HEAD_DIM: usize = 128;

impl KdaParts {
    pub fn new(seed: u64) -> KdaParts {
        let (h, hd, k) = (KDA_HEADS, KDA_HEAD_DIM, 4);
        let c = h * hd;
        let w = [c * D, c * D, c * D, c * k, c * k, c * k, h, c, hd * D, c * hd, h * D, hd, c * D, D * c]
            .iter()
            .enumerate()
            .map(|(i, n)| rand(*n, seed + i as u64, 0.1))
            .collect();
        KdaParts { w }
    }

    pub fn layer(&self) -> Kda<'_> {
        let (h, hd) = (KDA_HEADS, KDA_HEAD_DIM);
        let c = h * hd;
        let w = &self.w;
        Kda::new(
            "layer 0 (KDA)",
            KdaConfig {
                hidden: D,
                heads: h,
                head_dim: hd,
                conv_kernel: 4,
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
        .unwrap()
    }
}

/// MLA weights: 16 heads, latent 128, low-rank queries, output gate.
pub struct MlaParts {
    w: Vec<Vec<f32>>,
}

const MLA: (usize, usize, usize, usize, usize, usize) = (16, 128, 64, 32, 64, 192);

impl MlaParts {
    pub fn new(seed: u64) -> MlaParts {
        let (h, l, nope, rope, v, ql) = MLA;
        let qd = h * (nope + rope);
        let w = [ql * D, ql, qd * ql, (l + rope) * D, l, h * (nope + v) * l, h * v * D, D * h * v]
            .iter()
            .enumerate()
            .map(|(i, n)| rand(*n, seed + i as u64, 0.1))
            .collect();
        MlaParts { w }
    }

    pub fn layer(&self) -> Mla<'_> {
        let (h, l, nope, rope, v, ql) = MLA;
        let qd = h * (nope + rope);
        let w = &self.w;
        Mla::new(
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
                q: QPath::LowRank {
                    a: m(&w[0], ql, D),
                    norm: w[1].iter().map(|x| 1.0 + x).collect(),
                    b: m(&w[2], qd, ql),
                },
                kv_a: m(&w[3], l + rope, D),
                kv_a_norm: w[4].iter().map(|x| 1.0 + x).collect(),
                kv_b: m(&w[5], h * (nope + v), l),
                g_proj: Some(m(&w[6], h * v, D)),
                o_proj: m(&w[7], D, h * v),
            },
        )
        .unwrap()
    }
}
