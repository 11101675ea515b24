//! The Kimi forward pass over a WASTE model: K3 (AttnRes, KDA and gated MLA, LatentMoE with SiTU)
//! and Kimi-Linear (pre-norm residual, SiLU MoE with a shared expert).
//!
//! One file per concern: `options` (how an engine runs), `layers` (the layers and how they are
//! built from the file), `forward` (the pass over a chunk), `moe` (the streaming MoE step), `approx` (measured approximations of its experts),
//! `lookahead` (guessing and prefetching the next layer's experts), `expert_io` (the reader and
//! cache), `compute` (the thread pool), `attnres` (K3's residual mix), `session` (a sequence's
//! state), `stats` (counters and timelines); the memory plan is `crate::memory_plan`.

mod activations;
mod approx;
mod attnres;
mod compute;
mod expert_io;
mod forward;
mod layers;
mod lookahead;
mod moe;
mod options;
mod session;
mod state_file;
mod stats;
pub mod tap;
mod vision;
mod walk;

pub use activations::{ActivationPrecision, ExpertWeights, Ran, TrunkWeights, WeightClasses};
pub use approx::{ExpertApprox, LowBitCopies, RoundedCopies};
pub use forward::{Logits, Seq};
pub use layers::activate;
pub use options::EngineOptions;
pub(crate) use session::LayerState;
pub use session::{RoutedToken, Session};
pub use state_file::{SavedState, StateFileError, StateFileLayout, StateHeader, read_state_header, state_ids_bytes};
pub use stats::{RunStats, Span, SpanKind};
pub use vision::{ImageWork, Inserted, PromptImage};
pub use walk::{GROUP_ROWS as WALK_GROUP_ROWS, LayerWalk};

use std::sync::Mutex;

use k3_format::Model;
use k3_quant::Matrix;

use crate::EngineError;
use crate::config::ModelConfig;
use crate::memory_plan::{self, Demand, Footprint, MemoryPlan};
use crate::names;
use crate::verify::TrunkCheck;
use crate::weights::{Rotations, matrix, vector_of};
use compute::Compute;
use expert_io::ExpertIo;
use layers::{Attn, Ffn, Layer, res_vector};

/// A model ready to run.
#[derive(Debug)]
pub struct Engine<'m> {
    model: &'m Model,
    cfg: ModelConfig,
    hidden: usize,
    vocab: usize,
    /// The embedding table `[vocab, hidden]`, f32 or bf16 (rows are looked up, never multiplied).
    embed: Matrix<'m>,
    lm_head: Matrix<'m>,
    norm: Vec<f32>,
    out_res: Option<Vec<f32>>,
    /// AttnRes layers per block (1 without AttnRes).
    res_block: usize,
    layers: Vec<Layer<'m>>,
    rotations: Rotations,
    /// Expert reads: O_DIRECT through k3-io; `None` for a model without routed experts.
    io: Option<Mutex<ExpertIo>>,
    /// Experts predicted beyond `top_k` by the lookahead.
    lookahead_margin: usize,
    opts: EngineOptions,
    /// How the MLA caches store positions: `opts.kv_cache`, or the rule's choice for `auto`.
    kv_cache: k3_attn::KvCacheType,
    plan: MemoryPlan,
    trunk_check: Option<TrunkCheck>,
    compute: Compute,
    /// What identifies the model a saved state belongs to ([`Engine::fingerprint`]), computed
    /// once: K3's manifest lists every expert record.
    fingerprint: std::sync::OnceLock<u64>,
    /// K3's vision tower, when the model was converted with one.
    eyes: Option<vision::Eyes<'m>>,
}

/// Applies the options that change routing (top-k reduction, top-p) to the model's MoE, refusing
/// values the model cannot take.
fn routing_knobs(cfg: &mut ModelConfig, opts: &EngineOptions) -> Result<(), EngineError> {
    if opts.experts_per_token.is_none() && opts.expert_top_p.is_none() {
        return Ok(());
    }
    let Some(moe) = cfg.moe.as_mut() else {
        return Err(EngineError::Config(
            "expert routing options were given, but the model has no routed experts".into(),
        ));
    };
    if let Some(n) = opts.experts_per_token {
        if n == 0 || n > moe.top_k {
            return Err(EngineError::Config(format!(
                "experts per token {n}: the model routes each token to {}; give 1 to {} (fewer only)",
                moe.top_k, moe.top_k
            )));
        }
        moe.keep = Some(n);
    }
    if let Some(p) = opts.expert_top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(EngineError::Config(format!("expert top-p {p}: give a share of the routing weight in (0, 1]")));
        }
        moe.top_p = Some(p);
    }
    Ok(())
}

/// Refuses cache-aware routing the model cannot take: it swaps 1 to k - 1 of a token's experts,
/// for runners-up by a gate's score (a synthetic routing process has none).
fn check_cache_aware(layers: &[Layer<'_>], cfg: &ModelConfig, opts: &EngineOptions) -> Result<(), EngineError> {
    let Some(n) = opts.cache_aware else {
        return Ok(());
    };
    approx::light_experts(cfg, "cache-aware experts", n)?;
    if layers.iter().any(|l| matches!(&l.ffn, Ffn::Moe(m) if m.synthetic.is_some())) {
        return Err(EngineError::Config(
            "cache-aware routing needs a gate's scores for the runners-up; this model's synthetic routing has none"
                .into(),
        ));
    }
    Ok(())
}

impl<'m> Engine<'m> {
    pub fn load(model: &'m Model) -> Result<Engine<'m>, EngineError> {
        Self::load_with(model, EngineOptions::default())
    }

    /// Loads with explicit options: checks the trunk (unless told not to), builds the layers,
    /// plans memory (failing with the minimum when the budget is too small) and opens the expert
    /// reader.
    pub fn load_with(model: &'m Model, opts: EngineOptions) -> Result<Engine<'m>, EngineError> {
        let activations = opts.activations.for_model(model);
        let kv_cache = opts.kv_cache.unwrap_or_else(|| activations.kv_cache());
        let opts = EngineOptions { activations, ..opts };
        let trunk_check = if opts.verify_trunk { Some(crate::verify::verify_trunk(model)?) } else { None };
        let raw =
            model.blob("config.json").ok_or_else(|| EngineError::Config("the model embeds no config.json".into()))?;
        let mut cfg = ModelConfig::parse(std::path::Path::new("config.json"), raw)?;
        routing_knobs(&mut cfg, &opts)?;
        opts.approx.check(&cfg)?;
        if let Some(c) = &opts.low_bit_copies {
            c.check(model, &cfg)?;
        }
        let (d, vocab) = (cfg.hidden as usize, cfg.vocab as usize);
        let embed = matrix(model, names::EMBED)?;
        if !embed.reads_rows() || embed.rows() != vocab || embed.cols() != d {
            return Err(EngineError::Shape(format!(
                "{} must be an f32, bf16, int8-row or int4-group [{vocab}, {d}] table, got [{}, {}]",
                names::EMBED,
                embed.rows(),
                embed.cols()
            )));
        }
        let out_res = match cfg.attn_res_block {
            Some(_) => Some(res_vector(model, names::OUT_RES_NORM, names::OUT_RES_PROJ, d)?),
            None => None,
        };
        let mut layers = layers::build(layers::Trunk { model, act: opts.activations.trunk() }, &cfg)?;
        for layer in &mut layers {
            if let Attn::Mla(m) = &mut layer.attn {
                m.set_form(opts.mla_form);
            }
        }
        check_cache_aware(&layers, &cfg, &opts)?;
        let res_block = cfg.attn_res_block.unwrap_or(1);
        let plan = memory_plan::plan(
            footprint(&layers, &cfg, res_block, kv_cache),
            Demand {
                budget: opts.mem_budget,
                context: match cfg.max_positions {
                    Some(most) if opts.fit_context => opts.context.min(most),
                    _ => opts.context,
                },
                fit_context: opts.fit_context,
                sequences: opts.sequences,
                chunk: opts.chunk,
                reserved_bytes: opts.reserved_bytes,
                trunk_bytes: model.manifest().trunk.bytes,
                slot_bytes: model.manifest().expert_layouts.iter().map(|l| l.record_bytes).max().unwrap_or(0),
                all_experts: u64::from(cfg.experts) * cfg.moe_layers().len() as u64,
                top_k: u64::from(cfg.experts_per_token).max(1),
            },
        )?;
        let io = if plan.cache_slots == 0 {
            None
        } else {
            Some(Mutex::new(ExpertIo::open(model, &opts, plan.slot_bytes as usize, plan.cache_slots as usize)?))
        };
        let lookahead_margin = (cfg.experts_per_token as usize).div_ceil(2);
        let compute = Compute::new(opts.threads)?;
        let eyes = vision::load(model, &cfg, opts.activations.trunk())?;
        Ok(Engine {
            eyes,
            compute,
            model,
            hidden: d,
            vocab,
            embed,
            lm_head: layers::Trunk { model, act: opts.activations.head() }.matrix(names::LM_HEAD)?,
            norm: vector_of(model, names::NORM, d)?,
            out_res,
            res_block,
            layers,
            rotations: Rotations::for_model(model),
            io,
            lookahead_margin,
            opts,
            kv_cache,
            plan,
            trunk_check,
            cfg,
            fingerprint: std::sync::OnceLock::new(),
        })
    }

    /// Prompt tokens per forward call: the chunk the memory plan holds the activations of (the
    /// caller's, or the one the plan picked for this model and budget).
    pub fn prefill_chunk(&self) -> usize {
        self.plan.chunk as usize
    }

    /// Whether the expert cache holds every routed expert at once (or the model has none): once
    /// warm, a step reads nothing.
    pub(crate) fn resident(&self) -> bool {
        let all = u64::from(self.cfg.experts) * self.cfg.moe_layers().len() as u64;
        all == 0 || self.plan.cache_slots >= all
    }

    /// The activation precision the engine runs (`Auto` resolved for this model).
    pub fn activations(&self) -> ActivationPrecision {
        self.opts.activations
    }

    /// How the engine's MLA caches store positions (the rule's choice resolved for this model).
    pub fn kv_cache(&self) -> k3_attn::KvCacheType {
        self.kv_cache
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The trunk check done at load (`None` when `verify_trunk` was off).
    pub fn trunk_check(&self) -> Option<TrunkCheck> {
        self.trunk_check
    }

    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn model(&self) -> &'m Model {
        self.model
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

    /// The compute threads.
    pub fn threads(&self) -> usize {
        self.compute.threads()
    }

    fn eps(&self) -> f32 {
        self.cfg.eps
    }

    /// Keeps the hottest experts of a usage history resident once loaded (at most half the cache).
    /// Returns how many are pinned.
    pub fn pin_hottest(&self, history: &k3_router::UsageHistory) -> usize {
        let Some(io) = &self.io else { return 0 };
        let Ok(mut io) = io.lock() else { return 0 };
        let room = io.cache.capacity() / 2;
        io.cache.pin(&history.hottest(room))
    }

    /// Predict `top_k + margin` experts per layer ahead (default: half of top_k more).
    pub fn set_lookahead_margin(&mut self, margin: usize) {
        self.lookahead_margin = margin;
    }

    /// A new session holding `from`'s tokens and recurrent state (none of its statistics), with
    /// the MLA caches planned as a fresh one's: what a prompt cache hands a request that
    /// extends `from`'s tokens. Continuing it gives the bits continuing `from` would.
    pub fn fork(&self, from: &Session) -> Result<Session, EngineError> {
        let mut s = self.keep(from)?;
        for l in &mut s.layers {
            if let LayerState::Mla(c) = l {
                c.plan(self.plan.context as usize);
            }
        }
        Ok(s)
    }

    /// A compact copy of `from`'s state, with no room to grow: what a cache keeps (a [`fork`]
    /// of it runs on).
    ///
    /// [`fork`]: Engine::fork
    pub fn keep(&self, from: &Session) -> Result<Session, EngineError> {
        if from.pending.is_some() {
            return Err(EngineError::Input("a session awaiting `accept_drafts` cannot be forked".into()));
        }
        if from.layers.len() != self.layers.len() {
            return Err(EngineError::Input("the session does not belong to this model".into()));
        }
        let mut s = Session::new(from.layers.clone());
        s.ids.clone_from(&from.ids);
        Ok(s)
    }

    /// A fresh sequence (its MLA caches growing with use up to the planned context).
    pub fn session(&self) -> Session {
        let layers = self
            .layers
            .iter()
            .map(|l| match &l.attn {
                Attn::Kda(k) => LayerState::Kda(k.state()),
                Attn::Mla(m) => {
                    let mut c = m.cache_of(self.kv_cache());
                    c.plan(self.plan.context as usize);
                    LayerState::Mla(c)
                }
            })
            .collect();
        Session::new(layers)
    }
}

/// The memory a model's layers need per token of context and per token of a forward call.
fn footprint(layers: &[Layer<'_>], cfg: &ModelConfig, res_block: usize, kv: k3_attn::KvCacheType) -> Footprint {
    let f = |n: usize| n as u64 * 4;
    let (d, vocab) = (cfg.hidden as usize, cfg.vocab as usize);
    let (state_per_token, state_fixed) = cfg.attention_state(kv);
    let mut fp = Footprint { state_per_token, state_fixed, ..Footprint::default() };
    let mut attn_width = 0usize;
    let mut ffn_width = 0usize;
    for l in layers {
        match &l.attn {
            Attn::Kda(k) => {
                let c = k.config();
                let ch = c.heads * c.head_dim;
                // q, k, v, gate input, output gate, output; the low-rank intermediates; beta.
                attn_width = attn_width.max(7 * ch + 2 * c.head_dim + c.heads);
            }
            Attn::Mla(m) => {
                let c = m.config();
                // q (and its low-rank input), the latent and shared key, gate, context; and the
                // larger of the absorbed form's queries (`[H, L]` a row) and the expanded form's
                // per-head query, sums and output (at most every head at once).
                let form = c.heads * c.kv_lora.max(c.nope + c.rope + 2 * c.v_dim + 2);
                attn_width = attn_width.max(
                    c.heads * (c.nope + c.rope) + 2 * c.hidden + c.kv_lora + c.rope + 2 * c.heads * c.v_dim + form,
                );
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
