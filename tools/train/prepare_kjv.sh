#!/usr/bin/env bash
# Fetch the training text for the embedded default model: the King James Version of the Bible
# from Debian's `bible-kjv-text` package (text public domain: the 1611 translation's copyright
# has long expired; the package's retrieval program `bible-kjv` is GPL-2+ and only used here to
# print the text). Writes OUT/kjv.txt: one chapter per paragraph, verse references stripped.
set -euo pipefail
out=${1:?usage: prepare_kjv.sh OUT_DIR}
mkdir -p "$out/deb"
cd "$out/deb"
[ -f bible-kjv-text_4.38_all.deb ] || apt-get download bible-kjv-text=4.38 bible-kjv=4.38
for f in *.deb; do dpkg-deb -x "$f" root; done
./root/usr/bin/bible -f -p root/usr/lib gen1:1-rev22:21 > ../kjv-verses.txt
cd ..
python3 - <<'PY'
import re
chapters, key = [], None
for line in open("kjv-verses.txt", encoding="utf-8"):
    m = re.match(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$", line.rstrip("\n"))
    if not m:
        raise SystemExit(f"unexpected line: {line!r}")
    book, ch, _, text = m.groups()
    if (book, ch) != key:
        chapters.append([])
        key = (book, ch)
    chapters[-1].append(text.strip())
with open("kjv.txt", "w", encoding="utf-8") as f:
    for c in chapters:
        f.write(" ".join(c) + "\n\n")
print(f"{len(chapters)} chapters")
PY
sha256sum kjv.txt
