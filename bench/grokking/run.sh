#!/bin/bash
# One sweep point of bench/grokking/sweep.md: bench/grokking/run.sh NAME [grokking_torch.py options]
# (one torch thread, at most 300 s of training, held-out accuracy every 10 epochs, stop once it
# has been >= 0.99 at 50 consecutive evaluations (500 epochs); raw/NAME.json keeps every 10th epoch).
set -e
cd "$(dirname "$0")/../.."
name=$1; shift
PY=${PYTHON:-python3}
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $PY scripts/grokking_torch.py --threads 1 --max-seconds 300 --eval-every 10 \
  --stop-when-generalised 50 --history-every 10 --print-every 2000 --epochs 200000 --json bench/grokking/raw/$name.json "$@" \
  > bench/grokking/raw/$name.log 2>&1
tail -1 bench/grokking/raw/$name.log
