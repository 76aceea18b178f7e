#!/usr/bin/env bash
# A PyTorch AdamW loop on real MNIST, recorded in float64 and again in float32, imported, and its
# exact path kernel: 784-32-10 ReLU MLP, 500 training images, 50 AdamW steps (lr 0.01, weight
# decay 0.05, cosine schedule) on mini-batches of 50, recorded by scripts/record_torch_trajectory.py;
# `pathkernel import` replays AdamW from the gradients it recomputes in f64 and checks every
# update; the EPK (preconditioned form) on 20 test images with auto:1e-12 quadrature; the float32
# run's rounding is the kernel's residual term (exactness.json: rounding_term_max_abs).
#
#   PYTHON=/path/to/python-with-torch MNIST=data/mnist bash scripts/torch_mnist_optim_epk.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python3}"
pk="${PATHKERNEL:-target/release/pathkernel}"
mnist="${MNIST:-data/mnist}"
[ -e "$mnist/train-images.idx3-ubyte" ] || bash data/fetch-mnist.sh
for prec in float64 float32; do
  flag=""; [ "$prec" = float32 ] && flag="--float32"
  rm -rf "runs/mnist-adamw-$prec-rec"
  "$py" scripts/record_torch_trajectory.py "runs/mnist-adamw-$prec-rec" --mnist "$mnist" --n-train 500 --n-test 20 \
    --hidden 32 --steps 50 --lr 0.01 --optim adamw --sgd 50 --cosine --seed 0 $flag
  "$pk" import --from torch "runs/mnist-adamw-$prec-rec" --out "runs/mnist-adamw-$prec" --force
  "$pk" kernel --run "runs/mnist-adamw-$prec" --kind epk --quadrature auto:1e-12 --points test --out "runs/mnist-adamw-$prec-epk" --force
done
