#!/usr/bin/env python3
"""Reference points for the expert codecs on the trained default model, scored by stock
transformers exactly as the trainer scores held-out text (train_kimi_linear.perplexity):
routed experts as trained (BF16), rounded to 3- and 4-bit round-to-nearest (per 32-weight group,
absmax scale: the usual baseline a 3-bit codec must beat), and removed altogether (how much the
experts matter at all on this model).

    python3 tools/train/codec_baselines.py bench-out/default-hf
"""

import json
import os
import sys

import torch
from transformers import KimiLinearForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from train_kimi_linear import perplexity  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def rtn(w, bits, group=32):
    """Symmetric round-to-nearest along the input dimension, one scale per `group` weights."""
    q = (1 << (bits - 1)) - 1  # 3 bits: levels -3..3 (and -4, unused) as in a signed int3
    g = w.reshape(-1, group)
    scale = g.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / q
    return (torch.round(g / scale).clamp(-q - 1, q) * scale).reshape(w.shape)


def main():
    out = sys.argv[1]
    torch.set_num_threads(2)
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    ids = torch.tensor(tok.encode(open(os.path.join(out, "heldout.txt"), encoding="utf-8").read()).ids)
    window = json.load(open(os.path.join(out, "metrics.json")))["eval_window"]
    results = {}
    for name in ["bf16", "rtn4_g32", "rtn3_g32", "no_routed_experts"]:
        model = KimiLinearForCausalLM.from_pretrained(out, dtype=torch.float32)
        with torch.no_grad():
            for layer in model.model.layers:
                experts = getattr(layer.mlp, "experts", None)
                if experts is None:
                    continue
                for p in (experts.gate_up_proj, experts.down_proj):
                    if name.startswith("rtn"):
                        p.copy_(rtn(p, int(name[3])))
                    elif name == "no_routed_experts":
                        p.zero_()
        ppl, _, _ = perplexity(model, ids, window)
        results[name] = ppl
        print(f"{name:>18}: held-out perplexity {ppl:.4f}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
