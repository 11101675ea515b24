#!/usr/bin/env bash
# One non-interactive Codex CLI turn (`codex exec`, OpenAI's agent, speaking the Responses API)
# against `k3-cli serve` on a model, through a proxy that logs every request body Codex sends
# (to $work/requests.jsonl; the answers to $work/requests.jsonl.out). Nothing of the user's
# Codex setup is read or touched: CODEX_HOME is a fresh directory here.
#
#   tools/server/codex_turn.sh CLI MODEL CODEX [PROMPT]
#
# CLI: target/debug/k3-cli; MODEL: a model (the tool-caller of `cargo xtask synth --preset
# tool-caller` calls a tool each turn); CODEX: the `codex` binary (`npm install --prefix DIR
# @openai/codex`, then DIR/node_modules/.bin/codex).
set -euo pipefail
cli=$1 model=$2 codex=$3 prompt=${4:-"What is the weather in Paris?"}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
server_port=$(port) proxy_port=$(port)
"$cli" serve --model "$model" --port "$server_port" --api-key sesame --log-format json --context "${K3_CONTEXT:-65536}" 2>"$work/server.log" &
server=$!
python3 "$here/logging_proxy.py" "$proxy_port" "http://127.0.0.1:$server_port" "$work/requests.jsonl" &
proxy=$!
trap 'kill $server $proxy 2>/dev/null; wait $server $proxy 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  curl -sf "http://127.0.0.1:$server_port/health" >/dev/null && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$server_port/health" >/dev/null || { echo "the server did not become ready:"; cat "$work/server.log"; exit 1; }
name=$(curl -sf -H 'authorization: Bearer sesame' "http://127.0.0.1:$server_port/v1/models" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
mkdir -p "$work/home"
cat >"$work/home/config.toml" <<EOF
model_provider = "k3"
model = "$name"
# Web search is a tool OpenAI runs on its servers; k3 refuses it by name.
web_search = "disabled"

[model_providers.k3]
name = "k3"
base_url = "http://127.0.0.1:$proxy_port/v1"
wire_api = "responses"
env_key = "K3_KEY"
EOF
# Codex runs the call the model makes and sends its output back: one round trip is two
# requests. The scripted tool-caller calls a tool every turn, so Codex is stopped once the
# second is answered.
K3_KEY=sesame CODEX_HOME="$work/home" "$codex" exec --skip-git-repo-check --sandbox read-only \
  "$prompt" </dev/null >"$work/codex.out" 2>"$work/codex.err" &
agent=$!
trap 'kill $agent $server $proxy 2>/dev/null; wait $agent $server $proxy 2>/dev/null || true' EXIT
answered() { grep -c '^--- POST /v1/responses' "$work/requests.jsonl.out" 2>/dev/null || echo 0; }
for _ in $(seq "${CODEX_WAIT:-300}"); do
  kill -0 $agent 2>/dev/null || break
  [ "$(answered)" -ge 2 ] && break
  sleep 1
done
kill $agent 2>/dev/null || true
wait $agent 2>/dev/null || true
echo "--- Codex's output:"
cat "$work/codex.out" "$work/codex.err"
echo "--- the server's request lines:"
grep '"event":"request"' "$work/server.log" || true
echo "--- the requests Codex sent (bodies in $work/requests.jsonl, answers in $work/requests.jsonl.out):"
python3 - "$work/requests.jsonl" "$work/requests.jsonl.out" <<'EOF2'
import json, re, sys
bodies = [json.loads(line)["body"] or {} for line in open(sys.argv[1])]
for b in bodies:
    print("POST /v1/responses", sorted(b), [i.get("type", i.get("role")) for i in b.get("input", [])])
statuses = re.findall(r"^--- POST /v1/responses (\d+)$", open(sys.argv[2]).read(), re.M)
assert statuses[:2] == ["200", "200"], statuses
first_out = open(sys.argv[2]).read()
called = re.findall(r'"call_id":"([^"]+)"', first_out)
sent = [i for i in bodies[1]["input"] if i.get("type") == "function_call_output"]
assert sent and sent[0]["call_id"] in called, (sent, called)
print(f"ok: Codex ran the call {sent[0]['call_id']} and sent its output back; every request answered 200")
EOF2
