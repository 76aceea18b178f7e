#!/usr/bin/env python3
"""Recompute the attribution benchmark's LDS from its attributions and retrained outputs, independently.

Reads OUT_DIR/result.json (the subsets, the tuning/evaluation split and every method's reported LDS),
OUT_DIR/retrained.safetensors (logp, margin [S, P]) and the attributions file (each method's chosen
tau [P, M]; --tau, default OUT_DIR/tau.safetensors; a study keeps it in its cache, e.g.
runs/mnist-attribution/tau.safetensors), all written by
`pathkernel::datamodels::benchmark::write_tables`. For every method it
recomputes, with scipy.stats.spearmanr, the LDS of each test point over the evaluation subsets
(Spearman between sum_{i in S} tau(x, i) and the retrained output; 0 where either side is constant)
and the mean over test points, for log p_y and for the margin, and the mean over the tuning subsets,
and compares them with the reported values. Exit status 0 when all agree to --tol (default 1e-9).

Usage:  python3 scripts/check_datamodels_lds.py OUT_DIR [--tau TAU_FILE] [--tol 1e-9]
Needs:  numpy, scipy (the safetensors files are parsed here: an 8-byte header length, a JSON
        header, little-endian f64 data).
"""
import argparse
import json
import struct
import sys

import numpy as np
from scipy.stats import spearmanr


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        assert meta["dtype"] == "F64", meta
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f8").reshape(meta["shape"])
    return out


def lds(tau, members, outputs, which):
    p, m = tau.shape
    mask = np.zeros((len(which), m))
    for r, s in enumerate(which):
        mask[r, members[s]] = 1.0
    pred = mask @ tau.T  # [S, P]
    vals = []
    for q in range(p):
        a, b = pred[:, q], outputs[which, q]
        if np.all(a == a[0]) or np.all(b == b[0]):
            vals.append(0.0)
        else:
            vals.append(spearmanr(a, b).statistic)
    return float(np.mean(vals))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--tau", help="the attributions file (default OUT_DIR/tau.safetensors)")
    ap.add_argument("--tol", type=float, default=1e-9)
    args = ap.parse_args()
    res = json.load(open(f"{args.out_dir}/result.json"))
    taus = read_safetensors(args.tau or f"{args.out_dir}/tau.safetensors")
    ret = read_safetensors(f"{args.out_dir}/retrained.safetensors")
    members = [np.array(v) for v in res["subsets"]["members"]]
    tuning = res["subsets"]["tuning"]
    tune_ids = list(range(tuning))
    eval_ids = list(range(tuning, len(members)))
    worst = 0.0
    for m in res["methods"]:
        tau = taus[m["method"]]
        got = (lds(tau, members, ret["logp"], tune_ids), lds(tau, members, ret["logp"], eval_ids), lds(tau, members, ret["margin"], eval_ids))
        want = (m["tune"], m["lds"]["mean"], m["lds_margin"]["mean"])
        diff = max(abs(a - b) for a, b in zip(got, want))
        worst = max(worst, diff)
        print(f"{m['method']:>14}: tune {got[0]:.6f} eval {got[1]:.6f} margin {got[2]:.6f}  max |diff| {diff:.2e}")
    print(f"largest difference {worst:.2e} (tolerance {args.tol:g})")
    sys.exit(0 if worst <= args.tol else 1)


if __name__ == "__main__":
    main()
