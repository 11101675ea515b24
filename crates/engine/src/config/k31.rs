//! Kimi K3.1 Pro (2026-10-23): reported by Moonshot and NVIDIA as K3's architecture post-trained
//! (2.8T parameters, 104B active, the same MXFP4 checkpoint format); third-party copies of its
//! Hugging Face repository carry the model type `kimi_k31`. Its own config.json was not readable
//! where this was written, so it runs as K3 only while its config holds nothing K3's does not:
//! a field K3's config lacks could change the arithmetic, and is refused by name rather than
//! ignored.

/// The model type K3.1 Pro's config is reported to carry.
pub const K31_MODEL_TYPE: &str = "kimi_k31";

/// The top-level fields of K3's config.json, and the bookkeeping fields Hugging Face writes.
const ROOT: &[&str] = &[
    "architectures",
    "auto_map",
    "bos_token_id",
    "dtype",
    "eos_token_id",
    "media_placeholder_token_id",
    "model_type",
    "pad_token_id",
    "text_config",
    "tie_word_embeddings",
    "torch_dtype",
    "transformers_version",
    "vision_config",
    "_name_or_path",
    "use_cache",
    "initializer_range",
];

/// The fields of K3's `text_config` (its release's, as fixtures/golden/tiny-k3 transcribes them).
const TEXT: &[&str] = &[
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "attn_res_block_size",
    "dtype",
    "first_k_dense_replace",
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "kv_lora_rank",
    "latent_moe_use_norm",
    "linear_attn_config",
    "max_position_embeddings",
    "mla_use_nope",
    "mla_use_output_gate",
    "model_type",
    "moe_intermediate_size",
    "moe_layer_freq",
    "moe_renormalize",
    "moe_router_activation_func",
    "num_attention_heads",
    "num_expert_group",
    "num_experts",
    "num_experts_per_token",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_nextn_predict_layers",
    "num_shared_experts",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "quantization_config",
    "rms_norm_eps",
    "routed_expert_hidden_size",
    "routed_scaling_factor",
    "tie_word_embeddings",
    "topk_group",
    "topk_method",
    "use_grouped_topk",
    "v_head_dim",
    "vocab_size",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "torch_dtype",
    "use_cache",
    "initializer_range",
    "architectures",
    "transformers_version",
];

/// The fields of K3's `text_config.linear_attn_config` (KDA's shape and placement).
const LINEAR: &[&str] = &[
    "full_attn_layers",
    "gate_lower_bound",
    "head_dim",
    "kda_layers",
    "num_heads",
    "short_conv_kernel_size",
    "use_full_rank_gate",
];

/// Refuses a K3.1 config with a field K3's config does not have, naming it: at the top, in
/// `text_config` and in its `linear_attn_config` (what sets the arithmetic; the quantization and
/// vision configs are checked where they are read).
pub(super) fn check(root: &serde_json::Value) -> Result<(), String> {
    let unknown = |obj: Option<&serde_json::Map<String, serde_json::Value>>, known: &[&str], at: &str| {
        obj.into_iter().flat_map(|o| o.keys()).find(|k| !known.contains(&k.as_str())).map(|k| format!("{at}{k}"))
    };
    let text = root.get("text_config").and_then(|t| t.as_object());
    let linear = text.and_then(|t| t.get("linear_attn_config")).and_then(|l| l.as_object());
    let found = unknown(root.as_object(), ROOT, "")
        .or_else(|| unknown(text, TEXT, "text_config."))
        .or_else(|| unknown(linear, LINEAR, "text_config.linear_attn_config."));
    match found {
        None => Ok(()),
        Some(field) => Err(format!(
            "model_type `{K31_MODEL_TYPE}` (Kimi K3.1 Pro) runs as K3, but its config has `{field}`, which K3's \
             does not: k3 does not know what it changes, so it does not run this model"
        )),
    }
}
