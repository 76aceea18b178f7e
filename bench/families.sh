#!/usr/bin/env bash
# The MLP and CNN presets against the layer-stack engine, as a researcher runs them: for each
# network and quadrature rule, the EPK's wall seconds, CPU share, gradient evaluations per point
# and step and the machine's exactness, for one or more pathkernel binaries in one run (the
# machine's load moves every figure: compare within a run), beside faer's DGEMM rate.
#
#   bash bench/families.sh                                    # this checkout's release binary
#   BINS="before:/tmp/pathkernel-old after:target/release/pathkernel" bash bench/families.sh
#
# The networks, trained once each on MNIST (2 000 training images, 200 per digit, pixels x/255;
# IMAGES held-out images, default 64): the MNIST MLP of data/studies/mnist-mlp.toml (784-128-10
# ReLU, full-batch GD lr 0.5, 200 steps), the same network written as a layer stack, a
# 784-128-64-10 ReLU MLP, a 784-128-10 tanh MLP, and the CNN preset of data/studies/mnist-cnn.toml
# (1 000 images, lr 0.1, 100 steps) and the same CNN written as a layer stack, and a linear
# model (hidden = [], GD lr 0.1) as the MLP preset and as a layer stack. The EPK (class-diagonal) over STEPS (default 0:20) with
# RULES (default "auto:1e-12 left:10"). Needs the MNIST files (bash data/fetch-mnist.sh).
# With OPTIM=momentum (heavy-ball 0.9, lr 0.05; the CNNs lr 0.01) or OPTIM=adam (lr 0.001) the
# networks train 40 steps with that optimizer instead (the kernel then replays it); their runs
# go to bench/out/families-$OPTIM.
# With PATHS="fast nodes" each kernel also runs with `--path nodes` (the stack engine at its
# quadrature nodes, never a closed form): the closed forms against the engine they replace.
# Environment: OUT (default bench/out/families), CARGO_TARGET_DIR, NETS (a subset of the names
# below), OPTIM, PATHS (default fast).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES="${IMAGES:-64}"
STEPS="${STEPS:-0:20}"
RULES="${RULES:-auto:1e-12 left:10}"
PATHS="${PATHS:-fast}"
OPTIM="${OPTIM:-gd}"
case "$OPTIM" in
    gd) OUT="${OUT:-bench/out/families}" ;;
    momentum | adam) OUT="${OUT:-bench/out/families-$OPTIM}" ;;
    *) echo "families: OPTIM is gd, momentum or adam, not $OPTIM" >&2; exit 2 ;;
esac
TARGET="${CARGO_TARGET_DIR:-target}"
BINS="${BINS:-this:$TARGET/release/pathkernel}"
NETS="${NETS:-mlp mlp-as-stack mlp-2-hidden mlp-tanh cnn cnn-as-stack linear linear-as-stack}"
mkdir -p "$OUT"
first_bin="${BINS%% *}"
first_bin="${first_bin#*:}"

config() {
    local data="[data]
kind = \"mnist\"
per_class = 200
n_test = $IMAGES
normalize = false
"
    # The MLPs' and the CNNs' training: GD (lr 0.5, 200 steps; the CNNs lr 0.1, 100 steps), or
    # 40 steps of OPTIM (momentum: lr 0.05, the CNNs 0.01; adam: lr 0.001).
    local gd="[train]
optimizer = \"gd\"
lr = 0.5
steps = 200
seed = 0"
    local cnn_train="[train]
lr = 0.1
steps = 100"
    case "$OPTIM" in
        momentum)
            gd="[train]
optimizer = \"gd\"
momentum = 0.9
lr = 0.05
steps = 40
seed = 0"
            cnn_train="[train]
momentum = 0.9
lr = 0.01
steps = 40" ;;
        adam)
            gd="[train]
optimizer = \"adam\"
lr = 0.001
steps = 40
seed = 0"
            cnn_train="[train]
optimizer = \"adam\"
lr = 0.001
steps = 40" ;;
    esac
    case "$1" in
        mlp) printf '%s\n[model]\nkind = "mlp"\nhidden = [128]\nactivation = "relu"\nzero_last = true\n\n%s\n' "$data" "$gd" ;;
        mlp-as-stack) printf '%s\n[model]\nkind = "layers"\nlayers = ["flatten", { dense = 128 }, "relu", { dense = 10 }]\nzero_last = true\n\n%s\n' "$data" "$gd" ;;
        linear) printf '%s\n[model]\nkind = "mlp"\nhidden = []\nzero_last = false\n\n%s\n' "$data" "${gd/lr = 0.5/lr = 0.1}" ;;
        linear-as-stack) printf '%s\n[model]\nkind = "layers"\nlayers = ["flatten", { dense = 10 }]\nzero_last = false\n\n%s\n' "$data" "${gd/lr = 0.5/lr = 0.1}" ;;
        mlp-2-hidden-as-stack) printf '%s\n[model]\nkind = "layers"\nlayers = ["flatten", { dense = 128 }, "relu", { dense = 64 }, "relu", { dense = 10 }]\nzero_last = true\n\n%s\n' "$data" "$gd" ;;
        mlp-2-hidden) printf '%s\n[model]\nkind = "mlp"\nhidden = [128, 64]\nactivation = "relu"\nzero_last = true\n\n%s\n' "$data" "$gd" ;;
        mlp-tanh) printf '%s\n[model]\nkind = "mlp"\nhidden = [128]\nactivation = "tanh"\nzero_last = true\n\n%s\n' "$data" "$gd" ;;
        cnn-as-stack) printf '[data]\nkind = "mnist"\nn_train = 1000\nn_test = %s\n\n[model]\nkind = "layers"\nlayers = [{ conv2d = { channels = 4, kernel = 5 } }, "relu", { max_pool2d = 2 }, "flatten", { dense = 10 }]\n\n%s\n' "$IMAGES" "$cnn_train" ;;
        cnn) printf '[data]\nkind = "mnist"\nn_train = 1000\nn_test = %s\n\n[model]\nkind = "cnn"\nchannels = 4\nkernel = 5\npool = 2\n\n%s\n' "$IMAGES" "$cnn_train" ;;
        *) echo "families: unknown network $1" >&2; exit 2 ;;
    esac
}

for net in $NETS; do
    config "$net" > "$OUT/$net.toml"
    if [ ! -f "$OUT/run-$net/manifest.json" ] || ! cmp -s "$OUT/$net.toml" "$OUT/run-$net.toml"; then
        "$first_bin" train -q --config "$OUT/$net.toml" --out "$OUT/run-$net" --force
        cp "$OUT/$net.toml" "$OUT/run-$net.toml"
    fi
done

. bench/lib.sh
gemm() { gemm_rate "$first_bin" "$OUT/run-${NETS%% *}"; }

echo "| network | rule | path | binary | wall s | CPU % | CPU s | evaluations/point/step | max abs err | tolerance met | faer DGEMM GFLOP/s (before, after) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for net in $NETS; do
    for rule in $RULES; do
        for path in $PATHS; do
        for entry in $BINS; do
            name="${entry%%:*}"
            bin="${entry#*:}"
            g0=$(gemm)
            k="$OUT/k-$net-$rule-$path-$name"
            # `--path` only where asked (binaries before it had the fast path alone).
            path_arg=()
            [ "$path" = fast ] || path_arg=(--path "$path")
            /usr/bin/time -v -o "$k.time" "$bin" kernel -q --run "$OUT/run-$net" --kind epk --quadrature "$rule" --layout diag --steps "$STEPS" "${path_arg[@]}" --out "$k" --force > "$k.stdout" 2> "$k.stderr" || { cat "$k.stderr" >&2; exit 1; }
            g1=$(gemm)
            PYTHONPATH=bench python3 - "$k" "$net" "$rule" "$path" "$name" "$g0" "$g1" <<'PY'
import json, sys
from timev import read
k, net, rule, path, name, g0, g1 = sys.argv[1:]
t = read(f"{k}.time")
secs, cpu = t["wall_s"], t["user_s"] + t["system_s"]
e = json.load(open(f"{k}/exactness.json"))
print(f"| {net} | {rule} | {path} | {name} | {secs:.2f} | {t['cpu_percent']} | {cpu:.2f} | "
      f"{e['evaluations_per_step']['mean']:.1f} | {e['max_abs_error']:.2e} | {e['tolerance_met']} | {float(g0):.0f}, {float(g1):.0f} |")
PY
        done
        done
    done
done
