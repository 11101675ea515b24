"""Tiny random Kimi K2 / DeepSeek-V3 checkpoints in the real releases' layouts, with reference
logits and a hidden-state trace from transformers' `DeepseekV3ForCausalLM` (5.24), which this
project did not write. Three encodings of one model:

- `bf16/`:  BF16 everywhere (DeepSeek-V3 style `model_type: deepseek_v3`).
- `fp8/`:   K2-Instruct / DeepSeek-V3 style FP8 e4m3 weights with 128x128 block `weight_scale_inv`
            on every Linear but the embeddings, lm_head and the router (partial edge blocks: the
            hidden size is 192); `model_type: kimi_k2`.
- `int4/`:  K2-Thinking style compressed-tensors `pack-quantized` INT4 (symmetric, group 32) for the
            routed experts only, BF16 elsewhere; `model_type: kimi_k2`.

Each variant's reference runs transformers in f32 on exactly the weights that variant encodes
(dequantized), and it is the same 3-layer model (layer 0 dense, MLA with q low-rank, interleaved
RoPE + YaRN factor 32 as K2's config has it, 16 experts top-4 in 4 groups choosing 2, sigmoid
scores with a correction bias, one shared expert). Experts are saved per expert under the
checkpoint names (transformers fuses them on load; we split them back: gate rows first).

    /tmp/venv/bin/python tools/golden/deepseek_v3.py fixtures/golden/deepseek-v3

`--unseen-fp8 DIR` writes one more FP8 checkpoint of another shape, seed and layout (two
safetensors shards with an index, hidden 320 = two and a half blocks, expert width 96 = three
quarters of a block, 24 experts top 6), made after the FP8 kernels were written and never tuned
against: the check that the golden model's agreement is not a property of its shape.

    /tmp/venv/bin/python tools/golden/deepseek_v3.py --unseen-fp8 fixtures/golden/deepseek-v3/fp8-unseen
"""

import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

ROPE = {"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096}
DIMS = dict(vocab_size=512, hidden_size=192, intermediate_size=320, moe_intermediate_size=32, num_hidden_layers=3,
            first_k_dense_replace=1, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2,
            n_shared_experts=1, routed_scaling_factor=2.827, norm_topk_prob=True, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, max_position_embeddings=131072, rms_norm_eps=1e-6, tie_word_embeddings=False,
            hidden_act="silu", bos_token_id=0, eos_token_id=1)
IDS = [3, 141, 59, 265, 358, 97, 93, 238, 462, 64, 338, 327]
SEED = 7
UNSEEN = dict(hidden_size=320, intermediate_size=448, moe_intermediate_size=96, num_hidden_layers=4,
              n_routed_experts=24, num_experts_per_tok=6, n_group=4, topk_group=2, routed_scaling_factor=2.5,
              q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
UNSEEN_IDS = [17, 402, 9, 311, 256, 77, 130, 499, 61, 5, 288, 144, 390, 23]


def config_json(model_type: str, extra=None) -> dict:
    """config.json as the releases write it (`rope_scaling` + `rope_theta`)."""
    c = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": model_type, **DIMS, "rope_theta": 50000.0,
         "rope_scaling": ROPE, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
         "num_nextn_predict_layers": 0, "torch_dtype": "bfloat16"}
    c.update(extra or {})
    return c


def random_model() -> DeepseekV3ForCausalLM:
    rope = {"rope_type": "yarn", "rope_theta": 50000.0, **{k: v for k, v in ROPE.items() if k != "type"}}
    cfg = DeepseekV3Config(**DIMS, rope_parameters=rope)
    torch.manual_seed(SEED)
    m = DeepseekV3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
        for layer in m.model.layers:
            if hasattr(layer.mlp, "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias"):
                layer.mlp.gate.e_score_correction_bias.copy_(0.5 * torch.randn_like(layer.mlp.gate.e_score_correction_bias))
    return m


def checkpoint_tensors(m) -> dict:
    """The state dict under the checkpoints' names: experts one by one."""
    out = {}
    inter = DIMS["moe_intermediate_size"]
    for k, v in m.state_dict().items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v.clone()
    return out


def load_into(m, tensors: dict) -> None:
    """Back into transformers' fused layout."""
    sd = {}
    layers = {}
    for k, v in tensors.items():
        if ".mlp.experts." in k:
            base, rest = k.split(".mlp.experts.")
            e, w = rest.split(".", 1)
            layers.setdefault(base, {}).setdefault(int(e), {})[w.split(".")[0]] = v
        else:
            sd[k] = v
    for base, experts in layers.items():
        n = len(experts)
        sd[f"{base}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate_proj"], experts[e]["up_proj"]]) for e in range(n)])
        sd[f"{base}.mlp.experts.down_proj"] = torch.stack([experts[e]["down_proj"] for e in range(n)])
    missing, unexpected = m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True), None


def fp8_quantize(w: torch.Tensor):
    """128x128 blocks, e4m3 with scale amax / 448; returns (fp8, scale_inv, dequantized)."""
    n, k = w.shape
    bn, bk = math.ceil(n / 128), math.ceil(k / 128)
    scale = torch.zeros(bn, bk)
    q = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    deq = torch.zeros(n, k)
    for i in range(bn):
        for j in range(bk):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = blk.abs().max().clamp(min=1e-12) / 448.0
            qb = (blk / s).to(torch.float8_e4m3fn)
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qb
            deq[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = qb.float() * s
            scale[i, j] = s
    return q, scale, deq


def int4_quantize(w: torch.Tensor):
    """Symmetric INT4, groups of 32 along K, bf16 scales; packed 8 nibbles per int32, LSB first,
    nibble = q + 8. Returns (packed, scale, shape, dequantized)."""
    n, k = w.shape
    g = w.reshape(n, k // 32, 32)
    scale = (g.abs().amax(dim=2) / 7.0).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.round(g / scale.float().unsqueeze(2)).clamp(-8, 7).to(torch.int32)
    deq = (q.float() * scale.float().unsqueeze(2)).reshape(n, k)
    nib = (q.reshape(n, k) + 8).to(torch.int64)
    packed = torch.zeros(n, k // 8, dtype=torch.int64)
    for i in range(8):
        packed |= nib[:, i::8] << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed, scale, torch.tensor([n, k], dtype=torch.int32), deq


def reference(m, tensors: dict, out_dir: str, note: str) -> None:
    load_into(m, tensors)
    ids = torch.tensor([IDS])
    with torch.no_grad():
        o = m(ids, output_hidden_states=True)
    logits = o.logits[0].float().contiguous()
    # The residual stream after every layer but the last (the last hidden state is normed).
    trace = torch.stack([h[0] for h in o.hidden_states[1:-1]], dim=1).float().contiguous()
    g = os.path.join(out_dir, "golden")
    os.makedirs(g, exist_ok=True)
    open(os.path.join(g, "ids.txt"), "w").write(" ".join(map(str, IDS)) + "\n")
    logits.numpy().tofile(os.path.join(g, "logits.f32"))
    trace.numpy().tofile(os.path.join(g, "trace.f32"))
    json.dump({"tokens": len(IDS), "vocab": DIMS["vocab_size"], "logits": "f32 [tokens, vocab]",
               "trace": f"f32 [tokens, {DIMS['num_hidden_layers'] - 1}, hidden]: the residual stream after layers 0..n-2",
               "reference": "transformers 5.24.0 DeepseekV3ForCausalLM, f32, on the dequantized weights",
               "weights": note, "argmax": logits.argmax(-1).tolist()},
              open(os.path.join(g, "meta.json"), "w"), indent=1)


def fp8_checkpoint(d: str, m, base: dict, shards: int = 1) -> None:
    """FP8 blocks on every Linear but embeddings, lm_head and the router, with its reference."""
    os.makedirs(d, exist_ok=True)
    stored, deq = {}, {}
    for k, v in base.items():
        linear = v.dim() == 2 and "embed_tokens" not in k and "lm_head" not in k and not k.endswith("mlp.gate.weight")
        if linear:
            q, s, dq = fp8_quantize(v.float())
            stored[k] = q
            stored[k.replace(".weight", ".weight_scale_inv")] = s
            deq[k] = dq
        else:
            stored[k] = v
            deq[k] = v.float()
    if shards == 1:
        save_file({k: v.contiguous() for k, v in stored.items()}, os.path.join(d, "model.safetensors"))
    else:
        # Layers split over the shards as the releases split them (a tensor and its scale together).
        names = sorted(stored)
        files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        where = {n: files[min(shards - 1, i * shards // len(names))] for i, n in enumerate(names)}
        for n in names:
            if n.endswith("_scale_inv"):
                where[n] = where[n[: -len("_scale_inv")]]
        for f in files:
            save_file({k: stored[k].contiguous() for k in names if where[k] == f}, os.path.join(d, f))
        json.dump({"metadata": {}, "weight_map": where}, open(os.path.join(d, "model.safetensors.index.json"), "w"),
                  indent=1)
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    json.dump(config_json("kimi_k2", {"quantization_config": qc}), open(os.path.join(d, "config.json"), "w"), indent=1)
    reference(m, deq, d, "fp8 e4m3 x block scale_inv, dequantized in f32")


def unseen_fp8(d: str) -> None:
    global SEED, IDS
    DIMS.update(UNSEEN)
    SEED, IDS = 1234, UNSEEN_IDS
    m = random_model()
    base = {k: v.to(torch.bfloat16) for k, v in checkpoint_tensors(m).items()}
    fp8_checkpoint(d, m, base, shards=2)
    print("wrote", d)


def main() -> None:
    if sys.argv[1] == "--unseen-fp8":
        return unseen_fp8(sys.argv[2])
    root = sys.argv[1]
    m = random_model()
    base = {k: v.to(torch.bfloat16) for k, v in checkpoint_tensors(m).items()}

    # BF16.
    d = os.path.join(root, "bf16")
    os.makedirs(d, exist_ok=True)
    save_file({k: v.contiguous() for k, v in base.items()}, os.path.join(d, "model.safetensors"))
    json.dump(config_json("deepseek_v3"), open(os.path.join(d, "config.json"), "w"), indent=1)
    reference(m, {k: v.float() for k, v in base.items()}, d, "bf16 as stored")

    # FP8 blocks on every Linear but embeddings, lm_head and the router.
    fp8_checkpoint(os.path.join(root, "fp8"), m, base)

    # INT4 routed experts (compressed-tensors pack-quantized), BF16 elsewhere.
    d = os.path.join(root, "int4")
    os.makedirs(d, exist_ok=True)
    stored, deq = {}, {}
    for k, v in base.items():
        if ".mlp.experts." in k:
            p, s, shape, dq = int4_quantize(v.float())
            b = k[: -len(".weight")]
            stored[b + ".weight_packed"], stored[b + ".weight_scale"], stored[b + ".weight_shape"] = p, s, shape
            deq[k] = dq
        else:
            stored[k] = v
            deq[k] = v.float()
    save_file({k: v.contiguous() for k, v in stored.items()}, os.path.join(d, "model.safetensors"))
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 4, "type": "int", "symmetric": True, "group_size": 32, "strategy": "group"}}},
          "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}
    json.dump(config_json("kimi_k2", {"quantization_config": qc}), open(os.path.join(d, "config.json"), "w"), indent=1)
    reference(m, deq, d, "int4 routed experts (nibble - 8) x bf16 group scale, the rest bf16")
    print("wrote", root)


if __name__ == "__main__":
    main()
