#!/usr/bin/env bash
# Build, on this machine (no GPU, no CUDA toolkit), everything scripts/gpu/run.sh needs on a GPU
# machine that has no Rust toolchain and no registry, and pack it into gpu-bundle/bundle.tar.xz
# (git-ignored; the device tool's `carry` takes it there):
#
#   bundle/pathkernel    the ordinary release binary, stripped. Its cuBLAS contraction
#                        (`--device cuda`) dlopens libcuda.so.1 and libcublas.so.13 at first use,
#                        so it needs no CUDA at build time and starts without one.
#   bundle/lib-tests     the library's unit tests (stripped): run.sh runs the #[ignore]d
#                        kernel::backend::tests::cuda_backend_matches_cpu there.
#   bundle/device-tests  tests/device.rs (stripped): run.sh runs the #[ignore]d cuda_gram_equals_cpu_gram.
#   bundle/epk.ptx       the node evaluation's kernels (kernels/epk.cu) compiled by NVRTC 13.0 to
#                        PTX 9.0 for sm_90 (scripts/gpu/ptx.py); run.sh points PATHKERNEL_PTX at it.
#   bundle/mnist/*.gz    the four MNIST IDX files (data/mnist), gzipped.
#   bundle/MANIFEST      commit, build date, sizes, sha256 of every file.
#
# Not built by default: the dfdx `cuda` training binary (`--features cuda`, 10-20 min on 2 cores,
# needs the CUDA 13.0 wheels, a stub libcuda and a stand-in nvidia-smi); `--with-dfdx-cuda` runs
# ../shared/notes/gpu-build.sh's recipe for it (see docs/src/performance.md, "On a GPU").
#
# Usage:  bash scripts/gpu/build.sh            (CARGO_TARGET_DIR as for any build)
# Output: gpu-bundle/bundle.tar.xz (refused above 40 MB; xz -9 with its 64 MiB window stores the
#         three binaries, which share most of their code, nearly as one: 25 MB where gzip gives
#         45), gpu-bundle/build.log (times, sizes)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
OUTDIR=$ROOT/gpu-bundle
B=$OUTDIR/bundle
MAX_BYTES=40000000
WITH_DFDX_CUDA=0
[ "${1:-}" = "--with-dfdx-cuda" ] && WITH_DFDX_CUDA=1
rm -rf "$B"
mkdir -p "$B/mnist"
LOG=$OUTDIR/build.log
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
t0=$(date +%s)

# 1. The binary and the two test binaries (one cargo invocation each; `nice`: shared machine).
#    cargo prints "Executable <test> (<path>)" for every test binary it builds.
say "== cargo build --release --locked --bin pathkernel"
nice cargo build --release --locked --bin pathkernel 2>&1 | tail -1 | tee -a "$LOG"
say "== cargo test --release --locked --no-run --lib --test device"
EXES=$(nice cargo test --release --locked --no-run --lib --test device 2>&1 | tee -a "$LOG" | sed -n 's/.*Executable \(.*\) (\(.*\))$/\1|\2/p')
LIB_TESTS=$(echo "$EXES" | grep '^unittests src/lib.rs|' | cut -d'|' -f2)
DEV_TESTS=$(echo "$EXES" | grep '^tests/device.rs|' | cut -d'|' -f2)
[ -x "$LIB_TESTS" ] && [ -x "$DEV_TESTS" ] || { say "build.sh: error: test binaries not found in: $EXES"; exit 1; }
t1=$(date +%s)
say "cargo: $((t1 - t0)) s"

cp "$CARGO_TARGET_DIR/release/pathkernel" "$B/pathkernel"
cp "$LIB_TESTS" "$B/lib-tests"
cp "$DEV_TESTS" "$B/device-tests"
strip "$B/pathkernel" "$B/lib-tests" "$B/device-tests"

# 2. MNIST (the raw IDX files; data/fetch-mnist.sh fetches them where they are missing).
for f in train-images.idx3-ubyte train-labels.idx1-ubyte t10k-images.idx3-ubyte t10k-labels.idx1-ubyte; do
    [ -f "data/mnist/$f" ] || { say "build.sh: error: data/mnist/$f missing (bash data/fetch-mnist.sh)"; exit 1; }
    gzip -c -6 "data/mnist/$f" > "$B/mnist/$f.gz"
done

# 2b. The device kernels as PTX (NVRTC 13.0 from its wheel; checked against the declarations).
say "== python3 scripts/gpu/ptx.py --out bundle/epk.ptx"
python3 scripts/gpu/ptx.py --out "$B/epk.ptx" 2>&1 | tee -a "$LOG"

# 3. Optionally the dfdx `cuda` training binary, by the recipe in ../shared/notes/gpu-build.sh.
if [ "$WITH_DFDX_CUDA" = 1 ]; then
    NOTES=$ROOT/../shared/notes/gpu-build.sh
    [ -f "$NOTES" ] || NOTES=/work/shared/notes/gpu-build.sh
    say "== dfdx cuda build: G=${G:-$HOME/gpu-build} bash $NOTES $ROOT"
    bash "$NOTES" "$ROOT" 2>&1 | tail -5 | tee -a "$LOG"
    G=${G:-$HOME/gpu-build}
    mkdir -p "$B/dfdx-cuda"
    cp -r "$G/bundle/." "$B/dfdx-cuda/"
fi

# 4. What the binary needs and that it starts here; then the manifest and the archive.
say "== checks"
readelf -d "$B/pathkernel" | grep NEEDED | tee -a "$LOG"
if readelf -d "$B/pathkernel" | grep -q 'libcu'; then say "build.sh: error: the plain binary links a CUDA library"; exit 1; fi
"$B/pathkernel" --version | tee -a "$LOG"
{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock || echo ' (+ uncommitted changes)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
    (cd "$B" && find . -type f ! -name MANIFEST | sort | xargs sha256sum | while read -r h f; do echo "$(stat -c %s "$f") $h $f"; done)
} > "$B/MANIFEST"
rm -f "$OUTDIR"/bundle.tar.*
tar -C "$OUTDIR" -cf - bundle | xz -9 -T1 > "$OUTDIR/bundle.tar.xz"
SIZE=$(stat -c %s "$OUTDIR/bundle.tar.xz")
say "== sizes (bytes)"
(cd "$B" && find . -type f | sort | xargs stat -c '%s %n') | tee -a "$LOG"
say "bundle.tar.xz $SIZE"
say "total $(( $(date +%s) - t0 )) s"
rm -rf "$B"
if [ "$SIZE" -gt "$MAX_BYTES" ]; then
    say "build.sh: error: the bundle is $SIZE bytes, over $MAX_BYTES"
    exit 1
fi
