"""The k3 server through the official `openai` Python client (from PyPI): model list, a chat
completion whole and streamed (the same greedy text both ways), a text completion, usage, and an
error the client raises as OpenAI's; with a second model that calls tools (`cargo xtask synth
--preset tool-caller`), a tool-call round trip streamed the way agents consume it. Run by .ci/run
in a venv it makes:

    python tools/server/openai_client_test.py target/debug/k3-cli fixtures/default.waste [TOOL_CALLER [VISION]]

VISION is a K3 converted with its vision tower (`fixtures/golden/tiny-k3-vision`): a picture sent
as an `image_url` data URL the way the client's users send one, the same picture again resumed
from the prompt cache, and a remote URL refused.
"""

import json
import sys
from typing import Literal, Optional

import openai
from pydantic import BaseModel, Field

from k3serve import serve


class Person(BaseModel):
    name: str = Field(max_length=24)
    tribe: Literal["Judah", "Levi", "Dan"]


class Answer(BaseModel):
    king: Person
    years: list[int] = Field(max_length=2)
    anointed: bool
    note: Optional[str] = Field(default=None, max_length=16)


def structured(client: openai.OpenAI) -> None:
    """The client's `parse` with a pydantic model: the schema it sends (strict) is honoured and
    the answer validates into the model."""
    chat = client.chat.completions
    parse = chat.parse if hasattr(chat, "parse") else client.beta.chat.completions.parse
    r = parse(model="default", messages=[{"role": "user", "content": "Who was the first king?"}],
              response_format=Answer, max_tokens=160, temperature=0)
    got = r.choices[0].message.parsed
    assert isinstance(got, Answer), r
    assert len(got.years) <= 2 and got.king.tribe in ("Judah", "Levi", "Dan"), got
    try:
        class Bounded(BaseModel):
            n: int = Field(ge=1)
        parse(model="default", messages=[{"role": "user", "content": "n?"}], response_format=Bounded, max_tokens=8)
        raise SystemExit("a schema with `minimum` was accepted")
    except openai.BadRequestError as e:
        assert "minimum" in str(e), e
    print(f"openai {openai.__version__}: structured outputs (parse into a pydantic model) ok")


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def tool_round_trip(cli: str, model: str) -> None:
    """Streams a turn with tools as an agent does (tool-call deltas merged by index), runs the
    tool, sends the call and its result back, and gets the next turn."""
    with serve(cli, model) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="sesame")
        name = client.models.list().data[0].id
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        stream = client.chat.completions.create(
            model=name, messages=messages, tools=WEATHER, max_tokens=32, temperature=0, stream=True)
        content, reasoning, calls, finish = "", "", {}, None
        for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            # Not in OpenAI's types: the client keeps it as an extra field.
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for c in delta.tool_calls or []:
                slot = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += c.id or ""
                slot["name"] += (c.function.name or "") if c.function else ""
                slot["arguments"] += (c.function.arguments or "") if c.function else ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls", finish
        assert reasoning and reasoning not in content, (reasoning, content)
        assert len(calls) == 1 and calls[0]["name"] == "get_weather", calls
        args = json.loads(calls[0]["arguments"])
        assert args == {"city": "Paris"}, args
        messages.append({"role": "assistant", "content": content, "tool_calls": [
            {"id": calls[0]["id"], "type": "function",
             "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]})
        messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C, clear"})
        second = client.chat.completions.create(
            model=name, messages=messages, tools=WEATHER, max_tokens=32, temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens > 0, second.usage
        assert second.choices[0].message.tool_calls[0].function.name == "get_weather", second
    print(f"openai {openai.__version__}: tool-call round trip (streamed calls, results sent back) ok")


def image_round_trip(cli: str, model: str) -> None:
    import base64
    import pathlib

    png = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "chat-page.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    with serve(cli, model) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="sesame")
        name = client.models.list().data[0].id
        messages = [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url, "detail": "auto"}},
        ]}]
        first = client.chat.completions.create(model=name, messages=messages, max_tokens=4, temperature=0)
        again = client.chat.completions.create(model=name, messages=messages, max_tokens=4, temperature=0)
        assert first.usage.prompt_tokens > 100, first.usage
        assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens, again.usage
        try:
            client.chat.completions.create(model=name, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
            raise SystemExit("a remote image URL was accepted")
        except openai.BadRequestError as e:
            assert "never fetched" in str(e), e
    print(f"openai {openai.__version__}: an image as a data URL (resumed the second time), a remote URL refused ok")


def main() -> None:
    cli, model = sys.argv[1], sys.argv[2]
    with serve(cli, model) as base:
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
        structured(client)
    if len(sys.argv) > 3:
        tool_round_trip(cli, sys.argv[3])
    if len(sys.argv) > 4:
        image_round_trip(cli, sys.argv[4])


if __name__ == "__main__":
    main()
