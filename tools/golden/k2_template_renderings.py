"""Reference renderings of the Kimi K2 releases' own chat templates (fixtures/chat/templates/,
copied from shared/golden/chat-templates: Kimi-K2-Instruct, moonshotai-Kimi-K2, Kimi-K2-Thinking)
with Python jinja2 configured as transformers' `apply_chat_template` configures it, for k3's
minijinja rendering to match: plain turns with and without a system message (the default one),
tool declarations, calls and results, and K2-Thinking's rule that reasoning is kept only after
the last assistant turn without tool calls. Writes fixtures/chat/k2-templates.json:
[{template, messages, tools_text, rendered}].

    python3 -m venv /tmp/v && /tmp/v/bin/pip install jinja2
    /tmp/v/bin/python tools/golden/k2_template_renderings.py
"""

import json

import jinja2
from jinja2.ext import loopcontrols


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


TEMPLATES = ["Kimi-K2-Instruct.jinja", "moonshotai-Kimi-K2.jinja", "Kimi-K2-Thinking.jinja"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, in °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}}}
CASES = [
    # No system message: the template adds its default.
    {"tools": None, "messages": [{"role": "user", "content": "Hi there"}]},
    {"tools": None, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue.", "reasoning_content": "any will do"},
        {"role": "user", "content": "Another?", "name": "ann"},
    ]},
    {"tools": [WEATHER, CLOCK], "messages": [
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "two tools", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "18 C, clear"},
        {"role": "tool", "tool_call_id": "call_1", "name": "now", "content": "12:00"},
    ]},
    # K2-Thinking: reasoning of turns before the last plain answer is dropped, after it kept.
    {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Where?", "reasoning_content": "need a city"},
        {"role": "user", "content": "Oslo"},
        {"role": "assistant", "content": "", "reasoning_content": "call it", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c", "name": "get_weather", "content": "-3 C"},
    ]},
]


def main() -> None:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = []
    for name in TEMPLATES:
        template = env.from_string(open(f"fixtures/chat/templates/{name}").read())
        for c in CASES:
            kw = {"tools": c["tools"]} if c["tools"] else {}
            rendered = template.render(messages=c["messages"], add_generation_prompt=True, **kw)
            # The declarations as a client sends them (compact, ASCII-escaped, key order kept).
            tools_text = json.dumps(c["tools"], separators=(",", ":")) if c["tools"] else None
            out.append({"template": name, "messages": c["messages"], "tools_text": tools_text, "rendered": rendered})
    json.dump(out, open("fixtures/chat/k2-templates.json", "w"), indent=1, ensure_ascii=False)
    print(f"wrote {len(out)} renderings to fixtures/chat/k2-templates.json")


if __name__ == "__main__":
    main()
