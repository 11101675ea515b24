//! MoonViT3d for still images and K3's projector (PatchMergerMLPV2), in f32 on the stored
//! weights: patch embedding (the 14 x 14 convolution as a product) plus the learned positions,
//! pre-norm blocks (RMSNorm, attention with 2D rotary positions over the whole image, RMSNorm,
//! GELU-tanh MLP), a final RMSNorm, each 2 x 2 group of patches side by side, and the projector
//! (linear, exact GELU, linear, RMSNorm) into the language model's width.

pub mod attention;
mod names;
mod pos;

pub use names::{TensorRole, block as block_name, tensors};

use k3_quant::{Matrix, par, vecops::rms_norm};

use crate::{Patches, VisionConfig, VisionError};

/// `torch.nn.RMSNorm(dim)` without an eps: the dtype's machine epsilon.
const BLOCK_NORM_EPS: f32 = f32::EPSILON;

/// One encoder block's weights.
#[derive(Debug)]
pub struct BlockWeights<'a> {
    pub norm0: Vec<f32>,
    pub norm1: Vec<f32>,
    pub wqkv: Matrix<'a>,
    pub wo: Matrix<'a>,
    pub fc0: Matrix<'a>,
    pub fc1: Matrix<'a>,
}

/// The tower's and projector's weights, as the caller found them.
#[derive(Debug)]
pub struct TowerWeights<'a> {
    /// The patch convolution as a `[hidden, 3 * p * p]` matrix.
    pub patch_embed: Matrix<'a>,
    /// `[init_h, init_w, hidden]`.
    pub pos_emb: Vec<f32>,
    pub blocks: Vec<BlockWeights<'a>>,
    pub final_norm: Vec<f32>,
    pub proj0: Matrix<'a>,
    pub proj2: Matrix<'a>,
    pub post_norm: Vec<f32>,
}

/// A vision tower ready to run.
#[derive(Debug)]
pub struct Tower<'a> {
    cfg: VisionConfig,
    w: TowerWeights<'a>,
}

fn shape_err(name: &str, reason: String) -> VisionError {
    VisionError::Tensor { name: name.to_string(), reason }
}

fn check_matrix(name: &str, m: &Matrix<'_>, rows: usize, cols: usize) -> Result<(), VisionError> {
    if (m.rows(), m.cols()) != (rows, cols) {
        return Err(shape_err(name, format!("is [{}, {}], the config says [{rows}, {cols}]", m.rows(), m.cols())));
    }
    Ok(())
}

fn check_vector(name: &str, v: &[f32], len: usize) -> Result<(), VisionError> {
    if v.len() != len {
        return Err(shape_err(name, format!("has {} values, the config says {len}", v.len())));
    }
    Ok(())
}

impl<'a> Tower<'a> {
    /// Checks every weight's shape against `cfg`.
    pub fn new(cfg: VisionConfig, w: TowerWeights<'a>) -> Result<Self, VisionError> {
        let (d, q, m) = (cfg.vt_hidden_size, cfg.qkv_hidden_size, cfg.vt_intermediate_size);
        let p = cfg.patch_size;
        check_matrix("vision_tower.patch_embed.proj.weight", &w.patch_embed, d, 3 * p * p)?;
        check_vector(
            "vision_tower.patch_embed.pos_emb.weight",
            &w.pos_emb,
            cfg.init_pos_emb_height * cfg.init_pos_emb_width * d,
        )?;
        if w.blocks.len() != cfg.vt_num_hidden_layers {
            return Err(shape_err(
                "vision_tower.encoder.blocks",
                format!("{} blocks, the config says {}", w.blocks.len(), cfg.vt_num_hidden_layers),
            ));
        }
        for (i, b) in w.blocks.iter().enumerate() {
            let n = |s: &str| names::block(i, s);
            check_vector(&n("norm0.weight"), &b.norm0, d)?;
            check_vector(&n("norm1.weight"), &b.norm1, d)?;
            check_matrix(&n("wqkv.weight"), &b.wqkv, 3 * q, d)?;
            check_matrix(&n("wo.weight"), &b.wo, d, q)?;
            check_matrix(&n("mlp.fc0.weight"), &b.fc0, m, d)?;
            check_matrix(&n("mlp.fc1.weight"), &b.fc1, d, m)?;
        }
        check_vector("vision_tower.encoder.final_layernorm.weight", &w.final_norm, d)?;
        let mw = cfg.merged_width();
        check_matrix("mm_projector.proj.0.weight", &w.proj0, mw, mw)?;
        check_matrix("mm_projector.proj.2.weight", &w.proj2, cfg.text_hidden_size, mw)?;
        check_vector("mm_projector.post_norm.weight", &w.post_norm, cfg.text_hidden_size)?;
        Ok(Tower { cfg, w })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// The image's prompt rows, `[positions, text_hidden]`: the tower, then the projector.
    pub fn embed(&self, patches: &Patches) -> Result<Vec<f32>, VisionError> {
        Ok(self.project(&self.merged(patches)?))
    }

    /// The tower's output with each 2 x 2 group of patches side by side, `[positions, 4 * hidden]`.
    pub fn merged(&self, patches: &Patches) -> Result<Vec<f32>, VisionError> {
        Ok(self.start(patches)?.merged())
    }

    /// A run of the tower over `patches` that advances a block at a time ([`TowerRun::step`]),
    /// so a caller with other work (a server's decoding sequences) can interleave it.
    pub fn start(&self, patches: &Patches) -> Result<TowerRun<'_, 'a>, VisionError> {
        let (cfg, l) = (&self.cfg, &patches.layout);
        if patches.patch != cfg.patch_size || patches.values.len() != l.patches() * 3 * cfg.patch_size.pow(2) {
            return Err(VisionError::Image(format!(
                "patches of {} pixels do not fit a tower of {}",
                patches.patch, cfg.patch_size
            )));
        }
        let (n, d) = (l.patches(), cfg.vt_hidden_size);
        let mut x = vec![0f32; n * d];
        par::matmul(&self.w.patch_embed, &patches.values, &mut x);
        let table = (cfg.init_pos_emb_height, cfg.init_pos_emb_width);
        let pos = pos::interpolate(&self.w.pos_emb, table.0, table.1, d, l.grid_h, l.grid_w);
        x.iter_mut().zip(&pos).for_each(|(a, b)| *a += b);
        let rot = pos::rotary(l.grid_h, l.grid_w, cfg.head_dim());
        Ok(TowerRun { tower: self, x, n, rot, grid: (l.grid_h, l.grid_w), next: 0 })
    }

    /// The projector over merged rows, `[positions, text_hidden]`.
    pub fn project(&self, merged: &[f32]) -> Vec<f32> {
        let mw = self.cfg.merged_width();
        let n = merged.len() / mw;
        let mut h = vec![0f32; n * mw];
        par::matmul(&self.w.proj0, merged, &mut h);
        h.iter_mut().for_each(|v| *v = gelu_erf(*v));
        let t = self.cfg.text_hidden_size;
        let mut out = vec![0f32; n * t];
        par::matmul(&self.w.proj2, &h, &mut out);
        let mut normed = vec![0f32; n * t];
        norm_rows(&out, &self.w.post_norm, self.cfg.projector_ln_eps, &mut normed);
        normed
    }

    fn block(&self, b: &BlockWeights<'_>, x: &mut [f32], n: usize, rot: &[(f32, f32)]) {
        let (d, q, hd) = (self.cfg.vt_hidden_size, self.cfg.qkv_hidden_size, self.cfg.head_dim());
        let heads = self.cfg.vt_num_attention_heads;
        let mut h = vec![0f32; n * d];
        norm_rows(x, &b.norm0, BLOCK_NORM_EPS, &mut h);
        let mut qkv = vec![0f32; n * 3 * q];
        par::matmul(&b.wqkv, &h, &mut qkv);
        let pairs = hd / 2;
        for (t, row) in qkv.chunks_exact_mut(3 * q).enumerate() {
            let r = &rot[t * pairs..][..pairs];
            for head in row[..2 * q].chunks_exact_mut(hd) {
                pos::rotate(head, r);
            }
        }
        let att = attention::attend(&qkv, n, heads, hd);
        let mut o = vec![0f32; n * d];
        par::matmul(&b.wo, &att, &mut o);
        x.iter_mut().zip(&o).for_each(|(a, v)| *a += v);
        norm_rows(x, &b.norm1, BLOCK_NORM_EPS, &mut h);
        let m = self.cfg.vt_intermediate_size;
        let mut mid = vec![0f32; n * m];
        par::matmul(&b.fc0, &h, &mut mid);
        mid.iter_mut().for_each(|v| *v = gelu_tanh(*v));
        par::matmul(&b.fc1, &mid, &mut o);
        x.iter_mut().zip(&o).for_each(|(a, v)| *a += v);
    }
}

/// The tower part way through an image.
#[derive(Debug)]
pub struct TowerRun<'t, 'a> {
    tower: &'t Tower<'a>,
    x: Vec<f32>,
    n: usize,
    rot: Vec<(f32, f32)>,
    grid: (usize, usize),
    next: usize,
}

impl TowerRun<'_, '_> {
    /// Runs the next block; false when none is left.
    pub fn step(&mut self) -> bool {
        let Some(b) = self.tower.w.blocks.get(self.next) else { return false };
        self.tower.block(b, &mut self.x, self.n, &self.rot);
        self.next += 1;
        self.next < self.tower.w.blocks.len()
    }

    /// Blocks not yet run.
    pub fn blocks_left(&self) -> usize {
        self.tower.w.blocks.len() - self.next
    }

    /// The final norm and the 2 x 2 merge (after every block).
    pub fn merged(mut self) -> Vec<f32> {
        while self.blocks_left() > 0 {
            self.step();
        }
        let d = self.tower.cfg.vt_hidden_size;
        let mut normed = vec![0f32; self.n * d];
        norm_rows(&self.x, &self.tower.w.final_norm, BLOCK_NORM_EPS, &mut normed);
        merge(&normed, self.grid.0, self.grid.1, d)
    }

    /// The image's prompt rows: the rest of the tower, then the projector.
    pub fn finish(self) -> Vec<f32> {
        let tower = self.tower;
        tower.project(&self.merged())
    }
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        rms_norm(xr, w, eps, or);
    }
}

/// Groups of 2 x 2 patches side by side (`tpool_patch_merger` for one frame): merged row
/// `(i, j)` holds patches `(2i, 2j), (2i, 2j+1), (2i+1, 2j), (2i+1, 2j+1)`.
fn merge(x: &[f32], gh: usize, gw: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for i in 0..gh / 2 {
        for j in 0..gw / 2 {
            for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                out.extend_from_slice(&x[((2 * i + a) * gw + 2 * j + b) * d..][..d]);
            }
        }
    }
    out
}

/// `gelu(x, approximate="tanh")`.
fn gelu_tanh(x: f32) -> f32 {
    let x64 = f64::from(x);
    (0.5 * x64 * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64 * x64 * x64)).tanh())) as f32
}

/// `nn.GELU()`: `x * Phi(x)` with the exact error function.
fn gelu_erf(x: f32) -> f32 {
    let x64 = f64::from(x);
    (0.5 * x64 * (1.0 + erf(x64 / std::f64::consts::SQRT_2))) as f32
}

/// The error function to ~1e-15 (W. J. Cody's rational approximations are overkill here; the
/// Taylor series near zero and the continued fraction of erfc beyond 2 meet well inside f32).
fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 2.5 {
        // erf(a) = 2/sqrt(pi) * sum (-1)^n a^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, a2) = (a, a, a * a);
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...)))), evaluated backwards.
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (f64::from(k) / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    r.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun, table 7.1.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
        ] {
            assert!((erf(x) - want).abs() < 1e-12, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-12);
        }
    }

    #[test]
    fn merge_puts_each_square_of_four_patches_in_one_row() {
        // A 2 x 4 grid of 1-wide patches numbered row-major.
        let x: Vec<f32> = (0..8).map(|v| v as f32).collect();
        assert_eq!(merge(&x, 2, 4, 1), [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
    }
}
