#!/usr/bin/env bash
# A real Slurm run of a tiled kernel job: starts a single-node cluster on localhost (munged,
# slurmctld, slurmd, all configured in a temporary folder), trains a tiny run with the built
# binary, plans a kernel job of 2 row blocks x 2 column blocks x 2 step ranges, submits it with
# `pathkernel tile slurm --submit` (a job array of 8 tasks plus the merge job that depends on it),
# waits for both, and checks the merged Gram against the one-process Gram (<= 1e-13 relative).
#
# Installs Debian's slurm-wlm and munge when missing (needs root). Bounded in time; stops the
# daemons it started (by their pid files, also on failure) and removes its folder. Prints one
# PASS or FAIL line last and exits non-zero on failure.
#
#   bash tests/slurm/run.sh                 # CARGO_TARGET_DIR as in .ci/run
#   PATHKERNEL_BIN=/path/to/pathkernel bash tests/slurm/run.sh
#   KEEP=1 bash tests/slurm/run.sh          # keep the temporary folder (logs) afterwards
#   PATHKERNEL_SKIP_SLURM=1 bash .ci/run     # skip this test (prints SKIP)
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
if [[ "${PATHKERNEL_SKIP_SLURM:-0}" == 1 ]]; then
    echo "SKIP: tests/slurm/run.sh (PATHKERNEL_SKIP_SLURM=1)"
    exit 0
fi

T0=$(date +%s.%N)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "[slurm $(since "$T0")s] $*"; }

WORK=""
PIDS=()
PIDFILES=()
RESULT="FAIL"
REASON="interrupted"

# Stops one daemon: TERM, up to 15 s, then KILL. Only pids this script started.
stop_pid() {
    local pid=$1 name=$2 i
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || { log "stopped $name (pid $pid)"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    log "killed $name (pid $pid)"
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "$WORK" && -f "$WORK/slurm.conf" ]] && command -v scancel >/dev/null; then
        # Jobs first (their slurmstepd processes end with them), then the daemons.
        if [[ -n "$(squeue -h -o %i 2>/dev/null)" ]]; then
            log "cancelling the remaining jobs"
            timeout 10 scancel --quiet --user=root 2>/dev/null
            for _ in $(seq 1 100); do
                [[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]] && break
                sleep 0.2
            done
        fi
    fi
    # Daemons in reverse order of their start, by pid file, then by the pid recorded at start.
    local i
    for ((i = ${#PIDFILES[@]} - 1; i >= 0; i--)); do
        local f=${PIDFILES[$i]%%:*} name=${PIDFILES[$i]#*:} pid
        pid=$(cat "$f" 2>/dev/null || true)
        [[ -n "$pid" ]] && stop_pid "$pid" "$name"
        stop_pid "${PIDS[$i]}" "$name"
    done
    if [[ "$RESULT" != PASS && -n "$WORK" && -d "$WORK" ]]; then
        for f in "$WORK"/log/*.log "$WORK"/tiles/slurm/logs/*.out; do
            [[ -f "$f" ]] || continue
            echo "---- tail $f"
            tail -n 15 "$f"
        done
    fi
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if [[ "${KEEP:-0}" == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
    fi
    if [[ "$RESULT" == PASS ]]; then
        echo "PASS: tests/slurm/run.sh: $REASON"
        exit 0
    fi
    echo "FAIL: tests/slurm/run.sh: $REASON"
    exit $((rc == 0 ? 1 : rc))
}
trap cleanup EXIT
trap 'REASON="interrupted by a signal"; exit 130' INT TERM

fail() {
    REASON="$*"
    exit 1
}

# ---- the binary
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/pathkernel-target}"
BIN="${PATHKERNEL_BIN:-$CARGO_TARGET_DIR/release/pathkernel}"
if [[ ! -x "$BIN" ]]; then
    log "building $BIN"
    timeout 3600 cargo build --release --bin pathkernel >/dev/null || fail "cargo build --release failed"
fi
[[ -x "$BIN" ]] || fail "no binary at $BIN"
BIN=$(readlink -f "$BIN")
log "binary $BIN"

# ---- Slurm and munge
INSTALL_S=0
NEED=(slurmctld slurmd sbatch squeue scontrol sinfo scancel munged)
missing() {
    local c
    for c in "${NEED[@]}"; do command -v "$c" >/dev/null || { echo "$c"; return; }; done
}
if [[ -n "$(missing)" ]]; then
    [[ $(id -u) == 0 ]] || fail "slurm-wlm/munge are not installed and installing them needs root"
    log "installing slurm-wlm and munge"
    t=$(now)
    POLICY_CREATED=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        # Keep the packages' init scripts from starting daemons we would not own.
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && POLICY_CREATED=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    ok=1
    timeout 600 apt-get update -qq >/tmp/pk-slurm-apt.log 2>&1 || ok=0
    [[ $ok == 1 ]] && { timeout 900 apt-get install -y -qq --no-install-recommends slurm-wlm munge >>/tmp/pk-slurm-apt.log 2>&1 || ok=0; }
    [[ $POLICY_CREATED == 1 ]] && rm -f /usr/sbin/policy-rc.d
    [[ $ok == 1 ]] || { tail -n 20 /tmp/pk-slurm-apt.log; fail "apt-get install slurm-wlm munge failed (log /tmp/pk-slurm-apt.log)"; }
    INSTALL_S=$(since "$t")
    rm -f /tmp/pk-slurm-apt.log
    log "installed in ${INSTALL_S} s"
fi
[[ -z "$(missing)" ]] || fail "$(missing) not found after installing slurm-wlm and munge"
[[ $(id -u) == 0 ]] || fail "the test cluster runs its daemons as root (SlurmUser=root)"

WORK=$(mktemp -d /tmp/pk-slurm.XXXXXX) || fail "mktemp"
chmod 700 "$WORK"
mkdir -p "$WORK"/{munge,state,spool,pids,log} && chmod 700 "$WORK/munge"
HOST=$(hostname -s)
NCPU=$(nproc)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
CTL_PORT=$(free_port) && D_PORT=$(free_port) || fail "no free port"
[[ "$CTL_PORT" != "$D_PORT" ]] || D_PORT=$((CTL_PORT + 1))

# ---- munged with its own key and socket
KEY="$WORK/munge/munge.key"
if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$KEY" --force >/dev/null 2>&1 || fail "mungekey failed"
elif [[ -x /usr/sbin/create-munge-key ]]; then
    dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none || fail "no munge key"
fi
[[ -s "$KEY" ]] || dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none
chmod 600 "$KEY"
SOCK="$WORK/munge/munge.socket"
munged --foreground --force --key-file="$KEY" --socket="$SOCK" --pid-file="$WORK/pids/munged.pid" \
    --log-file="$WORK/log/munged.log" --seed-file="$WORK/munge/munged.seed" >"$WORK/log/munged.out" 2>&1 &
PIDS+=($!)
PIDFILES+=("$WORK/pids/munged.pid:munged")
for _ in $(seq 1 100); do [[ -S "$SOCK" ]] && break; sleep 0.1; done
[[ -S "$SOCK" ]] || fail "munged did not start ($(tail -n 3 "$WORK/log/munged.out" "$WORK/log/munged.log" 2>/dev/null | tr '\n' ' '))"

# ---- slurm.conf in the temporary folder
cat >"$WORK/slurm.conf" <<EOF
ClusterName=pktest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTL_PORT
SlurmdPort=$D_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/pids/slurmctld.pid
SlurmdPidFile=$WORK/pids/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU State=UNKNOWN
PartitionName=pk Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$WORK/slurm.conf"

t_daemons=$(now)
slurmctld -D -c -f "$SLURM_CONF" >"$WORK/log/slurmctld.out" 2>&1 &
PIDS+=($!)
PIDFILES+=("$WORK/pids/slurmctld.pid:slurmctld")
slurmd -D -f "$SLURM_CONF" -N "$HOST" >"$WORK/log/slurmd.out" 2>&1 &
PIDS+=($!)
PIDFILES+=("$WORK/pids/slurmd.pid:slurmd")
FIRST_SINFO_S=""
for _ in $(seq 1 300); do
    if [[ -z "$FIRST_SINFO_S" ]] && timeout 5 sinfo -h >/dev/null 2>&1; then
        FIRST_SINFO_S=$(since "$t_daemons")
        log "sinfo answers after ${FIRST_SINFO_S} s"
    fi
    state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | head -n 1)
    [[ "$state" == idle ]] && break
    for i in 1 2; do kill -0 "${PIDS[$i]}" 2>/dev/null || fail "${PIDFILES[$i]#*:} exited ($(tail -n 3 "$WORK/log/$(basename "${PIDFILES[$i]%%:*}" .pid).out" | tr '\n' ' '))"; done
    sleep 0.2
done
[[ -n "$FIRST_SINFO_S" ]] || fail "sinfo did not answer within 60 s"
[[ "$state" == idle ]] || fail "node $HOST is '$state', not idle, after 60 s"
NODE_IDLE_S=$(since "$t_daemons")
log "node $HOST idle after ${NODE_IDLE_S} s ($NCPU CPUs)"

# ---- the kernel job
cat >"$WORK/toy.toml" <<'EOF'
[data]
kind = "gaussian-mixture"
dim = 2
per_class = 20
n_test = 12
seed = 3

[model]
kind = "mlp"
hidden = [8]
activation = "relu"

[train]
lr = 0.5
steps = 10
seed = 7
EOF
"$BIN" train -q --config "$WORK/toy.toml" --out "$WORK/run" >/dev/null || fail "pathkernel train failed"
"$BIN" kernel -q --run "$WORK/run" --kind epk --out "$WORK/one" >/dev/null || fail "one-process pathkernel kernel failed"
"$BIN" kernel -q --run "$WORK/run" --kind epk --tiles 2x2x2 --out "$WORK/tiles" >"$WORK/plan.out" || fail "planning failed"
grep -q "8 tiles = 2 row blocks .* x 2 column blocks .* x 2 step ranges" "$WORK/plan.out" || fail "unexpected plan: $(head -n 1 "$WORK/plan.out")"
t_submit=$(now)
"$BIN" tile slurm "$WORK/tiles" --submit --max-parallel 2 --time 10:00 >"$WORK/submit.out" 2>&1 || fail "tile slurm --submit: $(tail -n 1 "$WORK/submit.out")"
cat "$WORK/submit.out"
grep -q -- "--array=0-7%2" "$WORK/submit.out" || fail "the array is not 0-7%2"
ARRAY=$(sed -n 's/.*submitted array job \([0-9]*\) .*/\1/p' "$WORK/submit.out")
MERGE=$(sed -n 's/.* merge job \([0-9]*\) .*/\1/p' "$WORK/submit.out")
[[ -n "$ARRAY" && -n "$MERGE" ]] || fail "no job ids in: $(cat "$WORK/submit.out")"

# ---- wait for both jobs (bounded)
ARRAY_S=""
for _ in $(seq 1 1500); do
    q=$(timeout 5 squeue -h -o "%i %T" 2>/dev/null)
    if [[ -z "$ARRAY_S" ]] && ! grep -q "^${ARRAY}_" <<<"$q" && ! grep -q "^${ARRAY} " <<<"$q"; then
        ARRAY_S=$(since "$t_submit")
        log "array job $ARRAY left the queue after ${ARRAY_S} s"
    fi
    [[ -z "$q" ]] && break
    sleep 0.2
done
[[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]] || fail "jobs still queued after 300 s: $(squeue -h -o '%i %T %r' | tr '\n' ';')"
TOTAL_JOB_S=$(since "$t_submit")

# ---- every array task and the merge completed
states=$(timeout 10 scontrol -o show job "$ARRAY" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | sort | uniq -c | tr -s ' ' | tr '\n' ';')
tasks_done=$(timeout 10 scontrol -o show job "$ARRAY" 2>/dev/null | grep -c 'JobState=COMPLETED')
[[ "$tasks_done" == 8 ]] || fail "array job $ARRAY: $tasks_done of 8 tasks completed ($states)"
scontrol -o show job "$MERGE" 2>/dev/null | grep -q 'JobState=COMPLETED' || fail "merge job $MERGE: $(scontrol -o show job "$MERGE" | grep -o 'JobState=[A-Z_]*')"
for i in 0 1 2 3 4 5 6 7; do
    grep -q "tile $i: computed" "$WORK/tiles/slurm/logs/tile-$i.out" || fail "tile $i's log: $(cat "$WORK/tiles/slurm/logs/tile-$i.out")"
done
[[ -f "$WORK/tiles/merged/gram.safetensors" ]] || fail "no merged Gram"

# ---- the merged Gram against the one-process Gram
"$BIN" tile compare "$WORK/tiles/merged" "$WORK/one" --tol 1e-13 >"$WORK/compare.out" 2>&1 || fail "$(tail -n 1 "$WORK/compare.out")"
MAXREL=$(sed -n 's/^max relative difference \([^ ]*\).*/\1/p' "$WORK/compare.out")
GRAM=$(grep 'gram.safetensors:gram ' "$WORK/compare.out" | sed 's/  */ /g')
log "compare: $GRAM"

RESULT=PASS
REASON="8 tiles (2 row blocks x 2 column blocks x 2 step ranges) as a Slurm array + merge job on $HOST; merged vs one-process max relative difference $MAXREL (<= 1e-13); install ${INSTALL_S} s, first sinfo ${FIRST_SINFO_S} s, node idle ${NODE_IDLE_S} s, array job ${ARRAY_S} s, array + merge ${TOTAL_JOB_S} s, total $(since "$T0") s"
exit 0
