#!/usr/bin/env python3
"""Compare two recorded trajectories step by step (standard library only: runs with any python3).

    python3 scripts/gpu/traj_diff.py RUN_A RUN_B [--tol 1e-10]

Reads every RUN/trajectory/step-*.safetensors of both runs (the same step files must exist in
both) and compares each state w_t as one vector: max_rel = max_t max |a - b| / max |a| over all
F64 tensors of step t (the state's infinity norm). Also reported, not judged: the worst tensor
relative to its own largest entry (tensor_max_rel), which is meaningless for a tensor that is
rounding noise (the zero-initialised last layer's bias after one step of balanced-class GD is
~1e-15 on either device, so any two roundings of it differ by ~100 %). Prints one JSON line
{"name": "trajectory_diff", "steps", "tensors", "max_rel", "max_abs", "worst_step", "worst_tensor",
"tensor_max_rel", ...} and exits 1 when max_rel > tol (2 on unreadable input), so that
scripts/gpu/run.sh can check the dfdx `cuda` training against the CPU's (issue 38 asks <= 1e-10).
"""
import array
import math
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
    worst = (0.0, None, None, 0.0)
    worst_t = (0.0, None, None, 0.0)
    tensors = 0
    for s in steps:
        a, b = load(os.path.join(dirs[0], s)), load(os.path.join(dirs[1], s))
        if a.keys() != b.keys():
            print(f"traj_diff: {s}: tensors differ: {sorted(a)} vs {sorted(b)}", file=sys.stderr)
            return 2
        state_scale, state_diff, state_worst = 0.0, 0.0, None
        for name, x in a.items():
            y = b[name]
            if len(x) != len(y):
                print(f"traj_diff: {s}/{name}: {len(x)} vs {len(y)} numbers", file=sys.stderr)
                return 2
            scale = max((abs(v) for v in x), default=0.0)
            # A non-finite number on either side is an infinite difference (max() would skip NaN).
            diff = max((d if math.isfinite(d) else math.inf for d in (abs(u - v) for u, v in zip(x, y))), default=0.0)
            tensors += 1
            rel = diff / (scale or 1.0)
            if rel > worst_t[0] or worst_t[1] is None:
                worst_t = (rel, s, name, scale)
            state_scale = max(state_scale, scale)
            if diff >= state_diff:
                state_diff, state_worst = diff, name
        rel = state_diff / (state_scale or 1.0)
        if rel > worst[0] or worst[1] is None:
            worst = (rel, s, state_worst, state_diff)
    print(json.dumps({"name": "trajectory_diff", "steps": len(steps), "tensors": tensors, "max_rel": worst[0], "max_abs": worst[3],
                      "worst_step": worst[1], "worst_tensor": worst[2], "tensor_max_rel": worst_t[0], "tensor_worst": f"{worst_t[2]} at {worst_t[1]}",
                      "tensor_worst_scale": worst_t[3], "tol": tol}))
    return 0 if worst[0] <= tol else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
