"""The k3 server through the official `ollama` Python client (from PyPI): the model list, show,
chat and generate whole and streamed (the same greedy text both ways), Ollama's options and
errors as the client raises them; with a second model that calls tools (`cargo xtask synth
--preset tool-caller`), a tool call with its arguments as an object and the result sent back.
Run by .ci/run in a venv it makes:

    python tools/server/ollama_client_test.py target/debug/k3-cli fixtures/default.waste [TOOL_CALLER]
"""

import json
import sys
import urllib.request
from typing import Literal

import ollama
from pydantic import BaseModel, Field

from k3serve import serve

AUTH = {"Authorization": "Bearer sesame"}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


class Answer(BaseModel):
    name: str = Field(max_length=24)
    tribe: Literal["Judah", "Levi", "Dan"]
    years: list[int] = Field(max_length=2)


def expect_error(status: int, says: str, call) -> None:
    try:
        call()
    except ollama.ResponseError as e:
        assert e.status_code == status and says in e.error, (e.status_code, e.error)
        return
    raise SystemExit(f"no error saying {says!r}")


def main_model(client: ollama.Client, base: str) -> None:
    listed = client.list().models
    assert [m.model for m in listed] == ["default:latest"], listed
    assert listed[0].details.family == "kimi_linear" and listed[0].size > 0, listed[0]
    shown = client.show("default")
    assert shown.modelinfo["kimi_linear.context_length"] == 4096, shown.modelinfo
    assert "temperature" in shown.parameters, shown.parameters
    with urllib.request.urlopen(urllib.request.Request(base + "/api/version", headers=AUTH)) as r:
        assert json.load(r)["version"], "no version"

    opts = {"temperature": 0, "num_predict": 12}
    messages = [{"role": "user", "content": "And God said"}]
    whole = client.chat(model="default", messages=messages, options=opts)
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.content, whole
    assert whole.eval_count <= 12 and whole.prompt_eval_count > 0 and whole.total_duration > 0, whole
    streamed = list(client.chat(model="default:latest", messages=messages, options=opts, stream=True))
    assert "".join(p.message.content for p in streamed) == whole.message.content, streamed
    assert streamed[-1].done and not any(p.done for p in streamed[:-1]), streamed[-1]

    gen = client.generate(model="default", prompt="In the beginning", raw=True, options=opts)
    pieces = client.generate(model="default", prompt="In the beginning", raw=True, options=opts, stream=True)
    assert "".join(p.response for p in pieces) == gen.response and gen.response, gen
    assert client.generate(model="default", prompt="").done_reason == "load"

    # `format` as a JSON schema (Ollama's structured outputs), and as "json".
    r = client.chat(model="default", messages=[{"role": "user", "content": "The first king?"}],
                    format=Answer.model_json_schema(), options={"temperature": 0, "num_predict": 160})
    got = Answer.model_validate_json(r.message.content)
    assert len(got.years) <= 2, got
    r = client.generate(model="default", prompt="Describe the light", format="json", options={"temperature": 0, "num_predict": 160})
    assert r.done_reason == "length" or isinstance(json.loads(r.response), dict), r.response

    expect_error(404, "nope", lambda: client.chat(model="nope", messages=messages))
    expect_error(400, "options.temperature", lambda: client.chat(
        model="default", messages=messages, options={"temperature": -1}))
    expect_error(400, "options.mirostat", lambda: client.chat(
        model="default", messages=messages, options={"mirostat": 2}))
    expect_error(401, "", lambda: ollama.Client(host=base).list())
    print("ollama: list, show, version, chat and generate (whole and streamed), format (schema, json), errors ok")


def tool_round_trip(client: ollama.Client) -> None:
    name = client.list().models[0].model
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.chat(model=name, messages=messages, tools=WEATHER, options={"temperature": 0, "num_predict": 32})
    calls = r.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather", r.message
    assert calls[0].function.arguments == {"city": "Paris"}, calls[0].function.arguments
    assert r.message.thinking, r.message
    messages.append(r.message)
    messages.append({"role": "tool", "tool_name": "get_weather", "content": "18 C, clear"})
    second = client.chat(model=name, messages=messages, tools=WEATHER, options={"temperature": 0, "num_predict": 32})
    assert second.done, second
    print("ollama: tool call (arguments as an object, thinking apart) and its result sent back ok")


def main() -> None:
    cli, model = sys.argv[1], sys.argv[2]
    # `--context 4096`: /api/show reports the server's context, not the model's longest.
    with serve(cli, model, context=4096) as base:
        main_model(ollama.Client(host=base, headers=AUTH), base)
    if len(sys.argv) > 3:
        with serve(cli, sys.argv[3]) as base:
            tool_round_trip(ollama.Client(host=base, headers=AUTH))


if __name__ == "__main__":
    main()
