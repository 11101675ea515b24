#!/usr/bin/env bash
# One non-interactive Claude Code run against `k3-cli serve` on the scripted tool caller
# (`cargo xtask synth --preset tool-caller`), which answers every turn with a thought, a sentence
# and a `get_weather` call: Claude Code streams /v1/messages, gets the tool_use, answers it with a
# tool_result (an error: it has no such tool) and sends the conversation back, which the server
# resumes from the prefix cache; `--max-turns 2` ends the run there.
#
#   tools/server/claude_code_turn.sh target/debug/k3-cli TOOL_CALLER CLAUDE
#
# CLAUDE: the `claude` of `npm install --prefix DIR @anthropic-ai/claude-code` (DIR/node_modules/.bin/claude).
# `--bare`, a one-line system prompt and one tool keep the prompt short: the tool caller's
# tokenizer is bytes, so Claude Code's own system prompt and tools (~70 kB) are ~77k tokens,
# minutes of prefill in a debug build.
set -euo pipefail
cli="$1" model="$2" claude="$3"
work="$(mktemp -d)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$cli" serve --model "$model" --port "$port" --api-key sesame --log-format json --context 32768 2>"$work/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.05
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "the server did not become ready:"; cat "$work/server.log"; exit 1; }
id="$(basename "$model")"
mkdir -p "$work/home" "$work/cwd"
set +e
(cd "$work/cwd" && HOME="$work/home" ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sesame \
  ANTHROPIC_MODEL="$id" ANTHROPIC_SMALL_FAST_MODEL="$id" ANTHROPIC_DEFAULT_HAIKU_MODEL="$id" \
  DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  timeout 120 "$claude" --bare -p "What is the weather in Paris?" --system-prompt "You are terse." \
  --tools Read --max-turns 2 --no-session-persistence >"$work/out.txt" 2>&1)
set -e
cat "$work/out.txt"; echo
# Two turns, each ended by its call, the second resuming the first's prompt from the cache.
python3 - "$work/server.log" "$work/out.txt" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
turns = [l for l in lines if l.get("event") == "request"]
out = open(sys.argv[2]).read()
assert "Reached max turns (2)" in out, out
assert len(turns) == 2 and all(t["finish_reason"] == "tool_calls" for t in turns), turns
assert turns[1]["cached_tokens"] >= turns[0]["prompt_tokens"], turns
print(f"claude code: 2 turns (tool_use, then its tool_result), the second resumed "
      f"{turns[1]['cached_tokens']} of {turns[1]['prompt_tokens']} prompt tokens from the cache ok")
EOF
