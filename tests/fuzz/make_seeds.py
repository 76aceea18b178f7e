#!/usr/bin/env python3
"""Regenerates the seed corpora in corpus/{idx,trajectory,config}/ (see README.md).

Usage (from tests/fuzz/): python3 make_seeds.py RUN_DIR...
where each RUN_DIR is a run written by `pathkernel train` (the README lists the configs used).
The manifest is minified; each trajectory seed is MANIFEST SEP STEP-0 [SEP DATASET] with
SEP = b"\\n--8<--\\n" (the layout fuzz_targets/trajectory.rs splits on). Datasets over 4 KB are
left out to keep the corpus small.
"""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = b"\n--8<--\n"


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx(ty, dims, data):
    return bytes([0, 0, ty, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


# IDX: labels (0x00000801), images (0x00000803), 2-D and 4-D arrays, and two near misses.
out("idx", "labels-idx1", idx(0x08, [5], [0, 1, 2, 9, 7]))
out("idx", "images-idx3", idx(0x08, [2, 3, 3], range(18)))
out("idx", "matrix-idx2", idx(0x08, [4, 2], [255, 0, 1, 2, 3, 4, 5, 6]))
out("idx", "tensor-idx4", idx(0x08, [1, 2, 2, 2], [8] * 8))
out("idx", "empty-dim-idx3", idx(0x08, [0, 28, 28], []))
out("idx", "f32-idx1", idx(0x0D, [2], [0] * 8))

for run in sys.argv[1:]:
    name = os.path.basename(os.path.normpath(run))
    with open(os.path.join(run, "manifest.json")) as f:
        manifest = json.dumps(json.load(f), separators=(",", ":")).encode()
    with open(os.path.join(run, "trajectory", "step-000000.safetensors"), "rb") as f:
        step = f.read()
    seed = manifest + SEP + step
    ds_path = os.path.join(run, "dataset.safetensors")
    if os.path.getsize(ds_path) <= 4096:
        with open(ds_path, "rb") as f:
            seed += SEP + f.read()
    out("trajectory", name, seed)

cfg_dir = os.path.join(HERE, "corpus", "config")
os.makedirs(cfg_dir, exist_ok=True)
studies = os.path.join(HERE, "..", "..", "data", "studies")
for f in sorted(os.listdir(studies)):
    if f.endswith(".toml"):
        shutil.copy(os.path.join(studies, f), os.path.join(cfg_dir, "study-" + f))
src = os.path.join(HERE, "seeds-src")
for f in sorted(os.listdir(src)):
    if f.endswith(".toml"):
        shutil.copy(os.path.join(src, f), os.path.join(cfg_dir, "run-" + f))
