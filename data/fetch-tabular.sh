#!/usr/bin/env bash
# Fetch the UCI wine recognition data (178 wines, 13 chemical measurements, 3 cultivars) into
# DEST/wine.csv (default: data/wine next to this script), for the `table` study data/studies/wine.toml.
#
#   bash data/fetch-tabular.sh [DEST]
#
# The data come from the copy scikit-learn bundles (sklearn/datasets/data/wine_data.csv), taken
# out of its pinned PyPI wheel with `pip download --no-deps` (scikit-learn is never installed or
# imported; only pip and Python's zipfile module are used). The wheel and the extracted CSV are
# both checked against pinned sha256 hashes. scikit-learn's file starts with a line of counts and
# class names ("178,13,class_0,class_1,class_2") and numbers the classes 0-2; we write a header of
# feature names and the class as the string class_0 / class_1 / class_2 (the `table` kind maps
# string classes to 0..K-1 in sorted order). Idempotent: an existing wine.csv with the right
# hash is left alone.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${1:-$script_dir/wine}"

version="1.5.2"
wheel="scikit_learn-1.5.2-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
wheel_sha256="394397841449853c2290a32050382edaec3da89e35b3e03d6cc966aebc6a8ae6"
member="sklearn/datasets/data/wine_data.csv"
member_sha256="10e8a802908b34f86e5da8ce962f3c806694bc98450a18f61851af59f324bede"
header="alcohol,malic_acid,ash,alcalinity_of_ash,magnesium,total_phenols,flavanoids,nonflavanoid_phenols,proanthocyanins,color_intensity,hue,od280_od315,proline,class"

die() { echo "fetch-tabular: error: $*" >&2; exit 1; }

if command -v sha256sum >/dev/null 2>&1; then
  sha256() { sha256sum "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
  sha256() { shasum -a 256 "$1" | cut -d' ' -f1; }
else
  die "neither sha256sum nor shasum found"
fi

out="$dest/wine.csv"
# The sha256 of the wine.csv this script writes (checked after writing, and for idempotence).
out_sha256="0c261a81d5f16dc278d94012e8a23f9ae1cc2e942f2a7997a76e3477d35010c3"
if [[ -f "$out" && "$(sha256 "$out")" == "$out_sha256" ]]; then
  echo "fetch-tabular: $out already present (sha256 verified); nothing to do."
  exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 (with pip) is needed to download the scikit-learn==$version wheel from PyPI"
python3 -m pip --version >/dev/null 2>&1 || die "pip is not available for python3 (try: python3 -m ensurepip)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/fetch-tabular.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-tabular: downloading $wheel from PyPI ..."
python3 -m pip download "scikit-learn==$version" --no-deps --only-binary :all: \
  --platform manylinux2014_x86_64 --python-version 3.12 --implementation cp --abi cp312 \
  --disable-pip-version-check -d "$tmp" >"$tmp/pip.log" 2>&1 \
  || { cat "$tmp/pip.log" >&2; die "pip download failed (is PyPI reachable?)"; }
[[ -f "$tmp/$wheel" ]] || { cat "$tmp/pip.log" >&2; die "pip did not save $wheel"; }
got="$(sha256 "$tmp/$wheel")"
[[ "$got" == "$wheel_sha256" ]] || die "sha256 mismatch for $wheel: expected $wheel_sha256, got $got"

python3 - "$tmp/$wheel" "$member" "$tmp/wine_data.csv" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], "wb") as f:
    f.write(z.read(sys.argv[2]))
PY
got="$(sha256 "$tmp/wine_data.csv")"
[[ "$got" == "$member_sha256" ]] || die "sha256 mismatch for $member: expected $member_sha256, got $got"

mkdir -p "$dest" || die "cannot create destination directory $dest"
part="$dest/.wine.csv.part"
{
  echo "$header"
  # Skip scikit-learn's count line; the last field (0, 1, 2) becomes class_0, class_1, class_2.
  tail -n +2 "$tmp/wine_data.csv" | tr -d '\r' | awk -F, 'BEGIN { OFS = "," } NF { $NF = "class_" $NF; print }'
} >"$part"
got="$(sha256 "$part")"
if [[ "$got" != "$out_sha256" ]]; then
  rm -f "$part"
  die "sha256 mismatch for the written wine.csv: expected $out_sha256, got $got"
fi
mv -f "$part" "$out"
echo "fetch-tabular: wrote $out (178 rows, 13 features, label column 'class'; sha256 OK)"
