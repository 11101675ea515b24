//! One head's delta rule over a chunk of positions at once: the WY / UT form of the reference
//! kernels (fla's `naive_chunk_kda`, the Kimi Linear paper's chunkwise algorithm), in which the
//! state is read and updated once a chunk by matrix products instead of once a position.
//!
//! With `G_t` the chunk's cumulative log-decay up to position `t` (per channel), `S0` the state
//! at the chunk's start and rows as positions:
//! - `L[i][j] = beta_i sum_x k_i k_j e^{G_i - G_j}` (j < i), `T = (I + L)^-1`;
//! - `Aqk[i][j] = sum_x q_i k_j e^{G_i - G_j}` (j <= i);
//! - `D = T diag(beta) (V - (K o e^G) S0)`: each position's `delta` of the recurrence;
//! - `O = (Q o e^G) S0 + Aqk D`: each position's `S_t^T q_t`;
//! - `S = diag(e^{G_last}) S0 + (K o e^{G_last - G})^T D`.
//!
//! `G` is summed in f64 and every exponent is a difference of those sums rounded once to f32.
//! `Aqk` and `L` are formed a block row of [`SUB`] positions at a time around the block's first
//! row `r`: `(q_i e^{G_i - r}) . (k_j e^{r - G_j})`, whose factors are at most 1 for earlier
//! blocks and at most `e^MAX_SPAN` inside the block, within `exp_shifted`'s range (it clamps
//! to [-87.3, 88]), and the dot of q and k (unit vectors in the layer) stays far below f32's
//! largest value. An in-block pair is so a product of two rounded exponents, whose error grows
//! with `|G_i - r|` (~5e-6 relative at 80 nats; K3's gate spans at most 75 over a block, and
//! little in practice). A block across which some channel decays by more than `MAX_SPAN` (only
//! an unbounded gate can) gets its own pairs' exponents `G_i - G_j` directly.

use k3_quant::expf::exp_shifted;
use k3_quant::gemm::{abt, pb_acc};

/// Positions a chunk holds (fla allows 32 or 64; 32 measured 1.2x faster here, fewer extra
/// multiply-adds).
pub(super) const CHUNK: usize = 32;
/// Positions of a block row of `Aqk` and `L`.
const SUB: usize = 16;
/// The largest decay across a block (nats, any channel) factored around its first row.
const MAX_SPAN: f64 = 80.0;

/// Reusable buffers of one head's chunks.
#[derive(Default)]
pub(super) struct ChunkWork {
    /// Cumulative log-decay `[c, d]`.
    cum: Vec<f64>,
    /// `[W; Q o e^G]` `[2c, d]` (W = `-T diag(beta) (K o e^G)`).
    wq: Vec<f32>,
    /// `[D; O]` `[2c, d]`.
    d_o: Vec<f32>,
    /// `-beta K o e^G` then `beta V`, `[c, d]` each.
    kb: Vec<f32>,
    vb: Vec<f32>,
    /// `(K o e^{G_last - G})^T` `[d, c]`.
    kl_t: Vec<f32>,
    /// `T` and `Aqk` by block rows: block row `b` is `[rows_b, end_b]`.
    t: Vec<f32>,
    aqk: Vec<f32>,
    /// One block row's factors and products.
    fa: Vec<f32>,
    fb: Vec<f32>,
    prod: Vec<f32>,
    /// Exponents of one row.
    e: Vec<f32>,
}

/// Block rows of a chunk of `c` positions: `(first row, rows, end column, offset)` in the
/// block-row layout of `T` and `Aqk`.
fn block_rows(c: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    (0..c.div_ceil(SUB)).map(move |b| {
        let i0 = b * SUB;
        let end = (i0 + SUB).min(c);
        // Earlier block rows hold SUB rows each, of ends SUB, 2 SUB, ...
        let offset = SUB * SUB * b * (b + 1) / 2;
        (i0, end - i0, end, offset)
    })
}

/// Advances the head's state `s` (`[d][d]`, `S[k][v]`) over `c` positions (`q, k, v, g`
/// `[c, d]`, `g` the log-decay, `beta` `[c]`, `c <= CHUNK`) and hands each position's
/// `S_t^T q_t` to `emit`.
pub(super) fn advance(
    s: &mut [f32],
    [q, k, v, g]: [&[f32]; 4],
    beta: &[f32],
    w: &mut ChunkWork,
    mut emit: impl FnMut(usize, &[f32]),
) {
    let c = beta.len();
    debug_assert!(c <= CHUNK, "a chunk holds at most {CHUNK} positions");
    let d = q.len() / c.max(1);
    if c == 0 {
        return;
    }
    w.cum.resize(c * d, 0.0);
    for t in 0..c {
        for x in 0..d {
            let before = if t == 0 { 0.0 } else { w.cum[(t - 1) * d + x] };
            w.cum[t * d + x] = before + f64::from(g[t * d + x]);
        }
    }
    w.e.resize(d, 0.0);
    scaled_inputs(q, k, v, beta, d, w);
    intra(q, k, beta, d, w);
    invert(c, &mut w.t);
    // W = -T beta K e^G into wq's first half; D = T beta V (D's first half of d_o).
    let cd = c * d;
    w.wq[..cd].fill(0.0);
    w.d_o.fill(0.0);
    for (i0, rows, end, off) in block_rows(c) {
        let tb = &w.t[off..off + rows * end];
        pb_acc(tb, &w.kb[..end * d], d, &mut w.wq[i0 * d..(i0 + rows) * d]);
        pb_acc(tb, &w.vb[..end * d], d, &mut w.d_o[i0 * d..(i0 + rows) * d]);
    }
    // [D; O] += [W; Q e^G] S0: D = T beta (V - K e^G S0), O = Q e^G S0.
    pb_acc(&w.wq, s, d, &mut w.d_o);
    let (dd, o) = w.d_o.split_at_mut(cd);
    for (i0, rows, end, off) in block_rows(c) {
        pb_acc(&w.aqk[off..off + rows * end], &dd[..end * d], d, &mut o[i0 * d..(i0 + rows) * d]);
    }
    for (t, row) in o.chunks_exact(d).enumerate() {
        emit(t, row);
    }
    // S = e^{G_last} S0 + (K e^{G_last - G})^T D.
    for (x, row) in s.chunks_exact_mut(d).enumerate() {
        let decay = (w.cum[(c - 1) * d + x] as f32).exp();
        row.iter_mut().for_each(|sv| *sv *= decay);
    }
    pb_acc(&w.kl_t, dd, d, s);
}

/// `Q e^G` (wq's second half), `-beta K e^G`, `beta V` and `(K e^{G_last - G})^T`.
fn scaled_inputs(q: &[f32], k: &[f32], v: &[f32], beta: &[f32], d: usize, w: &mut ChunkWork) {
    let c = beta.len();
    w.wq.resize(2 * c * d, 0.0);
    w.d_o.resize(2 * c * d, 0.0);
    w.kb.resize(c * d, 0.0);
    w.vb.resize(c * d, 0.0);
    w.kl_t.resize(d * c, 0.0);
    let last = &w.cum[(c - 1) * d..];
    for t in 0..c {
        let r = t * d..(t + 1) * d;
        let cum = &w.cum[r.clone()];
        w.e.iter_mut().zip(cum).for_each(|(e, &gc)| *e = gc as f32);
        exp_shifted(&mut w.e, 0.0);
        let qe = &mut w.wq[c * d + t * d..c * d + (t + 1) * d];
        for x in 0..d {
            qe[x] = q[t * d + x] * w.e[x];
            w.kb[t * d + x] = -beta[t] * (k[t * d + x] * w.e[x]);
            w.vb[t * d + x] = beta[t] * v[t * d + x];
        }
        w.e.iter_mut().zip(cum.iter().zip(last)).for_each(|(e, (&gc, &gl))| *e = (gl - gc) as f32);
        exp_shifted(&mut w.e, 0.0);
        for x in 0..d {
            w.kl_t[x * c + t] = k[t * d + x] * w.e[x];
        }
    }
}

/// `Aqk` and `L` (into `t`, to be inverted there), a block row at a time.
fn intra(q: &[f32], k: &[f32], beta: &[f32], d: usize, w: &mut ChunkWork) {
    let c = beta.len();
    let size = block_rows(c).last().map_or(0, |(_, rows, end, off)| off + rows * end);
    w.t.resize(size, 0.0);
    w.aqk.resize(size, 0.0);
    for (i0, rows, end, off) in block_rows(c) {
        let r = &w.cum[i0 * d..(i0 + 1) * d];
        let span = (0..d).map(|x| r[x] - w.cum[(end - 1) * d + x]).fold(0f64, f64::max);
        // Rows: q e^{G_i - r}, then k e^{G_i - r}; columns k_j e^{r - G_j}, j < end.
        w.fa.resize(2 * rows * d, 0.0);
        w.fb.resize(end * d, 0.0);
        for i in 0..rows {
            exps(&mut w.e, &w.cum[(i0 + i) * d..(i0 + i + 1) * d], r, 1.0);
            for x in 0..d {
                w.fa[i * d + x] = q[(i0 + i) * d + x] * w.e[x];
                w.fa[(rows + i) * d + x] = k[(i0 + i) * d + x] * w.e[x];
            }
        }
        for j in 0..end {
            exps(&mut w.e, &w.cum[j * d..(j + 1) * d], r, -1.0);
            for x in 0..d {
                w.fb[j * d + x] = k[j * d + x] * w.e[x];
            }
        }
        w.prod.resize(2 * rows * end, 0.0);
        abt(&w.fa, &w.fb, d, &mut w.prod, false);
        for i in 0..rows {
            let (qrow, krow) = (&w.prod[i * end..(i + 1) * end], &w.prod[(rows + i) * end..(rows + i + 1) * end]);
            let (ta, tt) =
                (&mut w.aqk[off + i * end..off + (i + 1) * end], &mut w.t[off + i * end..off + (i + 1) * end]);
            for j in 0..end {
                let (past, now) = (j < i0 + i, j <= i0 + i);
                ta[j] = if now { qrow[j] } else { 0.0 };
                tt[j] = if past { beta[i0 + i] * krow[j] } else { 0.0 };
            }
        }
        if span > MAX_SPAN {
            pairwise(q, k, beta, d, (i0, rows, end, off), w);
        }
    }
}

/// `e = exp(sign (cum - r))`, each difference rounded once.
fn exps(e: &mut [f32], cum: &[f64], r: &[f64], sign: f64) {
    e.iter_mut().zip(cum.iter().zip(r)).for_each(|(e, (&gc, &rc))| *e = (sign * (gc - rc)) as f32);
    exp_shifted(e, 0.0);
}

/// A block's own pairs with each pair's exponents `G_i - G_j` directly (a decay too steep to
/// factor around one row).
fn pairwise(
    q: &[f32],
    k: &[f32],
    beta: &[f32],
    d: usize,
    (i0, rows, end, off): (usize, usize, usize, usize),
    w: &mut ChunkWork,
) {
    for i in i0..i0 + rows {
        for j in i0..=i {
            let (gi, gj) = (&w.cum[i * d..(i + 1) * d], &w.cum[j * d..(j + 1) * d]);
            exps(&mut w.e, gi, gj, 1.0);
            let (mut qk, mut kk) = (0f32, 0f32);
            for x in 0..d {
                let kj = k[j * d + x] * w.e[x];
                qk += q[i * d + x] * kj;
                kk += k[i * d + x] * kj;
            }
            w.aqk[off + (i - i0) * end + j] = qk;
            if j < i {
                w.t[off + (i - i0) * end + j] = beta[i] * kk;
            }
        }
    }
}

/// `L` (strictly lower, block-row layout) to `T = (I + L)^-1` in place, a row at a time:
/// `T_i = e_i - sum_{m<i} L[i][m] T_m`.
fn invert(c: usize, t: &mut [f32]) {
    let mut li = [0f32; CHUNK];
    for (i0, rows, end, off) in block_rows(c) {
        for ii in 0..rows {
            let i = i0 + ii;
            let start = off + ii * end;
            let (done, row) = t.split_at_mut(start);
            let row = &mut row[..end];
            li[..i].copy_from_slice(&row[..i]);
            row.fill(0.0);
            for (m, &lm) in li[..i].iter().enumerate() {
                let (b, mm) = (m / SUB, m % SUB);
                let m_end = ((b + 1) * SUB).min(c);
                let m_row = &done[SUB * SUB * b * (b + 1) / 2 + mm * m_end..][..=m];
                row[..=m].iter_mut().zip(m_row).for_each(|(r, tm)| *r -= lm * tm);
            }
            row[i] = 1.0;
        }
    }
}
