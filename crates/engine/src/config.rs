//! The model's `config.json`: the fields the engine and the converter need, read from
//! `text_config` when present (K3) or the root object (Kimi-Linear).

use std::path::{Path, PathBuf};

use serde_json::Value;

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
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::KimiK3 => "kimi_k3",
            Family::KimiLinear => "kimi_linear",
        }
    }
}

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
    /// The whole text config, for the fields only the forward pass needs.
    pub text: Value,
}

impl ModelConfig {
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ModelConfig, ConfigError> {
        let err = |reason: String| ConfigError { path: path.to_path_buf(), reason };
        let root: Value = serde_json::from_slice(bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let text = root.get("text_config").cloned().unwrap_or_else(|| root.clone());
        let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or_default();
        let family = match model_type {
            "kimi_k3" => Family::KimiK3,
            "kimi_linear" => Family::KimiLinear,
            other => return Err(err(format!("model_type `{other}` is not a model k3 runs (kimi_k3, kimi_linear)"))),
        };
        let u = |keys: &[&str]| -> Result<u64, ConfigError> {
            keys.iter()
                .find_map(|k| text.get(*k).and_then(Value::as_u64))
                .ok_or_else(|| err(format!("missing or non-integer field `{}`", keys[0])))
        };
        let small = |keys: &[&str]| -> Result<u32, ConfigError> {
            u(keys)?.try_into().map_err(|_| err(format!("field `{}` is out of range", keys[0])))
        };
        let cfg = ModelConfig {
            family,
            layers: small(&["num_hidden_layers"])?,
            hidden: u(&["hidden_size"])?,
            vocab: u(&["vocab_size"])?,
            experts: small(&["num_experts", "n_routed_experts"])?,
            experts_per_token: small(&["num_experts_per_token", "num_experts_per_tok"])?,
            first_k_dense_replace: small(&["first_k_dense_replace"]).unwrap_or(0),
            moe_layer_freq: small(&["moe_layer_freq"]).unwrap_or(1).max(1),
            text,
        };
        if cfg.experts_per_token > cfg.experts {
            return Err(err(format!("{} experts per token but only {} experts", cfg.experts_per_token, cfg.experts)));
        }
        Ok(cfg)
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
