"""`k3-cli serve` on a free loopback port for the client tests, stopped when the block ends."""

import contextlib
import os
import socket
import subprocess
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def k3(cli: str, data: str, *args: str) -> str:
    """`k3-cli ARGS` with its model store in `data` (`K3_DATA_DIR`): its standard output; a
    failure raises, with what it said on standard error."""
    env = {**os.environ, "K3_DATA_DIR": data}
    r = subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"k3-cli {' '.join(args)}: {r.stderr}"
    return r.stdout


@contextlib.contextmanager
def serve(cli: str, model: str | None, key: str | None = "sesame", port: int | None = None, context: int | None = None,
          env: dict[str, str] | None = None):
    """A server on `model` (None: no --model, so every model in the store and the built-in
    `default`, each loaded when asked for) on `port` (else a free one) requiring `key` (None:
    no key), with `--context context` when given (else the model's own, fitted to memory) and
    `env` added to this process's environment, once ready: its base URL."""
    port = port or free_port()
    args = [cli, "serve"] + (["--model", model] if model else []) + ["--port", str(port)]
    args += ["--context", str(context)] if context else []
    server = subprocess.Popen(args + (["--api-key", key] if key else []), env={**os.environ, **(env or {})})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health") as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.05)
        else:
            raise SystemExit("the server did not become ready")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)
