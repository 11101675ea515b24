"""Long-context golden logits (N = 16,384 positions) for three tiny random-weight models, computed by
code this project did not write:

- `tiny-kimi-linear`: transformers 5.24.0 `KimiLinearForCausalLM`, CPU, f32, SDPA attention, the
  pure-torch KDA path (`chunk_kimi_delta_attention`; fla must not be importable when transformers
  loads, or it would take fla's Triton kernels: the script checks). One forward of the whole prompt.
- `deepseek-v3` (the `bf16/` checkpoint, K2 layout, YaRN factor 32 from 4096): transformers 5.24.0
  `DeepseekV3ForCausalLM`, f32, SDPA, built and loaded by `tools/golden/deepseek_v3.py`'s own
  `DIMS`/`ROPE`/`load_into` (experts saved per expert, fused on load). One forward.
- `tiny-k3`: WARP's pure-PyTorch K3 oracle (`sqliteai/warp` `tools/kimi_ref.py`, fla-core 0.6.0's
  `naive_recurrent_kda`), fed by `tools/golden/kimi_k3_vision.py`'s stand-in for WARP's container
  (no image). The prompt goes in as 16 chunks of 1,024 tokens through the oracle's own state
  (KDA recurrent state, short-conv tails, MLA key/value cache) - its decode path, exact
  continuation; the script checks chunked == one call on a 512-token prefix. Dequantized experts
  are memoized (the values are `mxfp4.dequant`'s, unchanged).

Before any long run, each reference must reproduce its model's short golden
(`<model>/golden/logits.f32`) to 1e-5 relative L2, or the script stops.

Prompt: `numpy.random.default_rng(SEED).integers(LO, HI, N)`: ids in [0, 508) for the Kimi models
(508..511 are bos / unused / eos / pad in their configs), [2, 512) for deepseek-v3 (0 = bos,
1 = eos). Stored: logits at positions 0, 1024, ..., 15360 and 16320..16383 (80 rows).
Sensitivities (in meta.json): relative L2 over the stored rows at positions >= 8192 between the
logits and (a) the same prompt without its first 4,096 tokens (rows at the same tokens), (b) for
deepseek-v3, positions offset by +1 and YaRN off (plain RoPE, theta 50000). Kimi-Linear and tiny-k3
use no positional encoding (`mla_use_nope`), so (b) does not apply to them.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install --no-cache-dir torch==2.15.0 \
        transformers==5.24.0 numpy safetensors pillow==13.0.0 einops
    pip download fla-core==0.6.0 --no-deps -d /tmp/vl && (cd /tmp/vl && mkdir fla && cd fla && unzip ../fla_core-0.6.0-*.whl)
    (WARP: the search tool's `fetch github:sqliteai/warp`; git show HEAD:tools/kimi_ref.py, HEAD:tools/mxfp4.py
     into /tmp/vl/warp; WARP at 7f1fbba3cbaee0e9fdaffd940d87ff2dba9ee09b)
    /tmp/venv/bin/python tools/golden/long_context.py --fla /tmp/vl/fla --warp /tmp/vl/warp \
        fixtures/golden fixtures/golden/long

`--only NAME` runs one model. All three take ~8 minutes on 2 CPUs (peak RSS 11.5 GB).

`--f64` (Kimi-Linear only; `--fla`/`--warp` not needed): the same reference, same ids, in float64, to tell
the f32 reference's own rounding from an engine's error. Weights loaded as f64, SDPA, eager experts
(`grouped_mm` has no f64), and the explicit f32 upcasts of `modeling_kimi_linear` (RMSNorm, gated norm,
forget gate, both KDA paths, router, eager softmax: `torch.float32`, `.float()`) rewritten to f64 in a
copy of the module loaded beside it; the script checks every module output is f64. Writes only
`<out>/tiny-kimi-linear/logits-f64.f32` (the 80 rows, cast to f32, same layout) and `meta-f64.json`,
never `logits.f32`, and prints each stored row's rel-L2 of `logits.f32` against it if that exists.
~2.5 minutes, peak RSS 21 GB (SDPA in f64 on 16,384 tokens).
Why it exists: the f32 reference's router picks a different expert set from f64's at token 14387
(layer 2: 4th/5th expert score margin 9e-8, below f32 rounding) and 15951 (layer 3, 9.5e-7); every
later position carries that, so logits.f32 is 1e-5..1.3e-4 from f64 at the rows >= 15360 (~2e-6 before).

    /tmp/venv/bin/python tools/golden/long_context.py --f64 fixtures/golden fixtures/golden/long
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np
import torch

# transformers first, while fla is not on the path (its Triton kernels would replace the torch KDA).
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, KimiLinearForCausalLM  # noqa: E402

assert "fla" not in sys.modules
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_v3 as dsv3  # noqa: E402
import kimi_k3_vision as k3v  # noqa: E402

N = 16384
CUT = 4096  # (a): the prompt without its first CUT tokens
FROM = 8192  # sensitivities over the stored rows at positions >= FROM
POSITIONS = list(range(0, N, 1024)) + list(range(N - 64, N))
SEEDS = {"tiny-kimi-linear": 20261, "deepseek-v3": 20262, "tiny-k3": 20263}
RANGES = {"tiny-kimi-linear": (0, 508), "deepseek-v3": (2, 512), "tiny-k3": (0, 508)}
CHUNK = 1024  # tiny-k3: tokens per oracle call

torch.set_grad_enabled(False)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def prompt(name):
    lo, hi = RANGES[name]
    return np.random.default_rng(SEEDS[name]).integers(lo, hi, N).tolist()


# ------------------------------------------------------------------ references ---

class KimiLinear:
    package = f"transformers {__import__('transformers').__version__} KimiLinearForCausalLM, f32, sdpa, torch KDA path"

    def __init__(self, root):
        self.src = os.path.join(root, "tiny-kimi-linear")
        self.m = KimiLinearForCausalLM.from_pretrained(self.src, dtype=torch.float32, attn_implementation="sdpa").eval()
        assert "fla" not in sys.modules

    def logits(self, ids, offset=0):
        assert offset == 0
        return self.m(torch.tensor([ids])).logits[0].float().numpy()


def kimi_linear_f64_module():
    """A copy of transformers' modeling_kimi_linear with its f32 upcasts made f64 (see the docstring)."""
    from transformers.models.kimi_linear import modeling_kimi_linear as mkl

    src = open(mkl.__file__).read()
    assert src.count("torch.float32") and src.count(".float()")
    src = src.replace("torch.float32", "torch.float64").replace(".float()", ".double()")
    name = mkl.__name__ + "_f64"
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    mod.__package__, mod.__file__ = mkl.__package__, mkl.__file__
    sys.modules[name] = mod
    exec(compile(src, mkl.__file__ + " (f64)", "exec"), mod.__dict__)
    return mod


class KimiLinearF64(KimiLinear):
    package = (f"transformers {__import__('transformers').__version__} KimiLinearForCausalLM, f64 (weights, "
               "activations and the module's f32 upcasts), sdpa, eager experts, torch KDA path")

    def __init__(self, root):
        self.src = os.path.join(root, "tiny-kimi-linear")
        self.m = kimi_linear_f64_module().KimiLinearForCausalLM.from_pretrained(
            self.src, dtype=torch.float64, attn_implementation="sdpa", experts_implementation="eager").eval()
        assert "fla" not in sys.modules
        assert all(p.dtype == torch.float64 for p in list(self.m.parameters()) + list(self.m.buffers()))
        self.not_f64 = set()

        def hook(module, inp, out):
            for t in out if isinstance(out, tuple) else (out,):
                if torch.is_tensor(t) and t.is_floating_point() and t.dtype != torch.float64:
                    self.not_f64.add((type(module).__name__, str(t.dtype)))

        self.hooks = [m.register_forward_hook(hook) for m in self.m.modules()]

    def logits(self, ids, offset=0):
        assert offset == 0
        out = self.m(torch.tensor([ids])).logits[0]
        assert out.dtype == torch.float64 and not self.not_f64, self.not_f64
        for h in self.hooks:  # checked on the first call (the short golden)
            h.remove()
        self.hooks = []
        return out.numpy()


def run_f64(args):
    name = "tiny-kimi-linear"
    t0 = time.time()
    ref = KimiLinearF64(args.root)
    meta = {"model": f"fixtures/golden/{os.path.relpath(ref.src, args.root)}", "reference": ref.package,
            "torch": torch.__version__}
    meta["short_golden_rel_l2"] = short_check(name, ref)
    ids = prompt(name)
    out = os.path.join(args.out, name)
    if os.path.exists(os.path.join(out, "ids.txt")):
        assert open(os.path.join(out, "ids.txt")).read().split() == list(map(str, ids))
    t1 = time.time()
    full = ref.logits(ids)
    meta["seconds_full_run"] = round(time.time() - t1, 1)
    print(f"[{name}] f64: {N} tokens in {meta['seconds_full_run']} s", flush=True)
    assert full.shape[0] == N and np.isfinite(full).all()
    rows = full[POSITIONS]
    os.makedirs(out, exist_ok=True)
    rows.astype("<f4").tofile(os.path.join(out, "logits-f64.f32"))
    f32 = os.path.join(out, "logits.f32")
    if os.path.exists(f32):
        stored = np.fromfile(f32, dtype="<f4").reshape(rows.shape).astype(np.float64)
        per_row = np.linalg.norm(stored - rows, axis=1) / np.linalg.norm(rows, axis=1)
        for p, e, n in zip(POSITIONS, per_row, np.linalg.norm(rows, axis=1)):
            print(f"  position {p:5d}: logits.f32 vs f64 rel-L2 {e:.2e}  (||f64 row|| {n:.2f})")
        meta["logits_f32_vs_f64_rel_l2_per_row"] = [float(e) for e in per_row]
    meta.update({"N": N, "seed": SEEDS[name], "positions": len(POSITIONS),
                 "logits": f"logits-f64.f32: little-endian f32 [{len(POSITIONS)}, {rows.shape[1]}] (f64 cast to "
                           "f32), row i = position positions[i]",
                 "fed": "one forward from an empty state", "seconds_total": round(time.time() - t0, 1)})
    json.dump(meta, open(os.path.join(out, "meta-f64.json"), "w"), indent=1)


class DeepSeek:
    package = f"transformers {__import__('transformers').__version__} DeepseekV3ForCausalLM, f32, sdpa"

    def __init__(self, root, yarn=True):
        self.src = os.path.join(root, "deepseek-v3", "bf16")
        from safetensors.torch import load_file

        if yarn:
            rope = {"rope_type": "yarn", "rope_theta": 50000.0, **{k: v for k, v in dsv3.ROPE.items() if k != "type"}}
        else:
            rope = {"rope_type": "default", "rope_theta": 50000.0}
        cfg = DeepseekV3Config(**dsv3.DIMS, rope_parameters=rope, attn_implementation="sdpa")
        self.m = DeepseekV3ForCausalLM(cfg).float().eval()
        dsv3.load_into(self.m, {k: v.float() for k, v in load_file(os.path.join(self.src, "model.safetensors")).items()})

    def logits(self, ids, offset=0):
        pos = (torch.arange(len(ids)) + offset).unsqueeze(0)
        return self.m(torch.tensor([ids]), position_ids=pos).logits[0].float().numpy()


class MemoTensors(k3v.Tensors):
    """kimi_k3_vision's stand-in for WARP's container, with each dequantized expert kept."""

    def expert(self, layer, e):
        memo = self.__dict__.setdefault("_memo", {})
        if (layer, e) not in memo:
            memo[(layer, e)] = super().expert(layer, e)
        return memo[(layer, e)]


class K3:
    package = "WARP tools/kimi_ref.py (sqliteai/warp 7f1fbba) + fla-core 0.6.0 naive_recurrent_kda, f32"

    def __init__(self, root, fla, warp):
        self.src = os.path.join(root, "tiny-k3")
        sys.path.insert(0, fla)
        sys.path.insert(0, warp)
        import kimi_ref
        import mxfp4

        self.cfg = json.load(open(os.path.join(self.src, "config.json")))["text_config"]
        c = MemoTensors(self.src, self.cfg, mxfp4)
        c.cfg = self.cfg
        self.ref = kimi_ref.KimiRef(c)

    def logits(self, ids, offset=0, chunk=CHUNK):
        assert offset == 0
        self.ref.reset()
        out = []
        for s in range(0, len(ids), chunk):
            out.append(self.ref.forward(torch.tensor(ids[s:s + chunk])).numpy())
        self.ref.reset()
        return np.concatenate(out)


# ------------------------------------------------------------------------ run ---

def short_check(name, ref):
    g = os.path.join(ref.src, "golden")
    ids = [int(t) for t in open(os.path.join(g, "ids.txt")).read().split()]
    gold = np.fromfile(os.path.join(g, "logits.f32"), dtype=np.float32).reshape(len(ids), -1)
    err = rel(ref.logits(ids), gold)
    print(f"[{name}] short golden ({len(ids)} tokens): rel-L2 {err:.2e}", flush=True)
    assert err < 1e-5, (name, err)
    return err


def run(name, args):
    t0 = time.time()
    if name == "tiny-kimi-linear":
        ref = KimiLinear(args.root)
    elif name == "deepseek-v3":
        ref = DeepSeek(args.root)
    else:
        ref = K3(args.root, args.fla, args.warp)
    meta = {"model": f"fixtures/golden/{os.path.relpath(ref.src, args.root)}", "reference": ref.package,
            "torch": torch.__version__}
    meta["short_golden_rel_l2"] = short_check(name, ref)
    if name == "tiny-k3":
        # Chunked continuation through the oracle's state == one call (512-token prefix).
        ids = prompt(name)[:512]
        meta["chunked_vs_one_call_rel_l2_512"] = rel(ref.logits(ids, chunk=128), ref.logits(ids, chunk=512))
        print(f"[{name}] chunks of 128 vs one call, 512 tokens: {meta['chunked_vs_one_call_rel_l2_512']:.2e}")
        assert meta["chunked_vs_one_call_rel_l2_512"] < 1e-5

    ids = prompt(name)
    lo, hi = RANGES[name]
    t1 = time.time()
    full = ref.logits(ids)
    meta["seconds_full_run"] = round(time.time() - t1, 1)
    print(f"[{name}] {N} tokens in {meta['seconds_full_run']} s", flush=True)
    assert full.shape[0] == N and np.isfinite(full).all()
    vocab = full.shape[1]
    rows = full[POSITIONS].astype(np.float32)

    out = os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "ids.txt"), "w").write(" ".join(map(str, ids)) + "\n")
    open(os.path.join(out, "positions.txt"), "w").write(" ".join(map(str, POSITIONS)) + "\n")
    rows.astype("<f4").tofile(os.path.join(out, "logits.f32"))

    late = [i for i, p in enumerate(POSITIONS) if p >= FROM]
    late_pos = [POSITIONS[i] for i in late]
    sens = {}
    t1 = time.time()
    cut = ref.logits(ids[CUT:])
    sens["drop_first_4096"] = rel(cut[[p - CUT for p in late_pos]], full[late_pos])
    print(f"[{name}] (a) without the first {CUT} tokens: {sens['drop_first_4096']:.3e} ({time.time() - t1:.0f} s)",
          flush=True)
    if name == "deepseek-v3":
        t1 = time.time()
        sens["positions_plus_1"] = rel(ref.logits(ids, offset=1)[late_pos], full[late_pos])
        print(f"[{name}] (b) positions + 1: {sens['positions_plus_1']:.3e} ({time.time() - t1:.0f} s)", flush=True)
        del ref
        t1 = time.time()
        sens["yarn_off"] = rel(DeepSeek(args.root, yarn=False).logits(ids)[late_pos], full[late_pos])
        print(f"[{name}] (b) YaRN off: {sens['yarn_off']:.3e} ({time.time() - t1:.0f} s)", flush=True)

    meta.update({
        "N": N, "seed": SEEDS[name],
        "ids": f"numpy.random.default_rng({SEEDS[name]}).integers({lo}, {hi}, {N})",
        "positions": len(POSITIONS), "vocab": vocab,
        "logits": f"little-endian f32 [{len(POSITIONS)}, {vocab}], row i = position positions[i]",
        "fed": (f"{N // CHUNK} chunks of {CHUNK} through the oracle's state, from empty" if name == "tiny-k3"
                else "one forward from an empty state"),
        "sensitivity": {"rows": f"stored rows at positions >= {FROM} ({len(late)})",
                        "metric": "||a - b|| / ||b||, b = these logits", **sens},
        "argmax_last": int(full[-1].argmax()),
        "seconds_total": round(time.time() - t0, 1),
    })
    json.dump(meta, open(os.path.join(out, "meta.json"), "w"), indent=1)
    print(json.dumps(meta, indent=1), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fla")
    ap.add_argument("--warp")
    ap.add_argument("--only", choices=list(SEEDS))
    ap.add_argument("--f64", action="store_true", help="Kimi-Linear only: f64 logits to logits-f64.f32")
    ap.add_argument("root")
    ap.add_argument("out")
    args = ap.parse_args()
    if args.f64:
        if args.only not in (None, "tiny-kimi-linear"):
            ap.error("--f64 is for tiny-kimi-linear only")
        run_f64(args)
        return
    if not (args.fla and args.warp):
        ap.error("--fla and --warp are required (except with --f64)")
    # tiny-k3 last: it puts fla on sys.path.
    for name in [args.only] if args.only else list(SEEDS):
        run(name, args)


if __name__ == "__main__":
    main()
