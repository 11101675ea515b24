//! The release's tensor names for the tower and projector, and what each is (so conversion can
//! check and store them, and the engine can find them, from one list).

use crate::VisionConfig;

/// How a tower tensor is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// A projection used in products: `[out, in]`.
    Matrix,
    /// Read as values (norms, the position table, the patch convolution): kept as stored.
    Values,
}

/// `vision_tower.encoder.blocks.{i}.{rest}`.
pub fn block(i: usize, rest: &str) -> String {
    format!("vision_tower.encoder.blocks.{i}.{rest}")
}

/// Every tensor of the tower and projector a model with `cfg` has, with its shape.
pub fn tensors(cfg: &VisionConfig) -> Vec<(String, Vec<u64>, TensorRole)> {
    let u = |v: usize| v as u64;
    let (d, q, m, p) = (u(cfg.vt_hidden_size), u(cfg.qkv_hidden_size), u(cfg.vt_intermediate_size), u(cfg.patch_size));
    let (mw, t) = (u(cfg.merged_width()), u(cfg.text_hidden_size));
    let mut out = vec![
        ("vision_tower.patch_embed.proj.weight".to_string(), vec![d, 3, p, p], TensorRole::Values),
        (
            "vision_tower.patch_embed.pos_emb.weight".to_string(),
            vec![u(cfg.init_pos_emb_height), u(cfg.init_pos_emb_width), d],
            TensorRole::Values,
        ),
    ];
    for i in 0..cfg.vt_num_hidden_layers {
        out.push((block(i, "norm0.weight"), vec![d], TensorRole::Values));
        out.push((block(i, "norm1.weight"), vec![d], TensorRole::Values));
        out.push((block(i, "wqkv.weight"), vec![3 * q, d], TensorRole::Matrix));
        out.push((block(i, "wo.weight"), vec![d, q], TensorRole::Matrix));
        out.push((block(i, "mlp.fc0.weight"), vec![m, d], TensorRole::Matrix));
        out.push((block(i, "mlp.fc1.weight"), vec![d, m], TensorRole::Matrix));
    }
    out.push(("vision_tower.encoder.final_layernorm.weight".to_string(), vec![d], TensorRole::Values));
    out.push(("mm_projector.proj.0.weight".to_string(), vec![mw, mw], TensorRole::Matrix));
    out.push(("mm_projector.proj.2.weight".to_string(), vec![t, mw], TensorRole::Matrix));
    out.push(("mm_projector.post_norm.weight".to_string(), vec![t], TensorRole::Values));
    out
}
