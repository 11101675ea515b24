//! The checkpoint tensors of a model, with the shapes its config implies: one table per family,
//! so conversion can refuse a wrong checkpoint before writing a byte, naming the tensor that is
//! wrong (`docs/FORMAT.md` and `../shared/notes/models.md` list the same names).

use serde_json::Value;

use crate::config::{ConfigError, Family, ModelConfig};

/// What a tensor must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Exactly this shape (`[out, in]` for a matrix).
    Shape(Vec<u64>),
    /// Any shape holding one of these element counts (small vectors stored as `[n]`, `[1, n]`,
    /// `[n, 1, k]` or zero-padded, as releases do).
    Elements(Vec<u64>),
}

impl Expect {
    pub fn accepts(&self, shape: &[u64]) -> bool {
        match self {
            Expect::Shape(s) => s == shape,
            Expect::Elements(counts) => counts.contains(&shape.iter().product()),
        }
    }
}

impl std::fmt::Display for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expect::Shape(s) => write!(f, "shape {s:?}"),
            Expect::Elements(c) if c.len() == 1 => write!(f, "{} elements", c[0]),
            Expect::Elements(c) => write!(f, "one of {c:?} elements"),
        }
    }
}

/// The logical shapes of one routed expert's matrices (w1 gate, w2 down, w3 up), `[out, in]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertShapes {
    pub w1: [u64; 2],
    pub w2: [u64; 2],
    pub w3: [u64; 2],
}

/// Every trunk tensor a model with this config has, with its expected shape.
#[derive(Debug, Clone)]
pub struct TensorTable {
    pub trunk: Vec<(String, Expect)>,
    pub experts: ExpertShapes,
}

impl TensorTable {
    pub fn get(&self, name: &str) -> Option<&Expect> {
        self.trunk.iter().find(|(n, _)| n == name).map(|(_, e)| e)
    }
}

/// The config's numbers the table needs.
struct Dims<'a> {
    t: &'a Value,
    path: &'a std::path::Path,
}

impl Dims<'_> {
    fn get(&self, v: &Value, key: &str) -> Result<u64, ConfigError> {
        v.get(key).and_then(Value::as_u64).ok_or_else(|| ConfigError {
            path: self.path.to_path_buf(),
            reason: format!("missing or non-integer field `{key}`"),
        })
    }

    fn text(&self, key: &str) -> Result<u64, ConfigError> {
        self.get(self.t, key)
    }

    fn flag(&self, key: &str) -> bool {
        self.t.get(key).and_then(Value::as_bool).unwrap_or(false)
    }
}

/// The tensor table of `cfg` (read from `path`, named in errors).
pub fn table(cfg: &ModelConfig, path: &std::path::Path) -> Result<TensorTable, ConfigError> {
    let dims = Dims { t: &cfg.text, path };
    let (d, v) = (cfg.hidden, cfg.vocab);
    let k3 = cfg.family == Family::KimiK3;
    let mut trunk: Vec<(String, Expect)> = Vec::new();
    let mut add = |name: String, e: Expect| trunk.push((name, e));
    let vec_of = |n: u64| Expect::Elements(vec![n]);
    add("model.embed_tokens.weight".into(), Expect::Shape(vec![v, d]));
    add("lm_head.weight".into(), Expect::Shape(vec![v, d]));
    add("model.norm.weight".into(), vec_of(d));
    if k3 {
        add("model.output_attn_res_norm.weight".into(), vec_of(d));
        add("model.output_attn_res_proj.weight".into(), vec_of(d));
    }
    let lac = cfg.text.get("linear_attn_config").cloned().unwrap_or(Value::Null);
    let kda_layers: Vec<u64> = lac
        .get("kda_layers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let moe_layers = cfg.moe_layers();
    let latent = cfg.text.get("routed_expert_hidden_size").and_then(Value::as_u64);
    let moe_inter = if moe_layers.is_empty() { 0 } else { dims.text("moe_intermediate_size")? };
    for i in 0..cfg.layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        add(p("input_layernorm.weight"), vec_of(d));
        add(p("post_attention_layernorm.weight"), vec_of(d));
        if k3 {
            for s in ["self_attention_res", "mlp_res"] {
                add(p(&format!("{s}_norm.weight")), vec_of(d));
                add(p(&format!("{s}_proj.weight")), vec_of(d));
            }
        }
        let a = |s: &str| p(&format!("self_attn.{s}"));
        if kda_layers.contains(&(u64::from(i) + 1)) {
            let (h, hd) = (dims.get(&lac, "num_heads")?, dims.get(&lac, "head_dim")?);
            let kern = lac.get("short_conv_kernel_size").and_then(Value::as_u64).unwrap_or(4);
            let c = h * hd;
            for s in ["q", "k", "v"] {
                add(a(&format!("{s}_proj.weight")), Expect::Shape(vec![c, d]));
                add(a(&format!("{s}_conv1d.weight")), vec_of(c * kern));
            }
            // K3 stores A_log as [head_dim], the per-head values zero-padded.
            add(a("A_log"), Expect::Elements(if hd > h { vec![h, hd] } else { vec![h] }));
            add(a("dt_bias"), vec_of(c));
            add(a("f_a_proj.weight"), Expect::Shape(vec![hd, d]));
            add(a("f_b_proj.weight"), Expect::Shape(vec![c, hd]));
            add(a("b_proj.weight"), Expect::Shape(vec![h, d]));
            add(a("o_norm.weight"), vec_of(hd));
            if lac.get("use_full_rank_gate").and_then(Value::as_bool).unwrap_or(false) {
                add(a("g_proj.weight"), Expect::Shape(vec![c, d]));
            } else {
                add(a("g_a_proj.weight"), Expect::Shape(vec![hd, d]));
                add(a("g_b_proj.weight"), Expect::Shape(vec![c, hd]));
            }
            add(a("o_proj.weight"), Expect::Shape(vec![d, c]));
        } else {
            let h = dims.text("num_attention_heads")?;
            let (nope, rope, vd) =
                (dims.text("qk_nope_head_dim")?, dims.text("qk_rope_head_dim")?, dims.text("v_head_dim")?);
            let kv_lora = dims.text("kv_lora_rank")?;
            match cfg.text.get("q_lora_rank").and_then(Value::as_u64) {
                Some(q) => {
                    add(a("q_a_proj.weight"), Expect::Shape(vec![q, d]));
                    add(a("q_a_layernorm.weight"), vec_of(q));
                    add(a("q_b_proj.weight"), Expect::Shape(vec![h * (nope + rope), q]));
                }
                None => add(a("q_proj.weight"), Expect::Shape(vec![h * (nope + rope), d])),
            }
            add(a("kv_a_proj_with_mqa.weight"), Expect::Shape(vec![kv_lora + rope, d]));
            add(a("kv_a_layernorm.weight"), vec_of(kv_lora));
            add(a("kv_b_proj.weight"), Expect::Shape(vec![h * (nope + vd), kv_lora]));
            if dims.flag("mla_use_output_gate") {
                add(a("g_proj.weight"), Expect::Shape(vec![h * vd, d]));
            }
            add(a("o_proj.weight"), Expect::Shape(vec![d, h * vd]));
        }
        if moe_layers.contains(&i) {
            let m = |s: &str| p(&format!("block_sparse_moe.{s}"));
            let e = u64::from(cfg.experts);
            add(m("gate.weight"), Expect::Shape(vec![e, d]));
            add(m("gate.e_score_correction_bias"), vec_of(e));
            if let Some(z) = latent {
                add(m("routed_expert_down_proj.weight"), Expect::Shape(vec![z, d]));
                add(m("routed_expert_norm.weight"), vec_of(z));
                add(m("routed_expert_up_proj.weight"), Expect::Shape(vec![d, z]));
            }
            let shared = cfg.text.get("num_shared_experts").and_then(Value::as_u64).unwrap_or(0);
            if shared > 0 {
                let w = shared * moe_inter;
                add(m("shared_experts.gate_proj.weight"), Expect::Shape(vec![w, d]));
                add(m("shared_experts.up_proj.weight"), Expect::Shape(vec![w, d]));
                add(m("shared_experts.down_proj.weight"), Expect::Shape(vec![d, w]));
            }
        } else {
            let inter = dims.text("intermediate_size")?;
            add(p("mlp.gate_proj.weight"), Expect::Shape(vec![inter, d]));
            add(p("mlp.up_proj.weight"), Expect::Shape(vec![inter, d]));
            add(p("mlp.down_proj.weight"), Expect::Shape(vec![d, inter]));
        }
    }
    let z = latent.unwrap_or(d);
    let experts = ExpertShapes { w1: [moe_inter, z], w2: [z, moe_inter], w3: [moe_inter, z] };
    Ok(TensorTable { trunk, experts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_counts_accept_any_layout_of_the_values() {
        let e = Expect::Elements(vec![4, 128]);
        assert!(e.accepts(&[4]) && e.accepts(&[1, 1, 4, 1]) && e.accepts(&[128]));
        assert!(!e.accepts(&[5]));
        assert!(Expect::Shape(vec![2, 3]).accepts(&[2, 3]) && !Expect::Shape(vec![2, 3]).accepts(&[3, 2]));
    }
}
