//! One head's recurrence, position by position, and the layout helpers around it. The same
//! `advance` runs when a chunk is computed and when a tentative chunk's accepted positions are
//! committed later, so both leave the state with the same bits.

use k3_quant::vecops::{axpby, dot};

use super::{Kda, KdaGate};
use crate::ops::{sigmoid, silu, softplus};

/// Working memory of one head's recurrence: `u`, the per-channel decay, and `a` (`S^T q` after
/// the update).
pub(super) struct HeadScratch {
    u: Vec<f32>,
    decay: Vec<f32>,
    pub a: Vec<f32>,
}

impl HeadScratch {
    pub fn new(hd: usize) -> HeadScratch {
        HeadScratch { u: vec![0.0; hd], decay: vec![0.0; hd], a: vec![0.0; hd] }
    }
}

/// One position of one head: its pre-convolution `q, k, v` (convolved in place), the gate's `z`
/// (before `dt_bias`) and beta's logit.
pub(super) struct Position<'x> {
    pub qkv: [&'x mut [f32]; 3],
    pub z: &'x [f32],
    pub b: f32,
}

impl Kda<'_> {
    /// Advances head `h` by one position: the convolutions advance `win`, q and k are
    /// normalized, the gate gives the decay, the delta rule updates `s`; leaves `S^T q` in
    /// `sc.a`.
    pub(super) fn advance(
        &self,
        h: usize,
        pos: Position<'_>,
        s: &mut [f32],
        win: [&mut [f32]; 3],
        sc: &mut HeadScratch,
    ) {
        let (hd, kern) = (self.cfg.head_dim, self.cfg.conv_kernel);
        let taps = h * hd * kern..(h + 1) * hd * kern;
        let Position { qkv: [qh, kh, vh], z, b } = pos;
        let [win_q, win_k, win_v] = win;
        conv_silu(qh, win_q, &self.w.q_conv[taps.clone()], kern);
        conv_silu(kh, win_k, &self.w.k_conv[taps.clone()], kern);
        conv_silu(vh, win_v, &self.w.v_conv[taps], kern);
        let q_scale = 1.0 / (hd as f32).sqrt();
        let qn = 1.0 / (qh.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt() * q_scale;
        qh.iter_mut().for_each(|x| *x *= qn);
        let kn = 1.0 / (kh.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
        kh.iter_mut().for_each(|x| *x *= kn);
        let a_exp = self.w.a_log[h].exp();
        for ((dc, zc), db) in sc.decay.iter_mut().zip(z).zip(&self.w.dt_bias[h * hd..(h + 1) * hd]) {
            let zc = zc + db;
            let g = match self.cfg.gate {
                KdaGate::LowerBound(lb) => lb * sigmoid(a_exp * zc),
                KdaGate::Softplus => -a_exp * softplus(zc),
            };
            *dc = g.exp();
        }
        delta_rule(s, qh, kh, vh, &sc.decay, sigmoid(b), &mut sc.u, &mut sc.a);
    }
}

/// `[n, H*hd]` token-major to `[H, n, hd]` head-major.
pub(super) fn to_heads(tm: &[f32], n: usize, hd: usize) -> Vec<f32> {
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

/// `[H, n, hd]` head-major back to `[n, H*hd]` token-major, into `out`.
pub(super) fn from_heads(hm: &[f32], n: usize, hd: usize, out: &mut [f32]) {
    let c = hm.len() / n.max(1);
    let heads = c / hd;
    for h in 0..heads {
        for t in 0..n {
            out[t * c + h * hd..t * c + (h + 1) * hd].copy_from_slice(&hm[(h * n + t) * hd..(h * n + t + 1) * hd]);
        }
    }
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
pub(super) fn conv_silu(proj: &mut [f32], win: &mut [f32], taps: &[f32], kern: usize) {
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
