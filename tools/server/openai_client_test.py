"""The k3 server through the official `openai` Python client (from PyPI): model list, a chat
completion whole and streamed (the same greedy text both ways), a text completion, usage, and an
error the client raises as OpenAI's. Run by .ci/run in a venv it makes:

    python tools/server/openai_client_test.py target/debug/k3-cli fixtures/default.waste
"""

import socket
import subprocess
import sys
import time
import urllib.request

import openai


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    cli, model = sys.argv[1], sys.argv[2]
    port = free_port()
    server = subprocess.Popen([cli, "serve", "--model", model, "--port", str(port), "--api-key", "sesame"])
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

        client = openai.OpenAI(base_url=base + "/v1", api_key="sesame")
        ids = [m.id for m in client.models.list().data]
        assert ids == ["default"], ids

        messages = [{"role": "user", "content": "And God said"}]
        whole = client.chat.completions.create(model="default", messages=messages, max_tokens=20, temperature=0)
        text = whole.choices[0].message.content
        assert text, whole
        assert whole.choices[0].finish_reason in ("stop", "length"), whole
        assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

        stream = client.chat.completions.create(
            model="default", messages=messages, max_tokens=20, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        assert "".join(pieces) == text, ("".join(pieces), text)
        assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens, usage

        done = client.completions.create(model="default", prompt="In the beginning", max_tokens=5, temperature=0)
        assert done.usage.completion_tokens == 5 and done.choices[0].text, done

        try:
            client.chat.completions.create(model="default", messages=messages, n=2)
            raise SystemExit("n = 2 was accepted")
        except openai.BadRequestError as e:
            assert "n = 2" in str(e), e
        try:
            openai.OpenAI(base_url=base + "/v1", api_key="wrong").models.list()
            raise SystemExit("a wrong key was accepted")
        except openai.AuthenticationError:
            pass
        print(f"openai {openai.__version__}: models, chat (whole and streamed), completions and errors ok")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
