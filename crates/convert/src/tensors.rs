//! The checkpoint tensors of a model, with the shapes its config implies and how each may be
//! stored: one table per family, so conversion can refuse a wrong checkpoint before writing a
//! byte, naming the tensor that is wrong, and re-encodes only what may be re-encoded
//! (`docs/FORMAT.md` §4.3 states the policy; `../shared/notes/models.md` lists the same names).

use k3_engine::config::{KdaDims, MlaDims, ModelConfig};
use k3_engine::names::{self, KdaNames, LayerNames, MlaNames, MlpNames, MoeNames};

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

/// Collects the table's entries.
#[derive(Default)]
struct Entries(Vec<TrunkEntry>);

impl Entries {
    fn put(&mut self, name: &str, expect: Expect, storage: Storage) {
        self.0.push(TrunkEntry { name: name.to_string(), expect, storage });
    }

    /// A projection matrix `[out, in]`.
    fn matrix(&mut self, name: &str, out: usize, inp: usize) {
        self.put(name, Expect::Shape(vec![out as u64, inp as u64]), Storage::Matrix);
    }

    /// An exact tensor of `n` values, in whatever shape the release stores them.
    fn exact(&mut self, name: &str, n: usize) {
        self.put(name, Expect::Elements(vec![n as u64]), Storage::Exact);
    }

    fn mlp(&mut self, n: &MlpNames, inter: usize, d: usize) {
        self.matrix(&n.gate, inter, d);
        self.matrix(&n.up, inter, d);
        self.matrix(&n.down, d, inter);
    }
}

/// The tensor table of `cfg`.
pub fn table(cfg: &ModelConfig) -> TensorTable {
    let (d, v) = (cfg.hidden as usize, cfg.vocab as usize);
    let mut t = Entries::default();
    t.put(names::EMBED, Expect::Shape(vec![v as u64, d as u64]), Storage::Table);
    t.matrix(names::LM_HEAD, v, d);
    t.exact(names::NORM, d);
    if cfg.attn_res_block.is_some() {
        t.exact(names::OUT_RES_NORM, d);
        t.exact(names::OUT_RES_PROJ, d);
    }
    let moe_layers = cfg.moe_layers();
    for i in 0..cfg.layers {
        let l = LayerNames::of(i);
        t.exact(&l.input_norm, d);
        t.exact(&l.post_norm, d);
        if cfg.attn_res_block.is_some() {
            for n in [&l.att_res_norm, &l.att_res_proj, &l.mlp_res_norm, &l.mlp_res_proj] {
                t.exact(n, d);
            }
        }
        match (cfg.is_kda(i), cfg.kda, cfg.mla) {
            (true, Some(k), _) => kda(&mut t, &KdaNames::of(i), k, d),
            (false, _, Some(m)) => mla(&mut t, &MlaNames::of(i), m, d),
            // The config check guarantees the dimensions of every layer kind it has.
            _ => {}
        }
        match (moe_layers.contains(&i), cfg.moe) {
            (true, Some(m)) => {
                let n = MoeNames::of(i);
                t.put(&n.gate, Expect::Shape(vec![m.experts as u64, d as u64]), Storage::Exact);
                t.exact(&n.bias, m.experts);
                if let Some(z) = m.latent {
                    t.matrix(&n.latent_down, z, d);
                    t.exact(&n.latent_norm, z);
                    t.matrix(&n.latent_up, d, z);
                }
                if m.shared > 0 {
                    t.mlp(&n.shared, m.shared * m.inter, d);
                }
            }
            _ => t.mlp(&MlpNames::dense(i), cfg.dense_inter.unwrap_or(0), d),
        }
    }
    if let Some(v) = &cfg.vision {
        // The tower's projections take the trunk's encoding; norms, positions and the patch
        // convolution stay exact.
        for (name, shape, role) in k3_vision::tower::tensors(&v.tower) {
            let storage = match role {
                k3_vision::tower::TensorRole::Matrix => Storage::Matrix,
                k3_vision::tower::TensorRole::Values => Storage::Exact,
            };
            t.put(&name, Expect::Shape(shape), storage);
        }
    }
    let (inter, z) = cfg.moe.map_or((0, d), |m| (m.inter, m.latent.unwrap_or(d)));
    let (inter, z) = (inter as u64, z as u64);
    TensorTable { trunk: t.0, experts: ExpertShapes { w1: [inter, z], w2: [z, inter], w3: [inter, z] } }
}

fn kda(t: &mut Entries, n: &KdaNames, k: KdaDims, d: usize) {
    let (h, hd) = (k.heads, k.head_dim);
    let c = h * hd;
    for (proj, conv) in [(&n.q_proj, &n.q_conv), (&n.k_proj, &n.k_conv), (&n.v_proj, &n.v_conv)] {
        t.matrix(proj, c, d);
        t.exact(conv, c * k.conv_kernel);
    }
    // K3 stores A_log as [head_dim], the per-head values zero-padded.
    let a_log = if hd > h { vec![h as u64, hd as u64] } else { vec![h as u64] };
    t.put(&n.a_log, Expect::Elements(a_log), Storage::Exact);
    t.exact(&n.dt_bias, c);
    t.matrix(&n.f_a, hd, d);
    t.matrix(&n.f_b, c, hd);
    t.matrix(&n.b_proj, h, d);
    t.exact(&n.o_norm, hd);
    if k.full_rank_gate {
        t.matrix(&n.g_proj, c, d);
    } else {
        t.matrix(&n.g_a, hd, d);
        t.matrix(&n.g_b, c, hd);
    }
    t.matrix(&n.o_proj, d, c);
}

fn mla(t: &mut Entries, n: &MlaNames, m: MlaDims, d: usize) {
    let q_out = m.heads * (m.nope + m.rope);
    match m.q_lora {
        Some(q) => {
            t.matrix(&n.q_a, q, d);
            t.exact(&n.q_a_norm, q);
            t.matrix(&n.q_b, q_out, q);
        }
        None => t.matrix(&n.q_proj, q_out, d),
    }
    t.matrix(&n.kv_a, m.kv_lora + m.rope, d);
    t.exact(&n.kv_a_norm, m.kv_lora);
    t.put(&n.kv_b, Expect::Shape(vec![(m.heads * (m.nope + m.v_dim)) as u64, m.kv_lora as u64]), Storage::Dense);
    if m.output_gate {
        t.matrix(&n.g_proj, m.heads * m.v_dim, d);
    }
    t.matrix(&n.o_proj, d, m.heads * m.v_dim);
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
