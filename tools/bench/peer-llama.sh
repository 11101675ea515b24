#!/usr/bin/env bash
# k3 side by side with llama.cpp, the engine people would otherwise use (not run in CI: it
# downloads torch and llama.cpp and takes ~30 minutes on two cores).
#
#   tools/bench/peer-llama.sh [WORK_DIR]        (default bench-out/peer; THREADS, REPS, ACTIVATIONS,
#                                                PAIRS, ISA from the env; ACTIVATIONS: k3's --activations,
#                                                auto, its default; ISA=avx2: both engines as on an
#                                                AVX2-only CPU (llama.cpp built for AVX2 + FMA + F16C,
#                                                k3 with K3_SIMD=avx2), results in results-avx2)
#
# 1. builds llama.cpp (llama-bench, llama-quantize) from the llama-cpp-python source package on
#    PyPI, whose vendored llama.cpp has the kimi-linear architecture; natively, but without AMX (this machine's
#    CPU reports AMX but the VM does not enable its tile state: llama.cpp's AMX kernels die with
#    SIGILL), every other native extension on;
# 2. makes a random-weight Kimi-Linear-shaped checkpoint with stock transformers (1.54 B
#    parameters: hidden 1024, 8 layers, 128 experts top-8; tools/bench/peer/make_kimi_linear.py);
# 3. converts it to GGUF (BF16, then llama-quantize to Q8_0, Q4_K_M and MXFP4_MOE) and to WASTE
#    (bf16 as stored; MXFP4 experts with an int4 trunk, Q4_K_M's pairing, and with an int8 trunk,
#    MXFP4_MOE's; PAIRS from the env chooses others);
# 4. runs both engines' decode (64 tokens after a 32-token prompt) and prefill (256 tokens) on the
#    same thread count, interleaved, REPS times, and prints medians and ratios;
# 5. measures each pair's quality on a trained model, the default model (fixtures/default.waste,
#    exported as a Hugging Face checkpoint and encoded the same ways by both): the mean KL against
#    the unquantized model over the held-out text, in the same 256-token windows, each engine
#    scoring the second half of every window (llama-perplexity --kl-divergence; k3-cli perplexity
#    --skip 128 --against), with the same --activations as the speed runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$(realpath -m "${1:-bench-out/peer}")
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
ACTIVATIONS=${ACTIVATIONS:-auto}
mkdir -p "$W"

# Tools: a venv with the converter's and the checkpoint maker's packages.
if [ ! -x "$W/venv/bin/python" ]; then
    python3 -m venv "$W/venv"
    "$W/venv/bin/pip" install -q "torch==2.15.0" "transformers==5.24.0" safetensors numpy sentencepiece \
        protobuf cmake ninja
fi
PY="$W/venv/bin/python"
export PATH="$W/venv/bin:$PATH"

# llama.cpp from the llama-cpp-python sdist.
LLAMA="$W/llama.cpp"
if [ ! -d "$LLAMA/ggml" ]; then
    "$W/venv/bin/pip" download -q llama-cpp-python --no-binary llama-cpp-python --no-deps -d "$W/sdist"
    rm -rf "$W/src" && mkdir -p "$W/src"
    tar xzf "$W"/sdist/llama_cpp_python-*.tar.gz -C "$W/src"
    rm -rf "$LLAMA" && mv "$W"/src/llama_cpp_python-*/vendor/llama.cpp "$LLAMA"
fi
ISA=${ISA:-native}
case "$ISA" in
    native) BUILD="$LLAMA/build" R="$W/results"
        ISA_FLAGS=(-DGGML_NATIVE=ON) ;;
    avx2) BUILD="$LLAMA/build-avx2" R="$W/results-avx2"
        ISA_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
        export K3_SIMD=avx2 ;;
    *) echo "ISA is native or avx2, not $ISA" >&2; exit 2 ;;
esac
if [ ! -f "$BUILD/build.ninja" ]; then
    cmake -S "$LLAMA" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF "${ISA_FLAGS[@]}" \
        "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
        "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
fi
if [ ! -x "$BUILD/bin/llama-perplexity" ]; then
    cmake --build "$BUILD" --target llama-bench llama-quantize llama-perplexity -j "$(nproc)" >/dev/null
fi
BIN="$BUILD/bin"

# k3.
cargo build --release -q -p xtask -p k3-cli

# The checkpoint and its conversions.
if [ ! -f "$W/hf/config.json" ]; then
    target/release/xtask export --model fixtures/default.waste --out "$W/tokenizer-src"
    "$PY" tools/bench/peer/make_kimi_linear.py "$W/hf" "$W/tokenizer-src/tokenizer.json"
fi
[ -f "$W/bf16.gguf" ] || "$PY" tools/bench/peer/convert_gguf.py "$LLAMA" "$W/hf" "$W/bf16.gguf"
for q in Q8_0 Q4_K_M MXFP4_MOE; do
    [ -f "$W/$q.gguf" ] || "$BIN/llama-quantize" "$W/bf16.gguf" "$W/$q.gguf" "$q" "$THREADS" >/dev/null 2>&1
done
# k3's models are made again every run: a conversion already complete is kept as it is, and this
# build's encoder may differ from the one that wrote it.
rm -rf "$W"/*.waste "$W"/quality/*.waste
target/release/xtask convert --hf "$W/hf" --out "$W/bf16.waste" >/dev/null
target/release/xtask convert --hf "$W/hf" --out "$W/mxfp4-int8.waste" --experts mxfp4 --trunk int8 >/dev/null
target/release/xtask convert --hf "$W/hf" --out "$W/mxfp4-int4.waste" --experts mxfp4 --trunk int4 >/dev/null

# Pairs: WASTE model, GGUF model, at matching bytes per weight: Q4_K_M's trunk is 4-6 bits a
# weight (k3's int4 trunk: 4.5), MXFP4_MOE's is Q8_0 (k3's int8 trunk: 8 + a scale a row).
PAIRS=${PAIRS:-"bf16.waste:bf16.gguf mxfp4-int4.waste:Q4_K_M.gguf mxfp4-int8.waste:MXFP4_MOE.gguf mxfp4-int8.waste:Q8_0.gguf"}
rm -rf "$R" && mkdir -p "$R"
for rep in $(seq 1 "$REPS"); do
    for pair in $PAIRS; do
        waste=${pair%%:*} gguf=${pair##*:}
        echo "rep $rep: $waste vs $gguf" >&2
        # k3's warm runs (the experts in its cache, as llama.cpp's weights are in the page cache
        # after its warm-up): `bench decode` runs the prompt and decode, then both again.
        target/release/xtask bench decode --model "$W/$waste" --prompt 32 --tokens 64 --reps 1 \
            --variants overlap --threads "$THREADS" --activations "$ACTIVATIONS" --svg "$R/svg.svg" --json >"$R/k3-decode-$waste-$gguf-$rep.json" 2>/dev/null
        target/release/xtask bench decode --model "$W/$waste" --prompt 256 --tokens 1 --reps 1 \
            --variants overlap --threads "$THREADS" --activations "$ACTIVATIONS" --svg "$R/svg.svg" --json >"$R/k3-prefill-$waste-$gguf-$rep.json" 2>/dev/null
        "$BIN/llama-bench" -m "$W/$gguf" -t "$THREADS" -p 256 -n 64 -d 32 -r 1 -o json \
            >"$R/llama-$waste-$gguf-$rep.json" 2>/dev/null
    done
done

# Quality on the trained default model: each pair's models made again from it.
Q="$W/quality" && mkdir -p "$Q"
TEXT=fixtures/default-model/heldout.txt
[ -f "$Q/hf/config.json" ] || target/release/xtask export --model fixtures/default.waste --out "$Q/hf" >/dev/null
[ -f "$Q/bf16.gguf" ] || "$PY" tools/bench/peer/convert_gguf.py "$LLAMA" "$Q/hf" "$Q/bf16.gguf" >/dev/null 2>&1
[ -f "$Q/base.kld" ] || "$BIN/llama-perplexity" -m "$Q/bf16.gguf" -f "$TEXT" -c 256 -b 256 -t "$THREADS" \
    --kl-divergence-base "$Q/base.kld" >"$Q/llama-base.txt" 2>&1
for pair in $PAIRS; do
    waste=${pair%%:*} gguf=${pair##*:}
    if [ "$gguf" != bf16.gguf ] && [ ! -f "$Q/$gguf" ]; then
        "$BIN/llama-quantize" "$Q/bf16.gguf" "$Q/$gguf" "${gguf%.gguf}" "$THREADS" >/dev/null 2>&1
    fi
    "$BIN/llama-perplexity" -m "$Q/$gguf" -f "$TEXT" -c 256 -b 256 -t "$THREADS" --kl-divergence-base "$Q/base.kld" \
        --kl-divergence >"$R/quality-llama-$gguf.txt" 2>&1
    if [ "$waste" = bf16.waste ]; then
        m=fixtures/default.waste
    else
        m="$Q/$waste" enc=${waste%.waste}
        [ -d "$m" ] || target/release/k3-cli convert --from fixtures/default.waste --out "$m" \
            --experts "${enc%-*}" --trunk "${enc#*-}" >/dev/null
    fi
    target/release/k3-cli perplexity --model "$m" "$TEXT" --window 256 --skip 128 --against fixtures/default.waste \
        --activations "$ACTIVATIONS" --threads "$THREADS" --json >"$R/quality-k3-$waste.json" 2>/dev/null
    echo "$(du -sb "$m" | cut -f1) $(stat -c %s "$Q/$gguf")" >"$R/quality-bytes-$waste-$gguf"
done

"$PY" - "$R" "$PAIRS" "$THREADS" "$ACTIVATIONS" <<'PY'
import glob, json, statistics, sys
r, pairs, threads, activations = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
med = statistics.median
print(f"decode: 64 tokens after a 32-token prompt; prefill: 256 tokens; {threads} threads; medians; k3 activations {activations}")
print(f"{'k3 (WASTE)':<18} {'llama.cpp (GGUF)':<16} {'k3 decode':>10} {'llama':>8} {'ratio':>6} {'k3 prefill':>11} {'llama':>8} {'ratio':>6}")
for p in pairs:
    w, g = p.split(":")
    k3 = lambda kind, key: med(json.load(open(f))["variants"]["overlap"][key] for f in glob.glob(f"{r}/k3-{kind}-{w}-{g}-*.json"))
    kd, kp = k3("decode", "warm_tok_per_s"), k3("prefill", "warm_prefill_tok_per_s")
    ld, lp = [], []
    for f in glob.glob(f"{r}/llama-{w}-{g}-*.json"):
        for row in json.load(open(f)):
            (ld if row["n_gen"] > 0 else lp).append(row["avg_ts"])
    ld, lp = med(ld), med(lp)
    print(f"{w:<18} {g:<16} {kd:>10.1f} {ld:>8.1f} {kd/ld:>5.2f}x {kp:>11.1f} {lp:>8.1f} {kp/lp:>5.2f}x")
print()
print("quality on the trained default model: mean KL (nats) against the unquantized model, the second half")
print("of each 256-token held-out window; bytes of the model files")
print(f"{'k3 (WASTE)':<18} {'llama.cpp (GGUF)':<16} {'k3 KL':>9} {'llama KL':>9} {'k3 bytes':>10} {'llama bytes':>11}")
for p in pairs:
    w, g = p.split(":")
    k = json.load(open(f"{r}/quality-k3-{w}.json"))["against"]["mean_kl"]
    l = None
    for line in open(f"{r}/quality-llama-{g}.txt"):
        if line.startswith("Mean    KLD:"):
            l = float(line.split()[2])
    kb, lb = open(f"{r}/quality-bytes-{w}-{g}").read().split()
    print(f"{w:<18} {g:<16} {k:>9.5f} {l if l is not None else float('nan'):>9.5f} {int(kb):>10} {int(lb):>11}")
PY
