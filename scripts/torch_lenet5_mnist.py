"""LeNet-5 trained by PyTorch on real MNIST with AdamW and mini-batches, recorded, imported by
pathkernel, its exact path kernel, and its weights exported back to PyTorch. Outside CI (needs
torch; the guide quotes what it prints).

    /work/venv/bin/python scripts/torch_lenet5_mnist.py [--steps 100] [--batch 100] [--per-class 200]
        [--n-test 500] [--lr 1e-3] [--precision float64,float32] [--mnist data/mnist] [--pathkernel target/release/pathkernel] [--out runs/lenet5]

For each precision of --precision (default float64, then float32):
1. LeNet-5 (`nn.Sequential(Conv2d(1, 6, 5, padding=2), ReLU, MaxPool2d(2), Conv2d(6, 16, 5), ReLU,
   MaxPool2d(2), Flatten, Linear(400, 120), ReLU, Linear(120, 84), ReLU, Linear(84, 10))`, PyTorch's
   initialisation under torch.manual_seed(0)) trained by `torch.optim.AdamW` (lr --lr, default
   1e-3, weight decay 0.01) on mini-batches (epoch-wise seeded permutations) of the first `per-class` training
   images of each class (pixels / 255), recorded by scripts/record_torch_trajectory.py;
2. `pathkernel import`: every recorded update against AdamW replayed from gradients recomputed
   in f64 (largest relative difference printed);
3. `pathkernel kernel --kind epk --quadrature auto:1e-12` on the first `n-test` test images:
   the kernel machine vs the network (and, for float32, the residual term: recorded minus
   replayed updates, which belongs to no training point);
4. `pathkernel export --format torch` of the last state, loaded by scripts/torch_model.py and
   run by PyTorch on the test images, against the PyTorch model as trained (logits, same
   precision as trained for the model; the export is float64).

Writes OUT/summary.json and prints one line per figure, with the wall time of each stage.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from record_torch_trajectory import train_and_record  # noqa: E402
from torch_model import load  # noqa: E402


def idx(path):
    with open(path, "rb") as f:
        raw = f.read()
    nd = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(nd)]
    return np.frombuffer(raw[4 + 4 * nd :], dtype=np.uint8).reshape(dims)


def mnist(path, per_class, n_test):
    xtr, ytr = idx(os.path.join(path, "train-images.idx3-ubyte")), idx(os.path.join(path, "train-labels.idx1-ubyte"))
    keep = np.sort(np.concatenate([np.flatnonzero(ytr == c)[:per_class] for c in range(10)]))
    xte, yte = idx(os.path.join(path, "t10k-images.idx3-ubyte"))[:n_test], idx(os.path.join(path, "t10k-labels.idx1-ubyte"))[:n_test]
    img = lambda a: torch.from_numpy(a.astype(np.float64)[:, None] / 255.0)
    lab = lambda a: torch.from_numpy(a.astype(np.int64))
    return img(xtr[keep]), lab(ytr[keep]), img(xte), lab(yte)


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
    )


def pk(binary, *args):
    t = time.time()
    out = subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout.strip()
    return out, time.time() - t


def after(text, key):
    return float(text.split(key, 1)[1].split()[0].rstrip(",;()"))


def one(a, prec, data):
    xtr, ytr, xte, yte = data
    dtype = torch.float64 if prec == "float64" else torch.float32
    rec, run, epk, exp = (os.path.join(a.out, f"{prec}-{s}") for s in ("rec", "run", "epk", "final.safetensors"))
    for p in (rec, run, epk):
        shutil.rmtree(p, ignore_errors=True)
    torch.manual_seed(0)
    model = lenet5().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    t = time.time()
    train_and_record(rec, model, xtr, ytr, xte, yte, opt, a.steps, a.batch, None, seed=0,
                     description=f"torch_lenet5_mnist.py: LeNet-5, AdamW lr {a.lr} wd 0.01, batch {a.batch}, {len(ytr)} MNIST images, {prec}")
    t_train = time.time() - t
    model.eval()
    with torch.no_grad():
        torch_logits = model(xte.to(dtype)).double().numpy()
    acc = float((torch_logits.argmax(1) == yte.numpy()).mean())
    imported, t_import = pk(a.pathkernel, "import", "--from", "torch", rec, "--out", run, "--force")
    print(imported)
    kernel, t_kernel = pk(a.pathkernel, "kernel", "--run", run, "--kind", "epk", "--quadrature", "auto:1e-12", "--points", "test", "--out", epk, "--force")
    print(kernel)
    with open(os.path.join(epk, "exactness.json")) as f:
        ex = json.load(f)
    exported, _ = pk(a.pathkernel, "export", "--run", run, "--format", "torch", "--out", exp, "--force")
    with torch.no_grad():
        ours = load(exp)(xte).numpy()
    r = {
        "precision": prec,
        "train_images": len(ytr),
        "test_images": len(yte),
        "steps": a.steps,
        "batch": a.batch,
        "lr": a.lr,
        "test_accuracy": acc,
        "replay_max_rel_diff": after(imported, "max relative difference "),
        "replay_max_abs_diff": after(imported, "max absolute "),
        "epk_machine_vs_network": ex["max_abs_error"],
        "epk_machine_vs_network_mean": ex["mean_abs_error"],
        "residual_term_max_abs": ex.get("rounding_term_max_abs"),
        "export_vs_pytorch_logits": float(np.abs(ours - torch_logits).max()),
        "seconds": {"pytorch_train_and_record": t_train, "import": t_import, "epk": t_kernel},
        "exactness": ex,
    }
    print(f"{prec}: test accuracy {acc:.3f}; replay max relative difference {r['replay_max_rel_diff']:.3e} (abs {r['replay_max_abs_diff']:.3e}); "
          f"EPK machine vs network {r['epk_machine_vs_network']:.3e}; residual term {r['residual_term_max_abs']}; "
          f"exported and run by PyTorch vs PyTorch's network {r['export_vs_pytorch_logits']:.3e}; "
          f"seconds: train+record {t_train:.1f}, import {t_import:.1f}, EPK {t_kernel:.1f}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--mnist", default=os.path.join(here, "..", "data", "mnist"))
    ap.add_argument("--pathkernel", default=os.path.join(here, "..", "target", "release", "pathkernel"))
    ap.add_argument("--out", default=os.path.join(here, "..", "runs", "lenet5"))
    ap.add_argument("--precision", default="float64,float32", help="comma-separated: float64, float32 (run in this order)")
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    os.makedirs(a.out, exist_ok=True)
    data = mnist(a.mnist, a.per_class, a.n_test)
    results = []
    for prec in a.precision.split(","):
        if prec not in ("float64", "float32"):
            raise SystemExit(f"--precision {prec}: float64 or float32")
        results.append(one(a, prec, data))
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(results, f, indent=1)
    print(f"wrote {os.path.join(a.out, 'summary.json')}")


if __name__ == "__main__":
    main()
