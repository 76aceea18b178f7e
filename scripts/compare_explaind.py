"""Side by side with ExPLAIND (PyPI `explaind` 0.1.0, Python >= 3.12; outside CI, as
scripts/laplace_torch_check.py): one PyTorch training run handed to both tools, each
reconstructing the final network's outputs on the same test points.

    /work/venv/bin/python scripts/compare_explaind.py [--arch cnn|lenet5] [--per-class 30]
        [--steps 10] [--batch 100] [--lr 0.01] [--wd 0.01] [--n-test 10]
        [--settings default,1,10,100,1000] [--ours auto:1e-12,midpoint:10,midpoint:100,midpoint:1000] [--mnist data/mnist]
        [--pathkernel BIN] [--out runs/explaind-compare] [--report reports/explaind-compare]

The run. The network (`--arch cnn`: `Conv2d(1, 4, 5, padding=2), ReLU, MaxPool2d(2),
Conv2d(4, 8, 5), ReLU, MaxPool2d(2), Flatten, Linear(200, 10)`, 2 922 parameters; `lenet5`: the
LeNet-5 of scripts/torch_lenet5_mnist.py, 61 706 parameters), PyTorch's initialisation under
torch.manual_seed(0), **float32** (ExPLAIND 0.1.0's feature map keeps only float32 parameters:
a float64 model gets no features, so the comparison is made as ExPLAIND ships, in float32), is
trained by `torch.optim.AdamW` (betas 0.9/0.999, eps 1e-8) with mini-batches (epoch-wise seeded
permutations) of the first `per-class` MNIST training images of each class (pixels / 255) on the
cross-entropy of its logits. It is trained **once**, inside ExPLAIND's own wrappers: the model is
wrapped by `explaind.model_paths.ModelPath` (with a final `LogSoftmax`, as ExPLAIND's models end:
its loss gradient is the one-hot target), the optimizer is the `torch.optim.AdamW` that
`explaind.optimizer_paths.AdamWOptimizerPath` builds and checkpoints (its per-step first and
second moments, which our recorder does not save and ExPLAIND needs), the batches are logged by
`explaind.data_paths.DataPath`; the same optimizer is handed to our recorder
(scripts/record_torch_trajectory.py), which writes the weights of every step, the batches and
the hyper-parameters. The script checks that the two records hold the same weights at every
step (printed; 0 expected: one run, two recorders).

The output compared is the **log-softmax** of the network on the first `n-test` MNIST test
images (all 10 classes): ExPLAIND's f is the model's output (ending in LogSoftmax), ours is the
log-softmax of the logits for a cross-entropy run (pathkernel's `network` output). Both are
compared with one reference: the recorded final weights run in float64 (their float32 network
differs from it by its float32 rounding, printed). Errors are absolute, in log-probability
units; "relative" is the error divided by the largest change of the output over training,
max |f_N - f_0| (both tools start from the exact f_0 and reconstruct the change).

ExPLAIND: `ExactPathKernelModel.predict` (its decomposition of the AdamW steps: per-training-point
first-moment features normalised by the recorded second moment, plus its weight-decay "reg
term"), its midpoint rule with K evaluations per step (`integral_eps = 1/K`; `default` is its
constructor's defaults, `integral_eps=0.1, early_integral_eps=0.001, early_steps=4`: 1 000
evaluations for the first 4 steps, 10 after; `K` sets both eps to 1/K; `integral_eps=1` is
passed as the integer 1, its code needs an integer there). Its arithmetic is float32 as shipped.
One runtime patch, no edit of site-packages: `predict` with `keep_param_wise_kernel=False`
fails at step 0 on an uninitialised dict (`prev_eval[...] = ...` with prev_eval None); the
script wraps `exact_path_kernel_step_test` to pass `{}` instead of None (the code path it then
takes is the one it takes from step 1 on). `evaluate_predictions=False` (its per-step diagnostic
forwards are not part of the reconstruction). An evaluation is one point of its midpoint rule:
the gradients of all 10 outputs of every test point at one interpolated weight vector. A setting
`K-f64` (e.g. `--settings 100-f64`, not in the default sweep) runs ExPLAIND patched to float64 at
run time: `explaind.model_paths` is given a `torch` whose `torch.float` is float64 (its
parameter filter `v.dtype == torch.float` is that module's only use of it) and the model,
checkpoints, moments, batches and test points are cast to float64; its floor is then the float32
rounding of the recorded updates, which its decomposition has no term for.

Ours: `pathkernel import --from torch` (the float32 states read as f64, every update replayed
against AdamW from f64 gradients; the float32 rounding becomes the residual term) and
`pathkernel kernel --kind epk --quadrature auto:1e-12 --points test` (f64); its reconstruction
is the kernel machine with its weight-decay term and the residual term (`kernel_machine` of
predictions.parquet), evaluations per point and step from `exactness.json`. `--ours` also runs
our fixed midpoint rule at 10, 100 and 1 000 points per step: ExPLAIND's rule, in f64.

Each setting runs in its own process; wall time is the process's (Python start and torch import
included for ExPLAIND, ~5 s on the shared 2-core machine; `pathkernel import` added to ours),
peak memory its peak RSS (`os.wait4`). Writes OUT/ (the recording, the run, ExPLAIND's
checkpoints, each setting's log) and REPORT/compare.csv, compare.md, summary.json.
`--ours ""` runs ExPLAIND's side only (a probe of its cost, e.g. `--arch lenet5 --settings 10`).
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
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)


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
    img = lambda a: torch.from_numpy(a.astype(np.float32)[:, None] / np.float32(255.0))
    lab = lambda a: torch.from_numpy(a.astype(np.int64))
    return img(xtr[keep]), lab(ytr[keep]), img(xte), lab(yte)


def build(arch):
    if arch == "lenet5":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10),
        )
    if arch == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 4, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(200, 10),
        )
    raise SystemExit(f"--arch {arch}: cnn or lenet5")


class Targets(torch.utils.data.Dataset):
    """What explaind.data_paths.DataPath needs of a data set: `targets` and a length."""

    def __init__(self, y):
        self.targets = [t.clone() for t in y]

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.targets[i]


def explaind_paths(model, ckpts=None, opt_ckpts=None, y=None, hp=None):
    """ExPLAIND's three wrappers around `model` (the logits network): ModelPath of
    `Sequential(*model, LogSoftmax)`, AdamWOptimizerPath, DataPath."""
    from explaind.data_paths import DataPath
    from explaind.model_paths import ModelPath
    from explaind.optimizer_paths import AdamWOptimizerPath

    full = nn.Sequential(*model, nn.LogSoftmax(dim=-1))
    mp = ModelPath(full, device="cpu", checkpoints=ckpts, output_dim=10)
    # a fresh list: AdamWOptimizerPath's default `checkpoints=[]` is shared between instances
    op = AdamWOptimizerPath(mp, lr=hp["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=hp["wd"],
                            checkpoints=[] if opt_ckpts is None else opt_ckpts, device="cpu")
    dp = DataPath(torch.utils.data.DataLoader(Targets(y), batch_size=hp["batch"]))
    return full, mp, op, dp


def train(a, data, rec_dir, state_path):
    from record_torch_trajectory import TrajectoryRecorder
    from safetensors.torch import load_file

    xtr, ytr, xte, yte = data
    torch.manual_seed(0)
    model = build(a.arch)
    hp = {"lr": a.lr, "wd": a.wd, "batch": a.batch}
    full, mp, op, dp = explaind_paths(model, y=ytr, hp=hp)
    rec = TrajectoryRecorder(rec_dir, model, xtr, ytr, xte, yte, loss="cross_entropy", optimizer=op.optimizer,
                             description=f"compare_explaind.py: {a.arch}, AdamW lr {a.lr} wd {a.wd}, batch {a.batch}, {len(ytr)} MNIST images, float32")
    g = torch.Generator().manual_seed(0)
    rec.start()
    perm, pos = None, 0
    for s in range(a.steps):
        if perm is None or pos + a.batch > len(perm):
            perm, pos = torch.randperm(xtr.shape[0], generator=g), 0
        batch = perm[pos : pos + a.batch]
        pos += a.batch
        xb, yb = xtr[batch], ytr[batch]
        op.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        op.step()
        rec.step(batch=batch)
        mp.log_checkpoint()
        op.log_checkpoint()
        dp.log_batch(xb, yb, batch)
        if s == 0 or s + 1 == a.steps:
            print(f"step {s}: batch loss {loss.item():.6f}")
    rec.finish()
    worst = 0.0
    for s, ck in enumerate(mp.checkpoints):
        ours = load_file(os.path.join(rec_dir, f"step_{s:05d}.safetensors"))
        worst = max(worst, max(float((ck[k] - ours[k]).abs().max()) for k in ours))
    print(f"ExPLAIND's and our recorder's weights, largest difference over {len(mp.checkpoints)} states: {worst:.3g}")
    torch.save({"model": mp.checkpoints, "optimizer": op.checkpoints, "batches": dp.checkpoints, "hp": hp, "arch": a.arch,
                "y_train": ytr, "x_test": xte}, state_path)
    return model, mp, worst


def setting_args(setting):
    """(integral_eps, early_integral_eps, early_steps) of a setting name."""
    setting = setting.removesuffix("-f64")
    if setting == "default":
        return 0.1, 0.001, 4
    k = int(setting)
    eps = 1 if k == 1 else 1.0 / k
    return eps, eps, 4


def explaind_worker(state_path, setting, out_npy):
    """One ExPLAIND predict (run in its own process: its wall time and peak RSS are its own)."""
    from explaind import epk_model
    from explaind.epk_model import ExactPathKernelModel

    torch.set_num_threads(2)
    st = torch.load(state_path, weights_only=False)
    model = build(st["arch"])
    if setting.endswith("-f64"):
        # ExPLAIND patched to float64 arithmetic: its feature map keeps the parameters whose dtype
        # is `torch.float` (model_paths.py); explaind.model_paths sees a `torch` whose `float`
        # is float64 (that comparison is the module's only use of `torch.float`), and the model,
        # its checkpoints, the moments, the batches and the test points are cast to float64
        import explaind.model_paths as emp

        class Float64Torch:
            float = torch.float64

            def __getattr__(self, name):
                return getattr(torch, name)

        emp.torch = Float64Torch()
        c64 = lambda d: {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in d.items()}
        model = model.double()
        st["model"] = [c64(c) for c in st["model"]]
        st["optimizer"] = [{k: c64(v) if isinstance(v, dict) else v for k, v in c.items()} for c in st["optimizer"]]
        st["batches"] = [c64(b) for b in st["batches"]]
        st["x_test"] = st["x_test"].double()
    full, mp, op, dp = explaind_paths(model, ckpts=st["model"], opt_ckpts=st["optimizer"], y=st["y_train"], hp=st["hp"])
    dp.checkpoints = st["batches"]
    full.load_state_dict(st["model"][0])

    orig = ExactPathKernelModel.exact_path_kernel_step_test

    def step_test(self, *args, prev_eval=None, **kw):  # explaind 0.1.0: prev_eval None fails at step 0
        return orig(self, *args, prev_eval={} if prev_eval is None else prev_eval, **kw)

    ExactPathKernelModel.exact_path_kernel_step_test = step_test
    eps, early_eps, early_steps = setting_args(setting)
    epk = ExactPathKernelModel(mp, op, torch.nn.CrossEntropyLoss(), dp, integral_eps=eps, early_integral_eps=early_eps,
                               early_steps=early_steps, device="cpu", evaluate_predictions=False, keep_param_wise_kernel=False)
    steps = epk.get_integral_steps(eps, early_eps=early_eps, early_steps=early_steps)
    evals = [len(p) for _, p in steps]
    t = time.time()
    pred, init, _, _, _ = epk.predict(st["x_test"])
    secs = time.time() - t
    np.save(out_npy, pred.detach().double().numpy())
    with open(out_npy + ".json", "w") as f:
        json.dump({"predict_seconds": secs, "evaluations_per_step": evals, "steps": len(evals)}, f)


def measured(cmd, log):
    """Runs cmd; (wall seconds, peak RSS MB of the process)."""
    t = time.time()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.time() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {os.waitstatus_to_exitcode(status)}); see {log}")
    return wall, ru.ru_maxrss / 1024.0


def errors(pred, ref, change):
    d = np.abs(pred - ref)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "max_rel": float(d.max() / change), "mean_rel": float(d.mean() / change)}


def read_ours(epk_dir):
    """Our reconstruction of f on the test points, [n, 10]: predictions.parquet's `kernel_machine`
    (the kernel machine with its weight-decay term and, for a float32 recording, the residual
    term), and the `network` column (our f64 forward of the recorded final weights)."""
    import pandas as pd

    t = pd.read_parquet(os.path.join(epk_dir, "predictions.parquet")).sort_values(["point", "class"])
    n, k = t["point"].nunique(), t["class"].nunique()
    return t["kernel_machine"].to_numpy().reshape(n, k), t["network"].to_numpy().reshape(n, k)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="cnn")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--per-class", type=int, default=30)
    ap.add_argument("--n-test", type=int, default=10)
    ap.add_argument("--settings", default="default,1,10,100,1000")
    ap.add_argument("--ours", default="auto:1e-12,midpoint:10,midpoint:100,midpoint:1000", help="comma-separated --quadrature rules for pathkernel (empty: ExPLAIND only)")
    ap.add_argument("--mnist", default=os.path.join(here, "..", "data", "mnist"))
    ap.add_argument("--pathkernel", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(here, "..", "target")), "release", "pathkernel"))
    ap.add_argument("--out", default=os.path.join(here, "..", "runs", "explaind-compare"))
    ap.add_argument("--report", default=os.path.join(here, "..", "reports", "explaind-compare"))
    ap.add_argument("--worker", nargs=3, metavar=("STATE", "SETTING", "OUT_NPY"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        explaind_worker(*a.worker)
        return
    torch.set_num_threads(2)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.report, exist_ok=True)
    rec_dir, run_dir, state = (os.path.join(a.out, s) for s in ("rec", "run", "explaind-state.pt"))
    shutil.rmtree(rec_dir, ignore_errors=True)
    data = mnist(a.mnist, a.per_class, a.n_test)
    t = time.time()
    model, mp, worst = train(a, data, rec_dir, state)
    t_train = time.time() - t
    xte = data[2]
    # the reference: the recorded final weights in float64
    ref_net = nn.Sequential(*build(a.arch), nn.LogSoftmax(dim=-1)).double()
    with torch.no_grad():
        ref_net.load_state_dict({k: v.double() for k, v in mp.checkpoints[-1].items()})
        ref = ref_net(xte.double()).numpy()
        f32 = nn.Sequential(*model, nn.LogSoftmax(dim=-1))(xte).double().numpy()
        ref_net.load_state_dict({k: v.double() for k, v in mp.checkpoints[0].items()})
        f0 = ref_net(xte.double()).numpy()
    change = float(np.abs(ref - f0).max())
    acc = float((ref.argmax(1) == data[3].numpy()).mean())
    print(f"{a.arch}: {sum(p.numel() for p in model.parameters())} parameters; {len(data[1])} training images, {a.steps} steps, "
          f"{a.n_test} test images; test accuracy {acc:.2f}; max |f_N - f_0| {change:.4g}; float32 network vs float64 reference {np.abs(f32 - ref).max():.3g}")
    rows = []
    for s in a.settings.split(","):
        out_npy = os.path.join(a.out, f"explaind-{s}.npy")
        wall, mb = measured([sys.executable, os.path.abspath(__file__), "--worker", state, s, out_npy], os.path.join(a.out, f"explaind-{s}.log"))
        with open(out_npy + ".json") as f:
            info = json.load(f)
        ev = info["evaluations_per_step"]
        base = s.removesuffix("-f64")
        r = {"tool": "ExPLAIND 0.1.0 (float64, patched)" if s.endswith("-f64") else "ExPLAIND 0.1.0 (float32)",
             "setting": base if base == "default" else f"{base} per step",
             "evaluations_per_step": float(np.mean(ev)), "evaluations_per_step_max": max(ev),
             **errors(np.load(out_npy), ref, change), "wall_s": wall, "predict_s": info["predict_seconds"], "peak_mb": mb}
        rows.append(r)
        print(f"ExPLAIND {s}: {r}", flush=True)
    wall_import = None
    if a.ours:
        wall_import, mb_import = measured([a.pathkernel, "import", "--from", "torch", rec_dir, "--out", run_dir, "--force"], os.path.join(a.out, "import.log"))
        print(open(os.path.join(a.out, "import.log")).read().strip())
        for rule in a.ours.split(","):
            epk_dir = os.path.join(a.out, "epk-" + rule.replace(":", "-"))
            wall, mb = measured([a.pathkernel, "kernel", "--run", run_dir, "--kind", "epk", "--quadrature", rule, "--points", "test", "--out", epk_dir, "--force"],
                                os.path.join(a.out, f"kernel-{rule.replace(':', '-')}.log"))
            with open(os.path.join(epk_dir, "exactness.json")) as f:
                ex = json.load(f)
            ours, network = read_ours(epk_dir)
            print(f"pathkernel's network column vs the float64 reference: {np.abs(network - ref).max():.3g}")
            ev = ex.get("evaluations_per_step", {})
            r = {"tool": "pathkernel (f64)", "setting": rule, "evaluations_per_step": ev.get("mean") if isinstance(ev, dict) else ev,
                 "evaluations_per_step_max": ev.get("max") if isinstance(ev, dict) else None,
                 **errors(ours, ref, change), "wall_s": wall + wall_import, "predict_s": wall, "peak_mb": max(mb, mb_import),
                 "exactness_max_abs_error": ex.get("max_abs_error"), "residual_term_max_abs": ex.get("rounding_term_max_abs")}
            rows.append(r)
            print(f"pathkernel {rule}: {r}", flush=True)
    head = ["tool", "setting", "evaluations per point and step (mean / max)", "max abs error", "mean abs error", "max rel error", "mean rel error",
            "wall s, whole (predict / kernel)", "peak MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    csv = [",".join(["tool", "setting", "evals_mean", "evals_max", "max_abs", "mean_abs", "max_rel", "mean_rel", "wall_s", "kernel_s", "peak_mb"])]
    for r in rows:
        ev = f"{r['evaluations_per_step']:.4g} / {r['evaluations_per_step_max']}" if r["evaluations_per_step"] is not None else "?"
        lines.append(f"| {r['tool']} | {r['setting']} | {ev} | {r['max_abs']:.2e} | {r['mean_abs']:.2e} | {r['max_rel']:.2e} | {r['mean_rel']:.2e} | "
                     f"{r['wall_s']:.1f} ({r['predict_s']:.1f}) | {r['peak_mb']:.0f} |")
        csv.append(",".join(str(v) for v in (r["tool"], r["setting"], r["evaluations_per_step"], r["evaluations_per_step_max"], r["max_abs"], r["mean_abs"],
                                              r["max_rel"], r["mean_rel"], r["wall_s"], r["predict_s"], r["peak_mb"])))
    with open(os.path.join(a.report, "compare.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(a.report, "compare.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")
    summary = {"args": {k: v for k, v in vars(a).items() if k != "worker"}, "parameters": sum(p.numel() for p in model.parameters()),
               "train_images": len(data[1]), "test_accuracy": acc, "max_change": change, "recorders_weight_difference": worst,
               "float32_network_vs_reference": float(np.abs(f32 - ref).max()), "train_seconds": t_train, "import_seconds": wall_import, "rows": rows}
    with open(os.path.join(a.report, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
