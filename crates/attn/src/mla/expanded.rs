//! MLA attention in the expanded form ([`MlaForm::Expanded`](super::MlaForm)): per head, the
//! cached latents are decompressed a span at a time into keys `[W_uk c_t | k_ext_t]` and values
//! `W_uv c_t`, and the chunk's queries attend over them flash-style: blocks of queries against
//! blocks of [`BLOCK`] keys, an online softmax per query.
//!
//! A row's bits never depend on the other rows: every row runs over the same key blocks (fixed
//! at multiples of [`BLOCK`] from position 0, a partly future block masked to exact zeros), each
//! decompressed value is its own dot product (`gemm::abt`), each score its own chain of
//! multiply-adds over the query's dims (`gemm::pb_acc` against the block's transposed keys), and
//! each row's weighted sum adds its blocks in order. So a chunk gives the bits of stepping its
//! tokens one by one in this form, on any number of threads.

use k3_quant::{Dense, expf, gemm};
use rayon::prelude::*;

use super::softmax::Keys;
use super::{Mla, MlaCache, MlaConfig};

/// Keys per block of the online softmax.
const BLOCK: usize = 32;
/// Queries per block: their scores against a key block in one product.
const QUERIES: usize = 32;
/// Positions decompressed at a time (a multiple of `BLOCK`): bounds a head's scratch memory.
const SPAN: usize = 1024;

impl Mla<'_> {
    /// The `n` rows of one sequence's chunk (`q` `[n, H, nope + rope]`, rotated), the last `n`
    /// positions of `cache`, attend over it: `ctx` `[n, H, v]`. Heads split over the pool when
    /// `parallel`, which changes no bit.
    pub(super) fn attend_expanded(&self, cache: &MlaCache, q: &[f32], parallel: bool, ctx: &mut [f32]) {
        let scale = self.softmax_scale();
        Chunk { cfg: &self.cfg, kv_b: &self.kv_b_rows, scale, keys: cache.keys(), len: cache.len(), q }
            .attend(parallel, ctx)
    }
}

/// The expanded form over cached rows given as f32 slices (`c` `[len, L]`, `kext` `[len, R]`),
/// `kv_b` `[H (nope + v), L]`: what [`Mla`] runs for a long chunk, for benchmarks at a model's
/// dimensions without its projections. `q` `[n, H, nope + rope]` are the last `n` positions';
/// `ctx` `[n, H, v]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_expanded(
    cfg: &MlaConfig,
    kv_b: &Dense<'_>,
    scale: f32,
    c: &[f32],
    kext: &[f32],
    len: usize,
    q: &[f32],
    parallel: bool,
    ctx: &mut [f32],
) {
    Chunk { cfg, kv_b, scale, keys: Keys::F32 { c, kext }, len, q }.attend(parallel, ctx)
}

/// One sequence's chunk in the expanded form: its queries `q` `[n, H, nope + rope]` (the last
/// `n` of `len` cached positions), the cache's rows and the layer's `kv_b_proj`.
#[derive(Clone, Copy)]
struct Chunk<'a> {
    cfg: &'a MlaConfig,
    kv_b: &'a Dense<'a>,
    scale: f32,
    keys: Keys<'a>,
    len: usize,
    q: &'a [f32],
}

impl Chunk<'_> {
    fn attend(self, parallel: bool, ctx: &mut [f32]) {
        let (h, v) = (self.cfg.heads, self.cfg.v_dim);
        // As many heads at a time as threads: their outputs `[n, v]` wait beside `ctx` only that
        // many at once (a whole chunk's worth would double the context's memory).
        let at_once = if parallel { rayon::current_num_threads().max(1) } else { 1 };
        for heads in (0..h).step_by(at_once).map(|s| s..(s + at_once).min(h)) {
            let outs: Vec<Vec<f32>> = if parallel {
                heads.clone().into_par_iter().map(|hd| self.head(hd)).collect()
            } else {
                heads.clone().map(|hd| self.head(hd)).collect()
            };
            for (hd, out) in heads.zip(&outs) {
                for (t, row) in out.chunks_exact(v).enumerate() {
                    ctx[(t * h + hd) * v..(t * h + hd + 1) * v].copy_from_slice(row);
                }
            }
        }
    }

    /// Head `hd`'s context for every row `[n, v]`.
    fn head(&self, hd: usize) -> Vec<f32> {
        let cfg = self.cfg;
        let (h, l, r, nope, v) = (cfg.heads, cfg.kv_lora, cfg.rope, cfg.nope, cfg.v_dim);
        let (qh, kw, len) = (nope + r, nope + v, self.len);
        let n = self.q.len() / (h * qh);
        let first = len - n;
        let qs: Vec<f32> = self.q.chunks_exact(qh).skip(hd).step_by(h).flatten().copied().collect();
        // The head's key rows then value rows of `kv_b_proj`, widened: `[nope + v, L]`.
        let mut w = vec![0f32; kw * l];
        for (j, row) in w.chunks_exact_mut(l).enumerate() {
            self.kv_b.row_values(hd * kw + j, row);
        }
        let mut rows = Rows::new(n, v, first, self.scale);
        let (mut wide, mut kv) = ((Vec::new(), Vec::new()), Vec::new());
        let (mut kb, mut vb) = (Vec::new(), Vec::new());
        for span in (0..len).step_by(SPAN) {
            let sn = SPAN.min(len - span);
            let (cb, eb) = self.keys.block(span, sn, l, r, &mut wide);
            kv.resize(sn * kw, 0.0);
            gemm::abt(cb, &w, l, &mut kv, false);
            // Keys `[W_uk c | k_ext]`, each block's transposed (`[nope + rope, BLOCK]`: a query's
            // scores against the block are one row of a product without horizontal sums), and
            // values; zero past the cache to whole blocks.
            let padded = sn.next_multiple_of(BLOCK);
            kb.clear();
            kb.resize(padded * qh, 0.0);
            vb.clear();
            vb.resize(padded * v, 0.0);
            for (t, row) in kv.chunks_exact(kw).enumerate() {
                let block = &mut kb[t / BLOCK * qh * BLOCK..][..qh * BLOCK];
                let key = row[..nope].iter().chain(&eb[t * r..(t + 1) * r]);
                for (k, x) in key.enumerate() {
                    block[k * BLOCK + t % BLOCK] = *x;
                }
                vb[t * v..(t + 1) * v].copy_from_slice(&row[nope..]);
            }
            // Query blocks whose rows see some of this span.
            for qb in (span.saturating_sub(first)..n).step_by(QUERIES).map(|i| i..(i + QUERIES).min(n)) {
                rows.attend_span(&qs, qh, &kb, &vb, span, qb);
            }
        }
        rows.finish()
    }
}

/// Every row's online softmax for one head: running maximum, sum of exponentials and weighted
/// sum of values `[n, v]`.
struct Rows {
    m: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
    v: usize,
    /// The position of row 0.
    first: usize,
    scale: f32,
    s: Vec<f32>,
}

impl Rows {
    fn new(n: usize, v: usize, first: usize, scale: f32) -> Rows {
        Rows {
            m: vec![f32::NEG_INFINITY; n],
            sum: vec![0.0; n],
            acc: vec![0.0; n * v],
            v,
            first,
            scale,
            s: vec![0.0; QUERIES * BLOCK],
        }
    }

    /// Rows `qb` against the key blocks of the span starting at `span` (`kb` a block at a time
    /// `[qh, BLOCK]`, `vb` `[.., v]`, whole blocks) up to the one holding the last row's position. A row takes only
    /// the blocks that start at or before its position.
    fn attend_span(&mut self, qs: &[f32], qh: usize, kb: &[f32], vb: &[f32], span: usize, qb: std::ops::Range<usize>) {
        let v = self.v;
        let last = self.first + qb.end - 1;
        let blocks = (kb.len() / qh).min((last + 1 - span).next_multiple_of(BLOCK)) / BLOCK;
        for b in 0..blocks {
            let kpos = span + b * BLOCK;
            // Rows at or past the block's first key (rows run in position order).
            let lo = qb.start.max(kpos.saturating_sub(self.first));
            let s = &mut self.s[..(qb.end - lo) * BLOCK];
            s.fill(0.0);
            gemm::pb_acc(&qs[lo * qh..qb.end * qh], &kb[b * BLOCK * qh..(b + 1) * BLOCK * qh], BLOCK, s);
            for (i, row) in (lo..qb.end).zip(s.chunks_exact_mut(BLOCK)) {
                let seen = (self.first + i + 1 - kpos).min(BLOCK);
                row.iter_mut().for_each(|x| *x *= self.scale);
                let bm = row[..seen].iter().fold(f32::NEG_INFINITY, |a, x| a.max(*x));
                if bm > self.m[i] {
                    let f = (self.m[i] - bm).exp();
                    self.acc[i * v..(i + 1) * v].iter_mut().for_each(|x| *x *= f);
                    self.sum[i] *= f;
                    self.m[i] = bm;
                }
                expf::exp_shifted(row, self.m[i]);
                // Keys after the row's position weigh exactly nothing.
                row[seen..].fill(0.0);
                self.sum[i] += row.iter().sum::<f32>();
            }
            gemm::pb_acc(s, &vb[b * BLOCK * v..(b + 1) * BLOCK * v], v, &mut self.acc[lo * v..qb.end * v]);
        }
    }

    /// The normalized weighted sums `[n, v]`.
    fn finish(mut self) -> Vec<f32> {
        for (a, sum) in self.acc.chunks_exact_mut(self.v).zip(&self.sum) {
            let inv = 1.0 / sum;
            a.iter_mut().for_each(|x| *x *= inv);
        }
        self.acc
    }
}
