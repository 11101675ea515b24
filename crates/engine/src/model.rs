//! The Kimi forward pass over a WASTE model: K3 (AttnRes, KDA and gated MLA, LatentMoE with SiTU)
//! and Kimi-Linear (pre-norm residual, SiLU MoE with a shared expert). Activations are f32; RMS
//! means and AttnRes scores are accumulated in f64, as in the reference implementations.

use k3_attn::kda::a_log_per_head;
use k3_attn::{
    Kda, KdaConfig, KdaGate, KdaState, KdaWeights, Mla, MlaCache, MlaConfig, MlaWeights, OutputGate, PositionEmbedding,
    QPath,
};
use k3_format::Model;
use k3_io::{CacheStats, ExpertCache, FileId, Key, Location, Policy, Priority, Reader, ReaderOptions, Status};
use k3_quant::Matrix;
use k3_router::lookahead::{LookaheadStats, Predictor, predict};
use k3_router::{RouterConfig, Routing, route};
use serde_json::Value;

use crate::EngineError;
use crate::config::{Family, ModelConfig};
use crate::plan::{self, Demand, Footprint, MemoryPlan};
use crate::weights::{Rotations, expert_matrix, matrix, vector, vector_of};

use k3_quant::vecops::{rms_norm, sigmoid};

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

thread_local! {
    /// The gate and up activations of `Mlp::forward`, reused: it runs once per expert per token.
    static MLP_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl Mlp<'_> {
    fn forward(&self, act: Act, x: &[f32], out: &mut [f32]) {
        MLP_SCRATCH.with_borrow_mut(|(g, u)| {
            g.resize(self.gate.rows(), 0.0);
            u.resize(self.up.rows(), 0.0);
            self.gate.matvec(x, g);
            self.up.matvec(x, u);
            for (gv, uv) in g.iter_mut().zip(u.iter()) {
                *gv = act.apply(*gv, *uv);
            }
            self.down.matvec(g, out);
        })
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
    /// Per layer: the after-attention guesses a prefetch would read (best first, capped), and how
    /// many of them the layer then chose.
    prefetch_guesses: Vec<(u64, u64)>,
    pub stats: RunStats,
    /// When `Some`, the next `forward` records where its time went (cleared at each call).
    pub timeline: Option<Vec<Span>>,
    /// Every expert this session routed to, counted (for the usage-history file).
    pub usage: k3_router::UsageHistory,
    /// When `Some`, every token's experts at every MoE layer are appended (for comparing encodings).
    pub routing_trace: Option<Vec<RoutedToken>>,
}

/// The experts one token chose at one MoE layer, in routing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedToken {
    pub position: usize,
    pub layer: u32,
    pub experts: Vec<u32>,
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
    opts: EngineOptions,
    plan: MemoryPlan,
    trunk_check: Option<crate::verify::TrunkCheck>,
}

/// The reader and the shard files it has open.
#[derive(Debug)]
struct ExpertIo {
    cache: ExpertCache,
    files: Vec<FileId>,
}

/// Tokens over which a layer's lookahead is tried before its recall decides whether it continues.
const LOOKAHEAD_WARMUP_TOKENS: u64 = 8;

/// How many guesses a layer's prefetch reads at most: half of top-k (the drive's idle gap holds
/// only a few records; docs/EFFICIENCY.md: caps 4 / 8 / 16 in single, noisy runs).
fn prefetch_cap(moe: &Moe<'_>) -> usize {
    (moe.router.top_k / 2).max(1)
}

/// How the engine runs: the measurement switches of `k3-cli`.
#[derive(Clone)]
pub struct EngineOptions {
    /// Total memory to live within (trunk, attention state, expert cache, I/O buffers).
    pub mem_budget: Option<u64>,
    /// Compute while expert reads are in flight (off: read, then compute).
    pub overlap: bool,
    /// Prefetch the next layer's predicted experts.
    pub lookahead: bool,
    /// After a warm-up, a layer's prefetch continues only while at least this fraction of the
    /// guesses it would prefetch (the best top-k / 2 per token) turn out chosen (0 = always).
    pub lookahead_min_precision: f64,
    /// Also measure the after-MoE and previous-token predictors (an extra router pass per layer
    /// and token: for `k3-cli lookahead` and benchmarks, off on the decode path).
    pub lookahead_stats: bool,
    pub policy: Policy,
    /// Reads in flight at once.
    pub queue_depth: usize,
    /// Tokens of context the memory plan reserves MLA cache for (sessions reserve it up front).
    pub context: u64,
    /// The most tokens the caller passes to one `forward` call: the plan reserves their
    /// activations.
    pub chunk: u64,
    /// Memory the caller keeps beside the engine (the logits it collects, say), for the plan.
    pub reserved_bytes: u64,
    /// Check every trunk tensor's checksum when loading (on every core). Off only for a model
    /// that was verified before (`k3-cli verify`) and has not been touched since.
    pub verify_trunk: bool,
    #[doc(hidden)]
    pub fault: Option<k3_io::reader::FaultHook>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            mem_budget: None,
            overlap: true,
            lookahead: true,
            lookahead_min_precision: 0.8,
            lookahead_stats: false,
            policy: Policy::Lfru,
            queue_depth: 32,
            context: 4096,
            chunk: 256,
            reserved_bytes: 0,
            verify_trunk: true,
            fault: None,
        }
    }
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("mem_budget", &self.mem_budget)
            .field("overlap", &self.overlap)
            .field("lookahead", &self.lookahead)
            .field("policy", &self.policy)
            .field("context", &self.context)
            .field("chunk", &self.chunk)
            .field("verify_trunk", &self.verify_trunk)
            .finish_non_exhaustive()
    }
}

/// What a stretch of a decode step was spent on (for the timeline of a step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Attention,
    /// Routing, latent projection, shared expert, the final sums.
    MoeOther,
    /// Blocked, waiting for an expert read.
    Wait,
    /// Computing with one expert.
    Expert(u32),
}

/// One stretch of time in a step, in seconds from the step's start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub layer: u32,
    pub kind: SpanKind,
    pub start: f64,
    pub end: f64,
}

/// Counters of a run (a session).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunStats {
    pub tokens: u64,
    pub seconds: f64,
    /// Time blocked waiting for expert reads.
    pub io_wait_seconds: f64,
    /// Time from a layer's first expert request to its last expert computed, summed.
    pub io_span_seconds: f64,
    pub expert_compute_seconds: f64,
    /// The engine's expert-cache counters after this session's last step (the cache is shared by
    /// every session of an engine, so these count from the engine's start).
    pub cache: CacheStats,
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

impl RunStats {
    /// Adds a later session's times to these; the cache counters (cumulative per engine) are the
    /// later session's.
    pub fn accumulate(&mut self, later: &RunStats) {
        self.tokens += later.tokens;
        self.seconds += later.seconds;
        self.io_wait_seconds += later.io_wait_seconds;
        self.io_span_seconds += later.io_span_seconds;
        self.expert_compute_seconds += later.expert_compute_seconds;
        self.cache = later.cache;
    }
}

impl<'m> Engine<'m> {
    pub fn load(model: &'m Model) -> Result<Engine<'m>, EngineError> {
        Self::load_with(model, EngineOptions::default())
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The trunk check done at load (`None` when `verify_trunk` was off).
    pub fn trunk_check(&self) -> Option<crate::verify::TrunkCheck> {
        self.trunk_check
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Loads with explicit options; fails with the minimum when the memory budget is too small.
    pub fn load_with(model: &'m Model, opts: EngineOptions) -> Result<Engine<'m>, EngineError> {
        let trunk_check = if opts.verify_trunk { Some(crate::verify::verify_trunk(model)?) } else { None };
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
        let res_block = t.get("attn_res_block_size").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
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
        let plan = plan::plan(
            footprint(&layers, &cfg, res_block),
            Demand {
                budget: opts.mem_budget,
                context: opts.context,
                chunk: opts.chunk,
                reserved_bytes: opts.reserved_bytes,
                trunk_bytes: model.manifest().trunk.bytes,
                slot_bytes: model.manifest().expert_layouts.iter().map(|l| l.record_bytes).max().unwrap_or(0),
                all_experts: u64::from(cfg.experts) * cfg.moe_layers().len() as u64,
                top_k: u64::from(cfg.experts_per_token).max(1),
            },
        )?;
        let (cache_slots, slot_bytes) = (plan.cache_slots, plan.slot_bytes);
        let io = if cache_slots == 0 {
            None
        } else {
            let ropts = ReaderOptions {
                queue_depth: opts.queue_depth.max(1),
                fault: opts.fault.clone(),
                ..ReaderOptions::new(slot_bytes as usize, cache_slots as usize)
            };
            let mut reader = Reader::new(ropts)?;
            let files = model.shard_paths().iter().map(|p| reader.open(p)).collect::<Result<Vec<_>, _>>()?;
            Some(std::sync::Mutex::new(ExpertIo { cache: ExpertCache::new(reader, opts.policy), files }))
        };
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
            opts,
            plan,
            trunk_check,
        })
    }

    /// Keeps the hottest experts of a usage history resident once loaded (at most half the cache).
    /// Returns how many are pinned.
    pub fn pin_hottest(&self, history: &k3_router::UsageHistory) -> usize {
        let Some(io) = &self.io else { return 0 };
        let Ok(mut io) = io.lock() else { return 0 };
        let room = io.cache.capacity() / 2;
        io.cache.pin(&history.hottest(room))
    }

    /// Also measure the after-MoE and previous-token predictors (see
    /// [`EngineOptions::lookahead_stats`]).
    pub fn measure_lookahead(&mut self) {
        self.opts.lookahead_stats = true;
    }

    /// Predict `top_k + margin` experts per layer ahead (default: half of top_k more).
    pub fn set_lookahead_margin(&mut self, margin: usize) {
        self.lookahead_margin = margin;
    }

    /// Layer `li + 1`'s router applied to `v` (normed with that layer's post-attention norm):
    /// the experts it would pick, `top_k + margin` of them. `None` when the next layer is dense.
    ///
    /// With AttnRes (K3) the next router sees the next layer's mix of the finished blocks and the
    /// running partial sum, not the partial sum alone (which lacks the embedding and every earlier
    /// block): the guess mixes `blocks` and `v` with the next layer's MLP weights, the next
    /// layer's own attention output (not computed yet) left out.
    fn predict_next(&self, li: usize, blocks: &[Vec<f32>], v: &[f32]) -> Option<Vec<u32>> {
        let next = self.layers.get(li + 1)?;
        let Ffn::Moe(moe) = &next.ffn else { return None };
        let mixed;
        let v = match &next.mlp_res {
            Some(w) => {
                mixed = mix(blocks, v, w, self.eps);
                &mixed
            }
            None => v,
        };
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
                Attn::Mla(m) => {
                    let mut c = m.cache();
                    c.reserve(self.plan.context as usize);
                    LayerState::Mla(c)
                }
            })
            .collect();
        let n = self.layers.len();
        Session {
            layers,
            tokens: 0,
            lookahead: LookaheadStats::new(n),
            prev_routing: vec![Vec::new(); n],
            prefetch_guesses: vec![(0, 0); n],
            stats: RunStats::default(),
            timeline: None,
            usage: k3_router::UsageHistory::default(),
            routing_trace: None,
        }
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
        let started = std::time::Instant::now();
        let (d, n, nl) = (self.hidden, ids.len(), self.layers.len());
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(EngineError::Input(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        if let Some(tl) = session.timeline.as_mut() {
            tl.clear();
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
        let mut routings = vec![Routing::default(); n];
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
            let t_att = started.elapsed().as_secs_f64();
            match (&layer.attn, &mut session.layers[li]) {
                (Attn::Kda(k), LayerState::Kda(s)) => k.prefill(s, &normed, &mut att),
                (Attn::Mla(m), LayerState::Mla(c)) => m.prefill(c, &normed, &mut att),
                _ => return Err(EngineError::Input(format!("the session does not belong to this model (layer {li})"))),
            }
            if let Some(tl) = session.timeline.as_mut() {
                tl.push(Span {
                    layer: li as u32,
                    kind: SpanKind::Attention,
                    start: t_att,
                    end: started.elapsed().as_secs_f64(),
                });
            }
            if layer.att_res.is_some() && fresh {
                p.copy_from_slice(&att);
            } else {
                p.iter_mut().zip(&att).for_each(|(a, b)| *a += b);
            }
            let mut preds_att = Vec::with_capacity(n);
            for t in 0..n {
                let pt = &p[t * d..(t + 1) * d];
                let m_in = match &layer.mlp_res {
                    Some(w) => mix(&blocks[t], pt, w, self.eps),
                    None => pt.to_vec(),
                };
                rms_norm(&m_in, &layer.post_norm, self.eps, &mut normed[t * d..(t + 1) * d]);
                // The after-attention guess feeds the prefetch; computed only when someone uses it.
                let wanted = self.opts.lookahead || self.opts.lookahead_stats;
                preds_att.push(if wanted { self.predict_next(li, &blocks[t], pt) } else { None });
            }
            match &layer.ffn {
                Ffn::Dense(mlp) => {
                    for (x, o) in normed.chunks_exact(d).zip(att.chunks_exact_mut(d)) {
                        mlp.forward(self.act, x, o);
                    }
                }
                Ffn::Moe(moe) => {
                    // Prefetch for the next layer only while its guesses earn it: for the first
                    // tokens (to measure them), then only while at least `lookahead_min_precision`
                    // of what a prefetch would read is used (a wrong guess costs a full read of
                    // drive bandwidth, which an I/O-bound step pays in time).
                    let c = session.lookahead.counts(Predictor::AfterAttention, li + 1);
                    let (guessed, right) = session.prefetch_guesses.get(li + 1).copied().unwrap_or((0, 0));
                    let earns = c.tokens < LOOKAHEAD_WARMUP_TOKENS
                        || right as f64 >= self.opts.lookahead_min_precision * guessed as f64;
                    let predicted: Vec<Vec<u32>> =
                        if earns { preds_att.iter().flatten().cloned().collect() } else { Vec::new() };
                    let mut spans = session.timeline.as_ref().map(|_| Vec::new());
                    self.moe_chunk(
                        layer,
                        moe,
                        &normed,
                        &mut att,
                        &mut routings,
                        &predicted,
                        &mut session.stats,
                        started,
                        &mut spans,
                    )?;
                    if let (Some(tl), Some(sp)) = (session.timeline.as_mut(), spans) {
                        tl.extend(sp);
                    }
                    for (t, r) in routings.iter().enumerate() {
                        let [a, m] = std::mem::take(&mut pending[t]);
                        if let Some(a) = a {
                            session.lookahead.record(Predictor::AfterAttention, li, &a, &r.experts);
                            let best = &a[..a.len().min(prefetch_cap(moe))];
                            let g = &mut session.prefetch_guesses[li];
                            g.0 += best.len() as u64;
                            g.1 += best.iter().filter(|e| r.experts.contains(e)).count() as u64;
                        }
                        if let Some(m) = m {
                            session.lookahead.record(Predictor::AfterMoe, li, &m, &r.experts);
                        }
                        if self.opts.lookahead_stats {
                            if !session.prev_routing[li].is_empty() {
                                session.lookahead.record(
                                    Predictor::PreviousToken,
                                    li,
                                    &session.prev_routing[li],
                                    &r.experts,
                                );
                            }
                            session.prev_routing[li].clone_from(&r.experts);
                        }
                        for &e in &r.experts {
                            session.usage.record((li as u32, e));
                        }
                        if let Some(tr) = session.routing_trace.as_mut() {
                            let position = session.tokens + t;
                            tr.push(RoutedToken { position, layer: li as u32, experts: r.experts.clone() });
                        }
                    }
                }
            }
            for t in 0..n {
                for ((hv, pv), fv) in
                    h[t * d..(t + 1) * d].iter_mut().zip(&p[t * d..(t + 1) * d]).zip(&att[t * d..(t + 1) * d])
                {
                    *hv = pv + fv;
                }
                let after_moe = if self.opts.lookahead_stats {
                    self.predict_next(li, &blocks[t], &h[t * d..(t + 1) * d])
                } else {
                    None
                };
                pending[t] = [preds_att[t].take(), after_moe];
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
        session.stats.tokens += n as u64;
        session.stats.seconds += started.elapsed().as_secs_f64();
        if let Some(Ok(io)) = self.io.as_ref().map(|m| m.lock()) {
            session.stats.cache = io.cache.stats();
        }
        Ok(logits)
    }

    /// A MoE layer over a chunk of tokens, streaming its experts:
    /// 1. route every token; the chunk's unique experts are requested at once (demand), each read once;
    /// 2. the lookahead's experts for the next layer are requested too (prefetch, low priority, only
    ///    into free slots);
    /// 3. while reads are in flight, the latent projections and the shared expert are computed;
    /// 4. experts are used in arrival order (with `overlap` off: each wave is read, then computed);
    /// 5. each token's expert outputs are summed in routing order, so the result never depends on
    ///    which read finished first.
    #[allow(clippy::too_many_arguments)]
    fn moe_chunk(
        &self,
        layer: &Layer<'m>,
        moe: &Moe<'m>,
        xs: &[f32],
        outs: &mut [f32],
        routings: &mut [Routing],
        predicted: &[Vec<u32>],
        stats: &mut RunStats,
        step_start: std::time::Instant,
        spans: &mut Option<Vec<Span>>,
    ) -> Result<(), EngineError> {
        let now = || step_start.elapsed().as_secs_f64();
        let span = |spans: &mut Option<Vec<Span>>, kind: SpanKind, start: f64| {
            if let Some(v) = spans.as_mut() {
                v.push(Span { layer: layer.index, kind, start, end: step_start.elapsed().as_secs_f64() });
            }
        };
        let t_moe = now();
        let d = self.hidden;
        let n = xs.len() / d;
        let mut logits = vec![0f32; moe.router.experts];
        for (x, r) in xs.chunks_exact(d).zip(routings.iter_mut()) {
            moe.gate.matvec(x, &mut logits);
            route(&moe.router, &logits, &moe.bias, r);
        }
        let mut uniq: Vec<u32> = Vec::new();
        for r in routings.iter() {
            for e in &r.experts {
                if !uniq.contains(e) {
                    uniq.push(*e);
                }
            }
        }
        let io = self.io.as_ref().ok_or_else(|| EngineError::Input("the model has no expert shards".into()))?;
        let mut io = io.lock().map_err(|_| EngineError::Input("a previous expert read panicked".into()))?;
        let io = &mut *io;
        let li = layer.index;
        io.cache.set_layer(li);
        let keys: Vec<Key> = uniq.iter().map(|&e| (li, e)).collect();
        io.cache.protect(&keys);
        let location = |io: &ExpertIo, layer: u32, e: u32| -> Result<Location, EngineError> {
            let loc = self.model.expert(layer, e)?;
            Ok(Location {
                file: io.files[usize::from(loc.entry.shard)],
                offset: loc.entry.offset,
                len: loc.entry.length as usize,
                xxh3: Some(loc.entry.xxh3),
            })
        };
        let mut queue: std::collections::VecDeque<Key> = keys.iter().copied().collect();
        let (mut inflight, mut ready): (Vec<Key>, Vec<Key>) = (Vec::new(), Vec::new());
        let fill = |io: &mut ExpertIo,
                    queue: &mut std::collections::VecDeque<Key>,
                    inflight: &mut Vec<Key>,
                    ready: &mut Vec<Key>|
         -> Result<(), EngineError> {
            while let Some(&k) = queue.front() {
                match io.cache.request(k, location(io, k.0, k.1)?, Priority::Demand)? {
                    Status::Hit => ready.push(k),
                    Status::Issued | Status::Pending => inflight.push(k),
                    Status::NoRoom => break,
                }
                queue.pop_front();
            }
            Ok(())
        };
        let t_io = std::time::Instant::now();
        fill(io, &mut queue, &mut inflight, &mut ready)?;
        // The next layer's predicted experts, read at low priority once this layer's own reads
        // have all landed: the drive would idle through the last experts' arithmetic and the next
        // layer's attention, so the guesses cost no demand read any bandwidth.
        let mut prefetched = !self.opts.lookahead;
        let prefetch = |io: &mut ExpertIo| -> Result<(), EngineError> {
            let next = li + 1;
            if !self.layers.get(next as usize).is_some_and(|l| matches!(l.ffn, Ffn::Moe(_))) {
                return Ok(());
            }
            // Best guesses first (every token's first choice, then second, ...), at most half of
            // top-k of them: a wasted guess costs a whole record of bandwidth, and the drive's
            // idle gap holds only a few records (docs/EFFICIENCY.md: caps 4 / 8 / 16 measured).
            let mut want: Vec<u32> = Vec::new();
            let longest = predicted.iter().map(Vec::len).max().unwrap_or(0);
            for rank in 0..longest {
                for e in predicted.iter().filter_map(|p| p.get(rank)) {
                    if !want.contains(e) {
                        want.push(*e);
                    }
                }
            }
            want.truncate(prefetch_cap(moe));
            for e in want {
                if io.cache.available() == 0 {
                    break;
                }
                if !io.cache.contains((next, e)) {
                    io.cache.request((next, e), location(io, next, e)?, Priority::Prefetch { layer: next })?;
                }
            }
            Ok(())
        };
        // Work that needs no expert, done while the reads are in flight.
        let zs: Vec<f32> = match &moe.latent {
            Some((down, _, _)) => {
                let mut z = vec![0f32; n * down.rows()];
                down.matmul(xs, &mut z);
                z
            }
            None => xs.to_vec(),
        };
        let zd = zs.len() / n;
        let mut shared = vec![0f32; n * d];
        if let Some(sh) = &moe.shared {
            for (x, o) in xs.chunks_exact(d).zip(shared.chunks_exact_mut(d)) {
                sh.forward(self.act, x, o);
            }
        }
        span(spans, SpanKind::MoeOther, t_moe);
        // Expert outputs per (token, routing rank), summed in rank order at the end.
        let k = moe.router.top_k;
        let mut ys = vec![0f32; n * k * zd];
        let mut done_experts = 0usize;
        loop {
            if !prefetched && queue.is_empty() && inflight.is_empty() {
                prefetch(io)?;
                prefetched = true;
            }
            for key in ready.drain(..) {
                let t0 = std::time::Instant::now();
                let t_exp = now();
                let bytes = io.cache.get(key).ok_or(k3_io::IoError::Closed)?;
                let loc = self.model.expert(key.0, key.1)?;
                let rec = loc.parse(bytes, false)?;
                let r = &self.rotations;
                let mlp = Mlp {
                    gate: expert_matrix("w1", rec.matrix("w1")?, r)?,
                    up: expert_matrix("w3", rec.matrix("w3")?, r)?,
                    down: expert_matrix("w2", rec.matrix("w2")?, r)?,
                };
                for (t, rt) in routings.iter().enumerate() {
                    if let Some(rank) = rt.experts.iter().position(|&e| e == key.1) {
                        mlp.forward(
                            self.act,
                            &zs[t * zd..(t + 1) * zd],
                            &mut ys[(t * k + rank) * zd..(t * k + rank + 1) * zd],
                        );
                    }
                }
                io.cache.release(key);
                done_experts += 1;
                stats.expert_compute_seconds += t0.elapsed().as_secs_f64();
                span(spans, SpanKind::Expert(key.1), t_exp);
            }
            if done_experts == keys.len() {
                break;
            }
            fill(io, &mut queue, &mut inflight, &mut ready)?;
            if !ready.is_empty() {
                continue;
            }
            let t_wait = std::time::Instant::now();
            let t_w = now();
            if inflight.is_empty() {
                // Every slot holds an in-flight prefetch: let one land, then ask again.
                // A failed prefetch only costs its slot; the demand read that needs it reports errors.
                let _ = io.cache.wait_next().ok_or(k3_io::IoError::Closed)?;
            } else if self.opts.overlap {
                let (key, res) = io.cache.wait_any(&inflight).ok_or(k3_io::IoError::Closed)?;
                res.map_err(|e| expert_error(key, e))?;
                inflight.retain(|x| *x != key);
                ready.push(key);
            } else {
                // Read, then compute: the whole wave first.
                while let Some((key, res)) = io.cache.wait_any(&inflight) {
                    res.map_err(|e| expert_error(key, e))?;
                    inflight.retain(|x| *x != key);
                    ready.push(key);
                }
            }
            stats.io_wait_seconds += t_wait.elapsed().as_secs_f64();
            span(spans, SpanKind::Wait, t_w);
        }
        let t_sum = now();
        stats.io_span_seconds += t_io.elapsed().as_secs_f64();
        for t in 0..n {
            let mut u = vec![0f32; zd];
            for (rank, w) in routings[t].weights.iter().enumerate() {
                u.iter_mut().zip(&ys[(t * k + rank) * zd..(t * k + rank + 1) * zd]).for_each(|(a, b)| *a += w * b);
            }
            let out = &mut outs[t * d..(t + 1) * d];
            match &moe.latent {
                Some((_, norm, up)) => {
                    let mut un = vec![0f32; zd];
                    rms_norm(&u, norm, self.eps, &mut un);
                    up.matvec(&un, out);
                }
                None => out.copy_from_slice(&u),
            }
            out.iter_mut().zip(&shared[t * d..(t + 1) * d]).for_each(|(a, b)| *a += b);
        }
        span(spans, SpanKind::MoeOther, t_sum);
        Ok(())
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

/// A failed expert read, named by (layer, expert) as `k3-cli verify` names it.
fn expert_error((layer, expert): Key, source: k3_io::IoError) -> EngineError {
    EngineError::Expert { layer, expert, source }
}

/// The memory a model's layers need per token of context and per token of a forward call.
fn footprint(layers: &[Layer<'_>], cfg: &ModelConfig, res_block: usize) -> Footprint {
    let f = |n: usize| n as u64 * 4;
    let (d, vocab) = (cfg.hidden as usize, cfg.vocab as usize);
    let mut fp = Footprint::default();
    let mut attn_width = 0usize;
    let mut ffn_width = 0usize;
    for l in layers {
        match &l.attn {
            Attn::Kda(k) => {
                let c = k.config();
                let ch = c.heads * c.head_dim;
                fp.state_fixed += f(ch * c.head_dim + 3 * ch * c.conv_kernel);
                // q, k, v, gate input, output gate, output; the low-rank intermediates; beta.
                attn_width = attn_width.max(7 * ch + 2 * c.head_dim + c.heads);
            }
            Attn::Mla(m) => {
                let c = m.config();
                fp.state_per_token += f(c.kv_lora + c.rope);
                // q (and its low-rank input), the latent and shared key, gate, context.
                attn_width = attn_width
                    .max(c.heads * (c.nope + c.rope) + 2 * c.hidden + c.kv_lora + c.rope + 2 * c.heads * c.v_dim);
            }
        }
        match &l.ffn {
            Ffn::Dense(mlp) => ffn_width = ffn_width.max(2 * mlp.gate.rows()),
            Ffn::Moe(moe) => {
                let zd = moe.latent.as_ref().map_or(d, |(down, _, _)| down.rows());
                // Latent input, routed outputs per rank, shared output, router logits.
                ffn_width = ffn_width.max(zd * (moe.router.top_k + 2) + d + moe.router.experts);
            }
        }
    }
    // The residual stream, its copy, the normed input and the attention output; AttnRes block
    // snapshots; the logits row.
    let blocks = if layers.iter().any(|l| l.att_res.is_some()) { layers.len().div_ceil(res_block) + 1 } else { 0 };
    fp.activation_per_token = f(5 * d + blocks * d + vocab + attn_width + ffn_width);
    fp
}
