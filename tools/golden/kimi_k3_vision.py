"""A tiny K3 vision tower (MoonViT3d + PatchMergerMLPV2 projector) in the release's tensor layout,
with reference outputs computed by code this project did not write:

- the tower and projector: SGLang 0.5.23's `sglang/srt/models/kimi_k3_vl.py` (`KimiK3VisionTower`,
  `KimiK3MultiModalProjector`: "faithful port of the checkpoint reference implementation"), loaded
  from the wheel with stand-ins for its CUDA-side imports (the attention backend resolves to torch
  SDPA on CPU; `tpool_patch_merger` and `concat_or_single` are SGLang's own, read from their files);
- preprocessing: SGLang's `navit_resize_config` (target size and padding), the checkpoint
  processor's resize as SGLang documents it (`PIL.Image.resize(..., BICUBIC)`, Pillow 13), and
  SGLang's `_normalize_and_patchify_torch`;
- the language model's logits with the image's embeddings in place of its placeholder tokens:
  WARP's pure-PyTorch K3 oracle (`sqliteai/warp` `tools/kimi_ref.py`, with fla-core 0.6.0's
  `naive_recurrent_kda`), fed from the safetensors checkpoint through a stand-in for its WASTE
  container (experts dequantized by WARP's `tools/mxfp4.py`). The embedding table is the only
  thing the stand-in changes: rows of the placeholder id come from the projector, in order. The
  stand-in is first checked on the text-only golden prompt against `tiny-k3/golden/logits.f32`
  (the independent numpy reference): it must agree to 1e-5 or the script stops.

Everything runs in f32 on the BF16-stored weights (upcast exactly).

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch==2.15.0 numpy pillow==13.0.0 safetensors
    pip download sglang==0.5.23 fla-core==0.6.0 --no-deps -d /tmp/vl   # unzip both wheels
    (WARP: the search tool's `fetch github:sqliteai/warp`; git show HEAD:tools/kimi_ref.py, HEAD:tools/mxfp4.py)
    /tmp/venv/bin/python tools/golden/kimi_k3_vision.py --sglang /tmp/vl/sgl --fla /tmp/vl/fla \
        --warp /tmp/vl/warp fixtures/golden/tiny-k3 fixtures/golden/tiny-k3-vision
"""

import argparse
import ast
import importlib.util
import json
import os
import sys
import types

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

PLACEHOLDER = 500  # an unused id of the tiny vocabulary (512), K3's is 163605
VISION = dict(
    patch_size=14,
    init_pos_emb_height=8,
    init_pos_emb_width=8,
    init_pos_emb_time=4,
    pos_emb_type="divided_fixed",
    vt_num_attention_heads=2,
    vt_num_hidden_layers=2,
    vt_hidden_size=64,
    vt_intermediate_size=128,
    merge_kernel_size=[2, 2],
    video_attn_type="spatial_temporal",
    merge_type="sd2_tpool",
    mm_projector_type="patchmergerv2",
    projector_hidden_act="gelu",
    projector_ln_eps=1e-5,
    qkv_hidden_size=96,
    norm_type="rmsnorm",
    attn_bias=False,
    patch_embed_proj_bias=False,
    mlp_type="mlp2",
    linear_bias=False,
    activation_func="gelu_pytorch_tanh",
    pos_emb_interpolation_mode="bilinear",
    text_hidden_size=256,
)
PROCESSOR = {
    "media_proc_cfg": {
        "in_patch_limit": 64,
        "patch_limit_on_one_side": 512,
        "patch_size": 14,
        "merge_kernel_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
}


def functions_from(path, names, namespace):
    """Top-level functions of a source file, executed from that file's own text."""
    tree = ast.parse(open(path).read())
    picked = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in picked} == set(names), (path, names)
    code = compile(ast.Module(body=picked, type_ignores=[]), path, "exec")
    exec(code, namespace)
    return [namespace[n] for n in names]


def stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load_sglang(root):
    srt = os.path.join(root, "sglang", "srt")
    ns = {"torch": torch, "F": torch.nn.functional, "np": np, "math": __import__("math")}
    from typing import List, Optional, Sequence

    ns.update(List=List, Optional=Optional, Sequence=Sequence, Callable=None, Union=None, Dict=dict)
    (tpool,) = functions_from(os.path.join(srt, "models", "kimi_vl_moonvit.py"), ["tpool_patch_merger"], ns)
    (concat,) = functions_from(os.path.join(srt, "multimodal", "mm_utils.py"), ["concat_or_single"], ns)
    (navit,) = functions_from(os.path.join(srt, "multimodal", "processors", "kimi_k25.py"), ["navit_resize_config"], ns)
    (patchify,) = functions_from(
        os.path.join(root, "sglang", "kernels", "ops", "mm", "process", "image.py"),
        ["_normalize_and_patchify_torch"],
        ns,
    )

    class Meta:
        def __init__(self, cu_seqlens):
            self.cu_seqlens = cu_seqlens
            self.max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())

    def no_mm():
        raise ValueError("no runtime context")

    for pkg in ["sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention", "sglang.srt",
                "sglang.srt.layers", "sglang.srt.layers.attention", "sglang.srt.models", "sglang.srt.multimodal"]:
        stub(pkg)
    stub("sglang.kernels.ops.attention.vision_rope",
         apply_fused_qk_complex_rope=None,
         can_use_fused_qk_complex_rope=lambda **_: False,
         precompile_fused_qk_complex_rope=lambda **_: False)
    flag = types.SimpleNamespace(get=lambda: False)
    stub("sglang.srt.environ", envs=types.SimpleNamespace(SGLANG_VIT_ENABLE_CUDA_GRAPH=flag))
    stub("sglang.srt.layers.attention.vision",
         FLASHINFER_WORKSPACE_SIZE_BYTES=0, QKV_BACKEND_IMPL={}, VisionAttentionMetadata=Meta,
         prepare_flashinfer_cudnn_vision_attention_metadata=None,
         prepare_vision_attention_metadata=lambda cu, device=None: Meta(cu))
    stub("sglang.srt.models.kimi_vl_moonvit", tpool_patch_merger=tpool)
    stub("sglang.srt.multimodal.mm_utils", concat_or_single=concat)
    stub("sglang.srt.runtime_context", get_mm=no_mm)
    stub("sglang.srt.utils", get_bool_env_var=lambda *_: False, is_hip=lambda: False, print_info_once=print)
    spec = importlib.util.spec_from_file_location("kimi_k3_vl", os.path.join(srt, "models", "kimi_k3_vl.py"))
    vl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vl)
    return vl, navit, patchify


def make_image(path):
    """A 200 x 150 RGB picture with edges, gradients and noise (PNG: decoded exactly everywhere)."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:150, 0:200].astype(np.float64)
    r = 127 + 100 * np.sin(x / 9.0) * np.cos(y / 13.0)
    g = 255 * (x / 199.0)
    b = np.where((x // 25 + y // 25) % 2 == 0, 220.0, 30.0)
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (150, 200, 3))
    img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    Image.fromarray(img, "RGB").save(path)


def other_encodings(g):
    """The picture as JPEG (quality 90) and lossless WebP, with Pillow's decodes of them (RGB u8):
    the decoders' reference (libjpeg-turbo's IDCT differs from other decoders' by a level or two;
    lossless WebP decodes exactly everywhere)."""
    src = Image.open(os.path.join(g, "picture.png")).convert("RGB")
    src.save(os.path.join(g, "picture.jpg"), quality=90)
    src.save(os.path.join(g, "picture.webp"), lossless=True)
    for name in ("picture.jpg", "picture.webp"):
        a = np.asarray(Image.open(os.path.join(g, name)).convert("RGB"))
        a.astype(np.uint8).tofile(os.path.join(g, name.replace(".", "-") + ".rgb"))


def preprocess(path, navit, patchify):
    cfg = PROCESSOR["media_proc_cfg"]
    image = Image.open(path).convert("RGB")
    w, h = image.size
    rc = navit(w, h, cfg["patch_size"], cfg["merge_kernel_size"], cfg["in_patch_limit"],
               cfg["patch_limit_on_one_side"], None)
    resized = image.resize((rc["new_width"], rc["new_height"]), Image.BICUBIC)
    x = torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1).unsqueeze(0).float()
    scale = torch.tensor([1.0 / (255.0 * s) for s in cfg["image_std"]]).view(1, 3, 1, 1)
    bias = torch.tensor([-m / s for m, s in zip(cfg["image_mean"], cfg["image_std"])]).view(1, 3, 1, 1)
    ph, pw = rc["new_height"] + rc["pad_height"], rc["new_width"] + rc["pad_width"]
    pixels = patchify(x, scale, bias, cfg["patch_size"], ph, pw).squeeze(0)
    grid = [1, ph // cfg["patch_size"], pw // cfg["patch_size"]]
    return rc, np.asarray(resized), pixels, grid


def vision_weights(tower, projector):
    """Random BF16 weights under the release's names, and the f32 values the modules get."""
    g = torch.Generator().manual_seed(3)
    out = {}
    for prefix, mod in (("vision_tower.", tower), ("mm_projector.", projector)):
        for name, p in mod.named_parameters():
            if name.endswith("norm0.weight") or name.endswith("norm1.weight") or "layernorm" in name \
                    or "post_norm" in name:
                w = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            elif "pos_emb" in name:
                w = 0.5 * torch.randn(p.shape, generator=g)
            else:
                w = torch.randn(p.shape, generator=g) / (p.shape[-1] if p.dim() == 2 else 588) ** 0.5
            w = w.to(torch.bfloat16)
            out[prefix + name] = w.contiguous()
            with torch.no_grad():
                p.copy_(w.float())
    return out


class Tensors(dict):
    """WARP's `Container` interface over a safetensors checkpoint (trunk in f32, experts dequantized
    by WARP's mxfp4.py); the embedding table takes the image's rows for placeholder ids."""

    def __init__(self, ckpt, cfg, mxfp4, image_rows=None):
        tensors = {}
        for f in sorted(os.listdir(ckpt)):
            if f.endswith(".safetensors") and "vision" not in f:
                tensors.update(load_file(os.path.join(ckpt, f)))
        self.raw, self.mxfp4, self.cfg = tensors, mxfp4, cfg
        super().__init__({k: v.float() for k, v in tensors.items() if ".experts." not in k})
        if image_rows is not None:
            self["model.embed_tokens.weight"] = Embedding(self["model.embed_tokens.weight"], image_rows)
        self.t, self.prefix = self, ""

    def expert(self, layer, e):
        def deq(m):
            p = f"model.layers.{layer}.block_sparse_moe.experts.{e}.{m}"
            return self.mxfp4.dequant(self.raw[p + ".weight_packed"], self.raw[p + ".weight_scale"])

        return {"gate": deq("w1"), "up": deq("w3"), "down": deq("w2")}


class Embedding:
    def __init__(self, table, rows):
        self.table, self.rows = table, rows

    def __getitem__(self, ids):
        x = self.table[ids].clone()
        at = (ids == PLACEHOLDER).nonzero().flatten()
        assert len(at) == self.rows.shape[0], (len(at), self.rows.shape)
        x[at] = self.rows
        return x


def warp_logits(args, cfg, ids, image_rows=None):
    sys.path.insert(0, args.fla)
    sys.path.insert(0, args.warp)
    import kimi_ref
    import mxfp4

    c = Tensors(args.src, cfg, mxfp4, image_rows)
    c.cfg = cfg
    ref = kimi_ref.KimiRef(c)
    with torch.no_grad():
        return ref.forward(torch.tensor(ids))


SPECIALS = {256: "<|open|>", 257: "<|close|>", 258: "<|sep|>", 259: "<|end_of_msg|>", 260: "<|media_begin|>",
            261: "<|media_content|>", 262: "<|media_end|>", PLACEHOLDER: "<|kimi_image_placeholder|>",
            508: "[BOS]", 510: "[EOS]", 511: "[PAD]"}


def write_tokenizer(out):
    """Not a reference: a byte-level tokenizer that fits the tiny vocabulary (512), with K3's chat
    and media markers as special tokens, so the tiny model can be chatted with (k3-cli, the server)."""
    import base64

    with open(os.path.join(out, "tiktoken.model"), "w") as f:
        for b in range(256):
            f.write(f"{base64.b64encode(bytes([b])).decode()} {b}\n")
    added = {str(i): {"content": c, "special": True} for i, c in SPECIALS.items()}
    json.dump({"added_tokens_decoder": added, "bos_token": "[BOS]", "eos_token": "[EOS]"},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=1)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang", required=True)
    ap.add_argument("--fla", required=True)
    ap.add_argument("--warp", required=True)
    ap.add_argument("src")
    ap.add_argument("out")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "golden"), exist_ok=True)
    write_tokenizer(args.out)
    vl, navit, patchify = load_sglang(args.sglang)
    torch.manual_seed(0)

    src_cfg = json.load(open(os.path.join(args.src, "config.json")))
    text = src_cfg["text_config"]

    # The oracle first: text only, against the independent numpy reference.
    gold_ids = [int(t) for t in open(os.path.join(args.src, "golden", "ids.txt")).read().split()]
    gold = np.fromfile(os.path.join(args.src, "golden", "logits.f32"), dtype=np.float32).reshape(len(gold_ids), -1)
    text_err = rel(warp_logits(args, text, gold_ids).numpy(), gold)
    print(f"WARP oracle on the text golden: rel-L2 {text_err:.2e}")
    assert text_err < 1e-5, text_err

    vcfg = types.SimpleNamespace(**VISION)
    vcfg.mm_hidden_size = vcfg.vt_hidden_size
    tower = vl.KimiK3VisionTower(vcfg).eval()
    projector = vl.KimiK3MultiModalProjector(vcfg).eval()
    weights = vision_weights(tower, projector)
    save_file(weights, os.path.join(args.out, "model-00002-of-00002.safetensors"), metadata={"format": "pt"})

    image_path = os.path.join(args.out, "golden", "picture.png")
    make_image(image_path)
    other_encodings(os.path.join(args.out, "golden"))
    rc, resized, pixels, grid = preprocess(image_path, navit, patchify)
    with torch.no_grad():
        merged = tower(pixels, torch.tensor([grid]))
        embeds = projector(merged)
    n = embeds.shape[0]
    ids = [5, 73, 237, PLACEHOLDER] + [PLACEHOLDER] * (n - 1) + [390, 292, 41]
    logits = warp_logits(args, text, ids, embeds)

    g = os.path.join(args.out, "golden")
    resized.astype(np.uint8).tofile(os.path.join(g, "resized.u8"))
    pixels.numpy().astype(np.float32).tofile(os.path.join(g, "pixels.f32"))
    torch.cat([m.reshape(m.shape[0], -1) for m in merged]).numpy().astype(np.float32).tofile(os.path.join(g, "tower.f32"))
    embeds.numpy().astype(np.float32).tofile(os.path.join(g, "embeds.f32"))
    logits.numpy().astype(np.float32).tofile(os.path.join(g, "logits.f32"))
    open(os.path.join(g, "ids.txt"), "w").write(" ".join(map(str, ids)) + "\n")

    cfg = dict(src_cfg)
    cfg["vision_config"] = VISION
    cfg["media_placeholder_token_id"] = PLACEHOLDER
    json.dump(cfg, open(os.path.join(args.out, "config.json"), "w"), indent=1)
    json.dump(PROCESSOR, open(os.path.join(args.out, "preprocessor_config.json"), "w"), indent=1)
    index = json.load(open(os.path.join(args.src, "model.safetensors.index.json")))
    text_file = "model-00001-of-00002.safetensors"
    wm = {k: text_file for k in index["weight_map"]}
    wm.update({k: "model-00002-of-00002.safetensors" for k in weights})
    json.dump({"metadata": index.get("metadata", {}), "weight_map": wm},
              open(os.path.join(args.out, "model.safetensors.index.json"), "w"), indent=1)
    meta = {
        "image": "picture.png (200 x 150 RGB)",
        "resize": rc,
        "grid_thw": grid,
        "positions": n,
        "resized": f"u8 [{rc['new_height']}, {rc['new_width']}, 3], PIL bicubic",
        "pixels": f"f32 {list(pixels.shape)}, patches (c, y, x) after normalization, padding = -mean/std",
        "tower": f"f32 [{n}, {4 * VISION['vt_hidden_size']}], the merged patches before the projector",
        "embeds": f"f32 [{n}, {VISION['text_hidden_size']}], after the projector",
        "logits": f"f32 [{len(ids)}, {text['vocab_size']}]",
        "placeholder": PLACEHOLDER,
        "text_oracle_rel_l2": text_err,
    }
    json.dump(meta, open(os.path.join(g, "meta.json"), "w"), indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
