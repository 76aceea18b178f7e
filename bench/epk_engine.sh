#!/usr/bin/env bash
# The layer-stack EPK engine on LeNet-5, as a researcher runs it: seconds per held-out image,
# cores busy, the kernel's (system) share of the CPU time, page faults, evaluations per point
# and step and the machine's exactness, for one or more pathkernel binaries in one run, beside
# faer's DGEMM rate measured in the same run (the machine's load moves every figure).
#
#   bash bench/epk_engine.sh                                  # this checkout's release binary
#   BINS="before:/tmp/pathkernel-old after:target/release/pathkernel" bash bench/epk_engine.sh
#
# The network: LeNet-5 (data/studies/mnist-lenet.toml's layers) trained by mini-batch SGD
# (batches of 100, lr 0.3, seed 0) on PER_CLASS (default 200: 2 000) MNIST training images for
# TRAIN_STEPS (default 100) steps; the EPK (auto:1e-12, class-diagonal) of IMAGES (default 4)
# held-out images over the steps STEPS (default 0:10), on the network's outputs or, with
# OUTPUTS=logits, on the logits (as data/studies/mnist-lenet.toml), split by parameter layer with
# PER_LAYER=1 (as that study's exact EPK). The 500 held-out images of that study's network over
# all 100 steps: IMAGES=500 STEPS=0:100 OUTPUTS=logits PER_LAYER=1 bash bench/epk_engine.sh
# (about 1.4 hours on two cores). Needs the MNIST files (bash data/fetch-mnist.sh).
# Environment: OUT (default bench/out/epk-engine), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
PER_CLASS="${PER_CLASS:-200}"
TRAIN_STEPS="${TRAIN_STEPS:-100}"
IMAGES="${IMAGES:-4}"
STEPS="${STEPS:-0:10}"
OUTPUTS="${OUTPUTS:-network}"
PER_LAYER="${PER_LAYER:-0}"
OUT="${OUT:-bench/out/epk-engine}"
TARGET="${CARGO_TARGET_DIR:-target}"
BINS="${BINS:-this:$TARGET/release/pathkernel}"
mkdir -p "$OUT"
first_bin="${BINS%% *}"
first_bin="${first_bin#*:}"
extra=(--outputs "$OUTPUTS")
[ "$PER_LAYER" = 1 ] && extra+=(--per-layer)

cat > "$OUT/lenet.toml" <<EOF
[data]
kind = "mnist"
per_class = $PER_CLASS
n_test = $IMAGES
normalize = true

[model]
kind = "layers"
zero_last = false
layers = [
  { conv2d = { channels = 6, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 },
  { conv2d = { channels = 16, kernel = 5 } }, "relu", { max_pool2d = 2 },
  "flatten", { dense = 120 }, "relu", { dense = 84 }, "relu", { dense = 10 },
]

[train]
optimizer = "sgd"
batch_size = 100
lr = 0.3
steps = $TRAIN_STEPS
seed = 0
EOF
if [ ! -f "$OUT/run/manifest.json" ] || ! cmp -s "$OUT/lenet.toml" "$OUT/run.toml"; then
    "$first_bin" train -q --config "$OUT/lenet.toml" --out "$OUT/run" --force
    cp "$OUT/lenet.toml" "$OUT/run.toml"
fi

. bench/lib.sh
gemm() { gemm_rate "$first_bin" "$OUT/run"; }

echo "| binary | P | steps | wall s | s per image | CPU % | system share | minor faults | evaluations/point/step | max abs err | tolerance met | faer DGEMM GFLOP/s (before, after) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for entry in $BINS; do
    name="${entry%%:*}"
    bin="${entry#*:}"
    g0=$(gemm)
    /usr/bin/time -v -o "$OUT/time-$name.txt" "$bin" kernel -q --run "$OUT/run" --kind epk --quadrature auto:1e-12 --layout diag --steps "$STEPS" "${extra[@]}" --out "$OUT/k-$name" --force > "$OUT/stdout-$name.txt" 2> "$OUT/stderr-$name.txt" || { cat "$OUT/stderr-$name.txt" >&2; exit 1; }
    g1=$(gemm)
    PYTHONPATH=bench python3 - "$OUT" "$name" "$IMAGES" "$STEPS" "$g0" "$g1" <<'PY'
import json, sys
from timev import read
out, name, images, steps, g0, g1 = sys.argv[1:]
t = read(f"{out}/time-{name}.txt")
secs, user, system = t["wall_s"], t["user_s"], t["system_s"]
e = json.load(open(f"{out}/k-{name}/exactness.json"))
print(f"| {name} | {images} | {steps} | {secs:.1f} | {secs / int(images):.1f} | {t['cpu_percent']} | "
      f"{system / max(user + system, 1e-9):.3f} | {t['minor_faults']:,} | "
      f"{e['evaluations_per_step']['mean']:.1f} | {e['max_abs_error']:.2e} | {e['tolerance_met']} | {float(g0):.0f}, {float(g1):.0f} |")
PY
done
