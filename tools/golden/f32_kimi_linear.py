"""Reference logits for an f32 Kimi-Linear checkpoint, computed by stock transformers.

The golden tiny Kimi-Linear (fixtures/golden/tiny-kimi-linear, BF16 matrices) is widened to f32
and every BF16 tensor's element i is multiplied by

    1 + ((i * 2654435761 mod 2^32) / 2^32 - 0.5) * 0.02        (computed in f64, rounded to f32)

so its matrices hold values bf16 cannot (the F32 tensors are kept). The k3 tests build the same
checkpoint from the same rule (crates/engine/tests/trunk_policy.rs) and compare k3's logits with
these, which transformers 5.24 computes on CPU in f32 (KimiLinearForCausalLM, torch KDA path).

    python3 tools/golden/f32_kimi_linear.py fixtures/golden/tiny-kimi-linear fixtures/golden/tiny-kimi-linear-f32

Needs torch and transformers 5.24 (pip install torch==2.15.0 transformers==5.24.0 safetensors numpy).
It also checks the pipeline: transformers on the unperturbed checkpoint must reproduce the
golden logits.
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers import KimiLinearForCausalLM


def perturb(a):
    i = np.arange(a.size, dtype=np.uint64)
    u = ((i * np.uint64(2654435761)) % np.uint64(1 << 32)).astype(np.float64) / float(1 << 32)
    return (a.astype(np.float64).ravel() * (1.0 + (u - 0.5) * 0.02)).astype(np.float32).reshape(a.shape)


def bf16_to_f32(raw):
    # safetensors.numpy has no bfloat16: read the raw u16 and widen.
    return (raw.astype(np.uint32) << 16).view(np.float32)


def load_bf16_aware(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        buf = data[s:e]
        shape = info["shape"]
        if info["dtype"] == "BF16":
            out[name] = (bf16_to_f32(np.frombuffer(buf, dtype=np.uint16)).reshape(shape), "BF16")
        elif info["dtype"] == "F32":
            out[name] = (np.frombuffer(buf, dtype=np.float32).reshape(shape).copy(), "F32")
        else:
            raise SystemExit(f"unexpected dtype {info['dtype']} for {name}")
    return out


def logits(model_dir, ids):
    model = KimiLinearForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def main():
    src, out = sys.argv[1], sys.argv[2]
    ids = [int(t) for t in open(os.path.join(src, "golden/ids.txt")).read().split()]
    golden = np.fromfile(os.path.join(src, "golden/logits.f32"), dtype=np.float32).reshape(len(ids), -1)
    check = logits(src, ids)
    rel = float(np.linalg.norm(check - golden) / np.linalg.norm(golden))
    print(f"transformers on the unperturbed checkpoint vs the golden logits: rel L2 {rel:.2e}")
    assert rel < 1e-5, rel

    tensors = load_bf16_aware(os.path.join(src, "model.safetensors"))
    f32 = {n: (perturb(a) if kind == "BF16" else a) for n, (a, kind) in tensors.items()}
    with tempfile.TemporaryDirectory() as tmp:
        save_file(f32, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(os.path.join(src, "config.json"), tmp)
        ref = logits(tmp, ids)
    os.makedirs(os.path.join(out, "golden"), exist_ok=True)
    ref.astype(np.float32).tofile(os.path.join(out, "golden/logits.f32"))
    shutil.copy(os.path.join(src, "golden/ids.txt"), os.path.join(out, "golden/ids.txt"))
    meta = {
        "tokens": len(ids),
        "vocab": int(ref.shape[1]),
        "logits": "f32 [tokens, vocab], every position",
        "reference": f"transformers {__import__('transformers').__version__} KimiLinearForCausalLM, f32, torch {torch.__version__}",
        "checkpoint": "fixtures/golden/tiny-kimi-linear widened to f32, BF16 tensors perturbed (tools/golden/f32_kimi_linear.py)",
        "pipeline_check_rel_l2_vs_golden": rel,
        "argmax": [int(a) for a in ref.argmax(axis=1)],
    }
    json.dump(meta, open(os.path.join(out, "golden/meta.json"), "w"), indent=1)
    print(f"wrote {out}/golden: argmax {meta['argmax']}")


if __name__ == "__main__":
    main()
