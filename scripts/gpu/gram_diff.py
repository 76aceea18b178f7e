#!/usr/bin/env python3
"""Compare the Grams of two `pathkernel kernel` outputs: prints one JSON line with
max |A - B| / max |B| of gram.safetensors, and both runs' exactness (max |machine - network|,
evaluations per point and step, tolerance met). Plain Python (no numpy): the GPU machine's
python3 need not have it.

  python3 scripts/gpu/gram_diff.py DIR_A DIR_B [--name NAME]
"""
import json
import os
import struct
import sys


def gram(d):
    raw = open(os.path.join(d, "gram.safetensors"), "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    meta = head["gram"]
    if meta["dtype"] != "F64":
        sys.exit(f"gram_diff.py: {d}: gram is {meta['dtype']}, expected F64")
    a, b = meta["data_offsets"]
    body = raw[8 + n + a:8 + n + b]
    return struct.unpack(f"<{len(body) // 8}d", body)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    name = sys.argv[sys.argv.index("--name") + 1] if "--name" in sys.argv else "gram_diff"
    if len(args) < 2:
        sys.exit(__doc__)
    da, db = args[0], args[1]
    ga, gb = gram(da), gram(db)
    if len(ga) != len(gb):
        sys.exit(f"gram_diff.py: Grams of different sizes ({len(ga)} vs {len(gb)})")
    scale = max((abs(v) for v in gb), default=0.0)
    diff = max((abs(x - y) for x, y in zip(ga, gb)), default=0.0)
    ea, eb = (json.load(open(os.path.join(d, "exactness.json"))) for d in (da, db))
    print(json.dumps({
        "name": name, "rel_diff": diff / scale if scale else diff, "entries": len(ga),
        "a_max_abs_error": ea["max_abs_error"], "b_max_abs_error": eb["max_abs_error"],
        "a_evaluations": ea["evaluations_per_step"]["mean"], "b_evaluations": eb["evaluations_per_step"]["mean"],
        "a_tolerance_met": ea["tolerance_met"], "b_tolerance_met": eb["tolerance_met"],
    }))


if __name__ == "__main__":
    main()
