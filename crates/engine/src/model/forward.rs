//! The forward pass over a chunk of rows — one sequence's tokens, or several sequences' side by
//! side: embedding, then per layer the attention input (AttnRes mix or the residual), attention
//! (each sequence on its own state, projections batched over every row), the MLP input, the dense
//! MLP or the streaming MoE step (each distinct expert read once for every row), and at the end
//! the final norm and the logits. Activations are f32; RMS means and AttnRes scores are
//! accumulated in f64, as in the reference implementations.

use std::time::Instant;

use k3_attn::{KdaRun, KdaSeq, MlaSeq};
use k3_quant::vecops::rms_norm;
use k3_router::Routing;
use k3_router::synthetic::RowContext;

use super::Engine;
use super::attnres::mix;
use super::layers::{Attn, Ffn, Layer};
use super::lookahead::Guesses;
use super::moe::{Clock, Rows};
use super::session::{LayerState, Pending, Session};
use super::stats::{RunStats, Span, SpanKind};
use crate::EngineError;

/// Which positions' logits a sequence of a step returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every position's, `[n, vocab]`.
    All,
    /// The last position's, `[vocab]`: a prompt being prefilled needs no others, and the output
    /// projection (K3's is 1.2 G weights) is then computed once per chunk instead of once per
    /// token. The same bits as the last row of `All`.
    Last,
}

/// One sequence's part of a step.
#[derive(Debug)]
pub struct Seq<'s> {
    pub session: &'s mut Session,
    pub ids: &'s [u32],
    pub logits: Logits,
    /// Speculative drafts: the rows are computed but the session keeps only what
    /// [`Engine::accept_drafts`] later keeps of them.
    pub tentative: bool,
    /// Images of the prompt this chunk is part of (positions counted from where `images_from`
    /// counts): the rows that fall in the chunk replace the placeholder tokens' embeddings.
    pub images: &'s [super::Inserted],
    /// The chunk's first row in the images' positions.
    pub images_from: usize,
}

impl<'s> Seq<'s> {
    /// `ids` run into `session` for good, returning the logits asked for.
    pub fn new(session: &'s mut Session, ids: &'s [u32], logits: Logits) -> Self {
        Seq { session, ids, logits, tentative: false, images: &[], images_from: 0 }
    }

    /// The same step with the prompt's `images` in place of their placeholder rows, the chunk
    /// starting at position `from` of the prompt (an image a chunk boundary splits gives each
    /// chunk its rows; none is copied).
    pub fn with_images(self, images: &'s [super::Inserted], from: usize) -> Self {
        Seq { images, images_from: from, ..self }
    }
}

/// The activations of one chunk as it goes through the layers.
pub(super) struct Chunk {
    pub(super) n: usize,
    /// Rows per sequence, in order.
    pub(super) rows: Vec<usize>,
    /// The residual stream `[n, d]` (K3: the running partial sum's layer output).
    pub(super) h: Vec<f32>,
    /// The layer's partial sum `[n, d]`.
    p: Vec<f32>,
    normed: Vec<f32>,
    /// Attention output, then the MLP's.
    out: Vec<f32>,
    /// K3 AttnRes block snapshots per row.
    pub(super) blocks: Vec<Vec<Vec<f32>>>,
    routings: Vec<Routing>,
    /// Per row: what the predictors said about the current layer.
    guesses: Vec<Guesses>,
    /// Per row, for a model routed by a synthetic process: the tokens its routing depends on.
    contexts: Vec<RowContext>,
    /// Expert Deferral: the previous layer's deferred experts' share `[n, d]`, added at the end
    /// of this one.
    late: Option<Vec<f32>>,
}

impl Chunk {
    /// A chunk of `rows` (rows per sequence) whose residual stream is `h` and AttnRes snapshots
    /// `blocks`, before a layer.
    pub(super) fn at(rows: Vec<usize>, h: Vec<f32>, blocks: Vec<Vec<Vec<f32>>>, contexts: Vec<RowContext>) -> Self {
        let n = blocks.len();
        Chunk {
            n,
            rows,
            normed: vec![0f32; h.len()],
            out: vec![0f32; h.len()],
            h,
            p: Vec::new(),
            blocks,
            routings: vec![Routing::default(); n],
            guesses: vec![[None, None]; n],
            contexts,
            late: None,
        }
    }
}

impl Chunk {
    /// Each sequence's row range.
    fn spans(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        self.rows.iter().scan(0, |at, &n| {
            *at += n;
            Some(*at - n..*at)
        })
    }
}

/// The first session of the step that records a timeline.
fn timeline<'a>(seqs: &'a mut [Seq<'_>]) -> Option<&'a mut Vec<Span>> {
    seqs.iter_mut().find_map(|s| s.session.timeline.as_mut())
}

impl<'m> Engine<'m> {
    /// Runs `ids` (a chunk, after whatever `session` holds) through the model. Returns the logits
    /// `[n, vocab]`; fills `trace` (when given) with the hidden state after every layer,
    /// `[n, layers, hidden]` token-major.
    pub fn forward(
        &self,
        session: &mut Session,
        ids: &[u32],
        trace: Option<&mut Vec<f32>>,
    ) -> Result<Vec<f32>, EngineError> {
        let mut seqs = [Seq::new(session, ids, Logits::All)];
        Ok(self.run(&mut seqs, trace)?.pop().expect("one sequence"))
    }

    /// As [`forward`](Self::forward), returning only the last position's logits `[vocab]`
    /// ([`Logits::Last`]).
    pub fn forward_last(&self, session: &mut Session, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.forward_last_with_images(session, ids, &[], 0)
    }

    /// As [`forward_last`](Self::forward_last), with a prompt's images ([`Seq::with_images`]):
    /// `ids` start at position `from` of the prompt they place.
    pub fn forward_last_with_images(
        &self,
        session: &mut Session,
        ids: &[u32],
        images: &[super::Inserted],
        from: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let mut seqs = [Seq::new(session, ids, Logits::Last).with_images(images, from)];
        Ok(self.run(&mut seqs, None)?.pop().expect("one sequence"))
    }

    /// Several sequences advanced in one step: their rows share every weight read — each trunk
    /// matrix once per step, each distinct routed expert once for all the rows that chose it —
    /// and each row gives the same bits as its sequence run alone. Returns each sequence's
    /// logits as it asked.
    pub fn forward_batch(&self, seqs: &mut [Seq<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.run(seqs, None)
    }

    /// Scores speculative drafts: `ids` (the last accepted token, then the drafts) are run and
    /// every position's logits returned `[n, vocab]`, but the session keeps nothing of them until
    /// [`accept_drafts`](Self::accept_drafts) says how many rows to keep.
    pub fn forward_drafts(&self, session: &mut Session, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut seqs = [Seq { session, ids, logits: Logits::All, tentative: true, images: &[], images_from: 0 }];
        Ok(self.run(&mut seqs, None)?.pop().expect("one sequence"))
    }

    /// Keeps the first `rows` rows of the session's chunk of drafts (the rest never happened):
    /// the session is then exactly as if only those rows had been run.
    pub fn accept_drafts(&self, session: &mut Session, rows: usize) -> Result<(), EngineError> {
        let p =
            session.pending.take().ok_or_else(|| EngineError::Input("no chunk of drafts awaits acceptance".into()))?;
        let rows = rows.min(p.ids.len());
        let start = session.ids.len();
        for (li, layer) in self.layers.iter().enumerate() {
            match (&layer.attn, &mut session.layers[li]) {
                (Attn::Kda(k), LayerState::Kda(s)) => self.compute.run(|| k.commit(s, &p.tapes[li], rows)),
                (Attn::Mla(_), LayerState::Mla(c)) => c.truncate(p.mla_len[li] + rows),
                _ => return Err(EngineError::Input(format!("the session does not belong to this model (layer {li})"))),
            }
        }
        if let Some(tr) = session.routing_trace.as_mut() {
            tr.extend(p.routes.into_iter().filter(|r| r.position < start + rows));
        }
        session.ids.extend_from_slice(&p.ids[..rows]);
        session.stats.tokens += rows as u64;
        Ok(())
    }

    /// A step. When the model's experts all stay in memory its steps never wait on the drive
    /// once warm, and the whole step runs on a compute worker: its ~100 products then share their
    /// rows with the other workers inside the pool (a join), where from this thread each one
    /// would wake the pool and sleep until it finished (docs/EFFICIENCY.md, "Decode without
    /// hand-offs"). A step that streams keeps its coordinator here, off the pool, so a wait on a
    /// read never holds a compute worker.
    fn run(&self, seqs: &mut [Seq<'_>], trace: Option<&mut Vec<f32>>) -> Result<Vec<Vec<f32>>, EngineError> {
        if self.resident() { self.compute.run(|| self.run_step(seqs, trace)) } else { self.run_step(seqs, trace) }
    }

    fn run_step(&self, seqs: &mut [Seq<'_>], mut trace: Option<&mut Vec<f32>>) -> Result<Vec<Vec<f32>>, EngineError> {
        let started = Instant::now();
        let (d, nl) = (self.hidden, self.layers.len());
        let mut ids = Vec::new();
        for s in seqs.iter_mut() {
            self.check_seq(s)?;
            ids.extend_from_slice(s.ids);
            if s.tentative {
                s.session.pending = Some(self.pending(s.session, s.ids));
            }
            if let Some(tl) = s.session.timeline.as_mut() {
                tl.clear();
            }
        }
        let n = ids.len();
        let contexts = if self.synthetic_routing() { row_contexts(seqs) } else { Vec::new() };
        let rows = seqs.iter().map(|s| s.ids.len()).collect();
        let mut h = self.embed(&ids);
        let mut at = 0;
        for s in seqs.iter() {
            for (img, range) in super::vision::in_chunk(s.images, s.images_from, s.ids.len(), d) {
                let rows = &img.rows[(range.start - img.at) * d..(range.end - img.at) * d];
                h[(at + range.start - s.images_from) * d..][..rows.len()].copy_from_slice(rows);
            }
            at += s.ids.len();
        }
        let mut c = Chunk::at(rows, h, vec![Vec::new(); n], contexts);
        if let Some(tr) = trace.as_deref_mut() {
            tr.clear();
            tr.resize(n * nl * d, 0.0);
        }
        let mut step = RunStats::default();
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention(seqs, li, layer, &mut c, started)?;
            self.feed_forward(seqs, li, layer, &mut c, started, &mut step)?;
            if let Some(tr) = trace.as_deref_mut() {
                for t in 0..n {
                    tr[(t * nl + li) * d..(t * nl + li + 1) * d].copy_from_slice(&c.h[t * d..(t + 1) * d]);
                }
            }
        }
        let logits = self.logits(&c, seqs);
        let seconds = started.elapsed().as_secs_f64();
        let cache = self.io.as_ref().and_then(|m| m.lock().ok().map(|io| io.cache.stats()));
        for s in seqs.iter_mut() {
            let n = s.ids.len();
            if !s.tentative {
                s.session.ids.extend_from_slice(s.ids);
                s.session.stats.tokens += n as u64;
            }
            // Every sequence of the step waited for all of it.
            s.session.stats.add_step(&step, seconds, cache);
        }
        Ok(logits)
    }

    /// A sequence can take this step: ids in the vocabulary, a session of this model with no
    /// chunk of drafts awaiting acceptance.
    fn check_seq(&self, s: &Seq<'_>) -> Result<(), EngineError> {
        if let Some(&bad) = s.ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(EngineError::Input(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        if s.session.layers.len() != self.layers.len() {
            return Err(EngineError::Input("the session does not belong to this model".into()));
        }
        if s.session.pending.is_some() {
            return Err(EngineError::Input("the session has a chunk of drafts awaiting `accept_drafts`".into()));
        }
        self.check_images(s)
    }

    /// What `accept_drafts` will need to keep a prefix of the tentative chunk `ids`.
    fn pending(&self, session: &Session, ids: &[u32]) -> Pending {
        let mla_len = session
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Mla(c) => c.len(),
                LayerState::Kda(_) => 0,
            })
            .collect();
        Pending {
            ids: ids.to_vec(),
            tapes: vec![Default::default(); session.layers.len()],
            mla_len,
            routes: Vec::new(),
        }
    }

    pub(super) fn embed(&self, ids: &[u32]) -> Vec<f32> {
        let d = self.hidden;
        let mut h = vec![0f32; ids.len() * d];
        for (&t, row) in ids.iter().zip(h.chunks_exact_mut(d)) {
            // The table's encoding and shape are checked at load, the ids against the vocabulary
            // before a forward call: a lookup always reads a row.
            let read = self.embed.row_values(t as usize, row);
            debug_assert!(read, "token {t} has no row in the embedding table");
        }
        h
    }

    /// The attention input (K3: the AttnRes mix of the blocks and the partial sum; a fresh block
    /// snapshots it), attention, and the partial sum after it.
    pub(super) fn attention(
        &self,
        seqs: &mut [Seq<'_>],
        li: usize,
        layer: &Layer<'m>,
        c: &mut Chunk,
        started: Instant,
    ) -> Result<(), EngineError> {
        let d = self.hidden;
        let fresh = li.is_multiple_of(self.res_block);
        c.p.clone_from(&c.h);
        for t in 0..c.n {
            let pt = &c.p[t * d..(t + 1) * d];
            let a_in = match &layer.att_res {
                Some(w) if !c.blocks[t].is_empty() => mix(&c.blocks[t], pt, w, self.eps()),
                _ => pt.to_vec(),
            };
            if layer.att_res.is_some() && fresh {
                c.blocks[t].push(pt.to_vec());
            }
            rms_norm(&a_in, &layer.input_norm, self.eps(), &mut c.normed[t * d..(t + 1) * d]);
        }
        let t_att = started.elapsed().as_secs_f64();
        let (normed, out) = (&c.normed, &mut c.out);
        let mismatch = || EngineError::Input(format!("the session does not belong to this model (layer {li})"));
        match &layer.attn {
            Attn::Kda(k) => {
                let mut ks = Vec::with_capacity(seqs.len());
                for (s, &rows) in seqs.iter_mut().zip(&c.rows) {
                    let Session { layers, pending, .. } = &mut *s.session;
                    let LayerState::Kda(state) = &mut layers[li] else { return Err(mismatch()) };
                    let run = match pending.as_mut() {
                        Some(p) => KdaRun::Tentative(&*state, &mut p.tapes[li]),
                        None => KdaRun::Advance(state),
                    };
                    ks.push(KdaSeq { rows, run });
                }
                self.compute.run(|| k.forward(&mut ks, normed, out));
            }
            Attn::Mla(m) => {
                let mut ms = Vec::with_capacity(seqs.len());
                for (s, &rows) in seqs.iter_mut().zip(&c.rows) {
                    let LayerState::Mla(cache) = &mut s.session.layers[li] else { return Err(mismatch()) };
                    ms.push(MlaSeq { cache, rows });
                }
                self.compute.run(|| m.forward(&mut ms, normed, out));
            }
        }
        if let Some(tl) = timeline(seqs) {
            let end = started.elapsed().as_secs_f64();
            tl.push(Span { layer: li as u32, kind: SpanKind::Attention, start: t_att, end });
        }
        if layer.att_res.is_some() && fresh {
            c.p.copy_from_slice(&c.out);
        } else {
            c.p.iter_mut().zip(&c.out).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    /// The MLP input (K3: the AttnRes mix), the dense MLP or the streaming MoE step, and the new
    /// residual stream; the lookahead's guesses for the next layer on the way.
    pub(super) fn feed_forward(
        &self,
        seqs: &mut [Seq<'_>],
        li: usize,
        layer: &Layer<'m>,
        c: &mut Chunk,
        started: Instant,
        step: &mut RunStats,
    ) -> Result<(), EngineError> {
        let d = self.hidden;
        // The after-attention guess feeds the prefetch; computed only when someone uses it: a
        // model whose experts all stay in memory has nothing to prefetch once warm.
        let wanted = (self.opts.lookahead && !self.resident()) || self.opts.lookahead_stats;
        let mut after_attention = Vec::with_capacity(c.n);
        for t in 0..c.n {
            let pt = &c.p[t * d..(t + 1) * d];
            let m_in = match &layer.mlp_res {
                Some(w) => mix(&c.blocks[t], pt, w, self.eps()),
                None => pt.to_vec(),
            };
            rms_norm(&m_in, &layer.post_norm, self.eps(), &mut c.normed[t * d..(t + 1) * d]);
            let row = c.contexts.get(t);
            after_attention.push(if wanted { self.predict_next(li, &c.blocks[t], pt, row) } else { None });
        }
        // The last layer defers nothing: there is no later layer to add it to.
        let defers = self.opts.approx.defer > 0 && li + 1 < self.layers.len();
        let mut late = Vec::new();
        match &layer.ffn {
            Ffn::Dense(mlp) => {
                let (normed, out, act) = (&c.normed, &mut c.out, self.cfg.activation);
                self.compute.run(|| mlp.forward_batch(act, normed, out));
            }
            Ffn::Moe(moe) => {
                let earns = seqs.iter().any(|s| self.prefetch_earns(s.session, li));
                let predicted: Vec<Vec<u32>> =
                    if earns { after_attention.iter().flatten().cloned().collect() } else { Vec::new() };
                let mut spans = timeline(seqs).map(|_| Vec::new());
                let mut clock = Clock { start: started, spans: &mut spans, layer: layer.index };
                let rows = Rows { xs: &c.normed, contexts: &c.contexts };
                let later = defers.then_some(&mut late);
                self.moe_chunk(layer, moe, rows, &mut c.out, &mut c.routings, &predicted, step, &mut clock, later)?;
                if let (Some(tl), Some(sp)) = (timeline(seqs), spans) {
                    tl.extend(sp);
                }
                let spans: Vec<_> = c.spans().collect();
                for (s, r) in seqs.iter_mut().zip(spans) {
                    let (routings, guesses) = (&c.routings[r.clone()], &mut c.guesses[r]);
                    self.record_routing(s.session, li, moe, routings, guesses);
                }
            }
        }
        if let Some(prev) = c.late.take() {
            c.out.iter_mut().zip(&prev).for_each(|(a, b)| *a += b);
        }
        c.late = (!late.is_empty()).then_some(late);
        for (t, guess) in after_attention.into_iter().enumerate() {
            let r = t * d..(t + 1) * d;
            for ((hv, pv), fv) in c.h[r.clone()].iter_mut().zip(&c.p[r.clone()]).zip(&c.out[r.clone()]) {
                *hv = pv + fv;
            }
            let row = c.contexts.get(t);
            let after_moe =
                if self.opts.lookahead_stats { self.predict_next(li, &c.blocks[t], &c.h[r], row) } else { None };
            c.guesses[t] = [guess, after_moe];
        }
        Ok(())
    }

    /// The final norm (K3: after the output AttnRes mix) and the logits each sequence asked for,
    /// as one product over every row that needs them.
    fn logits(&self, c: &Chunk, seqs: &[Seq<'_>]) -> Vec<Vec<f32>> {
        let d = self.hidden;
        let wanted: Vec<std::ops::Range<usize>> = c
            .spans()
            .zip(seqs)
            .map(|(r, s)| match s.logits {
                Logits::All => r,
                Logits::Last => r.end.saturating_sub(1).max(r.start)..r.end,
            })
            .collect();
        let rows: Vec<usize> = wanted.iter().flat_map(|r| r.clone()).collect();
        let mut normed = vec![0f32; rows.len() * d];
        for (&t, o) in rows.iter().zip(normed.chunks_exact_mut(d)) {
            let ht = &c.h[t * d..(t + 1) * d];
            let fin = match &self.out_res {
                Some(w) => mix(&c.blocks[t], ht, w, self.eps()),
                None => ht.to_vec(),
            };
            rms_norm(&fin, &self.norm, self.eps(), o);
        }
        let mut logits = vec![0f32; rows.len() * self.vocab];
        self.compute.matmul(&self.lm_head, &normed, &mut logits);
        let mut out = Vec::with_capacity(seqs.len());
        let mut at = 0;
        for r in wanted {
            out.push(logits[at * self.vocab..(at + r.len()) * self.vocab].to_vec());
            at += r.len();
        }
        out
    }
}

/// Each row's context for a synthetic routing process: its position, its token and the two
/// before it, and the tokens that start its topic segments.
fn row_contexts(seqs: &[Seq<'_>]) -> Vec<RowContext> {
    let mut out = Vec::new();
    for s in seqs {
        let history = &s.session.ids;
        let id = |p: usize| if p < history.len() { history[p] } else { s.ids[p - history.len()] };
        for j in 0..s.ids.len() {
            out.push(RowContext::at(history.len() + j, id));
        }
    }
    out
}
