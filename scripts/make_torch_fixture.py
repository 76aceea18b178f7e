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

- tests/data/torch-stack-adamw: a float64 layer stack (conv + residual blocks + layer norm /
  GELU, `STACK` below, torch_model.Residual and ChannelLayerNorm) on 24 8x8 images of 3 classes,
  AdamW (lr 0.01, weight decay 0.05), 30 steps of mini-batches of 8. Its module structure is
  what `pathkernel import` reads.
- tests/data/torch-stack: the round trip PyTorch -> `[model] init` -> train -> export ->
  PyTorch of the same stack: `roundtrip.toml` starts a pathkernel run from the recording's w_0
  (PyTorch's initialisation) and trains 10 AdamW steps; this script runs it with the binary
  given by --pathkernel (default target/release/pathkernel), exports the last state, runs the
  exported file through torch_model.load and stores the logits on the recording's test images in
  `roundtrip-logits.safetensors` (`logits` [8, 3]); it prints the largest difference between
  them and pathkernel's own network. tests/torch_stacks.rs reruns the pathkernel half and
  compares its export with the stored PyTorch logits. `recorded-logits.safetensors` holds the
  recorded PyTorch model's own logits at its last state on the same images (`logits` [8, 3]):
  the imported run's network must be them.
- tests/data/torch-recipes/*: float64 ReLU MLPs 2-8-2, 20 steps of batches of 8 of 32 two-moons
  points, one per recipe the import replays beyond the plain ones (tests/torch.rs):
  `onecycle-clip` AdamW (wd 0.01) with OneCycleLR's defaults (beta1 cycled 0.85-0.95, lr down to
  4e-8) and clip_grad_norm_(0.3); `cyclic-clip` SGD momentum 0.9, dampening 0.1, wd 1e-3 with
  CyclicLR (momentum cycled) and clip_grad_norm_(0.3); `adagrad-warmup` Adagrad (lr 0.1,
  lr_decay 0.01, initial accumulator 0.1, wd 1e-3) with a LambdaLR warm-up from lr 0;
  `rmsprop-f32` RMSprop centred (lr 0.01, alpha 0.9, wd 1e-3) in float32 with
  CosineAnnealingLR(T_max=19): lr 0 at the last step.

- tests/data/torch-transformer-adamw: ExPLAIND's one-layer transformer block as torch_model's
  modules (`nn.Sequential(ScaledEmbedding(9, 8, scale=sqrt(8)), SelfAttention(8, heads=2,
  shared q = k = v), LastToken(), Residual(Linear(8, 16), ReLU, Linear(16, 8), ReLU),
  Linear(8, 9, bias=False))`) on `a + b mod 7` as token ids `[a, 7, b, 8]` (14 of the 28 pairs
  a >= b for training, the rest held out), float64, AdamW (lr 0.01, betas 0.9/0.98, weight decay
  1), full batch, 10 steps; `logits.safetensors` beside it holds the recorded model's logits at
  its last state on the held-out pairs (`logits` [14, 9]): the imported run's network must be
  them (tests/transformer.rs).

- tests/data/torch-mha-adamw: a pre-norm transformer block on PyTorch's own
  nn.MultiheadAttention (`MHA_STACK` below: torch_model.ScaledEmbedding with a learned position
  embedding, Residual(LayerNorm, MHSelfAttention(6, 2 heads, bias, causal)), LastToken,
  Residual(LayerNorm, Linear, ReLU, Linear), Linear(6, 7)) on `a + b mod 7` as token ids
  `[a, 7, b, 8]` (2 of the 4 pairs a >= b of each class for training, the 14 others held
  out), float64, AdamW
  (lr 0.02, betas 0.9/0.98, weight decay 0.1) under a linear warm-up (4 steps) then cosine
  decay (LambdaLR), 30 steps of mini-batches of 8; `logits.safetensors` holds the recorded
  model's logits at its last state on the held-out pairs (`logits` [14, 7]).
- tests/data/torch-mha: the round trip PyTorch -> `[model] init` -> train -> export -> PyTorch
  of the same block (`roundtrip.toml`: the recording's w_0, 12 AdamW steps with a cosine
  schedule here); `roundtrip-logits.safetensors` holds PyTorch's forward (torch_model.load, the
  export loaded into MHSelfAttention's nn.MultiheadAttention by load_state_dict) of pathkernel's
  export of its last state, on the held-out pairs (`logits` [14, 7]) (tests/torch_mha.rs).

- tests/data/torch-grokking and torch-grokking-f32: ExPLAIND's transformer as one module
  (scripts/grokking_torch.py's GrokkingTransformer, its own tensor names `input_emb.weight`,
  `head{h}_encoder.weight`, …, `decoder.weight`) recorded by `grokking_torch.py --record`:
  `a + b mod 5`, d 8, 2 heads, m 16, 9 of the 15 pairs for training, AdamW lr 0.01 betas
  (0.9, 0.98) wd 1, init scale 1, 8 steps, float64 and float32. The recording's model is the
  layer stack with the name mapping (`pathkernel_stack()`); `logits.safetensors` holds the
  module's logits, run in float64 on the recorded last state, on the 6 held-out pairs (`logits`
  [6, 7]): the imported run's network must be them (tests/transformer.rs).

Each recording is written by the recorder package (python/pathkernel_recorder).

    python scripts/make_torch_fixture.py [--only torch-stack-adamw] [--pathkernel BIN]

(`--only torch-mha-adamw` also writes torch-mha.)
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
from safetensors.torch import save_file

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from record_torch_trajectory import _moons, train_and_record  # noqa: E402
from torch_model import ChannelLayerNorm, LastToken, MHSelfAttention, Residual, ScaledEmbedding, build_stack, load, read_safetensors  # noqa: E402

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


# The fixture stack as pathkernel's `[model] layers` (roundtrip.toml) and as PyTorch modules.
STACK_TOML = """layers = [
  { conv2d = { channels = 4, kernel = 3, padding = 1 } }, "relu", { avg_pool2d = 2 },
  { residual = [ { conv2d = { channels = 4, kernel = 3, padding = 1 } }, "layer_norm", "gelu", { conv2d = { channels = 4, kernel = 3, padding = 1 } } ] },
  { residual = [ { conv2d = { channels = 6, kernel = 3, stride = 2, padding = 1 } }, "gelu" ] },
  "flatten", "layer_norm", { dense = 3 },
]"""


def recipes():
    S = torch.optim.lr_scheduler
    made = {
        "onecycle-clip": (lambda p: torch.optim.AdamW(p, lr=0.02, weight_decay=0.01), lambda o: S.OneCycleLR(o, max_lr=0.02, total_steps=20), 0.3, torch.float64),
        "cyclic-clip": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3), lambda o: S.CyclicLR(o, 0.01, 0.1, step_size_up=5), 0.3, torch.float64),
        "adagrad-warmup": (lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=1e-3), lambda o: S.LambdaLR(o, lambda s: s / 4 if s < 4 else 1.0), None, torch.float64),
        "rmsprop-f32": (lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, centered=True, weight_decay=1e-3), lambda o: S.CosineAnnealingLR(o, T_max=19), None, torch.float32),
    }
    for i, (name, (make_opt, make_sched, clip, dtype)) in enumerate(made.items()):
        torch.manual_seed(10 + i)
        xtr, ytr, xte, yte = moons(32, 8, 10 + i)
        model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)).to(dtype)
        opt = make_opt(model.parameters())
        train_and_record(fresh(os.path.join("torch-recipes", name)), model, xtr.double(), ytr, xte.double(), yte, opt, 20, 8, make_sched(opt), seed=10 + i,
                         clip_norm=clip, description=f"make_torch_fixture.py: MLP 2-8-2 ReLU, recipe {name}, batch 8 of 32 moons, {dtype}")


def stack():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        Residual(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), ChannelLayerNorm(4), nn.GELU(), nn.Conv2d(4, 4, 3, padding=1))),
        Residual(nn.Sequential(nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.GELU()), nn.Conv2d(4, 6, 1, stride=2)),
        nn.Flatten(), nn.LayerNorm(24), nn.Linear(24, 3),
    ).double()


def images(n, g):
    """n 8x8 images of 3 classes: a bright row band, column band or diagonal, plus noise."""
    y = torch.arange(n) % 3
    x = 0.3 * torch.rand(n, 1, 8, 8, generator=g, dtype=torch.float64)
    for i in range(n):
        r = int(torch.randint(1, 6, (1,), generator=g))
        if y[i] == 0:
            x[i, 0, r : r + 2, :] += 1.0
        elif y[i] == 1:
            x[i, 0, :, r : r + 2] += 1.0
        else:
            x[i, 0].diagonal().add_(1.0)
    return x, y


def stack_adamw():
    torch.manual_seed(6)
    g = torch.Generator().manual_seed(6)
    (xtr, ytr), (xte, yte) = images(24, g), images(8, g)
    model = stack()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    train_and_record(fresh("torch-stack-adamw"), model, xtr, ytr, xte, yte, opt, 30, 8, None, seed=6,
                     description="make_torch_fixture.py: conv + residual (channel layer norm, GELU) + projection residual + layer norm stack, AdamW lr 0.01 wd 0.05, batch 8 of 24 8x8 images")
    with torch.no_grad():
        return model(xte).contiguous()


def transformer_adamw():
    p, d = 7, 8
    torch.manual_seed(7)
    arch = {"body": {"kind": "layers", "input": {"tokens": [4, p + 2]}, "outputs": p + 2, "layers": [
        {"embedding": {"vocab": p + 2, "dim": d, "scale": d ** 0.5}},
        {"self_attention": {"heads": 2, "shared_qkv": True, "bias": False, "causal": False}},
        "last_token",
        {"residual": [{"dense": {"features": 16, "bias": True}}, "relu", {"dense": {"features": d, "bias": True}}, "relu"]},
        {"dense": {"features": p + 2, "bias": False}}]}}
    model, _ = build_stack(arch)
    pairs = [(a, b) for b in range(p) for a in range(b, p)]
    x = torch.tensor([[a, p, b, p + 1] for a, b in pairs], dtype=torch.float64)
    y = torch.tensor([(a + b) % p for a, b in pairs], dtype=torch.int64)
    perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(7))
    tr, te = perm[:14].sort().values, perm[14:].sort().values
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.98), weight_decay=1.0)
    out = fresh("torch-transformer-adamw")
    train_and_record(out, model, x[tr], y[tr], x[te], y[te], opt, 10, 0, None, seed=7,
                     description="make_torch_fixture.py: ExPLAIND's transformer block on a + b mod 7, AdamW lr 0.01 betas 0.9/0.98 wd 1, full batch")
    with torch.no_grad():
        save_file({"logits": model(x[te]).contiguous()}, os.path.join(out, "logits.safetensors"))


# The transformer block on nn.MultiheadAttention as pathkernel's `[model] layers`.
MHA_STACK_TOML = """layers = [
  { embedding = { vocab = 9, dim = 6, positions = true } },
  { residual = ["layer_norm", { self_attention = { heads = 2, bias = true, causal = true, layout = "packed" } }] },
  "last_token",
  { residual = ["layer_norm", { dense = 12 }, "relu", { dense = 6 }] },
  { dense = 7 },
]"""


def modular_pairs(p, per_class, seed):
    """Token rows [a, p, b, p + 1] of the pairs a >= b and their labels (a + b) mod p: a seeded
    `per_class` pairs of every class for training, the rest held out."""
    pairs = [(a, b) for b in range(p) for a in range(b, p)]
    x = torch.tensor([[a, p, b, p + 1] for a, b in pairs], dtype=torch.float64)
    y = torch.tensor([(a + b) % p for a, b in pairs], dtype=torch.int64)
    perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))
    tr = torch.cat([perm[y[perm] == c][:per_class] for c in range(p)]).sort().values
    te = torch.tensor([i for i in range(len(pairs)) if i not in set(tr.tolist())])
    return x[tr], y[tr], x[te], y[te]


def mha_block():
    """MHA_STACK_TOML as PyTorch modules (nn.MultiheadAttention inside MHSelfAttention)."""
    return nn.Sequential(
        ScaledEmbedding(9, 6, 1.0, positions=4),
        Residual(nn.Sequential(nn.LayerNorm(6), MHSelfAttention(6, 2, bias=True, causal=True))),
        LastToken(),
        Residual(nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))),
        nn.Linear(6, 7),
    ).double()


MHA_ROUNDTRIP_TOML = f"""# PyTorch (nn.MultiheadAttention) -> init -> train -> export -> PyTorch (scripts/make_torch_fixture.py,
# tests/torch_mha.rs). Paths relative to a directory holding the recording as rec/.
[data]
kind = "arrays"
path = "rec/data.safetensors"
vocab = 9

[model]
kind = "layers"
init = "rec/step_00000.safetensors"
zero_last = false
{MHA_STACK_TOML}

[train]
optimizer = "adamw"
lr = 0.02
betas = [0.9, 0.98]
weight_decay = 0.1
batch_size = 8
steps = 12
seed = 13
schedule = {{ kind = "cosine", min_lr = 0.002 }}
"""


def mha_adamw(pathkernel):
    import math

    torch.manual_seed(12)
    xtr, ytr, xte, yte = modular_pairs(7, 2, 12)
    model = mha_block()
    opt = torch.optim.AdamW(model.parameters(), lr=0.02, betas=(0.9, 0.98), weight_decay=0.1)
    steps = 30
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 4 if s < 4 else 0.5 * (1 + math.cos(math.pi * (s - 4) / (steps - 4))))
    out = fresh("torch-mha-adamw")
    train_and_record(out, model, xtr, ytr, xte, yte, opt, steps, 8, sched, seed=12,
                     description="make_torch_fixture.py: pre-norm transformer block on nn.MultiheadAttention (2 heads, bias, causal) on a + b mod 7, "
                                 "AdamW lr 0.02 betas 0.9/0.98 wd 0.1, warm-up 4 then cosine, batch 8 of 14")
    with torch.no_grad():
        save_file({"logits": model(xte).contiguous()}, os.path.join(out, "logits.safetensors"))
    # The round trip through pathkernel's trainer and export.
    rt = fresh("torch-mha")
    os.makedirs(rt)
    with open(os.path.join(rt, "roundtrip.toml"), "w") as f:
        f.write(MHA_ROUNDTRIP_TOML)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(out, os.path.join(tmp, "rec"))
        shutil.copy(os.path.join(rt, "roundtrip.toml"), tmp)
        run = lambda *a: subprocess.run([pathkernel, *a], cwd=tmp, check=True, capture_output=True, text=True).stdout.strip()
        print(run("train", "-q", "--config", "roundtrip.toml", "--out", "run"))
        print(run("export", "--run", "run", "--format", "torch", "--out", "trained.safetensors"))
        net = load(os.path.join(tmp, "trained.safetensors"))
        assert any(isinstance(m, nn.MultiheadAttention) for m in net.modules())
        with torch.no_grad():
            logits = net(xte).contiguous()
        save_file({"logits": logits}, os.path.join(rt, "roundtrip-logits.safetensors"))
        print(run("kernel", "--run", "run", "--kind", "ntk", "--out", "k", "-q"))
        import pyarrow.parquet as pq

        pred = pq.read_table(os.path.join(tmp, "k", "predictions.parquet")).to_pydict()
        ours = np.zeros(tuple(logits.shape))
        ours[np.array(pred["point"]), np.array(pred["class"])] = pred["network"]
        f = torch.log_softmax(logits, 1).numpy()
        print(f"MHA round trip: PyTorch forward of pathkernel's export vs pathkernel's network (log-softmax): max |diff| {np.abs(f - ours).max():.3e}")


def grokking(name, dtype):
    """`grokking_torch.py --record` on a tiny grokking task (the module docstring)."""
    out = fresh(name)
    cmd = [sys.executable, os.path.join(here, "grokking_torch.py"), "--p", "5", "--d", "8", "--heads", "2", "--m", "16", "--train-frac", "0.6",
           "--seed", "5", "--data-seed", "5", "--epochs", "8", "--lr", "0.01", "--wd", "1", "--init-scale", "1", "--dtype", dtype,
           "--print-every", "0", "--record", out]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    from grokking_torch import GrokkingTransformer
    from safetensors.torch import load_file

    model = GrokkingTransformer(5, 8, 2, 16).double()
    model.load_state_dict({k: v.double() for k, v in load_file(os.path.join(out, "step_00008.safetensors")).items()})
    x = load_file(os.path.join(out, "data.safetensors"))["x_test"]
    with torch.no_grad():
        save_file({"logits": model(x).contiguous()}, os.path.join(out, "logits.safetensors"))


ROUNDTRIP_TOML = f"""# PyTorch -> init -> train -> export -> PyTorch (scripts/make_torch_fixture.py, tests/torch.rs).
# Paths relative to a directory holding the recording as rec/.
[data]
kind = "arrays"
path = "rec/data.safetensors"

[model]
kind = "layers"
init = "rec/step_00000.safetensors"
{STACK_TOML}

[train]
optimizer = "adamw"
lr = 0.01
weight_decay = 0.05
batch_size = 8
steps = 10
seed = 11
"""


def roundtrip(pathkernel, recorded_logits):
    out = fresh("torch-stack")
    os.makedirs(out)
    save_file({"logits": recorded_logits}, os.path.join(out, "recorded-logits.safetensors"))
    with open(os.path.join(out, "roundtrip.toml"), "w") as f:
        f.write(ROUNDTRIP_TOML)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(data_dir, "torch-stack-adamw"), os.path.join(tmp, "rec"))
        shutil.copy(os.path.join(out, "roundtrip.toml"), tmp)
        run = lambda *a: subprocess.run([pathkernel, *a], cwd=tmp, check=True, capture_output=True, text=True).stdout.strip()
        print(run("train", "-q", "--config", "roundtrip.toml", "--out", "run"))
        print(run("export", "--run", "run", "--format", "torch", "--out", "trained.safetensors"))
        data, _ = read_safetensors(os.path.join(tmp, "rec", "data.safetensors"))
        x = torch.from_numpy(data["x_test"])
        with torch.no_grad():
            logits = load(os.path.join(tmp, "trained.safetensors"))(x).contiguous()
        save_file({"logits": logits}, os.path.join(out, "roundtrip-logits.safetensors"))
        print(run("kernel", "--run", "run", "--kind", "ntk", "--out", "k", "-q"))
        import pyarrow.parquet as pq

        pred = pq.read_table(os.path.join(tmp, "k", "predictions.parquet")).to_pydict()
        ours = np.zeros(tuple(logits.shape))
        ours[np.array(pred["point"]), np.array(pred["class"])] = pred["network"]
        f = torch.log_softmax(logits, 1).numpy()
        print(f"round trip: PyTorch forward of pathkernel's export vs pathkernel's network (log-softmax): max |diff| {np.abs(f - ours).max():.3e}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="write one fixture (torch-stack-adamw also writes torch-stack)")
    ap.add_argument("--pathkernel", default=os.path.join(here, "..", "target", "release", "pathkernel"))
    a = ap.parse_args()
    if a.only in (None, "torch-recipes"):
        recipes()
    if a.only in (None, "torch-stack-adamw"):
        roundtrip(a.pathkernel, stack_adamw())
    if a.only in (None, "torch-transformer-adamw"):
        transformer_adamw()
    if a.only in (None, "torch-mha-adamw"):
        mha_adamw(a.pathkernel)
    for name, dtype in (("torch-grokking", "float64"), ("torch-grokking-f32", "float32")):
        if a.only in (None, name):
            grokking(name, dtype)
    if a.only is None:
        init_mlp()
        adamw("torch-adamw", torch.float64, 40)
        adamw("torch-adamw-f32", torch.float32, 20)
        nesterov()
        cnn_momentum()
    names = ["torch-adamw", "torch-adamw-f32", "torch-nesterov", "torch-cnn-momentum", "torch-stack-adamw", "torch-stack", "torch-transformer-adamw", "torch-mha-adamw",
             "torch-mha", "torch-grokking", "torch-grokking-f32"]
    for name in names + [os.path.join("torch-recipes", r) for r in sorted(os.listdir(os.path.join(data_dir, "torch-recipes")))]:
        d = os.path.join(data_dir, name)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{name}: {len(os.listdir(d))} files, {size} bytes")
