//! The forward pass over a chunk of tokens: embedding, then per layer the attention input (AttnRes
//! mix or the residual), attention, the MLP input, the dense MLP or the streaming MoE step, and at
//! the end the final norm and the logits. Activations are f32; RMS means and AttnRes scores are
//! accumulated in f64, as in the reference implementations.

use std::time::Instant;

use k3_quant::Matrix;
use k3_quant::vecops::rms_norm;
use k3_router::Routing;

use super::Engine;
use super::attnres::mix;
use super::layers::{Attn, Ffn, Layer};
use super::lookahead::Guesses;
use super::moe::Clock;
use super::session::{LayerState, Session};
use super::stats::{Span, SpanKind};
use crate::EngineError;

/// The activations of one chunk as it goes through the layers.
struct Chunk {
    n: usize,
    /// The residual stream `[n, d]` (K3: the running partial sum's layer output).
    h: Vec<f32>,
    /// The layer's partial sum `[n, d]`.
    p: Vec<f32>,
    normed: Vec<f32>,
    /// Attention output, then the MLP's.
    out: Vec<f32>,
    /// K3 AttnRes block snapshots per token.
    blocks: Vec<Vec<Vec<f32>>>,
    routings: Vec<Routing>,
    /// Per token: what the predictors said about the current layer.
    guesses: Vec<Guesses>,
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
        self.run(session, ids, trace, false)
    }

    /// As [`forward`](Self::forward), returning only the last position's logits `[vocab]`: a
    /// prompt being prefilled needs no others, and the output projection (K3's is 1.2 G weights)
    /// is then computed once per chunk instead of once per token. The same bits as the last row
    /// of `forward`'s logits.
    pub fn forward_last(&self, session: &mut Session, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.run(session, ids, None, true)
    }

    fn run(
        &self,
        session: &mut Session,
        ids: &[u32],
        mut trace: Option<&mut Vec<f32>>,
        last_only: bool,
    ) -> Result<Vec<f32>, EngineError> {
        let started = Instant::now();
        let (d, n, nl) = (self.hidden, ids.len(), self.layers.len());
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(EngineError::Input(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        if session.layers.len() != nl {
            return Err(EngineError::Input("the session does not belong to this model".into()));
        }
        if let Some(tl) = session.timeline.as_mut() {
            tl.clear();
        }
        let mut c = Chunk {
            n,
            h: self.embed(ids),
            p: Vec::new(),
            normed: vec![0f32; n * d],
            out: vec![0f32; n * d],
            blocks: vec![Vec::new(); n],
            routings: vec![Routing::default(); n],
            guesses: vec![[None, None]; n],
        };
        if let Some(tr) = trace.as_deref_mut() {
            tr.clear();
            tr.resize(n * nl * d, 0.0);
        }
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention(session, li, layer, &mut c, started)?;
            self.feed_forward(session, li, layer, &mut c, started)?;
            if let Some(tr) = trace.as_deref_mut() {
                for t in 0..n {
                    tr[(t * nl + li) * d..(t * nl + li + 1) * d].copy_from_slice(&c.h[t * d..(t + 1) * d]);
                }
            }
        }
        let logits = self.logits(&c, if last_only { n.saturating_sub(1) } else { 0 });
        session.tokens += n;
        session.stats.tokens += n as u64;
        session.stats.seconds += started.elapsed().as_secs_f64();
        if let Some(Ok(io)) = self.io.as_ref().map(|m| m.lock()) {
            session.stats.cache = io.cache.stats();
        }
        Ok(logits)
    }

    fn embed(&self, ids: &[u32]) -> Vec<f32> {
        let d = self.hidden;
        let mut h = vec![0f32; ids.len() * d];
        for (&t, row) in ids.iter().zip(h.chunks_exact_mut(d)) {
            let t = t as usize;
            match self.embed {
                Matrix::F32 { w, .. } => row.copy_from_slice(&w[t * d..(t + 1) * d]),
                Matrix::Bf16 { w, .. } => row.iter_mut().zip(&w[t * d..(t + 1) * d]).for_each(|(o, v)| *o = v.to_f32()),
                _ => unreachable!("checked at load"),
            }
        }
        h
    }

    /// The attention input (K3: the AttnRes mix of the blocks and the partial sum; a fresh block
    /// snapshots it), attention, and the partial sum after it.
    fn attention(
        &self,
        session: &mut Session,
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
        match (&layer.attn, &mut session.layers[li]) {
            (Attn::Kda(k), LayerState::Kda(s)) => self.compute.run(|| k.prefill(s, normed, out)),
            (Attn::Mla(m), LayerState::Mla(cache)) => self.compute.run(|| m.prefill(cache, normed, out)),
            _ => return Err(EngineError::Input(format!("the session does not belong to this model (layer {li})"))),
        }
        if let Some(tl) = session.timeline.as_mut() {
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
    fn feed_forward(
        &self,
        session: &mut Session,
        li: usize,
        layer: &Layer<'m>,
        c: &mut Chunk,
        started: Instant,
    ) -> Result<(), EngineError> {
        let d = self.hidden;
        // The after-attention guess feeds the prefetch; computed only when someone uses it.
        let wanted = self.opts.lookahead || self.opts.lookahead_stats;
        let mut after_attention = Vec::with_capacity(c.n);
        for t in 0..c.n {
            let pt = &c.p[t * d..(t + 1) * d];
            let m_in = match &layer.mlp_res {
                Some(w) => mix(&c.blocks[t], pt, w, self.eps()),
                None => pt.to_vec(),
            };
            rms_norm(&m_in, &layer.post_norm, self.eps(), &mut c.normed[t * d..(t + 1) * d]);
            after_attention.push(if wanted { self.predict_next(li, &c.blocks[t], pt) } else { None });
        }
        match &layer.ffn {
            Ffn::Dense(mlp) => {
                let (normed, out, act) = (&c.normed, &mut c.out, self.cfg.activation);
                self.compute.run(|| mlp.forward_batch(act, normed, out));
            }
            Ffn::Moe(moe) => {
                let predicted: Vec<Vec<u32>> = if self.prefetch_earns(session, li) {
                    after_attention.iter().flatten().cloned().collect()
                } else {
                    Vec::new()
                };
                let mut spans = session.timeline.as_ref().map(|_| Vec::new());
                let mut clock = Clock { start: started, spans: &mut spans, layer: layer.index };
                self.moe_chunk(
                    layer,
                    moe,
                    &c.normed,
                    &mut c.out,
                    &mut c.routings,
                    &predicted,
                    &mut session.stats,
                    &mut clock,
                )?;
                if let (Some(tl), Some(sp)) = (session.timeline.as_mut(), spans) {
                    tl.extend(sp);
                }
                self.record_routing(session, li, moe, &c.routings, &mut c.guesses);
            }
        }
        for (t, guess) in after_attention.into_iter().enumerate() {
            let r = t * d..(t + 1) * d;
            for ((hv, pv), fv) in c.h[r.clone()].iter_mut().zip(&c.p[r.clone()]).zip(&c.out[r.clone()]) {
                *hv = pv + fv;
            }
            let after_moe = if self.opts.lookahead_stats { self.predict_next(li, &c.blocks[t], &c.h[r]) } else { None };
            c.guesses[t] = [guess, after_moe];
        }
        Ok(())
    }

    /// The final norm (K3: after the output AttnRes mix) and the logits of positions `from..n`,
    /// `[n - from, vocab]`.
    fn logits(&self, c: &Chunk, from: usize) -> Vec<f32> {
        let d = self.hidden;
        let m = c.n - from;
        let mut normed = vec![0f32; m * d];
        for (i, o) in normed.chunks_exact_mut(d).enumerate() {
            let t = from + i;
            let ht = &c.h[t * d..(t + 1) * d];
            let fin = match &self.out_res {
                Some(w) => mix(&c.blocks[t], ht, w, self.eps()),
                None => ht.to_vec(),
            };
            rms_norm(&fin, &self.norm, self.eps(), o);
        }
        let mut logits = vec![0f32; m * self.vocab];
        self.compute.matmul(&self.lm_head, &normed, &mut logits);
        logits
    }
}
