"""Reference logits for two approximations of the routed experts, computed by stock transformers.

On the golden tiny Kimi-Linear (fixtures/golden/tiny-kimi-linear, 16 BF16 experts, top 4), with
KimiLinearForCausalLM's MoE blocks patched here (transformers 5.24, CPU, f32):

- HOBBIT as the engine runs it over one chunk from a cold cache (`chunk_rule`): an expert's
  copy is used only where it is among the lightest of every token that chose it.
- Expert Deferral (KTransformers): each token's `n` lightest routed experts (by routing weight;
  of equal weights the higher expert id is the lighter) are summed apart, and that sum is added
  to the residual stream at the end of the *next* decoder layer instead of this one. The last
  layer defers nothing.
- HOBBIT's low-bit copies: each token's `n` lightest routed experts (`n` = 4: all of them, as a
  model converted with `--experts int2` computes) are computed from a copy of
  their matrices rounded to `bits`-bit integers, in groups of 32 along each row (16 or 8 where a
  row's length is not a multiple of 32), one f16 scale a group: the scale, out of nine
  candidates between max|w| / qmax and max|w| / -qmin, with the least squared error (f32,
  summed in order), values rounded half away from zero.

    python3 tools/golden/expert_approx.py fixtures/golden/tiny-kimi-linear fixtures/golden/tiny-kimi-linear-approx

Needs torch and transformers 5.24 (pip install torch==2.15.0 transformers==5.24.0 numpy). It
checks its own pipeline first: with nothing approximated it must reproduce the golden logits.
"""

import json
import os
import sys

import numpy as np
import torch
from transformers import KimiLinearForCausalLM
from transformers.models.kimi_linear import modeling_kimi_linear as mkl

CASES = [
    {"name": "defer-1", "defer": 1},
    {"name": "defer-2", "defer": 2},
    {"name": "low-bit-2-bits-2", "low_bit": 2, "bits": 2},
    {"name": "low-bit-3-bits-3", "low_bit": 3, "bits": 3},
    # Every expert from its copy: what a model converted with `--experts int2` computes.
    {"name": "int2-experts", "low_bit": 4, "bits": 2},
    # HOBBIT from a cold cache over one chunk: an expert's copy is used only when it is among
    # the 2 lightest of every token that chose it (else its record is read whole for all).
    {"name": "hobbit-chunk-2", "low_bit": 2, "bits": 2, "chunk_rule": True},
]


def round_away(x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) == np.float32(0.5), t + np.sign(x), np.rint(x)).astype(np.float32)


def rtn(w, bits):
    """Round-to-nearest copy of a [rows, cols] f32 matrix, groups along each row."""
    rows, cols = w.shape
    group = next((g for g in (32, 16, 8) if cols % g == 0), cols)
    g = w.astype(np.float32).reshape(-1, group)
    qmin, qmax = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    amax = np.abs(g).max(axis=1)
    best_err = np.full(len(g), np.inf, dtype=np.float64)
    best_s = np.zeros(len(g), dtype=np.float32)
    for step in range(9):
        div = np.float32(qmax) + np.float32(-qmin - qmax) * np.float32(step) / np.float32(8)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = (amax / div).astype(np.float16).astype(np.float32)
            q = np.clip(round_away(g / s[:, None]), qmin, qmax)
            err = np.cumsum((g - q * s[:, None]) ** 2, axis=1, dtype=np.float32)[:, -1]
        better = (s != 0) & (err < best_err)
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(round_away(g / best_s[:, None]), qmin, qmax)
    out = np.where(best_s[:, None] == 0, np.float32(0), q * best_s[:, None]).astype(np.float32)
    return out.reshape(rows, cols)


def lightest(weights, ids, n):
    """Per token, a mask of its n lightest routed experts."""
    mask = torch.zeros_like(weights, dtype=torch.bool)
    for t in range(weights.shape[0]):
        order = sorted(range(weights.shape[1]), key=lambda j: (weights[t, j].item(), -ids[t, j].item()))
        mask[t, order[:n]] = True
    return mask


def patch(model, case):
    state = {"pending": None, "stash": None}
    n_def, n_low, bits = case.get("defer", 0), case.get("low_bit", 0), case.get("bits", 0)
    layers = model.model.layers
    low_cache = {}

    def low_copy(experts, e):
        key = (id(experts), e)
        if key not in low_cache:
            gu = rtn(experts.gate_up_proj[e].detach().numpy(), bits)
            dn = rtn(experts.down_proj[e].detach().numpy(), bits)
            low_cache[key] = (torch.from_numpy(gu), torch.from_numpy(dn))
        return low_cache[key]

    def moe_forward(self, hidden_states):
        orig_shape = hidden_states.shape
        _, w, idx = self.gate(hidden_states)
        x = hidden_states.view(-1, hidden_states.shape[-1])
        ex = self.experts
        light = lightest(w, idx, max(n_def, n_low))
        if case.get("chunk_rule"):
            heavy = {int(idx[t, j]) for t in range(w.shape[0]) for j in range(w.shape[1]) if not light[t, j]}
            for t in range(w.shape[0]):
                for j in range(w.shape[1]):
                    light[t, j] = bool(light[t, j]) and int(idx[t, j]) not in heavy
        now, later = torch.zeros_like(x), torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(w.shape[1]):
                e = int(idx[t, j])
                gu, dn = ex.gate_up_proj[e], ex.down_proj[e]
                if n_low and light[t, j]:
                    gu, dn = low_copy(ex, e)
                g, u = torch.nn.functional.linear(x[t], gu).chunk(2, dim=-1)
                y = torch.nn.functional.linear(ex.act_fn(g) * u, dn) * w[t, j]
                if n_def and light[t, j]:
                    later[t] += y
                else:
                    now[t] += y
        state["stash"] = later.view(*orig_shape)
        return now.view(*orig_shape) + self.shared_experts(hidden_states)

    for m in model.modules():
        if isinstance(m, mkl.KimiLinearMoE):
            m.forward = moe_forward.__get__(m)

    for i, layer in enumerate(layers):
        orig = layer.forward
        last = i == len(layers) - 1

        def fwd(*a, _orig=orig, _last=last, **kw):
            state["stash"] = None
            out = _orig(*a, **kw)
            if state["pending"] is not None:
                out = out + state["pending"]
                state["pending"] = None
            if state["stash"] is not None:
                if _last:
                    out = out + state["stash"]
                else:
                    state["pending"] = state["stash"]
            return out

        layer.forward = fwd


def logits(src, ids, case):
    model = KimiLinearForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.eval()
    if case is not None:
        patch(model, case)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    src, out = sys.argv[1], sys.argv[2]
    ids = [int(t) for t in open(os.path.join(src, "golden/ids.txt")).read().split()]
    golden = np.fromfile(os.path.join(src, "golden/logits.f32"), dtype=np.float32).reshape(len(ids), -1)
    check = logits(src, ids, {"name": "none"})
    print(f"patched, nothing approximated, vs the golden logits: rel L2 {rel(check, golden):.2e}")
    assert rel(check, golden) < 1e-5
    os.makedirs(out, exist_ok=True)
    meta = {"source": src, "ids": ids, "transformers": __import__("transformers").__version__, "cases": []}
    for case in CASES:
        got = logits(src, ids, case)
        got.astype("<f4").tofile(os.path.join(out, case["name"] + ".f32"))
        d = rel(got, golden)
        print(f"{case['name']}: rel L2 from the exact logits {d:.3e}")
        meta["cases"].append({**case, "rel_l2_from_exact": d})
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
