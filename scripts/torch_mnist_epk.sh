#!/usr/bin/env bash
# A PyTorch training loop on real MNIST, recorded, imported and turned into its exact path kernel:
# 784-128-10 ReLU MLP, 2 000 training images, 200 full-batch GD steps (lr 0.5) recorded by
# scripts/record_torch_trajectory.py in float64; `pathkernel import` checks every update against
# the gradient it recomputes; the EPK on 100 test images with auto:1e-12 quadrature; the exported
# last state compared with pathkernel's network values by scripts/torch_model.py.
#
#   PYTHON=/path/to/python-with-torch bash scripts/torch_mnist_epk.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python3}"
pk="${PATHKERNEL:-target/release/pathkernel}"
bash data/fetch-mnist.sh
rm -rf runs/mnist-torch-rec
"$py" scripts/record_torch_trajectory.py runs/mnist-torch-rec --mnist data/mnist --n-train 2000 --n-test 100 \
  --hidden 128 --steps 200 --lr 0.5 --seed 0
"$pk" import --from torch runs/mnist-torch-rec --out runs/mnist-torch --force
"$pk" kernel --run runs/mnist-torch --kind epk --quadrature auto:1e-12 --points test --out runs/mnist-torch-epk --force -q
"$pk" export --run runs/mnist-torch --format torch --out runs/mnist-torch.safetensors --force
"$py" scripts/torch_model.py runs/mnist-torch.safetensors runs/mnist-torch-epk
