#!/usr/bin/env python3
"""Cross-check of pathkernel's function-space Laplace against laplace-torch on the same network.

    python3 scripts/laplace_torch_check.py reports/mnist-uncertainty [--cache runs/mnist-uncertainty]
        [--model model.safetensors] [--points N] [--batch 100]

Needs torch and laplace-torch, which CI does not install (they are large). Install them in a
virtual environment outside the repository:

    python3 -m venv ~/venv-laplace && ~/venv-laplace/bin/pip install torch laplace-torch pyarrow safetensors
    ~/venv-laplace/bin/python scripts/laplace_torch_check.py reports/mnist-uncertainty

What it does, on the uncertainty study's network under test (read from the study's cache, or the
`pathkernel export --format torch` file given with --model):

1. rebuilds the 784-128-10 MLP as `nn.Sequential(Linear, ReLU, Linear)` in float64 and checks
   that its softmax equals the study's MAP probabilities (`predictions.parquet`, method `map`);
2. fits laplace-torch's `FunctionalLaplace` (`Laplace(model, 'classification',
   subset_of_weights='all', hessian_structure='gp', independent_outputs=True)`) on the same
   2 000 training images with the prior precision δ our `fsl-ntk-diag` chose by the evidence
   (`gp_fits.json`);
3. compares per test point and class laplace-torch's `functional_variance` (summed over the
   classes: our study keeps the trace, `runs/…/ntk-gp/clean.safetensors`) and its probit
   probabilities with ours (`fsl-ntk-diag` in `predictions.parquet`), relative differences.

laplace-torch replaces 1/λ = ∞ (a training point with p_ic exactly 0 or 1 in float64) by 10; the
script reports how many such λ there are, since there the two constructions differ by design.
"""
import argparse
import json
import os
import sys

import numpy as np


def fail(msg):
    print(f"laplace_torch_check: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--cache", default=None, help="the study's cache (default runs/<study name>)")
    ap.add_argument("--model", default=None, help="a `pathkernel export --format torch` file (default: the run's last state)")
    ap.add_argument("--points", type=int, default=None, help="clean test points compared (default all)")
    ap.add_argument("--batch", type=int, default=100)
    a = ap.parse_args()
    try:
        import torch
        from laplace import Laplace
        from safetensors.numpy import load_file
        import pyarrow.parquet as pq
    except ImportError as e:
        fail(f"{e}: install torch, laplace-torch, safetensors and pyarrow (see the docstring)")
    torch.set_default_dtype(torch.float64)
    name = os.path.basename(os.path.normpath(a.report))
    cache = a.cache or os.path.join("runs", name)
    sel = json.load(open(os.path.join(a.report, "selection.json")))
    fits = json.load(open(os.path.join(a.report, "gp_fits.json")))
    fsl = [f for f in fits.get("functional_laplace", []) if f["kernel"] == "ntk" and f["fit"]["curvature"] == "class-diagonal"]
    if not fsl:
        fail(f"{a.report}/gp_fits.json has no class-diagonal NTK function-space Laplace fit")
    delta = fsl[0]["fit"]["delta"]
    # The network under test: the selection run with the chosen lr and steps (the study's rule).
    last = max(r["steps"] for r in sel["rows"])
    run = os.path.join(cache, "select", f"lr-{sel['lr']}-steps-{last}") if sel["steps"] == last else os.path.join(cache, "run")
    man = json.load(open(os.path.join(run, "manifest.json")))
    if man["architecture"]["body"]["widths"] != [784, 128, 10]:
        fail(f"{run}: expected the 784-128-10 MLP")
    data = load_file(os.path.join(run, "dataset.safetensors"))
    if a.model:
        w = load_file(a.model)
        names = [("0.weight", "0.bias"), ("2.weight", "2.bias")]
    else:
        w = load_file(os.path.join(run, "trajectory", f"step-{sel['steps']:06d}.safetensors"))
        names = [("layers.0.weight", "layers.0.bias"), ("layers.1.weight", "layers.1.bias")]
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    with torch.no_grad():
        for lin, (wn, bn) in zip([model[0], model[2]], names):
            lin.weight.copy_(torch.from_numpy(w[wn]))
            lin.bias.copy_(torch.from_numpy(w[bn]))
    xtr = torch.from_numpy(data["x_train"]).double()
    ytr = torch.from_numpy(data["y_train"].astype(np.int64))
    n = a.points or data["x_test"].shape[0]
    xte = torch.from_numpy(data["x_test"][:n]).double()

    t = pq.read_table(os.path.join(a.report, "predictions.parquet"))
    col = {c: t.column(c).to_numpy() if c not in ("method", "setting") else np.array(t.column(c).to_pylist()) for c in t.column_names}

    def ours(method, what="probs"):
        sel_rows = np.where((col["method"] == method) & (col["setting"] == "clean"))[0]
        sel_rows = sel_rows[np.argsort(col["point"][sel_rows])][:n]
        if what == "ood_score":
            return col["ood_score"][sel_rows]
        return np.stack([col[f"p{c}"][sel_rows] for c in range(10)], axis=1)

    with torch.no_grad():
        p_map = torch.softmax(model(xte), -1).numpy()
    d_map = np.abs(p_map - ours("map")).max()
    print(f"network: softmax vs the study's MAP probabilities, max |diff| = {d_map:.3e} ({n} clean test points)")

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=a.batch)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="gp",
                 independent_outputs=True, n_subset=xtr.shape[0], prior_precision=delta)
    la.fit(loader)
    with torch.no_grad():
        ps = torch.softmax(model(xtr), -1)
    lam = ps * (1 - ps)
    print(f"laplace-torch FunctionalLaplace fitted: M = {xtr.shape[0]}, δ = {delta:.6e}; λ_ic exactly 0: {int((lam == 0).sum())}")
    f_mu, f_var = la._glm_predictive_distribution(xte)
    var = torch.diagonal(f_var, dim1=-2, dim2=-1).detach().numpy()
    probs = la(xte, pred_type="gp", link_approx="probit").detach().numpy()

    our_trace = ours("fsl-ntk-diag", "ood_score")
    tr = var.sum(-1)
    rel_var = np.abs(tr - our_trace) / np.abs(our_trace)
    p_ours = ours("fsl-ntk-diag")
    rel_p = np.abs(probs - p_ours) / np.maximum(np.abs(p_ours), 1e-300)
    print(f"functional variance (trace over classes): max relative difference {rel_var.max():.3e}, median {np.median(rel_var):.3e}")
    print(f"probit probabilities: max relative difference {rel_p.max():.3e} (max absolute {np.abs(probs - p_ours).max():.3e})")
    print(f"variance scale: ours mean trace {our_trace.mean():.6e}, laplace-torch {tr.mean():.6e}")
    ok = rel_var.max() <= 1e-8 and np.abs(probs - p_ours).max() <= 1e-8 and d_map <= 1e-12
    print("PASS (≤ 1e-8)" if ok else "DIFFERENCES ABOVE 1e-8")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
