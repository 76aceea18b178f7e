#!/usr/bin/env bash
# Side-by-side performance of pathkernel against numpy, neural-tangents, scipy and scikit-learn
# on identical inputs, in one run on this machine (issue #7). Prints a markdown table of ratios
# and the max relative differences of the results (must agree to 1e-10), the paper-toy study's
# wall time, and writes the scaling chart.
#
#   bash bench/compare.sh                 # everything (about 3-5 minutes on 2 cores)
#   REPEAT=3 SKIP_NT=1 bash bench/compare.sh
#
# Environment: VENV (default $HOME/.cache/pathkernel-bench-venv), OUT (default bench/out),
# REPEAT (default 5), ROUNDS (default 3: our fast cases and the peers timed alternately), SKIP_NT=1 (no neural-tangents), SKIP_STUDY=1, SKIP_SCALING=1,
# CARGO_TARGET_DIR as usual.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$HOME/.cache/pathkernel-bench-venv}
OUT=${OUT:-bench/out}
REPEAT=${REPEAT:-5}
ROUNDS=${ROUNDS:-3}
TARGET=${CARGO_TARGET_DIR:-target}
PK="$TARGET/release/pathkernel"

# 1. The Python peers. jax 0.4.25 predates numpy 2 and needs a tensorflow of its time (for
#    tf2jax, which neural-tangents imports).
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import neural_tangents, sklearn, scipy, safetensors" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "numpy<2" "scipy<1.14" "scikit-learn<1.6" safetensors \
        jax==0.4.25 jaxlib==0.4.25 neural-tangents==0.6.5 "tensorflow-cpu==2.16.1" "ml-dtypes~=0.3.1"
fi
export TF_CPP_MIN_LOG_LEVEL=3

# 2. Our side: build, train the paper toy, time every case and export the compared arrays.
cargo build --release --quiet
mkdir -p "$OUT"
if [ ! -f "$OUT/run/manifest.json" ]; then
    rm -rf "$OUT/run"
    "$PK" train --config data/studies/paper-toy.toml --out "$OUT/run" --quiet
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
SCALING_ARGS=()
if [ -z "${SKIP_SCALING:-}" ]; then
    SCALING_ARGS=(--scaling 300,1000,3000,10000 --scaling-steps 1,3,10,30,100 --scaling-out "$OUT")
fi
"$PK" bench --run "$OUT/run" --step 50 --repeat "$REPEAT" --full --gram-m 3000 --export "$OUT" "${SCALING_ARGS[@]}" > "$OUT/bench.jsonl"

# 3. The peers on the same inputs, and the table.
NT_ARGS=()
if [ -n "${SKIP_NT:-}" ]; then NT_ARGS=(--skip-nt); fi
"$VENV/bin/python" bench/compare.py "$OUT/run" "$OUT" --repeat "$REPEAT" --rounds "$ROUNDS" --pk "$PK" "${NT_ARGS[@]}" 2> >(grep -v -E "^(I0000|W0000)|oneDNN|cuda" >&2)

# 4. The whole paper-toy study, from scratch (fresh cache and report directories).
if [ -z "${SKIP_STUDY:-}" ]; then
    rm -rf "$OUT/study-cache" "$OUT/study-report"
    t0=$(date +%s.%N)
    "$PK" study run data/studies/paper-toy.toml --out "$OUT/study-report" --cache "$OUT/study-cache" --quiet > /dev/null
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { s = b - a; printf "| whole paper-toy study (study run, fresh cache) | %.1f s | | | | ≤ 60 s | %s | |\n", s, (s <= 60 ? "yes" : "**no**") }'
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
