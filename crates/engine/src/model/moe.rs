//! The streaming MoE step over a chunk of tokens:
//! 1. route every token; the chunk's unique experts are requested at once (demand), each read once;
//! 2. while reads are in flight, the latent projections and the shared expert are computed;
//! 3. experts are used in arrival order (with `overlap` off: each wave is read, then computed);
//! 4. once the layer's own reads have landed, the next layer's predicted experts are prefetched
//!    into free slots (`lookahead`);
//! 5. each token's expert outputs are summed in routing order, so the result never depends on
//!    which read finished first.

use std::collections::VecDeque;
use std::time::Instant;

use k3_format::Model;
use k3_io::{Key, Priority, Status};
use k3_quant::vecops::rms_norm;
use k3_router::{Routing, route};

use super::expert_io::{ExpertIo, expert_error};
use super::layers::{Layer, Mlp, Moe};
use super::stats::{RunStats, Span, SpanKind};
use super::{Engine, lookahead};
use crate::EngineError;
use crate::weights::expert_matrix;

/// Where a step's time goes (the timeline of `bench decode`), relative to the step's start.
pub(crate) struct Clock<'a> {
    pub start: Instant,
    pub spans: &'a mut Option<Vec<Span>>,
    pub layer: u32,
}

impl Clock<'_> {
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Records `kind` from `since` until now.
    pub fn span(&mut self, kind: SpanKind, since: f64) {
        let end = self.now();
        if let Some(v) = self.spans.as_mut() {
            v.push(Span { layer: self.layer, kind, start: since, end });
        }
    }
}

/// The reads of one layer's experts: waiting to be requested, in flight, landed.
struct Reads {
    queue: VecDeque<Key>,
    inflight: Vec<Key>,
    ready: Vec<Key>,
}

impl Reads {
    /// Requests queued experts while the cache has room; hits are ready at once.
    fn fill(&mut self, io: &mut ExpertIo, model: &Model) -> Result<(), EngineError> {
        while let Some(&k) = self.queue.front() {
            match io.cache.request(k, io.location(model, k)?, Priority::Demand)? {
                Status::Hit => self.ready.push(k),
                Status::Issued | Status::Pending => self.inflight.push(k),
                Status::NoRoom => break,
            }
            self.queue.pop_front();
        }
        Ok(())
    }

    /// Blocks until at least one more record lands (with `overlap` off, until the whole wave has).
    fn wait(&mut self, io: &mut ExpertIo, overlap: bool) -> Result<(), EngineError> {
        if self.inflight.is_empty() {
            // Every slot holds an in-flight prefetch: let one land, then ask again. A failed
            // prefetch only costs its slot; the demand read that needs it reports errors.
            let _ = io.cache.wait_next().ok_or(k3_io::IoError::Closed)?;
            return Ok(());
        }
        loop {
            let (key, res) = io.cache.wait_any(&self.inflight).ok_or(k3_io::IoError::Closed)?;
            res.map_err(|e| expert_error(key, e))?;
            self.inflight.retain(|x| *x != key);
            self.ready.push(key);
            if overlap || self.inflight.is_empty() {
                return Ok(());
            }
        }
    }
}

/// The chunk's inputs to the routed experts and what needs no expert, computed while reads fly.
struct Prepared {
    /// Per token: the experts' input (the latent projection, or the normed hidden state).
    zs: Vec<f32>,
    zd: usize,
    /// Per token: the shared experts' output.
    shared: Vec<f32>,
}

impl<'m> Engine<'m> {
    /// A MoE layer over a chunk of tokens (`xs` normed inputs `[n, d]`, `outs` `[n, d]`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_chunk(
        &self,
        layer: &Layer<'m>,
        moe: &Moe<'m>,
        xs: &[f32],
        outs: &mut [f32],
        routings: &mut [Routing],
        predicted: &[Vec<u32>],
        stats: &mut RunStats,
        clock: &mut Clock<'_>,
    ) -> Result<(), EngineError> {
        let t_moe = clock.now();
        let keys = route_chunk(moe, xs, self.hidden, routings, layer.index);
        let io = self.io.as_ref().ok_or_else(|| EngineError::Input("the model has no expert shards".into()))?;
        let mut io = io.lock().map_err(|_| EngineError::Input("a previous expert read panicked".into()))?;
        let io = &mut *io;
        io.cache.set_layer(layer.index);
        io.cache.protect(&keys);
        let mut reads = Reads { queue: keys.iter().copied().collect(), inflight: Vec::new(), ready: Vec::new() };
        let t_io = Instant::now();
        reads.fill(io, self.model)?;
        let prep = self.prepare(moe, xs);
        clock.span(SpanKind::MoeOther, t_moe);
        // Expert outputs per (token, routing rank), summed in rank order at the end.
        let k = moe.router.top_k;
        let mut ys = vec![0f32; routings.len() * k * prep.zd];
        let mut prefetched = !self.opts.lookahead;
        let mut done = 0usize;
        loop {
            if !prefetched && reads.queue.is_empty() && reads.inflight.is_empty() {
                lookahead::prefetch(self, io, moe, layer.index + 1, predicted)?;
                prefetched = true;
            }
            for key in std::mem::take(&mut reads.ready) {
                let t0 = Instant::now();
                let t_exp = clock.now();
                self.run_expert(io, key, routings, &prep, k, &mut ys)?;
                io.cache.release(key);
                done += 1;
                stats.expert_compute_seconds += t0.elapsed().as_secs_f64();
                clock.span(SpanKind::Expert(key.1), t_exp);
            }
            if done == keys.len() {
                break;
            }
            reads.fill(io, self.model)?;
            if !reads.ready.is_empty() {
                continue;
            }
            let (t_wait, t_w) = (Instant::now(), clock.now());
            reads.wait(io, self.opts.overlap)?;
            stats.io_wait_seconds += t_wait.elapsed().as_secs_f64();
            clock.span(SpanKind::Wait, t_w);
        }
        let t_sum = clock.now();
        stats.io_span_seconds += t_io.elapsed().as_secs_f64();
        self.combine(moe, routings, &prep, &ys, outs);
        clock.span(SpanKind::MoeOther, t_sum);
        Ok(())
    }

    /// The latent projections and the shared expert: work that needs no routed expert.
    fn prepare(&self, moe: &Moe<'m>, xs: &[f32]) -> Prepared {
        let d = self.hidden;
        let n = xs.len() / d;
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
                sh.forward(self.cfg.activation, x, o);
            }
        }
        Prepared { zs, zd, shared }
    }

    /// One landed expert, applied to every token of the chunk that chose it.
    fn run_expert(
        &self,
        io: &ExpertIo,
        key: Key,
        routings: &[Routing],
        prep: &Prepared,
        k: usize,
        ys: &mut [f32],
    ) -> Result<(), EngineError> {
        let bytes = io.cache.get(key).ok_or(k3_io::IoError::Closed)?;
        let rec = self.model.expert(key.0, key.1)?.parse(bytes, false)?;
        let r = &self.rotations;
        let mlp = Mlp {
            gate: expert_matrix("w1", rec.matrix("w1")?, r)?,
            up: expert_matrix("w3", rec.matrix("w3")?, r)?,
            down: expert_matrix("w2", rec.matrix("w2")?, r)?,
        };
        let zd = prep.zd;
        for (t, rt) in routings.iter().enumerate() {
            if let Some(rank) = rt.experts.iter().position(|&e| e == key.1) {
                let slot = (t * k + rank) * zd;
                mlp.forward(self.cfg.activation, &prep.zs[t * zd..(t + 1) * zd], &mut ys[slot..slot + zd]);
            }
        }
        Ok(())
    }

    /// Each token's expert outputs weighted and summed in routing order, projected back up
    /// (LatentMoE), plus the shared expert.
    fn combine(&self, moe: &Moe<'m>, routings: &[Routing], prep: &Prepared, ys: &[f32], outs: &mut [f32]) {
        let (d, zd, k) = (self.hidden, prep.zd, moe.router.top_k);
        for (t, r) in routings.iter().enumerate() {
            let mut u = vec![0f32; zd];
            for (rank, w) in r.weights.iter().enumerate() {
                u.iter_mut().zip(&ys[(t * k + rank) * zd..(t * k + rank + 1) * zd]).for_each(|(a, b)| *a += w * b);
            }
            let out = &mut outs[t * d..(t + 1) * d];
            match &moe.latent {
                Some((_, norm, up)) => {
                    let mut un = vec![0f32; zd];
                    rms_norm(&u, norm, self.eps(), &mut un);
                    up.matvec(&un, out);
                }
                None => out.copy_from_slice(&u),
            }
            out.iter_mut().zip(&prep.shared[t * d..(t + 1) * d]).for_each(|(a, b)| *a += b);
        }
    }
}

/// Routes every token of the chunk; returns the chunk's distinct experts as cache keys, in order
/// of first use.
fn route_chunk(moe: &Moe<'_>, xs: &[f32], d: usize, routings: &mut [Routing], layer: u32) -> Vec<Key> {
    let mut logits = vec![0f32; moe.router.experts];
    let mut keys: Vec<Key> = Vec::new();
    for (x, r) in xs.chunks_exact(d).zip(routings.iter_mut()) {
        moe.gate.matvec(x, &mut logits);
        route(&moe.router, &logits, &moe.bias, r);
        for &e in &r.experts {
            if !keys.contains(&(layer, e)) {
                keys.push((layer, e));
            }
        }
    }
    keys
}
