#!/usr/bin/env python3
"""Compare two recorded trajectories step by step (standard library only: runs with any python3).

    python3 scripts/gpu/traj_diff.py RUN_A RUN_B [--tol 1e-10]

Reads every RUN/trajectory/step-*.safetensors of both runs (the same step files must exist in
both), and for every F64 tensor of every step the largest |a - b| relative to the largest |a| of
that tensor. Prints one JSON line {"name": "trajectory_diff", "steps", "tensors", "max_rel",
"worst_step", "worst_tensor"} and exits 1 when max_rel > tol (2 on unreadable input), so that
scripts/gpu/run.sh can check the dfdx `cuda` training against the CPU's (issue 38 asks <= 1e-10).
"""
import array
import json
import os
import struct
import sys


def load(path):
    """{name: array('d')} of a safetensors file's F64 tensors."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta.get("dtype") != "F64":
            continue
        b, e = meta["data_offsets"]
        a = array.array("d")
        a.frombytes(data[b:e])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = a
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    tol = 1e-10
    if "--tol" in argv:
        tol = float(argv[argv.index("--tol") + 1])
        args.remove(argv[argv.index("--tol") + 1])
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    dirs = [os.path.join(r, "trajectory") for r in args]
    steps = sorted(f for f in os.listdir(dirs[0]) if f.startswith("step-") and f.endswith(".safetensors"))
    if not steps or steps != sorted(f for f in os.listdir(dirs[1]) if f.startswith("step-") and f.endswith(".safetensors")):
        print(f"traj_diff: the two runs do not hold the same step files ({len(steps)} in {args[0]})", file=sys.stderr)
        return 2
    worst = (0.0, None, None)
    tensors = 0
    for s in steps:
        a, b = load(os.path.join(dirs[0], s)), load(os.path.join(dirs[1], s))
        if a.keys() != b.keys():
            print(f"traj_diff: {s}: tensors differ: {sorted(a)} vs {sorted(b)}", file=sys.stderr)
            return 2
        for name, x in a.items():
            y = b[name]
            if len(x) != len(y):
                print(f"traj_diff: {s}/{name}: {len(x)} vs {len(y)} numbers", file=sys.stderr)
                return 2
            scale = max((abs(v) for v in x), default=0.0) or 1.0
            rel = max((abs(u - v) for u, v in zip(x, y)), default=0.0) / scale
            tensors += 1
            if rel > worst[0] or worst[1] is None:
                worst = (rel, s, name)
    print(json.dumps({"name": "trajectory_diff", "steps": len(steps), "tensors": tensors, "max_rel": worst[0], "worst_step": worst[1], "worst_tensor": worst[2], "tol": tol}))
    return 0 if worst[0] <= tol else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
