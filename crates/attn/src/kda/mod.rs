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
//! `S_new^T q`), and one read-modify-write gives `S[k] <- e^{g_k} S[k] + k_k delta`. Over a
//! chunk, that write and the next position's read are one pass (`vecops::update_then_read`,
//! the same arithmetic per value): one pass over `S` a position instead of two.

mod chunk;
mod form;
mod recurrence;
mod wy;

use k3_quant::Matrix;

use crate::AttnError;
use crate::ops::{check_len, check_matrix};
use crate::state_io;

pub use chunk::{KdaRun, KdaSeq, KdaTape};
pub use form::KdaForm;
pub use recurrence::{delta_rule, state_pass};

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
    form: KdaForm,
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
    /// Bytes of the state (short-conv windows and the per-head matrices).
    pub fn bytes(&self) -> usize {
        4 * (self.s.len() + self.conv.iter().map(Vec::len).sum::<usize>())
    }

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
        if hd == 0 {
            return Err(AttnError::Unsupported { layer: name, reason: "head_dim 0".into() });
        }
        Ok(Kda { name, cfg, w, form: KdaForm::Recurrent })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &KdaConfig {
        &self.cfg
    }

    /// Which form a run of positions takes ([`KdaForm::Recurrent`] unless set).
    pub fn set_form(&mut self, form: KdaForm) {
        self.form = form;
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
}
