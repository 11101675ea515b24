//! One head over a run of positions (the state pass position by position, or in chunks), and
//! the layout helpers around it. The same `run_head` runs when a chunk is computed and when a
//! tentative chunk's accepted positions are committed later, so both leave the state with the
//! same bits (in either form: a run's chunks are counted from its own first position).

use k3_quant::vecops::{axpby, dot, update_then_read};

use super::wy::{CHUNK, ChunkWork, advance};
use super::{Kda, KdaForm, KdaGate};
use crate::ops::{sigmoid, silu, softplus};

impl Kda<'_> {
    /// Runs head `h` over `n` positions (`q, k, v` head-major `[n, hd]`, convolved in place;
    /// `z(t)` and `b(t)` the gate's inputs of position `t`), advancing its state `s` and
    /// convolution windows `win`, and hands `S^T q` after each position's update to `emit`.
    ///
    /// Everything that does not depend on the state (convolutions, norms, gates) is done for
    /// every position first, then the state pass in the layer's form for `n` ([`state_pass`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_head<'z>(
        &self,
        h: usize,
        [q, k, v]: [&mut [f32]; 3],
        z: impl Fn(usize) -> &'z [f32],
        b: impl Fn(usize) -> f32,
        s: &mut [f32],
        [win_q, win_k, win_v]: [&mut [f32]; 3],
        emit: impl FnMut(usize, &[f32]),
    ) {
        let (hd, kern) = (self.cfg.head_dim, self.cfg.conv_kernel);
        let n = q.len() / hd;
        let taps = h * hd * kern..(h + 1) * hd * kern;
        let mut g = vec![0f32; n * hd];
        let beta: Vec<f32> = (0..n).map(|t| sigmoid(b(t))).collect();
        for t in 0..n {
            let r = t * hd..(t + 1) * hd;
            conv_silu(&mut q[r.clone()], win_q, &self.w.q_conv[taps.clone()], kern);
            conv_silu(&mut k[r.clone()], win_k, &self.w.k_conv[taps.clone()], kern);
            conv_silu(&mut v[r.clone()], win_v, &self.w.v_conv[taps.clone()], kern);
            normalize(&mut q[r.clone()], &mut k[r.clone()]);
            self.log_decay(h, z(t), &mut g[r]);
        }
        state_pass(self.form, s, [q, k, v], &mut g, &beta, emit);
    }

    /// Head `h`'s per-channel log-decay `g` from the gate's `z` (before `dt_bias`).
    fn log_decay(&self, h: usize, z: &[f32], out: &mut [f32]) {
        let hd = self.cfg.head_dim;
        let a_exp = self.w.a_log[h].exp();
        for ((dc, zc), db) in out.iter_mut().zip(z).zip(&self.w.dt_bias[h * hd..(h + 1) * hd]) {
            let zc = zc + db;
            let g = match self.cfg.gate {
                KdaGate::LowerBound(lb) => lb * sigmoid(a_exp * zc),
                KdaGate::Softplus => -a_exp * softplus(zc),
            };
            *dc = g;
        }
    }
}

/// One head's state `s` (`[hd][hd]`) over a run of positions (`q, k, v` and the log-decays `g`
/// `[n, hd]`, `beta` `[n]`), chunked or position by position, handing each position's `S^T q`
/// (after its update) to `emit`. `g` is overwritten.
///
/// Position by position, each position's update of `S` and the next one's read of it share one
/// pass ([`update_then_read`]), each value computed as by [`delta_rule`], so any split of the
/// positions into runs (a decode step is one) leaves the same bits. Chunked, the bits depend on
/// where the run starts (its chunks are counted from its first position).
///
/// # Panics
/// When the shapes do not agree: `q, k, v, g` `[n, hd]` for the `n` betas, `s` `[hd, hd]`.
pub fn state_pass(
    form: KdaForm,
    s: &mut [f32],
    [q, k, v]: [&[f32]; 3],
    g: &mut [f32],
    beta: &[f32],
    mut emit: impl FnMut(usize, &[f32]),
) {
    let n = beta.len();
    if n == 0 {
        return;
    }
    let hd = q.len() / n;
    let rows = |x: &[f32]| x.len() == n * hd;
    assert!(
        hd > 0 && rows(q) && rows(k) && rows(v) && rows(g) && hd.checked_mul(hd) == Some(s.len()),
        "state_pass: q, k, v, g must be [n, hd] for the n betas, s [hd, hd]"
    );
    if form == KdaForm::Chunked {
        let mut work = ChunkWork::default();
        for t0 in (0..n).step_by(CHUNK) {
            let r = t0 * hd..(t0 + CHUNK).min(n) * hd;
            let rows = [&q[r.clone()], &k[r.clone()], &v[r.clone()], &g[r]];
            advance(s, rows, &beta[t0..(t0 + CHUNK).min(n)], &mut work, |t, o| emit(t0 + t, o));
        }
        return;
    }
    g.iter_mut().for_each(|x| *x = x.exp());
    let decay = &*g;
    // The current position's `u, a`, the next one's, and the next one's read weights.
    let mut work = vec![0f32; 6 * hd];
    let (mut u, rest) = work.split_at_mut(hd);
    let (mut a, rest) = rest.split_at_mut(hd);
    let (mut u_next, rest) = rest.split_at_mut(hd);
    let (mut a_next, rest) = rest.split_at_mut(hd);
    let (cu, co) = rest.split_at_mut(hd);
    let pos = |t: usize| t * hd..(t + 1) * hd;
    read(s, &decay[pos(0)], &k[pos(0)], &q[pos(0)], u, a);
    for t in 0..n {
        let (qt, kt, vt, dt) = (&q[pos(t)], &k[pos(t)], &v[pos(t)], &decay[pos(t)]);
        finish(qt, kt, vt, beta[t], u, a);
        emit(t, a);
        if t + 1 == n {
            update(s, dt, kt, u);
            break;
        }
        // The next position's read weights, as `read` forms them.
        let (dn, kn, qn) = (&decay[pos(t + 1)], &k[pos(t + 1)], &q[pos(t + 1)]);
        for c in 0..hd {
            (cu[c], co[c]) = (dn[c] * kn[c], dn[c] * qn[c]);
        }
        u_next.fill(0.0);
        a_next.fill(0.0);
        update_then_read(s, dt, kt, u, (cu, co), u_next, a_next);
        std::mem::swap(&mut u, &mut u_next);
        std::mem::swap(&mut a, &mut a_next);
    }
}

/// `q <- q / |q| * hd^-0.5`, `k <- k / |k|` (each with 1e-6 under the root).
fn normalize(q: &mut [f32], k: &mut [f32]) {
    let q_scale = 1.0 / (q.len() as f32).sqrt();
    let qn = 1.0 / (q.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt() * q_scale;
    q.iter_mut().for_each(|x| *x *= qn);
    let kn = 1.0 / (k.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
    k.iter_mut().for_each(|x| *x *= kn);
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

/// The gated delta rule for one head and one position, in two passes over the state `s`
/// (`[hd][hd]`, `S[k][v]`): `S <- diag(decay) S; u = S^T k; S <- S + k (beta (v - u))^T`;
/// writes `o = S^T q` (the updated state) into `o`. `u` is scratch of `hd` values.
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
    read(s, decay, k, q, u, o);
    finish(q, k, v, beta, u, o);
    update(s, decay, k, u);
}

/// One read of the decayed state: `u = S_decayed^T k`, `o = S_decayed^T q`.
fn read(s: &[f32], decay: &[f32], k: &[f32], q: &[f32], u: &mut [f32], o: &mut [f32]) {
    u.fill(0.0);
    o.fill(0.0);
    for (kk, row) in s.chunks_exact(q.len()).enumerate() {
        axpby(1.0, u, decay[kk] * k[kk], row);
        axpby(1.0, o, decay[kk] * q[kk], row);
    }
}

/// `u <- delta = beta (v - u)`; `o += (k . q) delta`, which makes `o = S_new^T q`.
fn finish(q: &[f32], k: &[f32], v: &[f32], beta: f32, u: &mut [f32], o: &mut [f32]) {
    for (uv, vv) in u.iter_mut().zip(v) {
        *uv = beta * (vv - *uv);
    }
    axpby(1.0, o, dot(k, q), u);
}

/// One read-modify-write of the state: `S[k] <- decay_k S[k] + k_k delta`.
fn update(s: &mut [f32], decay: &[f32], k: &[f32], delta: &[f32]) {
    for (kk, row) in s.chunks_exact_mut(delta.len()).enumerate() {
        axpby(decay[kk], row, k[kk], delta);
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
