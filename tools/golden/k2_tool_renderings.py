"""Reference renderings of Kimi K2's chat template (as shipped, from shared/golden/chat-templates)
for conversations with tools, made with Python jinja2 and the `tojson` filter transformers'
`apply_chat_template` installs (key order kept, ", " / ": " separators, no ASCII escaping).
Writes fixtures/chat/k2-tools.json: [{messages, tools, tools_text, rendered}].

    python3 -m venv /tmp/v && /tmp/v/bin/pip install jinja2
    /tmp/v/bin/python tools/golden/k2_tool_renderings.py ../shared/golden/chat-templates/Kimi-K2-Instruct.jinja
"""

import json
import sys

import jinja2


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # As transformers' chat-template environment defines it.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main() -> None:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    template = env.from_string(open(sys.argv[1]).read())
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city, in °C",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    clock = {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}}}
    cases = [
        {"tools": [weather], "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Weather in Paris?"},
        ]},
        {"tools": [weather, clock], "messages": [
            {"role": "system", "content": "You are Kimi."},
            {"role": "user", "content": "Weather in Paris and the time?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "18 C, clear"},
            {"role": "tool", "tool_call_id": "call_1", "name": "now", "content": "12:00"},
        ]},
    ]
    for c in cases:
        c["rendered"] = template.render(messages=c["messages"], tools=c["tools"], add_generation_prompt=True)
        # The declarations as a client sends them (compact); the renderer must respace them.
        c["tools_text"] = json.dumps(c["tools"], separators=(",", ":"), ensure_ascii=True)
    json.dump(cases, open("fixtures/chat/k2-tools.json", "w"), indent=1, ensure_ascii=False)
    print(f"wrote {len(cases)} renderings to fixtures/chat/k2-tools.json")


if __name__ == "__main__":
    main()
