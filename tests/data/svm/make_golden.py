#!/usr/bin/env python3
"""Golden data for pathkernel's `svm` module (src/svm.rs), from scikit-learn's libsvm.

Run from the repository root:

    python3 tests/data/svm/make_golden.py            # rewrites tests/data/svm/*.json
    python3 tests/data/svm/make_golden.py --bench    # also times SVC on the M = 3000 bench Gram

Produced with Python 3.11.7, numpy 2.4.6, scikit-learn 1.9.1 (scipy 1.17.1); install with
`pip install numpy scikit-learn`. Output is deterministic for fixed versions (seeded numpy
Generator; the Gram is rounded before fitting, see below).

What it writes (one JSON per Gram; all arrays row-major, flat):

* `separable_linear.json` - three well-separated 2-D blobs, linear Gram K = X Xᵀ, C = 100
  (hard-margin regime: every α < C), so the support set is a robust, comparable quantity.
* `overlap_rbf.json` - three overlapping blobs, RBF Gram exp(-γ|x-x'|²) with γ = 0.5, fitted
  with C = 1 and C = 10.
* `indefinite_sigmoid.json` - the overlapping blobs with the (indefinite) sigmoid Gram
  tanh(0.5 x·x' - 1), C = 1: exercises libsvm's τ = 1e-12 for pairs with non-positive
  curvature K_ii + K_jj - 2 K_ij ≤ 0 (the count is printed and stored as `n_nonpos_pairs`).

Each file: `m`, `p`, `k`, `gram` [M*M], `labels` [M], `cross` [P*M] (K(x_test, x_train)),
`test_labels` [P], `tol`, and `fits`: one entry per C with `c` and `classes`, one per
one-vs-rest class c: `dual_coef` [M] (y_i α_i aligned to all M points, 0 off the support),
`intercept`, `support` (sorted indices), `decision` [P] (f on the cross Gram, positive for
class c), `n_iter` (libsvm's iteration count), plus diagnostics (`min_sv_alpha`,
`min_nonsv_margin`, `max_alpha`).

Conventions handled here:

* The Gram and the cross Gram are rounded to float32 *before* fitting and stored as the
  shortest decimal of each float32 (read them as f32, then widen to f64). libsvm caches
  Q_ij = y_i y_j K_ij as float32; with float32-exact K that cache is exact, so libsvm's SMO
  runs in the same double arithmetic as src/svm.rs and the iterates agree to the last bit
  (same iteration counts), not just to tolerance.
* scikit-learn's binary SVC reports `dual_coef_`, `intercept_`, `decision_function` for the
  positive class `classes_[1]`, and orders `support_` by class. We encode class c as label 0
  and "rest" as label 1: libsvm then takes class c as its internal +1 (its first class), so
  its SMO iterates are those of our solver (same WSS, same tie-breaking); the public values
  (for `classes_[1]` = rest) are negated to give f for class c, and `support_`/`dual_coef_`
  are scattered to full length M. The script asserts f = cross · dual_coef + intercept.
* `shrinking=False` (our solver does not shrink) and `tol = 1e-6` to make the comparison
  tight; each class is also fitted at libsvm's default `tol = 1e-3` (`decision_tol1e3`,
  `n_iter_tol1e3`).

The `--bench` problem uses a splitmix64 stream that `src/svm.rs`'s ignored speed test
reproduces exactly: M = 3000 points uniform in [0,1)², label +1 inside the disc
|x - (0.5, 0.5)| < 0.3, 10 % of labels flipped, RBF Gram with γ = 10, C = 1, tol = 1e-3.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import sklearn
from sklearn.svm import SVC

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-6


def f32(a):
    """Round to float32 (then back to float64 for numpy/sklearn)."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def f32_list(a):
    """float32 values as their shortest decimal repr (json writes floats with repr)."""
    return [float(str(v)) for v in np.asarray(a, dtype=np.float32).ravel()]


def blobs(rng, centers, n_per, spread):
    xs, ys = [], []
    for c, mu in enumerate(centers):
        xs.append(rng.normal(mu, spread, size=(n_per, 2)))
        ys.append(np.full(n_per, c))
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    perm = rng.permutation(len(y))
    return x[perm], y[perm]


def linear(a, b):
    return a @ b.T


def rbf(gamma):
    def k(a, b):
        d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        return np.exp(-gamma * d2)

    return k


def fit_class(gram, cross, labels, c_cls, C):
    out = fit_class_tol(gram, cross, labels, c_cls, C, TOL)
    loose = fit_class_tol(gram, cross, labels, c_cls, C, 1e-3)
    out["decision_tol1e3"] = loose["decision"]
    out["n_iter_tol1e3"] = loose["n_iter"]
    return out


def fit_class_tol(gram, cross, labels, c_cls, C, tol):
    """One-vs-rest class c_cls; returns values for f = decision of class c_cls."""
    m = len(labels)
    enc = np.where(labels == c_cls, 0, 1)  # class c is libsvm's first (+1) class
    svc = SVC(kernel="precomputed", C=C, tol=tol, shrinking=False, max_iter=-1)
    svc.fit(gram, enc)
    assert list(svc.classes_) == [0, 1]
    dual = np.zeros(m)
    dual[svc.support_] = -svc.dual_coef_[0]  # sklearn's is for classes_[1] = rest
    intercept = -float(svc.intercept_[0])
    dec = -svc.decision_function(cross)
    assert np.allclose(dec, cross @ dual + intercept, atol=1e-10, rtol=0)
    y = np.where(labels == c_cls, 1.0, -1.0)
    alpha = dual * y
    assert np.all(alpha >= 0) and np.all(alpha <= C + 1e-12)
    f_train = gram @ dual + intercept
    margin = y * f_train
    sv = np.sort(svc.support_)
    nonsv = np.setdiff1d(np.arange(m), sv)
    return {
        "dual_coef": dual.tolist(),
        "intercept": intercept,
        "support": sv.tolist(),
        "decision": dec.tolist(),
        "n_iter": int(np.asarray(svc.n_iter_).ravel()[0]),
        "min_sv_alpha": float(alpha[sv].min()),
        "max_alpha": float(alpha.max()),
        "min_nonsv_margin": float(margin[nonsv].min()) if len(nonsv) else None,
    }


def case(name, seed, centers, spread, kernel, cs, m_per=20, p_per=7):
    rng = np.random.default_rng(seed)
    x, labels = blobs(rng, centers, m_per, spread)
    xt, test_labels = blobs(rng, centers, p_per, spread)
    gram = kernel(x, x)
    gram = f32(0.5 * (gram + gram.T))  # exactly symmetric
    cross = f32(kernel(xt, x))
    k = len(centers)
    diag = np.diag(gram)
    curv = diag[:, None] + diag[None, :] - 2.0 * gram
    n_nonpos = int(((curv <= 0) & ~np.eye(len(diag), dtype=bool)).sum() // 2)
    min_eig = float(np.linalg.eigvalsh(gram).min())
    print(f"{name}: min eigenvalue {min_eig:.3e}, pairs with curvature <= 0: {n_nonpos}")
    out = {
        "name": name,
        "m": int(len(labels)),
        "p": int(len(test_labels)),
        "k": k,
        "tol": TOL,
        "min_eigenvalue": min_eig,
        "n_nonpos_pairs": n_nonpos,
        "gram": f32_list(gram),
        "labels": labels.tolist(),
        "cross": f32_list(cross),
        "test_labels": test_labels.tolist(),
        "fits": [{"c": C, "classes": [fit_class(gram, cross, labels, c, C) for c in range(k)]} for C in cs],
    }
    path = os.path.join(HERE, f"{name}.json")
    with open(path, "w") as fh:
        json.dump(out, fh, separators=(",", ":"))
        fh.write("\n")
    for fit in out["fits"]:
        for c, cl in enumerate(fit["classes"]):
            print(
                f"{name} C={fit['c']} class {c}: nSV={len(cl['support'])} b={cl['intercept']:.6f} "
                f"n_iter={cl['n_iter']} min_sv_alpha={cl['min_sv_alpha']:.3g} max_alpha={cl['max_alpha']:.3g} "
                f"min_nonsv_margin={cl['min_nonsv_margin']}"
            )
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


MASK64 = (1 << 64) - 1


def splitmix64(state):
    """One step of splitmix64: returns (new_state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def bench_problem(m=3000, seed=42, gamma=10.0):
    """The speed-test problem; mirrored by `bench_problem` in src/svm.rs's tests."""
    s = seed
    x = np.empty((m, 2))
    y = np.empty(m)
    for i in range(m):
        s, a = splitmix64(s)
        s, b = splitmix64(s)
        s, u = splitmix64(s)
        x[i] = [(a >> 11) * 2.0**-53, (b >> 11) * 2.0**-53]
        inside = (x[i, 0] - 0.5) ** 2 + (x[i, 1] - 0.5) ** 2 < 0.09
        flip = (u >> 11) * 2.0**-53 < 0.1
        y[i] = 1.0 if inside != flip else -1.0
    sq = (x * x).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0)
    return np.exp(-gamma * d2), y


def bench():
    gram, y = bench_problem()
    enc = np.where(y > 0, 0, 1)  # +1 class first, as in the golden fits
    times = []
    for _ in range(5):
        svc = SVC(kernel="precomputed", C=1.0, tol=1e-3, shrinking=False)
        t0 = time.perf_counter()
        svc.fit(gram, enc)
        times.append(time.perf_counter() - t0)
    svc_s = SVC(kernel="precomputed", C=1.0, tol=1e-3)  # default shrinking=True
    t_s = []
    for _ in range(5):
        t0 = time.perf_counter()
        svc_s.fit(gram, enc)
        t_s.append(time.perf_counter() - t0)
    print(
        f"bench M=3000 RBF: sklearn SVC(precomputed, shrinking=False) fit median {np.median(times):.4f} s "
        f"(min {min(times):.4f}), n_iter={int(svc.n_iter_[0])}, nSV={len(svc.support_)}, "
        f"b={-svc.intercept_[0]:.6f}; shrinking=True median {np.median(t_s):.4f} s, n_iter={int(svc_s.n_iter_[0])}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", action="store_true", help="also time SVC on the M = 3000 bench Gram")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, scikit-learn {sklearn.__version__}")
    tri = [(0.0, 0.0), (4.0, 0.0), (2.0, 3.5)]
    case("separable_linear", 1, tri, 0.5, linear, [100.0])
    overlap = [(0.0, 0.0), (1.5, 0.0), (0.75, 1.3)]
    case("overlap_rbf", 2, overlap, 0.8, rbf(0.5), [1.0, 10.0])
    case("indefinite_sigmoid", 2, overlap, 0.8, lambda a, b: np.tanh(0.5 * a @ b.T - 1.0), [1.0])
    if args.bench:
        bench()


if __name__ == "__main__":
    main()
