"""Record a PyTorch training loop so that `pathkernel import --from torch DIR --out RUN` can turn
it into a run directory (and `pathkernel kernel --run RUN` into its exact path kernel).

Add three calls to a training loop:

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)   # or SGD, Adam
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n)          # any scheduler
    rec = TrajectoryRecorder("DIR", model, x_train, y_train, x_test, y_test,
                             loss="cross_entropy", optimizer=opt)
    rec.start()                                   # writes w_0
    for step in range(n):
        batch = ...                               # indices into x_train, or None (full batch)
        opt.zero_grad()
        F.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
        opt.step()                                # the recorder notes the lr this step used
        rec.step(batch=batch)                     # writes w_{s+1} and the batch
        sched.step()
    rec.finish()                                  # writes trajectory.json

What is written: `step_00000.safetensors` ... one `state_dict` per state (float64 or float32,
as trained; metadata `step`), `data.safetensors` (x_train, y_train, x_test, y_test in float64)
and `trajectory.json` (version 2: model structure, the optimizer's class and every
hyper-parameter, the precision, loss, the learning rate every step used, batches).

The learning rate of each step is read by an optimizer step pre-hook, so any scheduler (or
hand-set `param_groups[0]["lr"]`) is recorded as used. The optimizer must have one parameter
group holding every parameter of the model, and no state yet (a fresh optimizer).

Requirements (checked here, and again by `pathkernel import` on the numbers):
- the model is an `nn.Sequential` of the layers of `scripts/torch_model.py`'s convention
  (Linear, Conv2d, MaxPool2d, AvgPool2d, Flatten, LayerNorm, ChannelLayerNorm, the activation
  modules ReLU, LeakyReLU, Tanh, Sigmoid, Softplus, GELU(), SiLU, and torch_model.Residual), in
  float64 or float32 (half precision is refused: its rounding is as large as the updates). A
  version-2 recording writes every child's class, repr and attributes (`torch_model.
  describe_module`) and the sample shape; `pathkernel import` builds the layer stack from them
  and refuses, naming the module, what it cannot express: batch norm, dropout in training mode,
  any other module. An MLP `Linear, ReLU|Tanh, ..., Linear` or the one-conv CNN
  `Conv2d, ReLU|Tanh, MaxPool2d, Flatten, Linear` is written as `mlp` / `cnn` instead (imported
  as pathkernel's MLP and CNN, whose kernels have factored fast paths; `describe_model`). The
  legacy version-1 form takes those two only.
- the loss is the *mean* `F.cross_entropy` on the logits (class labels, int64) or `F.mse_loss`;
- the optimizer is `torch.optim.SGD` (momentum, dampening, nesterov, weight_decay), `Adam` or
  `AdamW` (betas, eps, weight_decay). `amsgrad` is recorded as set and refused by the import
  (its preconditioner is a running maximum the import does not replay), as is `maximize`.

The legacy form `optimizer="gd"` / `"sgd"` with `rec.step(lr, batch)` still writes a version-1
recording of plain gradient steps.

`python scripts/record_torch_trajectory.py OUT [--steps N] [--sgd BATCH] [--optim adamw|sgd-nesterov|...]`
runs a demo: a 2-layer MLP on a small two-moons-like dataset (or on MNIST IDX files).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_model import describe_module  # noqa: E402


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


def describe_model(model, sample_shape):
    """The `model` entry of a version-2 trajectory.json. An MLP (`Linear, ReLU|Tanh, ...,
    Linear`) or the one-conv CNN is written as such (`mlp`, `cnn`: pathkernel imports them as its
    MLP and CNN, whose kernels have factored fast paths); any other module as a layer stack
    (`layers`: the sample shape and every child of the nn.Sequential, torch_model.describe_module),
    which `pathkernel import` builds or refuses, naming the module."""
    try:
        return _describe(model)
    except ValueError:
        children = list(model.children()) if isinstance(model, nn.Sequential) else [model]
        return {"kind": "layers", "input": [int(v) for v in sample_shape], "modules": [describe_module(c) for c in children]}


def _scalar(v):
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def describe_optimizer(opt, model):
    """The `optimizer` entry of a version-2 trajectory.json: the class and every hyper-parameter
    the import replays (amsgrad and maximize recorded as set; the import refuses them)."""
    if len(opt.param_groups) != 1:
        raise ValueError(f"{len(opt.param_groups)} parameter groups: record one group holding every parameter (one set of hyper-parameters)")
    g = opt.param_groups[0]
    if {id(p) for p in g["params"]} != {id(p) for p in model.parameters()}:
        raise ValueError("the optimizer's parameters are not exactly the model's")
    if any(len(s) for s in opt.state.values()):
        raise ValueError("the optimizer already has state (momentum buffers, moments): record from a fresh optimizer")
    name = type(opt).__name__
    if isinstance(opt, torch.optim.SGD):
        return {"class": "SGD", "lr": _scalar(g["lr"]), "momentum": _scalar(g["momentum"]), "dampening": _scalar(g["dampening"]),
                "nesterov": bool(g["nesterov"]), "weight_decay": _scalar(g["weight_decay"]), "maximize": bool(g["maximize"])}
    if isinstance(opt, torch.optim.Adam):  # AdamW is an Adam with decoupled weight decay
        decoupled = bool(g.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW)))
        return {"class": "AdamW" if decoupled else "Adam", "lr": _scalar(g["lr"]), "betas": [_scalar(b) for b in g["betas"]],
                "eps": _scalar(g["eps"]), "weight_decay": _scalar(g["weight_decay"]), "amsgrad": bool(g["amsgrad"]), "maximize": bool(g["maximize"])}
    if isinstance(opt, torch.optim.AdamW):
        return {"class": "AdamW", "lr": _scalar(g["lr"]), "betas": [_scalar(b) for b in g["betas"]], "eps": _scalar(g["eps"]),
                "weight_decay": _scalar(g["weight_decay"]), "amsgrad": bool(g["amsgrad"]), "maximize": bool(g["maximize"])}
    raise ValueError(f"{name}: the import replays torch.optim.SGD, Adam and AdamW")


class TrajectoryRecorder:
    """Writes a recording directory for `pathkernel import --from torch` (see the module docs)."""

    def __init__(self, out_dir, model, x_train, y_train, x_test, y_test, loss="cross_entropy", optimizer="gd", torch_optimizer=None, description=""):
        if isinstance(optimizer, torch.optim.Optimizer):
            torch_optimizer, optimizer = optimizer, None
        if optimizer is not None and optimizer not in ("gd", "sgd"):
            raise ValueError(f"optimizer {optimizer!r}: pass the torch.optim optimizer itself (SGD, Adam, AdamW), or 'gd'/'sgd' for plain steps")
        self.opt = torch_optimizer
        self.optimizer = optimizer
        if optimizer is not None and torch_optimizer is not None:
            if not isinstance(torch_optimizer, torch.optim.SGD):
                raise ValueError(f"{type(torch_optimizer).__name__} with optimizer={optimizer!r}: pass the optimizer itself as optimizer=")
            for g in torch_optimizer.param_groups:
                if g.get("momentum", 0) or g.get("weight_decay", 0) or g.get("nesterov", False):
                    raise ValueError("torch.optim.SGD with momentum, weight decay or nesterov: pass it as optimizer= (a version-2 recording)")
        self.opt_spec = describe_optimizer(torch_optimizer, model) if optimizer is None else None
        if loss not in ("cross_entropy", "mse"):
            raise ValueError(f"loss {loss!r}: expected cross_entropy (mean, on logits) or mse (mean)")
        dtypes = {p.dtype for p in model.state_dict().values() if p.is_floating_point()}
        if len(dtypes) != 1 or next(iter(dtypes)) not in (torch.float64, torch.float32):
            raise ValueError(f"the model's tensors are {sorted(map(str, dtypes))}: record a float64 (model.double()) or float32 model; "
                             "half precision rounds the updates as much as they move")
        self.dtype = "float64" if torch.float64 in dtypes else "float32"
        if optimizer is not None and self.dtype != "float64":
            raise ValueError("a version-1 (gd/sgd) recording is float64: record a float32 model with optimizer=<torch optimizer>")
        self.out = out_dir
        self.model = model
        if self.opt_spec is None:
            self.spec = _describe(model)
        else:
            self.spec = describe_model(model, x_train.shape[1:])
        self.loss = loss
        self.description = description
        self.lrs = []
        self.batches = []
        self.steps = 0
        self._pending_lr = None
        if self.opt is not None:
            self._hook = self.opt.register_step_pre_hook(self._note_lr)
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

    def _note_lr(self, opt, args, kwargs):
        self._pending_lr = _scalar(opt.param_groups[0]["lr"])

    def _save(self, s):
        sd = {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}
        save_file(sd, os.path.join(self.out, f"step_{s:05d}.safetensors"), metadata={"step": str(s)})

    def start(self):
        """Writes w_0 (call before the first update)."""
        self._save(0)

    def step(self, lr=None, batch=None):
        """Call after each optimizer step: writes w_{s+1}; `batch` is the step's training-row
        indices, or None for every row. The learning rate is the one the optimizer used (noted by
        the step pre-hook); `lr` is only for the legacy gd/sgd form without an optimizer."""
        if self.optimizer is not None and (batch is None) != (self.optimizer == "gd"):
            raise ValueError("gd steps take batch=None; sgd steps need the batch indices")
        if self._pending_lr is not None:
            if lr is not None and float(lr) != self._pending_lr:
                raise ValueError(f"lr {lr} given, but the optimizer stepped with {self._pending_lr}")
            lr, self._pending_lr = self._pending_lr, None
        elif self.opt is not None:
            raise ValueError("rec.step() without an optimizer step since the last one")
        if lr is None:
            raise ValueError("the step's learning rate is unknown: pass the optimizer to the recorder, or lr=")
        if self.steps > 0 and (batch is None) != (not self.batches):
            raise ValueError("every step needs a batch, or none does (full batch)")
        self.lrs.append(float(lr))
        if batch is not None:
            self.batches.append([int(i) for i in (batch.tolist() if isinstance(batch, torch.Tensor) else batch)])
        self.steps += 1
        self._save(self.steps)

    def finish(self):
        """Writes trajectory.json."""
        if self.opt_spec is None:
            rec = {"format": "pathkernel-torch-trajectory", "version": 1, "model": self.spec, "optimizer": self.optimizer,
                   "loss": self.loss, "learning_rates": self.lrs, "description": self.description}
            if self.optimizer == "sgd":
                rec["batches"] = self.batches
            if self.opt is not None:
                self._hook.remove()
        else:
            rec = {"format": "pathkernel-torch-trajectory", "version": 2, "model": self.spec, "optimizer": self.opt_spec,
                   "dtype": self.dtype, "loss": self.loss, "learning_rates": self.lrs, "description": self.description}
            if self.batches:
                rec["batches"] = self.batches
            self._hook.remove()
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


def train_and_record(out, model, xtr, ytr, xte, yte, opt, steps, batch_size=0, sched=None, seed=0, description="", loss="cross_entropy"):
    """Trains `model` for `steps` optimizer steps (mini-batches of `batch_size` drawn by epoch-wise
    permutations of a seeded generator, 0: full batch), stepping `sched` after each, and records
    the run into `out` (version 2). Returns the recorder."""
    rec = TrajectoryRecorder(out, model, xtr, ytr, xte, yte, loss=loss, optimizer=opt, description=description)
    lossf = F.cross_entropy if loss == "cross_entropy" else F.mse_loss
    dt = next(model.parameters()).dtype
    g = torch.Generator().manual_seed(seed)
    rec.start()
    perm, pos = None, 0
    for s in range(steps):
        if batch_size:
            if perm is None or pos + batch_size > len(perm):
                perm, pos = torch.randperm(xtr.shape[0], generator=g), 0
            batch = perm[pos : pos + batch_size]
            pos += batch_size
        else:
            batch = None
        xb, yb = (xtr, ytr) if batch is None else (xtr[batch], ytr[batch])
        opt.zero_grad()
        value = lossf(model(xb.to(dt)), yb)
        value.backward()
        opt.step()
        rec.step(batch=batch)
        if sched is not None:
            sched.step()
        if s == 0 or s + 1 == steps:
            print(f"step {s}: batch loss {value.item():.6f}")
    rec.finish()
    return rec


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
