"""The k3 server through the official `anthropic` Python client (from PyPI): messages.create whole
and streamed (`messages.stream` and its final message), each answer the same as the same
conversation through the `openai` client's chat.completions with the same seed; count_tokens;
errors raised as the client's typed exceptions; the key sent as `x-api-key` (api_key=) and as
`Authorization: Bearer` (auth_token=). With the tool caller (`cargo xtask synth --preset
tool-caller`): a tool round trip. With the tiny vision K3: thinking (by default and within a
budget) and an image. Run by .ci/run in a venv it makes:

    python tools/server/anthropic_client_test.py CLI DEFAULT_MODEL TOOL_CALLER VISION
"""

import base64
import json
import sys

import anthropic
import openai

from k3serve import serve

KEY = "sesame"
WEATHER = [{"name": "get_weather", "description": "Weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
OPENAI_WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def clients(base: str):
    return (anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0),
            openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0))


def blocks(msg, kind: str, field: str) -> str:
    return "".join(getattr(b, field) for b in msg.content if b.type == kind)


def dump(content) -> list:
    """Blocks as plain data (a streamed final message's blocks are the Parsed* types)."""
    return [{k: v for k, v in b.model_dump().items() if k not in ("parsed_output", "citations")} for b in content]


def same(chat, msg) -> None:
    """The Messages answer says what the chat answer says."""
    m = chat.choices[0].message
    assert blocks(msg, "text", "text") == (m.content or ""), (msg, m)
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content") or ""
    assert blocks(msg, "thinking", "thinking") == reasoning, (msg, m)
    uses = [(b.name, b.input) for b in msg.content if b.type == "tool_use"]
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in (m.tool_calls or [])]
    assert uses == calls, (uses, calls)
    u = msg.usage
    assert u.input_tokens + u.cache_read_input_tokens == chat.usage.prompt_tokens, (u, chat.usage)
    assert u.output_tokens == chat.usage.completion_tokens, (u, chat.usage)
    reason = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[chat.choices[0].finish_reason]
    assert msg.stop_reason == reason, (msg.stop_reason, reason)


def expect(kind, says: str, call) -> None:
    try:
        call()
    except kind as e:
        assert says in str(e), (says, str(e))
        assert e.body["type"] == "error", e.body
        return
    raise SystemExit(f"no {kind.__name__} saying {says!r}")


def main_model(base: str) -> None:
    client, oai = clients(base)
    system = "You are terse."
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another?"}]
    chat = oai.chat.completions.create(model="default", messages=[{"role": "system", "content": system}, *messages],
                                       max_tokens=12, temperature=0.9, seed=7)
    whole = client.messages.create(model="default", system=system, messages=messages, max_tokens=12,
                                   extra_body={"seed": 7, "temperature": 0.9})
    same(chat, whole)
    assert whole.id.startswith("msg_") and whole.role == "assistant" and whole.model == "default", whole
    with client.messages.stream(model="default", system=system, messages=messages, max_tokens=12,
                                extra_body={"seed": 7, "temperature": 0.9}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == blocks(whole, "text", "text") and dump(final.content) == dump(whole.content), (text, final, whole)
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens, final
    # The same prompt again is read from the prefix cache.
    assert final.usage.cache_read_input_tokens > 0 and final.usage.input_tokens < chat.usage.prompt_tokens, final.usage
    counted = client.messages.count_tokens(model="default", system=system, messages=messages)
    assert counted.input_tokens == chat.usage.prompt_tokens, (counted, chat.usage)
    # A stop sequence, named.
    stop = blocks(whole, "text", "text")[2:4]
    if len(stop) == 2:
        cut = client.messages.create(model="default", system=system, messages=messages, max_tokens=12,
                                     stop_sequences=[stop], extra_body={"seed": 7, "temperature": 0.9})
        assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
    # The key as a bearer token works as well as x-api-key.
    bearer = anthropic.Anthropic(base_url=base, auth_token=KEY, max_retries=0)
    assert bearer.messages.create(model="default", messages=messages, max_tokens=2).type == "message"

    expect(anthropic.AuthenticationError, "API key",
           lambda: anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
               model="default", messages=messages, max_tokens=2))
    expect(anthropic.NotFoundError, "claude-nope",
           lambda: client.messages.create(model="claude-nope", messages=messages, max_tokens=2))
    expect(anthropic.BadRequestError, "service_tier",
           lambda: client.messages.create(model="default", messages=messages, max_tokens=2, service_tier="auto"))
    expect(anthropic.BadRequestError, "messages[0].content[0].source.type",
           lambda: client.messages.create(model="default", max_tokens=2, messages=[{"role": "user", "content": [
               {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]))
    expect(anthropic.BadRequestError, "prompt is too long",
           lambda: client.messages.create(model="default", max_tokens=2,
                                          messages=[{"role": "user", "content": "tick " * 5000}]))
    print("anthropic: create whole and streamed (= chat.completions), count_tokens, stop sequence, "
          "x-api-key and bearer, typed errors ok")


def tool_round_trip(base: str) -> None:
    client, oai = clients(base)
    user = {"role": "user", "content": "Weather in Paris?"}
    chat = oai.chat.completions.create(model="tool-caller", messages=[user], tools=OPENAI_WEATHER,
                                       max_tokens=32,
                                    extra_body={"temperature": 0})
    first = client.messages.create(model="tool-caller", messages=[user], tools=WEATHER, max_tokens=32,
                                    extra_body={"temperature": 0})
    same(chat, first)
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["thinking", "text", "tool_use"], first
    call = first.content[-1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"}, call
    with client.messages.stream(model="tool-caller", messages=[user], tools=WEATHER, max_tokens=32,
                                extra_body={"temperature": 0}) as s:
        streamed = s.get_final_message()
    assert dump(streamed.content) == dump(first.content) and streamed.stop_reason == "tool_use", streamed
    prompt = first.usage.input_tokens + first.usage.cache_read_input_tokens
    history = [user, {"role": "assistant", "content": first.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C, clear"}]}]
    second = client.messages.create(model="tool-caller", messages=history, tools=WEATHER, max_tokens=32,
                                    extra_body={"temperature": 0})
    assert second.usage.cache_read_input_tokens >= prompt, (prompt, second.usage)
    print(f"anthropic: tool_use, streamed the same, tool_result resumed from the cache "
          f"({second.usage.cache_read_input_tokens} of {second.usage.cache_read_input_tokens + second.usage.input_tokens} tokens) ok")


def vision_k3(base: str, picture: bytes) -> None:
    client, oai = clients(base)
    data = base64.b64encode(picture).decode()
    content = [{"type": "text", "text": "What is in this picture?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]
    chat = oai.chat.completions.create(model="tiny-k3-vision", max_tokens=24, seed=3, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}]}])
    msg = client.messages.create(model="tiny-k3-vision", max_tokens=24, messages=[{"role": "user", "content": content}],
                                 extra_body={"seed": 3})
    same(chat, msg)
    assert msg.content[0].type == "thinking" and msg.content[0].signature, msg
    counted = client.messages.count_tokens(model="tiny-k3-vision", messages=[{"role": "user", "content": content}])
    assert counted.input_tokens == chat.usage.prompt_tokens, (counted, chat.usage)
    budget = client.messages.create(model="tiny-k3-vision", max_tokens=24, messages=[{"role": "user", "content": content}],
                                    thinking={"type": "enabled", "budget_tokens": 4}, extra_body={"seed": 3})
    thought = blocks(budget, "thinking", "thinking").rstrip("\ufffd")
    assert blocks(msg, "thinking", "thinking").startswith(thought), (thought, msg)
    assert len(thought) < len(blocks(msg, "thinking", "thinking")), (thought, msg)
    off = client.messages.create(model="tiny-k3-vision", max_tokens=8, messages=[{"role": "user", "content": content}],
                                 thinking={"type": "disabled"})
    assert not any(b.type == "thinking" for b in off.content), off
    print("anthropic: K3 thinks (signed blocks), within a budget, not when disabled; an image, counted as chat counts it ok")


def main() -> None:
    cli, model = sys.argv[1], sys.argv[2]
    # A context a test can fill: a prompt past it is refused in Anthropic's words.
    with serve(cli, model, KEY, context=4096) as base:
        main_model(base)
    if len(sys.argv) > 3:
        with serve(cli, sys.argv[3], KEY) as base:
            tool_round_trip(base)
    if len(sys.argv) > 4:
        import pathlib
        picture = pathlib.Path(__file__).resolve().parents[2] / "fixtures/golden/tiny-k3-vision/golden/picture.png"
        with serve(cli, sys.argv[4], KEY) as base:
            vision_k3(base, picture.read_bytes())
    else:
        print("anthropic: thinking and images NOT checked: give the tiny vision K3 as the fourth argument")


if __name__ == "__main__":
    main()
