//! The synthetic models' presets and the `config.json` each is written with.

use super::SynthExperts;

/// The architecture a preset has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    /// K3: KDA with MLA every fourth layer, AttnRes, LatentMoE.
    K3,
    /// Kimi K2 / DeepSeek-V3: MLA with RoPE on every layer, experts on the hidden state, one
    /// shared expert.
    K2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    pub arch: SynthArch,
    /// The expert encoding the preset is written with unless told otherwise.
    pub experts_default: SynthExperts,
    pub layers: u32,
    pub hidden: usize,
    pub vocab: usize,
    pub experts: u32,
    pub top_k: u32,
    /// LatentMoE width the experts work in, and the experts' own width.
    pub latent: usize,
    pub expert_width: usize,
    pub dense_width: usize,
    pub kda_heads: usize,
    pub head_dim: usize,
    pub mla_heads: usize,
    pub q_lora: usize,
    pub kv_lora: usize,
    /// One router for every MoE layer and small residual updates: predictable routing.
    pub predictable_routing: bool,
    /// Routed by the K3-like process (`k3_router::synthetic`) instead of the random router: K3's
    /// next-token reuse, union factors, weight by rank and flat usage.
    pub k3_routing: bool,
}

/// 896 experts, 16 active, like K3; 6 MoE layers of 5.0 MB MXFP4 records = 27 GB of shards.
const K3_PROXY: Preset = Preset {
    name: "k3-proxy",
    arch: SynthArch::K3,
    experts_default: SynthExperts::Mxfp4,
    layers: 7,
    hidden: 2048,
    vocab: 4096,
    experts: 896,
    top_k: 16,
    latent: 2048,
    expert_width: 1536,
    dense_width: 4096,
    kda_heads: 16,
    head_dim: 128,
    mla_heads: 16,
    q_lora: 512,
    kv_lora: 512,
    predictable_routing: false,
    k3_routing: false,
};

/// K3's architecture small enough to live in memory here (1.8 GB, every expert cached), so decode
/// is compute-bound: what threads buy, measured without the drive in the way.
const K3_MEDIUM: Preset = Preset {
    name: "k3-medium",
    arch: SynthArch::K3,
    experts_default: SynthExperts::Mxfp4,
    layers: 8,
    hidden: 2048,
    vocab: 32768,
    experts: 64,
    top_k: 8,
    latent: 1024,
    expert_width: 1024,
    dense_width: 8192,
    kda_heads: 16,
    head_dim: 128,
    mla_heads: 16,
    q_lora: 512,
    kv_lora: 512,
    predictable_routing: false,
    k3_routing: false,
};

/// Kimi K2-Thinking's routed experts (384, 8 active, hidden 7168, width 2048, INT4 in groups of
/// 32: 24.8 MB records, as K2-Thinking's own) in 2 MoE layers = 19 GB of shards; its MLA
/// (64 heads, q_lora 1536, kv_lora 512) and one shared expert. The dense first layer is narrower
/// than K2's 18432 to keep the trunk small.
const K2_PROXY: Preset = Preset {
    name: "k2-proxy",
    arch: SynthArch::K2,
    experts_default: SynthExperts::Int4,
    layers: 3,
    hidden: 7168,
    vocab: 4096,
    experts: 384,
    top_k: 8,
    latent: 7168,
    expert_width: 2048,
    dense_width: 2048,
    kda_heads: 0,
    head_dim: 0,
    mla_heads: 64,
    q_lora: 1536,
    kv_lora: 512,
    predictable_routing: false,
    k3_routing: false,
};

/// K2's architecture in seconds, for tests.
const K2_TINY: Preset = Preset {
    name: "k2-tiny",
    layers: 3,
    hidden: 256,
    vocab: 512,
    experts: 32,
    top_k: 4,
    latent: 256,
    expert_width: 64,
    dense_width: 384,
    mla_heads: 4,
    q_lora: 96,
    kv_lora: 64,
    ..K2_PROXY
};

pub const PRESETS: [Preset; 8] = [
    Preset {
        name: "k3-tiny",
        arch: SynthArch::K3,
        experts_default: SynthExperts::Mxfp4,
        layers: 4,
        hidden: 256,
        vocab: 512,
        experts: 32,
        top_k: 4,
        latent: 128,
        expert_width: 64,
        dense_width: 384,
        kda_heads: 4,
        head_dim: 32,
        mla_heads: 4,
        q_lora: 96,
        kv_lora: 64,
        predictable_routing: false,
        k3_routing: false,
    },
    K3_PROXY,
    // The same sizes and I/O per token, with routing a lookahead can predict (module docs).
    Preset { name: "k3-proxy-routed", predictable_routing: true, ..K3_PROXY },
    // The same sizes and I/O per token, routed as K3 routes (issue #37).
    Preset { name: "k3-proxy-k3routing", k3_routing: true, ..K3_PROXY },
    // K3's routing shape (896 experts, top 16) routed as K3 routes, every width tiny (12 MB of
    // expert records): for measuring routing itself in seconds.
    Preset {
        name: "k3-routing-tiny",
        arch: SynthArch::K3,
        experts_default: SynthExperts::Mxfp4,
        layers: 4,
        hidden: 128,
        vocab: 512,
        experts: 896,
        top_k: 16,
        latent: 64,
        expert_width: 32,
        dense_width: 128,
        kda_heads: 2,
        head_dim: 32,
        mla_heads: 2,
        q_lora: 64,
        kv_lora: 64,
        predictable_routing: false,
        k3_routing: true,
    },
    K3_MEDIUM,
    K2_TINY,
    K2_PROXY,
];

pub fn preset(name: &str) -> Option<Preset> {
    PRESETS.iter().copied().find(|p| p.name == name)
}

pub(super) fn is_mla(p: &Preset, i: u32) -> bool {
    p.arch == SynthArch::K2 || (i + 1).is_multiple_of(4) || i + 1 == p.layers
}

/// The model's `config.json`.
pub fn config_json(p: &Preset) -> serde_json::Value {
    let mut c = match p.arch {
        SynthArch::K3 => k3_config_json(p),
        SynthArch::K2 => k2_config_json(p),
    };
    if p.k3_routing {
        let routing = serde_json::json!({"model": "k3-like", "seed": K3_ROUTING_SEED});
        match c.get_mut("text_config") {
            Some(t) => t["k3_synthetic_routing"] = routing,
            None => c["k3_synthetic_routing"] = routing,
        }
    }
    c
}

/// The seed of the K3-like routing process in synthetic models.
const K3_ROUTING_SEED: u64 = 37;

/// K2's config.json layout (DeepSeek-V3 fields, K2's RoPE and routing constants).
fn k2_config_json(p: &Preset) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
        "bos_token_id": p.vocab - 4, "eos_token_id": p.vocab - 2, "pad_token_id": p.vocab - 1,
        "hidden_size": p.hidden, "num_hidden_layers": p.layers, "vocab_size": p.vocab,
        "intermediate_size": p.dense_width, "moe_intermediate_size": p.expert_width, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "n_routed_experts": p.experts, "num_experts_per_tok": p.top_k, "n_shared_experts": 1,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.827,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_attention_heads": p.mla_heads,
        "num_key_value_heads": p.mla_heads, "q_lora_rank": p.q_lora, "kv_lora_rank": p.kv_lora,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
        "rope_scaling": {"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
        "synthetic": {"preset": p.name, "note": "random weights from `cargo xtask synth`"},
    })
}

/// K3's config.json layout (`text_config` inside).
fn k3_config_json(p: &Preset) -> serde_json::Value {
    let kda: Vec<u32> = (0..p.layers).filter(|&i| !is_mla(p, i)).map(|i| i + 1).collect();
    let mla: Vec<u32> = (0..p.layers).filter(|&i| is_mla(p, i)).map(|i| i + 1).collect();
    serde_json::json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3",
        "bos_token_id": p.vocab - 4, "eos_token_id": p.vocab - 2, "pad_token_id": p.vocab - 1,
        "text_config": {
            "model_type": "kimi_linear", "hidden_size": p.hidden, "num_hidden_layers": p.layers,
            "vocab_size": p.vocab, "intermediate_size": p.dense_width, "first_k_dense_replace": 1,
            "moe_layer_freq": 1, "num_attention_heads": p.mla_heads, "q_lora_rank": p.q_lora,
            "kv_lora_rank": p.kv_lora, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "mla_use_nope": true, "mla_use_output_gate": true, "num_experts": p.experts,
            "num_experts_per_token": p.top_k, "moe_intermediate_size": p.expert_width,
            "routed_expert_hidden_size": p.latent, "latent_moe_use_norm": true, "num_shared_experts": 2,
            "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "num_expert_group": 1,
            "topk_group": 1, "moe_renormalize": true, "routed_scaling_factor": 1.0, "hidden_act": "situ",
            "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "attn_res_block_size": 2,
            "rms_norm_eps": 1e-5,
            "linear_attn_config": {"kda_layers": kda, "full_attn_layers": mla, "num_heads": p.kda_heads,
                "head_dim": p.head_dim, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0, "use_full_rank_gate": true},
        },
        "synthetic": {"preset": p.name, "note": "random weights from `cargo xtask synth`"},
    })
}
