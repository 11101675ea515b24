//! Checkpoint tensor names, spelled once: the tensor table (`tensors`), loading (`model::build`),
//! conversion and `synth` all take them from here.

pub const EMBED: &str = "model.embed_tokens.weight";
pub const LM_HEAD: &str = "lm_head.weight";
pub const NORM: &str = "model.norm.weight";
/// K3's final AttnRes mix.
pub const OUT_RES_NORM: &str = "model.output_attn_res_norm.weight";
pub const OUT_RES_PROJ: &str = "model.output_attn_res_proj.weight";

/// The three matrices of a routed expert: w1 (gate), w2 (down), w3 (up).
pub const EXPERT_MATRICES: [&str; 3] = ["w1", "w2", "w3"];

fn layer(i: u32, s: &str) -> String {
    format!("model.layers.{i}.{s}")
}

/// Matrix `w` of routed expert `expert` in `layer` (without the `.weight` / `.weight_packed`
/// suffix, which depends on how the checkpoint stores it).
pub fn expert(layer: u32, expert: u32, w: &str) -> String {
    format!("model.layers.{layer}.block_sparse_moe.experts.{expert}.{w}")
}

/// The (layer, expert) a routed expert's tensor name belongs to (the inverse of [`expert`]).
pub fn parse_expert(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("block_sparse_moe.experts.")?;
    let (expert, _) = rest.split_once('.')?;
    Some((layer.parse().ok()?, expert.parse().ok()?))
}

/// The layer a `model.layers.L.*` tensor belongs to.
pub fn layer_of(name: &str) -> Option<u32> {
    name.strip_prefix("model.layers.")?.split_once('.')?.0.parse().ok()
}

/// A checkpoint tensor's name as k3 stores it. DeepSeek-V3 and Kimi K2 name a MoE layer's tensors
/// `mlp.gate`, `mlp.experts.E.{gate,up,down}_proj` and `mlp.shared_experts`; Kimi's names (used
/// throughout) are `block_sparse_moe.gate`, `block_sparse_moe.experts.E.{w1,w3,w2}` and
/// `block_sparse_moe.shared_experts`. Other names are kept.
pub fn canonical(name: &str) -> String {
    let Some((head, rest)) = name.split_once(".mlp.") else { return name.to_string() };
    if let Some(rest) = rest.strip_prefix("experts.") {
        let renamed = rest.split_once('.').and_then(|(e, m)| {
            let (w, tail) = m.split_once('.').unwrap_or((m, ""));
            let w = match w {
                "gate_proj" => "w1",
                "down_proj" => "w2",
                "up_proj" => "w3",
                _ => return None,
            };
            Some(format!("{head}.block_sparse_moe.experts.{e}.{w}{}{tail}", if tail.is_empty() { "" } else { "." }))
        });
        return renamed.unwrap_or_else(|| name.to_string());
    }
    if rest.starts_with("gate.") || rest.starts_with("shared_experts.") {
        return format!("{head}.block_sparse_moe.{rest}");
    }
    name.to_string()
}

/// What every layer has: its norms and (K3) its AttnRes score vectors.
#[derive(Debug, Clone)]
pub struct LayerNames {
    pub input_norm: String,
    pub post_norm: String,
    pub att_res_norm: String,
    pub att_res_proj: String,
    pub mlp_res_norm: String,
    pub mlp_res_proj: String,
}

impl LayerNames {
    pub fn of(i: u32) -> Self {
        LayerNames {
            input_norm: layer(i, "input_layernorm.weight"),
            post_norm: layer(i, "post_attention_layernorm.weight"),
            att_res_norm: layer(i, "self_attention_res_norm.weight"),
            att_res_proj: layer(i, "self_attention_res_proj.weight"),
            mlp_res_norm: layer(i, "mlp_res_norm.weight"),
            mlp_res_proj: layer(i, "mlp_res_proj.weight"),
        }
    }
}

/// A KDA layer's tensors.
#[derive(Debug, Clone)]
pub struct KdaNames {
    pub q_proj: String,
    pub k_proj: String,
    pub v_proj: String,
    pub q_conv: String,
    pub k_conv: String,
    pub v_conv: String,
    pub a_log: String,
    pub dt_bias: String,
    pub f_a: String,
    pub f_b: String,
    pub b_proj: String,
    pub o_norm: String,
    /// K3's full-rank output gate.
    pub g_proj: String,
    /// Kimi-Linear's low-rank output gate.
    pub g_a: String,
    pub g_b: String,
    pub o_proj: String,
}

impl KdaNames {
    pub fn of(i: u32) -> Self {
        let a = |s: &str| layer(i, &format!("self_attn.{s}"));
        KdaNames {
            q_proj: a("q_proj.weight"),
            k_proj: a("k_proj.weight"),
            v_proj: a("v_proj.weight"),
            q_conv: a("q_conv1d.weight"),
            k_conv: a("k_conv1d.weight"),
            v_conv: a("v_conv1d.weight"),
            a_log: a("A_log"),
            dt_bias: a("dt_bias"),
            f_a: a("f_a_proj.weight"),
            f_b: a("f_b_proj.weight"),
            b_proj: a("b_proj.weight"),
            o_norm: a("o_norm.weight"),
            g_proj: a("g_proj.weight"),
            g_a: a("g_a_proj.weight"),
            g_b: a("g_b_proj.weight"),
            o_proj: a("o_proj.weight"),
        }
    }
}

/// An MLA layer's tensors.
#[derive(Debug, Clone)]
pub struct MlaNames {
    /// The low-rank query path (K3).
    pub q_a: String,
    pub q_a_norm: String,
    pub q_b: String,
    /// The direct query (Kimi-Linear).
    pub q_proj: String,
    pub kv_a: String,
    pub kv_a_norm: String,
    pub kv_b: String,
    pub g_proj: String,
    pub o_proj: String,
}

impl MlaNames {
    pub fn of(i: u32) -> Self {
        let a = |s: &str| layer(i, &format!("self_attn.{s}"));
        MlaNames {
            q_a: a("q_a_proj.weight"),
            q_a_norm: a("q_a_layernorm.weight"),
            q_b: a("q_b_proj.weight"),
            q_proj: a("q_proj.weight"),
            kv_a: a("kv_a_proj_with_mqa.weight"),
            kv_a_norm: a("kv_a_layernorm.weight"),
            kv_b: a("kv_b_proj.weight"),
            g_proj: a("g_proj.weight"),
            o_proj: a("o_proj.weight"),
        }
    }
}

/// A gated MLP: the dense layer's, or the MoE layer's shared experts.
#[derive(Debug, Clone)]
pub struct MlpNames {
    pub gate: String,
    pub up: String,
    pub down: String,
}

impl MlpNames {
    fn under(prefix: String) -> Self {
        MlpNames {
            gate: format!("{prefix}.gate_proj.weight"),
            up: format!("{prefix}.up_proj.weight"),
            down: format!("{prefix}.down_proj.weight"),
        }
    }

    /// The dense MLP of layer `i`.
    pub fn dense(i: u32) -> Self {
        Self::under(layer(i, "mlp"))
    }
}

/// A MoE layer's resident tensors (the experts are records).
#[derive(Debug, Clone)]
pub struct MoeNames {
    pub gate: String,
    pub bias: String,
    /// K3's LatentMoE projections and norm.
    pub latent_down: String,
    pub latent_norm: String,
    pub latent_up: String,
    pub shared: MlpNames,
}

impl MoeNames {
    pub fn of(i: u32) -> Self {
        let m = |s: &str| layer(i, &format!("block_sparse_moe.{s}"));
        MoeNames {
            gate: m("gate.weight"),
            bias: m("gate.e_score_correction_bias"),
            latent_down: m("routed_expert_down_proj.weight"),
            latent_norm: m("routed_expert_norm.weight"),
            latent_up: m("routed_expert_up_proj.weight"),
            shared: MlpNames::under(m("shared_experts")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepseek_moe_names_become_kimis() {
        let c = |n: &str| canonical(n);
        assert_eq!(
            c("model.layers.3.mlp.experts.17.gate_proj.weight"),
            "model.layers.3.block_sparse_moe.experts.17.w1.weight"
        );
        assert_eq!(
            c("model.layers.3.mlp.experts.17.up_proj.weight_packed"),
            "model.layers.3.block_sparse_moe.experts.17.w3.weight_packed"
        );
        assert_eq!(
            c("model.layers.3.mlp.experts.0.down_proj.weight_scale_inv"),
            "model.layers.3.block_sparse_moe.experts.0.w2.weight_scale_inv"
        );
        assert_eq!(
            c("model.layers.3.mlp.gate.e_score_correction_bias"),
            "model.layers.3.block_sparse_moe.gate.e_score_correction_bias"
        );
        assert_eq!(
            c("model.layers.3.mlp.shared_experts.up_proj.weight"),
            "model.layers.3.block_sparse_moe.shared_experts.up_proj.weight"
        );
        // A dense layer's MLP and everything else keep their names.
        assert_eq!(c("model.layers.0.mlp.gate_proj.weight"), "model.layers.0.mlp.gate_proj.weight");
        assert_eq!(c("model.layers.0.self_attn.q_a_proj.weight"), "model.layers.0.self_attn.q_a_proj.weight");
        assert_eq!(layer_of("model.layers.61.embed_tokens.weight"), Some(61));
    }
}
