#!/usr/bin/env bash
# The one prepared GPU command (issue 38), run from the repository root on the GPU machine with
# gpu-bundle/ carried (scripts/gpu/build.sh makes it here):
#
#   bash scripts/gpu/run.sh              on the GPU machine, within BUDGET_S (default 400 s)
#   bash scripts/gpu/run.sh --dry-run    here: small sizes, every GPU step replaced by the same
#                                        command with --device cpu, and --device cuda checked to
#                                        be refused in one line (exit 2)
#
# Writes to $OUT (default ./gpu-out), four files, as the device tool brings back:
#   summary.md     the table: device, DGEMM rates, GPU tests, CPU vs GPU Gram difference, the
#                  MNIST 2000 x 2000 x 200-step EPK on GPU vs CPU, the contraction's fraction of
#                  the DGEMM rate, the largest MNIST size run
#   results.jsonl  every JSON line the binary printed, tagged with its step
#   run.log        every command, its exit status, seconds, stderr
#   env.txt        nvidia-smi, CPU, library directory, the bundle's MANIFEST
#
# Before the device call, `bash scripts/gpu/travel.sh stash` (the tree must fit the tool's 64 MiB
# with the bundle); after it, `bash scripts/gpu/travel.sh restore`.
#
# Every step has its own timeout within the budget; a step that fails is recorded and the rest
# still run. First run on an H100 on 2026-11-27: bench/gpu/2026-11-27-h100/ and docs/src/performance.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$ROOT/gpu-out}
BUNDLE=${BUNDLE:-$ROOT/gpu-bundle/bundle.tar.xz}
BUDGET=${BUDGET_S:-400}
START=$(date +%s)
mkdir -p "$OUT"
RES=$OUT/results.jsonl LOG=$OUT/run.log ENV=$OUT/env.txt
: > "$RES"; : > "$LOG"; : > "$ENV"
left() { echo $((START + BUDGET - $(date +%s))); }
log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$LOG" >&2; }

W=$(mktemp -d "${TMPDIR:-/tmp}/pk-gpu.XXXXXX")
tar -C "$W" -xJf "$BUNDLE" || { log "cannot unpack $BUNDLE (run scripts/gpu/build.sh here and carry gpu-bundle)"; exit 1; }
BIN=$W/bundle
PK=$BIN/pathkernel
mkdir -p "$W/mnist" "$W/runs"
for f in "$BIN"/mnist/*.gz; do gunzip -c "$f" > "$W/mnist/$(basename "$f" .gz)"; done

# CUDA 13 user-space libraries (libcublas.so.13, libcublasLt.so.13): the torch venv's wheels,
# else a toolkit; libcuda.so.1 comes from the driver. CUDA_LIBDIR overrides.
if [ -z "${CUDA_LIBDIR:-}" ]; then
    CUBLAS=$(ls /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcublas.so.13 \
        /usr/local/cuda/lib64/libcublas.so.13 /usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13 2>/dev/null | head -1)
    [ -n "$CUBLAS" ] && CUDA_LIBDIR=$(dirname "$CUBLAS")
fi
[ -n "${CUDA_LIBDIR:-}" ] && export LD_LIBRARY_PATH=$CUDA_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
GPU=cuda
[ "$DRY" = 1 ] && GPU=cpu
# The node evaluation's kernels (scripts/gpu/ptx.py, in the bundle).
export PATHKERNEL_PTX=$BIN/epk.ptx
# ONLY="group ..." runs only those groups (a short rerun on a warm machine): tests lenet train-gpu
# dgemm compare epk epk-full ladder. MNIST 2 000 is trained whenever any group needs it. Default: all.
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  dry-run: $DRY  budget: ${BUDGET}s"
    echo "CUDA_LIBDIR: ${CUDA_LIBDIR:-<none found>}"
    ls "${CUDA_LIBDIR:-/nonexistent}" 2>/dev/null | grep -E 'cublas|nvrtc' | tr '\n' ' '; echo
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3
    echo "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    cat "$BIN/MANIFEST"
} >> "$ENV" 2>&1

# step NAME TIMEOUT CMD...: runs CMD within min(TIMEOUT, budget left); its JSON lines go to
# results.jsonl tagged {"step": NAME}, stderr to run.log. Returns the command's status.
step() {
    local name=$1 t=$2
    shift 2
    local l
    l=$(left)
    if [ "$l" -le 5 ]; then log "$name: skipped (budget spent)"; return 124; fi
    [ "$t" -gt "$l" ] && t=$l
    log "$name: $* (timeout ${t}s)"
    local s0=$(date +%s) rc
    timeout "$t" "$@" > "$W/step.out" 2> "$W/step.err"
    rc=$?
    grep '^{' "$W/step.out" | sed "s/^{/{\"step\":\"$name\",/" >> "$RES"
    grep -v '^{' "$W/step.out" | head -20 >> "$LOG"
    tail -20 "$W/step.err" >> "$LOG"
    log "$name: exit $rc after $(( $(date +%s) - s0 ))s"
    echo "{\"step\":\"$name\",\"name\":\"status\",\"exit\":$rc,\"seconds\":$(( $(date +%s) - s0 ))}" >> "$RES"
    return $rc
}

# An MNIST training configuration: PER_CLASS images of each digit, N_TEST test images, STEPS
# full-batch GD steps on the 784-128-10 ReLU MLP of data/studies/mnist-mlp.toml (lr 0.5).
mnist_cfg() {
    cat > "$W/mnist-$1.toml" <<EOF
[data]
kind = "mnist"
path = "$W/mnist"
per_class = $1
n_test = $2
normalize = false

[model]
kind = "mlp"
hidden = [128]
activation = "relu"
zero_last = true

[train]
optimizer = "gd"
lr = 0.5
steps = $3
seed = 0
EOF
    echo "$W/mnist-$1.toml"
}

if [ "$DRY" = 1 ]; then
    PC=20; NT=200; ST=20; CMP_STEPS=0:5; DG=512; LADDER="40 80"; FULL_STEPS=0:5
else
    PC=200; NT=2000; ST=200; CMP_STEPS=0:20; DG=8192; LADDER="500 1000 2000 5000"; FULL_STEPS=0:40
fi

# 1. GPU tests (the #[ignore]d ones; in the dry run they are listed, not run).
if ! want tests; then :
elif [ "$DRY" = 1 ]; then
    step tests-list 30 "$BIN/lib-tests" --list --ignored
    step tests-list-device 30 "$BIN/device-tests" --list --ignored
else
    step test-backend 60 "$BIN/lib-tests" --include-ignored --exact kernel::backend::tests::cuda_backend_matches_cpu kernel::backend::tests::cuda_probe_is_one_line
    step test-gram 90 "$BIN/device-tests" --ignored --exact cuda_gram_equals_cpu_gram
    step test-stacks 120 "$BIN/device-tests" --ignored --exact cuda_nodes_equal_cpu_nodes_on_stacks
fi

# 1b. LeNet-5 (bench/epk_engine.sh's run: 2 000 MNIST images, SGD batches of 100, lr 0.3, 100
#     steps), its exact EPK (auto:1e-12, diag) with the node evaluations on the GPU and on this
#     machine's CPU: LENET_IMAGES held-out images over LENET_STEPS, seconds, evaluations, the
#     machine's error, and the two Grams' difference. The training alone took 200 s on an H200
#     machine's 16 cores (2026-11-28): give this group its own call, `ONLY="lenet" BUDGET_S=560`
#     (about 200 s of training, ~75 + ~135 s for the two EPKs by that day's rate, two short splits).
# Defaults: 32 images over the whole path (the per-image rate that 500 images extrapolate from,
# without the late window's bias: its kinks are denser than the path's average), and the split
# of the time on a short late window. On the H200 (2026-11-28) 128 images over steps 90:100 took
# 29.4 s on the GPU and 53.8 s on the 16 cores.
if [ "$DRY" = 1 ]; then LP=20; LI=4; LS=0:10; LSS=8:10; LT=10; else LP=200; LI=${LENET_IMAGES:-32}; LS=${LENET_STEPS:-0:100}; LSS=${LENET_SPLIT_STEPS:-90:92}; LT=100; fi
if want lenet; then
    cat > "$W/lenet.toml" <<EOF
[data]
kind = "mnist"
path = "$W/mnist"
per_class = $LP
n_test = $LI
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
steps = $LT
seed = 0
EOF
    if step lenet-train ${LENET_TRAIN_S:-330} "$PK" train -q --config "$W/lenet.toml" --out "$W/runs/lenet"; then
        step lenet-gpu 200 "$PK" kernel -q --run "$W/runs/lenet" --kind epk --quadrature auto:1e-12 --layout diag --steps $LS --device $GPU --out "$W/lenet-gpu"
        step lenet-cpu 200 "$PK" kernel -q --run "$W/runs/lenet" --kind epk --quadrature auto:1e-12 --layout diag --steps $LS --device cpu --out "$W/lenet-cpu"
        step lenet-diff 30 python3 "$ROOT/scripts/gpu/gram_diff.py" "$W/lenet-gpu" "$W/lenet-cpu" --name lenet_diff
        # Where the time goes: the seconds of gradient evaluations and of the node search.
        step lenet-split-gpu 120 "$PK" bench --run "$W/runs/lenet" --contraction diag --steps $LSS --device $GPU
        step lenet-split-cpu 120 "$PK" bench --run "$W/runs/lenet" --contraction diag --steps $LSS --device cpu
    fi
fi

# 2. MNIST 2 000 (the run of reports/mnist-mlp), trained on the CPU.
R=$W/runs/mnist-$PC
step train 90 "$PK" train -q --config "$(mnist_cfg $PC $NT $ST)" --out "$R"

# The CUDA path must be refused in one line where there is none (the dry run checks this here).
if [ "$DRY" = 1 ]; then
    LD_LIBRARY_PATH= "$PK" bench --run "$R" --dgemm 64 --device cuda > /dev/null 2> "$W/refuse.err"
    rc=$?
    if [ "$rc" = 2 ] && [ "$(wc -l < "$W/refuse.err")" = 1 ]; then
        log "refusal: ok (exit 2, one line: $(cat "$W/refuse.err"))"
        echo '{"step":"refusal","name":"status","exit":0,"seconds":0}' >> "$RES"
    else
        log "refusal: FAILED (exit $rc): $(cat "$W/refuse.err")"
        echo "{\"step\":\"refusal\",\"name\":\"status\",\"exit\":$rc,\"seconds\":0}" >> "$RES"
    fi
fi

# 2b. Training on the GPU (dfdx's `cuda` build, bundle/dfdx-cuda/ from build.sh --with-dfdx-cuda):
#     the paper toy and MNIST 2 000 trained again there, trajectories against the CPU's step by
#     step (<= 1e-10 relative). The dry run trains the "GPU" runs with the CPU binary to check
#     the plumbing.
TRAIN_GPU=
if [ "$DRY" = 1 ]; then TRAIN_GPU="$PK train --device cpu"; fi
if [ "$DRY" = 0 ] && [ -x "$BIN/dfdx-cuda/run-gpu.sh" ]; then TRAIN_GPU="$BIN/dfdx-cuda/run-gpu.sh train --device cuda"; fi
# run-gpu.sh links the binary's two baked NVRTC include paths to the bundle's headers where
# they do not exist; a link left dangling by an earlier run (its bundle deleted) would make its
# `ln` fail, so such links go first.
if [ -n "$TRAIN_GPU" ] && [ "$DRY" = 0 ]; then
    for d in $(sed -n 's/^for d in \(.*\); do$/\1/p' "$BIN/dfdx-cuda/run-gpu.sh" | tr -d '"'); do
        if [ -L "$d" ] && [ ! -e "$d" ]; then rm -f "$d"; fi
    done
fi
if ! want train-gpu; then :
elif [ -n "$TRAIN_GPU" ]; then
    # shellcheck disable=SC2086
    step train-gpu 120 $TRAIN_GPU -q --config "$W/mnist-$PC.toml" --out "$R-gpu"
    step traj-mnist 60 python3 "$ROOT/scripts/gpu/traj_diff.py" "$R" "$R-gpu"
    rm -rf "$R-gpu"
    step train-toy 60 "$PK" train -q --config "$ROOT/data/studies/paper-toy.toml" --out "$W/runs/toy"
    # shellcheck disable=SC2086
    step train-toy-gpu 120 $TRAIN_GPU -q --config "$ROOT/data/studies/paper-toy.toml" --out "$W/runs/toy-gpu"
    step traj-toy 60 python3 "$ROOT/scripts/gpu/traj_diff.py" "$W/runs/toy" "$W/runs/toy-gpu"
    rm -rf "$W/runs/toy" "$W/runs/toy-gpu"
else
    log "training on the GPU: not in the bundle (scripts/gpu/build.sh --with-dfdx-cuda); skipped"
fi

# 3. The device and its DGEMM rate; the CPU's for reference.
want dgemm && step dgemm-gpu 60 "$PK" bench --run "$R" --dgemm $DG --device $GPU --repeat 5
want dgemm && step dgemm-cpu 60 "$PK" bench --run "$R" --dgemm 4096 --device cpu --repeat 3

# 4. CPU vs GPU Gram in one process (diag over 20 steps, full and trace over 3).
want compare && step compare-diag 90 "$PK" bench --run "$R" --contraction diag --compare --device $GPU --steps $CMP_STEPS
want compare && step compare-full 90 "$PK" bench --run "$R" --contraction full --compare --device $GPU --steps 0:3
want compare && step compare-trace 60 "$PK" bench --run "$R" --contraction trace --compare --device $GPU --steps 0:3

# 5. The whole EPK (all steps, diag) on the GPU and on this machine's CPU: total and contraction
#    seconds, the contraction's GFLOP/s against the device's GEMM rate, machine vs network.
want epk && step epk-gpu 150 "$PK" bench --run "$R" --contraction diag --device $GPU
want epk && step epk-cpu 150 "$PK" bench --run "$R" --contraction diag --device cpu

# 5b. The full layout (K x K blocks per pair: the products' inner dimension and the Gram are K
#     times larger) over the first FULL_STEPS steps, on the GPU and on the CPU.
want epk-full && step epk-full-gpu 150 "$PK" bench --run "$R" --contraction full --device $GPU --steps $FULL_STEPS
want epk-full && step epk-full-cpu 150 "$PK" bench --run "$R" --contraction full --device cpu --steps $FULL_STEPS

# 6. The largest MNIST size that fits what is left: train and time the EPK on the GPU, growing
#    while the last time scaled by (P·M)_next / (P·M)_last fits the budget left.
last_t=0 last_pm=0
want ladder || LADDER=
for pc in $LADDER; do
    nt=$((10 * pc)); [ $nt -gt 10000 ] && nt=10000
    pm=$((nt * 10 * pc))
    if [ "$last_pm" -gt 0 ]; then
        need=$(( last_t * pm / last_pm + 30 ))
        if [ "$need" -gt "$(left)" ]; then log "ladder: $pc per class needs ~${need}s, $(left)s left: stop"; break; fi
    fi
    RL=$W/runs/mnist-$pc
    step "train-$pc" 120 "$PK" train -q --config "$(mnist_cfg $pc $nt $ST)" --out "$RL" || break
    s0=$(date +%s)
    step "epk-gpu-$pc" 600 "$PK" bench --run "$RL" --contraction diag --device $GPU || break
    last_t=$(( $(date +%s) - s0 )); last_pm=$pm
    rm -rf "$RL"
done

# 7. The summary (python3 of the torch venv there; any python3 here).
python3 - "$RES" "$ENV" "$DRY" "${LI:-0}" "${LS:-}" > "$OUT/summary.md" <<'PY'
import json, sys
res, env, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
rows = [json.loads(l) for l in open(res) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["step"], []).append(r)
def one(step, name):
    return next((r for r in by.get(step, []) if r.get("name") == name), None)
def status(step):
    s = one(step, "status")
    return "not run" if s is None else ("ok" if s["exit"] == 0 else f"exit {s['exit']}") + f", {s['seconds']} s"
print("# GPU run (issue 38)" + (" — DRY RUN on a CPU machine: every 'GPU' figure is the CPU's" if dry else ""))
print()
print("```"); print(open(env).read().split("commit")[0].strip()); print("```"); print()
print("| step | status |"); print("|---|---|")
for s in by:
    print(f"| {s} | {status(s)} |")
print()
g, c = one("dgemm-gpu", "dgemm"), one("dgemm-cpu", "dgemm")
if g: print(f"- device: {g['describe']}; DGEMM {g['n']}²: **{g['gflops']:.0f} GFLOP/s** ({g['device']})")
if c: print(f"- CPU DGEMM {c['n']}² (faer): {c['gflops']:.0f} GFLOP/s")
for lay in ("diag", "full", "trace"):
    r = one(f"compare-{lay}", "device_compare")
    if r: print(f"- CPU vs {r['device']} Gram, {lay}, {r['points']}×{r['train']}×{r['outputs']}, {r['steps']} steps: max |Δ| / max |G| = **{r['rel_diff']:.2e}** (≤ 1e-12 required); machine vs network {r['cpu_machine_error']:.1e} (CPU) / {r['device_machine_error']:.1e} ({r['device']})")
for s in ("traj-mnist", "traj-toy"):
    r = one(s, "trajectory_diff")
    if r: print(f"- trajectory GPU vs CPU training, {s[5:]}: max over steps of max |Δw| / max |w| = **{r['max_rel']:.2e}** over {r['steps']} steps (tolerance {r['tol']:.0e}; largest |Δ| {r.get('max_abs', float('nan')):.1e} in {r['worst_tensor']} at {r['worst_step']}); worst single tensor against its own scale {r.get('tensor_max_rel', float('nan')):.2e} ({r.get('tensor_worst', '')}, scale {r.get('tensor_worst_scale', float('nan')):.1e})")
r = one("lenet-diff", "lenet_diff")
if r:
    sg, sc = one("lenet-gpu", "status"), one("lenet-cpu", "status")
    li, ls = int(sys.argv[4]), sys.argv[5]
    print(f"- LeNet-5 EPK ({'dry-run sizes' if dry else '2 000 images, 100 steps'}; diag, auto:1e-12; {li} held-out images, steps {ls}), nodes on the GPU vs this machine's CPU: Gram max |Δ| / max |G| = **{r['rel_diff']:.2e}** (≤ 1e-12 required); machine vs network {r['a_max_abs_error']:.1e} / {r['b_max_abs_error']:.1e}; evaluations per point and step {r['a_evaluations']:.1f} / {r['b_evaluations']:.1f}; wall {sg['seconds']} s / {sc['seconds']} s (**{sc['seconds'] / max(sg['seconds'], 1):.2f}×**)")
    if li > 0 and ls == "0:100":
        print(f"- at that rate, 500 held-out images over the whole path: GPU **{sg['seconds'] / li * 500 / 60:.1f} min**, CPU {sc['seconds'] / li * 500 / 60:.1f} min (goal ≤ 10 min on the GPU)")
print()
print("| EPK (auto:1e-12): step (device), layout | P × M × K, steps | total s | contraction s | contraction GFLOP/s | device GEMM GFLOP/s | fraction | gradients s (closed form: its rows) | node search s | rest s | machine vs network |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
def rest(r):
    """What is neither contraction nor node work (the closed form's rows, on one thread, are wall
    seconds; a stack's node work is thread-seconds, so there it is not subtracted)."""
    closed = r.get("node_search_seconds", 0) == 0
    return r["total_seconds"] - r["contraction_seconds"] - (r.get("gradient_seconds", 0) if closed else 0)
for s in by:
    r = one(s, "contraction")
    if r:
        print(f"| {s} ({r['device']}), {r.get('layout', 'diag')} | {r['points']} × {r['train']} × {r['outputs']}, {r['steps']} | {r['total_seconds']:.1f} | {r['contraction_seconds']:.1f} | {r['contraction_gflops']:.0f} | {r['gemm_gflops']:.0f} | {r['ratio']:.2g} | {r.get('gradient_seconds', 0):.1f} | {r.get('node_search_seconds', 0):.1f} | {rest(r):.1f} | {r['max_abs_error']:.1e} |")
gp, cp = one("epk-gpu", "contraction"), one("epk-cpu", "contraction")
if gp and cp:
    print(); print(f"GPU vs this machine's CPU, whole EPK: {cp['total_seconds'] / gp['total_seconds']:.2f}× ({gp['total_seconds']:.1f} s vs {cp['total_seconds']:.1f} s); contraction alone {cp['contraction_seconds'] / max(gp['contraction_seconds'], 1e-9):.2f}×.")
gp, cp = one("epk-full-gpu", "contraction"), one("epk-full-cpu", "contraction")
if gp and cp:
    print(); print(f"GPU vs this machine's CPU, full layout over {gp['steps']} steps: {cp['total_seconds'] / gp['total_seconds']:.2f}× ({gp['total_seconds']:.1f} s vs {cp['total_seconds']:.1f} s); contraction alone {cp['contraction_seconds'] / max(gp['contraction_seconds'], 1e-9):.2f}×.")
big = [one(s, "contraction") for s in by if s.startswith("epk-gpu-")]
big = [r for r in big if r]
if big:
    r = max(big, key=lambda r: r["points"] * r["train"])
    print(f"Largest MNIST size run on the GPU: {r['points']} × {r['train']} × {r['outputs']}, {r['steps']} steps, {r['total_seconds']:.1f} s.")
PY
cat "$OUT/summary.md"
log "done in $(( $(date +%s) - START ))s; results in $OUT"
rm -rf "$W"
