"""llama.cpp's convert_hf_to_gguf.py for the peer checkpoint, whose tokenizer (the default model's
byte-level BPE) llama.cpp does not know by hash: its pre-tokenizer is declared GPT-2's (what a
byte-level BPE with GPT-2 splitting is). Nothing else is changed.

    python3 convert_gguf.py LLAMA_CPP_DIR HF_DIR OUT.gguf
"""

import sys

llama, hf, out = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, f"{llama}/gguf-py")
sys.path.insert(0, llama)

from conversion import base  # noqa: E402

original = base.TextModel.get_vocab_base_pre


def pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"


base.TextModel.get_vocab_base_pre = pre
sys.argv = ["convert_hf_to_gguf.py", hf, "--outtype", "bf16", "--outfile", out]
import convert_hf_to_gguf  # noqa: E402

convert_hf_to_gguf.main()
