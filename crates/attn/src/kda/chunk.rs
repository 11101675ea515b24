//! A chunk of tokens through a KDA layer, for one sequence or several at once: the projections
//! of every row as matrix products (each weight read once for the whole batch), then each
//! (sequence, head)'s state pass on its own (in the layer's [`KdaForm`](super::KdaForm)), then
//! the output projection of every row. A *tentative* sequence (speculative drafts being
//! verified) leaves its state as it was and records, per position, what [`Kda::commit`] needs to
//! advance the state later by as many positions as were accepted.

use k3_quant::Matrix;
use rayon::prelude::*;

use super::recurrence::{from_heads, to_heads};
use super::{Kda, KdaState, OutputGate};
use crate::ops::{rms_norm, sigmoid};

/// How a sequence's rows treat its state.
#[derive(Debug)]
pub enum KdaRun<'s> {
    /// Advance the state over the rows.
    Advance(&'s mut KdaState),
    /// Leave the state as it is; record the rows in the tape for [`Kda::commit`].
    Tentative(&'s KdaState, &'s mut KdaTape),
}

/// One sequence's consecutive rows of a batched chunk.
#[derive(Debug)]
pub struct KdaSeq<'s> {
    pub rows: usize,
    pub run: KdaRun<'s>,
}

/// What advancing a state needs of each position of a tentative chunk: the pre-convolution
/// q, k, v projections, the gate's `z` and beta's logit (token-major). For K3 (96 heads x 128)
/// that is 49,248 floats, 197 KB per position per KDA layer, against 6.3 MB for a copy of the
/// layer's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KdaTape {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    n: usize,
}

impl KdaTape {
    /// Positions recorded.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        4 * (self.q.len() + self.k.len() + self.v.len() + self.z.len() + self.b.len())
    }
}

/// Projections of a chunk of `n` tokens, token-major.
#[derive(Default)]
struct Proj {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    fa: Vec<f32>,
    z: Vec<f32>,
    b: Vec<f32>,
    ga: Vec<f32>,
    gate: Vec<f32>,
}

/// `out = m xs` for `n` vectors, rows split over the current rayon pool (same bits on any).
fn matmul_into(m: &Matrix<'_>, xs: &[f32], n: usize, out: &mut Vec<f32>) {
    out.resize(n * m.rows(), 0.0);
    k3_quant::par::matmul(m, xs, out);
}

/// One head's share of one sequence's rows: its projections and outputs (head-major `[n, hd]`),
/// its state and its convolution windows.
struct HeadTask<'x> {
    h: usize,
    /// The sequence's first row in the chunk.
    row0: usize,
    qkv: [&'x mut [f32]; 3],
    y: &'x mut [f32],
    s: &'x mut [f32],
    win: [&'x mut [f32]; 3],
}

impl KdaState {
    /// This state's per-head pieces: `(S, [q, k, v] windows)` for each head.
    fn heads(&mut self, hd: usize, kern: usize) -> Vec<(&mut [f32], [&mut [f32]; 3])> {
        let win = hd * (kern - 1);
        let [wq, wk, wv] = &mut self.conv;
        self.s
            .chunks_mut(hd * hd)
            .zip(wq.chunks_mut(win).zip(wk.chunks_mut(win)).zip(wv.chunks_mut(win)))
            .map(|(s, ((a, b), c))| (s, [a, b, c]))
            .collect()
    }
}

/// Runs `tasks` on the current pool when there is enough work, else on this thread.
fn run_tasks<T: Send>(tasks: Vec<T>, work: usize, f: impl Fn(T) + Sync + Send) {
    if work >= k3_quant::par::MIN_PARALLEL_WEIGHTS && rayon::current_num_threads() > 1 {
        tasks.into_par_iter().for_each(f);
    } else {
        tasks.into_iter().for_each(f);
    }
}

impl Kda<'_> {
    /// One token: `out = KDA(x)`, advancing `state`.
    pub fn step(&self, state: &mut KdaState, x: &[f32], out: &mut [f32]) {
        self.prefill(state, x, out)
    }

    /// A chunk of one sequence's tokens (`xs` `[n, D]`, `outs` `[n, D]`), bit-identical to
    /// stepping them one by one in the recurrent form (the default).
    pub fn prefill(&self, state: &mut KdaState, xs: &[f32], outs: &mut [f32]) {
        let rows = xs.len() / self.cfg.hidden.max(1);
        self.forward(&mut [KdaSeq { rows, run: KdaRun::Advance(state) }], xs, outs)
    }

    /// Several sequences' chunks as one (`xs` `[n, D]`: each sequence's rows in turn, as many as
    /// its `rows`): every row gives the same bits as that sequence's chunk alone would.
    pub fn forward(&self, seqs: &mut [KdaSeq<'_>], xs: &[f32], outs: &mut [f32]) {
        let d = self.cfg.hidden;
        let n = xs.len() / d;
        assert!(
            xs.len().is_multiple_of(d) && outs.len() == xs.len() && seqs.iter().map(|s| s.rows).sum::<usize>() == n,
            "{}: inputs and outputs must be [n, {d}], n the sequences' rows",
            self.name
        );
        let p = self.project(xs, n);
        let (c, hd, kern) = (self.cfg.channels(), self.cfg.head_dim, self.cfg.conv_kernel);
        // A tentative sequence runs on a copy of its state and keeps its rows' projections.
        let mut scratch: Vec<Option<KdaState>> = Vec::with_capacity(seqs.len());
        let mut row0 = 0;
        for seq in seqs.iter_mut() {
            scratch.push(match &mut seq.run {
                KdaRun::Advance(_) => None,
                KdaRun::Tentative(state, tape) => {
                    p.record(tape, row0, seq.rows, c, self.cfg.heads);
                    Some((*state).clone())
                }
            });
            row0 += seq.rows;
        }
        // Head-major copies per sequence: every (sequence, head) recurrence runs whole on one
        // thread, so the result is the same bits on any number of threads.
        let (mut q, mut k, mut v, mut y) = (Vec::new(), Vec::new(), Vec::new(), vec![0f32; n * c]);
        let mut row0 = 0;
        for seq in seqs.iter() {
            let r = row0 * c..(row0 + seq.rows) * c;
            q.extend(to_heads(&p.q[r.clone()], seq.rows, hd));
            k.extend(to_heads(&p.k[r.clone()], seq.rows, hd));
            v.extend(to_heads(&p.v[r], seq.rows, hd));
            row0 += seq.rows;
        }
        let mut tasks = Vec::with_capacity(seqs.len() * self.cfg.heads);
        let (mut qr, mut kr, mut vr, mut yr) = (&mut q[..], &mut k[..], &mut v[..], &mut y[..]);
        let mut row0 = 0;
        for (seq, scr) in seqs.iter_mut().zip(scratch.iter_mut()) {
            let ni = seq.rows;
            let (qs, kv, vv, ys);
            (qs, qr) = std::mem::take(&mut qr).split_at_mut(ni * c);
            (kv, kr) = std::mem::take(&mut kr).split_at_mut(ni * c);
            (vv, vr) = std::mem::take(&mut vr).split_at_mut(ni * c);
            (ys, yr) = std::mem::take(&mut yr).split_at_mut(ni * c);
            if ni == 0 {
                continue;
            }
            let state: &mut KdaState = match (&mut seq.run, scr) {
                (KdaRun::Advance(s), _) => s,
                (KdaRun::Tentative(..), Some(s)) => s,
                (KdaRun::Tentative(..), None) => unreachable!("a tentative sequence has a scratch state"),
            };
            let parts = qs.chunks_mut(ni * hd).zip(kv.chunks_mut(ni * hd)).zip(vv.chunks_mut(ni * hd));
            for (h, ((((q, k), v), y), (s, win))) in
                parts.zip(ys.chunks_mut(ni * hd)).zip(state.heads(hd, kern)).enumerate()
            {
                tasks.push(HeadTask { h, row0, qkv: [q, k, v], y, s, win });
            }
            row0 += ni;
        }
        run_tasks(tasks, n * c * hd, |t| self.head(t, &p));
        let mut yt = vec![0f32; n * c];
        let mut row0 = 0;
        for seq in seqs.iter() {
            let r = row0 * c..(row0 + seq.rows) * c;
            from_heads(&y[r.clone()], seq.rows, hd, &mut yt[r]);
            row0 += seq.rows;
        }
        k3_quant::par::matmul(&self.w.o_proj, &yt, outs);
    }

    /// Advances `state` by the first `upto` positions of `tape` (recorded by a tentative
    /// [`forward`](Self::forward) from this same state): the same bits as advancing it over
    /// those tokens directly.
    pub fn commit(&self, state: &mut KdaState, tape: &KdaTape, upto: usize) {
        let upto = upto.min(tape.n);
        if upto == 0 {
            return;
        }
        let (c, hd, kern, heads) = (self.cfg.channels(), self.cfg.head_dim, self.cfg.conv_kernel, self.cfg.heads);
        let (mut q, mut k, mut v) = (
            to_heads(&tape.q[..upto * c], upto, hd),
            to_heads(&tape.k[..upto * c], upto, hd),
            to_heads(&tape.v[..upto * c], upto, hd),
        );
        let tasks: Vec<_> = q
            .chunks_mut(upto * hd)
            .zip(k.chunks_mut(upto * hd))
            .zip(v.chunks_mut(upto * hd))
            .zip(state.heads(hd, kern))
            .enumerate()
            .collect();
        run_tasks(tasks, upto * c * hd, |(h, (((q, k), v), (s, win)))| {
            let z = |t: usize| &tape.z[t * c + h * hd..t * c + (h + 1) * hd];
            self.run_head(h, [q, k, v], z, |t| tape.b[t * heads + h], s, win, |_, _| {});
        });
    }

    /// Every row's projections (batched over the rows).
    fn project(&self, xs: &[f32], n: usize) -> Proj {
        let w = &self.w;
        let mut p = Proj::default();
        matmul_into(&w.q_proj, xs, n, &mut p.q);
        matmul_into(&w.k_proj, xs, n, &mut p.k);
        matmul_into(&w.v_proj, xs, n, &mut p.v);
        matmul_into(&w.f_a, xs, n, &mut p.fa);
        matmul_into(&w.f_b, &p.fa, n, &mut p.z);
        matmul_into(&w.b_proj, xs, n, &mut p.b);
        match &w.gate {
            OutputGate::FullRank(g) => matmul_into(g, xs, n, &mut p.gate),
            OutputGate::LowRank { a, b } => {
                matmul_into(a, xs, n, &mut p.ga);
                matmul_into(b, &p.ga, n, &mut p.gate);
            }
        }
        p
    }

    /// The recurrence of one head over one sequence's rows, from its projections (head-major
    /// `[n, hd]`); writes the head's gated outputs.
    fn head(&self, task: HeadTask<'_>, p: &Proj) {
        let HeadTask { h, row0, qkv, y, s, win } = task;
        let (hd, c, heads) = (self.cfg.head_dim, self.cfg.channels(), self.cfg.heads);
        let head = |row: usize| row * c + h * hd..row * c + (h + 1) * hd;
        let emit = |t: usize, a: &[f32]| {
            let yh = &mut y[t * hd..(t + 1) * hd];
            rms_norm(a, &self.w.o_norm, self.cfg.norm_eps, yh);
            for (yv, gv) in yh.iter_mut().zip(&p.gate[head(row0 + t)]) {
                *yv *= sigmoid(*gv);
            }
        };
        self.run_head(h, qkv, |t| &p.z[head(row0 + t)], |t| p.b[(row0 + t) * heads + h], s, win, emit);
    }
}

impl Proj {
    /// Copies rows `row0..row0 + n` of what a commit needs into `tape`.
    fn record(&self, tape: &mut KdaTape, row0: usize, n: usize, c: usize, heads: usize) {
        let r = row0 * c..(row0 + n) * c;
        tape.q = self.q[r.clone()].to_vec();
        tape.k = self.k[r.clone()].to_vec();
        tape.v = self.v[r.clone()].to_vec();
        tape.z = self.z[r].to_vec();
        tape.b = self.b[row0 * heads..(row0 + n) * heads].to_vec();
        tape.n = n;
    }
}
