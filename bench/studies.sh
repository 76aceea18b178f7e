#!/usr/bin/env bash
# Committed studies timed from an empty cache, for one or more pathkernel binaries in one run
# (the machine's load moves every figure: compare within a run): wall time, CPU seconds, the
# system (page-fault) share, peak RSS, beside faer's DGEMM rate right after each.
#
#   BINS="before:/tmp/pathkernel-old after:target/release/pathkernel" bash bench/studies.sh
#
# Environment: STUDIES (default "mnist-cnn mnist-uncertainty-small", names under data/studies/;
# both need bash data/fetch-mnist.sh), BINS (default this checkout's release binary), OUT
# (default bench/out/studies: each study's report and cache per binary), CARGO_TARGET_DIR.
# Each binary runs every study, in the order given; then the next binary.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
BINS="${BINS:-this:$TARGET/release/pathkernel}"
STUDIES="${STUDIES:-mnist-cnn mnist-uncertainty-small}"
OUT="${OUT:-bench/out/studies}"
first_bin="${BINS%% *}"
first_bin="${first_bin#*:}"
mkdir -p "$OUT"
# faer's DGEMM rate on a 2048² product (the bench opens the study's trained run only to have one).
. bench/lib.sh
gemm() { gemm_rate "$first_bin" "$1"; }

echo "| study | binary | wall s | CPU s | system share | peak RSS GB | faer DGEMM GFLOP/s after |"
echo "|---|---|---|---|---|---|---|"
for entry in $BINS; do
    name="${entry%%:*}"
    bin="${entry#*:}"
    for study in $STUDIES; do
        d="$OUT/$study-$name"
        rm -rf "$d"
        mkdir -p "$d"
        /usr/bin/time -v -o "$d/time" "$bin" study run -q "data/studies/$study.toml" --out "$d/report" --cache "$d/cache" > "$d/stdout" 2> "$d/stderr" || { cat "$d/stderr" >&2; exit 1; }
        g=$(gemm "$d/cache/run")
        PYTHONPATH=bench python3 - "$d/time" "$study" "$name" "$g" <<'PY'
import sys
from timev import read
path, study, name, g = sys.argv[1:]
t = read(path)
secs, user, system = t["wall_s"], t["user_s"], t["system_s"]
rss = t["max_rss_kb"] / 1e6
print(f"| {study} | {name} | {secs:.1f} | {user + system:.0f} | {system / (user + system):.3f} | {rss:.2f} | {float(g):.0f} |")
PY
    done
done
