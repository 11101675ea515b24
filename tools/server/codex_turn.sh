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
"$cli" serve --model "$model" --port "$server_port" --api-key sesame --log-format json 2>"$work/server.log" &
server=$!
python3 "$here/logging_proxy.py" "$proxy_port" "http://127.0.0.1:$server_port" "$work/requests.jsonl" &
proxy=$!
trap 'kill $server $proxy 2>/dev/null; wait $server $proxy 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  curl -sf "http://127.0.0.1:$server_port/health" >/dev/null && break
  sleep 0.1
done
name=$(curl -sf -H 'authorization: Bearer sesame' "http://127.0.0.1:$server_port/v1/models" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
mkdir -p "$work/home"
cat >"$work/home/config.toml" <<EOF
model_provider = "k3"
model = "$name"

[model_providers.k3]
name = "k3"
base_url = "http://127.0.0.1:$proxy_port/v1"
wire_api = "responses"
env_key = "K3_KEY"
EOF
status=0
K3_KEY=sesame CODEX_HOME="$work/home" timeout 120 "$codex" exec --skip-git-repo-check --sandbox read-only \
  "$prompt" </dev/null >"$work/codex.out" 2>"$work/codex.err" || status=$?
echo "codex exit status: $status; its output:"
cat "$work/codex.out"
echo "--- its log (stderr):"
cat "$work/codex.err"
echo "--- the requests it sent (bodies in $work/requests.jsonl):"
python3 - "$work/requests.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    b = r["body"] or {}
    print(r["method"], r["path"], sorted(b), [i.get("type", i.get("role")) for i in b.get("input", [])])
EOF
exit "$status"
