#!/usr/bin/env python3
"""Times one training step (forward + backward, batch 16 x 256 tokens) of the default model's
architecture under the KDA chunk sizes and expert implementations the trainer could use, side by
side in one process, and prints the loss and gradient norm of each (they must agree: the choices
change the grouping of the arithmetic, not the function).

    python3 tools/train/time_step.py bench-out/default-hf
"""

import functools
import statistics
import sys
import time

import torch
import transformers.models.kimi_linear.modeling_kimi_linear as kimi_modeling
from transformers import KimiLinearConfig, KimiLinearForCausalLM

stock = kimi_modeling.chunk_kimi_delta_attention
torch.set_num_threads(2)
x = torch.randint(0, 4096, (16, 256), generator=torch.Generator().manual_seed(0))
variants = [("eager experts, chunk 64", "eager", 64), ("eager experts, chunk 16", "eager", 16),
            ("grouped_mm experts, chunk 16", "grouped_mm", 16)]
for name, experts, chunk in variants:
    cfg = KimiLinearConfig.from_pretrained(sys.argv[1])
    cfg.dtype = torch.float32
    cfg._experts_implementation = experts
    torch.manual_seed(0)
    model = KimiLinearForCausalLM(cfg).float()
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0.0, 0.02)
    kimi_modeling.chunk_kimi_delta_attention = functools.partial(stock, chunk_size=chunk)
    times = []
    for _ in range(3):
        model.zero_grad()
        t = time.perf_counter()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        times.append(time.perf_counter() - t)
    gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    print(f"{name:>30}: median step {statistics.median(times):.2f} s  loss {out.loss.item():.8f}  "
          f"grad norm {gn.item():.8f}", flush=True)
