//! Kimi Delta Attention (KDA): per head a `head_dim x head_dim` state `S[k][v]`, updated by a
//! per-channel gated delta rule, read with the query.
//!
//! Per token (x = the normed layer input, per head h, `hd = head_dim`):
//! 1. `q, k, v = SiLU(causal_conv(W_{q,k,v} x))` (a window of the last `kernel` projections per
//!    channel, zeros at the start; the last tap is the current token; no bias).
//! 2. `q <- q / sqrt(sum q^2 + 1e-6) * hd^-0.5`, `k <- k / sqrt(sum k^2 + 1e-6)`.
//! 3. `z = f_b(f_a x) + dt_bias`; gate (log-decay per channel): K3 `g = lb * sigmoid(exp(A_log[h]) * z)`,
//!    Kimi-Linear `g = -exp(A_log[h]) * softplus(z)`; `beta = sigmoid(b_proj x)[h]`.
//! 4. `S <- diag(exp(g)) S; u = S^T k; S <- S + k (beta (v - u))^T; o = S^T q`.
//! 5. `y_h = RMSNorm(o; o_norm) * sigmoid(gate)` with gate `g_proj x` (K3) or `g_b(g_a x)`;
//!    the output is `o_proj(concat_h y_h)`.
//!
//! The state pass is fused: one read of `S` gives `u = sum_k e^{g_k} k_k S[k]` and
//! `a = sum_k e^{g_k} q_k S[k]`; then `delta = beta (v - u)`, `o = a + (k . q) delta` (which is
//! `S_new^T q`), and one read-modify-write gives `S[k] <- e^{g_k} S[k] + k_k delta`.

use k3_quant::Matrix;
use k3_quant::vecops::{axpby, dot};
use rayon::prelude::*;

use crate::AttnError;
use crate::ops::{check_len, check_matrix, rms_norm, sigmoid, silu, softplus};
use crate::state_io;

/// How the log-decay gate is formed from `z = f_b(f_a x) + dt_bias`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KdaGate {
    /// K3: `g = bound * sigmoid(exp(A_log[h]) * z)` (bound = `gate_lower_bound`, e.g. -5).
    LowerBound(f32),
    /// Kimi-Linear: `g = -exp(A_log[h]) * softplus(z)`.
    Softplus,
}

#[derive(Debug, Clone, PartialEq)]
pub struct KdaConfig {
    pub hidden: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    pub gate: KdaGate,
    /// eps of the per-head output RMSNorm (the model's `rms_norm_eps`).
    pub norm_eps: f32,
}

impl KdaConfig {
    fn channels(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// The output gate's projection.
#[derive(Debug, Clone, Copy)]
pub enum OutputGate<'a> {
    /// K3: `g_proj` `[H*hd, D]`.
    FullRank(Matrix<'a>),
    /// Kimi-Linear: `g_b(g_a x)`, `g_a` `[hd, D]`, `g_b` `[H*hd, hd]`.
    LowRank { a: Matrix<'a>, b: Matrix<'a> },
}

/// `A_log` as the layer needs it (`[H]`) from however a checkpoint stored it: `[H]`,
/// `[1, 1, H, 1]` (Kimi-Linear) or a 1-D vector padded beyond the heads (K3 stores `[head_dim]`
/// with the per-head values first and zeros after).
pub fn a_log_per_head(layer: &str, values: &[f32], shape: &[u64], heads: usize) -> Result<Vec<f32>, AttnError> {
    let count: u64 = shape.iter().product();
    let padded_1d = shape.len() == 1 && count as usize > heads;
    if count as usize != values.len() || (count as usize != heads && !padded_1d) {
        return Err(AttnError::Unsupported {
            layer: layer.to_string(),
            reason: format!("`A_log` of shape {shape:?} does not hold one value per head ({heads} heads)"),
        });
    }
    Ok(values[..heads].to_vec())
}

/// A KDA layer's weights. Small vectors are f32 copies (the engine converts whatever dtype and
/// shape the checkpoint stored, e.g. `A_log` as `[H]`, padded `[hd]` or `[1,1,H,1]`).
#[derive(Debug, Clone)]
pub struct KdaWeights<'a> {
    pub q_proj: Matrix<'a>,
    pub k_proj: Matrix<'a>,
    pub v_proj: Matrix<'a>,
    /// `[H*hd, kernel]` each.
    pub q_conv: Vec<f32>,
    pub k_conv: Vec<f32>,
    pub v_conv: Vec<f32>,
    /// `[H]`.
    pub a_log: Vec<f32>,
    /// `[H*hd]`.
    pub dt_bias: Vec<f32>,
    pub f_a: Matrix<'a>,
    pub f_b: Matrix<'a>,
    pub b_proj: Matrix<'a>,
    /// `[hd]`, shared by the heads.
    pub o_norm: Vec<f32>,
    pub gate: OutputGate<'a>,
    pub o_proj: Matrix<'a>,
}

/// A KDA layer: config and weights, checked against each other.
#[derive(Debug, Clone)]
pub struct Kda<'a> {
    name: String,
    cfg: KdaConfig,
    w: KdaWeights<'a>,
}

/// The recurrent state of one KDA layer (plus reusable scratch memory).
#[derive(Debug, Clone, PartialEq)]
pub struct KdaState {
    /// Per projection (q, k, v): the last `kernel - 1` pre-conv values per channel, oldest first.
    conv: [Vec<f32>; 3],
    /// `[H][hd][hd]`, `S[k][v]`.
    s: Vec<f32>,
    dims: [u64; 3],
}

impl KdaState {
    /// Back to the start of a sequence.
    pub fn reset(&mut self) {
        self.conv.iter_mut().for_each(|c| c.fill(0.0));
        self.s.fill(0.0);
    }

    /// The recurrent matrix of head `h`, `S[k][v]` row-major.
    pub fn head_state(&self, h: usize) -> &[f32] {
        let hd = self.dims[1] as usize;
        &self.s[h * hd * hd..(h + 1) * hd * hd]
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        state_io::write(b"KDA1", &self.dims, &[&self.conv[0], &self.conv[1], &self.conv[2], &self.s])
    }

    /// Restores a state saved by [`to_bytes`](Self::to_bytes) for a layer of the same shape.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), AttnError> {
        let mut a = state_io::read("KDA", bytes, b"KDA1", &self.dims)?;
        let want = [self.conv[0].len(), self.conv[1].len(), self.conv[2].len(), self.s.len()];
        if a.len() != 4 || a.iter().zip(want).any(|(x, w)| x.len() != w) {
            return Err(AttnError::State { what: "KDA", reason: "array sizes do not match the layer".into() });
        }
        self.s = a.pop().expect("4 arrays");
        for i in (0..3).rev() {
            self.conv[i] = a.pop().expect("3 arrays");
        }
        Ok(())
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
    y: Vec<f32>,
}

/// `out = m xs` for `n` vectors, rows split over the current rayon pool (same bits on any).
fn matmul_into(m: &Matrix<'_>, xs: &[f32], n: usize, out: &mut Vec<f32>) {
    out.resize(n * m.rows(), 0.0);
    k3_quant::par::matmul(m, xs, out);
}

impl<'a> Kda<'a> {
    /// Checks every weight's shape against `cfg`; `name` names the layer in errors.
    pub fn new(name: impl Into<String>, cfg: KdaConfig, w: KdaWeights<'a>) -> Result<Self, AttnError> {
        let name = name.into();
        let (d, h, hd, c) = (cfg.hidden, cfg.heads, cfg.head_dim, cfg.channels());
        for (t, m) in [("q_proj", &w.q_proj), ("k_proj", &w.k_proj), ("v_proj", &w.v_proj)] {
            check_matrix(&name, t, m, c, d)?;
        }
        for (t, v) in [("q_conv1d", &w.q_conv), ("k_conv1d", &w.k_conv), ("v_conv1d", &w.v_conv)] {
            check_len(&name, t, v, c * cfg.conv_kernel)?;
        }
        check_len(&name, "A_log", &w.a_log, h)?;
        check_len(&name, "dt_bias", &w.dt_bias, c)?;
        check_matrix(&name, "f_a_proj", &w.f_a, hd, d)?;
        check_matrix(&name, "f_b_proj", &w.f_b, c, hd)?;
        check_matrix(&name, "b_proj", &w.b_proj, h, d)?;
        check_len(&name, "o_norm", &w.o_norm, hd)?;
        match &w.gate {
            OutputGate::FullRank(g) => check_matrix(&name, "g_proj", g, c, d)?,
            OutputGate::LowRank { a, b } => {
                check_matrix(&name, "g_a_proj", a, hd, d)?;
                check_matrix(&name, "g_b_proj", b, c, hd)?;
            }
        }
        check_matrix(&name, "o_proj", &w.o_proj, d, c)?;
        if cfg.conv_kernel == 0 {
            return Err(AttnError::Unsupported { layer: name, reason: "short_conv_kernel_size 0".into() });
        }
        Ok(Kda { name, cfg, w })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &KdaConfig {
        &self.cfg
    }

    /// A fresh (zero) state for this layer.
    pub fn state(&self) -> KdaState {
        let (c, hd) = (self.cfg.channels(), self.cfg.head_dim);
        let win = c * (self.cfg.conv_kernel - 1);
        KdaState {
            conv: [vec![0.0; win], vec![0.0; win], vec![0.0; win]],
            s: vec![0.0; self.cfg.heads * hd * hd],
            dims: [self.cfg.heads as u64, hd as u64, self.cfg.conv_kernel as u64],
        }
    }

    /// One token: `out = KDA(x)`, advancing `state`.
    pub fn step(&self, state: &mut KdaState, x: &[f32], out: &mut [f32]) {
        self.prefill(state, x, out)
    }

    /// A chunk of tokens (`xs` `[n, D]`, `outs` `[n, D]`), bit-identical to stepping them one by
    /// one: projections are batched, the recurrence runs token by token.
    pub fn prefill(&self, state: &mut KdaState, xs: &[f32], outs: &mut [f32]) {
        let d = self.cfg.hidden;
        assert!(
            xs.len().is_multiple_of(d) && outs.len() == xs.len(),
            "{}: inputs and outputs must be [n, {d}]",
            self.name
        );
        let n = xs.len() / d;
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
        let (c, hd) = (self.cfg.channels(), self.cfg.head_dim);
        // Head-major copies: every head's recurrence runs whole on one thread (the heads are
        // independent), so the result is the same bits on any number of threads.
        let (mut q, mut k, mut v) = (to_heads(&p.q, n, hd), to_heads(&p.k, n, hd), to_heads(&p.v, n, hd));
        let mut y = vec![0f32; n * c];
        let win = hd * (self.cfg.conv_kernel - 1);
        let [wq, wk, wv] = &mut state.conv;
        let tasks: Vec<HeadTask<'_>> = q
            .chunks_mut(n * hd)
            .zip(k.chunks_mut(n * hd))
            .zip(v.chunks_mut(n * hd))
            .zip(y.chunks_mut(n * hd))
            .zip(state.s.chunks_mut(hd * hd))
            .zip(wq.chunks_mut(win).zip(wk.chunks_mut(win)).zip(wv.chunks_mut(win)))
            .enumerate()
            .map(|(h, (((((q, k), v), y), s), ((a, b), c)))| HeadTask { h, qkv: [q, k, v], y, s, win: [a, b, c] })
            .collect();
        let work = n * c * hd;
        if work >= k3_quant::par::MIN_PARALLEL_WEIGHTS && rayon::current_num_threads() > 1 {
            tasks.into_par_iter().for_each(|t| self.head(t, n, &p));
        } else {
            tasks.into_iter().for_each(|t| self.head(t, n, &p));
        }
        p.y = from_heads(&y, n, hd);
        k3_quant::par::matmul(&w.o_proj, &p.y, outs);
    }

    /// The recurrence of one head over the chunk, from its projections (head-major `[n, hd]`);
    /// writes the head's gated outputs.
    fn head(&self, task: HeadTask<'_>, n: usize, p: &Proj) {
        let HeadTask { h, qkv: [q, k, v], y, s, win } = task;
        let (hd, kern, c, heads) = (self.cfg.head_dim, self.cfg.conv_kernel, self.cfg.channels(), self.cfg.heads);
        // This head's channels' taps.
        let taps = h * hd * kern..(h + 1) * hd * kern;
        let [win_q, win_k, win_v] = win;
        let q_scale = 1.0 / (hd as f32).sqrt();
        let a_exp = self.w.a_log[h].exp();
        let mut scratch = vec![0f32; 3 * hd];
        let (u, rest) = scratch.split_at_mut(hd);
        let (a, decay) = rest.split_at_mut(hd);
        for t in 0..n {
            let r = t * hd..(t + 1) * hd;
            let (qh, kh, vh) = (&mut q[r.clone()], &mut k[r.clone()], &mut v[r.clone()]);
            conv_silu(qh, win_q, &self.w.q_conv[taps.clone()], kern);
            conv_silu(kh, win_k, &self.w.k_conv[taps.clone()], kern);
            conv_silu(vh, win_v, &self.w.v_conv[taps.clone()], kern);
            let qn = 1.0 / (qh.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt() * q_scale;
            qh.iter_mut().for_each(|x| *x *= qn);
            let kn = 1.0 / (kh.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
            kh.iter_mut().for_each(|x| *x *= kn);
            let z = &p.z[t * c + h * hd..t * c + (h + 1) * hd];
            for ((dc, zc), db) in decay.iter_mut().zip(z).zip(&self.w.dt_bias[h * hd..(h + 1) * hd]) {
                let zc = zc + db;
                let g = match self.cfg.gate {
                    KdaGate::LowerBound(lb) => lb * sigmoid(a_exp * zc),
                    KdaGate::Softplus => -a_exp * softplus(zc),
                };
                *dc = g.exp();
            }
            let beta = sigmoid(p.b[t * heads + h]);
            delta_rule(s, qh, kh, vh, decay, beta, u, a);
            let yh = &mut y[r];
            rms_norm(a, &self.w.o_norm, self.cfg.norm_eps, yh);
            for (yv, gv) in yh.iter_mut().zip(&p.gate[t * c + h * hd..t * c + (h + 1) * hd]) {
                *yv *= sigmoid(*gv);
            }
        }
    }
}

/// One head's share of a chunk: its projections and outputs (head-major `[n, hd]`), its state
/// and its convolution windows.
struct HeadTask<'x> {
    h: usize,
    qkv: [&'x mut [f32]; 3],
    y: &'x mut [f32],
    s: &'x mut [f32],
    win: [&'x mut [f32]; 3],
}

/// `[n, H*hd]` token-major to `[H, n, hd]` head-major.
fn to_heads(tm: &[f32], n: usize, hd: usize) -> Vec<f32> {
    let c = tm.len() / n.max(1);
    let heads = c / hd;
    let mut out = vec![0f32; tm.len()];
    for t in 0..n {
        for h in 0..heads {
            out[(h * n + t) * hd..(h * n + t + 1) * hd].copy_from_slice(&tm[t * c + h * hd..t * c + (h + 1) * hd]);
        }
    }
    out
}

/// `[H, n, hd]` head-major back to `[n, H*hd]` token-major.
fn from_heads(hm: &[f32], n: usize, hd: usize) -> Vec<f32> {
    let c = hm.len() / n.max(1);
    let heads = c / hd;
    let mut out = vec![0f32; hm.len()];
    for h in 0..heads {
        for t in 0..n {
            out[t * c + h * hd..t * c + (h + 1) * hd].copy_from_slice(&hm[(h * n + t) * hd..(h * n + t + 1) * hd]);
        }
    }
    out
}

/// The gated delta rule for one head, fused into two passes over the state `s` (`[hd][hd]`,
/// `S[k][v]`): `S <- diag(decay) S; u = S^T k; S <- S + k (beta (v - u))^T`; writes
/// `o = S^T q` (the updated state) into `o`. `u` is scratch of `hd` values.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: &[f32],
    beta: f32,
    u: &mut [f32],
    o: &mut [f32],
) {
    let hd = q.len();
    // One read of S: u = S_decayed^T k, o = S_decayed^T q.
    u.fill(0.0);
    o.fill(0.0);
    for (kk, row) in s.chunks_exact(hd).enumerate() {
        axpby(1.0, u, decay[kk] * k[kk], row);
        axpby(1.0, o, decay[kk] * q[kk], row);
    }
    // delta = beta (v - u); o += (k . q) delta, which makes o = S_new^T q.
    for (uv, vv) in u.iter_mut().zip(v) {
        *uv = beta * (vv - *uv);
    }
    axpby(1.0, o, dot(k, q), u);
    // One read-modify-write of S: S[k] <- decay_k S[k] + k_k delta.
    for (kk, row) in s.chunks_exact_mut(hd).enumerate() {
        axpby(decay[kk], row, k[kk], u);
    }
}

/// Causal short convolution over the window (oldest first, then the current value) and SiLU,
/// in place; the window advances by one.
fn conv_silu(proj: &mut [f32], win: &mut [f32], taps: &[f32], kern: usize) {
    for (ch, val) in proj.iter_mut().enumerate() {
        let t = &taps[ch * kern..(ch + 1) * kern];
        let hist = &mut win[ch * (kern - 1)..(ch + 1) * (kern - 1)];
        let mut acc = 0f32;
        for (tw, hv) in t.iter().zip(hist.iter()) {
            acc += tw * hv;
        }
        acc += t[kern - 1] * *val;
        if kern > 1 {
            hist.rotate_left(1);
            hist[kern - 2] = *val;
        }
        *val = silu(acc);
    }
}
