#!/usr/bin/env python3
"""Recompute the uncertainty benchmark's metrics from its per-point predictions, independently.

Reads REPORT_DIR/predictions.parquet and REPORT_DIR/metrics.parquet (written by
`pathkernel::uncertainty::UqResults::write`), recomputes every row of the metrics table from the
predictions with numpy, and compares them. Exit status 0 when every value agrees to --tol
(absolute, default 1e-9; infinities must match exactly), 1 otherwise.

Usage:  python3 scripts/check_uncertainty_metrics.py REPORT_DIR [--tol 1e-9]
Needs:  numpy (all the maths) and pyarrow (only to read the parquet files).

Conventions (the same as src/uncertainty/metrics.rs):
- arg-max ties go to the lowest class (np.argmax);
- NLL = mean of -ln p_y, unclamped (p_y = 0 gives +inf);
- Brier = mean over points of sum over classes of (p - onehot)^2;
- ECE: 15 bins of the top-label confidence c with edges j/15; bin j holds j/15 < c <= (j+1)/15,
  c = 0 goes to bin 0; ECE = sum_j (n_j/N) |acc_j - conf_j|;
- AUROC = P(s+ > s-) + P(s+ = s-)/2 from average ranks (Mann-Whitney). auroc_msp: positives are
  the method's `clean` points, negatives the OOD setting's, score = max probability;
  auroc_variance: positives the OOD points, negatives the clean ones, score = ood_score.
"""
import argparse
import sys

import numpy as np
import pyarrow.parquet as pq


def accuracy(p, y):
    return float(np.mean(np.argmax(p, axis=1) == y))


def nll(p, y):
    with np.errstate(divide="ignore"):
        return float(np.mean(-np.log(p[np.arange(len(y)), y])))


def brier(p, y):
    onehot = np.eye(p.shape[1])[y]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def ece(p, y, bins=15):
    conf = p.max(axis=1)
    hit = np.argmax(p, axis=1) == y
    edges = np.arange(bins + 1) / bins
    j = np.minimum(np.searchsorted(edges[1:], conf, side="left"), bins - 1)
    total = 0.0
    for b in range(bins):
        m = j == b
        if m.any():
            total += m.sum() / len(y) * abs(hit[m].mean() - conf[m].mean())
    return float(total)


def average_ranks(s):
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    srt = s[order]
    i = 0
    while i < len(s):
        j = i + 1
        while j < len(s) and srt[j] == srt[i]:
            j += 1
        ranks[order[i:j]] = (i + 1 + j) / 2.0
        i = j
    return ranks


def auroc(pos, neg):
    if np.isnan(pos).any() or np.isnan(neg).any():
        raise ValueError("NaN score")
    r = average_ranks(np.concatenate([pos, neg]))
    n1, n0 = len(pos), len(neg)
    return float((r[:n1].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report_dir")
    ap.add_argument("--tol", type=float, default=1e-9)
    args = ap.parse_args()

    pred = pq.read_table(f"{args.report_dir}/predictions.parquet").to_pydict()
    met = pq.read_table(f"{args.report_dir}/metrics.parquet").to_pydict()
    k = sum(1 for c in pred if c.startswith("p") and c[1:].isdigit())
    method = np.array(pred["method"])
    setting = np.array(pred["setting"])
    point = np.array(pred["point"])
    label = np.array(pred["label"])
    score = np.array(pred["ood_score"], dtype=float)
    probs = np.stack([np.array(pred[f"p{c}"], dtype=float) for c in range(k)], axis=1)

    def rows(m, s):
        idx = np.flatnonzero((method == m) & (setting == s))
        idx = idx[np.argsort(point[idx], kind="mergesort")]
        if len(idx) == 0:
            raise KeyError(f"no predictions for {m} / {s}")
        p = probs[idx]
        if not np.all(np.isfinite(p)) or np.any(np.abs(p.sum(axis=1) - 1.0) > 1e-8):
            raise ValueError(f"{m} / {s}: probabilities not finite or rows not summing to 1")
        return p, label[idx], score[idx]

    bad = 0
    worst = 0.0
    for m, s, name, value, n in zip(met["method"], met["setting"], met["metric"], met["value"], met["n"]):
        p, y, sc = rows(m, s)
        if len(y) != n:
            print(f"MISMATCH {m} / {s}: {len(y)} points, table says {n}")
            bad += 1
            continue
        if name in ("accuracy", "nll", "brier", "ece"):
            if np.any(y < 0):
                raise ValueError(f"{m} / {s}: labelled metric on unlabelled points")
            want = {"accuracy": accuracy, "nll": nll, "brier": brier, "ece": ece}[name](p, y)
        elif name == "auroc_msp":
            pc, _, _ = rows(m, "clean")
            want = auroc(pc.max(axis=1), p.max(axis=1))
        elif name == "auroc_variance":
            _, _, sc_clean = rows(m, "clean")
            want = auroc(sc, sc_clean)
        else:
            raise ValueError(f"unknown metric {name}")
        if np.isinf(want) or np.isinf(value):
            ok = want == value
            diff = 0.0 if ok else float("inf")
        else:
            diff = abs(want - value)
            ok = diff <= args.tol
        worst = max(worst, diff)
        if not ok:
            bad += 1
            print(f"MISMATCH {m} / {s} / {name}: table {value!r}, recomputed {want!r} (diff {diff:.3e})")
    total = len(met["metric"])
    print(f"{total - bad} passed, {bad} failed (largest difference {worst:.3e}, tolerance {args.tol:g})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
