#!/usr/bin/env bash
# Execute the evcxr notebooks headless, each in a fresh Rust kernel, and report which failed
# (not part of CI: installing evcxr_jupyter compiles it, and each notebook's first
# `:dep pathkernel` cell compiles the crate with polars and dfdx).
#
#   bash notebooks-evcxr/run.sh                      # every notebook here
#   bash notebooks-evcxr/run.sh quickstart.ipynb     # some of them
#
# Needs cargo and python3 with pip; installs evcxr_jupyter 0.22.0, jupyter and nbconvert when
# missing. Executed copies (with their outputs, errors included) go to
# notebooks-evcxr/executed/NAME.ipynb; a notebook that ran without an error cell replaces NAME.ipynb
# (the committed notebooks carry their outputs). Every notebook runs even when an earlier one
# fails; the script prints the wall time of each, of its first cell (`:dep pathkernel`) and of the
# others, and exits 1 when any failed. mnist.ipynb needs `bash data/fetch-mnist.sh` first.
#
# evcxr's build cache is on: evcxr reads `init.evcxr` from its config directory, which this
# script points at notebooks-evcxr/evcxr-config/ (EVCXR_CONFIG_DIR) whose init.evcxr holds
# `:cache 6000` (MiB). The cache keeps compiled dependencies between kernel sessions, so only
# the first `:dep pathkernel` compiles polars and dfdx; later runs reuse them.
set -uo pipefail
cd "$(dirname "$0")"

command -v evcxr_jupyter >/dev/null || cargo install --locked evcxr_jupyter --version 0.22.0 || exit 1
python3 -c 'import nbconvert, jupyter_client' 2>/dev/null || python3 -m pip install --quiet jupyter nbconvert || exit 1
evcxr_jupyter --install >/dev/null || exit 1
export EVCXR_CONFIG_DIR="$PWD/evcxr-config"
# evcxr builds each kernel's code as a crate in a temporary folder of its own, so every notebook
# compiles pathkernel again (its dependencies come from evcxr's cache). One persistent folder for
# all kernels keeps the compiled crate: only the first notebook after a change of the library
# compiles it. (Not under ~/.cache: evcxr's kernel fails to load its code from there.)
export EVCXR_TMPDIR="${EVCXR_TMPDIR:-${TMPDIR:-/tmp}/pathkernel-evcxr}"
mkdir -p "$EVCXR_TMPDIR"

if [ "$#" -gt 0 ]; then
  notebooks=("$@")
else
  notebooks=(*.ipynb)
fi
mkdir -p executed
failed=()
report=()
for nb in "${notebooks[@]}"; do
  name=$(basename "$nb" .ipynb)
  echo "== $name" >&2
  start=$EPOCHREALTIME
  # --allow-errors: keep the outputs of a failing notebook; failure is read from them below.
  if jupyter nbconvert --to notebook --execute --allow-errors \
      --ExecutePreprocessor.timeout=3600 --ExecutePreprocessor.kernel_name=rust \
      --output-dir executed --output "$name" "$nb" \
    && python3 - "executed/$name.ipynb" <<'EOF'
import json, sys
nb = json.load(open(sys.argv[1]))
bad = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
       and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
for i in bad:
    err = next(o for o in nb["cells"][i]["outputs"] if o.get("output_type") == "error")
    print(f"  cell {i}: {err.get('ename', '')}: {err.get('evalue', '')}"[:2000], file=sys.stderr)
# The first cell (`:dep pathkernel`, compiling the crate) and the rest, from nbclient's timings.
from datetime import datetime
def secs(c):
    t = c.get("metadata", {}).get("execution", {})
    a, b = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (a and b):
        return float("nan")
    f = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))
    return (f(b) - f(a)).total_seconds()
code = [c for c in nb["cells"] if c["cell_type"] == "code"]
first, rest = secs(code[0]), sum(secs(c) for c in code[1:])
open(sys.argv[1] + ".cells", "w").write(f"{first:.1f} {rest:.1f}")
sys.exit(1 if bad else 0)
EOF
  then
    status=ok
    # The notebook in the repository carries the outputs of its last successful run.
    cp "executed/$name.ipynb" "$nb"
  else
    status=FAILED
    failed+=("$name")
  fi
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  cells=$(cat "executed/$name.ipynb.cells" 2>/dev/null || echo "? ?")
  report+=("$(printf '%-14s %-6s %8s s   first cell %6s s, other cells %6s s' "$name" "$status" "$seconds" $cells)")
  echo "${report[-1]}" >&2
done

echo
echo "notebook       status   wall time   (first cell: :dep pathkernel)"
printf '%s\n' "${report[@]}"
echo "executed notebooks in $(pwd)/executed"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
