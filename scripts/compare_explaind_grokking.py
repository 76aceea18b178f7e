"""ExPLAIND (PyPI `explaind` 0.1.0, Python >= 3.12; outside CI) on a grokking run: the
modular-addition transformer of scripts/grokking_torch.py trained inside ExPLAIND's wrappers, then
ExPLAIND's exact-path-kernel reconstruction of the final network on held-out pairs at several
quadrature settings, timed and measured. The grokking counterpart of scripts/compare_explaind.py
(whose lessons it follows); the pathkernel side waits for the Rust importer to know the
transformer (the run is recorded for it with our recorder, OUT/rec).

    OMP_NUM_THREADS=1 /work/venv-explaind/bin/python scripts/compare_explaind_grokking.py
        [--p 31] [--d 64] [--heads 4] [--m 256] [--train-frac 0.8] [--seed 0] [--data-seed 0]
        [--epochs 5840] [--lr 1e-3] [--wd 2.0] [--beta2 0.98] [--init-scale 0.1] [--n-test 10]
        [--settings default,1,10,100,1000] [--budget-s 600] [--probe-steps 12] [--probe-evals 6000]
        [--windows K:W,...] [--reuse]
        [--out runs/explaind-grokking] [--report bench/explaind-grokking]

The run. `GrokkingTransformer(p, d, heads, m)` (ExPLAIND's SingleLayerTransformerClassifier; see
grokking_torch.py) under torch.manual_seed(seed), its parameters scaled by `--init-scale`, **float32** (ExPLAIND 0.1.0's feature map keeps
only the parameters whose dtype is `torch.float`: a float64 model gets no features), trained full
batch by `torch.optim.AdamW(lr, betas=(0.9, beta2), eps=1e-8, weight_decay=wd)` on the mean
cross-entropy of its logits, one step per epoch, on the same split as grokking_torch.py
(`--train-frac` of the p(p+1)/2 pairs, numpy seed `--data-seed`). It is trained **once**, inside
ExPLAIND's wrappers: `explaind.model_paths.ModelPath` around `Sequential(model, LogSoftmax)` (its
output, whose loss gradient is the one-hot target, with `output_dim = p + 2`), the
`torch.optim.AdamW` that `explaind.optimizer_paths.AdamWOptimizerPath` builds and checkpoints (its
per-step first and second moments), `explaind.data_paths.DataPath` logging the full batch of
every step. The same optimizer is handed to our recorder (python/pathkernel_recorder) writing
OUT/rec; the script checks that both records hold the same weights at every step (0 expected).
Train and held-out accuracy of the float32 run are logged every 10 epochs (report: the epochs at
which it memorised and generalised; the float32 run need not grok at the epoch the float64 run of
grokking_torch.py does).

The output compared is the **log-softmax** (all p + 2 outputs) on the first `n-test` held-out
pairs. Reference: the recorded final weights run in float64 (the float32 network's difference from
it is printed). Errors are absolute, in log-probability units, and relative: divided by the
largest change of the output over training, max |f_N - f_0| (the reconstruction starts from the
exact f_0 and builds the change).

ExPLAIND: `ExactPathKernelModel.predict` (its AdamW decomposition: per-training-point first-moment
features normalised by the recorded second moment, plus its weight-decay "reg term"), midpoint rule
with K evaluations per step (`integral_eps = 1/K`; `default` is its constructor's defaults,
`integral_eps=0.1, early_integral_eps=0.001, early_steps=4`: 1 000 evaluations for the first 4
steps, 10 after; `K` sets both eps to 1/K, `1` passed as the integer 1, which its code needs), as
shipped in float32, `evaluate_predictions=False`, `keep_param_wise_kernel=False`, one torch
thread. The one runtime patch of compare_explaind.py: `exact_path_kernel_step_test` gets `{}` for
`prev_eval` instead of None (0.1.0 fails at step 0 otherwise); the wrapper also times each step.
An evaluation is one point of its midpoint rule: the gradients of all p + 2 outputs of every test
point at one interpolated weight vector.

Cost. Each setting runs in its own process (wall time and peak RSS via `os.wait4`). First a probe:
the path cut to its first `min(probe-steps, probe-evals / K)` steps (at least 6; K the late steps' evaluations) (`ModelPath.checkpoints` truncated; the moments and
batches of those steps are the run's), every step timed. Its full-path time is extrapolated as the
probe's early steps plus the mean of its later steps times the remaining steps. When that is at most
`--budget-s`, the whole path is run and measured; otherwise the probe stands, **labelled
extrapolated**, with its error at the end of the probe window (the reconstruction of f at
w_probe from f_0, against the float64 network at w_probe) in place of the whole path's.

`--windows K:W,...` (after a run, reading OUT's state): ExPLAIND with K evaluations per step on
the first W steps of the path, its error at w_W, wall time and peak RSS, appended to
REPORT/results.json as `windows` (longer windows than the probe, each kept under ten minutes).

Writes OUT/ (ExPLAIND's state, the recording, each worker's log and prediction, train.json) and
REPORT/table.md, results.json (results.md is written by hand around them).
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
from compare_explaind import Targets, measured  # noqa: E402
from grokking_torch import GrokkingTransformer, build, first, modular_data  # noqa: E402


def explaind_paths(model, hp, y, ckpts=None, opt_ckpts=None):
    from explaind.data_paths import DataPath
    from explaind.model_paths import ModelPath
    from explaind.optimizer_paths import AdamWOptimizerPath

    full = nn.Sequential(model, nn.LogSoftmax(dim=-1))
    mp = ModelPath(full, device="cpu", checkpoints=ckpts, output_dim=hp["p"] + 2)
    op = AdamWOptimizerPath(mp, lr=hp["lr"], betas=(0.9, hp["beta2"]), eps=1e-8, weight_decay=hp["wd"],
                            checkpoints=[] if opt_ckpts is None else opt_ckpts, device="cpu")
    dp = DataPath(torch.utils.data.DataLoader(Targets(y), batch_size=len(y)))
    return full, mp, op, dp


def f64_net(hp, state):
    net = GrokkingTransformer(hp["p"], hp["d"], hp["heads"], hp["m"]).double()
    net.load_state_dict({k.removeprefix("0."): v.double() for k, v in state.items()})
    return net


def train(a, rec_dir, state_path):
    sys.path.insert(0, os.path.join(here, "..", "python", "pathkernel_recorder"))
    from pathkernel_recorder.recorder import TrajectoryRecorder
    from safetensors.torch import load_file

    hp = {k: getattr(a, k) for k in ("p", "d", "heads", "m", "lr", "wd", "beta2", "seed", "data_seed", "train_frac", "epochs", "init_scale")}
    xtr, ytr, xte, yte = modular_data(a.p, a.train_frac, a.data_seed)
    model = build(a.p, a.d, a.heads, a.m, a.seed, a.init_scale, torch.float32)
    full, mp, op, dp = explaind_paths(model, hp, ytr)
    rec = TrajectoryRecorder(rec_dir, model, xtr, ytr, xte[: a.n_test], yte[: a.n_test], loss="cross_entropy", optimizer=op.optimizer,
                             description=f"compare_explaind_grokking.py: a + b mod {a.p}, d {a.d}, {a.heads} heads, m {a.m}, full-batch AdamW "
                                         f"lr {a.lr} wd {a.wd} betas (0.9, {a.beta2}), {a.epochs} epochs, float32")
    with open(os.path.join(rec_dir, "grokking_model.json"), "w") as f:
        json.dump(dict(model.spec(), config=hp), f, indent=1)
    idx = torch.arange(len(ytr))
    hist = []
    rec.start()
    t = time.time()
    for s in range(a.epochs + 1):
        if s % 10 == 0 or s == a.epochs:
            with torch.no_grad():
                tr, te = model(xtr), model(xte)
            hist.append({"epoch": s, "train_acc": (tr.argmax(1) == ytr).float().mean().item(), "test_acc": (te.argmax(1) == yte).float().mean().item(),
                         "train_loss": F.cross_entropy(tr, ytr).item(), "test_loss": F.cross_entropy(te, yte).item()})
            if s % 500 == 0 or s == a.epochs:
                print(f"epoch {s}: train acc {hist[-1]['train_acc']:.4f} loss {hist[-1]['train_loss']:.3e}, held-out acc {hist[-1]['test_acc']:.4f}", flush=True)
        if s == a.epochs:
            break
        op.zero_grad()
        F.cross_entropy(model(xtr), ytr).backward()
        op.step()
        rec.step(batch=None)
        mp.log_checkpoint()
        op.log_checkpoint()
        dp.log_batch(xtr, ytr, idx)
    secs = time.time() - t
    rec.finish()
    worst = 0.0
    for s, ck in enumerate(mp.checkpoints):
        ours = load_file(os.path.join(rec_dir, f"step_{s:05d}.safetensors"))
        worst = max(worst, max(float((ck["0." + k] - v).abs().max()) for k, v in ours.items()))
    print(f"trained {a.epochs} epochs in {secs:.1f} s; ExPLAIND's and our recorder's weights, largest difference over {len(mp.checkpoints)} states: {worst:.3g}")
    torch.save({"model": mp.checkpoints, "optimizer": op.checkpoints, "batches": dp.checkpoints, "hp": hp, "y_train": ytr,
                "x_test": xte[: a.n_test]}, state_path)
    return mp, hist, worst, secs


def setting_args(setting):
    """(integral_eps, early_integral_eps, early_steps) of a setting name."""
    if setting == "default":
        return 0.1, 0.001, 4
    k = int(setting)
    eps = 1 if k == 1 else 1.0 / k
    return eps, eps, 4


def explaind_worker(state_path, setting, out_npy, window):
    """One ExPLAIND predict in its own process; `window` > 0 cuts the path to its first `window` steps."""
    from explaind.epk_model import ExactPathKernelModel

    torch.set_num_threads(1)
    window = int(window)
    st = torch.load(state_path, weights_only=False)
    hp = st["hp"]
    model = GrokkingTransformer(hp["p"], hp["d"], hp["heads"], hp["m"]).float()
    ck = st["model"] if window <= 0 else st["model"][: window + 1]
    full, mp, op, dp = explaind_paths(model, hp, st["y_train"], ckpts=ck, opt_ckpts=st["optimizer"])
    dp.checkpoints = st["batches"]
    full.load_state_dict(st["model"][0])
    orig = ExactPathKernelModel.exact_path_kernel_step_test
    step_s = []

    def step_test(self, *args, prev_eval=None, **kw):  # explaind 0.1.0: prev_eval None fails at step 0; timed
        t = time.time()
        r = orig(self, *args, prev_eval={} if prev_eval is None else prev_eval, **kw)
        step_s.append(time.time() - t)
        return r

    ExactPathKernelModel.exact_path_kernel_step_test = step_test
    eps, early_eps, early_steps = setting_args(setting)
    epk = ExactPathKernelModel(mp, op, torch.nn.CrossEntropyLoss(), dp, integral_eps=eps, early_integral_eps=early_eps,
                               early_steps=early_steps, device="cpu", evaluate_predictions=False, keep_param_wise_kernel=False)
    evals = [len(p) for _, p in epk.get_integral_steps(eps, early_eps=early_eps, early_steps=early_steps)]
    t = time.time()
    pred, _, _, _, _ = epk.predict(st["x_test"])
    secs = time.time() - t
    np.save(out_npy, pred.detach().double().numpy())
    with open(out_npy + ".json", "w") as f:
        json.dump({"predict_seconds": secs, "evaluations_per_step": evals, "steps": len(evals), "step_seconds": step_s, "window": window}, f)


def errors(pred, ref, change):
    d = np.abs(pred - ref)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "max_rel": float(d.max() / change), "mean_rel": float(d.mean() / change),
            "change": change}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--p", type=int, default=31)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--train-frac", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=5840)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=2.0)
    ap.add_argument("--beta2", type=float, default=0.98)
    ap.add_argument("--init-scale", type=float, default=0.1)
    ap.add_argument("--n-test", type=int, default=10)
    ap.add_argument("--settings", default="default,1,10,100,1000")
    ap.add_argument("--budget-s", type=float, default=600, help="run the whole path when the probe extrapolates to at most this")
    ap.add_argument("--probe-steps", type=int, default=12)
    ap.add_argument("--probe-evals", type=int, default=6000, help="the probe's steps: min(probe-steps, probe-evals / K), at least 6")
    ap.add_argument("--reuse", action="store_true", help="reuse OUT's trained state (skip training)")
    ap.add_argument("--out", default=os.path.join(here, "..", "runs", "explaind-grokking"))
    ap.add_argument("--report", default=os.path.join(here, "..", "bench", "explaind-grokking"))
    ap.add_argument("--windows", default="", help="K:W,... : after a run (its OUT), ExPLAIND with K evaluations per step on the first W steps, "
                    "added to REPORT/results.json as `windows`")
    ap.add_argument("--worker", nargs=4, metavar=("STATE", "SETTING", "OUT_NPY", "WINDOW"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        explaind_worker(*a.worker)
        return
    if a.windows:
        run_windows(a)
        return
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.report, exist_ok=True)
    rec_dir, state = os.path.join(a.out, "rec"), os.path.join(a.out, "explaind-state.pt")
    summary_path = os.path.join(a.out, "train.json")
    if a.reuse:
        with open(summary_path) as f:
            tr = json.load(f)
        st = torch.load(state, weights_only=False)
        ckpts, hist, worst, t_train = st["model"], tr["history"], tr["recorders_weight_difference"], tr["train_seconds"]
        del st
    else:
        shutil.rmtree(rec_dir, ignore_errors=True)
        os.makedirs(rec_dir)
        mp, hist, worst, t_train = train(a, rec_dir, state)
        ckpts = mp.checkpoints
        with open(summary_path, "w") as f:
            json.dump({"history": hist, "recorders_weight_difference": worst, "train_seconds": t_train}, f)
    hp = {k: getattr(a, k) for k in ("p", "d", "heads", "m")}
    _, _, xte, yte = modular_data(a.p, a.train_frac, a.data_seed)
    xte, yte = xte[: a.n_test], yte[: a.n_test]
    with torch.no_grad():
        f_at = lambda s: F.log_softmax(f64_net(hp, ckpts[s])(xte), -1).numpy()
        ref, f0 = f_at(-1), f_at(0)
        net32 = GrokkingTransformer(a.p, a.d, a.heads, a.m).float()
        net32.load_state_dict({k.removeprefix("0."): v for k, v in ckpts[-1].items()})
        f32 = F.log_softmax(net32(xte), -1).double().numpy()
    n_steps = len(ckpts) - 1
    change = float(np.abs(ref - f0).max())
    acc = float((ref.argmax(1) == yte.numpy()).mean())
    n_par = sum(v.numel() for v in ckpts[0].values())
    marks = {"train_0.99": first(hist, "train_acc", 0.99), "train_1.0": first(hist, "train_acc", 1.0),
             "test_0.5": first(hist, "test_acc", 0.5), "test_0.99": first(hist, "test_acc", 0.99), "test_1.0": first(hist, "test_acc", 1.0)}
    print(f"{n_par} parameters, {n_steps} steps; float32 run: train acc >= 0.99 at epoch {marks['train_0.99']}, held-out >= 0.99 at "
          f"{marks['test_0.99']}, final held-out {hist[-1]['test_acc']:.4f}; {a.n_test} test pairs: accuracy {acc:.2f}, max |f_N - f_0| {change:.4g}, "
          f"float32 network vs float64 reference {np.abs(f32 - ref).max():.3g}", flush=True)
    rows = []
    for s in a.settings.split(","):
        probe_npy = os.path.join(a.out, f"explaind-{s}-probe.npy")
        k_late = 10 if s == "default" else int(s)
        probe_steps = max(6, min(a.probe_steps, a.probe_evals // k_late))
        wall_p, mb_p = measured([sys.executable, os.path.abspath(__file__), "--worker", state, s, probe_npy, str(probe_steps)],
                                os.path.join(a.out, f"explaind-{s}-probe.log"))
        with open(probe_npy + ".json") as f:
            pinfo = json.load(f)
        ss = pinfo["step_seconds"]
        early = min(4, len(ss))
        late = ss[early:] or ss
        est_predict = sum(ss[:early]) + float(np.mean(late)) * (n_steps - early)
        overhead = wall_p - pinfo["predict_seconds"]
        est_wall = est_predict + overhead
        print(f"ExPLAIND {s}: probe of {len(ss)} steps {pinfo['predict_seconds']:.1f} s (late steps {np.mean(late):.3f} s each); "
              f"whole path extrapolated {est_wall:.0f} s", flush=True)
        evals_full = [1000 if (s == "default" and i < 4) else (10 if s == "default" else int(s)) for i in range(n_steps)]
        r = {"tool": "ExPLAIND 0.1.0 (float32)", "setting": s if s == "default" else f"{s} per step",
             "evaluations_per_step": float(np.mean(evals_full)), "evaluations_per_step_max": max(evals_full),
             "probe": {"steps": len(ss), "predict_s": pinfo["predict_seconds"], "wall_s": wall_p, "peak_mb": mb_p,
                       "late_step_s": float(np.mean(late)), "early_steps_s": sum(ss[:early])},
             "extrapolated_wall_s": est_wall}
        if est_wall <= a.budget_s:
            out_npy = os.path.join(a.out, f"explaind-{s}.npy")
            wall, mb = measured([sys.executable, os.path.abspath(__file__), "--worker", state, s, out_npy, "0"], os.path.join(a.out, f"explaind-{s}.log"))
            with open(out_npy + ".json") as f:
                info = json.load(f)
            assert info["steps"] == n_steps, (info["steps"], n_steps)
            r.update(measured_whole_path=True, **errors(np.load(out_npy), ref, change), wall_s=wall, predict_s=info["predict_seconds"], peak_mb=mb)
        else:
            w = len(ss)
            with torch.no_grad():
                ref_w, f0_w = f_at(w), f0
            e = errors(np.load(probe_npy), ref_w, float(np.abs(ref_w - f0_w).max()))
            r.update(measured_whole_path=False, window_steps=w, **{f"window_{k}": v for k, v in e.items()}, wall_s=est_wall,
                     predict_s=est_predict, peak_mb=mb_p)
        rows.append(r)
        print(f"ExPLAIND {s}: {json.dumps(r)}", flush=True)
    write_report(a, rows, hist, marks, n_par, n_steps, acc, change, worst, float(np.abs(f32 - ref).max()), t_train)


def run_windows(a):
    """`--windows K:W,...`: ExPLAIND on the first W steps of OUT's run (K per step, or `default`),
    its reconstruction of f at w_W against the float64 network at w_W; appended to results.json."""
    torch.set_num_threads(1)
    state = os.path.join(a.out, "explaind-state.pt")
    st = torch.load(state, weights_only=False)
    ckpts = st["model"]
    del st
    hp = {k: getattr(a, k) for k in ("p", "d", "heads", "m")}
    _, _, xte, _ = modular_data(a.p, a.train_frac, a.data_seed)
    xte = xte[: a.n_test]
    path = os.path.join(a.report, "results.json")
    with open(path) as f:
        summary = json.load(f)
    for spec in a.windows.split(","):
        s, w = spec.split(":")
        w = int(w)
        out_npy = os.path.join(a.out, f"explaind-{s}-window{w}.npy")
        wall, mb = measured([sys.executable, os.path.abspath(__file__), "--worker", state, s, out_npy, str(w)],
                            os.path.join(a.out, f"explaind-{s}-window{w}.log"))
        with open(out_npy + ".json") as f:
            info = json.load(f)
        with torch.no_grad():
            ref_w = F.log_softmax(f64_net(hp, ckpts[w])(xte), -1).numpy()
            f0 = F.log_softmax(f64_net(hp, ckpts[0])(xte), -1).numpy()
        r = {"setting": s, "window_steps": w, **errors(np.load(out_npy), ref_w, float(np.abs(ref_w - f0).max())), "wall_s": wall,
             "predict_s": info["predict_seconds"], "peak_mb": mb, "late_step_s": float(np.mean(info["step_seconds"][4:]))}
        print(f"ExPLAIND {s} on the first {w} steps: {json.dumps(r)}", flush=True)
        summary.setdefault("windows", []).append(r)
        summary.setdefault("windows_commands", []).append("OMP_NUM_THREADS=1 /work/venv-explaind/bin/python scripts/compare_explaind_grokking.py "
                                                          + " ".join(sys.argv[1:]))
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)


def write_report(a, rows, hist, marks, n_par, n_steps, acc, change, worst, f32err, t_train):
    cmd = "OMP_NUM_THREADS=1 /work/venv-explaind/bin/python scripts/compare_explaind_grokking.py " + " ".join(
        x for x in sys.argv[1:])
    head = ["setting", "evaluations per point and step (mean / max)", "max abs error", "mean abs error", "max rel error", "mean rel error",
            "wall s, whole (predict)", "peak MB", "measured"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ev = f"{r['evaluations_per_step']:.4g} / {r['evaluations_per_step_max']}"
        if r["measured_whole_path"]:
            lines.append(f"| {r['setting']} | {ev} | {r['max_abs']:.2e} | {r['mean_abs']:.2e} | {r['max_rel']:.2e} | {r['mean_rel']:.2e} | "
                         f"{r['wall_s']:.1f} ({r['predict_s']:.1f}) | {r['peak_mb']:.0f} | whole path |")
        else:
            lines.append(f"| {r['setting']} | {ev} | ({r['window_max_abs']:.2e} at w_{r['window_steps']}) | ({r['window_mean_abs']:.2e}) | "
                         f"({r['window_max_rel']:.2e}) | ({r['window_mean_rel']:.2e}) | **{r['wall_s']:.0f} extrapolated** ({r['predict_s']:.0f}) | "
                         f"{r['peak_mb']:.0f} | first {r['window_steps']} steps, extrapolated |")
    summary = {"command": cmd, "args": {k: v for k, v in vars(a).items() if k != "worker"}, "parameters": n_par, "steps": n_steps,
               "float32_run": {"first_epoch": marks, "final": hist[-1], "train_seconds": t_train},
               "test_points": a.n_test, "test_accuracy_final": acc, "max_change": change, "recorders_weight_difference": worst,
               "float32_network_vs_reference": f32err, "torch": torch.__version__, "rows": rows, "history_every_10": hist}
    with open(os.path.join(a.report, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(a.report, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
