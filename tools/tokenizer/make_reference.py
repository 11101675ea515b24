#!/usr/bin/env python3
"""Reference token ids from Python tiktoken (an implementation this project did not write).

Encodes a generated corpus of >= 1,000 varied strings (English, Chinese, Japanese kana and kanji,
Korean, emoji, code, numbers, CRLF and mixed whitespace, contractions, long runs) with the
o200k_base ranks and the Kimi K3 split regex, and writes fixtures/tokenizer/reference.jsonl.

    pip install tiktoken
    python3 tools/tokenizer/make_reference.py
"""
import base64
import json
import os
import random

import tiktoken

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RANKS = os.path.join(ROOT, "fixtures", "tokenizer", "o200k_base.tiktoken")
OUT = os.path.join(ROOT, "fixtures", "tokenizer", "reference.jsonl")

# models.md, section 1, "Tokenizer and chat format": the 8 alternatives, in order.
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])

PIECES = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "I'm sure they'll say it's fine; we've done it.",
    "DON'T SHOUT", "He said: \"Well...\"", "naïve café résumé", "Ünïcödé Straße", "e-mail: someone@example.com",
    "人工智能正在改变世界。", "我们今天去公园散步吧", "東京は日本の首都です。", "ひらがなとカタカナ、そして漢字。", "コンピューター",
    "안녕하세요, 세계!", "한국어 문장입니다.", "😀🎉👍🏽", "🇯🇵🇰🇷", "emoji 🤖 in text",
    "fn main() {\n    println!(\"hi\");\n}", "def f(x):\n\treturn x**2  # square", "if (a && b || !c) { x += 1; }",
    "for i in range(10):\n    print(i)", "SELECT * FROM t WHERE id = 42;", "<div class=\"a\">text</div>",
    "3.14159", "1234567890", "2026-11-29", "$1,000,000.00", "10^9 + 7", "0x1F 0b1010", "1e-6",
    "line one\r\nline two\r\n", "tabs\tand  spaces   here", "trailing spaces   ", "   leading", "\n\n\nnewlines\n",
    "mixed \t \r\n whitespace \u00a0 nbsp", "a" * 50, "ab" * 40, "!!!???...", "-----", "====\n====",
    "Привет, мир!", "مرحبا بالعالم", "שלום עולם", "Γειά σου Κόσμε", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "CamelCaseWord", "snake_case_word", "kebab-case-word", "ALLCAPS123", "x86_64-unknown-linux-gnu",
    "你好world混合text", "日本語とEnglishのmix", "数字123和汉字", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE",
]


def corpus():
    rng = random.Random(20261129)
    out = list(PIECES)
    while len(out) < 1200:
        k = rng.randint(1, 5)
        seps = ["", " ", "\n", "\r\n", "\t", "  ", ", ", "。", "!"]
        s = ""
        for _ in range(k):
            s += rng.choice(PIECES) + rng.choice(seps)
        if rng.random() < 0.2:
            s = s * rng.randint(2, 4)
        if rng.random() < 0.1:
            s = "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 40)))
        out.append(s)
    return out


def main():
    ranks = {}
    with open(RANKS, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    enc = tiktoken.Encoding(name="kimi-regex-o200k", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens={})
    with open(OUT, "w", encoding="utf-8") as f:
        for text in corpus():
            f.write(json.dumps({"text": text, "ids": enc.encode_ordinary(text)}, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
