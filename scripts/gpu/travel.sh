#!/usr/bin/env bash
# What the device tool sends to a GPU machine: the working tree (tracked files as they are on
# disk, untracked files git does not ignore) plus the carried paths, at most 64 MiB in all. The
# tracked tree alone is about 70 MB (two reports/mnist-uncertainty*/predictions.parquet are 51 MB
# of it), so before the one `run` call a GPU session sets the largest tracked report files aside
# in git-ignored gpu-out/stash/ and puts them back after:
#
#   bash scripts/gpu/travel.sh check     the bytes that would travel with gpu-bundle/ (exit 1 over)
#   bash scripts/gpu/travel.sh stash     move tracked files >= 5 MB under reports/ to gpu-out/stash/
#   bash scripts/gpu/travel.sh restore   move them back (and `git checkout` any still missing)
#
# Nothing is deleted: the stashed files stay in git's history and `restore` ends with them as git
# has them (it fails loudly otherwise). scripts/gpu/run.sh reads none of the stashed files; the
# test suite does (tests/notebooks.rs, api::uqreport), so run no tests between stash and restore.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
LIMIT=$((64 * 1024 * 1024))
STASH=gpu-out/stash
LIST=$STASH/files.txt
CARRY=${CARRY:-gpu-bundle}

bytes() { # the working-tree bytes of the files named on stdin (NUL-separated), missing ones 0
    local n=0 f s
    while IFS= read -r -d '' f; do
        [ -f "$f" ] || continue
        s=$(stat -c %s "$f"); n=$((n + s))
    done
    echo "$n"
}

check() {
    local tree untracked carry=0 total
    tree=$(git ls-files -z | bytes)
    untracked=$(git ls-files -z -o --exclude-standard | bytes)
    for c in $CARRY; do
        [ -e "$c" ] && carry=$((carry + $(du -sb "$c" | cut -f1)))
    done
    total=$((tree + untracked + carry))
    printf 'tracked %.1f MiB + untracked %.1f MiB + carry (%s) %.1f MiB = %.1f MiB of %d MiB\n' \
        "$(echo "$tree / 1048576" | bc -l)" "$(echo "$untracked / 1048576" | bc -l)" "$CARRY" \
        "$(echo "$carry / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)" $((LIMIT / 1048576))
    [ "$total" -le "$LIMIT" ] || { echo "travel.sh: over the device tool's limit: run 'bash scripts/gpu/travel.sh stash' first" >&2; return 1; }
}

case "${1:-}" in
    check) check ;;
    stash)
        [ -e "$LIST" ] && { echo "travel.sh: $LIST exists: files are stashed already (restore first)" >&2; exit 2; }
        mkdir -p "$STASH"
        : > "$LIST.tmp"
        git ls-files -z reports | while IFS= read -r -d '' f; do
            if [ -f "$f" ] && [ "$(stat -c %s "$f")" -ge 5000000 ]; then printf '%s\n' "$f" >> "$LIST.tmp"; fi
        done
        # A name goes on the list only once its file has moved, so `restore` never touches
        # a file that was not set aside.
        : > "$LIST"
        while IFS= read -r f; do
            mkdir -p "$STASH/$(dirname "$f")"
            mv "$f" "$STASH/$f"
            printf '%s\n' "$f" >> "$LIST"
            echo "stashed $f"
        done < "$LIST.tmp"
        rm -f "$LIST.tmp"
        check ;;
    restore)
        [ -e "$LIST" ] || { echo "travel.sh: nothing stashed ($LIST missing)" >&2; exit 2; }
        while IFS= read -r f; do
            if [ -f "$STASH/$f" ]; then mv "$STASH/$f" "$f"; elif [ ! -e "$f" ]; then git checkout -- "$f"; fi
            echo "restored $f"
        done < "$LIST"
        # The restored files, and only they, must be as git has them.
        bad=$(while IFS= read -r f; do git diff --quiet -- "$f" || echo "$f"; done < "$LIST")
        [ -z "$bad" ] || { echo "travel.sh: restored files differ from git: $bad" >&2; exit 1; }
        rm -f "$LIST" ;;
    *) echo "usage: bash scripts/gpu/travel.sh check|stash|restore" >&2; exit 2 ;;
esac
