#!/usr/bin/env bash
# The quality rule behind `--activations auto` (issue #57): for each encoding of a trained model,
# the KL its weights cost against the unquantized model, and the KL each rounded-activation
# precision adds on top (against the same encoded model run exact). A precision is a default for
# an encoding where it adds at most a tenth of the weights' KL and never more than 1e-3 nats.
#
#   tools/quality/activation-rule.sh [MODEL] [TEXT] [WORK_DIR]
#     MODEL: a BF16 WASTE model (default fixtures/default.waste); TEXT: held-out text
#     (default fixtures/default-model/heldout.txt). Prints one JSON line per (encoding, precision).
#     ENCODINGS from the env: "experts-trunk ..." (default: every pair below).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-fixtures/default.waste}
TEXT=${2:-fixtures/default-model/heldout.txt}
W=$(realpath -m "${3:-bench-out/activation-rule}")
ENCODINGS=${ENCODINGS:-"keep-bf16 keep-int8 keep-int4 mxfp4-bf16 mxfp4-int8 mxfp4-int4 int4-bf16 int4-int8 int4-int4 vq3-bf16 vq3-int8 vq3-int4"}
mkdir -p "$W"
cargo build --release -q -p k3-cli
K=target/release/k3-cli
kl() { "$K" perplexity --json "$@" 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["against"]["mean_kl"], d["against"]["top1_agreement"])'; }
for enc in $ENCODINGS; do
    e=${enc%-*} t=${enc#*-}
    m="$W/$(basename "$MODEL" .waste)-$enc.waste"
    [ -d "$m" ] || "$K" convert --from "$MODEL" --out "$m" --experts "$e" --trunk "$t" >/dev/null
    read -r wkl wtop < <(kl --model "$m" "$TEXT" --against "$MODEL")
    for a in int8-experts bf16-trunk int8; do
        read -r akl atop < <(kl --model "$m" "$TEXT" --activations "$a" --against "$m")
        echo "{\"encoding\":\"$enc\",\"weights_kl\":$wkl,\"weights_top1\":$wtop,\"activations\":\"$a\",\"added_kl\":$akl,\"added_top1\":$atop}"
    done
done
