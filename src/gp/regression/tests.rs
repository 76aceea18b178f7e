use super::*;
use nalgebra::{DMatrix, DVector};
use rand::Rng;

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn points(r: &mut ChaCha8Rng, n: usize, d: usize) -> Vec<Vec<f64>> {
    (0..n).map(|_| (0..d).map(|_| r.gen_range(-1.0..1.0)).collect()).collect()
}

fn rbf(a: &[f64], b: &[f64], amp: f64, ell: f64) -> f64 {
    let d2: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    amp * (-d2 / (2.0 * ell * ell)).exp()
}

/// Class c kernel: RBF with class-dependent amplitude and length scale.
fn kern(c: usize, a: &[f64], b: &[f64]) -> f64 {
    match c {
        0 => rbf(a, b, 1.0, 0.5),
        _ => rbf(a, b, 2.5, 1.2) + 0.1 * a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>(),
    }
}

struct Problem {
    m: usize,
    p: usize,
    k: usize,
    k_train: Vec<f64>,
    targets: Vec<f64>,
    k_cross: Vec<f64>,
    k_test: Vec<f64>,
    k_test_diag: Vec<f64>,
}

/// K = 2 classes, M training points, P test points (the first 3 test points are training
/// points), 2-D inputs.
fn problem(m: usize, p: usize, seed: u64) -> Problem {
    let k = 2;
    let mut r = rng(seed);
    let xtr = points(&mut r, m, 2);
    let mut xte = points(&mut r, p, 2);
    for q in 0..3.min(p).min(m) {
        xte[q] = xtr[q].clone();
    }
    let mut k_train = vec![0.0; k * m * m];
    let mut k_cross = vec![0.0; k * p * m];
    let mut k_test = vec![0.0; k * p * p];
    let mut k_test_diag = vec![0.0; k * p];
    for c in 0..k {
        for i in 0..m {
            for j in 0..m {
                k_train[c * m * m + i * m + j] = kern(c, &xtr[i], &xtr[j]);
            }
        }
        for q in 0..p {
            for i in 0..m {
                k_cross[c * p * m + q * m + i] = kern(c, &xte[q], &xtr[i]);
            }
            for q2 in 0..p {
                k_test[c * p * p + q * p + q2] = kern(c, &xte[q], &xte[q2]);
            }
            k_test_diag[c * p + q] = kern(c, &xte[q], &xte[q]);
        }
    }
    let targets: Vec<f64> = (0..m)
        .flat_map(|i| {
            let x = &xtr[i];
            [(3.0 * x[0]).sin() + x[1], (x[0] * x[1]).cos() - 0.5 * x[0]]
        })
        .collect();
    Problem { m, p, k, k_train, targets, k_cross, k_test, k_test_diag }
}

fn block(x: &[f64], c: usize, r: usize, cols: usize) -> DMatrix<f64> {
    DMatrix::from_row_slice(r, cols, &x[c * r * cols..(c + 1) * r * cols])
}

/// Dense reference posterior (LU solve): (mean [P], var [P], cov [P,P]).
fn dense_reference(pb: &Problem, c: usize, noise: f64, s: f64) -> (DVector<f64>, DVector<f64>, DMatrix<f64>, f64) {
    let (m, p) = (pb.m, pb.p);
    let kk = block(&pb.k_train, c, m, m);
    let a = &kk * s + DMatrix::identity(m, m) * noise;
    let y = DVector::from_iterator(m, (0..m).map(|i| pb.targets[i * pb.k + c]));
    let ks = block(&pb.k_cross, c, p, m); // P x M
    let kt = block(&pb.k_test, c, p, p);
    let lu = a.clone().lu();
    let alpha = lu.solve(&y).unwrap();
    let mean = &ks * &alpha * s;
    let ainv_kst = lu.solve(&ks.transpose()).unwrap(); // M x P
    let cov = &kt * s - &ks * &ainv_kst * (s * s);
    let var = DVector::from_iterator(p, (0..p).map(|q| cov[(q, q)]));
    let lml = -0.5 * y.dot(&alpha) - 0.5 * a.determinant().ln() - 0.5 * m as f64 * LN_2PI;
    (mean, var, cov, lml)
}

#[test]
fn posterior_matches_dense_nalgebra_solve() {
    let pb = problem(30, 12, 1);
    let (noise, s) = (1e-2, 1.7);
    let gp = GpParams::new().noise(noise).output_scale(s).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
    assert_eq!(gp.jitter_used(), vec![0.0, 0.0]);
    let post = gp.predict(&pb.k_cross, &pb.k_test_diag, pb.p).unwrap();
    let cov = gp.predict_cov(&pb.k_cross, &pb.k_test, pb.p).unwrap();
    let (p, k) = (pb.p, pb.k);
    for c in 0..k {
        let (mean_ref, var_ref, cov_ref, _) = dense_reference(&pb, c, noise, s);
        for q in 0..p {
            let (m1, v1) = (post.mean[q * k + c], post.var[q * k + c]);
            assert!((m1 - mean_ref[q]).abs() < 1e-10, "class {c} point {q}: mean {m1} vs {}", mean_ref[q]);
            assert!((v1 - var_ref[q]).abs() < 1e-10, "class {c} point {q}: var {v1} vs {}", var_ref[q]);
            // predict_cov's diagonal is predict's var, exactly.
            assert_eq!(cov[c * p * p + q * p + q], v1);
            for q2 in 0..p {
                let x = cov[c * p * p + q * p + q2];
                assert!((x - cov_ref[(q, q2)]).abs() < 1e-10, "cov[{c},{q},{q2}] {x} vs {}", cov_ref[(q, q2)]);
                assert_eq!(x, cov[c * p * p + q2 * p + q]);
            }
        }
    }
    // The two classes really are different problems.
    assert!((post.mean[0] - post.mean[1]).abs() > 1e-3);
}

#[test]
fn variance_is_nonnegative_and_below_prior() {
    for (noise, s) in [(1e-6, 1.0), (1e-2, 0.3), (0.0, 2.0)] {
        let pb = problem(40, 25, 2);
        let gp = GpParams::new().noise(noise).output_scale(s).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
        let post = gp.predict(&pb.k_cross, &pb.k_test_diag, pb.p).unwrap();
        for q in 0..pb.p {
            for c in 0..pb.k {
                let v = post.var[q * pb.k + c];
                let prior = s * pb.k_test_diag[c * pb.p + q];
                assert!(v >= 0.0 && v <= prior * (1.0 + 1e-12), "noise {noise}: var {v}, prior {prior}");
            }
        }
        // A test point unrelated to every training point (zero cross kernel, zero prior):
        // mean and variance exactly 0.
        let kc = vec![0.0; pb.k * pb.m];
        let post0 = gp.predict(&kc, &vec![0.0; pb.k], 1).unwrap();
        assert_eq!((post0.mean.clone(), post0.var.clone()), (vec![0.0; pb.k], vec![0.0; pb.k]));
        // At a training point the variance collapses towards the noise level.
        if noise > 0.0 {
            assert!(post.var[0] < 2.0 * noise + 1e-9, "var at training point {}", post.var[0]);
        }
    }
}

#[test]
fn inconsistent_test_kernel_gives_error_not_clamp() {
    let pb = problem(20, 4, 3);
    let gp = GpParams::new().noise(1e-3).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
    let mut diag = pb.k_test_diag.clone();
    diag[0] *= 0.5; // prior variance far below what the cross kernel explains
    match gp.predict(&pb.k_cross, &diag, pb.p) {
        Err(Error::Numerical(msg)) => assert!(msg.contains("negative"), "{msg}"),
        other => panic!("expected Numerical error, got {other:?}"),
    }
}

fn rank2_gram(m: usize) -> Vec<f64> {
    let mut r = rng(5);
    let x: Vec<[f64; 2]> = (0..m).map(|_| [r.gen_range(-1.0..1.0), r.gen_range(-1.0..1.0)]).collect();
    let mut g = vec![0.0; m * m];
    for i in 0..m {
        for j in 0..m {
            g[i * m + j] = x[i][0] * x[j][0] + x[i][1] * x[j][1];
        }
    }
    g
}

#[test]
fn jitter_escalation_on_rank_deficient_gram() {
    let m = 20;
    let g = rank2_gram(m);
    let y: Vec<f64> = (0..m).map(|i| (i as f64).sin()).collect();
    let mean_diag = (0..m).map(|i| g[i * m + i]).sum::<f64>() / m as f64;
    let gp = GpParams::new().noise(0.0).fit(&g, &y, m, 1).unwrap();
    let j = gp.jitter_used()[0];
    assert!(j > 0.0 && j < 1e-2 * mean_diag, "jitter used {j}");
    // On the ladder 1e-12·d̄·10^n.
    let n = (j / (1e-12 * mean_diag)).log10();
    assert!((n - n.round()).abs() < 1e-9 && n.round() >= 0.0, "jitter {j} not on the ladder (n = {n})");
    let dbg = format!("{gp:?}");
    assert!(dbg.contains("jitter_used") && dbg.len() < 400, "{dbg}");
    assert!(gp.log_marginal_likelihood()[0].is_finite());
    let kd: Vec<f64> = (0..m).map(|i| g[i * m + i]).collect();
    let post = gp.predict(&g, &kd, m).unwrap();
    assert!(post.mean.iter().chain(&post.var).all(|v| v.is_finite()));
    assert!(post.var.iter().all(|&v| v >= 0.0));

    // max_jitter tiny: an error with the failing pivot, never a panic.
    match GpParams::new().noise(0.0).max_jitter(1e-15).fit(&g, &y, m, 1) {
        Err(Error::NotPositiveDefinite { pivot, jitter_tried }) => {
            assert!(pivot >= 2 && pivot < m, "pivot {pivot}");
            assert!(jitter_tried > 0.0 && jitter_tried <= 1e-15 * mean_diag * (1.0 + 1e-12), "{jitter_tried}");
        }
        other => panic!("expected NotPositiveDefinite, got {other:?}"),
    }
    // max_jitter 0: only the first attempt.
    match GpParams::new().noise(0.0).max_jitter(0.0).fit(&g, &y, m, 1) {
        Err(Error::NotPositiveDefinite { jitter_tried, .. }) => assert_eq!(jitter_tried, 0.0),
        other => panic!("expected NotPositiveDefinite, got {other:?}"),
    }
    // An explicit first jitter that suffices is used as is.
    let gp = GpParams::new().noise(0.0).jitter(1e-3).fit(&g, &y, m, 1).unwrap();
    assert_eq!(gp.jitter_used(), vec![1e-3]);
}

#[test]
fn non_finite_inputs_are_errors() {
    let pb = problem(10, 3, 4);
    let mut kt = pb.k_train.clone();
    kt[pb.m * pb.m + 3 * pb.m + 4] = f64::NAN;
    match GpParams::new().fit(&kt, &pb.targets, pb.m, pb.k) {
        Err(Error::Data(msg)) => assert!(msg.contains("[1, 3, 4]"), "{msg}"),
        other => panic!("expected Data error, got {other:?}"),
    }
    let mut y = pb.targets.clone();
    y[5] = f64::INFINITY;
    assert!(matches!(GpParams::new().fit(&pb.k_train, &y, pb.m, pb.k), Err(Error::Data(_))));
    let gp = GpParams::new().noise(1e-3).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
    let mut kc = pb.k_cross.clone();
    kc[7] = f64::NAN;
    assert!(matches!(gp.predict(&kc, &pb.k_test_diag, pb.p), Err(Error::Data(_))));
    let mut kd = pb.k_test_diag.clone();
    kd[1] = f64::NEG_INFINITY;
    assert!(matches!(gp.predict(&pb.k_cross, &kd, pb.p), Err(Error::Data(_))));
}

#[test]
fn asymmetric_gram_is_an_error() {
    let pb = problem(10, 3, 6);
    let mut kt = pb.k_train.clone();
    kt[2 * pb.m + 5] += 1e-6;
    match GpParams::new().fit(&kt, &pb.targets, pb.m, pb.k) {
        Err(Error::Data(msg)) => assert!(msg.contains("not symmetric") && msg.contains("(2, 5)"), "{msg}"),
        other => panic!("expected Data error, got {other:?}"),
    }
    // Below the tolerance it is accepted.
    let mut kt = pb.k_train.clone();
    kt[2 * pb.m + 5] += 1e-13;
    assert!(GpParams::new().fit(&kt, &pb.targets, pb.m, pb.k).is_ok());
    // Asymmetric test block in predict_cov.
    let gp = GpParams::new().noise(1e-3).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
    let mut ktest = pb.k_test.clone();
    ktest[pb.p * pb.p + 1] += 1e-3;
    assert!(matches!(gp.predict_cov(&pb.k_cross, &ktest, pb.p), Err(Error::Data(_))));
}

#[test]
fn shapes_and_parameters_are_validated() {
    let pb = problem(10, 3, 7);
    let fit = |p: GpParams| p.fit(&pb.k_train, &pb.targets, pb.m, pb.k);
    assert!(matches!(fit(GpParams::new().noise(-1.0)), Err(Error::Config(_))));
    assert!(matches!(fit(GpParams::new().noise(f64::NAN)), Err(Error::Config(_))));
    assert!(matches!(fit(GpParams::new().output_scale(0.0)), Err(Error::Config(_))));
    assert!(matches!(fit(GpParams::new().jitter(-1e-3)), Err(Error::Config(_))));
    assert!(matches!(fit(GpParams::new().max_jitter(f64::INFINITY)), Err(Error::Config(_))));
    assert!(matches!(
        GpParams::new().fit(&pb.k_train[1..], &pb.targets, pb.m, pb.k),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        GpParams::new().fit(&pb.k_train, &pb.targets, pb.m, 3),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(GpParams::new().fit(&[], &[], 0, 1), Err(Error::Data(_))));
    let gp = fit(GpParams::new().noise(1e-3)).unwrap();
    assert!(matches!(gp.predict(&pb.k_cross, &pb.k_test_diag, pb.p + 1), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(gp.predict_cov(&pb.k_cross, &pb.k_test_diag, pb.p), Err(Error::ShapeMismatch { .. })));
    // P = 0 is a valid, empty request.
    let empty = gp.predict(&[], &[], 0).unwrap();
    assert!(empty.mean.is_empty() && empty.var.is_empty());
    assert!(gp.predict_cov(&[], &[], 0).unwrap().is_empty());
    assert!(mc_softmax(&empty, 10, 0).unwrap().entropy.is_empty());
    // Serde round trip of the parameters (partial configs take defaults).
    let p = GpParams::new().noise(0.5).fit_hyper(true);
    let s = serde_json::to_string(&p).unwrap();
    assert_eq!(serde_json::from_str::<GpParams>(&s).unwrap(), p);
    assert_eq!(serde_json::from_str::<GpParams>(r#"{"noise": 0.25}"#).unwrap(), GpParams::new().noise(0.25));
}

#[test]
fn log_marginal_likelihood_matches_nalgebra() {
    let pb = problem(30, 2, 8);
    for (noise, s) in [(1e-2, 1.0), (0.3, 2.2)] {
        let gp = GpParams::new().noise(noise).output_scale(s).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
        let lml = gp.log_marginal_likelihood();
        for c in 0..pb.k {
            let (_, _, _, lml_ref) = dense_reference(&pb, c, noise, s);
            assert!((lml[c] - lml_ref).abs() < 1e-9, "class {c}: {} vs {lml_ref}", lml[c]);
        }
    }
}

/// Dense LML for given (noise, s) via nalgebra's Cholesky.
fn lml_nalgebra(g: &[f64], y: &[f64], m: usize, noise: f64, s: f64) -> f64 {
    let a = DMatrix::from_row_slice(m, m, g) * s + DMatrix::identity(m, m) * noise;
    let ch = a.cholesky().unwrap();
    let yv = DVector::from_column_slice(y);
    let alpha = ch.solve(&yv);
    -0.5 * yv.dot(&alpha) - 0.5 * ch.ln_determinant() - 0.5 * m as f64 * LN_2PI
}

#[test]
fn fit_hyper_increases_lml_and_recovers_noise() {
    // y ~ GP(0, s·K + σ²I) with s = 2, σ² = 0.05, RBF on 2-D points.
    let m = 150;
    let (s_true, noise_true) = (2.0, 0.05);
    let mut r = rng(9);
    let x = points(&mut r, m, 2);
    let mut g = vec![0.0; m * m];
    for i in 0..m {
        for j in 0..m {
            g[i * m + j] = rbf(&x[i], &x[j], 1.0, 0.4);
        }
    }
    let cov = DMatrix::from_row_slice(m, m, &g) * s_true + DMatrix::identity(m, m) * noise_true;
    let lchol = cov.cholesky().unwrap().l();
    let z = DVector::from_iterator(m, (0..m).map(|_| StandardNormal.sample(&mut r)));
    let y: Vec<f64> = (lchol * z).iter().copied().collect();

    let start = GpParams::new().noise(1e-4).output_scale(1.0);
    let gp0 = start.fit(&g, &y, m, 1).unwrap();
    let gp1 = start.clone().fit_hyper(true).fit(&g, &y, m, 1).unwrap();
    let (l0, l1) = (gp0.log_marginal_likelihood()[0], gp1.log_marginal_likelihood()[0]);
    let (n1, s1) = (gp1.noise()[0], gp1.output_scale()[0]);
    assert!(l1 > l0 + 1.0, "LML start {l0}, fitted {l1}");
    assert!(n1 > noise_true / 3.0 && n1 < noise_true * 3.0, "fitted noise {n1}");
    assert!(s1 > s_true / 4.0 && s1 < s_true * 4.0, "fitted scale {s1}");
    // The reported LML is the nalgebra LML at the reported hyper-parameters...
    assert!((l1 - lml_nalgebra(&g, &y, m, n1, s1)).abs() < 1e-8);
    // ...and no point of a 2-D log grid around it is better.
    for a in -8..=8 {
        for b in -8..=8 {
            let (n, s) = (n1 * 2f64.powf(a as f64 / 4.0), s1 * 2f64.powf(b as f64 / 4.0));
            let l = lml_nalgebra(&g, &y, m, n, s);
            assert!(l <= l1 + 1e-6, "grid point noise {n}, scale {s}: {l} > fitted {l1}");
        }
    }
    // A start that is already optimal is kept (the fit never lowers the LML).
    let gp2 = GpParams::new().noise(n1).output_scale(s1).fit_hyper(true).fit(&g, &y, m, 1).unwrap();
    assert!(gp2.log_marginal_likelihood()[0] >= l1 - 1e-12);
}

fn softmax(z: &[f64]) -> Vec<f64> {
    let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - mx).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn post_of(mean: Vec<f64>, var: Vec<f64>, k: usize) -> Posterior {
    let p = mean.len() / k;
    Posterior { mean, var, p, k }
}

#[test]
fn mc_softmax_small_variance_limit() {
    let mean = vec![0.3, -1.2, 2.0, 0.0, 5.0, -3.0];
    let analytic: Vec<f64> = mean.chunks(3).flat_map(softmax).collect();
    let mc = mc_softmax(&post_of(mean.clone(), vec![1e-12; 6], 3), 2000, 1).unwrap();
    for i in 0..6 {
        assert!((mc.mean_prob[i] - analytic[i]).abs() < 1e-6, "{} vs {}", mc.mean_prob[i], analytic[i]);
        assert!(mc.std_prob[i] < 1e-5 && mc.se_mean_prob[i] < 1e-6);
    }
    // Exactly zero variance: exactly the softmax, zero spread.
    let mc = mc_softmax(&post_of(mean.clone(), vec![0.0; 6], 3), 100, 1).unwrap();
    for i in 0..6 {
        assert!((mc.mean_prob[i] - analytic[i]).abs() < 1e-15);
        assert_eq!(mc.std_prob[i], 0.0);
    }
    for q in 0..2 {
        let h: f64 = -analytic[q * 3..q * 3 + 3].iter().map(|p| p * p.ln()).sum::<f64>();
        assert!((mc.entropy[q] - h).abs() < 1e-14);
        assert_eq!(mc.se_entropy[q], 0.0);
    }
}

/// Each view of `McSoftmax` equals the flat data it views, read the slow obvious way.
#[test]
fn mc_softmax_views_equal_the_flat_vectors() {
    let mean = vec![0.5, -0.5, 1.0, 0.0, 0.0, 0.0, 2.0, -1.0, 0.5, 0.1, 0.2, 3.0];
    let mc = mc_softmax(&post_of(mean, vec![0.4; 12], 3), 200, 3).unwrap();
    assert_eq!(mc.shape(), (4, 3));
    for q in 0..4 {
        for c in 0..3 {
            assert_eq!(mc.mean()[(q, c)], mc.mean_prob[q * 3 + c]);
            assert_eq!(mc.std()[(q, c)], mc.std_prob[q * 3 + c]);
            assert_eq!(mc.se()[(q, c)], mc.se_mean_prob[q * 3 + c]);
        }
        let row = &mc.mean_prob[q * 3..q * 3 + 3];
        let best = (0..3).filter(|&c| (0..3).all(|j| row[j] <= row[c])).min().unwrap();
        assert_eq!((mc.predicted()[q], mc.confidence()[q]), (best, row[best]));
    }
    // Point 1 has equal means (flattest), point 3 the largest gap.
    let order = mc.least_confident(10);
    assert_eq!(order.len(), 4);
    assert_eq!(order[0], 1);
    assert!(order.windows(2).all(|w| mc.confidence()[w[0]] <= mc.confidence()[w[1]]));
    assert_eq!(mc.least_confident(2), order[..2]);
}

#[test]
fn mc_softmax_agrees_with_high_sample_reference() {
    let mean = vec![0.5, -0.5, 1.0, 0.0, 0.0, 0.0, 2.0, -1.0, 0.5];
    let var = vec![1.0, 0.5, 2.0, 0.3, 0.3, 0.3, 0.1, 4.0, 1.0];
    let post = post_of(mean, var, 3);
    let mc = mc_softmax(&post, 4000, 11).unwrap();
    let reference = mc_softmax(&post, 400_000, 12345).unwrap();
    for i in 0..9 {
        let se = (mc.se_mean_prob[i].powi(2) + reference.se_mean_prob[i].powi(2)).sqrt();
        assert!(se > 0.0);
        let d = (mc.mean_prob[i] - reference.mean_prob[i]).abs();
        assert!(d < 4.0 * se, "entry {i}: |{} - {}| = {d} > 4·{se}", mc.mean_prob[i], reference.mean_prob[i]);
        // The MC standard error is roughly right: std agrees with the reference's to 10 %.
        assert!((mc.std_prob[i] / reference.std_prob[i] - 1.0).abs() < 0.1);
    }
    for q in 0..3 {
        let se = (mc.se_entropy[q].powi(2) + reference.se_entropy[q].powi(2)).sqrt();
        let d = (mc.entropy[q] - reference.entropy[q]).abs();
        assert!(se > 0.0 && d < 4.0 * se, "entropy {q}: {d} vs se {se}");
        let s: f64 = mc.mean_prob[q * 3..q * 3 + 3].iter().sum();
        assert!((s - 1.0).abs() < 1e-12);
    }
}

/// E[σ(u)] and E[σ(u)²] for u ~ N(a, b) by a fine trapezoid rule (independent of the MC code).
fn logistic_normal_moments(a: f64, b: f64) -> (f64, f64) {
    let sd = b.sqrt();
    let n = 20_000;
    let (lo, hi) = (a - 12.0 * sd, a + 12.0 * sd);
    let h = (hi - lo) / n as f64;
    let (mut m1, mut m2) = (0.0, 0.0);
    for i in 0..=n {
        let u = lo + i as f64 * h;
        let w = if i == 0 || i == n { 0.5 } else { 1.0 } * h * (-(u - a).powi(2) / (2.0 * b)).exp()
            / (2.0 * std::f64::consts::PI * b).sqrt();
        let sg = 1.0 / (1.0 + (-u).exp());
        m1 += w * sg;
        m2 += w * sg * sg;
    }
    (m1, m2)
}

#[test]
fn mc_softmax_two_classes_matches_quadrature() {
    // K = 2: softmax(z)_0 = σ(z0 − z1), z0 − z1 ~ N(μ0 − μ1, v0 + v1).
    let post = post_of(vec![0.7, -0.2, 0.0, 1.5], vec![2.0, 0.5, 0.3, 0.1], 2);
    let mc = mc_softmax(&post, 20_000, 3).unwrap();
    for q in 0..2 {
        let (mu, v) = (&post.mean[2 * q..2 * q + 2], &post.var[2 * q..2 * q + 2]);
        let (m1, m2) = logistic_normal_moments(mu[0] - mu[1], v[0] + v[1]);
        let std = (m2 - m1 * m1).sqrt();
        let d = (mc.mean_prob[2 * q] - m1).abs();
        assert!(d < 4.0 * mc.se_mean_prob[2 * q], "point {q}: MC {} vs quadrature {m1}", mc.mean_prob[2 * q]);
        assert!((mc.mean_prob[2 * q + 1] - (1.0 - m1)).abs() < 4.0 * mc.se_mean_prob[2 * q + 1]);
        assert!((mc.std_prob[2 * q] / std - 1.0).abs() < 0.05, "std {} vs {std}", mc.std_prob[2 * q]);
        assert!((mc.se_mean_prob[2 * q] - mc.std_prob[2 * q] / (20_000f64).sqrt()).abs() < 1e-15);
        let h = -(m1 * m1.ln() + (1.0 - m1) * (1.0 - m1).ln());
        assert!((mc.entropy[q] - h).abs() < 4.0 * mc.se_entropy[q] + 1e-4, "entropy {} vs {h}", mc.entropy[q]);
    }
}

#[test]
fn mc_softmax_is_deterministic_per_seed() {
    let post = post_of(vec![0.1, 0.2, -0.3, 1.0], vec![0.5, 0.5, 1.0, 1.0], 2);
    let a = mc_softmax(&post, 500, 7).unwrap();
    let b = mc_softmax(&post, 500, 7).unwrap();
    let c = mc_softmax(&post, 500, 8).unwrap();
    assert_eq!(a, b);
    assert_ne!(a.mean_prob, c.mean_prob);
    // Point p's draws do not depend on the other points.
    let more = post_of(vec![0.1, 0.2, -0.3, 1.0, 3.0, 0.0], vec![0.5, 0.5, 1.0, 1.0, 2.0, 0.1], 2);
    let d = mc_softmax(&more, 500, 7).unwrap();
    assert_eq!(d.mean_prob[..4], a.mean_prob[..]);
    assert_eq!(d.se_entropy[..2], a.se_entropy[..]);
    // Identical points get independent draws (one stream per point).
    let twins = post_of(vec![0.0, 1.0, 0.0, 1.0], vec![1.0, 1.0, 1.0, 1.0], 2);
    let t = mc_softmax(&twins, 500, 7).unwrap();
    assert_ne!(t.mean_prob[..2], t.mean_prob[2..]);
    assert!(matches!(mc_softmax(&post, 1, 7), Err(Error::Config(_))));
    let bad = post_of(vec![0.0, 0.0], vec![-1.0, 0.0], 2);
    assert!(matches!(mc_softmax(&bad, 10, 7), Err(Error::Data(_))));
    let bad = post_of(vec![f64::NAN, 0.0], vec![1.0, 0.0], 2);
    assert!(matches!(mc_softmax(&bad, 10, 7), Err(Error::Data(_))));
}
