//! The layers of a model and how they are built from a WASTE file: every tensor looked up by the
//! names of `crate::names`, shaped by the typed config.

use k3_attn::kda::a_log_per_head;
use k3_attn::{Kda, KdaConfig, KdaGate, KdaWeights, Mla, MlaConfig, MlaWeights, OutputGate, QPath};
use k3_format::Model;
use k3_quant::vecops::sigmoid;
use k3_quant::{Activations, Matrix, par};
use k3_router::RouterConfig;

use crate::EngineError;
use crate::config::{Activation, KdaDims, MlaDims, ModelConfig, MoeDims};
use crate::names::{KdaNames, LayerNames, MlaNames, MlpNames, MoeNames};
use crate::weights::{matrix, vector, vector_of};

/// The gated activation `act(gate, up)` of an MLP.
pub fn activate(act: Activation, g: f32, u: f32) -> f32 {
    match act {
        Activation::Situ { beta, lin_beta } => beta * (g / beta).tanh() * sigmoid(g) * lin_beta * (u / lin_beta).tanh(),
        Activation::Silu => g * sigmoid(g) * u,
    }
}

/// `g = act(g, u)` elementwise; a prefill's worth in pieces over the pool (SiTU's two tanh and
/// an exp per element were ~3% of a 2-thread prefill, all on one thread).
pub(crate) fn activate_all(act: Activation, g: &mut [f32], u: &[f32]) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 14;
    let each = |(gp, up): (&mut [f32], &[f32])| {
        for (gv, uv) in gp.iter_mut().zip(up) {
            *gv = activate(act, *gv, *uv);
        }
    };
    if g.len() < 2 * PIECE {
        each((g, u));
    } else {
        g.par_chunks_mut(PIECE).zip(u.par_chunks(PIECE)).for_each(each);
    }
}

/// `down(act(gate x, up x))`.
#[derive(Debug)]
pub(crate) struct Mlp<'m> {
    pub gate: Matrix<'m>,
    pub up: Matrix<'m>,
    pub down: Matrix<'m>,
}

thread_local! {
    /// The gate and up activations of `Mlp::forward`, reused: it runs once per expert per token.
    static MLP_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl Mlp<'_> {
    pub fn forward(&self, act: Activation, x: &[f32], out: &mut [f32]) {
        MLP_SCRATCH.with_borrow_mut(|(g, u)| {
            g.resize(self.gate.rows(), 0.0);
            u.resize(self.up.rows(), 0.0);
            self.gate.matvec(x, g);
            self.up.matvec(x, u);
            for (gv, uv) in g.iter_mut().zip(u.iter()) {
                *gv = activate(act, *gv, *uv);
            }
            self.down.matvec(g, out);
        })
    }

    /// A batch (`xs` `[n, in]`, `outs` `[n, out]`) as three matrix products whose rows are split
    /// over the current rayon pool: the same bits as [`forward`](Self::forward) per vector.
    pub fn forward_batch(&self, act: Activation, xs: &[f32], outs: &mut [f32]) {
        let n = xs.len() / self.gate.cols().max(1);
        let (mut g, mut u) = (vec![0f32; n * self.gate.rows()], vec![0f32; n * self.up.rows()]);
        par::matmul_pair(&self.gate, &self.up, xs, &mut g, &mut u);
        activate_all(act, &mut g, &u);
        par::matmul(&self.down, &g, outs);
    }

    fn load<'m>(t: Trunk<'m>, n: &MlpNames) -> Result<Mlp<'m>, EngineError> {
        Ok(Mlp { gate: t.matrix(&n.gate)?, up: t.matrix(&n.up)?, down: t.matrix(&n.down)? })
    }
}

/// A MoE layer's resident part: router, LatentMoE projections, shared experts.
#[derive(Debug)]
pub(crate) struct Moe<'m> {
    pub router: RouterConfig,
    pub gate: Matrix<'m>,
    pub bias: Vec<f32>,
    /// K3's latent projection: `down` to the expert width, `norm`, `up` back.
    pub latent: Option<(Matrix<'m>, Vec<f32>, Matrix<'m>)>,
    pub shared: Option<Mlp<'m>>,
    /// A synthetic model's routing process, used instead of `gate` (`k3_router::synthetic`).
    pub synthetic: Option<k3_router::synthetic::K3Like>,
}

// One per layer, built once: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Ffn<'m> {
    Dense(Mlp<'m>),
    Moe(Moe<'m>),
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Attn<'m> {
    Kda(Kda<'m>),
    Mla(Mla<'m>),
}

#[derive(Debug)]
pub(crate) struct Layer<'m> {
    pub index: u32,
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub attn: Attn<'m>,
    pub ffn: Ffn<'m>,
    /// K3 AttnRes score vectors (norm weight times projection row) before attention and MLP.
    pub att_res: Option<Vec<f32>>,
    pub mlp_res: Option<Vec<f32>>,
}

/// An AttnRes score vector: the norm's weight times the projection's single row.
pub(crate) fn res_vector(model: &Model, norm: &str, proj: &str, d: usize) -> Result<Vec<f32>, EngineError> {
    let n = vector_of(model, norm, d)?;
    let p = vector_of(model, proj, d)?;
    Ok(n.iter().zip(&p).map(|(a, b)| a * b).collect())
}

/// Every layer of the model.
pub(crate) fn build<'m>(t: Trunk<'m>, cfg: &ModelConfig) -> Result<Vec<Layer<'m>>, EngineError> {
    let moe_layers = cfg.moe_layers();
    (0..cfg.layers).map(|i| layer(t, cfg, i, moe_layers.contains(&i))).collect()
}

/// The trunk's matrices as the engine multiplies them: each with the activation precision the
/// engine was loaded with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trunk<'m> {
    pub model: &'m Model,
    pub act: Activations,
}

impl<'m> Trunk<'m> {
    pub fn matrix(&self, name: &str) -> Result<Matrix<'m>, EngineError> {
        Ok(matrix(self.model, name)?.with_activations(self.act))
    }
}

fn layer<'m>(t: Trunk<'m>, cfg: &ModelConfig, i: u32, moe: bool) -> Result<Layer<'m>, EngineError> {
    let d = cfg.hidden as usize;
    let n = LayerNames::of(i);
    let missing =
        |what: &str| EngineError::Config(format!("layer {i} is {what} but the config gives no dimensions for it"));
    let attn = if cfg.is_kda(i) {
        Attn::Kda(kda(t, cfg, i, cfg.kda.ok_or_else(|| missing("KDA"))?)?)
    } else {
        Attn::Mla(mla(t, cfg, i, cfg.mla.ok_or_else(|| missing("MLA"))?)?)
    };
    let ffn = match (moe, cfg.moe) {
        (true, Some(m)) => Ffn::Moe(moe_layer(t, i, m, d)?),
        _ => Ffn::Dense(Mlp::load(t, &MlpNames::dense(i))?),
    };
    let (att_res, mlp_res) = if cfg.attn_res_block.is_some() {
        (
            Some(res_vector(t.model, &n.att_res_norm, &n.att_res_proj, d)?),
            Some(res_vector(t.model, &n.mlp_res_norm, &n.mlp_res_proj, d)?),
        )
    } else {
        (None, None)
    };
    Ok(Layer {
        index: i,
        input_norm: vector_of(t.model, &n.input_norm, d)?,
        post_norm: vector_of(t.model, &n.post_norm, d)?,
        attn,
        ffn,
        att_res,
        mlp_res,
    })
}

fn kda<'m>(t: Trunk<'m>, cfg: &ModelConfig, i: u32, k: KdaDims) -> Result<Kda<'m>, EngineError> {
    let n = KdaNames::of(i);
    let (heads, hd, kern) = (k.heads, k.head_dim, k.conv_kernel);
    let (a_log, a_shape) = vector(t.model, &n.a_log)?;
    let w = KdaWeights {
        q_proj: t.matrix(&n.q_proj)?,
        k_proj: t.matrix(&n.k_proj)?,
        v_proj: t.matrix(&n.v_proj)?,
        q_conv: vector_of(t.model, &n.q_conv, heads * hd * kern)?,
        k_conv: vector_of(t.model, &n.k_conv, heads * hd * kern)?,
        v_conv: vector_of(t.model, &n.v_conv, heads * hd * kern)?,
        a_log: a_log_per_head(&n.a_log, &a_log, &a_shape, heads)?,
        dt_bias: vector_of(t.model, &n.dt_bias, heads * hd)?,
        f_a: t.matrix(&n.f_a)?,
        f_b: t.matrix(&n.f_b)?,
        b_proj: t.matrix(&n.b_proj)?,
        o_norm: vector_of(t.model, &n.o_norm, hd)?,
        gate: if k.full_rank_gate {
            OutputGate::FullRank(t.matrix(&n.g_proj)?)
        } else {
            OutputGate::LowRank { a: t.matrix(&n.g_a)?, b: t.matrix(&n.g_b)? }
        },
        o_proj: t.matrix(&n.o_proj)?,
    };
    let gate = match k.gate_lower_bound {
        Some(lb) => KdaGate::LowerBound(lb),
        None => KdaGate::Softplus,
    };
    let kc = KdaConfig { hidden: cfg.hidden as usize, heads, head_dim: hd, conv_kernel: kern, gate, norm_eps: cfg.eps };
    Ok(Kda::new(format!("layer {i} (KDA)"), kc, w)?)
}

fn mla<'m>(t: Trunk<'m>, cfg: &ModelConfig, i: u32, m: MlaDims) -> Result<Mla<'m>, EngineError> {
    let n = MlaNames::of(i);
    let q = match m.q_lora {
        Some(_) => {
            let qa = t.matrix(&n.q_a)?;
            let qn = vector_of(t.model, &n.q_a_norm, qa.rows())?;
            QPath::LowRank { a: qa, norm: qn, b: t.matrix(&n.q_b)? }
        }
        None => QPath::Direct(t.matrix(&n.q_proj)?),
    };
    let w = MlaWeights {
        q,
        kv_a: t.matrix(&n.kv_a)?,
        kv_a_norm: vector_of(t.model, &n.kv_a_norm, m.kv_lora)?,
        kv_b: t.matrix(&n.kv_b)?,
        g_proj: if m.output_gate { Some(t.matrix(&n.g_proj)?) } else { None },
        o_proj: t.matrix(&n.o_proj)?,
    };
    let mc = MlaConfig {
        hidden: cfg.hidden as usize,
        heads: m.heads,
        kv_lora: m.kv_lora,
        nope: m.nope,
        rope: m.rope,
        v_dim: m.v_dim,
        // Moonshot's modeling code builds the low-rank norms with the default 1e-6.
        lowrank_eps: 1e-6,
        positions: cfg.positions,
    };
    Ok(Mla::new(format!("layer {i} (MLA)"), mc, w)?)
}

fn moe_layer<'m>(t: Trunk<'m>, i: u32, m: MoeDims, d: usize) -> Result<Moe<'m>, EngineError> {
    let n = MoeNames::of(i);
    let router = RouterConfig {
        experts: m.experts,
        top_k: m.top_k,
        groups: m.groups,
        top_groups: m.top_groups,
        renormalize: m.renormalize,
        scaling: m.scaling,
        biased_weights: false,
        top_p: m.top_p,
        keep: m.keep,
    };
    let latent = match m.latent {
        Some(z) => {
            let down = t.matrix(&n.latent_down)?;
            Some((down, vector_of(t.model, &n.latent_norm, z)?, t.matrix(&n.latent_up)?))
        }
        None => None,
    };
    let shared = if m.shared > 0 { Some(Mlp::load(t, &n.shared)?) } else { None };
    let gate = t.matrix(&n.gate)?;
    if gate.rows() != m.experts || gate.cols() != d {
        return Err(EngineError::Shape(format!(
            "tensor `{}` is [{}, {}], expected [{}, {d}]",
            n.gate,
            gate.rows(),
            gate.cols(),
            m.experts
        )));
    }
    let synthetic = m.synthetic_routing.map(|seed| k3_router::synthetic::K3Like::new(&router, seed));
    Ok(Moe { router, gate, bias: vector_of(t.model, &n.bias, m.experts)?, latent, shared, synthetic })
}
