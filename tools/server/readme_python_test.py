"""Runs every ```python block of README.md as written against `k3-cli serve --port 8011` (the
port the README uses): a block naming `tiny-k3-vision` against that model, the others against
the default one. A block that raises fails the run. Run by .ci/run in its venv:

    python tools/server/readme_python_test.py target/debug/k3-cli fixtures/default.waste VISION

VISION is `fixtures/golden/tiny-k3-vision` converted (`k3-cli convert --hf ... --out ...`).
"""

import re
import subprocess
import sys
from pathlib import Path

from k3serve import serve

ROOT = Path(__file__).resolve().parents[2]
PORT = 8011


def blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def run(cli: str, model: str, code: str) -> None:
    # As the README has it: no key, port 8011; the block run from the repository's root by a
    # fresh interpreter.
    with serve(cli, model, key=None, port=PORT):
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    print(done.stdout, end="")
    if done.returncode != 0:
        raise SystemExit(f"a README block failed:\n{code}\n{done.stderr}")


def main() -> None:
    cli, default, vision = sys.argv[1:4]
    found = blocks()
    assert found, "README.md has no python block"
    for code in found:
        if "tiny-k3-vision" in code:
            run(cli, vision, code)
        else:
            run(cli, default, code)
    print(f"README: {len(found)} python blocks ran as written")


if __name__ == "__main__":
    main()
