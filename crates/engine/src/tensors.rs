//! The checkpoint tensors of a model, with the shapes its config implies and how each may be
//! stored: one table per family, so conversion can refuse a wrong checkpoint before writing a
//! byte, naming the tensor that is wrong, and re-encodes only what may be re-encoded
//! (`docs/FORMAT.md` §4.3 states the policy; `../shared/notes/models.md` lists the same names).

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

/// How a trunk tensor may be stored when the trunk is re-encoded (`--trunk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// A projection matrix used in a matrix-vector product: takes the requested trunk encoding
    /// (f32, bf16, int8 rows, int4 groups).
    Matrix,
    /// Used transposed or per row (MLA's `kv_b_proj`, absorbed into the query and the output):
    /// f32 or bf16 only; int8 / int4 keep it as stored.
    Dense,
    /// The embedding table: rows are looked up, never multiplied: f32 or bf16 only.
    Table,
    /// Exact: what a small rounding turns into a different model — norms, router gates and their
    /// correction biases (they pick discrete experts), KDA's `A_log`, `dt_bias` and short
    /// convolutions (the decay and its window compound over every token), AttnRes projections
    /// (softmax scores that sit close together). Kept bit for bit at the source precision
    /// (`--trunk f32` widens them, which is exact).
    Exact,
}

/// The logical shapes of one routed expert's matrices (w1 gate, w2 down, w3 up), `[out, in]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertShapes {
    pub w1: [u64; 2],
    pub w2: [u64; 2],
    pub w3: [u64; 2],
}

/// One trunk tensor of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrunkEntry {
    pub name: String,
    pub expect: Expect,
    pub storage: Storage,
}

/// Every trunk tensor a model with this config has, with its expected shape and storage.
#[derive(Debug, Clone)]
pub struct TensorTable {
    pub trunk: Vec<TrunkEntry>,
    pub experts: ExpertShapes,
}

impl TensorTable {
    pub fn get(&self, name: &str) -> Option<&TrunkEntry> {
        self.trunk.iter().find(|e| e.name == name)
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

/// Collects the table's entries.
#[derive(Default)]
struct Entries(Vec<TrunkEntry>);

impl Entries {
    fn put(&mut self, name: String, expect: Expect, storage: Storage) {
        self.0.push(TrunkEntry { name, expect, storage });
    }

    /// A projection matrix `[out, in]`.
    fn matrix(&mut self, name: String, out: u64, inp: u64) {
        self.put(name, Expect::Shape(vec![out, inp]), Storage::Matrix);
    }

    /// An exact tensor of `n` values, in whatever shape the release stores them.
    fn exact(&mut self, name: String, n: u64) {
        self.put(name, Expect::Elements(vec![n]), Storage::Exact);
    }
}

/// The tensor table of `cfg` (read from `path`, named in errors).
pub fn table(cfg: &ModelConfig, path: &std::path::Path) -> Result<TensorTable, ConfigError> {
    let dims = Dims { t: &cfg.text, path };
    let (d, v) = (cfg.hidden, cfg.vocab);
    let k3 = cfg.family == Family::KimiK3;
    let mut t = Entries::default();
    t.put("model.embed_tokens.weight".into(), Expect::Shape(vec![v, d]), Storage::Table);
    t.matrix("lm_head.weight".into(), v, d);
    t.exact("model.norm.weight".into(), d);
    if k3 {
        t.exact("model.output_attn_res_norm.weight".into(), d);
        t.exact("model.output_attn_res_proj.weight".into(), d);
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
        t.exact(p("input_layernorm.weight"), d);
        t.exact(p("post_attention_layernorm.weight"), d);
        if k3 {
            for s in ["self_attention_res", "mlp_res"] {
                t.exact(p(&format!("{s}_norm.weight")), d);
                t.exact(p(&format!("{s}_proj.weight")), d);
            }
        }
        let a = |s: &str| p(&format!("self_attn.{s}"));
        if kda_layers.contains(&(u64::from(i) + 1)) {
            let (h, hd) = (dims.get(&lac, "num_heads")?, dims.get(&lac, "head_dim")?);
            let kern = lac.get("short_conv_kernel_size").and_then(Value::as_u64).unwrap_or(4);
            let c = h * hd;
            for s in ["q", "k", "v"] {
                t.matrix(a(&format!("{s}_proj.weight")), c, d);
                t.exact(a(&format!("{s}_conv1d.weight")), c * kern);
            }
            // K3 stores A_log as [head_dim], the per-head values zero-padded.
            let a_log = if hd > h { vec![h, hd] } else { vec![h] };
            t.put(a("A_log"), Expect::Elements(a_log), Storage::Exact);
            t.exact(a("dt_bias"), c);
            t.matrix(a("f_a_proj.weight"), hd, d);
            t.matrix(a("f_b_proj.weight"), c, hd);
            t.matrix(a("b_proj.weight"), h, d);
            t.exact(a("o_norm.weight"), hd);
            if lac.get("use_full_rank_gate").and_then(Value::as_bool).unwrap_or(false) {
                t.matrix(a("g_proj.weight"), c, d);
            } else {
                t.matrix(a("g_a_proj.weight"), hd, d);
                t.matrix(a("g_b_proj.weight"), c, hd);
            }
            t.matrix(a("o_proj.weight"), d, c);
        } else {
            let h = dims.text("num_attention_heads")?;
            let (nope, rope, vd) =
                (dims.text("qk_nope_head_dim")?, dims.text("qk_rope_head_dim")?, dims.text("v_head_dim")?);
            let kv_lora = dims.text("kv_lora_rank")?;
            match cfg.text.get("q_lora_rank").and_then(Value::as_u64) {
                Some(q) => {
                    t.matrix(a("q_a_proj.weight"), q, d);
                    t.exact(a("q_a_layernorm.weight"), q);
                    t.matrix(a("q_b_proj.weight"), h * (nope + rope), q);
                }
                None => t.matrix(a("q_proj.weight"), h * (nope + rope), d),
            }
            t.matrix(a("kv_a_proj_with_mqa.weight"), kv_lora + rope, d);
            t.exact(a("kv_a_layernorm.weight"), kv_lora);
            t.put(a("kv_b_proj.weight"), Expect::Shape(vec![h * (nope + vd), kv_lora]), Storage::Dense);
            if dims.flag("mla_use_output_gate") {
                t.matrix(a("g_proj.weight"), h * vd, d);
            }
            t.matrix(a("o_proj.weight"), d, h * vd);
        }
        if moe_layers.contains(&i) {
            let m = |s: &str| p(&format!("block_sparse_moe.{s}"));
            let e = u64::from(cfg.experts);
            t.put(m("gate.weight"), Expect::Shape(vec![e, d]), Storage::Exact);
            t.exact(m("gate.e_score_correction_bias"), e);
            if let Some(z) = latent {
                t.matrix(m("routed_expert_down_proj.weight"), z, d);
                t.exact(m("routed_expert_norm.weight"), z);
                t.matrix(m("routed_expert_up_proj.weight"), d, z);
            }
            let shared = cfg.text.get("num_shared_experts").and_then(Value::as_u64).unwrap_or(0);
            if shared > 0 {
                let w = shared * moe_inter;
                t.matrix(m("shared_experts.gate_proj.weight"), w, d);
                t.matrix(m("shared_experts.up_proj.weight"), w, d);
                t.matrix(m("shared_experts.down_proj.weight"), d, w);
            }
        } else {
            let inter = dims.text("intermediate_size")?;
            t.matrix(p("mlp.gate_proj.weight"), inter, d);
            t.matrix(p("mlp.up_proj.weight"), inter, d);
            t.matrix(p("mlp.down_proj.weight"), d, inter);
        }
    }
    let z = latent.unwrap_or(d);
    let experts = ExpertShapes { w1: [moe_inter, z], w2: [z, moe_inter], w3: [moe_inter, z] };
    Ok(TensorTable { trunk: t.0, experts })
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
