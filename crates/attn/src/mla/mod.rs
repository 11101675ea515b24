//! Multi-head latent attention, decoded in the absorbed form: without positions (NoPE: K3,
//! Kimi-Linear, optionally gated) or with RoPE on the rope dims (DeepSeek-V3 / Kimi K2, YaRN).
//!
//! Per token t (x = the normed layer input):
//! `q = q_b(RMSNorm(q_a x; q_a_layernorm))` (K3) or `q_proj x` (Kimi-Linear), per head
//! `[nope | rope]`; `ckv = kv_a_proj_with_mqa x`; the cache keeps `c_t = RMSNorm(ckv[..kv_lora];
//! kv_a_layernorm)` and the raw shared `k_ext_t = ckv[kv_lora..]`. Per head, with
//! `W_UK` / `W_UV` the head's first `nope` / next `v` rows of `kv_b_proj`:
//! `qabs = W_UK^T q_nope`, `s_t = (qabs . c_t + q_ext . k_ext_t) / sqrt(nope + rope)`, causal
//! softmax, `ctx = W_UV sum_t p_t c_t`, times `sigmoid(g_proj x)` when gated, then `o_proj`.
//! The low-rank norms use their own eps (1e-6 in Moonshot's code).
//!
//! With RoPE, `k_ext_t` is rotated by its position when appended to the cache (the cache keeps it
//! rotated) and `q_ext` by the query's position; the `nope` part never rotates. DeepSeek stores the
//! rope dims interleaved, so pair `(2i, 2i+1)` turns by `pos * inv_freq[i]` (transformers
//! de-interleaves first and rotates halves: the same dot products). YaRN blends interpolated and
//! extrapolated frequencies, scales cos/sin by its attention factor and the softmax by
//! `mscale(factor, mscale_all_dim)^2`.
//!
//! The softmax runs online over fixed blocks of cached positions (one pass over the cache for all
//! heads) within fixed groups of blocks, merged in order; neither boundary depends on how tokens
//! were batched or on the pool, so prefill and decode agree bit for bit on any number of threads.

mod cache;
mod expanded;
mod form;
mod int8;
mod softmax;

use k3_quant::par;
use k3_quant::{Dense, Matrix};
use rayon::prelude::*;

pub use self::cache::MlaCache;
pub use self::expanded::attend_expanded;
pub use self::form::{MlaForm, costs as form_costs};
use self::softmax::attend_keys;
pub use self::softmax::{attend, attend_cache};
use crate::AttnError;
use crate::latents::KvCacheType;
use crate::ops::{check_len, check_matrix, rms_norm, sigmoid};

pub use crate::rope::{Rope, Yarn};
use crate::rope::{RopeTable, rotate};

/// How positions enter attention: none (Kimi K3, Kimi-Linear) or RoPE (DeepSeek-V3, Kimi K2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PositionEmbedding {
    None,
    Rope(Rope),
}

#[derive(Debug, Clone, PartialEq)]
pub struct MlaConfig {
    pub hidden: usize,
    pub heads: usize,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    /// eps of `q_a_layernorm` and `kv_a_layernorm`.
    pub lowrank_eps: f32,
    pub positions: PositionEmbedding,
}

/// How the query is projected.
#[derive(Debug, Clone)]
pub enum QPath<'a> {
    /// K3: `q_b(RMSNorm(q_a x))`.
    LowRank { a: Matrix<'a>, norm: Vec<f32>, b: Matrix<'a> },
    /// Kimi-Linear: `q_proj x`.
    Direct(Matrix<'a>),
}

#[derive(Debug, Clone)]
pub struct MlaWeights<'a> {
    pub q: QPath<'a>,
    /// `[kv_lora + rope, D]`.
    pub kv_a: Matrix<'a>,
    pub kv_a_norm: Vec<f32>,
    /// `[H * (nope + v), kv_lora]`; must be f32 or bf16 (its key half is used transposed).
    pub kv_b: Matrix<'a>,
    /// `[H * v, D]` when the output is gated (K3).
    pub g_proj: Option<Matrix<'a>>,
    /// `[D, H * v]`.
    pub o_proj: Matrix<'a>,
}

#[derive(Debug, Clone)]
pub struct Mla<'a> {
    name: String,
    cfg: MlaConfig,
    w: MlaWeights<'a>,
    /// Per head, `kv_b_proj`'s key rows `W_uk` `[nope, kv_lora]` (used transposed) and value rows
    /// `W_uv` `[v_dim, kv_lora]`.
    uk: Vec<Dense<'a>>,
    uv: Vec<Matrix<'a>>,
    /// `kv_b_proj` as rows to widen (the expanded form decompresses with them).
    kv_b_rows: Dense<'a>,
    rope: Option<RopeTable>,
    form: MlaForm,
}

/// One sequence's consecutive rows of a batched chunk, and its cache.
#[derive(Debug)]
pub struct MlaSeq<'s> {
    pub cache: &'s mut MlaCache,
    pub rows: usize,
}

impl<'a> Mla<'a> {
    pub fn new(name: impl Into<String>, cfg: MlaConfig, w: MlaWeights<'a>) -> Result<Self, AttnError> {
        let name = name.into();
        let (d, h) = (cfg.hidden, cfg.heads);
        let qdim = h * (cfg.nope + cfg.rope);
        match &w.q {
            QPath::LowRank { a, norm, b } => {
                check_matrix(&name, "q_a_proj", a, a.rows(), d)?;
                check_len(&name, "q_a_layernorm", norm, a.rows())?;
                check_matrix(&name, "q_b_proj", b, qdim, a.rows())?;
            }
            QPath::Direct(q) => check_matrix(&name, "q_proj", q, qdim, d)?,
        }
        check_matrix(&name, "kv_a_proj_with_mqa", &w.kv_a, cfg.kv_lora + cfg.rope, d)?;
        check_len(&name, "kv_a_layernorm", &w.kv_a_norm, cfg.kv_lora)?;
        check_matrix(&name, "kv_b_proj", &w.kv_b, h * (cfg.nope + cfg.v_dim), cfg.kv_lora)?;
        let Some(kv_b_rows) = w.kv_b.dense() else {
            return Err(AttnError::Unsupported {
                layer: name,
                reason: "kv_b_proj must be stored f32, bf16 or fp8".into(),
            });
        };
        let per_head = cfg.nope + cfg.v_dim;
        let uk: Option<Vec<Dense<'a>>> =
            (0..h).map(|hd| w.kv_b.rows_view(hd * per_head, cfg.nope).and_then(Matrix::dense)).collect();
        let uv: Option<Vec<Matrix<'a>>> =
            (0..h).map(|hd| w.kv_b.rows_view(hd * per_head + cfg.nope, cfg.v_dim)).collect();
        let (Some(uk), Some(uv)) = (uk, uv) else {
            return Err(AttnError::Unsupported {
                layer: name,
                reason: "kv_b_proj's rows cannot be read per head".into(),
            });
        };
        if let Some(g) = &w.g_proj {
            check_matrix(&name, "g_proj", g, h * cfg.v_dim, d)?;
        }
        check_matrix(&name, "o_proj", &w.o_proj, d, h * cfg.v_dim)?;
        let rope = match &cfg.positions {
            PositionEmbedding::None => None,
            PositionEmbedding::Rope(_) if !cfg.rope.is_multiple_of(2) => {
                return Err(AttnError::Unsupported {
                    layer: name,
                    reason: format!("RoPE needs an even number of rope dims, not {}", cfg.rope),
                });
            }
            PositionEmbedding::Rope(r) => Some(RopeTable::new(r, cfg.rope)),
        };
        Ok(Mla { name, cfg, w, uk, uv, kv_b_rows, rope, form: MlaForm::Auto })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &MlaConfig {
        &self.cfg
    }

    /// Which form a chunk's attention runs ([`MlaForm::Auto`] unless set).
    pub fn set_form(&mut self, form: MlaForm) {
        self.form = form;
    }

    pub fn form(&self) -> MlaForm {
        self.form
    }

    /// An empty f32 cache for this layer.
    pub fn cache(&self) -> MlaCache {
        self.cache_of(KvCacheType::F32)
    }

    /// An empty cache for this layer storing its rows as `kind`.
    pub fn cache_of(&self, kind: KvCacheType) -> MlaCache {
        MlaCache::empty(kind, [self.cfg.kv_lora as u64, self.cfg.rope as u64])
    }

    pub fn step(&self, cache: &mut MlaCache, x: &[f32], out: &mut [f32]) {
        self.prefill(cache, x, out)
    }

    /// A chunk of one sequence's tokens (`xs` `[n, D]`): appends their cache entries, each
    /// attends causally.
    pub fn prefill(&self, cache: &mut MlaCache, xs: &[f32], outs: &mut [f32]) {
        let rows = xs.len() / self.cfg.hidden.max(1);
        self.forward(&mut [MlaSeq { cache, rows }], xs, outs)
    }

    /// Several sequences' chunks as one (`xs` `[n, D]`: each sequence's rows in turn): the
    /// projections of every row as matrix products, each row attending over its own sequence's
    /// cache; every row gives the same bits as that sequence's chunk alone would.
    pub fn forward(&self, seqs: &mut [MlaSeq<'_>], xs: &[f32], outs: &mut [f32]) {
        let cfg = &self.cfg;
        let d = cfg.hidden;
        let n = xs.len() / d;
        assert!(
            xs.len().is_multiple_of(d) && outs.len() == xs.len() && seqs.iter().map(|s| s.rows).sum::<usize>() == n,
            "{}: inputs and outputs must be [n, {d}], n the sequences' rows",
            self.name
        );
        let (h, l, r) = (cfg.heads, cfg.kv_lora, cfg.rope);
        let mut q = self.queries(xs, n);
        let mut ckv = vec![0f32; n * (l + r)];
        par::matmul(&self.w.kv_a, xs, &mut ckv);
        // Each row: its sequence's cache and how many positions it sees.
        let mut rows: Vec<(usize, usize)> = Vec::with_capacity(n);
        let (mut normed, mut key) = (vec![0f32; l], vec![0f32; r]);
        let mut entries = ckv.chunks_exact(l + r);
        // With RoPE: each row's (cos, sin) per pair, shared by its key and its heads' queries.
        let mut turns: Vec<(f32, f32)> = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            seq.cache.grow(seq.rows);
            for (_, row) in (0..seq.rows).zip(entries.by_ref()) {
                rms_norm(&row[..l], &self.w.kv_a_norm, cfg.lowrank_eps, &mut normed);
                key.copy_from_slice(&row[l..]);
                if let Some(rope) = &self.rope {
                    let from = turns.len();
                    rope.turns(seq.cache.len(), &mut turns);
                    rotate(&mut key, &turns[from..]);
                }
                seq.cache.push(&normed, &key);
                rows.push((i, seq.cache.len()));
            }
        }
        if self.rope.is_some() {
            let (qh, half) = (cfg.nope + r, r / 2);
            for (t, qt) in q.chunks_exact_mut(h * qh).enumerate() {
                for head in qt.chunks_exact_mut(qh) {
                    rotate(&mut head[cfg.nope..], &turns[t * half..(t + 1) * half]);
                }
            }
        }
        let mut gate = Vec::new();
        if let Some(g) = &self.w.g_proj {
            gate.resize(n * h * cfg.v_dim, 0.0);
            par::matmul(g, xs, &mut gate);
        }
        let caches: Vec<&MlaCache> = seqs.iter().map(|s| &*s.cache).collect();
        let mut ctx = self.contexts(&caches, &rows, &q);
        if !gate.is_empty() {
            for (c, g) in ctx.iter_mut().zip(&gate) {
                *c *= sigmoid(*g);
            }
        }
        par::matmul(&self.w.o_proj, &ctx, outs);
    }

    /// Every row's attention context `[n, H, v]` (`rows[t]`: row `t`'s sequence and how many of
    /// its positions it sees): each sequence's rows in the form [`MlaForm::expands`] picks for
    /// them, so a row's bits never depend on the other sequences batched with it.
    fn contexts(&self, caches: &[&MlaCache], rows: &[(usize, usize)], q: &[f32]) -> Vec<f32> {
        let cfg = &self.cfg;
        let (h, l, r, qh, hv) = (cfg.heads, cfg.kv_lora, cfg.rope, cfg.nope + cfg.rope, cfg.heads * cfg.v_dim);
        let n = rows.len();
        let seen: usize = rows.iter().map(|&(_, len)| len).sum();
        let parallel = h * seen * (l + r) >= par::MIN_PARALLEL_WEIGHTS && rayon::current_num_threads() > 1;
        let mut ctx = vec![0f32; n * hv];
        // A sequence's rows are consecutive: the expanded ones run a sequence at a time.
        let mut absorbed = vec![false; n];
        let mut t = 0;
        for (i, cache) in caches.iter().enumerate() {
            let count = rows[t..].iter().take_while(|&&(s, _)| s == i).count();
            let span = t..t + count;
            if count > 0 && self.form.expands(cfg, count, cache.len()) {
                let (qs, out) = (&q[t * h * qh..span.end * h * qh], &mut ctx[t * hv..span.end * hv]);
                self.attend_expanded(cache, qs, parallel, out);
            } else {
                absorbed[span].fill(true);
            }
            t += count;
        }
        // The absorbed rows: each on its own thread in a chunk; a lone row (decode) splits its
        // positions' groups and heads over the pool instead (`attend`). The same bits either way.
        let picked: Vec<usize> = (0..n).filter(|&t| absorbed[t]).collect();
        if picked.is_empty() {
            return ctx;
        }
        // Their queries: `q` itself when every row is absorbed (decode: nothing copied), else
        // gathered; row `t` is the picked rows' `index(t)`-th.
        let gathered: Vec<f32>;
        let qa = if picked.len() == n {
            q
        } else {
            gathered = picked.iter().flat_map(|&t| &q[t * h * qh..(t + 1) * h * qh]).copied().collect();
            &gathered
        };
        let index = |t: usize| picked.partition_point(|&p| p < t);
        let qabs = self.absorbed_queries(qa, parallel);
        let row = |(t, c): (usize, &mut [f32]), split: bool| {
            let (i, len) = rows[t];
            self.attend_row(caches[i], qa, &qabs, index(t), len, split, c)
        };
        if picked.len() > 1 && parallel {
            ctx.par_chunks_mut(hv).enumerate().filter(|(t, _)| absorbed[*t]).for_each(|tc| row(tc, false));
        } else {
            ctx.chunks_mut(hv).enumerate().filter(|(t, _)| absorbed[*t]).for_each(|tc| row(tc, parallel));
        }
        ctx
    }

    /// The softmax's scale: `1 / sqrt(nope + rope)`, times YaRN's factor with RoPE.
    fn softmax_scale(&self) -> f32 {
        let qh = self.cfg.nope + self.cfg.rope;
        match &self.rope {
            Some(rope) => (rope.softmax_factor / (qh as f64).sqrt()) as f32,
            None => 1.0 / (qh as f32).sqrt(),
        }
    }

    /// Every row's queries `[n, H, nope + rope]`.
    fn queries(&self, xs: &[f32], n: usize) -> Vec<f32> {
        let cfg = &self.cfg;
        let mut q = vec![0f32; n * cfg.heads * (cfg.nope + cfg.rope)];
        match &self.w.q {
            QPath::LowRank { a, norm, b } => {
                let mut qa = vec![0f32; n * a.rows()];
                par::matmul(a, xs, &mut qa);
                let mut normed = vec![0f32; a.rows()];
                for row in qa.chunks_exact_mut(a.rows()) {
                    rms_norm(row, norm, cfg.lowrank_eps, &mut normed);
                    row.copy_from_slice(&normed);
                }
                par::matmul(b, &qa, &mut q);
            }
            QPath::Direct(m) => par::matmul(m, xs, &mut q),
        }
        q
    }

    /// The absorbed queries of `q`'s rows (`[n, H, nope + rope]`): `[n, H, kv_lora]`, head `h`'s
    /// `W_uk^T q_nope` for all rows at once (`matmul_transposed`: each weight row widened once for
    /// the rows, each row's bits those of its own product); heads split over the pool when
    /// `parallel` and worth it.
    fn absorbed_queries(&self, q: &[f32], parallel: bool) -> Vec<f32> {
        let cfg = &self.cfg;
        let (h, l, qh) = (cfg.heads, cfg.kv_lora, cfg.nope + cfg.rope);
        let n = q.len() / (h * qh);
        // Head `hd`'s rows' `q_nope` gathered into `xs`, its absorbed queries into `out`.
        let head = |hd: usize, xs: &mut Vec<f32>, out: &mut [f32]| {
            xs.clear();
            xs.extend(q.chunks_exact(qh).skip(hd).step_by(h).flat_map(|qt| &qt[..cfg.nope]));
            self.uk[hd].matmul_transposed(xs, out);
        };
        let mut qabs = vec![0f32; n * h * l];
        let mut place = |hd: usize, out: &[f32]| {
            for (t, row) in out.chunks_exact(l).enumerate() {
                qabs[(t * h + hd) * l..(t * h + hd + 1) * l].copy_from_slice(row);
            }
        };
        let worth = n * h * cfg.nope * l >= par::MIN_PARALLEL_WEIGHTS && rayon::current_num_threads() > 1;
        if parallel && worth {
            let per_head: Vec<Vec<f32>> = (0..h)
                .into_par_iter()
                .map(|hd| {
                    let mut out = vec![0f32; n * l];
                    head(hd, &mut Vec::new(), &mut out);
                    out
                })
                .collect();
            per_head.iter().enumerate().for_each(|(hd, out)| place(hd, out));
        } else {
            // Serially: two buffers for all heads.
            let (mut xs, mut out) = (Vec::with_capacity(n * cfg.nope), vec![0f32; n * l]);
            for hd in 0..h {
                head(hd, &mut xs, &mut out);
                place(hd, &out);
            }
        }
        qabs
    }

    /// Token `t` of the chunk whose queries are `q` and absorbed queries `qabs` attends over the
    /// first `len` cached positions with every head; `ctx` `[H, v_dim]`. `parallel`: split the
    /// work over the pool (a decode row), which changes no bit.
    #[allow(clippy::too_many_arguments)]
    fn attend_row(
        &self,
        cache: &MlaCache,
        q: &[f32],
        qabs: &[f32],
        t: usize,
        len: usize,
        parallel: bool,
        ctx: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (h, l, r, qh) = (cfg.heads, cfg.kv_lora, cfg.rope, cfg.nope + cfg.rope);
        let qt = &q[t * h * qh..(t + 1) * h * qh];
        let qabs = &qabs[t * h * l..(t + 1) * h * l];
        let qext: Vec<f32> = qt.chunks_exact(qh).flat_map(|head| &head[cfg.nope..]).copied().collect();
        let scale = self.softmax_scale();
        let mut lat = vec![0f32; h * l];
        attend_keys(qabs, &qext, cache.keys(), len, l, r, scale, parallel, &mut lat);
        let out = |(hd, (c, lh)): (usize, (&mut [f32], &[f32]))| self.uv[hd].matvec(lh, c);
        if parallel {
            ctx.par_chunks_mut(cfg.v_dim).zip(lat.par_chunks(l)).enumerate().for_each(out);
        } else {
            ctx.chunks_mut(cfg.v_dim).zip(lat.chunks(l)).enumerate().for_each(out);
        }
    }
}
