"""Record a PyTorch training loop so that `pathkernel import --from torch DIR --out RUN` can turn
it into a run directory (and `pathkernel kernel --run RUN` into its exact path kernel).

Add three calls to a training loop (four with gradient clipping):

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)   # SGD, Adam, RMSprop, Adagrad
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=n)  # any scheduler
    rec = TrajectoryRecorder("DIR", model, x_train, y_train, x_test, y_test,
                             loss="cross_entropy", optimizer=opt)
    rec.start()                                   # writes w_0
    for step in range(n):
        batch = ...                               # indices into x_train, or None (full batch)
        opt.zero_grad()
        F.cross_entropy(model(x_train[batch]), y_train[batch]).backward()
        rec.clip_grad_norm_(1.0)                  # optional: torch's clip_grad_norm_, factor recorded
        opt.step()                                # the recorder notes the lr (and momentum) used
        rec.step(batch=batch)                     # writes w_{s+1} and the batch
        sched.step()
    rec.finish()                                  # writes trajectory.json

What is written: `step_00000.safetensors` ... one `state_dict` per state (float64 or float32,
as trained; metadata `step`), `data.safetensors` (x_train, y_train, x_test, y_test in float64)
and `trajectory.json` (version 2: model structure, the optimizer's class and every
hyper-parameter, the precision, loss, the learning rate every step used, the momentum / beta1 of
every step when a scheduler cycled it, the clip factor of every step, batches).

The learning rate and momentum of each step are read by an optimizer step pre-hook, so any
scheduler (or hand-set `param_groups[0]["lr"]`) is recorded as used, zero included; a scheduler
changing any other hyper-parameter is refused at that step. The optimizer must have one
parameter group holding every parameter of the model and must not have stepped yet.

Requirements (checked here, and again by `pathkernel import` on the numbers):
- the model is an `nn.Sequential` of the layers of `scripts/torch_model.py`'s convention, or a
  module computing a pathkernel layer stack under its own tensor names that says so with a
  method `pathkernel_stack()` (the layers and the name mapping; see `describe_model`), in
  float64 or float32 (half precision is refused: its rounding is as large as the updates);
  `describe_model` writes it;
- the loss is the *mean* `F.cross_entropy` on the logits (class labels, int64) or `F.mse_loss`;
- the optimizer is `torch.optim.SGD`, `Adam`, `AdamW`, `RMSprop` or `Adagrad`; options the
  import does not replay (amsgrad, maximize, RMSprop's momentum, Nesterov with a cycled momentum,
  clipping by value) are recorded as set and refused by the import in one line naming why.

The legacy form `optimizer="gd"` / `"sgd"` with `rec.step(lr, batch)` still writes a version-1
recording of plain gradient steps.
"""

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from .describe import describe_module


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
    which `pathkernel import` builds or refuses, naming the module. A stack whose first child is an
    embedding (`nn.Embedding`, torch_model.ScaledEmbedding) takes rows of token ids: `vocab` (its
    number of embeddings) is written beside `input` [T].

    A module that is not an nn.Sequential of layers but computes a pathkernel layer stack under
    its own tensor names (ExPLAIND's transformer, scripts/grokking_torch.py) says so with a method
    `pathkernel_stack()` returning `{"layers": [...], "names": {...}, "vocab": V}` (`vocab` only for
    token rows): the layers in pathkernel's syntax (the `layers` of a `[model] kind = "layers"`
    configuration, as JSON), `names` mapping each of the stack's parameter names (`0.weight`,
    `1.head1_encoder.weight`, ...) to the module's `state_dict` name. It is written as kind
    `stack`; the import checks the mapping against the stack's parameters and every recorded
    tensor's shape against the stack's."""
    stack = getattr(model, "pathkernel_stack", None)
    if callable(stack):
        st = stack()
        sd = model.state_dict()
        names = dict(st["names"])
        if sorted(names.values()) != sorted(sd):
            raise ValueError(f"pathkernel_stack()['names'] must name every state_dict tensor once: "
                             f"missing {sorted(set(sd) - set(names.values()))}, unknown {sorted(set(names.values()) - set(sd))}")
        out = {"kind": "stack", "input": [int(v) for v in sample_shape], "layers": list(st["layers"]), "names": names}
        if st.get("vocab") is not None:
            out["vocab"] = int(st["vocab"])
        return out
    try:
        return _describe(model)
    except ValueError:
        children = list(model.children()) if isinstance(model, nn.Sequential) else [model]
        out = {"kind": "layers", "input": [int(v) for v in sample_shape], "modules": [describe_module(c) for c in children]}
        first = out["modules"][0] if out["modules"] else {}
        if "num_embeddings" in first:
            # Rows of token ids: the first module's vocabulary.
            out["vocab"] = first["num_embeddings"]
        return out


def _scalar(v):
    return float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def _fresh(opt):
    """Whether `opt` has taken no step: no state, or only the state its constructor creates
    (Adagrad's `step` 0 and `sum` at `initial_accumulator_value`)."""
    for st in opt.state.values():
        for key, v in st.items():
            if key == "step":
                if _scalar(v) != 0:
                    return False
            elif not (isinstance(opt, torch.optim.Adagrad) and key == "sum"):
                return False
    return True


# The hyper-parameters a scheduler may change per step (recorded per step), and those it must not.
_CYCLED = {"SGD": ("momentum", None), "Adam": ("betas", 0), "AdamW": ("betas", 0)}


def _cycled_momentum(cls, g):
    key, i = _CYCLED.get(cls, (None, None))
    if key is None:
        return None
    return _scalar(g[key] if i is None else g[key][i])


def describe_optimizer(opt, model):
    """The `optimizer` entry of a version-2 trajectory.json: the class and every hyper-parameter
    the import replays (amsgrad, maximize and RMSprop's momentum recorded as set; the import
    refuses them, naming why)."""
    if len(opt.param_groups) != 1:
        raise ValueError(f"{len(opt.param_groups)} parameter groups: record one group holding every parameter (one set of hyper-parameters)")
    g = opt.param_groups[0]
    if {id(p) for p in g["params"]} != {id(p) for p in model.parameters()}:
        raise ValueError("the optimizer's parameters are not exactly the model's")
    if not _fresh(opt):
        raise ValueError("the optimizer has already taken steps (momentum buffers, moments): record from a fresh optimizer")
    name = type(opt).__name__
    if isinstance(opt, torch.optim.SGD):
        return {"class": "SGD", "lr": _scalar(g["lr"]), "momentum": _scalar(g["momentum"]), "dampening": _scalar(g["dampening"]),
                "nesterov": bool(g["nesterov"]), "weight_decay": _scalar(g["weight_decay"]), "maximize": bool(g["maximize"])}
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):  # AdamW: Adam with decoupled weight decay
        decoupled = bool(g.get("decoupled_weight_decay", isinstance(opt, torch.optim.AdamW)))
        return {"class": "AdamW" if decoupled else "Adam", "lr": _scalar(g["lr"]), "betas": [_scalar(b) for b in g["betas"]],
                "eps": _scalar(g["eps"]), "weight_decay": _scalar(g["weight_decay"]), "amsgrad": bool(g["amsgrad"]), "maximize": bool(g["maximize"])}
    if isinstance(opt, torch.optim.RMSprop):
        return {"class": "RMSprop", "lr": _scalar(g["lr"]), "alpha": _scalar(g["alpha"]), "eps": _scalar(g["eps"]), "weight_decay": _scalar(g["weight_decay"]),
                "momentum": _scalar(g["momentum"]), "centered": bool(g["centered"]), "maximize": bool(g["maximize"])}
    if isinstance(opt, torch.optim.Adagrad):
        return {"class": "Adagrad", "lr": _scalar(g["lr"]), "lr_decay": _scalar(g["lr_decay"]), "eps": _scalar(g["eps"]),
                "weight_decay": _scalar(g["weight_decay"]), "initial_accumulator_value": _scalar(g["initial_accumulator_value"]),
                "maximize": bool(g["maximize"])}
    # Recorded by class: the import refuses it in one line, naming the class.
    return {"class": name, "lr": _scalar(g["lr"])}


class TrajectoryRecorder:
    """Writes a recording directory for `pathkernel import --from torch` (see the module docs)."""

    def __init__(self, out_dir, model, x_train, y_train, x_test, y_test, loss="cross_entropy", optimizer="gd", torch_optimizer=None, description=""):
        if isinstance(optimizer, torch.optim.Optimizer):
            torch_optimizer, optimizer = optimizer, None
        if optimizer is not None and optimizer not in ("gd", "sgd"):
            raise ValueError(f"optimizer {optimizer!r}: pass the torch.optim optimizer itself (SGD, Adam, AdamW, RMSprop, Adagrad), or 'gd'/'sgd' for plain steps")
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
        self.momenta = []
        self.clip = None
        self.clip_factors = []
        self._pending_clip = None
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
        g = opt.param_groups[0]
        self._pending_lr = _scalar(g["lr"])
        if self.opt_spec is None:
            return
        cls = self.opt_spec["class"]
        self._pending_momentum = _cycled_momentum(cls, g)
        # Everything else must stay as described: a scheduler changing it is not replayed.
        for key, want in self.opt_spec.items():
            if key in ("lr", "class", "momentum") or (key == "betas" and cls in ("Adam", "AdamW")):
                continue
            got = g.get(key)
            got = [_scalar(b) for b in got] if isinstance(want, list) else (bool(got) if isinstance(want, bool) else _scalar(got))
            if got != want:
                raise ValueError(f"step {self.steps}: {cls}'s {key} changed from {want} to {got}; only the learning rate and the momentum (beta1) may change per step")
        if cls in ("Adam", "AdamW") and _scalar(g["betas"][1]) != self.opt_spec["betas"][1]:
            raise ValueError(f"step {self.steps}: {cls}'s beta2 changed; only the learning rate and beta1 may change per step")
        if cls not in _CYCLED and "momentum" in self.opt_spec and _scalar(g["momentum"]) != self.opt_spec["momentum"]:
            raise ValueError(f"step {self.steps}: {cls}'s momentum changed; it is not replayed per step")

    def _grads(self):
        return [p for p in self.model.parameters() if p.grad is not None]

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """`torch.nn.utils.clip_grad_norm_` on the model's gradients (call between `backward()`
        and `opt.step()`), recording the factor it multiplied them by:
        `min(1, max_norm / (total_norm + 1e-6))`, computed as torch computes it. Returns the
        total norm, as torch's does."""
        self._check_clip("norm")
        norm_type = float(norm_type)
        total = torch.nn.utils.clip_grad_norm_(self._grads(), max_norm, norm_type=norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        self.clip = {"kind": "norm", "max_norm": float(max_norm), "norm_type": "inf" if norm_type == float("inf") else norm_type}
        self._pending_clip = float(coef.item())
        return total

    def clip_grad_value_(self, clip_value):
        """`torch.nn.utils.clip_grad_value_` on the model's gradients, recorded as such (the import
        refuses it, naming why: a per-coordinate factor before the optimizer's buffer)."""
        self._check_clip("value")
        torch.nn.utils.clip_grad_value_(self._grads(), clip_value)
        self.clip = {"kind": "value", "clip_value": float(clip_value)}
        self._pending_clip = 1.0

    def _check_clip(self, kind):
        if self.opt_spec is None:
            raise ValueError("gradient clipping needs a version-2 recording: pass the torch optimizer as optimizer=")
        if self.clip is not None and self.clip["kind"] != kind:
            raise ValueError(f"clipping by {kind} after clipping by {self.clip['kind']}: one kind of clipping per recording")
        if self._pending_clip is not None:
            raise ValueError("the gradient was clipped twice before one optimizer step")

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
        if self.opt_spec is not None:
            self.momenta.append(getattr(self, "_pending_momentum", None))
            self.clip_factors.append(1.0 if self._pending_clip is None else self._pending_clip)
            self._pending_clip = None
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
            # Momenta per step only when a scheduler changed them (cycle_momentum).
            if self.momenta and None not in self.momenta and len(set(self.momenta)) > 1:
                rec["momenta"] = self.momenta
            if self.clip is not None:
                rec["clip"] = dict(self.clip, factors=self.clip_factors) if self.clip["kind"] == "norm" else self.clip
            self._hook.remove()
        with open(os.path.join(self.out, "trajectory.json"), "w") as f:
            json.dump(rec, f)
            f.write("\n")


def train_and_record(out, model, xtr, ytr, xte, yte, opt, steps, batch_size=0, sched=None, seed=0, description="", loss="cross_entropy", clip_norm=None, clip_value=None, quiet=False):
    """Trains `model` for `steps` optimizer steps (mini-batches of `batch_size` drawn by epoch-wise
    permutations of a seeded generator, 0: full batch), clipping the gradient by norm
    (`clip_norm`) or by value (`clip_value`) when given, stepping `sched` after each, and
    records the run into `out` (version 2). Returns the recorder."""
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
        if clip_norm is not None:
            rec.clip_grad_norm_(clip_norm)
        if clip_value is not None:
            rec.clip_grad_value_(clip_value)
        opt.step()
        rec.step(batch=batch)
        if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
            sched.step(value.item())
        elif sched is not None:
            sched.step()
        if not quiet and (s == 0 or s + 1 == steps):
            print(f"step {s}: batch loss {value.item():.6f}")
    rec.finish()
    return rec
