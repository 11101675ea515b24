//! A configuration checked whole before anything is written or loaded: every field a family uses
//! in range and consistent with the others, refused with its name and value. `config.json` is
//! untrusted input; what passes here cannot make the router, the attention or the memory plan
//! panic, divide by zero, overflow, or compute NaN (an `rms_norm_eps` of -1 would give NaN
//! logits; `num_expert_group` that does not divide the experts, a router panic). Each field is
//! named as the file writes it (`n_group` in a DeepSeek-V3 config, see [`super::Spelling`]).

use super::{Activation, ModelConfig, PositionEmbedding};

/// Sizes past these are no model this engine can hold, and products of them could overflow.
const MAX_WIDTH: u64 = 1 << 20;
const MAX_LAYERS: u32 = 4096;
const MAX_VOCAB: u64 = 1 << 24;
const MAX_EXPERTS: u32 = 1 << 16;

fn field(name: &str, value: impl std::fmt::Display, why: &str) -> String {
    format!("`{name}` = {value}: {why}")
}

fn positive_finite(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && v > 0.0 { Ok(()) } else { Err(field(name, v, "must be a finite number > 0")) }
}

fn finite(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() { Ok(()) } else { Err(field(name, v, "must be a finite number")) }
}

fn width(name: &str, v: u64) -> Result<(), String> {
    if (1..=MAX_WIDTH).contains(&v) { Ok(()) } else { Err(field(name, v, &format!("must be in 1..={MAX_WIDTH}"))) }
}

impl ModelConfig {
    /// Every field this family uses, in range and consistent (see the module comment).
    pub(super) fn check(&self) -> Result<(), String> {
        let t = &self.text;
        width("hidden_size", self.hidden)?;
        if !(1..=MAX_LAYERS).contains(&self.layers) {
            return Err(field("num_hidden_layers", self.layers, &format!("must be in 1..={MAX_LAYERS}")));
        }
        if !(1..=MAX_VOCAB).contains(&self.vocab) {
            return Err(field("vocab_size", self.vocab, &format!("must be in 1..={MAX_VOCAB}")));
        }
        positive_finite("rms_norm_eps", t.rms_norm_eps)?;
        if t.rms_norm_eps >= 1.0 {
            return Err(field("rms_norm_eps", t.rms_norm_eps, "must be below 1 (it is added to a mean square)"));
        }
        if let Some(bad) = self.eos.iter().find(|&&e| u64::from(e) >= self.vocab) {
            return Err(field("eos_token_id", bad, &format!("is outside the vocabulary of {}", self.vocab)));
        }
        if let Some(m) = t.max_position_embeddings.filter(|&m| m == 0) {
            return Err(field(&t.spelling.key("max_position_embeddings"), m, "must be at least 1"));
        }
        self.check_layers()?;
        self.check_moe()?;
        self.check_attention()?;
        if let Activation::Situ { beta, lin_beta } = self.activation {
            positive_finite("activation_situ_beta", f64::from(beta))?;
            positive_finite("activation_situ_linear_beta", f64::from(lin_beta))?;
        }
        if let PositionEmbedding::Rope(r) = &self.positions {
            positive_finite("rope_theta", r.theta)?;
            if let Some(y) = &r.yarn {
                let key = |f: &str| t.spelling.key(&format!("rope_scaling.{f}"));
                positive_finite(&key("factor"), y.factor)?;
                finite(&key("beta_fast"), y.beta_fast)?;
                finite(&key("beta_slow"), y.beta_slow)?;
                y.mscale.map_or(Ok(()), |m| finite(&key("mscale"), m))?;
                y.mscale_all_dim.map_or(Ok(()), |m| finite(&key("mscale_all_dim"), m))?;
                if y.original_max_positions == 0 {
                    return Err(field(&key("original_max_position_embeddings"), 0, "must be at least 1"));
                }
            }
        }
        Ok(())
    }

    /// Which layers are which: KDA indices, the dense prefix, the MoE stride, AttnRes blocks.
    fn check_layers(&self) -> Result<(), String> {
        let t = &self.text;
        let listed = t.linear_attn_config.iter().flat_map(|l| l.kda_layers.iter());
        let mut seen = std::collections::HashSet::new();
        for &l in listed {
            if l == 0 || l > self.layers {
                return Err(field(
                    "linear_attn_config.kda_layers",
                    l,
                    &format!("layers are numbered 1..={} (1-based)", self.layers),
                ));
            }
            if !seen.insert(l) {
                return Err(field("linear_attn_config.kda_layers", l, "is listed twice"));
            }
        }
        if t.moe_layer_freq == 0 {
            return Err(field("moe_layer_freq", 0, "must be at least 1"));
        }
        if self.first_k_dense_replace > self.layers {
            return Err(field(
                "first_k_dense_replace",
                self.first_k_dense_replace,
                &format!("is past the model's {} layers", self.layers),
            ));
        }
        if let Some(i) = self.dense_inter.filter(|_| self.first_k_dense_replace > 0 || self.experts == 0) {
            width("intermediate_size", i as u64)?;
        }
        if self.experts == 0 && self.dense_inter.is_none() {
            let experts = t.spelling.key("num_experts");
            return Err(format!("no `{experts}` and no `intermediate_size`: the layers have no MLP"));
        }
        if let Some(b) = t.attn_res_block_size.filter(|&b| b == 0 || b > u64::from(self.layers)) {
            return Err(field("attn_res_block_size", b, &format!("must be in 1..={}", self.layers)));
        }
        Ok(())
    }

    fn check_moe(&self) -> Result<(), String> {
        let t = &self.text;
        let key = |name: &str| t.spelling.key(name);
        let Some(m) = &self.moe else {
            if self.experts_per_token > 0 {
                return Err(field(
                    &key("num_experts_per_token"),
                    self.experts_per_token,
                    "but the model has no experts",
                ));
            }
            return Ok(());
        };
        if self.experts > MAX_EXPERTS {
            return Err(field(&key("num_experts"), self.experts, &format!("must be at most {MAX_EXPERTS}")));
        }
        let groups = key("num_expert_group");
        if t.num_expert_group == 0 || !self.experts.is_multiple_of(t.num_expert_group) {
            return Err(field(
                &groups,
                t.num_expert_group,
                &format!("must divide the {} experts into equal groups", self.experts),
            ));
        }
        if t.topk_group == 0 || t.topk_group > t.num_expert_group {
            return Err(field(
                "topk_group",
                t.topk_group,
                &format!("must be in 1..={} ({groups})", t.num_expert_group),
            ));
        }
        let reachable = (self.experts / t.num_expert_group) * t.topk_group;
        if m.top_k == 0 || m.top_k as u32 > reachable {
            return Err(field(
                &key("num_experts_per_token"),
                m.top_k,
                &format!("must be in 1..={reachable} (the experts in the {} groups kept)", t.topk_group),
            ));
        }
        width("moe_intermediate_size", m.inter as u64)?;
        if let Some(z) = m.latent {
            width("routed_expert_hidden_size", z as u64)?;
        }
        if t.num_shared_experts > 64 {
            return Err(field(&key("num_shared_experts"), t.num_shared_experts, "must be at most 64"));
        }
        positive_finite("routed_scaling_factor", t.routed_scaling_factor)
    }

    fn check_attention(&self) -> Result<(), String> {
        if let Some(k) = &self.kda {
            let name = "linear_attn_config";
            width(&format!("{name}.num_heads"), k.heads as u64)?;
            width(&format!("{name}.head_dim"), k.head_dim as u64)?;
            width(&format!("{name}.num_heads x head_dim"), (k.heads * k.head_dim) as u64)?;
            if !(1..=64).contains(&k.conv_kernel) {
                return Err(field(&format!("{name}.short_conv_kernel_size"), k.conv_kernel, "must be in 1..=64"));
            }
            if let Some(b) = k.gate_lower_bound {
                finite(&format!("{name}.gate_lower_bound"), f64::from(b))?;
            }
        }
        if let Some(a) = &self.mla {
            width("num_attention_heads", a.heads as u64)?;
            width("kv_lora_rank", a.kv_lora as u64)?;
            width("v_head_dim", a.v_dim as u64)?;
            if let Some(q) = a.q_lora {
                width("q_lora_rank", q as u64)?;
            }
            if a.nope + a.rope == 0 || a.nope as u64 > MAX_WIDTH || a.rope as u64 > MAX_WIDTH {
                return Err(field("qk_nope_head_dim + qk_rope_head_dim", a.nope + a.rope, "must be in 1..=2^20"));
            }
            if matches!(self.positions, PositionEmbedding::Rope(_)) && !a.rope.is_multiple_of(2) {
                return Err(field("qk_rope_head_dim", a.rope, "must be even (RoPE turns pairs)"));
            }
        }
        Ok(())
    }
}
