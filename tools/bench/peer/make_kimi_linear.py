"""A random-weight Kimi-Linear-shaped checkpoint of about 1.5 B parameters, saved by stock
transformers in Moonshot's tensor and config names (what llama.cpp's converter and k3's read).

    python3 make_kimi_linear.py OUT_DIR TOKENIZER_JSON

hidden 1024, 8 layers (KDA 1-3, 5-7; MLA 4 and 8), layer 1 dense (4096), 128 experts of width 512,
8 active + 1 shared, vocabulary 32768 (the tokenizer's ids, the rest padding). Seeded: the same
checkpoint every time.
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import KimiLinearConfig, KimiLinearForCausalLM

CONFIG = {
    "model_type": "kimi_linear",
    "architectures": ["KimiLinearForCausalLM"],
    "vocab_size": 32768,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "head_dim": 192,
    "num_experts": 128,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "routed_scaling_factor": 2.446,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "num_expert_group": 1,
    "topk_group": 1,
    "use_grouped_topk": True,
    "moe_layer_freq": 1,
    "mla_use_nope": True,
    "model_max_length": 1048576,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5, 6, 7],
        "full_attn_layers": [4, 8],
        "head_dim": 128,
        "num_heads": 8,
        "short_conv_kernel_size": 4,
    },
    "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-05,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "torch_dtype": "bfloat16",
}


def main():
    out, tokenizer = sys.argv[1], sys.argv[2]
    torch.manual_seed(1234)
    model = KimiLinearForCausalLM(KimiLinearConfig(**CONFIG)).to(torch.bfloat16)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    model.save_pretrained(out)
    # transformers saves the dense layer's MLP under `block_sparse_moe.`; Moonshot keeps `mlp.`.
    path = os.path.join(out, "model.safetensors")
    if os.path.exists(path):
        tensors = load_file(path)
        for part in ("gate_proj", "up_proj", "down_proj"):
            old = f"model.layers.0.block_sparse_moe.{part}.weight"
            if old in tensors:
                tensors[f"model.layers.0.mlp.{part}.weight"] = tensors.pop(old)
        save_file(tensors, path, metadata={"format": "pt"})
    else:
        raise SystemExit("expected one model.safetensors (raise save_pretrained's max_shard_size)")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=1)
    shutil.copy(tokenizer, os.path.join(out, "tokenizer.json"))


if __name__ == "__main__":
    main()
