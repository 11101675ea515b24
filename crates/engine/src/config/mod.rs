//! The model's `config.json`, typed: the text model's fields (from `text_config` when present, as
//! K3 nests them, else the root object, as Kimi-Linear has them) read with serde, then checked per
//! family into the dimensions each kind of layer needs, so nothing downstream reads JSON or meets
//! a missing field.

mod check;
mod k31;
mod vision;

pub use vision::Vision;

use std::path::{Path, PathBuf};

use k3_attn::mla::{PositionEmbedding, Rope, Yarn};
use k31::K31_MODEL_TYPE;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct ConfigError {
    pub path: PathBuf,
    pub reason: String,
}

/// Model families the engine knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    KimiK3,
    KimiLinear,
    /// Kimi K2 (`kimi_k2`) and DeepSeek-V3 (`deepseek_v3`): MLA with RoPE on every layer, a dense
    /// prefix, sigmoid-scored MoE.
    DeepseekV3,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::KimiK3 => "kimi_k3",
            Family::KimiLinear => "kimi_linear",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }
}

/// `rope_scaling` (the releases' config.json) or `rope_parameters` (transformers 5).
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub factor: Option<f64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub mscale: Option<f64>,
    pub mscale_all_dim: Option<f64>,
    pub original_max_position_embeddings: Option<u64>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn one_f() -> f64 {
    1.0
}

fn default_eps() -> f64 {
    1e-5
}

/// `eos_token_id`: one id or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn ids(&self) -> Vec<u32> {
        match self {
            TokenIds::One(i) => vec![*i],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// `linear_attn_config`: which layers are KDA, and their shape.
#[derive(Debug, Clone, Deserialize)]
pub struct LinearAttnConfig {
    /// 1-based.
    #[serde(default)]
    pub kda_layers: Vec<u32>,
    pub num_heads: Option<u32>,
    pub head_dim: Option<u32>,
    #[serde(default = "four")]
    pub short_conv_kernel_size: u32,
    /// K3's gate form (`-b sigmoid(...)`); absent: Kimi-Linear's softplus form.
    pub gate_lower_bound: Option<f64>,
    #[serde(default)]
    pub use_full_rank_gate: bool,
}

fn four() -> u32 {
    4
}

/// The text model's fields as `config.json` spells them (unknown fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    pub hidden_size: u64,
    pub num_hidden_layers: u32,
    pub vocab_size: u64,
    pub intermediate_size: Option<u64>,
    #[serde(default)]
    pub first_k_dense_replace: u32,
    #[serde(default = "one")]
    pub moe_layer_freq: u32,
    #[serde(default, alias = "n_routed_experts")]
    pub num_experts: u32,
    #[serde(default, alias = "num_experts_per_tok")]
    pub num_experts_per_token: u32,
    pub moe_intermediate_size: Option<u64>,
    /// LatentMoE (K3): the width routed experts work in.
    pub routed_expert_hidden_size: Option<u64>,
    #[serde(default, alias = "n_shared_experts")]
    pub num_shared_experts: u32,
    #[serde(default = "one", alias = "n_group")]
    pub num_expert_group: u32,
    #[serde(default = "one")]
    pub topk_group: u32,
    #[serde(default = "yes", alias = "norm_topk_prob")]
    pub moe_renormalize: bool,
    /// DeepSeek's expert scoring: only `sigmoid` is supported.
    pub scoring_func: Option<String>,
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    /// k3's own: a synthetic model routed by a process (see `k3_router::synthetic`).
    pub k3_synthetic_routing: Option<SyntheticRouting>,
    pub num_attention_heads: Option<u32>,
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: Option<u64>,
    pub qk_nope_head_dim: Option<u64>,
    pub qk_rope_head_dim: Option<u64>,
    pub v_head_dim: Option<u64>,
    #[serde(default)]
    pub mla_use_output_gate: bool,
    pub hidden_act: Option<String>,
    pub activation_situ_beta: Option<f64>,
    pub activation_situ_linear_beta: Option<f64>,
    /// AttnRes (K3): layers per block.
    pub attn_res_block_size: Option<u64>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    pub linear_attn_config: Option<LinearAttnConfig>,
    pub eos_token_id: Option<TokenIds>,
    #[serde(alias = "model_max_length")]
    pub max_position_embeddings: Option<u64>,
    pub rope_theta: Option<f64>,
    #[serde(alias = "rope_parameters")]
    pub rope_scaling: Option<RopeScaling>,
    /// DeepSeek-V3's multi-token-prediction layers (after the model's own): not run.
    #[serde(default)]
    pub num_nextn_predict_layers: u32,
    /// Which spelling of each two-named field the file used (errors name the field as written).
    #[serde(skip)]
    pub spelling: Spelling,
}

/// The fields `config.json` may spell two ways: k3's name (the serde field) and the other
/// releases' (the serde alias).
const ALIASES: [(&str, &str); 7] = [
    ("num_experts", "n_routed_experts"),
    ("num_experts_per_token", "num_experts_per_tok"),
    ("num_shared_experts", "n_shared_experts"),
    ("num_expert_group", "n_group"),
    ("moe_renormalize", "norm_topk_prob"),
    ("max_position_embeddings", "model_max_length"),
    ("rope_scaling", "rope_parameters"),
];

/// The aliases a config's text fields were written with.
#[derive(Debug, Clone, Default)]
pub struct Spelling(Vec<(&'static str, &'static str)>);

impl Spelling {
    /// The aliases among `text`'s keys.
    fn of(text: &serde_json::Value) -> Spelling {
        let written = |k: &str| text.get(k).is_some();
        Spelling(ALIASES.iter().copied().filter(|&(name, alias)| written(alias) && !written(name)).collect())
    }

    /// `name` (k3's field, or a dotted path under one) as the file writes it: `num_expert_group`
    /// is `n_group` in a DeepSeek-V3 config, `rope_scaling.factor` may be `rope_parameters.factor`.
    pub fn key(&self, name: &str) -> String {
        let (head, rest) = name.split_once('.').map_or((name, None), |(h, r)| (h, Some(r)));
        let head = self.0.iter().find(|(n, _)| *n == head).map_or(head, |(_, alias)| alias);
        match rest {
            Some(r) => format!("{head}.{r}"),
            None => head.to_string(),
        }
    }
}

/// The root object: the family, and where the text model's fields are.
#[derive(Debug, Deserialize)]
struct Root {
    #[serde(default)]
    model_type: String,
    text_config: Option<serde_json::Value>,
    eos_token_id: Option<TokenIds>,
    vision_config: Option<serde_json::Value>,
    media_placeholder_token_id: Option<u32>,
}

/// A KDA layer's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaDims {
    pub heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    /// `Some(b)`: K3's `-b sigmoid` gate; `None`: Kimi-Linear's softplus gate.
    pub gate_lower_bound: Option<f32>,
    /// K3's full-rank output gate, else low-rank `g_a`/`g_b`.
    pub full_rank_gate: bool,
}

/// An MLA layer's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub heads: usize,
    /// `None`: a direct `q_proj`.
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v_dim: usize,
    pub output_gate: bool,
}

/// The routed experts' shape and routing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeDims {
    pub experts: usize,
    pub top_k: usize,
    /// Each expert's own width.
    pub inter: usize,
    /// LatentMoE's width (K3), else `None`: experts work on the hidden state.
    pub latent: Option<usize>,
    pub shared: usize,
    pub groups: usize,
    pub top_groups: usize,
    pub renormalize: bool,
    pub scaling: f32,
    /// A synthetic model's K3-like routing process and its seed (config.json's
    /// `k3_synthetic_routing`), used instead of the router's weights.
    pub synthetic_routing: Option<u64>,
    /// Run-time routing knobs (not from config.json; `EngineOptions`): top-k reduction and
    /// top-p over the chosen experts' weights.
    pub keep: Option<usize>,
    pub top_p: Option<f32>,
}

/// A synthetic model's routing process (`"k3_synthetic_routing": {"model": "k3-like", "seed": N}`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticRouting {
    pub model: String,
    pub seed: u64,
}

/// The gated activation of every MLP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// K3's `beta tanh(g / beta) sigmoid(g) * lin_beta tanh(u / lin_beta)`.
    Situ { beta: f32, lin_beta: f32 },
    /// `silu(g) * u`.
    Silu,
}

/// A model's configuration, checked for its family.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub family: Family,
    pub layers: u32,
    pub hidden: u64,
    pub vocab: u64,
    pub experts: u32,
    pub experts_per_token: u32,
    pub first_k_dense_replace: u32,
    pub moe_layer_freq: u32,
    pub eps: f32,
    pub activation: Activation,
    /// K3's AttnRes block size.
    pub attn_res_block: Option<usize>,
    /// The dense MLP's width (layers before `first_k_dense_replace`).
    pub dense_inter: Option<usize>,
    /// 0-based KDA layers; every other layer is MLA.
    pub kda_layers: Vec<u32>,
    pub kda: Option<KdaDims>,
    pub mla: Option<MlaDims>,
    pub moe: Option<MoeDims>,
    /// End-of-message ids (the root's and the text config's).
    pub eos: Vec<u32>,
    /// The longest context the model was built for, if the config says.
    pub max_positions: Option<u64>,
    /// How positions enter MLA: none (Kimi) or RoPE, with YaRN when configured (DeepSeek-V3).
    pub positions: PositionEmbedding,
    /// The text model's fields as read.
    pub text: TextConfig,
    /// K3's vision tower, when the config has one.
    pub vision: Option<Vision>,
}

/// A required size field, or the error naming it.
fn required(v: Option<u64>, field: &str) -> Result<usize, String> {
    v.map(|x| x as usize).ok_or_else(|| format!("missing field `{field}`"))
}

impl TextConfig {
    fn mla_dims(&self) -> Result<MlaDims, String> {
        Ok(MlaDims {
            heads: required(self.num_attention_heads.map(u64::from), "num_attention_heads")?,
            q_lora: self.q_lora_rank.map(|q| q as usize),
            kv_lora: required(self.kv_lora_rank, "kv_lora_rank")?,
            nope: required(self.qk_nope_head_dim, "qk_nope_head_dim")?,
            rope: required(self.qk_rope_head_dim, "qk_rope_head_dim")?,
            v_dim: required(self.v_head_dim, "v_head_dim")?,
            output_gate: self.mla_use_output_gate,
        })
    }

    fn moe_dims(&self) -> Result<MoeDims, String> {
        Ok(MoeDims {
            experts: self.num_experts as usize,
            top_k: self.num_experts_per_token as usize,
            inter: required(self.moe_intermediate_size, "moe_intermediate_size")?,
            latent: self.routed_expert_hidden_size.map(|z| z as usize),
            shared: self.num_shared_experts as usize,
            groups: self.num_expert_group.max(1) as usize,
            top_groups: self.topk_group.max(1) as usize,
            renormalize: self.moe_renormalize,
            scaling: self.routed_scaling_factor as f32,
            synthetic_routing: match &self.k3_synthetic_routing {
                None => None,
                Some(s) if s.model == "k3-like" => Some(s.seed),
                Some(s) => {
                    return Err(format!("k3_synthetic_routing.model: `{}` (the one process is k3-like)", s.model));
                }
            },
            keep: None,
            top_p: None,
        })
    }

    /// DeepSeek-V3's RoPE: `rope_theta` (or `rope_parameters.rope_theta`), YaRN when
    /// `rope_scaling` says so; other scalings are refused by name.
    fn rope(&self) -> Result<PositionEmbedding, String> {
        let s = self.rope_scaling.as_ref();
        let theta = self.rope_theta.or(s.and_then(|s| s.rope_theta)).unwrap_or(10_000.0);
        let yarn = match s.and_then(|s| s.rope_type.as_deref()) {
            None | Some("default") => None,
            Some("yarn") => {
                let s = s.expect("a rope type comes from a rope_scaling");
                let rope = self.spelling.key("rope_scaling");
                let factor = s.factor.ok_or_else(|| format!("{rope}: yarn needs `factor`"))?;
                let original = s
                    .original_max_position_embeddings
                    .or(self.max_position_embeddings)
                    .ok_or_else(|| format!("{rope}: yarn needs `original_max_position_embeddings`"))?;
                Some(Yarn {
                    factor,
                    beta_fast: s.beta_fast.unwrap_or(32.0),
                    beta_slow: s.beta_slow.unwrap_or(1.0),
                    mscale: s.mscale,
                    mscale_all_dim: s.mscale_all_dim,
                    original_max_positions: original,
                })
            }
            Some(other) => {
                let rope = self.spelling.key("rope_scaling");
                return Err(format!("{rope} type `{other}` is not supported (yarn, default)"));
            }
        };
        Ok(PositionEmbedding::Rope(Rope { theta, yarn }))
    }

    fn activation(&self) -> Result<Activation, String> {
        match self.hidden_act.as_deref() {
            Some("situ") => Ok(Activation::Situ {
                beta: self.activation_situ_beta.unwrap_or(4.0) as f32,
                lin_beta: self.activation_situ_linear_beta.unwrap_or(25.0) as f32,
            }),
            Some("silu") | None => Ok(Activation::Silu),
            Some(other) => Err(format!("hidden_act `{other}` is not supported (situ, silu)")),
        }
    }
}

impl ModelConfig {
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ModelConfig, ConfigError> {
        let err = |reason: String| ConfigError { path: path.to_path_buf(), reason };
        let root_value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let root: Root = serde_json::from_value(root_value.clone()).map_err(|e| err(e.to_string()))?;
        let family = match root.model_type.as_str() {
            "kimi_k3" => Family::KimiK3,
            // Kimi K3.1 Pro runs as K3 while every field is one K3's config has (`k31`).
            K31_MODEL_TYPE => k31::check(&root_value).map(|()| Family::KimiK3).map_err(err)?,
            "kimi_linear" => Family::KimiLinear,
            "kimi_k2" | "deepseek_v3" => Family::DeepseekV3,
            other => {
                return Err(err(format!(
                    "model_type `{other}` is not a model k3 runs (kimi_k3, kimi_k31, kimi_linear, kimi_k2, deepseek_v3)"
                )));
            }
        };
        let text_value = root.text_config.clone().unwrap_or(root_value);
        let spelling = Spelling::of(&text_value);
        let mut text: TextConfig = serde_json::from_value(text_value).map_err(|e| err(e.to_string()))?;
        text.spelling = spelling;
        let need = |v: Option<u64>, field: &str| required(v, field).map_err(err);
        let lac = text.linear_attn_config.clone();
        let kda_layers: Vec<u32> =
            lac.iter().flat_map(|l| l.kda_layers.iter()).filter_map(|&l| l.checked_sub(1)).collect();
        let kda = match &lac {
            Some(l) if !kda_layers.is_empty() => Some(KdaDims {
                heads: need(l.num_heads.map(u64::from), "linear_attn_config.num_heads")?,
                head_dim: need(l.head_dim.map(u64::from), "linear_attn_config.head_dim")?,
                conv_kernel: l.short_conv_kernel_size as usize,
                gate_lower_bound: l.gate_lower_bound.map(|b| b as f32),
                full_rank_gate: l.use_full_rank_gate,
            }),
            _ => None,
        };
        let has_mla = (0..text.num_hidden_layers).any(|i| !kda_layers.contains(&i));
        let mla = if has_mla { Some(text.mla_dims().map_err(err)?) } else { None };
        let moe = if text.num_experts > 0 { Some(text.moe_dims().map_err(err)?) } else { None };
        let activation = text.activation().map_err(err)?;
        let attn_res_block = match (family, text.attn_res_block_size) {
            (Family::KimiK3, None) => return Err(err("missing field `attn_res_block_size` (K3's AttnRes)".into())),
            (Family::KimiK3, Some(b)) => Some(b.max(1) as usize),
            (Family::KimiLinear | Family::DeepseekV3, _) => None,
        };
        let positions = match family {
            Family::DeepseekV3 => text.rope().map_err(err)?,
            Family::KimiK3 | Family::KimiLinear => PositionEmbedding::None,
        };
        if let Some(f) = text.scoring_func.as_deref().filter(|f| *f != "sigmoid") {
            return Err(err(format!("scoring_func `{f}` is not supported (sigmoid)")));
        }
        let vision = match family {
            Family::KimiK3 => Vision::parse(
                root.vision_config.as_ref(),
                root.media_placeholder_token_id,
                text.hidden_size,
                text.vocab_size,
            )
            .map_err(err)?,
            Family::KimiLinear | Family::DeepseekV3 => None,
        };
        let mut eos: Vec<u32> = root.eos_token_id.iter().chain(&text.eos_token_id).flat_map(TokenIds::ids).collect();
        eos.dedup();
        let cfg = ModelConfig {
            family,
            layers: text.num_hidden_layers,
            hidden: text.hidden_size,
            vocab: text.vocab_size,
            experts: text.num_experts,
            experts_per_token: text.num_experts_per_token,
            first_k_dense_replace: text.first_k_dense_replace,
            moe_layer_freq: text.moe_layer_freq.max(1),
            eps: text.rms_norm_eps as f32,
            activation,
            attn_res_block,
            dense_inter: text.intermediate_size.map(|i| i as usize),
            kda_layers,
            kda,
            mla,
            moe,
            eos,
            max_positions: text.max_position_embeddings,
            positions,
            text,
            vision,
        };
        if cfg.first_k_dense_replace > 0 && cfg.dense_inter.is_none() {
            return Err(err("missing field `intermediate_size` (the dense MLP's width)".into()));
        }
        cfg.check().map_err(err)?;
        Ok(cfg)
    }

    /// Attention state in bytes: per token of context (MLA latents and shared keys, stored as
    /// `kv`) and fixed per sequence (KDA states and convolution windows, f32).
    pub fn attention_state(&self, kv: k3_attn::KvCacheType) -> (u64, u64) {
        let kda = self.kda_layers.len() as u64;
        let mla = u64::from(self.layers).saturating_sub(kda);
        let per_token = self.mla.as_ref().map_or(0, |m| (kv.row_bytes(m.kv_lora) + kv.row_bytes(m.rope)) as u64);
        let fixed = self.kda.as_ref().map_or(0, |k| {
            let ch = (k.heads * k.head_dim) as u64;
            4 * (ch * k.head_dim as u64 + 3 * ch * k.conv_kernel as u64)
        });
        (mla * per_token, kda * fixed)
    }

    /// Whether layer `i` (0-based) is KDA (else MLA).
    pub fn is_kda(&self, i: u32) -> bool {
        self.kda_layers.contains(&i)
    }

    /// 0-based layers with routed experts (DeepSeek rule: past the dense prefix, every `freq`-th).
    pub fn moe_layers(&self) -> Vec<u32> {
        if self.experts == 0 {
            return Vec::new();
        }
        (self.first_k_dense_replace..self.layers).filter(|l| l % self.moe_layer_freq == 0).collect()
    }

    pub fn architecture(&self) -> k3_format::Architecture {
        k3_format::Architecture {
            name: self.family.name().to_string(),
            layers: self.layers,
            hidden: self.hidden,
            vocab: self.vocab,
            experts: self.experts,
            experts_per_token: self.experts_per_token,
            moe_layers: self.moe_layers(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Result<ModelConfig, ConfigError> {
        ModelConfig::parse(Path::new("config.json"), &serde_json::to_vec(&json).unwrap())
    }

    #[test]
    fn missing_and_wrong_fields_are_named() {
        let e = parse(serde_json::json!({"model_type": "kimi_linear", "hidden_size": 8})).unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers"), "{e}");
        let e = parse(serde_json::json!({"model_type": "llama"})).unwrap_err().to_string();
        assert!(e.contains("llama"), "{e}");
        let e = parse(serde_json::json!({"model_type": "kimi_linear", "hidden_size": "big", "num_hidden_layers": 1, "vocab_size": 4}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_size") || e.contains("invalid type"), "{e}");
        // An MLA layer needs MLA's dimensions.
        let e = parse(
            serde_json::json!({"model_type": "kimi_linear", "hidden_size": 8, "num_hidden_layers": 1, "vocab_size": 4}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("num_attention_heads"), "{e}");
    }

    /// A golden checkpoint's `config.json` with `key` set to `value`: the error.
    fn broken(checkpoint: &str, key: &str, value: serde_json::Value) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden").join(checkpoint);
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.join("config.json")).unwrap()).unwrap();
        assert!(cfg.get(key).is_some(), "{checkpoint} writes no `{key}`");
        cfg[key] = value;
        parse(cfg).unwrap_err().to_string()
    }

    #[test]
    fn faults_name_the_field_as_the_file_writes_it() {
        for (checkpoint, key, value, internal) in [
            ("deepseek-v3/bf16", "n_group", serde_json::json!(3), "num_expert_group"),
            ("deepseek-v3/bf16", "n_group", serde_json::json!(0), "num_expert_group"),
            ("deepseek-v3/bf16", "num_experts_per_tok", serde_json::json!(9), "num_experts_per_token"),
            ("deepseek-v3/bf16", "n_shared_experts", serde_json::json!(65), "num_shared_experts"),
            ("tiny-kimi-linear", "model_max_length", serde_json::json!(0), "max_position_embeddings"),
        ] {
            let e = broken(checkpoint, key, value.clone());
            assert!(e.contains(&format!("`{key}` = {value}")), "{checkpoint}: {e}");
            assert!(!e.contains(internal), "{checkpoint}: the error names k3's `{internal}`: {e}");
        }
        // topk_group's bound names the groups' field as written too.
        let e = broken("deepseek-v3/bf16", "topk_group", serde_json::json!(5));
        assert!(e.contains("`topk_group` = 5") && e.contains("(n_group)"), "{e}");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/golden/deepseek-v3/bf16/config.json");
        let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let rope = cfg.as_object_mut().unwrap().remove("rope_scaling").unwrap();
        cfg["rope_parameters"] = rope;
        cfg["rope_parameters"]["factor"] = serde_json::json!(0.0);
        let e = parse(cfg).unwrap_err().to_string();
        assert!(e.contains("`rope_parameters.factor` = 0"), "{e}");
    }
}
