"""Training recipes recorded and round-tripped through `pathkernel import` and `pathkernel kernel`:
each of torch's schedulers, gradient clipping, each optimizer, in float64 and float32.

    python -m pathkernel_recorder.recipes --pathkernel target/release/pathkernel [--only NAME] [--dtype float32]

prints one markdown row per recipe and precision: imported (the import's largest replay
difference, absolute and in ulps of the weights and update, and the EPK machine's largest
difference from the network) or refused (the import's line). The guide's PyTorch chapter quotes
this table; the package's pytest tests run the same recipes.

The model is a ReLU MLP 16-16-4 on 64 points of 4 Gaussian classes (seeded), 24 steps of
mini-batches of 16; the kernel is the EPK on the 8 test points.
"""

import argparse
import os
import re
import subprocess
import tempfile

import torch
import torch.nn as nn

from .recorder import train_and_record

STEPS = 24
S = torch.optim.lr_scheduler


def data(seed=0, n_train=64, n_test=8, dim=16, classes=4):
    g = torch.Generator().manual_seed(seed)
    means = 1.5 * torch.randn(classes, dim, generator=g)
    def draw(n):
        y = torch.randint(0, classes, (n,), generator=g)
        return means[y] + torch.randn(n, dim, generator=g), y
    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    return xtr.double(), ytr, xte.double(), yte


def model(dtype, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).to(dtype)


def _adamw(p):
    return torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05)


def _sgd_m(p):
    return torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)


def _warmup_from_zero(s):
    return s / 5 if s < 5 else 1.0


# name -> (optimizer factory, scheduler factory or None, clip: None | ("norm", x) | ("value", x)).
RECIPES = {
    "AdamW, constant lr": (_adamw, None, None),
    "AdamW, StepLR": (_adamw, lambda o: S.StepLR(o, step_size=8, gamma=0.5), None),
    "AdamW, MultiStepLR": (_adamw, lambda o: S.MultiStepLR(o, milestones=[6, 15], gamma=0.3), None),
    "AdamW, ConstantLR": (_adamw, lambda o: S.ConstantLR(o, factor=0.25, total_iters=10), None),
    "AdamW, LinearLR start_factor=1e-6": (_adamw, lambda o: S.LinearLR(o, start_factor=1e-6, total_iters=STEPS), None),
    "AdamW, ExponentialLR": (_adamw, lambda o: S.ExponentialLR(o, gamma=0.9), None),
    "AdamW, PolynomialLR (to 0)": (_adamw, lambda o: S.PolynomialLR(o, total_iters=STEPS - 4, power=2.0), None),
    "AdamW, CosineAnnealingLR T_max=N-1 (lr 0 at the end)": (_adamw, lambda o: S.CosineAnnealingLR(o, T_max=STEPS - 1), None),
    "AdamW, CosineAnnealingWarmRestarts": (_adamw, lambda o: S.CosineAnnealingWarmRestarts(o, T_0=7, T_mult=2), None),
    "AdamW, LambdaLR warm-up from 0": (_adamw, lambda o: S.LambdaLR(o, _warmup_from_zero), None),
    "AdamW, SequentialLR (LinearLR, Cosine)": (_adamw, lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=6), S.CosineAnnealingLR(o, T_max=STEPS - 6)], milestones=[6]), None),
    "AdamW, ChainedScheduler (Exponential, MultiStep)": (_adamw, lambda o: S.ChainedScheduler([S.ExponentialLR(o, 0.95), S.MultiStepLR(o, [10], 0.5)]), None),
    "AdamW, ReduceLROnPlateau": (_adamw, lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=1, threshold=0.05), None),
    "AdamW, OneCycleLR cycle_momentum=False": (_adamw, lambda o: S.OneCycleLR(o, max_lr=1e-2, total_steps=STEPS, cycle_momentum=False), None),
    "AdamW, OneCycleLR (beta1 cycled)": (_adamw, lambda o: S.OneCycleLR(o, max_lr=1e-2, total_steps=STEPS), None),
    "Adam, CyclicLR (beta1 cycled)": (lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-3), lambda o: S.CyclicLR(o, 1e-3, 1e-2, step_size_up=5), None),
    "SGD momentum, CyclicLR (momentum cycled)": (_sgd_m, lambda o: S.CyclicLR(o, 0.01, 0.1, step_size_up=5), None),
    "SGD momentum, OneCycleLR (momentum cycled)": (_sgd_m, lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=STEPS), None),
    "SGD": (lambda p: torch.optim.SGD(p, lr=0.1), None, None),
    "SGD Nesterov, weight decay": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), None, None),
    "Adam, weight decay": (lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3), None, None),
    "RMSprop": (lambda p: torch.optim.RMSprop(p, lr=1e-3), None, None),
    "RMSprop centered, weight decay": (lambda p: torch.optim.RMSprop(p, lr=1e-3, alpha=0.9, centered=True, weight_decay=1e-3), None, None),
    "Adagrad lr_decay, initial accumulator, weight decay": (lambda p: torch.optim.Adagrad(p, lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=1e-3), None, None),
    "AdamW, clip_grad_norm_(0.5)": (_adamw, None, ("norm", 0.5)),
    "SGD momentum, clip_grad_norm_(0.5), StepLR": (_sgd_m, lambda o: S.StepLR(o, 8, 0.5), ("norm", 0.5)),
    "AdamW, clip_grad_value_(0.05)": (_adamw, None, ("value", 0.05)),
    "RMSprop momentum=0.9": (lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9), None, None),
    "SGD Nesterov, OneCycleLR (momentum cycled)": (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True), lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=STEPS), None),
    "Adam amsgrad": (lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True), None, None),
}

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def record(name, out, dtype="float64", steps=STEPS):
    """Records recipe `name` in `dtype` into `out` (a TrajectoryRecorder directory)."""
    make_opt, make_sched, clip = RECIPES[name]
    net = model(DTYPES[dtype])
    opt = make_opt(net.parameters())
    sched = make_sched(opt) if make_sched else None
    xtr, ytr, xte, yte = data()
    kw = {}
    if clip is not None:
        kw["clip_norm" if clip[0] == "norm" else "clip_value"] = clip[1]
    train_and_record(out, net, xtr, ytr, xte, yte, opt, steps, batch_size=16, sched=sched, seed=0, description=f"recipe: {name}, {dtype}", quiet=True, **kw)


def _figure(text, pattern):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def round_trip(name, dtype, binary, work):
    """Records, imports and computes the EPK of recipe `name`; returns a dict: `imported`
    (bool), `line` (the import's refusal, or its summary), `abs`, `rel`, `ulps` (the replay's
    largest differences), `epk` (machine vs network), `rounding` (the residual term)."""
    rec, run, k = (os.path.join(work, d) for d in ("rec", "run", "k"))
    record(name, rec, dtype)
    imp = subprocess.run([binary, "import", "--from", "torch", rec, "--out", run], capture_output=True, text=True)
    if imp.returncode != 0:
        line = imp.stderr.strip().splitlines()[-1] if imp.stderr.strip() else f"exit {imp.returncode}"
        return {"imported": False, "rc": imp.returncode, "line": line}
    out = {"imported": True, "rc": 0, "line": imp.stdout.strip()}
    out["rel"] = _figure(imp.stdout, r"max relative difference (\S+)")
    out["abs"] = _figure(imp.stdout, r"max absolute (\S+?),")
    out["ulps"] = _figure(imp.stdout, r"max (\S+) ulps")
    ker = subprocess.run([binary, "kernel", "--run", run, "--out", k, "-q"], capture_output=True, text=True)
    if ker.returncode != 0:
        raise RuntimeError(f"{name} {dtype}: kernel failed: {ker.stderr.strip()}")
    out["epk"] = _figure(ker.stdout, r"kernel machine vs network max \|err\| (\S+?),")
    out["rounding"] = _figure(ker.stdout, r"rounding term max (\S+?)(?:;|\s|$)") or 0.0
    out["kernel"] = ker.stdout.strip()
    return out


def _import(binary, rec, out):
    return subprocess.run([binary, "import", "--from", "torch", rec, "--out", out, "--force"], capture_output=True, text=True)


def _coordinates(rec, step):
    """Every (tensor, index, value) of state `step` of a recording."""
    from safetensors.torch import load_file

    t = load_file(os.path.join(rec, f"step_{step:05d}.safetensors"))
    return [(k, i, float(v)) for k in sorted(t) for i, v in enumerate(t[k].reshape(-1).tolist())]


def _edited_copy(rec, dst, step, name, index, delta):
    import shutil

    from safetensors.torch import safe_open, save_file

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(rec, dst)
    path = os.path.join(dst, f"step_{step:05d}.safetensors")
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    flat = t[name].reshape(-1)
    flat[index] += delta
    save_file(t, path, metadata=meta)


def edit_detection(binary, work, name="AdamW, constant lr", step=12, dtype="float32", coords=24):
    """Float32 edit detection on recipe `name`: the run's largest genuine rounding (the import's
    max absolute difference), then single-weight edits at `step` on `coords` coordinates spread
    over every tensor (the largest-magnitude weight among them): each edited by 100× that
    rounding (must be refused), and the smallest refused edit of each found by bisection.
    Returns a dict of the figures."""
    rec = os.path.join(work, "rec")
    record(name, rec, dtype)
    ok = _import(binary, rec, os.path.join(work, "ok"))
    if ok.returncode != 0:
        raise RuntimeError(ok.stderr)
    rounding = _figure(ok.stdout, r"max absolute (\S+?),")
    ulps = _figure(ok.stdout, r"max (\S+) ulps")
    allc = _coordinates(rec, step)
    pick = sorted(range(len(allc)), key=lambda j: -abs(allc[j][2]))[:1]
    pick += [j for j in range(0, len(allc), max(1, len(allc) // (coords - 1)))][: coords - 1]
    edited = os.path.join(work, "edited")
    rows = []
    for j in pick:
        tensor, index, value = allc[j]
        _edited_copy(rec, edited, step, tensor, index, 100 * rounding)
        refused_100x = _import(binary, edited, os.path.join(work, "e")).returncode == 2
        lo, hi = 0.0, 100 * rounding
        if refused_100x:
            for _ in range(12):
                mid = (lo + hi) / 2
                _edited_copy(rec, edited, step, tensor, index, mid)
                if _import(binary, edited, os.path.join(work, "e")).returncode == 2:
                    hi = mid
                else:
                    lo = mid
        rows.append({"coordinate": f"{tensor}[{index}]", "weight": value, "refused_100x": refused_100x, "smallest_refused": hi if refused_100x else None})
    return {"recipe": name, "dtype": dtype, "step": step, "rounding": rounding, "ulps": ulps, "edits": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pathkernel", default=os.environ.get("PATHKERNEL_BIN", "target/release/pathkernel"))
    ap.add_argument("--only", action="append", help="recipe name (repeatable)")
    ap.add_argument("--dtype", action="append", choices=list(DTYPES), help="default: both")
    ap.add_argument("--edits", action="store_true", help="the float32 edit-detection figures instead of the table")
    a = ap.parse_args(argv)
    if a.edits:
        with tempfile.TemporaryDirectory() as work:
            r = edit_detection(a.pathkernel, work)
        print(f"{r['recipe']} ({r['dtype']}): largest genuine rounding {r['rounding']:.2e} absolute ({r['ulps']:.2f} ulps); edits of one weight at step {r['step']}:")
        print("| coordinate | weight | 100x rounding refused | smallest edit refused |")
        print("|---|---|---|---|")
        for e in r["edits"]:
            small = "-" if e["smallest_refused"] is None else f"{e['smallest_refused']:.2e}"
            print(f"| {e['coordinate']} | {e['weight']:.4f} | {'yes' if e['refused_100x'] else 'NO'} | {small} |")
        worst = max((e["smallest_refused"] for e in r["edits"] if e["smallest_refused"] is not None), default=float("nan"))
        print(f"refused at 100x: {sum(e['refused_100x'] for e in r['edits'])} of {len(r['edits'])}; largest smallest-refused edit {worst:.2e} ({worst / r['rounding']:.1f}x the rounding)")
        return
    print("| recipe | precision | result | replay: max abs | max ulps | EPK machine vs network |")
    print("|---|---|---|---|---|---|")
    for name in a.only or RECIPES:
        for dtype in a.dtype or DTYPES:
            with tempfile.TemporaryDirectory() as work:
                r = round_trip(name, dtype, a.pathkernel, work)
            if r["imported"]:
                print(f"| {name} | {dtype} | imported | {r['abs']:.1e} | {r['ulps']:.1f} | {r['epk']:.1e} |")
            else:
                # The line without its "error: DIR/trajectory.json: " prefix (a temporary path).
                line = re.sub(r"^error: \S*trajectory\.json: ", "", r["line"]).replace("|", "\\|")
                print(f"| {name} | {dtype} | refused: {line} | | | |")


if __name__ == "__main__":
    main()
