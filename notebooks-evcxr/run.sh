#!/usr/bin/env bash
# Execute the evcxr notebooks headless (not part of CI: installing evcxr_jupyter takes 12+ minutes
# and each notebook's first `:dep pathkernel` compiles the crate with polars and dfdx).
#
#   bash notebooks-evcxr/run.sh
#
# Needs: cargo, python3 with pip. Writes executed copies as notebooks-evcxr/executed/*.ipynb.
set -euo pipefail
cd "$(dirname "$0")"
command -v evcxr_jupyter >/dev/null || cargo install --locked evcxr_jupyter
python3 -m pip install --quiet jupyter nbconvert
evcxr_jupyter --install
mkdir -p executed
for nb in quickstart uncertainty attribution; do
  jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=3600 \
    --ExecutePreprocessor.kernel_name=rust --output-dir executed "$nb.ipynb"
done
echo "executed notebooks in $(pwd)/executed"
