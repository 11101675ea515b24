#!/usr/bin/env bash
# Are two builds' outputs the same bytes? Converts every golden checkpoint with each trunk
# encoding, runs `k3-cli logits` on each result and on the committed fixtures, synthesizes
# `k3-tiny` and re-encodes the default model to VQ3, with both builds; prints one line per case
# (SAME / DIFF) and exits 1 if any differ. For a refactoring that must not change results.
#   tools/check/same-output.sh OLD_TARGET_DIR NEW_TARGET_DIR     (each with release/k3-cli, release/xtask)
# A build without `k3-cli convert` (before it existed) converts with its `xtask convert`.
set -uo pipefail
cd "$(dirname "$0")/../.."
old="$1/release"; new="$2/release"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
convert() { # build out args...
  local b="$1"; shift
  if "$b/k3-cli" convert --help >/dev/null 2>&1; then "$b/k3-cli" convert "$@"; else "$b/xtask" convert "$@"; fi
}
digest() { (cd "$1" && cat trunk.waste experts-*.waste | sha256sum | cut -c1-16); }
fail=0
report() { # label a b
  if [ "$2" = "$3" ]; then echo "SAME  $1  $2"; else echo "DIFF  $1  $2 vs $3"; fail=1; fi
}
ids="37 246 205 394 441 30 262 282"
for g in tiny-k3 tiny-kimi-linear deepseek-v3/bf16 deepseek-v3/fp8 deepseek-v3/int4; do
  n="${g//\//-}"
  for t in keep int8 int4; do
    for v in old new; do
      b="$old"; [ $v = new ] && b="$new"
      convert "$b" --hf "fixtures/golden/$g" --out "$work/$v-$n-$t" --trunk $t >/dev/null 2>&1 || echo "convert failed: $v $n $t"
      "$b/k3-cli" logits --model "$work/$v-$n-$t" --ids "$ids" --out "$work/$v-$n-$t.f32" >/dev/null 2>&1
    done
    report "$n --trunk $t: converted bytes" "$(digest "$work/old-$n-$t")" "$(digest "$work/new-$n-$t")"
    report "$n --trunk $t: logits" "$(sha256sum < "$work/old-$n-$t.f32" | cut -c1-16)" "$(sha256sum < "$work/new-$n-$t.f32" | cut -c1-16)"
  done
done
for m in fixtures/tiny-k3.waste fixtures/tiny-kimi-linear.waste fixtures/default.waste; do
  "$old/k3-cli" logits --model "$m" --ids "$ids" --out "$work/o.f32" >/dev/null 2>&1
  "$new/k3-cli" logits --model "$m" --ids "$ids" --out "$work/n.f32" >/dev/null 2>&1
  report "$m: logits" "$(sha256sum < "$work/o.f32" | cut -c1-16)" "$(sha256sum < "$work/n.f32" | cut -c1-16)"
done
"$old/xtask" synth --preset k3-tiny --out "$work/synth-old" >/dev/null 2>&1
"$new/xtask" synth --preset k3-tiny --out "$work/synth-new" >/dev/null 2>&1
report "synth --preset k3-tiny" "$(digest "$work/synth-old")" "$(digest "$work/synth-new")"
convert "$old" --from fixtures/default.waste --out "$work/vq-old" --experts vq3 >/dev/null 2>&1
convert "$new" --from fixtures/default.waste --out "$work/vq-new" --experts vq3 >/dev/null 2>&1
report "default model --experts vq3" "$(digest "$work/vq-old")" "$(digest "$work/vq-new")"
exit $fail
