"""Writes the PyTorch fixtures of tests/torch.rs. Run with a Python that has torch and safetensors
(never in CI: the outputs are committed):

    /work/venv/bin/python scripts/make_torch_fixture.py

- tests/data/torch/init-mlp.safetensors: the state_dict of a float64
  `nn.Sequential(Linear(2, 6), Tanh(), Linear(6, 5), Tanh(), Linear(5, 3))` with PyTorch's
  default initialisation under torch.manual_seed(20); tests/torch.rs starts a run from it
  (`[model] init`), trains, exports and compares the exported network with ours.
- tests/data/torch-adamw: a float64 ReLU MLP 2-8-8-2 trained by AdamW (lr 0.02, weight decay
  0.05) with a cosine schedule, 40 steps of mini-batches of 8 of 32 two-moons points.
- tests/data/torch-adamw-f32: the same network and data trained in float32, 20 steps.
- tests/data/torch-nesterov: a float64 Tanh MLP 2-8-2 trained by SGD with Nesterov momentum 0.9
  and weight decay 1e-3, StepLR (x0.5 every 10 steps), 25 steps of batches of 8.
- tests/data/torch-cnn-momentum: a float64 CNN Sequential(Conv2d(1, 2, 3, padding=1), ReLU,
  MaxPool2d(2), Flatten, Linear(32, 3)) on 12 random 8x8 images of 3 classes, SGD momentum 0.8,
  dampening 0.3, weight decay 1e-3, full batch, 10 steps.

Each recording is written by scripts/record_torch_trajectory.py's TrajectoryRecorder.
"""

import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from record_torch_trajectory import _moons, train_and_record  # noqa: E402

data_dir = os.path.join(here, "..", "tests", "data")


def init_mlp():
    out = os.path.join(data_dir, "torch", "init-mlp.safetensors")
    torch.manual_seed(20)
    model = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out)
    print(f"wrote {os.path.normpath(out)}: {model}")
    for k, v in model.state_dict().items():
        print(f"  {k} {list(v.shape)} sum {v.sum().item():.17g}")


def moons(n_train, n_test, seed):
    xtr, ytr = _moons(n_train, seed)
    xte, yte = _moons(n_test, seed + 1)
    return tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in (xtr, ytr, xte, yte))


def fresh(name):
    out = os.path.join(data_dir, name)
    shutil.rmtree(out, ignore_errors=True)
    return out


def adamw(name, dtype, steps):
    torch.manual_seed(3)
    xtr, ytr, xte, yte = moons(32, 8, 3)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    train_and_record(fresh(name), model, xtr.double(), ytr, xte.double(), yte, opt, steps, 8, sched, seed=3,
                     description=f"make_torch_fixture.py: MLP 2-8-8-2 ReLU, AdamW lr 0.02 wd 0.05 cosine, batch 8 of 32 moons, {dtype}")


def nesterov():
    torch.manual_seed(4)
    xtr, ytr, xte, yte = moons(32, 8, 4)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    train_and_record(fresh("torch-nesterov"), model, xtr.double(), ytr, xte.double(), yte, opt, 25, 8, sched, seed=4,
                     description="make_torch_fixture.py: MLP 2-8-2 Tanh, SGD nesterov 0.9 wd 1e-3 lr 0.2 StepLR(10, 0.5), batch 8 of 32 moons")


def cnn_momentum():
    torch.manual_seed(5)
    g = torch.Generator().manual_seed(5)
    xtr, xte = torch.rand(12, 1, 8, 8, generator=g, dtype=torch.float64), torch.rand(4, 1, 8, 8, generator=g, dtype=torch.float64)
    ytr, yte = torch.arange(12) % 3, torch.arange(4) % 3
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.8, dampening=0.3, weight_decay=1e-3)
    train_and_record(fresh("torch-cnn-momentum"), model, xtr, ytr, xte, yte, opt, 10, 0, None, seed=5,
                     description="make_torch_fixture.py: CNN conv(1->2, 3x3, pad 1) ReLU maxpool 2 linear(32, 3), SGD momentum 0.8 dampening 0.3 wd 1e-3 lr 0.3, full batch of 12 random 8x8 images")


if __name__ == "__main__":
    init_mlp()
    adamw("torch-adamw", torch.float64, 40)
    adamw("torch-adamw-f32", torch.float32, 20)
    nesterov()
    cnn_momentum()
    for name in ("torch-adamw", "torch-adamw-f32", "torch-nesterov", "torch-cnn-momentum"):
        d = os.path.join(data_dir, name)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{name}: {len(os.listdir(d))} files, {size} bytes")
