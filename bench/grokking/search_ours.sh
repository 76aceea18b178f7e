#!/bin/bash
# One point of the search in bench/grokking/search-ours.md: our trainer on the grokking study's
# configuration (data/studies/grokking.toml) with data seed D, training seed S, N steps and weight decay WD; prints the steps
# at which held-out accuracy first reached 0.5 / 0.9 / 0.99, its final and largest value; the
# weight states (0.36 MB each) are deleted after. Usage: bash bench/grokking/search_ours.sh D S N WD
# (environment: BIN, the pathkernel binary; OUT, a scratch directory; PY, a python with pyarrow).
D=$1; S=$2; N=$3; WD=$4
BIN=${BIN:-target/release/pathkernel}
OUT=${OUT:-/tmp/grok-search}
mkdir -p "$OUT"
out=$OUT/d$D-s$S-wd$WD
rm -rf $out
nice -n 19 $BIN train -q --config "$(dirname "$0")/../../data/studies/grokking.toml" --set data.seed=$D --set train.seed=$S --set train.steps=$N --set train.weight_decay=$WD --out $out > $out.log 2>&1
${PY:-python3} - $out "d$D s$S wd$WD" <<'PY'
import sys, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1] + "/train_log.parquet").to_pydict()
acc, tr, steps = t["test_accuracy"], t["accuracy"], t["step"]
def first(v, th):
    for s, a in zip(steps, v):
        if a is not None and a >= th: return s
    return None
print(f"{sys.argv[2]}: train>=0.99 at {first(tr,0.99)}; held-out >=0.5 at {first(acc,0.5)}, >=0.9 at {first(acc,0.9)}, >=0.99 at {first(acc,0.99)}; final {acc[-1]:.3f} at {steps[-1]}; max {max(acc):.3f} at {steps[acc.index(max(acc))]}")
PY
rm -rf $out/trajectory
