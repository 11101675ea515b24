"""Reference renderings of Kimi K3's chat template (shared/golden/chat-templates/Kimi-K3.jinja, a
rendering of K3's XTML encoder) for conversations with tools, thinking effort, tool_choice and
response_format, made with Python jinja2 configured as transformers' `apply_chat_template`
configures it (trim_blocks, lstrip_blocks, loop controls, its `tojson`: no ASCII escaping).
Writes fixtures/chat/k3-tools.json: [{messages, tools, options, rendered}]; assistant tool-call
arguments are given to the template as mappings (as a server passes a JSON object it parsed) and
to the engine as the JSON text a client sends.

    python3 -m venv /tmp/v && /tmp/v/bin/pip install jinja2
    /tmp/v/bin/python tools/golden/k3_tool_renderings.py ../shared/golden/chat-templates/Kimi-K3.jinja
"""

import json
import sys

import jinja2
from jinja2.ext import loopcontrols


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main() -> None:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(open(sys.argv[1]).read())
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}}
    search = {"type": "function", "function": {"name": "search", "description": "Search <the> web & more",
              "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "opts": {"type": "object"}}}}}
    cases = [
        {"tools": [weather], "options": {}, "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Weather in Paris?"},
        ]},
        # Results answer calls by id, given out of order: written in the calls' order.
        {"tools": [weather, search], "options": {"thinking": True, "thinking_effort": "low", "tool_choice": "required"},
         "messages": [
            {"role": "user", "content": "Weather in Paris, and search news."},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "Two tools.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
                {"id": "c2", "type": "function", "function": {"name": "search", "arguments":
                    {"q": "news \"today\"", "opts": {"lang": "fr", "n": [1, 2.5, True, None]}, "a\"b&c": False}}},
            ]},
            {"role": "tool", "tool_call_id": "c2", "content": "Nothing new."},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
         ]},
        # No ids: results in the order given, named by `name` or by position; thinking off.
        {"tools": [weather], "options": {"thinking": False, "tool_choice": "none",
                                         "response_format": {"type": "json_object"}},
         "messages": [
            {"role": "system", "content": "Be brief.", "name": "ops"},
            {"role": "user", "content": "Weather?", "name": "ann"},
            {"role": "assistant", "content": "", "reasoning_content": "dropped when not thinking", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {}}},
            ]},
            {"role": "tool", "content": "-3 C"},
            {"role": "tool", "name": "get_weather", "content": "unknown"},
            {"role": "user", "content": "Thanks."},
         ]},
        # A structured answer: the schema shown with its keys sorted.
        {"tools": [], "options": {"thinking": False, "response_format": {"type": "json_schema", "json_schema": {
            "name": "city", "strict": True, "schema": {"type": "object", "properties": {
                "name": {"type": "string", "description": "Its name, e.g. \"Paris\""},
                "population": {"type": "integer"}}, "required": ["name", "population"],
                "additionalProperties": False}}}},
         "messages": [{"role": "user", "content": "A city, as JSON."}]},
    ]
    for c in cases:
        c["rendered"] = template.render(messages=c["messages"], tools=c["tools"], add_generation_prompt=True, **c["options"])
        # What a client sends: the arguments as compact, ASCII-escaped JSON text.
        for m in c["messages"]:
            for call in m.get("tool_calls", []):
                call["function"]["arguments_text"] = json.dumps(call["function"]["arguments"], separators=(",", ":"))
    json.dump(cases, open("fixtures/chat/k3-tools.json", "w"), indent=1, ensure_ascii=False)
    print(f"wrote {len(cases)} renderings to fixtures/chat/k3-tools.json")


if __name__ == "__main__":
    main()
