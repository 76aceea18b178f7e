#!/usr/bin/env bash
# The x86-64-v3 build's CPU guard (src/main.rs, .cargo/config.toml): on a CPU without AVX2 and
# FMA the release binary prints one line and exits with status 2 instead of dying of SIGILL; on
# one with them it runs. qemu's user-mode emulator stands in for the old CPUs (installed with apt
# when missing). Only on x86-64 hosts.
#
#   bash scripts/check_cpu_guard.sh      (after cargo build --release; CARGO_TARGET_DIR as for it)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(uname -m)" = x86_64 ] || { echo "check_cpu_guard: not an x86-64 host, nothing to check"; exit 0; }
BIN="${CARGO_TARGET_DIR:-target}/release/pathkernel"
[ -x "$BIN" ] || { echo "check_cpu_guard: $BIN missing (cargo build --release)" >&2; exit 1; }
if ! command -v qemu-x86_64 >/dev/null; then
    # A fresh machine may have no package lists yet: update once when the first try fails.
    { apt-get install -y -q qemu-user || { apt-get update -q && apt-get install -y -q qemu-user; }; } >/dev/null 2>&1 \
        || { echo "check_cpu_guard: qemu-user could not be installed" >&2; exit 1; }
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
fail=0
for cpu in Nehalem SandyBridge; do
    rc=0
    qemu-x86_64 -cpu "$cpu" "$BIN" --version >/dev/null 2>"$tmp" || rc=$?
    err=$(grep -v '^qemu-x86_64: warning' "$tmp" || true)
    if [ "$rc" != 2 ] || [ "$(printf '%s\n' "$err" | wc -l)" != 1 ] || [[ "$err" != "error: this binary was built for x86-64-v3"* ]]; then
        echo "check_cpu_guard: on $cpu: status $rc, stderr: $err" >&2
        fail=1
    fi
done
out=$(qemu-x86_64 -cpu Haswell "$BIN" --version 2>/dev/null) || { echo "check_cpu_guard: on Haswell: status $?" >&2; fail=1; }
[ "$fail" = 0 ] && echo "check_cpu_guard: one line and status 2 on Nehalem and SandyBridge; runs on Haswell ($out)"
exit "$fail"
