"""The k3 server's Responses API (`/v1/responses`) through the official `openai` Python client
(from PyPI), against the same conversation through `chat.completions` with the same seed: whole,
streamed (`stream=True`, and `responses.stream(...)`'s final response), `previous_response_id`,
`retrieve` / `delete`, `responses.parse` into a pydantic model, errors the client raises with the
field named; with the tool-caller model (`cargo xtask synth --preset tool-caller`), a function-call
round trip as agents run it. Run by .ci/run in its venv:

    python tools/server/openai_responses_test.py target/debug/k3-cli fixtures/default.waste TOOL_CALLER
"""

import json
import sys

import openai

from k3serve import serve
# The structured answer the chat route's test parses, parsed here through the Responses API.
from openai_client_test import Answer


def same_as_chat(client: openai.OpenAI) -> None:
    """One conversation both ways, sampled with the same seed: the same text and counts."""
    history = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
               {"role": "user", "content": "And another?"}]
    chat = client.chat.completions.create(
        model="default", messages=[{"role": "system", "content": "Be brief."}] + history,
        max_tokens=16, temperature=0.9, seed=11)
    r = client.responses.create(model="default", instructions="Be brief.", input=history, max_output_tokens=16,
                                temperature=0.9, extra_body={"seed": 11}, store=False)
    assert r.output_text == chat.choices[0].message.content, (r.output_text, chat.choices[0].message.content)
    assert r.usage.input_tokens == chat.usage.prompt_tokens, (r.usage, chat.usage)
    assert r.usage.output_tokens == chat.usage.completion_tokens, (r.usage, chat.usage)
    assert r.status in ("completed", "incomplete") and r.object == "response", r

    deltas, seqs, final = [], [], None
    for ev in client.responses.create(model="default", instructions="Be brief.", input=history,
                                      max_output_tokens=16, temperature=0.9, extra_body={"seed": 11},
                                      store=False, stream=True):
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert seqs == list(range(len(seqs))), seqs
    assert "".join(deltas) == r.output_text == final.output_text, (deltas, r.output_text)

    print(f"openai {openai.__version__}: responses whole and streamed equal chat.completions ok")


def stored(client: openai.OpenAI) -> None:
    """previous_response_id continues the stored conversation from the prompt cache; retrieve
    and delete; another key sees nothing."""
    first = client.responses.create(model="default", input="In the beginning", max_output_tokens=8, temperature=0)
    second = client.responses.create(model="default", previous_response_id=first.id, input="Go on.",
                                     max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(model="default", max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": "In the beginning"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Go on."}])
    assert second.output_text == chat.choices[0].message.content, (second.output_text, chat)
    assert second.usage.input_tokens == chat.usage.prompt_tokens, (second.usage, chat.usage)
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens, (cached, first.usage)
    print(f"  previous_response_id: first input {first.usage.input_tokens} tokens, "
          f"follow-up {second.usage.input_tokens} with {cached} cached")
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"], items
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
        raise SystemExit("a deleted response was returned")
    except openai.NotFoundError:
        pass
    print(f"openai {openai.__version__}: previous_response_id (resumed from the cache), retrieve, delete ok")


def parsed(client: openai.OpenAI) -> None:
    r = client.responses.parse(model="default", input="Who was the first king?", text_format=Answer,
                               max_output_tokens=160, temperature=0, store=False)
    assert isinstance(r.output_parsed, Answer), r
    print(f"openai {openai.__version__}: responses.parse into a pydantic model ok")


def refused(client: openai.OpenAI) -> None:
    for kwargs, field in [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"}]}]},
         "input[0].content[0].image_url"),
        ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ]:
        args = {"model": "default", "input": "x", "max_output_tokens": 4, **kwargs}
        try:
            client.responses.create(**args)
            raise SystemExit(f"{kwargs} was accepted")
        except (openai.BadRequestError, openai.NotFoundError) as e:
            assert e.body["param"] == field, (field, e.body)
    print(f"openai {openai.__version__}: refusals name the field ok")


WEATHER = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "strict": True,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                           "additionalProperties": False}}]


def tool_round_trip(cli: str, model: str) -> None:
    """Streams a turn with a function tool as an agent does (items from output_item.done), runs
    the tool, sends the result with the whole history (store false) and by previous_response_id:
    the same next turn both ways, resumed from the cache."""
    with serve(cli, model) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="sesame")
        name = client.models.list().data[0].id
        done, reasoning, final = [], "", None
        for ev in client.responses.create(model=name, input="Weather in Paris?", tools=WEATHER,
                                          max_output_tokens=32, temperature=0, stream=True):
            if ev.type == "response.output_item.done":
                done.append(ev.item)
            if ev.type == "response.reasoning_text.delta":
                reasoning += ev.delta
            if ev.type == "response.completed":
                final = ev.response
        assert [i.type for i in done] == ["reasoning", "message", "function_call"], done
        assert reasoning and done[0].content[0].text == reasoning, (reasoning, done[0])
        call = done[2]
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}, call
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, clear"}
        history = [{"role": "user", "content": "Weather in Paris?"}] + [i.model_dump(exclude_none=True) for i in done]
        resent = client.responses.create(model=name, input=history + [result], tools=WEATHER,
                                         max_output_tokens=32, temperature=0, store=False)
        chained = client.responses.create(model=name, previous_response_id=final.id, input=[result],
                                          tools=WEATHER, max_output_tokens=32, temperature=0)
        assert resent.usage.input_tokens == chained.usage.input_tokens, (resent.usage, chained.usage)
        assert [i.type for i in resent.output] == [i.type for i in chained.output], (resent, chained)
        assert chained.usage.input_tokens_details.cached_tokens >= final.usage.input_tokens, chained.usage
        # The client's stream helper: it needs response.completed, which a turn ending at its call sends.
        with client.responses.stream(model=name, input="Weather in Paris?", tools=WEATHER, max_output_tokens=32,
                                     temperature=0) as stream:
            for _ in stream:
                pass
            got = stream.get_final_response()
        assert [i.type for i in got.output] == ["reasoning", "message", "function_call"], got
        assert got.output[2].arguments == call.arguments, got
    print(f"openai {openai.__version__}: function-call round trip (streamed, resent, chained; responses.stream) ok")


def main() -> None:
    cli, model = sys.argv[1], sys.argv[2]
    with serve(cli, model) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="sesame")
        same_as_chat(client)
        stored(client)
        parsed(client)
        refused(client)
    if len(sys.argv) > 3:
        tool_round_trip(cli, sys.argv[3])


if __name__ == "__main__":
    main()
