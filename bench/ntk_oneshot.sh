#!/usr/bin/env bash
# Fixed costs as a new user meets them: the whole `pathkernel kernel --kind ntk --step S` command
# (load, compute, exactness check, write gram.safetensors + tables) against a numpy script that
# loads the step file, computes the closed form and saves the array (bench/ntk_oneshot.py), on
# the paper toy (200 test x 3000 train, K = 3), timed as whole processes, alternating, fastest of
# ROUNDS each. Prints one markdown table row.
#
#   bash bench/ntk_oneshot.sh          # ROUNDS=7, VENV and OUT as in bench/compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$HOME/.cache/pathkernel-bench-venv}
OUT=${OUT:-bench/out}
ROUNDS=${ROUNDS:-7}
TARGET=${CARGO_TARGET_DIR:-target}
PK="$TARGET/release/pathkernel"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import numpy, safetensors" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "numpy<2" safetensors
fi
cargo build --release --quiet
mkdir -p "$OUT"
if [ ! -f "$OUT/run/manifest.json" ]; then
    rm -rf "$OUT/run"
    "$PK" train --config data/studies/paper-toy.toml --out "$OUT/run" --quiet
fi
STEP=100
now() { date +%s.%N; }
best_pk=1e9; best_np=1e9
for _ in $(seq "$ROUNDS"); do
    t0=$(now); "$PK" kernel --run "$OUT/run" --kind ntk --step $STEP --points test --out "$OUT/ntk-oneshot" --force --quiet > /dev/null; t1=$(now)
    "$VENV/bin/python" bench/ntk_oneshot.py "$OUT/run" $STEP "$OUT/ntk-oneshot.npy"; t2=$(now)
    best_pk=$(awk -v a="$t0" -v b="$t1" -v m="$best_pk" 'BEGIN { s = b - a; print (s < m ? s : m) }')
    best_np=$(awk -v a="$t1" -v b="$t2" -v m="$best_np" 'BEGIN { s = b - a; print (s < m ? s : m) }')
done
awk -v p="$best_pk" -v n="$best_np" -v l="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { printf "| one-step NTK command, whole process (paper toy) | %.3f s | numpy load + closed form + np.save | %.3f s | %.2f | ≤ 1× | %s | load %s |\n", p, n, p / n, (p <= n ? "yes" : "**no**"), l }'
