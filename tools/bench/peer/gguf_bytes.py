"""Bytes a decode step of a GGUF MoE model reads: the trunk's tensors (not the embedding table,
of which a step reads one row) and `active` of `experts` routed experts' (`*_exps` tensors).

    python tools/bench/peer/gguf_bytes.py MODEL.gguf ACTIVE EXPERTS
Needs llama.cpp's gguf-py (bench-out/peer/llama.cpp/gguf-py, put on PYTHONPATH if it is not
installed) and numpy: the peer script's venv has both.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "../../../bench-out/peer/llama.cpp/gguf-py"))
from gguf import GGUFReader  # noqa: E402


def main():
    path, active, experts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    routed = trunk = 0
    for t in GGUFReader(path).tensors:
        if "exps" in t.name:
            routed += t.n_bytes
        elif t.name != "token_embd.weight":
            trunk += t.n_bytes
    per_token = trunk + routed * active / experts
    print(f"trunk {trunk / 1e6:.1f} MB, routed experts {routed / 1e6:.1f} MB, per token {per_token / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
