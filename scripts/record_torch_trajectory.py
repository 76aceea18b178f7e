"""The recorder's demo and the fixtures' helpers. The recorder itself is the installable package
`python/pathkernel_recorder` (`pip install ./python/pathkernel_recorder`; its docstring says how
to record a training loop); this script imports it from the checkout when it is not installed.

`python scripts/record_torch_trajectory.py OUT [--steps N] [--sgd BATCH] [--optim adamw|sgd-nesterov|...]`
runs a demo: a 2-layer MLP on a small two-moons-like dataset (or on MNIST IDX files).
"""

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "pathkernel_recorder"))
from pathkernel_recorder.recorder import (  # noqa: E402,F401
    TrajectoryRecorder,
    _describe,
    describe_model,
    describe_optimizer,
    train_and_record,
)


def _moons(n, seed):
    g = np.random.default_rng(seed)
    t = g.uniform(0, np.pi, n)
    y = g.integers(0, 2, n)
    x = np.stack([np.cos(t) + y * 1.0 - 0.5, np.sin(t) * (1 - 2 * y) + 0.25 * (2 * y - 1)], 1)
    return x + 0.1 * g.normal(size=x.shape), y


def _mnist(path, n_train, n_test):
    def idx(name):
        with open(os.path.join(path, name), "rb") as f:
            raw = f.read()
        nd = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(nd)]
        return np.frombuffer(raw[4 + 4 * nd :], dtype=np.uint8).reshape(dims)

    xtr = idx("train-images.idx3-ubyte")[:n_train].reshape(n_train, -1) / 255.0
    ytr = idx("train-labels.idx1-ubyte")[:n_train].astype(np.int64)
    xte = idx("t10k-images.idx3-ubyte")[:n_test].reshape(n_test, -1) / 255.0
    yte = idx("t10k-labels.idx1-ubyte")[:n_test].astype(np.int64)
    return xtr, ytr, xte, yte


OPTIMIZERS = {
    "sgd": lambda p, lr: torch.optim.SGD(p, lr=lr),
    "momentum": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, dampening=0.1, weight_decay=1e-3),
    "nesterov": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda p, lr: torch.optim.Adam(p, lr=lr, weight_decay=1e-3),
    "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.05),
}


def main():
    ap = argparse.ArgumentParser(description="demo: record a 2-layer MLP trained by a torch optimizer")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--sgd", type=int, default=0, help="mini-batch size (0: full batch)")
    ap.add_argument("--optim", choices=["gd"] + list(OPTIMIZERS), default="gd",
                    help="gd: the legacy version-1 recording of plain steps (with --sgd: sgd); otherwise a version-2 recording")
    ap.add_argument("--cosine", action="store_true", help="a CosineAnnealingLR scheduler over the steps")
    ap.add_argument("--float32", action="store_true", help="train in float32 (version 2 only)")
    ap.add_argument("--n-train", type=int, default=24)
    ap.add_argument("--n-test", type=int, default=6)
    ap.add_argument("--mnist", help="directory of the MNIST IDX files (default: the two-moons toy)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    if a.mnist:
        xtr, ytr, xte, yte = _mnist(a.mnist, a.n_train, a.n_test)
        classes = 10
    else:
        xtr, ytr = _moons(a.n_train, a.seed)
        xte, yte = _moons(a.n_test, a.seed + 1)
        classes = 2
    xtr, ytr, xte, yte = (torch.from_numpy(np.ascontiguousarray(v)) for v in (xtr, ytr, xte, yte))
    xtr, xte = xtr.double(), xte.double()
    model = nn.Sequential(nn.Linear(xtr.shape[1], a.hidden), nn.ReLU(), nn.Linear(a.hidden, classes)).double()
    data = f"{'mnist' if a.mnist else 'moons'}, seed {a.seed}"
    if a.optim != "gd":
        if a.float32:
            model = model.float()
        opt = OPTIMIZERS[a.optim](model.parameters(), a.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.steps) if a.cosine else None
        train_and_record(a.out, model, xtr, ytr, xte, yte, opt, a.steps, a.sgd, sched, a.seed,
                         description=f"record_torch_trajectory.py demo: {data}, {a.optim}, batch {a.sgd or 'full'}")
        print(f"recorded {a.steps} {a.optim} steps into {a.out}")
        return
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    mode = "sgd" if a.sgd else "gd"
    rec = TrajectoryRecorder(a.out, model, xtr, ytr, xte, yte, loss="cross_entropy", optimizer=mode, torch_optimizer=opt,
                             description=f"record_torch_trajectory.py demo: {data.split(',')[0]}, {mode}, seed {a.seed}")
    g = torch.Generator().manual_seed(a.seed)
    rec.start()
    perm, pos = None, 0
    for s in range(a.steps):
        if a.sgd:
            if perm is None or pos + a.sgd > len(perm):
                perm, pos = torch.randperm(xtr.shape[0], generator=g), 0
            batch = perm[pos : pos + a.sgd]
            pos += a.sgd
        else:
            batch = None
        xb, yb = (xtr, ytr) if batch is None else (xtr[batch], ytr[batch])
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        lr = opt.param_groups[0]["lr"]
        opt.step()
        rec.step(lr, None if batch is None else batch.tolist())
        if s == 0 or s + 1 == a.steps:
            print(f"step {s}: batch loss {loss.item():.6f}")
    rec.finish()
    print(f"recorded {a.steps} {mode} steps into {a.out}")


if __name__ == "__main__":
    main()
