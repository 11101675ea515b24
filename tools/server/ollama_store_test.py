"""Models by name, as an Ollama user meets them, through the official `ollama` Python client
(from PyPI) and k3-cli's own commands: two models kept in a store (`convert --name`), `list`
showing both, `serve` without `--model` offering both and the built-in `default` in
`/api/tags` (the client's `list()`), each loaded when a chat names it (`ps()` and `k3-cli ps`
saying which, `keep_alive` 0 and `k3-cli stop` unloading), `run NAME MESSAGE` answering, and `rm` taking one out of the list. Run by .ci/run
in its venv:

    python tools/server/ollama_store_test.py target/debug/k3-cli fixtures/golden/tiny-k3-vision fixtures/default.waste
"""

import sys
import tempfile

import ollama

from k3serve import k3, serve


def main() -> None:
    cli, k3_checkpoint, small = sys.argv[1], sys.argv[2], sys.argv[3]
    with tempfile.TemporaryDirectory() as data:
        env = {"K3_DATA_DIR": data}  # for the server
        k3(cli, data, "convert", "-q", "--hf", k3_checkpoint, "--name", "tiny-k3")
        k3(cli, data, "convert", "-q", "--from", small, "--name", "small")
        listed = [line.split()[0] for line in k3(cli, data, "list").splitlines()[1:]]
        assert listed == ["small", "tiny-k3", "default"], listed
        answer = k3(cli, data, "run", "small", "Who made the light?", "-n", "6", "--temp", "0")
        assert answer.strip(), "run NAME MESSAGE printed an answer"

        with serve(cli, None, key=None, env=env) as base:
            o = ollama.Client(host=base)
            names = sorted(m.model for m in o.list().models)
            assert names == ["default:latest", "small:latest", "tiny-k3:latest"], names
            families = {m.model: m.details.family for m in o.list().models}
            assert families["tiny-k3:latest"] == "kimi_k3" and families["small:latest"] == "kimi_linear", families
            assert o.ps().models == [], "nothing loaded before a chat names a model"
            port = base.rsplit(":", 1)[1]
            for model in ["tiny-k3", "small:latest", "tiny-k3:latest"]:
                r = o.chat(model=model, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 3})
                assert r.done and r.model.split(":")[0] == model.split(":")[0], r
                loaded = [m.model for m in o.ps().models]
                assert loaded == [model if ":" in model else model + ":latest"], loaded
                ps = k3(cli, data, "ps", "--port", port)
                assert ps.splitlines()[1].startswith(loaded[0]) and "loaded" in ps, ps
            # `ollama stop` sends keep_alive 0: the model leaves memory; `k3-cli stop` does the same.
            o.generate(model="tiny-k3", keep_alive=0)
            assert o.ps().models == [], "unloaded"
            o.chat(model="small", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2})
            k3(cli, data, "stop", "small", "--port", port)
            assert o.ps().models == [], "stopped"
            try:
                o.chat(model="nope", messages=[{"role": "user", "content": "Hi"}])
                raise AssertionError("an unknown model answered")
            except ollama.ResponseError as e:
                assert e.status_code == 404 and "not found" in e.error, e

        print(k3(cli, data, "rm", "tiny-k3").strip())
        listed = [line.split()[0] for line in k3(cli, data, "list").splitlines()[1:]]
        assert listed == ["small", "default"], listed
    print("ollama store test: list, run, ps, rm and /api/tags on two stored models: ok")


if __name__ == "__main__":
    main()
