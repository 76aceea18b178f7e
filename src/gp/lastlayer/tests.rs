use super::*;
use crate::model::{Activation, ModelConfig};
use nalgebra::DMatrix;
use rand::{Rng, SeedableRng};

/// A small random problem: N points, q features (last one the bias 1, scaled by α), K classes.
fn problem(n: usize, h: usize, k: usize, seed: u64) -> (LastLayerFeatures, Vec<usize>, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let alpha = 1.3;
    let q = h + 1;
    let mut psi = Vec::new();
    for _ in 0..n {
        for _ in 0..h {
            // ReLU-like: some exact zeros.
            let v: f64 = rng.gen_range(-1.0..2.0);
            psi.push(alpha * v.max(0.0));
        }
        psi.push(alpha);
    }
    let theta: Vec<f64> = (0..k * q).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let logits = logits_of(&psi, &theta, n, q, k);
    let labels = (0..n).map(|_| rng.gen_range(0..k)).collect();
    (LastLayerFeatures { psi, logits, n, q, k }, labels, theta)
}

fn logits_of(psi: &[f64], theta: &[f64], n: usize, q: usize, k: usize) -> Vec<f64> {
    let mut z = vec![0.0; n * k];
    for i in 0..n {
        for c in 0..k {
            z[i * k + c] = (0..q).map(|j| theta[c * q + j] * psi[i * q + j]).sum();
        }
    }
    z
}

fn softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Summed cross-entropy and its gradient `Σ_i (p_i − e_{y_i}) ⊗ ψ_i`.
fn loss_and_grad(f: &LastLayerFeatures, labels: &[usize], theta: &[f64]) -> (f64, Vec<f64>) {
    let (n, q, k) = (f.n, f.q, f.k);
    let z = logits_of(&f.psi, theta, n, q, k);
    let mut loss = 0.0;
    let mut g = vec![0.0; k * q];
    for i in 0..n {
        let p = softmax(&z[i * k..(i + 1) * k]);
        loss -= p[labels[i]].ln();
        for c in 0..k {
            let r = p[c] - if c == labels[i] { 1.0 } else { 0.0 };
            for j in 0..q {
                g[c * q + j] += r * f.psi[i * q + j];
            }
        }
    }
    (loss, g)
}

fn to_na(m: faer::MatRef<'_, f64>) -> DMatrix<f64> {
    DMatrix::from_fn(m.nrows(), m.ncols(), |i, j| m[(i, j)])
}

#[test]
fn ggn_against_loops_and_finite_differences() {
    let (f, labels, theta) = problem(9, 3, 3, 1);
    let (n, q, k) = (f.n, f.q, f.k);
    let d = k * q;
    let probs: Vec<f64> = f.logits.chunks(k).flat_map(softmax).collect();
    let h = ggn(&f.psi, &probs, n, q, k);
    // Explicit loops over (i, k, k', j, j').
    let mut want = vec![0.0; d * d];
    for i in 0..n {
        for a in 0..k {
            for b in 0..k {
                let lam = probs[i * k + a] * (if a == b { 1.0 } else { 0.0 } - probs[i * k + b]);
                for j in 0..q {
                    for jj in 0..q {
                        want[(a * q + j) * d + b * q + jj] += lam * f.psi[i * q + j] * f.psi[i * q + jj];
                    }
                }
            }
        }
    }
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for r in 0..d {
        for c in 0..d {
            assert!((h[(r, c)] - want[r * d + c]).abs() < 1e-13 * scale, "({r}, {c})");
            assert_eq!(h[(r, c)], h[(c, r)]);
        }
    }
    // The gradient against finite differences of the loss, then H against finite
    // differences of the gradient (z is linear in θ, so the GGN is the exact Hessian).
    let eps = 1e-5;
    let (_, g0) = loss_and_grad(&f, &labels, &theta);
    for a in 0..d {
        let mut tp = theta.clone();
        let mut tm = theta.clone();
        tp[a] += eps;
        tm[a] -= eps;
        let (lp, gp) = loss_and_grad(&f, &labels, &tp);
        let (lm, gm) = loss_and_grad(&f, &labels, &tm);
        assert!(((lp - lm) / (2.0 * eps) - g0[a]).abs() < 1e-8, "gradient {a}");
        for r in 0..d {
            let fd = (gp[r] - gm[r]) / (2.0 * eps);
            assert!((fd - h[(r, a)]).abs() < 1e-8, "H[{r}, {a}]: fd {fd} vs {}", h[(r, a)]);
        }
    }
}

#[test]
fn evidence_matches_direct_determinant_and_is_maximised() {
    let (f, labels, theta) = problem(40, 4, 3, 2);
    let post = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new()).unwrap();
    let d = post.num_params();
    let h = to_na(post.hessian());
    let (loss, _) = loss_and_grad(&f, &labels, &theta);
    assert!((post.log_likelihood() + loss).abs() < 1e-12 * loss);
    let s: f64 = theta.iter().map(|v| v * v).sum();
    let direct = |lam: f64| {
        let a = &h + DMatrix::identity(d, d) * lam;
        let l = a.cholesky().expect("H + λI is positive definite");
        let logdet = 2.0 * l.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
        -loss - 0.5 * lam * s + 0.5 * d as f64 * lam.ln() - 0.5 * logdet
    };
    for lam in [1e-3, 0.1, 1.0, 7.5, 100.0] {
        let (a, b) = (post.log_marginal_likelihood(lam), direct(lam));
        assert!((a - b).abs() < 1e-9 * b.abs().max(1.0), "λ = {lam}: {a} vs {b}");
    }
    let lam = post.prior_precision();
    assert!(lam > 1e-8 && lam < 1e8);
    let best = direct(lam);
    for r in [0.999, 1.001, 0.9, 1.1, 0.5, 2.0] {
        assert!(direct(lam * r) <= best + 1e-12 * best.abs(), "λ·{r} beats λ = {lam}");
    }
    // The derivative in log λ vanishes at the optimum (central differences of the direct form).
    let t = lam.ln();
    let dd = (direct((t + 1e-4).exp()) - direct((t - 1e-4).exp())) / 2e-4;
    assert!(dd.abs() < 1e-6, "d evidence / d log λ = {dd}");
    assert_eq!(post.grid().len(), 161);
    assert!(post.grid().iter().all(|g| g[1] <= post.evidence() + 1e-9));
    // A fixed λ is used as given.
    let fixed = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().prior_precision(3.0)).unwrap();
    assert_eq!(fixed.prior_precision(), 3.0);
    assert!(fixed.grid().is_empty());
}

#[test]
fn predictive_covariance_against_explicit_products() {
    let (f, labels, theta) = problem(30, 3, 4, 3);
    let post = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new()).unwrap();
    let (q, k) = (f.q, f.k);
    let d = k * q;
    let lam = post.prior_precision();
    let sigma = (to_na(post.hessian()) + DMatrix::identity(d, d) * lam).try_inverse().unwrap();
    let sig_fast = to_na(post.covariance());
    assert!((&sigma - &sig_fast).abs().max() < 1e-10 * sigma.abs().max());
    let (test, _, _) = problem(6, 3, 4, 4);
    let test = LastLayerFeatures { logits: logits_of(&test.psi, &theta, 6, q, k), ..test };
    let lp = post.predict(&test).unwrap();
    assert_eq!(lp.mean, test.logits);
    for p in 0..6 {
        // J = I_K ⊗ ψᵀ, K × D.
        let j = DMatrix::from_fn(k, d, |r, c| if c / q == r { test.psi[p * q + c % q] } else { 0.0 });
        let c = &j * &sigma * j.transpose();
        for a in 0..k {
            for b in 0..k {
                let got = lp.cov[(p * k + a) * k + b];
                assert!((got - c[(a, b)]).abs() < 1e-10 * c.abs().max(), "point {p} ({a}, {b})");
            }
        }
        let var = lp.variance();
        assert_eq!(var[p * k + 1], lp.cov[(p * k + 1) * k + 1]);
        let tv = lp.total_variance()[p];
        assert!((tv - c.trace()).abs() < 1e-10 * tv);
    }
}

#[test]
fn mc_softmax_against_an_independent_sampler() {
    let (f, labels, theta) = problem(30, 3, 3, 5);
    let post = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new()).unwrap();
    let lp = post.predict(&f).unwrap();
    let k = lp.k;
    let probs = lp.mc_softmax(500, 9).unwrap();
    assert_eq!(probs, lp.mc_softmax(500, 9).unwrap());
    assert_ne!(probs, lp.mc_softmax(500, 10).unwrap());
    for p in [0, 7, 29] {
        let c = DMatrix::from_fn(k, k, |a, b| lp.cov[(p * k + a) * k + b]);
        let l = c.cholesky().unwrap().l();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        rng.set_stream(p as u64);
        let mut acc = vec![0.0; k];
        for _ in 0..500 {
            let xi = nalgebra::DVector::from_fn(k, |_, _| StandardNormal.sample(&mut rng));
            let z = &l * xi;
            let s = softmax(&(0..k).map(|a| lp.mean[p * k + a] + z[a]).collect::<Vec<_>>());
            acc.iter_mut().zip(&s).for_each(|(a, v)| *a += v / 500.0);
        }
        for a in 0..k {
            assert!((probs[p * k + a] - acc[a]).abs() < 1e-12, "point {p} class {a}");
        }
    }
    // No posterior spread: the softmax of the mean.
    let flat = LogitPosterior { cov: vec![0.0; lp.cov.len()], ..lp.clone() };
    let p0 = flat.mc_softmax(3, 0).unwrap();
    for (a, b) in p0.iter().zip(lp.mean.chunks(k).flat_map(softmax)) {
        assert!((a - b).abs() < 1e-15);
    }
    // A strong prior shrinks the spread: the predictive approaches the MAP softmax.
    let tight = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().prior_precision(1e9)).unwrap();
    let pt = tight.predict(&f).unwrap().mc_softmax(200, 1).unwrap();
    for (a, b) in pt.iter().zip(lp.mean.chunks(k).flat_map(softmax)) {
        assert!((a - b).abs() < 1e-3);
    }
    let mut bad = lp.clone();
    bad.cov[0] = f64::NAN;
    assert!(bad.mc_softmax(10, 0).is_err());
    assert!(lp.mc_softmax(0, 0).is_err());
}

#[test]
fn fit_errors() {
    let (f, labels, theta) = problem(10, 2, 3, 6);
    assert!(LaplacePosterior::fit(&f, &labels[..9], &theta, &LaplaceParams::new()).is_err());
    assert!(LaplacePosterior::fit(&f, &labels, &theta[1..], &LaplaceParams::new()).is_err());
    let mut bad = labels.clone();
    bad[0] = 3;
    assert!(LaplacePosterior::fit(&f, &bad, &theta, &LaplaceParams::new()).is_err());
    let mut g = f.clone();
    g.psi[3] = f64::NAN;
    assert!(LaplacePosterior::fit(&g, &labels, &theta, &LaplaceParams::new()).unwrap_err().to_string().contains("non-finite"));
    assert!(LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().prior_precision(-1.0)).is_err());
    assert!(LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().grid(1.0, 0.0, 10)).is_err());
    // θ* = 0 (an untrained zero-initialised layer): the evidence grows without bound in λ.
    let zero = vec![0.0; theta.len()];
    let z = LastLayerFeatures { logits: vec![0.0; f.logits.len()], ..f.clone() };
    let e = LaplacePosterior::fit(&z, &labels, &zero, &LaplaceParams::new()).unwrap_err().to_string();
    assert!(e.contains("edge of the grid"), "{e}");
}

fn mlp(hidden: Vec<usize>, bias: bool, alpha: f64, zero_output: bool) -> Architecture {
    ModelConfig::Mlp { hidden, activation: Activation::Relu, bias, zero_last: false, alpha, zero_output }
        .resolve(5, None, 3, OutputKind::LogSoftmax)
        .unwrap()
}

#[test]
fn save_writes_the_precision_posterior_and_logit_posterior() {
    let arch = mlp(vec![4], true, 0.7, false);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let x: Vec<f64> = (0..12 * 5).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let labels: Vec<usize> = (0..12).map(|i| i % 3).collect();
    let params = arch.init(2);
    let fit = LastLayerLaplace::fit(&arch, &params, None, &x, &labels, &LaplaceParams::new().prior_precision(0.8)).unwrap();
    let post = fit.posterior();
    let (d, q) = (post.num_params(), post.features());
    assert_eq!((q, post.classes(), d), (5, 3, 15));
    let prec = post.precision();
    for i in 0..d {
        for j in 0..d {
            assert_eq!(prec[(i, j)], post.hessian()[(i, j)] + if i == j { 0.8 } else { 0.0 });
        }
    }
    // Σ is its inverse.
    let eye = to_na(prec.as_ref()) * to_na(post.covariance());
    assert!((eye - DMatrix::identity(d, d)).abs().max() < 1e-12);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ll.safetensors");
    let meta = std::collections::HashMap::from([("run_id".to_string(), "abc".to_string())]);
    let pred = fit.save(&path, &x[..4 * 5], meta).unwrap();
    assert_eq!(pred, fit.predict(&x[..4 * 5]).unwrap());
    let f = crate::io::SafeFile::open(&path).unwrap();
    let m = f.metadata();
    for (key, want) in [("format", "pathkernel-lastlayer-laplace"), ("prior_precision", "0.8"), ("classes", "3"), ("features", "5"), ("hidden", "4"), ("bias", "true"), ("alpha", "0.7"), ("run_id", "abc")] {
        assert_eq!(m[key], want, "{key}");
    }
    let read = |name: &str, shape: &[usize]| f.f64(name, Some(shape)).unwrap().1;
    let (pr, h, cov) = (read("precision", &[d, d]), read("hessian", &[d, d]), read("covariance", &[d, d]));
    for i in 0..d {
        for j in 0..d {
            assert_eq!(pr[i * d + j], prec[(i, j)]);
            assert_eq!(h[i * d + j], post.hessian()[(i, j)]);
            assert_eq!(cov[i * d + j], post.covariance()[(i, j)]);
        }
    }
    assert_eq!(read("theta", &[d]), last_layer_theta(&arch, &params).unwrap());
    assert_eq!(read("points", &[4, 5]), x[..20]);
    assert_eq!(read("mean", &[4, 3]), pred.mean);
    assert_eq!(read("cov", &[4, 3, 3]), pred.cov);
    assert_eq!(read("variance", &[4, 3]), pred.variance());
    // Rows of the wrong width: an error, nothing written.
    let bad = dir.path().join("bad.safetensors");
    assert!(fit.save(&bad, &x[..7], Default::default()).is_err());
    assert!(!bad.exists());
}

#[test]
fn network_features_reproduce_the_forward_pass() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let x: Vec<f64> = (0..8 * 5).map(|_| rng.gen_range(-2.0..2.0)).collect();
    for (hidden, bias, alpha, zo) in [(vec![6], true, 1.0, false), (vec![4, 6], true, 0.7, true), (vec![6], false, 2.0, false), (vec![], true, 1.0, false)] {
        let arch = mlp(hidden.clone(), bias, alpha, zo);
        let init = arch.init(3);
        let mut params = arch.init(4);
        params.data.iter_mut().flatten().for_each(|v| *v += 0.1);
        let f = last_layer_features(&arch, &params, Some(&init), &x).unwrap();
        let fwd = arch.forward(&params, Some(&init), &x).unwrap();
        let mut ls = f.logits.clone();
        crate::model::log_softmax_rows(&mut ls, 3);
        for (a, b) in ls.iter().zip(&fwd) {
            assert!((a - b).abs() < 1e-12, "{hidden:?} bias {bias}: {a} vs {b}");
        }
        // z = Ψ θ_k (+ the zero-output offset): θ's class-blocked order matches ψ's.
        let theta = last_layer_theta(&arch, &params).unwrap();
        assert_eq!(theta.len(), 3 * f.q);
        let lin = logits_of(&f.psi, &theta, f.n, f.q, 3);
        let offset = if zo { arch.raw_forward(&init, &x) } else { vec![0.0; lin.len()] };
        for i in 0..lin.len() {
            assert!((lin[i] - alpha * offset[i] - f.logits[i]).abs() < 1e-12);
        }
        let fit = LastLayerLaplace::fit(&arch, &params, Some(&init), &x, &[0, 1, 2, 0, 1, 2, 0, 1], &LaplaceParams::new().prior_precision(1.0)).unwrap();
        let lp = fit.predict(&x[..10]).unwrap();
        assert_eq!((lp.p, lp.k), (2, 3));
        assert_eq!(lp.mean, f.logits[..6]);
    }
    // A CNN: the pooled maps are the features.
    let cnn = ModelConfig::Cnn { channels: 2, kernel: 3, stride: 1, padding: 0, pool: 2, activation: Activation::Relu, bias: true, zero_last: false, alpha: 1.0, zero_output: false }
        .resolve(36, Some([1, 6, 6]), 3, OutputKind::LogSoftmax)
        .unwrap();
    let p = cnn.init(1);
    let x: Vec<f64> = (0..3 * 36).map(|_| rng.gen_range(0.0..1.0)).collect();
    let f = last_layer_features(&cnn, &p, None, &x).unwrap();
    assert_eq!(f.q, 2 * 2 * 2 + 1);
    let mut ls = f.logits.clone();
    crate::model::log_softmax_rows(&mut ls, 3);
    for (a, b) in ls.iter().zip(&cnn.forward(&p, None, &x).unwrap()) {
        assert!((a - b).abs() < 1e-12);
    }
    let reg = ModelConfig::default().resolve(5, None, 3, OutputKind::Identity).unwrap();
    assert!(last_layer_features(&reg, &reg.init(0), None, &x[..5]).is_err());
}
