//! The Kimi forward pass over a WASTE model: K3 (AttnRes, KDA and gated MLA, LatentMoE with SiTU)
//! and Kimi-Linear (pre-norm residual, SiLU MoE with a shared expert). Activations are f32; RMS
//! means and AttnRes scores are accumulated in f64, as in the reference implementations.

use k3_attn::kda::a_log_per_head;
use k3_attn::{
    Kda, KdaConfig, KdaGate, KdaState, KdaWeights, Mla, MlaCache, MlaConfig, MlaWeights, OutputGate, PositionEmbedding,
    QPath,
};
use k3_format::Model;
use k3_io::{FileId, Priority, ReadRequest, Reader, ReaderOptions};
use k3_quant::Matrix;
use k3_router::lookahead::{LookaheadStats, Predictor, predict};
use k3_router::{RouterConfig, Routing, route};
use serde_json::Value;

use crate::EngineError;
use crate::config::{Family, ModelConfig};
use crate::weights::{Rotations, expert_matrix, matrix, vector, vector_of};

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| f64::from(*v) * f64::from(*v)).sum::<f64>() / x.len() as f64;
    let inv = (1.0 / (ms + f64::from(eps)).sqrt()) as f32;
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * inv * g;
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The gated activation of an MLP: K3's SiTU or Kimi-Linear's SiLU.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// `beta tanh(g / beta) sigmoid(g) * lin_beta tanh(u / lin_beta)`.
    Situ { beta: f32, lin_beta: f32 },
    /// `silu(g) * u`.
    Silu,
}

impl Act {
    fn apply(self, g: f32, u: f32) -> f32 {
        match self {
            Act::Situ { beta, lin_beta } => beta * (g / beta).tanh() * sigmoid(g) * lin_beta * (u / lin_beta).tanh(),
            Act::Silu => g * sigmoid(g) * u,
        }
    }
}

/// `down(act(gate x, up x))`.
#[derive(Debug)]
struct Mlp<'m> {
    gate: Matrix<'m>,
    up: Matrix<'m>,
    down: Matrix<'m>,
}

impl Mlp<'_> {
    fn forward(&self, act: Act, x: &[f32], out: &mut [f32]) {
        let mut g = vec![0f32; self.gate.rows()];
        let mut u = vec![0f32; self.up.rows()];
        self.gate.matvec(x, &mut g);
        self.up.matvec(x, &mut u);
        for (gv, uv) in g.iter_mut().zip(&u) {
            *gv = act.apply(*gv, *uv);
        }
        self.down.matvec(&g, out);
    }
}

#[derive(Debug)]
struct Moe<'m> {
    router: RouterConfig,
    gate: Matrix<'m>,
    bias: Vec<f32>,
    /// K3's latent projection: `down` to the expert width, `norm`, `up` back.
    latent: Option<(Matrix<'m>, Vec<f32>, Matrix<'m>)>,
    shared: Option<Mlp<'m>>,
}

// One per layer, built once: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Ffn<'m> {
    Dense(Mlp<'m>),
    Moe(Moe<'m>),
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Attn<'m> {
    Kda(Kda<'m>),
    Mla(Mla<'m>),
}

#[derive(Debug)]
struct Layer<'m> {
    index: u32,
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: Attn<'m>,
    ffn: Ffn<'m>,
    /// K3 AttnRes score vectors (norm weight times projection row) before attention and MLP.
    att_res: Option<Vec<f32>>,
    mlp_res: Option<Vec<f32>>,
}

impl PartialEq for Session {
    /// Same recurrent state (statistics aside).
    fn eq(&self, other: &Self) -> bool {
        self.layers == other.layers && self.tokens == other.tokens
    }
}

/// Per-layer recurrent state of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerState {
    Kda(KdaState),
    Mla(MlaCache),
}

/// The state of one sequence: everything earlier tokens left behind.
#[derive(Debug, Clone)]
pub struct Session {
    pub layers: Vec<LayerState>,
    pub tokens: usize,
    /// How well each lookahead predictor would have guessed every MoE layer's experts.
    pub lookahead: LookaheadStats,
    /// The experts each layer chose for the previous token (the previous-token predictor).
    prev_routing: Vec<Vec<u32>>,
}

/// A model ready to run.
#[derive(Debug)]
pub struct Engine<'m> {
    model: &'m Model,
    cfg: ModelConfig,
    hidden: usize,
    vocab: usize,
    eps: f32,
    act: Act,
    /// The embedding table `[vocab, hidden]`, f32 or bf16 (rows are looked up, never multiplied).
    embed: Matrix<'m>,
    lm_head: Matrix<'m>,
    norm: Vec<f32>,
    out_res: Option<Vec<f32>>,
    res_block: usize,
    layers: Vec<Layer<'m>>,
    rotations: Rotations,
    /// Expert reads: O_DIRECT through k3-io, one slot per routed expert of a token.
    io: Option<std::sync::Mutex<ExpertIo>>,
    /// Experts predicted beyond `top_k` by the lookahead.
    lookahead_margin: usize,
}

/// The reader and the shard files it has open.
#[derive(Debug)]
struct ExpertIo {
    reader: Reader,
    files: Vec<FileId>,
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn req(v: &Value, key: &str) -> Result<usize, EngineError> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| EngineError::Config(format!("config has no integer `{key}`")))
}

impl<'m> Engine<'m> {
    pub fn load(model: &'m Model) -> Result<Engine<'m>, EngineError> {
        let raw =
            model.blob("config.json").ok_or_else(|| EngineError::Config("the model embeds no config.json".into()))?;
        let cfg = ModelConfig::parse(std::path::Path::new("config.json"), raw)?;
        let t = &cfg.text;
        let (d, vocab) = (cfg.hidden as usize, cfg.vocab as usize);
        let eps = num(t, "rms_norm_eps").unwrap_or(1e-5) as f32;
        let k3 = cfg.family == Family::KimiK3;
        let act = match t.get("hidden_act").and_then(Value::as_str) {
            Some("situ") => Act::Situ {
                beta: num(t, "activation_situ_beta").unwrap_or(4.0) as f32,
                lin_beta: num(t, "activation_situ_linear_beta").unwrap_or(25.0) as f32,
            },
            Some("silu") | None => Act::Silu,
            Some(other) => return Err(EngineError::Config(format!("hidden_act `{other}` is not supported"))),
        };
        let lac = t.get("linear_attn_config").cloned().unwrap_or(Value::Null);
        let kda_layers: Vec<u32> = lac
            .get("kda_layers")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).map(|l| l as u32 - 1).collect())
            .unwrap_or_default();
        let embed = matrix(model, "model.embed_tokens.weight")?;
        if !matches!(embed, Matrix::F32 { .. } | Matrix::Bf16 { .. }) || embed.rows() != vocab || embed.cols() != d {
            return Err(EngineError::Shape(format!(
                "model.embed_tokens.weight must be an f32 or bf16 [{vocab}, {d}] table, got [{}, {}]",
                embed.rows(),
                embed.cols()
            )));
        }
        let lm_head = matrix(model, "lm_head.weight")?;
        let norm = vector_of(model, "model.norm.weight", d)?;
        let res_vec = |norm: &str, proj: &str| -> Result<Vec<f32>, EngineError> {
            let n = vector_of(model, norm, d)?;
            let p = vector_of(model, proj, d)?;
            Ok(n.iter().zip(&p).map(|(a, b)| a * b).collect())
        };
        let out_res = if k3 {
            Some(res_vec("model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight")?)
        } else {
            None
        };
        let mut layers = Vec::new();
        for i in 0..cfg.layers {
            let p = format!("model.layers.{i}.");
            let name = |s: &str| format!("{p}{s}");
            let input_norm = vector_of(model, &name("input_layernorm.weight"), d)?;
            let post_norm = vector_of(model, &name("post_attention_layernorm.weight"), d)?;
            let attn = if kda_layers.contains(&i) {
                let heads = req(&lac, "num_heads")?;
                let hd = req(&lac, "head_dim")?;
                let kern = lac.get("short_conv_kernel_size").and_then(Value::as_u64).unwrap_or(4) as usize;
                let gate = match num(&lac, "gate_lower_bound") {
                    Some(lb) => KdaGate::LowerBound(lb as f32),
                    None => KdaGate::Softplus,
                };
                let a = |s: &str| name(&format!("self_attn.{s}"));
                let (a_log, a_shape) = vector(model, &a("A_log"))?;
                let full_rank = model.has_tensor(&a("g_proj.weight"));
                let w = KdaWeights {
                    q_proj: matrix(model, &a("q_proj.weight"))?,
                    k_proj: matrix(model, &a("k_proj.weight"))?,
                    v_proj: matrix(model, &a("v_proj.weight"))?,
                    q_conv: vector_of(model, &a("q_conv1d.weight"), heads * hd * kern)?,
                    k_conv: vector_of(model, &a("k_conv1d.weight"), heads * hd * kern)?,
                    v_conv: vector_of(model, &a("v_conv1d.weight"), heads * hd * kern)?,
                    a_log: a_log_per_head(&p, &a_log, &a_shape, heads)?,
                    dt_bias: vector_of(model, &a("dt_bias"), heads * hd)?,
                    f_a: matrix(model, &a("f_a_proj.weight"))?,
                    f_b: matrix(model, &a("f_b_proj.weight"))?,
                    b_proj: matrix(model, &a("b_proj.weight"))?,
                    o_norm: vector_of(model, &a("o_norm.weight"), hd)?,
                    gate: if full_rank {
                        OutputGate::FullRank(matrix(model, &a("g_proj.weight"))?)
                    } else {
                        OutputGate::LowRank {
                            a: matrix(model, &a("g_a_proj.weight"))?,
                            b: matrix(model, &a("g_b_proj.weight"))?,
                        }
                    },
                    o_proj: matrix(model, &a("o_proj.weight"))?,
                };
                let kc = KdaConfig { hidden: d, heads, head_dim: hd, conv_kernel: kern, gate, norm_eps: eps };
                Attn::Kda(Kda::new(format!("layer {i} (KDA)"), kc, w)?)
            } else {
                let a = |s: &str| name(&format!("self_attn.{s}"));
                let kv_lora = req(t, "kv_lora_rank")?;
                let q = if model.has_tensor(&a("q_a_proj.weight")) {
                    let qa = matrix(model, &a("q_a_proj.weight"))?;
                    let qn = vector_of(model, &a("q_a_layernorm.weight"), qa.rows())?;
                    QPath::LowRank { a: qa, norm: qn, b: matrix(model, &a("q_b_proj.weight"))? }
                } else {
                    QPath::Direct(matrix(model, &a("q_proj.weight"))?)
                };
                let w = MlaWeights {
                    q,
                    kv_a: matrix(model, &a("kv_a_proj_with_mqa.weight"))?,
                    kv_a_norm: vector_of(model, &a("kv_a_layernorm.weight"), kv_lora)?,
                    kv_b: matrix(model, &a("kv_b_proj.weight"))?,
                    g_proj: if model.has_tensor(&a("g_proj.weight")) {
                        Some(matrix(model, &a("g_proj.weight"))?)
                    } else {
                        None
                    },
                    o_proj: matrix(model, &a("o_proj.weight"))?,
                };
                let mc = MlaConfig {
                    hidden: d,
                    heads: req(t, "num_attention_heads")?,
                    kv_lora,
                    nope: req(t, "qk_nope_head_dim")?,
                    rope: req(t, "qk_rope_head_dim")?,
                    v_dim: req(t, "v_head_dim")?,
                    // Moonshot's modeling code builds the low-rank norms with the default 1e-6.
                    lowrank_eps: 1e-6,
                    positions: PositionEmbedding::None,
                };
                Attn::Mla(Mla::new(format!("layer {i} (MLA)"), mc, w)?)
            };
            let ffn = if cfg.moe_layers().contains(&i) {
                let m = |s: &str| name(&format!("block_sparse_moe.{s}"));
                let experts = cfg.experts as usize;
                let router = RouterConfig {
                    experts,
                    top_k: cfg.experts_per_token as usize,
                    groups: t.get("num_expert_group").and_then(Value::as_u64).unwrap_or(1) as usize,
                    top_groups: t.get("topk_group").and_then(Value::as_u64).unwrap_or(1) as usize,
                    renormalize: t.get("moe_renormalize").and_then(Value::as_bool).unwrap_or(true),
                    scaling: num(t, "routed_scaling_factor").unwrap_or(1.0) as f32,
                    biased_weights: false,
                    top_p: None,
                };
                let latent = if model.has_tensor(&m("routed_expert_down_proj.weight")) {
                    let down = matrix(model, &m("routed_expert_down_proj.weight"))?;
                    let n = vector_of(model, &m("routed_expert_norm.weight"), down.rows())?;
                    Some((down, n, matrix(model, &m("routed_expert_up_proj.weight"))?))
                } else {
                    None
                };
                let shared = if model.has_tensor(&m("shared_experts.gate_proj.weight")) {
                    Some(Mlp {
                        gate: matrix(model, &m("shared_experts.gate_proj.weight"))?,
                        up: matrix(model, &m("shared_experts.up_proj.weight"))?,
                        down: matrix(model, &m("shared_experts.down_proj.weight"))?,
                    })
                } else {
                    None
                };
                Ffn::Moe(Moe {
                    router,
                    gate: matrix(model, &m("gate.weight"))?,
                    bias: vector_of(model, &m("gate.e_score_correction_bias"), experts)?,
                    latent,
                    shared,
                })
            } else {
                Ffn::Dense(Mlp {
                    gate: matrix(model, &name("mlp.gate_proj.weight"))?,
                    up: matrix(model, &name("mlp.up_proj.weight"))?,
                    down: matrix(model, &name("mlp.down_proj.weight"))?,
                })
            };
            let (att_res, mlp_res) = if k3 {
                (
                    Some(res_vec(&name("self_attention_res_norm.weight"), &name("self_attention_res_proj.weight"))?),
                    Some(res_vec(&name("mlp_res_norm.weight"), &name("mlp_res_proj.weight"))?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer { index: i, input_norm, post_norm, attn, ffn, att_res, mlp_res });
        }
        let io = if cfg.moe_layers().is_empty() {
            None
        } else {
            let slot_bytes =
                model.manifest().expert_layouts.iter().map(|l| l.record_bytes).max().unwrap_or(4096) as usize;
            let top_k = (cfg.experts_per_token as usize).max(1);
            let mut reader =
                Reader::new(ReaderOptions { queue_depth: top_k, ..ReaderOptions::new(slot_bytes, top_k) })?;
            let files = model.shard_paths().iter().map(|p| reader.open(p)).collect::<Result<Vec<_>, _>>()?;
            Some(std::sync::Mutex::new(ExpertIo { reader, files }))
        };
        let res_block = t.get("attn_res_block_size").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
        let margin = (cfg.experts_per_token as usize).div_ceil(2);
        Ok(Engine {
            model,
            cfg,
            hidden: d,
            vocab,
            eps,
            act,
            embed,
            lm_head,
            norm,
            out_res,
            res_block,
            layers,
            rotations: Rotations::for_model(model),
            io,
            lookahead_margin: margin,
        })
    }

    /// Predict `top_k + margin` experts per layer ahead (default: half of top_k more).
    pub fn set_lookahead_margin(&mut self, margin: usize) {
        self.lookahead_margin = margin;
    }

    /// Layer `li + 1`'s router applied to `v` (normed with that layer's post-attention norm):
    /// the experts it would pick, `top_k + margin` of them. `None` when the next layer is dense.
    fn predict_next(&self, li: usize, v: &[f32]) -> Option<Vec<u32>> {
        let next = self.layers.get(li + 1)?;
        let Ffn::Moe(moe) = &next.ffn else { return None };
        let mut x = vec![0f32; v.len()];
        rms_norm(v, &next.post_norm, self.eps, &mut x);
        let mut logits = vec![0f32; moe.router.experts];
        moe.gate.matvec(&x, &mut logits);
        Some(predict(&moe.router, &logits, &moe.bias, self.lookahead_margin))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// A fresh sequence.
    pub fn session(&self) -> Session {
        let layers = self
            .layers
            .iter()
            .map(|l| match &l.attn {
                Attn::Kda(k) => LayerState::Kda(k.state()),
                Attn::Mla(m) => LayerState::Mla(m.cache()),
            })
            .collect();
        let n = self.layers.len();
        Session { layers, tokens: 0, lookahead: LookaheadStats::new(n), prev_routing: vec![Vec::new(); n] }
    }

    /// Runs `ids` (a chunk, after whatever `session` holds) through the model. Returns the logits
    /// `[n, vocab]`; fills `trace` (when given) with the hidden state after every layer,
    /// `[n, layers, hidden]` token-major.
    pub fn forward(
        &self,
        session: &mut Session,
        ids: &[u32],
        mut trace: Option<&mut Vec<f32>>,
    ) -> Result<Vec<f32>, EngineError> {
        let (d, n, nl) = (self.hidden, ids.len(), self.layers.len());
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(EngineError::Input(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        let mut h = vec![0f32; n * d];
        for (&t, row) in ids.iter().zip(h.chunks_exact_mut(d)) {
            let t = t as usize;
            match self.embed {
                Matrix::F32 { w, .. } => row.copy_from_slice(&w[t * d..(t + 1) * d]),
                Matrix::Bf16 { w, .. } => row.iter_mut().zip(&w[t * d..(t + 1) * d]).for_each(|(o, v)| *o = v.to_f32()),
                _ => unreachable!("checked at load"),
            }
        }
        if let Some(tr) = trace.as_deref_mut() {
            tr.clear();
            tr.resize(n * nl * d, 0.0);
        }
        // AttnRes block snapshots per token (K3).
        let mut blocks: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
        let mut normed = vec![0f32; n * d];
        let mut att = vec![0f32; n * d];
        let mut routing = Routing::default();
        // Per token: what the after-attention and after-MoE predictors said about this layer.
        let mut pending: Vec<[Option<Vec<u32>>; 2]> = vec![[None, None]; n];
        for (li, layer) in self.layers.iter().enumerate() {
            let fresh = li % self.res_block == 0;
            // The attention input per token.
            let mut p = h.clone();
            for t in 0..n {
                let pt = &p[t * d..(t + 1) * d];
                let a_in = match &layer.att_res {
                    Some(w) if !blocks[t].is_empty() => mix(&blocks[t], pt, w, self.eps),
                    _ => pt.to_vec(),
                };
                if layer.att_res.is_some() && fresh {
                    blocks[t].push(pt.to_vec());
                }
                rms_norm(&a_in, &layer.input_norm, self.eps, &mut normed[t * d..(t + 1) * d]);
            }
            match (&layer.attn, &mut session.layers[li]) {
                (Attn::Kda(k), LayerState::Kda(s)) => k.prefill(s, &normed, &mut att),
                (Attn::Mla(m), LayerState::Mla(c)) => m.prefill(c, &normed, &mut att),
                _ => return Err(EngineError::Input(format!("the session does not belong to this model (layer {li})"))),
            }
            if layer.att_res.is_some() && fresh {
                p.copy_from_slice(&att);
            } else {
                p.iter_mut().zip(&att).for_each(|(a, b)| *a += b);
            }
            for t in 0..n {
                let pt = &p[t * d..(t + 1) * d];
                let m_in = match &layer.mlp_res {
                    Some(w) => mix(&blocks[t], pt, w, self.eps),
                    None => pt.to_vec(),
                };
                let x2 = &mut normed[t * d..(t + 1) * d];
                rms_norm(&m_in, &layer.post_norm, self.eps, x2);
                let out = &mut att[t * d..(t + 1) * d];
                let pred_att = self.predict_next(li, pt);
                if self.ffn(layer, x2, out, &mut routing)? {
                    let chosen = &routing.experts;
                    let [a, m] = std::mem::take(&mut pending[t]);
                    if let Some(a) = a {
                        session.lookahead.record(Predictor::AfterAttention, li, &a, chosen);
                    }
                    if let Some(m) = m {
                        session.lookahead.record(Predictor::AfterMoe, li, &m, chosen);
                    }
                    if !session.prev_routing[li].is_empty() {
                        session.lookahead.record(Predictor::PreviousToken, li, &session.prev_routing[li], chosen);
                    }
                    session.prev_routing[li].clone_from(chosen);
                }
                for ((hv, pv), fv) in h[t * d..(t + 1) * d].iter_mut().zip(pt).zip(out.iter()) {
                    *hv = pv + fv;
                }
                pending[t] = [pred_att, self.predict_next(li, &h[t * d..(t + 1) * d])];
            }
            if let Some(tr) = trace.as_deref_mut() {
                for t in 0..n {
                    tr[(t * nl + li) * d..(t * nl + li + 1) * d].copy_from_slice(&h[t * d..(t + 1) * d]);
                }
            }
        }
        let mut logits = vec![0f32; n * self.vocab];
        let mut o = vec![0f32; d];
        for t in 0..n {
            let ht = &h[t * d..(t + 1) * d];
            let fin = match &self.out_res {
                Some(w) => mix(&blocks[t], ht, w, self.eps),
                None => ht.to_vec(),
            };
            rms_norm(&fin, &self.norm, self.eps, &mut o);
            self.lm_head.matvec(&o, &mut logits[t * self.vocab..(t + 1) * self.vocab]);
        }
        session.tokens += n;
        Ok(logits)
    }

    /// The layer's MLP or MoE on one token; `true` when it routed (then `routing` holds the choice).
    fn ffn(&self, layer: &Layer<'m>, x: &[f32], out: &mut [f32], routing: &mut Routing) -> Result<bool, EngineError> {
        match &layer.ffn {
            Ffn::Dense(mlp) => {
                mlp.forward(self.act, x, out);
                return Ok(false);
            }
            Ffn::Moe(moe) => {
                let mut logits = vec![0f32; moe.router.experts];
                moe.gate.matvec(x, &mut logits);
                route(&moe.router, &logits, &moe.bias, routing);
                let z: Vec<f32> = match &moe.latent {
                    Some((down, _, _)) => {
                        let mut z = vec![0f32; down.rows()];
                        down.matvec(x, &mut z);
                        z
                    }
                    None => x.to_vec(),
                };
                let mut u = vec![0f32; z.len()];
                let mut y = vec![0f32; z.len()];
                // All of the token's experts are read at once (one slot each, checksummed on
                // arrival); they are then summed in routing order, whatever order they arrived in.
                let io = self.io.as_ref().ok_or_else(|| EngineError::Input("the model has no expert shards".into()))?;
                let mut io = io.lock().map_err(|_| EngineError::Input("a previous expert read panicked".into()))?;
                let mut locs = Vec::with_capacity(routing.experts.len());
                for (slot, &e) in routing.experts.iter().enumerate() {
                    let loc = self.model.expert(layer.index, e)?;
                    let file = io.files[usize::from(loc.entry.shard)];
                    io.reader.submit(ReadRequest {
                        file,
                        offset: loc.entry.offset,
                        len: loc.entry.length as usize,
                        slot,
                        xxh3: Some(loc.entry.xxh3),
                        priority: Priority::Demand,
                        tag: slot as u64,
                    })?;
                    locs.push(loc);
                }
                let mut failed = None;
                for _ in 0..locs.len() {
                    let c = io.reader.next_completion().ok_or(k3_io::IoError::Closed)?;
                    if let Err(e) = c.result {
                        failed.get_or_insert(e);
                    }
                }
                if let Some(e) = failed {
                    return Err(e.into());
                }
                for (slot, (loc, &w)) in locs.iter().zip(&routing.weights).enumerate() {
                    let bytes = io.reader.data(slot, loc.entry.length as usize).ok_or(k3_io::IoError::Closed)?;
                    let rec = loc.parse(bytes, false)?;
                    let r = &self.rotations;
                    let mlp = Mlp {
                        gate: expert_matrix("w1", rec.matrix("w1")?, r)?,
                        up: expert_matrix("w3", rec.matrix("w3")?, r)?,
                        down: expert_matrix("w2", rec.matrix("w2")?, r)?,
                    };
                    mlp.forward(self.act, &z, &mut y);
                    u.iter_mut().zip(&y).for_each(|(a, b)| *a += w * b);
                }
                match &moe.latent {
                    Some((_, norm, up)) => {
                        let mut un = vec![0f32; u.len()];
                        rms_norm(&u, norm, self.eps, &mut un);
                        up.matvec(&un, out);
                    }
                    None => out.copy_from_slice(&u),
                }
                if let Some(sh) = &moe.shared {
                    let mut s = vec![0f32; out.len()];
                    sh.forward(self.act, x, &mut s);
                    out.iter_mut().zip(&s).for_each(|(a, b)| *a += b);
                }
            }
        }
        Ok(true)
    }
}

/// AttnRes: softmax over the candidates `[blocks.., p]` of `(v . w) / sqrt(mean(v^2) + eps)`
/// (in f64), and the weighted sum of the raw candidates.
fn mix(blocks: &[Vec<f32>], p: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let cands: Vec<&[f32]> = blocks.iter().map(Vec::as_slice).chain(std::iter::once(p)).collect();
    let scores: Vec<f64> = cands
        .iter()
        .map(|v| {
            let dot: f64 = v.iter().zip(w).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            let ms = v.iter().map(|a| f64::from(*a) * f64::from(*a)).sum::<f64>() / v.len() as f64;
            dot / (ms + f64::from(eps)).sqrt()
        })
        .collect();
    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut out = vec![0f64; p.len()];
    for (c, wgt) in cands.iter().zip(&e) {
        let f = wgt / z;
        for (o, v) in out.iter_mut().zip(c.iter()) {
            *o += f * f64::from(*v);
        }
    }
    out.into_iter().map(|v| v as f32).collect()
}
