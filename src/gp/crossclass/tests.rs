use super::*;
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A random cross-class kernel from features: `k^{cc'}(x, x') = ⟨φ_c(x), φ_c'(x')⟩`, over
/// train then test points. Returns (k_train [M,M,K,K], k_cross [P,M,K,K], k_self [P,K,K],
/// logits, bias, labels, mean).
#[allow(clippy::type_complexity)]
fn problem(m: usize, p: usize, k: usize, feat: usize, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<usize>, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = m + p;
    let phi: Vec<f64> = (0..n * k * feat).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let dot = |a: usize, c: usize, b: usize, c2: usize| (0..feat).map(|t| phi[(a * k + c) * feat + t] * phi[(b * k + c2) * feat + t]).sum::<f64>();
    let mut kt = vec![0.0; m * m * k * k];
    let mut kx = vec![0.0; p * m * k * k];
    let mut ks = vec![0.0; p * k * k];
    for c in 0..k {
        for c2 in 0..k {
            for i in 0..m {
                for j in 0..m {
                    kt[((i * m + j) * k + c) * k + c2] = dot(i, c, j, c2);
                }
            }
            for q in 0..p {
                for j in 0..m {
                    kx[((q * m + j) * k + c) * k + c2] = dot(m + q, c, j, c2);
                }
                ks[(q * k + c) * k + c2] = dot(m + q, c, m + q, c2);
            }
        }
    }
    let logits: Vec<f64> = (0..m * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
    let bias: Vec<f64> = (0..m * k).map(|_| rng.gen_range(-0.1..0.1)).collect();
    let labels: Vec<usize> = (0..m).map(|_| rng.gen_range(0..k)).collect();
    let mean: Vec<f64> = (0..p * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
    (kt, kx, ks, logits, bias, labels, mean)
}

/// The dense curvature Λ (block-diagonal, index i K + c): `diag(p − p²)` (with laplace-torch's
/// 1/λ = ∞ → 10) or `diag(p_i) − p_i p_iᵀ`.
fn dense_lambda(probs: &[f64], m: usize, k: usize, full: bool) -> DMatrix<f64> {
    let mut l = DMatrix::<f64>::zeros(m * k, m * k);
    for i in 0..m {
        let pr = &probs[i * k..(i + 1) * k];
        for a in 0..k {
            for b in 0..k {
                l[(i * k + a, i * k + b)] = if full {
                    (if a == b { pr[a] } else { 0.0 }) - pr[a] * pr[b]
                } else if a == b {
                    let lam = pr[a] - pr[a] * pr[a];
                    if lam == 0.0 {
                        0.1
                    } else {
                        lam
                    }
                } else {
                    0.0
                };
            }
        }
    }
    l
}

fn dense_k(kt: &[f64], m: usize, k: usize) -> DMatrix<f64> {
    DMatrix::from_fn(m * k, m * k, |r, s| kt[((r / k * m + s / k) * k + r % k) * k + s % k])
}

/// The obvious formulas, with no F, no eigendecomposition: R&W eq. 3.24 with the prior K/δ,
/// `Σ* = k**/δ − (k*/δ)ᵀ Λ (I + K Λ/δ)⁻¹ (k*/δ)` by an LU solve, and for the diagonal curvature
/// also laplace-torch's `k**/δ − (k*/δ)ᵀ (K/δ + Λ⁻¹)⁻¹ (k*/δ)` (`functional_variance`).
#[allow(clippy::too_many_arguments)]
fn dense_cov(kt: &[f64], kx: &[f64], ks: &[f64], probs: &[f64], m: usize, p: usize, k: usize, delta: f64, full: bool) -> (Vec<f64>, Option<Vec<f64>>) {
    let n = m * k;
    let kk = dense_k(kt, m, k);
    let lam = dense_lambda(probs, m, k, full);
    let a = DMatrix::<f64>::identity(n, n) + &kk * &lam / delta;
    let lu = a.lu();
    let lt = if full { None } else { Some((&kk / delta + DMatrix::from_diagonal(&lam.diagonal().map(|v| 1.0 / v))).lu()) };
    let mut out = vec![0.0; p * k * k];
    let mut out_lt = vec![0.0; p * k * k];
    for q in 0..p {
        let kstar = DMatrix::from_fn(n, k, |r, c| kx[((q * m + r / k) * k + c) * k + r % k] / delta);
        let red = kstar.transpose() * &lam * lu.solve(&kstar).unwrap();
        for a in 0..k {
            for b in 0..k {
                out[(q * k + a) * k + b] = ks[(q * k + a) * k + b] / delta - red[(a, b)];
            }
        }
        if let Some(lt) = &lt {
            let red = kstar.transpose() * lt.solve(&kstar).unwrap();
            for a in 0..k {
                for b in 0..k {
                    out_lt[(q * k + a) * k + b] = ks[(q * k + a) * k + b] / delta - red[(a, b)];
                }
            }
        }
    }
    (out, lt.map(|_| out_lt))
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |s, v| s.max(v.abs()));
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn both_curvatures_match_the_dense_formulas() {
    let (m, p, k) = (9, 4, 3);
    let (kt, kx, ks, logits, bias, labels, mean) = problem(m, p, k, 40, 11);
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    let rows = KxkRows { k_cross: &kx, k_self: &ks, mean: &mean, p };
    let probs = crate::model::softmax_rows(&logits, k).unwrap();
    for (curv, full) in [(Curvature::ClassDiagonal, false), (Curvature::Full, true)] {
        for delta in [0.2, 3.0, 80.0] {
            let fsl = CrossClassLaplace::fit(&train, curv, Prior::Fixed(delta)).unwrap();
            let got = fsl.predict(&rows).unwrap();
            let (want, want_lt) = dense_cov(&kt, &kx, &ks, &probs, m, p, k, delta, full);
            let e = max_rel(&got.post.cov, &want);
            assert!(e < 1e-10, "{curv} δ = {delta}: {e:e}");
            if let Some(w) = want_lt {
                let e = max_rel(&got.post.cov, &w);
                assert!(e < 1e-10, "{curv} δ = {delta} against laplace-torch's form: {e:e}");
            }
            // Off-diagonal blocks are really there: the cross-class kernel couples the classes.
            let off = (0..p).map(|q| got.post.cov[q * k * k + 1].abs()).fold(0.0, f64::max);
            assert!(off > 1e-6, "{curv}: no cross-class covariance");
            assert_eq!(got.post.mean, mean);
            assert_eq!(got.clamped, 0);
            let nk = fsl.fit.kxk.as_ref().unwrap();
            assert!(nk.logdet_rel_diff.unwrap() < 1e-10, "{curv}: Cholesky and eigenvalue log-determinants differ by {:e}", nk.logdet_rel_diff.unwrap());
        }
    }
}

#[test]
fn class_diagonal_kernel_reduces_to_the_per_class_fit() {
    // A cross-class Gram with zero off-diagonal blocks is the per-class problem: the
    // diagonal curvature must then equal `FunctionalLaplace`'s class-diagonal fit.
    let (m, p, k) = (10, 5, 3);
    let (mut kt, mut kx, mut ks, logits, bias, labels, mean) = problem(m, p, k, 30, 12);
    for (idx, v) in kt.iter_mut().enumerate() {
        if (idx / k) % k != idx % k {
            *v = 0.0;
        }
    }
    for (idx, v) in kx.iter_mut().enumerate() {
        if (idx / k) % k != idx % k {
            *v = 0.0;
        }
    }
    for (idx, v) in ks.iter_mut().enumerate() {
        if (idx / k) % k != idx % k {
            *v = 0.0;
        }
    }
    let kc: Vec<f64> = (0..k).flat_map(|c| (0..m * m).map(move |ij| (ij, c))).map(|(ij, c)| kt[(ij * k + c) * k + c]).collect();
    let kxc: Vec<f64> = (0..k).flat_map(|c| (0..p * m).map(move |qj| (qj, c))).map(|(qj, c)| kx[(qj * k + c) * k + c]).collect();
    let kdc: Vec<f64> = (0..k).flat_map(|c| (0..p).map(move |q| (q, c))).map(|(q, c)| ks[(q * k + c) * k + c]).collect();
    let per =
        super::super::functional::FunctionalLaplace::fit(&super::super::FslTrain { k_train: &kc, logits: &logits, bias: &bias, labels: &labels, m, k }, Curvature::ClassDiagonal, Prior::Evidence)
            .unwrap();
    let x = CrossClassLaplace::fit(&KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k }, Curvature::ClassDiagonal, Prior::Evidence).unwrap();
    assert!((per.delta() - x.delta()).abs() < 1e-9 * per.delta(), "δ {} vs {}", per.delta(), x.delta());
    assert!((per.fit.log_evidence - x.fit.log_evidence).abs() < 1e-9 * per.fit.log_evidence.abs());
    let a = per.predict(&super::super::FslRows { k_cross: &kxc, k_diag: &kdc, mean: &mean, p }).unwrap();
    let b = x.predict(&KxkRows { k_cross: &kx, k_self: &ks, mean: &mean, p }).unwrap();
    assert!(max_rel(&b.post.cov, &a.post.cov) < 1e-10);
}

#[test]
fn evidence_is_the_dense_evidence_and_its_maximum() {
    let (m, k) = (8, 3);
    let (kt, _, _, logits, bias, labels, _) = problem(m, 1, k, 40, 13);
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    let probs = crate::model::softmax_rows(&logits, k).unwrap();
    for (curv, full) in [(Curvature::ClassDiagonal, false), (Curvature::Full, true)] {
        let fsl = CrossClassLaplace::fit(&train, curv, Prior::Evidence).unwrap();
        let best = fsl.fit.log_evidence;
        for i in 0..300 {
            let d = 10f64.powf(-6.0 + 12.0 * i as f64 / 299.0);
            assert!(fsl.log_evidence(d).unwrap() <= best + 1e-9 * best.abs(), "{curv} δ = {d}");
        }
        // Dense: log p(y|f) − (δ/2) rᵀ K⁻¹ r − ½ log det(I + Λ K/δ) (Sylvester), LU determinant.
        let delta = fsl.delta();
        let kk = dense_k(&kt, m, k);
        let r = DMatrix::from_fn(m * k, 1, |i, _| logits[i] - bias[i]);
        let lam = dense_lambda(&probs, m, k, full);
        let mut slow = super::super::functional::log_likelihood(&logits, &labels, k);
        slow -= 0.5 * delta * (r.transpose() * kk.clone().try_inverse().unwrap() * &r)[(0, 0)];
        slow -= 0.5 * (DMatrix::identity(m * k, m * k) + &lam * &kk / delta).determinant().ln();
        assert!((slow - best).abs() < 1e-8 * slow.abs(), "{curv}: {slow} vs {best}");
    }
}

#[test]
fn grid_search_picks_the_lowest_validation_nll() {
    let (m, p, k) = (10, 25, 3);
    let (kt, kx, ks, logits, bias, _, mean) = problem(m, p, k, 30, 14);
    let labels: Vec<usize> = (0..m).map(|i| crate::data::argmax(&logits[i * k..(i + 1) * k])).collect();
    let vlabels: Vec<usize> = (0..p).map(|q| (q * 5) % k).collect();
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    let rows = KxkRows { k_cross: &kx, k_self: &ks, mean: &mean, p };
    for curv in [Curvature::ClassDiagonal, Curvature::Full] {
        let mut fsl = CrossClassLaplace::fit(&train, curv, Prior::Fixed(1.0)).unwrap();
        let sweep = fsl.grid_search(&rows, &vlabels, -2.0, 2.0, 9).unwrap();
        let best = sweep.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        assert_eq!(fsl.delta(), best.0);
        assert_eq!(fsl.fit.prior, "grid");
        // Refitting at that δ gives the same predictive the sweep scored.
        let refit = CrossClassLaplace::fit(&train, curv, Prior::Fixed(best.0)).unwrap();
        let nll = super::super::functional::nll(&refit.predict(&rows).unwrap().post.probit(1.0, 1.0), &vlabels, k);
        assert!((nll - best.1).abs() < 1e-12, "{curv}: {nll} vs {}", best.1);
    }
}

#[test]
fn cholesky_route_matches_the_dense_formulas_and_the_eigen_route() {
    let (m, p, k) = (9, 4, 3);
    let (kt, kx, ks, logits, bias, labels, mean) = problem(m, p, k, 40, 11);
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    let rows = KxkRows { k_cross: &kx, k_self: &ks, mean: &mean, p };
    let probs = crate::model::softmax_rows(&logits, k).unwrap();
    for (curv, full) in [(Curvature::ClassDiagonal, false), (Curvature::Full, true)] {
        for delta in [0.2, 3.0, 80.0] {
            let fsl = CrossClassLaplace::fit_with(&train, curv, Prior::Fixed(delta), KxkSolver::Cholesky).unwrap();
            assert_eq!(fsl.solver(), KxkSolver::Cholesky);
            let got = fsl.predict(&rows).unwrap();
            let (want, _) = dense_cov(&kt, &kx, &ks, &probs, m, p, k, delta, full);
            let e = max_rel(&got.post.cov, &want);
            assert!(e < 1e-10, "{curv} δ = {delta}: {e:e}");
            let eig = CrossClassLaplace::fit(&train, curv, Prior::Fixed(delta)).unwrap();
            let (a, b) = (fsl.fit.log_evidence, eig.fit.log_evidence);
            assert!((a - b).abs() < 1e-10 * b.abs(), "{curv} δ = {delta}: evidence {a} vs {b}");
            assert_eq!(fsl.fit.kxk.as_ref().unwrap().scatter_jitter, Some(0.0));
        }
        // δ by the evidence: Brent's search on the factorisations against the eigen route's
        // bisection on the eigenvalues.
        let fsl = CrossClassLaplace::fit_with(&train, curv, Prior::Evidence, KxkSolver::Cholesky).unwrap();
        let eig = CrossClassLaplace::fit(&train, curv, Prior::Evidence).unwrap();
        let rel = (fsl.delta() - eig.delta()).abs() / eig.delta();
        assert!(rel < 1e-5, "{curv}: δ {} vs {} ({rel:e})", fsl.delta(), eig.delta());
        assert!((fsl.fit.log_evidence - eig.fit.log_evidence).abs() < 1e-10 * eig.fit.log_evidence.abs());
        let x = fsl.fit.kxk.as_ref().unwrap();
        assert!(x.search_factorisations.unwrap() <= 40, "{curv}: {} factorisations", x.search_factorisations.unwrap());
        assert!((x.rkr - eig.fit.kxk.as_ref().unwrap().rkr).abs() < 1e-10 * x.rkr);
        assert!((fsl.log_evidence(2.5).unwrap() - eig.log_evidence(2.5).unwrap()).abs() < 1e-10 * eig.fit.log_evidence.abs());
        let a = fsl.predict(&rows).unwrap();
        let b = CrossClassLaplace::fit(&train, curv, Prior::Fixed(fsl.delta())).unwrap().predict(&rows).unwrap();
        assert!(max_rel(&a.post.cov, &b.post.cov) < 1e-10);
    }
}

#[test]
fn cholesky_route_scatter_on_a_singular_kernel() {
    // Rank 12 < M K = 30: K does not factor; r = K α is in its range, where the jittered
    // solve and the pseudo-inverse agree to the jitter's order.
    let (m, k) = (10, 3);
    let (kt, _, _, logits, bias, labels, _) = problem(m, 1, k, 4, 16);
    let n = m * k;
    let kd = dense_k(&kt, m, k);
    let alpha = DMatrix::from_fn(n, 1, |i, _| ((i * 7 % 11) as f64 - 5.0) * 0.01);
    let r = &kd * &alpha;
    let logits2: Vec<f64> = (0..n).map(|i| bias[i] + r[(i, 0)]).collect();
    let _ = logits;
    let train = KxkTrain { k_train: &kt, logits: &logits2, bias: &bias, labels: &labels, m, k };
    for curv in [Curvature::ClassDiagonal, Curvature::Full] {
        let c = CrossClassLaplace::fit_with(&train, curv, Prior::Evidence, KxkSolver::Cholesky).unwrap();
        let e = CrossClassLaplace::fit(&train, curv, Prior::Evidence).unwrap();
        let (xc, xe) = (c.fit.kxk.as_ref().unwrap(), e.fit.kxk.as_ref().unwrap());
        assert!(xc.scatter_jitter.unwrap() > 0.0, "K should not factor");
        assert!(xe.pinv_dropped.unwrap() >= n - 12);
        let rel = (xc.rkr - xe.rkr).abs() / xe.rkr;
        assert!(rel < 1e-6, "{curv}: rkr {} vs {} ({rel:e})", xc.rkr, xe.rkr);
        assert!((c.delta() - e.delta()).abs() < 1e-5 * e.delta(), "{curv}: δ {} vs {}", c.delta(), e.delta());
    }
}

#[test]
fn cholesky_route_grid_visits_the_eigen_sweep() {
    let (m, p, k) = (10, 25, 3);
    let (kt, kx, ks, logits, bias, _, mean) = problem(m, p, k, 40, 14);
    let labels: Vec<usize> = (0..m).map(|i| crate::data::argmax(&logits[i * k..(i + 1) * k])).collect();
    let vlabels: Vec<usize> = (0..p).map(|q| (q * 5) % k).collect();
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    let rows = KxkRows { k_cross: &kx, k_self: &ks, mean: &mean, p };
    for curv in [Curvature::ClassDiagonal, Curvature::Full] {
        let mut eig = CrossClassLaplace::fit(&train, curv, Prior::Fixed(1.0)).unwrap();
        let all = eig.grid_search(&rows, &vlabels, -4.0, 4.0, 100).unwrap();
        let mut chol = CrossClassLaplace::fit_with(&train, curv, Prior::Fixed(1.0), KxkSolver::Cholesky).unwrap();
        let visited = chol.grid_search(&rows, &vlabels, -4.0, 4.0, 100).unwrap();
        assert!(visited.len() < 30, "{curv}: {} values visited", visited.len());
        for (d, v) in &visited {
            let (d2, v2) = all.iter().copied().find(|x| (x.0 - d).abs() <= 1e-12 * d).expect("a grid value");
            assert!((v - v2).abs() < 1e-10 * v2.abs(), "{curv} δ = {d}: {v} vs {v2} ({d2})");
        }
        assert_eq!(chol.delta(), eig.delta(), "{curv}: the coarse-to-fine search missed the sweep's best");
        assert_eq!(chol.fit.prior, "grid");
        assert!((chol.fit.log_evidence - eig.fit.log_evidence).abs() < 1e-10 * eig.fit.log_evidence.abs());
    }
}

#[test]
fn bad_inputs_are_refused() {
    let (m, p, k) = (5, 2, 3);
    let (kt, kx, ks, logits, bias, labels, mean) = problem(m, p, k, 10, 15);
    assert!(CrossClassLaplace::fit(&KxkTrain { k_train: &kt[1..], logits: &logits, bias: &bias, labels: &labels, m, k }, Curvature::Full, Prior::Evidence).is_err());
    let mut nonsym = kt.clone();
    nonsym[1] += 1.0; // G[0, 0, 0, 1] without G[0, 0, 1, 0]
    let e = CrossClassLaplace::fit(&KxkTrain { k_train: &nonsym, logits: &logits, bias: &bias, labels: &labels, m, k }, Curvature::Full, Prior::Evidence).unwrap_err();
    assert!(e.to_string().contains("not symmetric"), "{e}");
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    assert!(CrossClassLaplace::fit(&train, Curvature::Full, Prior::Fixed(-1.0)).is_err());
    let fsl = CrossClassLaplace::fit(&train, Curvature::Full, Prior::Fixed(1.0)).unwrap();
    assert!(fsl.predict(&KxkRows { k_cross: &kx[1..], k_self: &ks, mean: &mean, p }).is_err());
}
