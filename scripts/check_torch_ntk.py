#!/usr/bin/env python3
"""Independent check of pathkernel's kernels on layer stacks with PyTorch's `torch.func`.

    python3 scripts/check_torch_ntk.py RUN --pathkernel BIN [--steps S ...] [--tol 1e-12]
    python3 scripts/check_torch_ntk.py --suite DIR --pathkernel BIN [--mnist data/mnist]

Needs torch (float64 CPU), which CI does not install; use a virtual environment outside the
repository (`python3 -m venv ~/venv-torch && ~/venv-torch/bin/pip install torch numpy`).

For a recorded run of a `[model] kind = "layers"` network (RUN: its directory), the script
rebuilds the network in PyTorch from the manifest (`torch_model.build_stack`, parameter names equal
to ours), loads the recorded weights and, with `torch.func.jacrev` and `vmap` in float64:

1. the NTK at the last state, `<grad f^k(x_p), grad f^k'(x_i)>` for the test points against the
   training points (all K x K blocks), against `pathkernel kernel --kind ntk --layout full`;
2. the EPK of single steps s (`--steps`; default the first and the last),
   `int_0^1 <grad f^k(x_p; w_s + t dw), grad f^k'(x_i; w_s)> dt`, integrated by the script's own
   rule: each test point's kinks located by bisection (to 1e-15) on its activation pattern (the
   signs of every ReLU input and the winners of every max-pool window, read with forward hooks on
   a 257-point grid), then 32-point Gauss-Legendre on every piece, halved until it agrees with
   24 points to 1e-14 (the largest remaining difference is reported: the reference's own
   convergence), against
   `pathkernel kernel --kind epk --steps s:s+1 --layout full --quadrature auto:1e-13`.

f is the network as trained (log-softmax of alpha * logits for a classifier). It prints the
largest relative difference max|ours - torch| / max|torch| of each Gram and exits 1 above --tol.

`--suite DIR` trains, in DIR, one small run per layer kind alone and LeNet-5 and a residual CNN
(on real MNIST images when --mnist points at the IDX files, as `bash data/fetch-mnist.sh` puts
them) and the sequence layers (embedding, self-attention, a pre-norm transformer block on PyTorch's
`nn.MultiheadAttention`, ExPLAIND's transformer block) on `a + b mod 5`, checks each, and prints the table the guide quotes. `--only NAME ...` runs some
rows of the suite.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
from torch.func import functional_call, jacrev, vmap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_model import build_stack, read_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)


def load_run(run):
    with open(os.path.join(run, "manifest.json")) as f:
        manifest = json.load(f)
    arch = manifest["architecture"]
    net, shape = build_stack(arch)
    data, _ = read_safetensors(os.path.join(run, "dataset.safetensors"))
    return manifest, arch, net, shape, data


def state(run, s):
    t, _ = read_safetensors(os.path.join(run, "trajectory", f"step-{s:06d}.safetensors"))
    return {k: torch.from_numpy(v) for k, v in t.items()}


def make_f(arch, net, shape, init):
    """f(params, x) for one input row x: out(alpha * (g(x) - [zero_output] g_0(x)))."""
    alpha = arch["alpha"]

    def g(params, x):
        xi = x.reshape(1, *shape[1:]) if shape[0] == "map" else x.reshape(1, -1)
        return functional_call(net, params, (xi,))[0]

    def f(params, x):
        z = g(params, x)
        if arch["zero_output"]:
            z = z - g(init, x)
        z = alpha * z
        return torch.log_softmax(z, dim=0) if arch["output"] == "log-softmax" else z

    return f


def jac(f, params, x):
    """[n, K, W] per-sample Jacobians, parameters flattened in manifest order."""
    names = list(params.keys())
    j = vmap(jacrev(f), in_dims=(None, 0))(params, x)
    return torch.cat([j[n].reshape(x.shape[0], j[n].shape[1], -1) for n in names], dim=2)


def gram(jr, jt):
    """[P, M, K, K] from row and training Jacobians."""
    return torch.einsum("pkw,mlw->pmkl", jr, jt)


def pattern_fn(net, f):
    """pattern(params, x): the ReLU signs and max-pool winners of one input (forward hooks)."""
    seen = []

    def relu_hook(mod, inp, out):
        seen.append((inp[0] > 0).flatten())

    def pool_hook(mod, inp, out):
        _, idx = torch.nn.functional.max_pool2d(inp[0], mod.kernel_size, mod.stride, return_indices=True)
        seen.append(idx.flatten())

    for m in net.modules():
        if isinstance(m, (torch.nn.ReLU, torch.nn.LeakyReLU)):
            m.register_forward_hook(relu_hook)
        elif isinstance(m, torch.nn.MaxPool2d):
            m.register_forward_hook(pool_hook)

    def pattern(params, x):
        seen.clear()
        with torch.no_grad():
            f(params, x)
        return torch.cat([v.to(torch.int64) for v in seen]) if seen else torch.zeros(0, dtype=torch.int64)

    return pattern


def kinks_of(pattern, at, grid=257):
    """Times in (0, 1) where the activation pattern changes: a grid, then bisection to 1e-15."""
    ts = np.linspace(0.0, 1.0, grid)
    pats = [pattern(at(t)) for t in ts]
    out = []

    def bisect(a, pa, b, pb):
        if b - a <= 1e-15:
            out.append(0.5 * (a + b))
            return
        m = 0.5 * (a + b)
        pm = pattern(at(m))
        if not torch.equal(pa, pm):
            bisect(a, pa, m, pm)
        if not torch.equal(pm, pb):
            bisect(m, pm, b, pb)

    for j in range(grid - 1):
        if not torch.equal(pats[j], pats[j + 1]):
            bisect(ts[j], pats[j], ts[j + 1], pats[j + 1])
    return out


def epk_reference(f, pattern, ws, wn, names, xr, jt, orders=(24, 32)):
    """The step's EPK rows by Gauss-Legendre between each point's kinks (found by bisection on
    the activation pattern); a piece whose 24- and 32-point sums differ by more than 1e-14
    (relative) is halved until they agree. Returns the rows and the largest remaining
    difference (the reference's own convergence)."""
    at = lambda t: {n: ws[n] + t * (wn[n] - ws[n]) for n in names}
    rules = {o: np.polynomial.legendre.leggauss(o) for o in orders}

    def gl(x, a, b, o):
        nodes, weights = rules[o]
        acc = 0
        for t, wq in zip(a + (b - a) * (nodes + 1) / 2, weights):
            acc = acc + (b - a) / 2 * wq * gram(jac(f, at(float(t)), x), jt)
        return acc

    def piece(x, a, b, depth=0):
        lo, hi = gl(x, a, b, orders[0]), gl(x, a, b, orders[1])
        d = float((lo - hi).abs().max()) / max(float(hi.abs().max()), 1e-300)
        if d <= 1e-14 or depth >= 12:
            return hi, d
        m = 0.5 * (a + b)
        (l, dl), (r, dr) = piece(x, a, m, depth + 1), piece(x, m, b, depth + 1)
        return l + r, max(dl, dr)

    rows, worst = [], 0.0
    for p in range(xr.shape[0]):
        x = xr[p : p + 1]
        cuts = [0.0] + kinks_of(lambda prm: pattern(prm, x[0]), at) + [1.0]
        acc = 0
        for a, b in zip(cuts[:-1], cuts[1:]):
            v, d = piece(x, a, b)
            acc, worst = acc + v, max(worst, d)
        rows.append(acc)
    return torch.cat(rows), worst


def ours(binary, run, args, workdir):
    out = os.path.join(workdir, "k-" + "-".join(a.strip("-").replace(":", "_") for a in args))
    cmd = [binary, "kernel", "-q", "--run", run, "--points", "test", "--layout", "full", "--out", out, "--force", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    t, _ = read_safetensors(os.path.join(out, "gram.safetensors"))
    return torch.from_numpy(t["gram"])


def rel(a, b):
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-300))


def check_run(run, binary, steps, workdir):
    manifest, arch, net, shape, data = load_run(run)
    opt = manifest["optimizer"]
    if opt.get("kind") != "gd" or set(opt) - {"kind", "lr"}:
        # The EPK reference below integrates plain full-batch gradient steps.
        raise SystemExit(f"{run}: trained by {opt}; the EPK reference needs plain full-batch gradient descent (optimizer = \"gd\", no momentum or weight decay)")
    n = manifest["steps"]
    init = state(run, 0)
    f = make_f(arch, net, shape, init)
    xt = torch.from_numpy(data["x_train"])
    xr = torch.from_numpy(data["x_test"])
    results = {}
    pattern = pattern_fn(net, f)
    wn = state(run, n)
    jt = jac(f, wn, xt)
    results["ntk"] = rel(ours(binary, run, ["--kind", "ntk"], workdir), gram(jac(f, wn, xr), jt))
    for s in steps:
        ws, wnext = state(run, s), state(run, s + 1)
        names = list(ws.keys())
        jt = jac(f, ws, xt)
        ref, conv = epk_reference(f, pattern, ws, wnext, names, xr, jt)
        results[f"reference convergence, step {s}"] = conv
        mine = ours(binary, run, ["--kind", "epk", "--steps", f"{s}:{s + 1}", "--quadrature", "auto:1e-13"], workdir)
        results[f"epk step {s}"] = rel(mine, ref)
    return results


SUITE = {
    # name: (data, layers)
    "dense": ("mixture", '[{ dense = 3 }]'),
    "relu": ("mixture", '[{ dense = 8 }, "relu", { dense = 3 }]'),
    "leaky_relu": ("mixture", '[{ dense = 8 }, { leaky_relu = 0.1 }, { dense = 3 }]'),
    "tanh": ("mixture", '[{ dense = 8 }, "tanh", { dense = 3 }]'),
    "sigmoid": ("mixture", '[{ dense = 8 }, "sigmoid", { dense = 3 }]'),
    "softplus": ("mixture", '[{ dense = 8 }, "softplus", { dense = 3 }]'),
    "gelu": ("mixture", '[{ dense = 8 }, "gelu", { dense = 3 }]'),
    "silu": ("mixture", '[{ dense = 8 }, "silu", { dense = 3 }]'),
    "layer_norm": ("mixture", '[{ dense = 8 }, "layer_norm", { dense = 3 }]'),
    "residual": ("mixture", '[{ dense = 8 }, { residual = [{ dense = 8 }, "relu", { dense = 8 }] }, { dense = 3 }]'),
    "residual projection": ("mixture", '[{ residual = [{ dense = 6 }, "tanh"] }, { dense = 3 }]'),
    "conv2d": ("mnist", '[{ conv2d = { channels = 3, kernel = 5, stride = 3, padding = 1 } }, "flatten", { dense = 10 }]'),
    "max_pool2d": ("mnist", '[{ conv2d = { channels = 2, kernel = 5, stride = 2 } }, { max_pool2d = 3 }, "flatten", { dense = 10 }]'),
    "avg_pool2d": ("mnist", '[{ conv2d = { channels = 2, kernel = 5, stride = 2 } }, { avg_pool2d = { kernel = 3, stride = 2 } }, "flatten", { dense = 10 }]'),
    "channel layer_norm": ("mnist", '[{ conv2d = { channels = 3, kernel = 4, stride = 4 } }, "layer_norm", "flatten", { dense = 10 }]'),
    "LeNet-5": ("mnist", '[{ conv2d = { channels = 6, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 16, kernel = 5 } }, "relu", { max_pool2d = 2 }, "flatten", { dense = 120 }, "relu", { dense = 84 }, "relu", { dense = 10 }]'),
    # Sequence layers on `a + b mod 5` (tokens [a, 5, b, 6], vocabulary and classes 7).
    "embedding": ("modular", '[{ embedding = { vocab = 7, dim = 6, scale = 2.0 } }, "last_token", { dense = 7 }]'),
    "self_attention shared": ("modular", '[{ embedding = { vocab = 7, dim = 8, scale = "sqrt_dim" } }, { self_attention = { heads = 2, shared_qkv = true } }, "last_token", { dense = { features = 7, bias = false } }]'),
    "self_attention qkv": ("modular", '[{ embedding = { vocab = 7, dim = 6 } }, { self_attention = { heads = 3, bias = true, causal = true } }, "gelu", "last_token", { dense = 7 }]'),
    "mean_tokens": ("modular", '[{ embedding = { vocab = 7, dim = 6 } }, { self_attention = { heads = 2, causal = true } }, "mean_tokens", "relu", { dense = 7 }]'),
    "pre-norm block": ("modular", '[{ embedding = { vocab = 7, dim = 6, positions = true } }, { residual = ["layer_norm", { self_attention = { heads = 2, causal = true } }] }, "layer_norm", "last_token", { dense = 7 }]'),
    "MHA pre-norm block, position-wise MLP": ("modular", '[{ embedding = { vocab = 7, dim = 8, positions = true } }, { residual = ["layer_norm", { self_attention = { heads = 2, bias = true, causal = true, layout = "packed" } }] }, { residual = ["layer_norm", { dense = 16 }, "relu", { dense = 8 }] }, "mean_tokens", { dense = 7 }]'),
    "MHA pre-norm block": ("modular", '[{ embedding = { vocab = 7, dim = 8, positions = true } }, { residual = ["layer_norm", { self_attention = { heads = 2, bias = true, causal = true, layout = "packed" } }] }, "last_token", { residual = ["layer_norm", { dense = 16 }, "relu", { dense = 8 }] }, { dense = 7 }]'),
    "ExPLAIND block": ("modular", '[{ embedding = { vocab = 7, dim = 8, scale = "sqrt_dim" } }, { self_attention = { heads = 2, shared_qkv = true } }, "last_token", { residual = [{ dense = 16 }, "relu", { dense = 8 }, "relu"] }, { dense = { features = 7, bias = false } }]'),
    "residual CNN": ("mnist", '[{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "gelu", { residual = [{ conv2d = { channels = 4, kernel = 3, padding = 1 } }, "layer_norm", "gelu", { conv2d = { channels = 4, kernel = 3, padding = 1 } }] }, { residual = [{ conv2d = { channels = 8, kernel = 3, stride = 2, padding = 1 } }, "relu"] }, { avg_pool2d = 2 }, "flatten", { dense = 10 }]'),
}


def suite(directory, binary, mnist, only=None):
    os.makedirs(directory, exist_ok=True)
    rows = []
    for name, (data, layers) in SUITE.items():
        if only and name not in only:
            continue
        slug = name.replace(" ", "-").replace("_", "-").lower()
        if data == "mixture":
            data_toml = '[data]\nkind = "gaussian-mixture"\ndim = 2\nper_class = 8\nn_test = 4\nseed = 3\n'
            train = "lr = 0.5\nsteps = 3"
        elif data == "modular":
            data_toml = '[data]\nkind = "modular"\np = 5\ntrain_frac = 0.5\nseed = 1\n'
            train = "lr = 0.2\nsteps = 3"
        else:
            data_toml = f'[data]\nkind = "mnist"\npath = {json.dumps(os.path.abspath(mnist))}\nn_train = 12\nn_test = 3\n'
            train = "lr = 0.02\nsteps = 2"
        cfg = os.path.join(directory, f"{slug}.toml")
        with open(cfg, "w") as f:
            f.write(f'{data_toml}\n[model]\nkind = "layers"\nzero_last = false\nlayers = {layers}\n\n[train]\n{train}\nseed = 1\n')
        run = os.path.join(directory, slug)
        subprocess.run([binary, "train", "-q", "--config", cfg, "--out", run, "--force"], check=True, stdout=subprocess.DEVNULL)
        steps = sorted({0, json.load(open(os.path.join(run, "manifest.json")))["steps"] - 1})
        res = check_run(run, binary, steps, directory)
        rows.append((name, res))
        print(f"{name:22s} " + "  ".join(f"{k}: {v:.1e}" for k, v in res.items()), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?")
    ap.add_argument("--pathkernel", required=True)
    ap.add_argument("--steps", type=int, nargs="*")
    ap.add_argument("--tol", type=float, default=1e-12)
    ap.add_argument("--suite")
    ap.add_argument("--mnist", default="data/mnist")
    ap.add_argument("--only", nargs="*", help="suite rows to run (names as printed)")
    a = ap.parse_args()
    if a.suite:
        rows = suite(a.suite, a.pathkernel, a.mnist, a.only)
        worst = max(v for _, r in rows for v in r.values())
    else:
        if not a.run:
            ap.error("give RUN or --suite DIR")
        n = json.load(open(os.path.join(a.run, "manifest.json")))["steps"]
        steps = a.steps if a.steps else sorted({0, n - 1})
        res = check_run(a.run, a.pathkernel, steps, os.path.join(a.run, "torch-check"))
        for k, v in res.items():
            print(f"{k}: max relative difference {v:.2e}")
        worst = max(res.values())
    print(f"largest relative difference {worst:.2e} (tolerance {a.tol:.0e})")
    sys.exit(0 if worst <= a.tol else 1)


if __name__ == "__main__":
    main()
