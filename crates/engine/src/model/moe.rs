//! The streaming MoE step over a chunk of tokens:
//! 1. route every token; the chunk's unique experts are requested at once (demand), each read once;
//! 2. while reads are in flight, the latent projections and the shared expert are computed;
//! 3. each expert, as its record lands, is computed on a free compute worker (a lease keeps its
//!    cache slot untouched meanwhile) for every token that chose it, as one batched product; the
//!    calling thread meanwhile keeps reads flowing (with `overlap` off: each wave is read, then
//!    computed);
//! 4. once the layer's own reads have landed, the next layer's predicted experts are prefetched
//!    into free slots (`lookahead`);
//! 5. each token's expert outputs are summed in routing order, so the result never depends on
//!    which read, or which worker, finished first.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::Instant;

use k3_format::Model;
use k3_io::{Key, Lease, Priority, Status};
use k3_quant::Matrix;
use k3_quant::vecops::rms_norm;
use k3_router::{Routing, prefer_cached, route, select};

use super::approx;
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
        self.push(kind, since, end);
    }

    pub fn push(&mut self, kind: SpanKind, start: f64, end: f64) {
        if let Some(v) = self.spans.as_mut() {
            v.push(Span { layer: self.layer, kind, start, end });
        }
    }
}

/// The reads of one layer's experts: waiting to be requested, in flight, landed.
#[derive(Default)]
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

    /// Blocks until at least one more of this layer's records lands (with `overlap` off, until
    /// the whole wave has).
    fn wait(&mut self, io: &mut ExpertIo, overlap: bool) -> Result<(), EngineError> {
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

/// What a worker sends back for one expert: its outputs per (token, routing rank) slot, and when
/// it ran (seconds from the step's start).
struct ExpertDone {
    key: Key,
    outputs: Result<Vec<(usize, Vec<f32>)>, EngineError>,
    span: (f64, f64),
}

/// Applies a finished expert's outputs (`zd` wide, per (token, rank) slot) and frees its slot.
fn land(
    d: ExpertDone,
    zd: usize,
    io: &mut ExpertIo,
    ys: &mut [f32],
    stats: &mut RunStats,
    clock: &mut Clock<'_>,
) -> Result<(), EngineError> {
    io.cache.release(d.key);
    stats.expert_compute_seconds += d.span.1 - d.span.0;
    clock.push(SpanKind::Expert(d.key.1 & !approx::LOW_BIT), d.span.0, d.span.1);
    for (slot, v) in d.outputs? {
        ys[slot * zd..(slot + 1) * zd].copy_from_slice(&v);
    }
    Ok(())
}

/// A chunk's rows as a MoE layer sees them: normed inputs `[n, d]`, and for a model routed by a
/// synthetic process, each row's tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub xs: &'a [f32],
    pub contexts: &'a [k3_router::synthetic::RowContext],
}

impl<'m> Engine<'m> {
    /// Whether the model's MoE layers are routed by a synthetic process.
    pub(crate) fn synthetic_routing(&self) -> bool {
        self.layers.iter().any(|l| matches!(&l.ffn, super::layers::Ffn::Moe(m) if m.synthetic.is_some()))
    }

    /// A MoE layer over a chunk of tokens (`rows`' normed inputs `[n, d]`, `outs` `[n, d]`).
    /// With `later` (Expert Deferral), `outs` leaves out each token's deferred experts and
    /// `later` receives their share `[n, d]`, for the caller to add a layer late.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_chunk(
        &self,
        layer: &Layer<'m>,
        moe: &Moe<'m>,
        rows: Rows<'_>,
        outs: &mut [f32],
        routings: &mut [Routing],
        predicted: &[Vec<u32>],
        stats: &mut RunStats,
        clock: &mut Clock<'_>,
        later: Option<&mut Vec<f32>>,
    ) -> Result<(), EngineError> {
        let t_moe = clock.now();
        let xs = rows.xs;
        let io = self.io.as_ref().ok_or_else(|| EngineError::Input("the model has no expert shards".into()))?;
        let mut io = io.lock().map_err(|_| EngineError::Input("a previous expert read panicked".into()))?;
        let io = &mut *io;
        let keys = self.route_chunk(moe, rows, routings, layer.index, io, stats);
        stats.experts_computed += keys.len() as u64;
        let keys = self.low_bit_keys(keys, routings, io, stats);
        io.cache.set_layer(layer.index);
        io.cache.protect(&keys);
        let mut reads = Reads { queue: keys.iter().copied().collect(), ..Reads::default() };
        let t_io = Instant::now();
        if let Err(e) = reads.fill(io, self.model) {
            abandon(io, &keys);
            return Err(e);
        }
        let prep = self.prepare(moe, xs);
        clock.span(SpanKind::MoeOther, t_moe);
        // Expert outputs per (token, routing rank), summed in rank order at the end.
        let k = moe.router.top_k;
        let mut ys = vec![0f32; routings.len() * k * prep.zd];
        let routings: &[Routing] = routings;
        let (tx, rx) = mpsc::channel::<ExpertDone>();
        let prep_ref = &prep;
        let result = self.compute.pool().in_place_scope(|scope| -> Result<(), EngineError> {
            let mut prefetched = !self.opts.lookahead;
            let (mut done, mut working) = (0usize, 0usize);
            loop {
                if !prefetched && reads.queue.is_empty() && reads.inflight.is_empty() {
                    lookahead::prefetch(self, io, moe, layer.index + 1, predicted)?;
                    prefetched = true;
                }
                for key in std::mem::take(&mut reads.ready) {
                    let lease = io.cache.lease(key).ok_or(k3_io::IoError::Closed)?;
                    let tx = tx.clone();
                    let start = clock.start;
                    working += 1;
                    scope.spawn(move |_| {
                        let t0 = start.elapsed().as_secs_f64();
                        let outputs = self.run_expert(key, &lease, routings, prep_ref, k);
                        drop(lease);
                        let span = (t0, start.elapsed().as_secs_f64());
                        // The coordinator outlives every worker of the scope.
                        let _ = tx.send(ExpertDone { key, outputs, span });
                    });
                }
                while let Ok(d) = rx.try_recv() {
                    (working, done) = (working - 1, done + 1);
                    land(d, prep_ref.zd, io, &mut ys, stats, clock)?;
                }
                if done == keys.len() {
                    return Ok(());
                }
                reads.fill(io, self.model)?;
                if !reads.ready.is_empty() {
                    continue;
                }
                let (t_wait, t_w) = (Instant::now(), clock.now());
                if !reads.inflight.is_empty() {
                    reads.wait(io, self.opts.overlap)?;
                } else if working > 0 {
                    // Every demand read has landed (or waits for a slot a worker still uses).
                    let d = next_done(&rx)?;
                    (working, done) = (working - 1, done + 1);
                    land(d, prep_ref.zd, io, &mut ys, stats, clock)?;
                    continue;
                } else {
                    // Every slot holds an in-flight prefetch: let one land, then ask again. A
                    // failed prefetch only costs its slot; the demand read that needs it reports.
                    let _ = io.cache.wait_next().ok_or(k3_io::IoError::Closed)?;
                }
                // Waiting counts only while no worker had an expert to compute.
                if working == 0 {
                    stats.io_wait_seconds += t_wait.elapsed().as_secs_f64();
                    clock.span(SpanKind::Wait, t_w);
                }
            }
        });
        stats.io_span_seconds += t_io.elapsed().as_secs_f64();
        if let Err(e) = result {
            abandon(io, &keys);
            return Err(e);
        }
        let t_sum = clock.now();
        self.combine_or_defer(moe, routings, &prep, &ys, outs, later);
        clock.span(SpanKind::MoeOther, t_sum);
        Ok(())
    }

    /// [`combine`](Self::combine) into `outs`; under Expert Deferral (`later`), `outs` without
    /// each token's deferred experts and `later` their share: what the whole sum adds to the sum
    /// without them (through LatentMoE's norm and up-projection, no simple sum).
    fn combine_or_defer(
        &self,
        moe: &Moe<'m>,
        routings: &[Routing],
        prep: &Prepared,
        ys: &[f32],
        outs: &mut [f32],
        later: Option<&mut Vec<f32>>,
    ) {
        let Some(later) = later else {
            return self.combine(moe, routings, prep, ys, outs, 0);
        };
        let mut whole = vec![0f32; outs.len()];
        self.combine(moe, routings, prep, ys, &mut whole, 0);
        self.combine(moe, routings, prep, ys, outs, self.opts.approx.defer);
        *later = whole.iter().zip(outs.iter()).map(|(a, b)| a - b).collect();
    }

    /// HOBBIT: each of `keys` that is among the lightest experts of every token that chose it,
    /// and is neither cached nor on its way, becomes its low-bit copy's key (counted in `stats`).
    fn low_bit_keys(&self, keys: Vec<Key>, routings: &[Routing], io: &ExpertIo, stats: &mut RunStats) -> Vec<Key> {
        let Some(c) = &self.opts.low_bit_copies else {
            return keys;
        };
        // The experts some token of the step holds among its heavy ones: read whole.
        let mut heavy = std::collections::HashSet::new();
        for r in routings {
            let light = approx::lightest(r, c.experts);
            heavy.extend(r.experts.iter().zip(light).filter(|(_, l)| !l).map(|(e, _)| *e));
        }
        let keys: Vec<Key> = keys
            .into_iter()
            .map(|k| if io.cache.contains(k) || heavy.contains(&k.1) { k } else { (k.0, k.1 | approx::LOW_BIT) })
            .collect();
        stats.experts_low_bit += keys.iter().filter(|k| k.1 & approx::LOW_BIT != 0).count() as u64;
        keys
    }

    /// Routes every token of the chunk (the gate as one product over the chunk); returns the
    /// chunk's distinct experts as cache keys, in order of first use.
    fn route_chunk(
        &self,
        moe: &Moe<'_>,
        rows: Rows<'_>,
        routings: &mut [Routing],
        layer: u32,
        io: &ExpertIo,
        stats: &mut RunStats,
    ) -> Vec<Key> {
        match &moe.synthetic {
            // A synthetic model: the process routes, from the rows' tokens; no gate product.
            Some(p) => {
                for (ctx, r) in rows.contexts.iter().zip(routings.iter_mut()) {
                    p.route(&moe.router, layer, ctx, r);
                }
            }
            None => {
                let e = moe.router.experts;
                let mut logits = vec![0f32; routings.len() * e];
                self.compute.matmul(&moe.gate, rows.xs, &mut logits);
                for (l, r) in logits.chunks_exact(e).zip(routings.iter_mut()) {
                    route(&moe.router, l, &moe.bias, r);
                    if let Some(n) = self.opts.cache_aware {
                        // The runners-up: the next experts by the gate's selection score.
                        let runners = select(&moe.router, l, &moe.bias, 2 * moe.router.top_k);
                        let swapped = prefer_cached(r, &runners, n, |x| io.cache.contains((layer, x)));
                        stats.experts_rerouted += swapped as u64;
                    }
                }
            }
        }
        let mut keys: Vec<Key> = Vec::new();
        for r in routings.iter() {
            for &x in &r.experts {
                if !keys.contains(&(layer, x)) {
                    keys.push((layer, x));
                }
            }
        }
        keys
    }

    /// The latent projections and the shared expert: work that needs no routed expert.
    fn prepare(&self, moe: &Moe<'m>, xs: &[f32]) -> Prepared {
        let d = self.hidden;
        let n = xs.len() / d;
        let zs: Vec<f32> = match &moe.latent {
            Some((down, _, _)) => {
                let mut z = vec![0f32; n * down.rows()];
                self.compute.matmul(down, xs, &mut z);
                z
            }
            None => xs.to_vec(),
        };
        let zd = zs.len() / n;
        let mut shared = vec![0f32; n * d];
        if let Some(sh) = &moe.shared {
            let act = self.cfg.activation;
            self.compute.run(|| sh.forward_batch(act, xs, &mut shared));
        }
        Prepared { zs, zd, shared }
    }

    /// One landed expert applied to every token of the chunk that chose it, as one batched
    /// product: its outputs per (token, routing rank) slot. Under a low-bit approximation the
    /// tokens for which it is among the lightest get its rounded copy's outputs instead.
    fn run_expert(
        &self,
        key: Key,
        lease: &Lease,
        routings: &[Routing],
        prep: &Prepared,
        k: usize,
    ) -> Result<Vec<(usize, Vec<f32>)>, EngineError> {
        let (key, copy) = ((key.0, key.1 & !approx::LOW_BIT), key.1 & approx::LOW_BIT != 0);
        let model = match &self.opts.low_bit_copies {
            Some(c) if copy => &*c.model,
            _ => self.model,
        };
        let rec = model.expert(key.0, key.1)?.parse(lease.bytes(), false)?;
        let r = &self.rotations;
        let raw = |name: &str| expert_matrix(name, rec.matrix(name)?, r);
        let act = self.opts.activations;
        let mlp = Mlp {
            gate: act.for_experts(raw("w1")?),
            up: act.for_experts(raw("w3")?),
            down: act.for_experts(raw("w2")?),
        };
        let zd = prep.zd;
        let slots: Vec<(usize, usize)> = routings
            .iter()
            .enumerate()
            .filter_map(|(t, rt)| rt.experts.iter().position(|&e| e == key.1).map(|rank| (t, t * k + rank)))
            .collect();
        if let Some(c) = &self.opts.calibrate {
            let xs = gather(&slots, prep);
            let gates: Vec<f32> = slots.iter().map(|&(t, slot)| routings[t].weights[slot - t * k]).collect();
            c.record(key, &xs, &gates, zd);
        }
        let Some(lb) = self.opts.approx.low_bit_copies else {
            return Ok(self.expert_outputs(&mlp, &slots, prep));
        };
        let (low, exact): (Vec<_>, Vec<_>) =
            slots.into_iter().partition(|&(t, slot)| approx::lightest(&routings[t], lb.experts)[slot - t * k]);
        let mut out = self.expert_outputs(&mlp, &exact, prep);
        if !low.is_empty() {
            let copy = |m: Matrix<'_>| (approx::low_bit_copy(&m, lb.bits), m.rows(), m.cols());
            let [g, u, d] = [copy(raw("w1")?), copy(raw("w3")?), copy(raw("w2")?)];
            let low_mlp = Mlp { gate: dense(&g)?, up: dense(&u)?, down: dense(&d)? };
            out.extend(self.expert_outputs(&low_mlp, &low, prep));
        }
        Ok(out)
    }

    /// `mlp` applied to the tokens of `slots` (token, output slot), as one batched product.
    fn expert_outputs(&self, mlp: &Mlp<'_>, slots: &[(usize, usize)], prep: &Prepared) -> Vec<(usize, Vec<f32>)> {
        let zd = prep.zd;
        let xs = gather(slots, prep);
        let mut ys = vec![0f32; slots.len() * zd];
        match slots.len() {
            0 => {}
            1 => mlp.forward(self.cfg.activation, &xs, &mut ys),
            _ => mlp.forward_batch(self.cfg.activation, &xs, &mut ys),
        }
        slots.iter().zip(ys.chunks_exact(zd)).map(|((_, slot), y)| (*slot, y.to_vec())).collect()
    }

    /// Each token's expert outputs weighted and summed in routing order, projected back up
    /// (LatentMoE, one product over the chunk), plus the shared expert; each token's `leave_out`
    /// lightest experts left out.
    fn combine(
        &self,
        moe: &Moe<'m>,
        routings: &[Routing],
        prep: &Prepared,
        ys: &[f32],
        outs: &mut [f32],
        leave_out: usize,
    ) {
        let (zd, k) = (prep.zd, moe.router.top_k);
        let n = routings.len();
        let mut us = vec![0f32; n * zd];
        for ((t, r), u) in routings.iter().enumerate().zip(us.chunks_exact_mut(zd)) {
            // Only Expert Deferral leaves any out: the decode path sorts nothing.
            let out = if leave_out == 0 { Vec::new() } else { approx::lightest(r, leave_out) };
            for (rank, w) in r.weights.iter().enumerate().filter(|(rank, _)| !out.get(*rank).copied().unwrap_or(false))
            {
                u.iter_mut().zip(&ys[(t * k + rank) * zd..(t * k + rank + 1) * zd]).for_each(|(a, b)| *a += w * b);
            }
        }
        match &moe.latent {
            Some((_, norm, up)) => {
                let mut normed = vec![0f32; n * zd];
                for (u, o) in us.chunks_exact(zd).zip(normed.chunks_exact_mut(zd)) {
                    rms_norm(u, norm, self.eps(), o);
                }
                self.compute.matmul(up, &normed, outs);
            }
            None => outs.copy_from_slice(&us),
        }
        outs.iter_mut().zip(&prep.shared).for_each(|(a, b)| *a += b);
    }
}

/// The experts' inputs of `slots`' tokens, one after another.
/// The next expert a worker finished. A coordinator that is itself a compute worker (a resident
/// model's step) computes queued experts while it waits: blocked, it could hold the very job it
/// waits for (with one thread, forever).
fn next_done(rx: &mpsc::Receiver<ExpertDone>) -> Result<ExpertDone, EngineError> {
    if rayon::current_thread_index().is_none() {
        return rx.recv().map_err(|_| k3_io::IoError::Closed.into());
    }
    loop {
        match rx.try_recv() {
            Ok(d) => return Ok(d),
            Err(mpsc::TryRecvError::Disconnected) => return Err(k3_io::IoError::Closed.into()),
            Err(mpsc::TryRecvError::Empty) => {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::yield_now();
                }
            }
        }
    }
}

fn gather(slots: &[(usize, usize)], prep: &Prepared) -> Vec<f32> {
    let zd = prep.zd;
    slots.iter().flat_map(|(t, _)| prep.zs[t * zd..(t + 1) * zd].iter().copied()).collect()
}

/// A low-bit copy `(values, rows, cols)` as a matrix.
fn dense((w, rows, cols): &(Vec<f32>, usize, usize)) -> Result<Matrix<'_>, EngineError> {
    Matrix::f32(w, *rows, *cols).map_err(|e| EngineError::Shape(e.to_string()))
}

/// A failed step's records let go: none stays protected, and no read of the step stays in flight,
/// or its failure would be delivered to the next step that asks for the record (a stale error
/// outliving the fault, e.g. a shard since restored): each record is read afresh next time.
fn abandon(io: &mut ExpertIo, keys: &[Key]) {
    for k in keys {
        io.cache.release(*k);
    }
    io.cache.drain();
}
