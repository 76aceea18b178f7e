"""Record a PyTorch training loop so that `pathkernel import --from torch DIR --out RUN` can turn
it into a run directory (and `pathkernel kernel --run RUN` into its exact path kernel).

Add three calls to a float64 training loop with plain gradient steps:

    rec = TrajectoryRecorder("DIR", model, x_train, y_train, x_test, y_test,
                             loss="cross_entropy", optimizer="sgd")
    rec.start()                                   # writes w_0
    for step in range(n):
        batch = ...                               # indices into x_train (sgd), or None (gd)
        opt.zero_grad()
        F.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
        lr = opt.param_groups[0]["lr"]            # the lr this step uses
        opt.step()
        rec.step(lr, batch)                       # writes w_{s+1}, notes lr_s and the batch
    rec.finish()                                  # writes trajectory.json

What is written: `step_00000.safetensors` ... one `state_dict` (f64) per state,
`data.safetensors` (x_train, y_train, x_test, y_test) and `trajectory.json` (model structure,
optimizer, loss, learning rates, batches).

Requirements (checked here, and again by `pathkernel import` on the numbers):
- the model is `nn.Sequential(Linear, ReLU|Tanh, ..., Linear)` or
  `nn.Sequential(Conv2d, ReLU|Tanh, MaxPool2d, Flatten, Linear)`, in float64;
- the loss is the *mean* `F.cross_entropy` on the logits (class labels, int64) or `F.mse_loss`;
- the update is a plain gradient step `w <- w - lr * grad` (torch.optim.SGD without momentum,
  weight decay or nesterov): full batch (`optimizer="gd"`) or the recorded batch (`"sgd"`).
  Momentum, Adam and the like are refused: their updates depend on optimizer state (buffers,
  moments) that such a recording does not hold, so the states alone do not give the kernel.

`python scripts/record_torch_trajectory.py OUT [--steps N] [--sgd BATCH] [--mnist DIR --n-train M ...]`
runs a demo: a 2-layer MLP on a small two-moons-like dataset (or on MNIST IDX files).
"""

import argparse
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file


def _describe(model):
    layers = list(model.children()) if isinstance(model, nn.Sequential) else None
    if not layers:
        raise ValueError("the model must be an nn.Sequential (Linear/activation layers, or Conv2d, act, MaxPool2d, Flatten, Linear)")
    acts = {nn.ReLU: "relu", nn.Tanh: "tanh"}
    if isinstance(layers[0], nn.Linear):
        act = None
        for i, layer in enumerate(layers):
            if i % 2 == 0:
                if not isinstance(layer, nn.Linear):
                    raise ValueError(f"layer {i} is {layer}; expected Linear at even positions")
            else:
                kind = acts.get(type(layer))
                if kind is None or (act is not None and kind != act):
                    raise ValueError(f"layer {i} is {layer}; expected one ReLU or Tanh kind between Linear layers")
                act = kind
        if len(layers) % 2 == 0:
            raise ValueError("the model must end with a Linear layer")
        return {"kind": "mlp", "activation": act or "relu"}
    if isinstance(layers[0], nn.Conv2d) and len(layers) == 5:
        conv, a, pool, flat, lin = layers
        if type(a) not in acts or not isinstance(pool, nn.MaxPool2d) or not isinstance(flat, nn.Flatten) or not isinstance(lin, nn.Linear):
            raise ValueError("a CNN must be Sequential(Conv2d, ReLU|Tanh, MaxPool2d, Flatten, Linear)")
        k = pool.kernel_size if isinstance(pool.kernel_size, int) else pool.kernel_size[0]
        stride = pool.stride if isinstance(pool.stride, int) else pool.stride[0]
        if stride != k or pool.padding not in (0, (0, 0)):
            raise ValueError("MaxPool2d must be non-overlapping (stride = kernel_size, no padding)")
        return {
            "kind": "cnn",
            "activation": acts[type(a)],
            "stride": conv.stride[0],
            "padding": conv.padding[0],
            "pool": k,
        }
    raise ValueError(f"unsupported model structure: {model}")


class TrajectoryRecorder:
    """Writes a recording directory for `pathkernel import --from torch` (see the module docs)."""

    def __init__(self, out_dir, model, x_train, y_train, x_test, y_test, loss="cross_entropy", optimizer="gd", torch_optimizer=None, description=""):
        if optimizer not in ("gd", "sgd"):
            raise ValueError(
                f"optimizer {optimizer!r}: only plain gd or sgd steps can be imported; momentum, Adam and the like "
                "need optimizer state (buffers, moments) that the recording does not have"
            )
        if torch_optimizer is not None:
            if not isinstance(torch_optimizer, torch.optim.SGD):
                raise ValueError(f"{type(torch_optimizer).__name__}: only torch.optim.SGD (plain steps) can be imported; its kernel would need the optimizer state")
            for g in torch_optimizer.param_groups:
                if g.get("momentum", 0) or g.get("weight_decay", 0) or g.get("nesterov", False):
                    raise ValueError("torch.optim.SGD with momentum, weight decay or nesterov: not a plain gradient step")
        if loss not in ("cross_entropy", "mse"):
            raise ValueError(f"loss {loss!r}: expected cross_entropy (mean, on logits) or mse (mean)")
        for name, p in model.state_dict().items():
            if p.dtype != torch.float64:
                raise ValueError(f"{name} is {p.dtype}; record a float64 model (model.double())")
        self.out = out_dir
        self.model = model
        self.spec = _describe(model)
        self.loss = loss
        self.optimizer = optimizer
        self.description = description
        self.lrs = []
        self.batches = []
        self.steps = 0
        xs = x_train.shape[1:]
        if self.spec["kind"] == "cnn":
            if len(xs) != 3:
                raise ValueError("a CNN's x_train must be images [M, C, H, W]")
            self.spec["image"] = list(xs)
        os.makedirs(out_dir, exist_ok=True)
        to64 = lambda t: t.detach().to(torch.float64).contiguous()
        ylab = lambda t: t.detach().to(torch.int64).contiguous() if loss == "cross_entropy" else to64(t)
        save_file(
            {"x_train": to64(x_train), "y_train": ylab(y_train), "x_test": to64(x_test), "y_test": ylab(y_test)},
            os.path.join(out_dir, "data.safetensors"),
        )

    def _save(self, s):
        sd = {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}
        save_file(sd, os.path.join(self.out, f"step_{s:05d}.safetensors"), metadata={"step": str(s)})

    def start(self):
        """Writes w_0 (call before the first update)."""
        self._save(0)

    def step(self, lr, batch=None):
        """Call after each optimizer step: writes w_{s+1}; `lr` is the step's learning rate,
        `batch` its training-row indices (sgd) or None (gd: every row)."""
        if (batch is None) != (self.optimizer == "gd"):
            raise ValueError("gd steps take batch=None; sgd steps need the batch indices")
        self.lrs.append(float(lr))
        if batch is not None:
            self.batches.append([int(i) for i in batch])
        self.steps += 1
        self._save(self.steps)

    def finish(self):
        """Writes trajectory.json."""
        rec = {
            "format": "pathkernel-torch-trajectory",
            "version": 1,
            "model": self.spec,
            "optimizer": self.optimizer,
            "loss": self.loss,
            "learning_rates": self.lrs,
            "description": self.description,
        }
        if self.optimizer == "sgd":
            rec["batches"] = self.batches
        with open(os.path.join(self.out, "trajectory.json"), "w") as f:
            json.dump(rec, f)
            f.write("\n")


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


def main():
    ap = argparse.ArgumentParser(description="demo: record a 2-layer MLP trained with plain GD/SGD in float64")
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--hidden", type=int, default=8)
    ap.add_argument("--sgd", type=int, default=0, help="mini-batch size (0: full-batch gd)")
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
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    mode = "sgd" if a.sgd else "gd"
    rec = TrajectoryRecorder(a.out, model, xtr, ytr, xte, yte, loss="cross_entropy", optimizer=mode, torch_optimizer=opt,
                             description=f"record_torch_trajectory.py demo: {'mnist' if a.mnist else 'moons'}, {mode}, seed {a.seed}")
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
