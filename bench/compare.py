"""Side-by-side timings of pathkernel against numpy, neural-tangents, scipy and scikit-learn on
identical inputs (the run's trajectory and dataset, and the arrays `pathkernel bench --export`
wrote). Prints a markdown table of ratios and the max relative differences of the results.

Usage: python bench/compare.py RUN_DIR EXPORT_DIR [--repeat N] [--rounds R --pk BIN]
(bench/compare.sh does it all). With --rounds, our fast cases (a fresh `pathkernel bench`) and
the peers are timed alternately R times and each side's fastest is kept, so that a burst of
load on a shared machine does not land on one side only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file


def timed(f, repeat):
    """(min, median) seconds of `repeat` calls of f, and the last result (after a warm-up call)."""
    out = f()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts), out


def rel(a, b):
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def load_run(run, step):
    m = json.load(open(f"{run}/manifest.json"))
    arch = m["architecture"]
    assert arch["body"]["kind"] == "mlp" and arch["activation"] == "relu", "the comparison covers ReLU MLPs"
    assert arch["alpha"] == 1.0 and not arch["zero_output"] and arch["output"] == "log-softmax"
    ds = load_file(f"{run}/dataset.safetensors")
    w = load_file(f"{run}/trajectory/step-{step:06d}.safetensors")
    nl = len(arch["body"]["widths"]) - 1
    params = [(w[f"layers.{l}.weight"], w[f"layers.{l}.bias"]) for l in range(nl)]
    return m, ds, params


# ----------------------------------------------------------------------------------------------
# numpy: the NTK of a ReLU MLP with log-softmax outputs in closed form.
#   K[p,i,k,k'] = sum_l (delta_{p,l}[k] . delta_{i,l}[k']) (a_{p,l} . a_{i,l} + 1)
# with a_l the layer inputs and delta_l[k] = d f_k / d z_l (backpropagated through the ReLUs and
# the log-softmax Jacobian I - softmax).
# ----------------------------------------------------------------------------------------------
def factors(params, x):
    acts, pre = [], []
    a = x
    for l, (W, b) in enumerate(params):
        acts.append(a)
        z = a @ W.T + b
        pre.append(z)
        a = np.maximum(z, 0.0) if l + 1 < len(params) else z
    z = a - a.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n, k = p.shape
    # d f_k / d z_L[j] = [k == j] - p_j   -> [n, K, K]
    d = np.broadcast_to(np.eye(k), (n, k, k)) - p[:, None, :]
    deltas = [None] * len(params)
    for l in range(len(params) - 1, -1, -1):
        deltas[l] = d
        if l > 0:
            d = (d @ params[l][0]) * (pre[l - 1] > 0)[:, None, :]
    return acts, deltas


def ntk_numpy(params, xr, xt):
    ar, dr = factors(params, xr)
    at, dt = factors(params, xt)
    P, M, K = xr.shape[0], xt.shape[0], dr[0].shape[1]
    g = np.zeros((P, K, M, K))
    for l in range(len(params)):
        s = ar[l] @ at[l].T + 1.0  # [P, M]
        d = dr[l].reshape(P * K, -1) @ dt[l].reshape(M * K, -1).T  # [(P,K), (M,K)]
        g += s[:, None, :, None] * d.reshape(P, K, M, K)
    return g.transpose(0, 2, 1, 3)  # [P, M, K, K] (a view, as einsum would return)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("export")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1, help="alternate our timings and the peers' this many times")
    ap.add_argument("--pk", help="the pathkernel binary: re-run its fast cases in every round")
    ap.add_argument("--skip-nt", action="store_true")
    args = ap.parse_args()
    ours = {}
    for line in open(f"{args.export}/results.jsonl"):
        r = json.loads(line)
        ours[r["name"]] = r
    ntk_out = load_file(f"{args.export}/ntk_step.safetensors")
    step = ours["ntk_step"]["step"]
    m, ds, params = load_run(args.run, step)
    xr, xt = ds["x_test"], ds["x_train"]
    gp = os.path.exists(f"{args.export}/gram_problem.safetensors")

    # Peers: name -> (case, ours name, target label, target, function returning (min, median, rel diff)).
    peers = {}
    peers["numpy"] = ("NTK step [200×3000×3×3]", "ntk_step", "numpy closed form", "≤ 1.5×", 1.5,
                      lambda: timed(lambda: ntk_numpy(params, xr, xt), args.repeat))
    diffs = {"numpy": lambda out: rel(ntk_out["gram"], out)}
    if not args.skip_nt:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        import neural_tangents as nt

        def f(ps, x):
            a = x
            for l, (W, b) in enumerate(ps):
                a = a @ W.T + b
                if l + 1 < len(ps):
                    a = jnp.maximum(a, 0.0)
            return jax.nn.log_softmax(a, axis=-1)

        jp = [(jnp.asarray(W), jnp.asarray(b)) for W, b in params]
        jxr, jxt = jnp.asarray(xr), jnp.asarray(xt)
        for impl in [nt.NtkImplementation.STRUCTURED_DERIVATIVES, nt.NtkImplementation.JACOBIAN_CONTRACTION]:
            fn = jax.jit(nt.empirical_ntk_fn(f, trace_axes=(), vmap_axes=0, implementation=impl))
            sd = impl == nt.NtkImplementation.STRUCTURED_DERIVATIVES
            peers[impl.name] = ("NTK step [200×3000×3×3]", "ntk_step", f"neural-tangents {impl.name} (jit)",
                                "≤ 1/3" if sd else "(info)", 1 / 3 if sd else None,
                                (lambda fn=fn: timed(lambda: fn(jxr, jxt, jp).block_until_ready(), args.repeat)))
            diffs[impl.name] = lambda out: rel(ntk_out["gram"], np.asarray(out))
    if gp:
        import scipy.linalg as sl
        from sklearn.svm import SVC

        g = load_file(f"{args.export}/gram_problem.safetensors")
        K, y, noise = g["k"], g["y"], float(g["noise"][0])
        M = K.shape[0]
        C, tol = float(g["c"][0]), float(g["tol"][0])

        def chol():
            c = sl.cho_factor(K + noise * np.eye(M), lower=True, check_finite=False)
            return sl.cho_solve(c, y, check_finite=False)

        peers["scipy"] = (f"GP Cholesky + solve, M = {M}", "cholesky_solve", "scipy cho_factor + cho_solve", "≤ 1×", 1.0,
                          lambda: timed(chol, args.repeat))
        diffs["scipy"] = lambda out: rel(g["gp_alpha"], out)
        # libsvm puts classes_[0] first; label 0 for our +1 class makes its problem ours, so
        # (K holds f32 values, as libsvm's cache) its iterates equal ours; decision = -ours.
        ysk = np.where(y > 0, 0, 1)
        for shrinking in [True, False]:
            fit = (lambda sh=shrinking: SVC(kernel="precomputed", C=C, tol=tol, shrinking=sh, cache_size=200).fit(K, ysk))
            peers[f"svc{shrinking}"] = (f"SVM SMO, M = {M}", "smo", f"scikit-learn SVC(precomputed, shrinking={shrinking})",
                                        "≤ 2×" if shrinking else "(info)", 2.0 if shrinking else None,
                                        (lambda fit=fit: timed(fit, args.repeat)))
            diffs[f"svc{shrinking}"] = lambda svc: rel(g["svm_decision"], -svc.decision_function(K))
    iters = {}

    # Rounds: our fast cases (fresh process) and then every peer, alternately; minima over rounds.
    best_ours = {k: (v["seconds_min"], v["seconds_median"]) for k, v in ours.items()}
    best_peer = {}
    results = {}
    for rnd in range(args.rounds):
        if args.pk and (rnd > 0 or args.rounds > 1):
            cmd = [args.pk, "bench", "--run", args.run, "--step", str(step), "--repeat", str(args.repeat)]
            if gp:
                cmd += ["--gram-m", str(M)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                r = json.loads(line)
                a, b = best_ours.get(r["name"], (float("inf"), float("inf")))
                best_ours[r["name"]] = (min(a, r["seconds_min"]), min(b, r["seconds_median"]))
        for key, (_, _, _, _, _, run) in peers.items():
            tmin, tmed, out = run()
            a, b = best_peer.get(key, (float("inf"), float("inf")))
            best_peer[key] = (min(a, tmin), min(b, tmed))
            if key not in results:
                results[key] = diffs[key](out)
                if key.startswith("svc"):
                    iters[key] = int(out.n_iter_[0])

    # --- table ------------------------------------------------------------------------------------
    print("| case | pathkernel s (min / median) | peer | peer s (min / median) | ratio (min) | target | met | max rel. diff |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for key, (case, oname, peer, tlabel, tval, _) in peers.items():
        omin, omed = best_ours[oname]
        pmin, pmed = best_peer[key]
        d = results[key]
        if key in iters:
            peer += f", n_iter {iters[key]} (ours {ours['smo']['iterations']})"
        ratio = omin / pmin
        met = "—" if tval is None else ("yes" if ratio <= tval else "**no**")
        agree = d <= 1e-10
        ok &= agree
        print(f"| {case} | {omin:.3f} / {omed:.3f} | {peer} | {pmin:.3f} / {pmed:.3f} | {ratio:.2f} | {tlabel} | {met} | {d:.1e}{'' if agree else ' (> 1e-10!)'} |")
    if "epk_step" in ours:
        e, n = best_ours["epk_step"], best_ours["ntk_step"]
        r = e[0] / n[0]
        print(f"| EPK step (auto:1e-12, {ours['epk_step']['evaluations']:.2f} evals/pt) vs our NTK step | {e[0]:.3f} / {e[1]:.3f} | pathkernel NTK step | {n[0]:.3f} / {n[1]:.3f} | {r:.2f} | ≤ 2× | {'yes' if r <= 2 else '**no**'} | machine vs network {ours['epk_step']['step_max_abs_error']:.1e} |")
    for name in ["epk_full", "epk_full_blocked"]:
        if name in ours:
            r = ours[name]
            ratio = r["peak_bytes"] / r["output_bytes"]
            print(f"| peak heap, {name} ({r['steps']} steps, {r['blocks']} block(s)) | {r['seconds_min']:.2f} s | output {r['output_bytes'] / 2**20:.1f} MiB | peak {r['peak_bytes'] / 2**20:.1f} MiB | {ratio:.2f} | ≤ 2× | {'yes' if ratio <= 2 else '**no**'} | |")
    if not ok:
        print("results disagree beyond 1e-10 relative", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
