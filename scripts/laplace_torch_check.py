#!/usr/bin/env python3
"""Cross-check of pathkernel's function-space and last-layer Laplace against laplace-torch on the same network.

    python3 scripts/laplace_torch_check.py reports/mnist-uncertainty [--cache runs/mnist-uncertainty]
        [--model model.safetensors] [--points N] [--batch 100] [--check all|fsl|fsl-kxk|lastlayer]
        [--lastlayer DIR | --pathkernel BIN]

Needs torch and laplace-torch, which CI does not install (they are large). Install them in a
virtual environment outside the repository:

    python3 -m venv ~/venv-laplace && ~/venv-laplace/bin/pip install torch laplace-torch pyarrow safetensors
    ~/venv-laplace/bin/python scripts/laplace_torch_check.py reports/mnist-uncertainty

What it does, on the uncertainty study's network under test (read from the study's cache, or the
`pathkernel export --format torch` file given with --model):

1. rebuilds the 784-128-10 MLP as `nn.Sequential(Linear, ReLU, Linear)` in float64 and checks
   that its softmax equals the study's MAP probabilities (`predictions.parquet`, method `map`);
2. fits laplace-torch's `FunctionalLaplace` (`Laplace(model, 'classification',
   subset_of_weights='all', hessian_structure='gp', independent_outputs=True)`) on the same
   2 000 training images with the prior precision δ our `fsl-ntk-diag` chose by the evidence
   (`gp_fits.json`);
3. compares per test point and class laplace-torch's `functional_variance` (summed over the
   classes: our study keeps the trace, `runs/…/ntk-gp/clean.safetensors`) and its probit
   probabilities with ours (`fsl-ntk-diag` in `predictions.parquet`), relative differences.

laplace-torch replaces 1/λ = ∞ (a training point with p_ic exactly 0 or 1 in float64) by 10; the
script reports how many such λ there are, since there the two constructions differ by design.

The cross-class check (`--check fsl-kxk`, part of `all` when the study has the fit):

4. fits `Laplace(model, 'classification', subset_of_weights='all', hessian_structure='gp',
   independent_outputs=False)` (the whole [M·K, M·K] kernel; `_build_L` keeps the diagonal
   λ = p − p², `_build_Sigma_inv` factors K/δ + diag(1/λ)) with the δ our `fsl-ntk-kxk-diag`
   chose by the evidence, and compares with ours (`src/gp/crossclass/`): the K × K predictive
   covariance per clean test point (laplace-torch's `functional_variance`; ours from the study's
   cache, `runs/…/ntk-gp/clean.safetensors`, array `fsl-ntk-kxk-diag/cov`), the probit
   probabilities (`predictions.parquet`), and the evidence's terms at δ (ours in
   `gp_fits.json`): laplace-torch's `log_likelihood` and `log_det_ratio` against ours, and
   `rᵀK⁺r` from numpy's `eigh` of laplace-torch's own `K_MM` with our rule (eigenvalues above
   1e-12 of the largest) and our targets r = f(w_N) − f(w_0), permuted into the order of its
   subset-of-data sampler (`SoDSampler`, a seeded permutation even when M = N), and
   `log_likelihood − ½ (log_det_ratio + δ rᵀK⁺r)`. laplace-torch's own `scatter` uses
   `mu = J θ_MAP` (prior mean at θ = 0) and solves `K/δ + 1e-5 I` by Cholesky (printed for
   reference on our r, with that jitter and without).

The last-layer check (`--check lastlayer`, part of `all`):

4. our side comes from the Rust code: `pathkernel laplace --run RUN --step S --grid …` (the
   benchmark's fit, `src/gp/lastlayer.rs`, with the benchmark's λ grid from `uq.json`) writes the
   posterior precision `H + λ I`, `H`, `Σ`, θ* and the logit posterior at the test points; the
   script runs it into a temporary directory (`--pathkernel BIN`, default `pathkernel` on PATH or
   `target/release/pathkernel`) or reads a directory given with `--lastlayer`. It checks that this
   fit is the study's: the same run and step, the same λ as `uq.json` and the same trace of the
   logit covariance as the study's `laplace` OOD score on the clean test images;
5. fits `Laplace(model, 'classification', subset_of_weights='last_layer',
   hessian_structure='full', prior_precision=λ/α²)` (curvlinops' exact GGN of the summed
   cross-entropy for the last `nn.Linear`'s weight and bias) on the same training images;
6. maps the orderings explicitly: laplace-torch's vector is `parameters_to_vector(last_layer)` =
   the weight `[K, h]` row-major then the bias `[K]`; ours is class-blocked, index `k q + j` =
   `W[k, j]` (`j < h`), `b[k]` (`j = h`), `q = h + 1`. With α folded into the exported layer
   (θ_torch = α θ_ours) the torch Jacobian is ours / α, so `H_torch = P H_ours Pᵀ / α²` and with
   the prior precision λ/α² the posterior precision is `P (H + λ I) Pᵀ / α²`, the covariance
   `α² P Σ Pᵀ`, and the logit covariance `J Σ Jᵀ` is the same (α = 1 in the study);
7. compares the GGN, the posterior precision and covariance (max |difference| / max |entry|), the
   predictive (functional) variance of the logits per test point and class (relative), the whole
   `K × K` logit covariance per point, the mean logits, and the Laplace evidence at λ with
   laplace-torch's `log_marginal_likelihood` (and its derivative in log λ by autograd: ≈ 0 where
   our λ maximises it). Our MC probabilities are not compared (different random streams).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-8


def fail(msg):
    print(f"laplace_torch_check: {msg}", file=sys.stderr)
    sys.exit(2)


def fsl_check(a, model, xtr, ytr, xte, n, ours, fits):
    """Function-space Laplace (`fsl-ntk-diag`) against laplace-torch's FunctionalLaplace."""
    import torch
    from laplace import Laplace

    fsl = [f for f in fits.get("functional_laplace", []) if f["kernel"] == "ntk" and f["fit"].get("blocks", "class-diagonal") == "class-diagonal" and f["fit"]["curvature"] == "class-diagonal"]
    if not fsl:
        fail(f"{a.report}/gp_fits.json has no class-diagonal NTK function-space Laplace fit")
    delta = fsl[0]["fit"]["delta"]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=a.batch)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="gp",
                 independent_outputs=True, n_subset=xtr.shape[0], prior_precision=delta)
    la.fit(loader)
    with torch.no_grad():
        ps = torch.softmax(model(xtr), -1)
    lam = ps * (1 - ps)
    print(f"laplace-torch FunctionalLaplace fitted: M = {xtr.shape[0]}, δ = {delta:.6e}; λ_ic exactly 0: {int((lam == 0).sum())}")
    f_mu, f_var = la._glm_predictive_distribution(xte)
    var = torch.diagonal(f_var, dim1=-2, dim2=-1).detach().numpy()
    probs = la(xte, pred_type="gp", link_approx="probit").detach().numpy()

    our_trace = ours("fsl-ntk-diag", "ood_score")
    tr = var.sum(-1)
    rel_var = np.abs(tr - our_trace) / np.abs(our_trace)
    p_ours = ours("fsl-ntk-diag")
    rel_p = np.abs(probs - p_ours) / np.maximum(np.abs(p_ours), 1e-300)
    print(f"functional variance (trace over classes): max relative difference {rel_var.max():.3e}, median {np.median(rel_var):.3e}")
    print(f"probit probabilities: max relative difference {rel_p.max():.3e} (max absolute {np.abs(probs - p_ours).max():.3e})")
    print(f"variance scale: ours mean trace {our_trace.mean():.6e}, laplace-torch {tr.mean():.6e}")
    return rel_var.max() <= TOL and np.abs(probs - p_ours).max() <= TOL


def fsl_kxk_check(a, model, model0, xtr, ytr, xte, n, ours, fits, cache):
    """Cross-class function-space Laplace (`fsl-ntk-kxk-diag`) against laplace-torch's
    FunctionalLaplace with independent_outputs=False."""
    import torch
    from laplace import Laplace
    from laplace.baselaplace import FunctionalLaplace
    from safetensors.numpy import load_file

    fsl = [f for f in fits.get("functional_laplace", []) if f["kernel"] == "ntk" and f["fit"].get("blocks") == "cross-class" and f["fit"]["curvature"] == "class-diagonal"]
    if not fsl:
        fail(f"{a.report}/gp_fits.json has no cross-class NTK function-space Laplace fit with the diagonal curvature (fsl_kxk)")
    fit = fsl[0]["fit"]
    delta, our_ev = fit["delta"], fit["log_evidence"]
    path = os.path.join(cache, "ntk-gp", "clean.safetensors")
    our_cov = load_file(path)["fsl-ntk-kxk-diag/cov"][:n]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=a.batch)
    la = Laplace(model, "classification", subset_of_weights="all", hessian_structure="gp",
                 independent_outputs=False, n_subset=xtr.shape[0], prior_precision=delta)
    la.fit(loader)
    with torch.no_grad():
        ps = torch.softmax(model(xtr), -1)
    lam = ps - ps * ps
    print(f"laplace-torch FunctionalLaplace (independent_outputs=False) fitted: M·K = {la.K_MM.shape[0]}, δ = {delta:.6e}; "
          f"λ_ic exactly 0: {int((lam == 0).sum())} (ours: {fit['kxk']['lambda_zero']})")
    with torch.no_grad():
        r = (model(xtr) - model0(xtr)).numpy().reshape(-1)
    # rᵀ K⁺ r on laplace-torch's own kernel K_MM (index i·C + c, as ours), by numpy's eigh with
    # our rule (eigenvalues above 1e-12 of the largest). laplace-torch's `scatter` would solve
    # (K/δ + eps I) by Cholesky; with eps = 0 it fails on this kernel (numerically singular), with
    # its default eps = 1e-5 it is a different quantity (printed for reference).
    # laplace-torch's K_MM is in the order of its subset-of-data sampler (`SoDSampler`: a seeded
    # `rng.choice(N, M, replace=False)`, a permutation when M = N): r is permuted to match.
    order = la.train_loader.sampler.indices.numpy()
    r = r.reshape(xtr.shape[0], -1)[order].reshape(-1)
    kmm = la.K_MM.detach().numpy()
    kx = fit["kxk"]
    chol_route = kx.get("solver") == "cholesky"
    if chol_route:
        # Our Cholesky route (`fsl_kxk_solver = "cholesky"`, src/gp/crossclass/cholesky.rs):
        # rᵀ (K + τ I)⁻¹ r by a Cholesky, with τ = 0 where K factors and else the τ it reports
        # (scatter_jitter): the same on laplace-torch's K_MM, by scipy's Cholesky.
        from scipy.linalg import cho_factor, cho_solve
        tau = kx.get("scatter_jitter") or 0.0
        ksym = kmm + kmm.T
        ksym *= 0.5
        ksym[np.diag_indices_from(ksym)] += tau
        rkr = float(r @ cho_solve(cho_factor(ksym, lower=True, overwrite_a=True), r))
        del ksym
    else:
        e, u = np.linalg.eigh(0.5 * (kmm + kmm.T))
        proj = u.T @ r
        rkr_at = {c: float((proj[e > c * np.abs(e).max()] ** 2 / e[e > c * np.abs(e).max()]).sum()) for c in (1e-12, 1e-10, 1e-8, 1e-6)}
        rkr = rkr_at[1e-12]
    loglik, logdet = la.log_likelihood.item(), la.log_det_ratio.item()
    # Ours: log Z = log p(y|f) − (δ/2) rᵀK⁺r − ½ log det(I + G/δ); its log-determinant from the fit's numbers.
    our_logdet = 2.0 * (fit["log_likelihood"] - 0.5 * delta * kx["rkr"] - our_ev)
    rel_ll = abs(loglik - fit["log_likelihood"]) / abs(fit["log_likelihood"])
    rel_ld = abs(logdet - our_logdet) / abs(our_logdet)
    rel_rkr = abs(rkr - kx["rkr"]) / abs(kx["rkr"])
    ev = loglik - 0.5 * (logdet + delta * rkr)
    rel_ev = abs(ev - our_ev) / abs(our_ev)
    la.mu = torch.from_numpy(r.reshape(-1, la.n_outputs))
    lt_scatter = FunctionalLaplace.scatter.fget(la).item()
    try:
        lt_scatter0 = f"{FunctionalLaplace.scatter.fget(la, 0.0).item() / delta:.10g}"
    except Exception as err:  # not positive definite without the jitter
        lt_scatter0 = f"fails ({type(err).__name__})"
    if not chol_route:
        print(f"kernel K_MM: smallest / largest eigenvalue {e[0]:.3e} / {e[-1]:.6e} (ours {kx['k_eig'][0]:.3e} / {kx['k_eig'][1]:.6e}); "
              f"eigenvalues below 1e-12 / 1e-10 / 1e-8 / 1e-6 of the largest: {', '.join(str(int((e <= c * np.abs(e).max()).sum())) for c in rkr_at)} (ours below 1e-12: {kx['pinv_dropped']})")
    print(f"log likelihood: ours {fit['log_likelihood']!r}, laplace-torch's log_likelihood {loglik!r} (relative difference {rel_ll:.3e})")
    print(f"log det(I + λ^½ K λ^½/δ): ours {our_logdet!r}, laplace-torch's log_det_ratio {logdet!r} (relative difference {rel_ld:.3e})")
    if chol_route:
        print(f"scatter rᵀ(K + τI)⁻¹r, r = f(w_N) − f(w_0), τ = {tau!r}: ours {kx['rkr']!r}; scipy's Cholesky of laplace-torch's K_MM + τ I: {rkr!r} "
              f"(relative difference {rel_rkr:.3e}); laplace-torch's own scatter / δ on our r: with eps = 0 {lt_scatter0}, with its default eps = 1e-5 {lt_scatter / delta:.10g}")
    else:
        print(f"scatter rᵀK⁺r, r = f(w_N) − f(w_0): ours {kx['rkr']!r}; numpy eigh of laplace-torch's K_MM, eigenvalues above 1e-12 of the largest: {rkr!r} "
              f"(relative difference {rel_rkr:.3e}; above 1e-10 / 1e-8 / 1e-6: {' / '.join(f'{v:.10g}' for v in list(rkr_at.values())[1:])}); "
              f"laplace-torch's own scatter / δ on our r: with eps = 0 {lt_scatter0}, with its default eps = 1e-5 {lt_scatter / delta:.10g}")
    print(f"evidence at δ: ours {our_ev!r}, laplace-torch's log_likelihood − ½ (log_det_ratio + δ rᵀK⁺r) = {ev!r} (relative difference {rel_ev:.3e})")
    covs, probs = [], []
    for s in range(0, n, a.batch):
        x = xte[s:s + a.batch]
        _, f_var = la._glm_predictive_distribution(x)
        covs.append(f_var.detach().numpy())
        probs.append(la(x, pred_type="gp", link_approx="probit").detach().numpy())
    cov, probs = np.concatenate(covs), np.concatenate(probs)
    cov_rel = max(np.abs(cov[i] - our_cov[i]).max() / np.abs(np.diag(our_cov[i])).max() for i in range(n))
    var_rel = np.abs(np.diagonal(cov, axis1=1, axis2=2) - np.diagonal(our_cov, axis1=1, axis2=2)) / np.abs(np.diagonal(our_cov, axis1=1, axis2=2))
    off = np.abs(our_cov - np.einsum("ncc->nc", our_cov)[:, :, None] * np.eye(our_cov.shape[1])).max()
    p_ours = ours("fsl-ntk-kxk-diag")
    d_p = np.abs(probs - p_ours).max()
    rel_p = (np.abs(probs - p_ours) / np.maximum(np.abs(p_ours), 1e-300)).max()
    print(f"K × K predictive covariance ({n} clean test points): max |diff| / max diagonal per point = {cov_rel:.3e}; "
          f"variances max relative difference {var_rel.max():.3e} (median {np.median(var_rel):.3e}); largest off-diagonal |Σ*_cc'| {off:.3e}")
    print(f"probit probabilities: max relative difference {rel_p:.3e} (max absolute {d_p:.3e})")

    return cov_rel <= TOL and var_rel.max() <= TOL and d_p <= TOL and rel_ll <= TOL and rel_ld <= TOL and rel_rkr <= TOL and rel_ev <= TOL


def pathkernel_binary(a):
    if a.pathkernel:
        return a.pathkernel
    found = shutil.which("pathkernel")
    if found:
        return found
    for d in [os.environ.get("CARGO_TARGET_DIR"), "target"]:
        if d and os.path.isfile(os.path.join(d, "release", "pathkernel")):
            return os.path.join(d, "release", "pathkernel")
    fail("no pathkernel binary: build it (cargo build --release) and pass --pathkernel target/release/pathkernel, or give --lastlayer DIR")


def mat_rel(got, want):
    """max |got − want| / max |want| (a matrix's relative difference; entries may be 0)."""
    return np.abs(got - want).max() / np.abs(want).max()


def lastlayer_check(a, run, man, step, model, xtr, ytr, xte, n, ours, uq, tmp):
    """Our last-layer Laplace (`pathkernel laplace`, the benchmark's fit) against laplace-torch's
    `Laplace(…, subset_of_weights='last_layer', hessian_structure='full')`."""
    import torch
    from laplace import Laplace

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_model import read_safetensors

    lap = uq.get("laplace")
    if not lap:
        fail(f"{a.report}/uq.json has no last-layer Laplace fit")
    study_lam = lap["prior_precision"]
    grid = uq["config"]["laplace"]
    if grid.get("prior_precision") is not None:
        fail("the study fixed the last-layer prior precision; this check compares the evidence choice")
    out = a.lastlayer
    if out is None:
        out = os.path.join(tmp, "lastlayer")
        cmd = [pathkernel_binary(a), "laplace", "--run", run, "--step", str(step), "--points", "test",
               "--grid", f"{grid['log10_min']}:{grid['log10_max']}:{grid['grid_points']}", "--out", out]
        print("ours: " + " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"pathkernel laplace failed: {r.stderr.strip()}")
    if not os.path.isfile(os.path.join(out, "laplace.safetensors")):
        fail(f"{out}: no laplace.safetensors (expected the --out of `pathkernel laplace --points test`)")
    t, meta = read_safetensors(os.path.join(out, "laplace.safetensors"))
    if meta.get("format") != "pathkernel-lastlayer-laplace":
        fail(f"{out}: not written by `pathkernel laplace`")
    if meta["run_id"] != man["run_id"] or int(meta["step"]) != step or meta["points"] != "test":
        fail(f"{out}: run {meta['run_id']} state {meta['step']} points {meta['points']}, not the study's network {man['run_id']} state {step} at the test points")
    K, q, h = int(meta["classes"]), int(meta["features"]), int(meta["hidden"])
    bias, alpha, lam = meta["bias"] == "true", float(meta["alpha"]), float(meta["prior_precision"])
    D = K * q
    if not np.array_equal(t["points"][:n], xte.numpy()):
        fail(f"{out}: its row points are not the study's clean test images")

    # Ours is the study's fit: λ from the same evidence search, the same logit covariance trace.
    our_var = t["variance"][:n]
    our_cov = t["cov"][:n]
    study_tr = ours("laplace", "ood_score")
    rel_lam = abs(lam - study_lam) / study_lam
    rel_tr = np.abs(our_var.sum(-1) - study_tr) / study_tr
    print(f"ours: `pathkernel laplace` on run {man['run_id']} state {step}: D = {D} (K = {K}, q = {q}), λ = {lam!r} "
          f"(study's uq.json {study_lam!r}, relative difference {rel_lam:.1e}); logit covariance trace vs the study's "
          f"`laplace` OOD score: max relative difference {rel_tr.max():.3e}")

    # The explicit ordering map: torch index → ours. Torch: W [K, h] row-major, then b [K].
    perm = (np.arange(K)[:, None] * q + np.arange(h)[None, :]).ravel()
    if bias:
        perm = np.concatenate([perm, np.arange(K) * q + h])
    assert sorted(perm.tolist()) == list(range(D))
    to_torch = lambda m: m[np.ix_(perm, perm)]
    H_ours = to_torch(t["hessian"]) / alpha**2
    P_ours = to_torch(t["precision"]) / alpha**2
    S_ours = to_torch(t["covariance"]) * alpha**2
    theta_ours = t["theta"][perm] * alpha

    lam_t = lam / alpha**2
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=a.batch)
    la = Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="full", prior_precision=lam_t)
    la.fit(loader)
    last = la.model.last_layer
    print(f"laplace-torch FullLLLaplace fitted ({type(la.backend).__name__}): last layer {last}, "
          f"{la.n_params} parameters, M = {xtr.shape[0]}, prior precision λ/α² = {lam_t!r}")
    if la.n_params != D:
        fail(f"laplace-torch's last layer has {la.n_params} parameters, ours {D}")
    mean_t = la.mean.detach().numpy()
    d_theta = np.abs(mean_t - theta_ours).max()
    H_t = la.H.detach().numpy()
    P_t = la.posterior_precision.detach().numpy()
    S_t = la.posterior_covariance.detach().numpy()
    f_mu, f_cov = la._glm_predictive_distribution(xte)
    f_mu, f_cov = f_mu.numpy(), f_cov.numpy()
    f_var = np.diagonal(f_cov, axis1=-2, axis2=-1)

    r_H, r_P, r_S = mat_rel(H_t, H_ours), mat_rel(P_t, P_ours), mat_rel(S_t, S_ours)
    print(f"parameters θ* (torch order): max |diff| {d_theta:.3e}")
    unmapped = mat_rel(H_t, t["hessian"] / alpha**2)
    print(f"GGN H: max |diff| / max |H| = {r_H:.3e} (max |H| {np.abs(H_ours).max():.4e}; without the ordering map {unmapped:.2e})")
    print(f"posterior precision H + λI: max |diff| / max |P| = {r_P:.3e}")
    print(f"posterior covariance (H + λI)⁻¹: max |diff| / max |Σ| = {r_S:.3e}")
    rel_var = np.abs(f_var - our_var) / our_var
    cov_rel = max(np.abs(f_cov[i] - our_cov[i]).max() / np.diag(our_cov[i]).max() for i in range(n))
    d_mu = np.abs(f_mu - t["mean"][:n]).max()
    print(f"predictive variance of the logits ({n} clean test points × {K} classes): max relative difference "
          f"{rel_var.max():.3e}, median {np.median(rel_var):.3e} (ours mean {our_var.mean():.6e}, laplace-torch {f_var.mean():.6e})")
    print(f"logit covariance K × K per point: max |diff| / max diagonal = {cov_rel:.3e}; mean logits max |diff| {d_mu:.3e}")

    # The evidence at our λ, and its slope in log λ (ours maximises it: the slope is ~0).
    our_ev = json.load(open(os.path.join(out, "laplace.json")))["log_marginal_likelihood"]
    logp = torch.tensor(np.log(lam_t), requires_grad=True)
    ev = la.log_marginal_likelihood(prior_precision=logp.exp())
    (slope,) = torch.autograd.grad(ev, logp)
    ev, slope = ev.item(), slope.item()
    la.prior_precision = lam_t
    rel_ev = abs(ev - our_ev) / abs(our_ev)
    print(f"Laplace evidence at λ: ours {our_ev!r}, laplace-torch {ev!r} (relative difference {rel_ev:.3e}); "
          f"laplace-torch's d evidence / d log λ at λ = {slope:.3e} (relative to D/2: {abs(slope) / (D / 2):.1e})")
    return (rel_lam <= 1e-15 and rel_tr.max() <= TOL and d_theta <= 1e-15 and max(r_H, r_P, r_S) <= TOL
            and rel_var.max() <= TOL and cov_rel <= TOL and d_mu <= 1e-12 and rel_ev <= TOL and abs(slope) / (D / 2) <= TOL)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--cache", default=None, help="the study's cache (default runs/<study name>)")
    ap.add_argument("--model", default=None, help="a `pathkernel export --format torch` file (default: the run's last state)")
    ap.add_argument("--points", type=int, default=None, help="clean test points compared (default all)")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--check", choices=["all", "fsl", "fsl-kxk", "lastlayer"], default="all", help="which comparisons (default all; fsl-kxk in all when the study has it)")
    ap.add_argument("--lastlayer", default=None, help="a `pathkernel laplace --points test` output for the network under test (default: run it)")
    ap.add_argument("--pathkernel", default=None, help="the pathkernel binary for `pathkernel laplace` (default: on PATH, or target/release/pathkernel)")
    a = ap.parse_args()
    try:
        import torch
        from laplace import Laplace  # noqa: F401
        from safetensors.numpy import load_file
        import pyarrow.parquet as pq
    except ImportError as e:
        fail(f"{e}: install torch, laplace-torch, safetensors and pyarrow (see the docstring)")
    torch.set_default_dtype(torch.float64)
    name = os.path.basename(os.path.normpath(a.report))
    cache = a.cache or os.path.join("runs", name)
    sel = json.load(open(os.path.join(a.report, "selection.json")))
    fits = json.load(open(os.path.join(a.report, "gp_fits.json")))
    uq = json.load(open(os.path.join(a.report, "uq.json")))
    # The network under test: the selection run with the chosen lr and steps (the study's rule).
    last = max(r["steps"] for r in sel["rows"])
    if sel["steps"] == last:
        # The selection run's folder: `lr0.5-steps200/run` (older caches: `lr-0.5-steps-200`).
        names = [os.path.join(f"lr{sel['lr']}-steps{last}", "run"), f"lr-{sel['lr']}-steps-{last}"]
        run = next((os.path.join(cache, "select", d) for d in names if os.path.isfile(os.path.join(cache, "select", d, "manifest.json"))), os.path.join(cache, "select", names[0]))
    else:
        run = os.path.join(cache, "run")
    man = json.load(open(os.path.join(run, "manifest.json")))
    arch = man["architecture"]
    if arch["body"]["widths"] != [784, 128, 10]:
        fail(f"{run}: expected the 784-128-10 MLP")
    if arch["zero_output"]:
        fail(f"{run}: a zero_output network (net(x) − init(x)) is not an nn.Sequential; the check rebuilds the network alone")
    data = load_file(os.path.join(run, "dataset.safetensors"))
    alpha = 1.0
    if a.model:
        w = load_file(a.model)
        names = [("0.weight", "0.bias"), ("2.weight", "2.bias")]
    else:
        w = load_file(os.path.join(run, "trajectory", f"step-{sel['steps']:06d}.safetensors"))
        names = [("layers.0.weight", "layers.0.bias"), ("layers.1.weight", "layers.1.bias")]
        alpha = arch["alpha"]  # folded into the last layer below, as `pathkernel export` does
    def mlp(w, names):
        net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        with torch.no_grad():
            for lin, (wn, bn), scale in zip([net[0], net[2]], names, [1.0, alpha]):
                lin.weight.copy_(torch.from_numpy(w[wn]) * scale)
                lin.bias.copy_(torch.from_numpy(w[bn]) * scale)
        return net

    model = mlp(w, names)
    # The initial state w_0 (the prior mean f(w_0) of the function-space fits).
    model0 = mlp(load_file(os.path.join(run, "trajectory", "step-000000.safetensors")), [("layers.0.weight", "layers.0.bias"), ("layers.1.weight", "layers.1.bias")])
    xtr = torch.from_numpy(data["x_train"]).double()
    ytr = torch.from_numpy(data["y_train"].astype(np.int64))
    n = a.points or data["x_test"].shape[0]
    xte = torch.from_numpy(data["x_test"][:n]).double()

    t = pq.read_table(os.path.join(a.report, "predictions.parquet"))
    col = {c: t.column(c).to_numpy() if c not in ("method", "setting") else np.array(t.column(c).to_pylist()) for c in t.column_names}

    def ours(method, what="probs"):
        sel_rows = np.where((col["method"] == method) & (col["setting"] == "clean"))[0]
        sel_rows = sel_rows[np.argsort(col["point"][sel_rows])][:n]
        if what == "ood_score":
            return col["ood_score"][sel_rows]
        return np.stack([col[f"p{c}"][sel_rows] for c in range(10)], axis=1)

    with torch.no_grad():
        p_map = torch.softmax(model(xte), -1).numpy()
    d_map = np.abs(p_map - ours("map")).max()
    print(f"network: softmax vs the study's MAP probabilities, max |diff| = {d_map:.3e} ({n} clean test points)")
    ok = d_map <= 1e-12
    verdicts = []
    if a.check in ("all", "fsl"):
        v = fsl_check(a, model, xtr, ytr, xte, n, ours, fits)
        verdicts.append(("function-space Laplace", v))
    has_kxk = any(f["fit"].get("blocks") == "cross-class" for f in fits.get("functional_laplace", []))
    if a.check == "fsl-kxk" or (a.check == "all" and has_kxk):
        v = fsl_kxk_check(a, model, model0, xtr, ytr, xte, n, ours, fits, cache)
        verdicts.append(("cross-class function-space Laplace", v))
    if a.check in ("all", "lastlayer"):
        with tempfile.TemporaryDirectory() as tmp:
            v = lastlayer_check(a, run, man, sel["steps"], model, xtr, ytr, xte, n, ours, uq, tmp)
        verdicts.append(("last-layer Laplace", v))
    for what, v in verdicts:
        print(f"{what}: {'PASS (≤ 1e-8)' if v and ok else 'DIFFERENCES ABOVE 1e-8'}")
        ok = ok and v
    print("PASS (≤ 1e-8)" if ok else "DIFFERENCES ABOVE 1e-8")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
