use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One golden file. `gram` and `cross` hold float32 values (what libsvm's f32 Q cache
/// represents exactly), read as f32 and widened.
#[derive(serde::Deserialize)]
struct GoldenFile {
    name: String,
    m: usize,
    p: usize,
    k: usize,
    tol: f64,
    gram: Vec<f32>,
    labels: Vec<usize>,
    cross: Vec<f32>,
    test_labels: Vec<usize>,
    fits: Vec<GoldenFit>,
}

struct Golden {
    name: String,
    m: usize,
    p: usize,
    k: usize,
    tol: f64,
    gram: Vec<f64>,
    labels: Vec<usize>,
    cross: Vec<f64>,
    test_labels: Vec<usize>,
    fits: Vec<GoldenFit>,
}

#[derive(serde::Deserialize)]
struct GoldenFit {
    c: f64,
    classes: Vec<GoldenClass>,
}

#[derive(serde::Deserialize)]
struct GoldenClass {
    dual_coef: Vec<f64>,
    intercept: f64,
    support: Vec<usize>,
    decision: Vec<f64>,
    n_iter: usize,
    decision_tol1e3: Vec<f64>,
    n_iter_tol1e3: usize,
}

fn golden(name: &str) -> Golden {
    let path = format!("{}/tests/data/svm/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let f: GoldenFile = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
    Golden {
        name: f.name,
        m: f.m,
        p: f.p,
        k: f.k,
        tol: f.tol,
        gram: widen(f.gram),
        labels: f.labels,
        cross: widen(f.cross),
        test_labels: f.test_labels,
        fits: f.fits,
    }
}

/// `K` copies of `block` (a shared kernel for every one-vs-rest class).
fn repeat(block: &[f64], k: usize) -> Vec<f64> {
    block.repeat(k)
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// KKT check recomputed from scratch (not from the solver's gradient): box, equality
/// constraint, `m(α) − M(α) ≤ tol`, and the margin conditions with the returned intercept.
fn assert_kkt(svm: &BinarySvm, gram: &[f64], y: &[f64], m: usize, c: f64, tol: f64) {
    let slack = 1e-9 * (1.0 + c * m as f64);
    let alpha: Vec<f64> = svm.dual_coef.iter().zip(y).map(|(d, yy)| d * yy).collect();
    for (i, &a) in alpha.iter().enumerate() {
        assert!((0.0..=c).contains(&a), "alpha[{i}] = {a} outside [0, {c}]");
        assert_eq!(a > 0.0, svm.support.binary_search(&i).is_ok(), "support set wrong at {i}");
    }
    assert!(svm.support.windows(2).all(|w| w[0] < w[1]), "support not sorted");
    let sum: f64 = svm.dual_coef.iter().sum();
    assert!(sum.abs() <= slack, "Σ y_i α_i = {sum}");
    // f(x_i) without intercept, and F_i = y_i ∇_i = f0_i − y_i.
    let f0: Vec<f64> = (0..m).map(|i| (0..m).map(|j| gram[i * m + j] * svm.dual_coef[j]).sum::<f64>()).collect();
    let (mut m_up, mut m_low) = (f64::NEG_INFINITY, f64::INFINITY);
    for i in 0..m {
        let neg_f = -(f0[i] - y[i]);
        let in_up = (y[i] > 0.0 && alpha[i] < c) || (y[i] < 0.0 && alpha[i] > 0.0);
        let in_low = (y[i] > 0.0 && alpha[i] > 0.0) || (y[i] < 0.0 && alpha[i] < c);
        if in_up {
            m_up = m_up.max(neg_f);
        }
        if in_low {
            m_low = m_low.min(neg_f);
        }
    }
    assert!(m_up - m_low <= tol + slack, "KKT gap m − M = {} > tol {tol}", m_up - m_low);
    for i in 0..m {
        let margin = y[i] * (f0[i] + svm.intercept);
        if alpha[i] <= 0.0 {
            assert!(margin >= 1.0 - tol - slack, "α_{i} = 0 but y f = {margin}");
        } else if alpha[i] >= c {
            assert!(margin <= 1.0 + tol + slack, "α_{i} = C but y f = {margin}");
        } else {
            assert!((margin - 1.0).abs() <= tol + slack, "free α_{i} but y f = {margin}");
        }
    }
    let q = |i: usize, j: usize| y[i] * y[j] * gram[i * m + j];
    let obj: f64 = 0.5 * (0..m).map(|i| (0..m).map(|j| alpha[i] * q(i, j) * alpha[j]).sum::<f64>()).sum::<f64>()
        - alpha.iter().sum::<f64>();
    assert!((obj - svm.objective).abs() <= 1e-8 * (1.0 + obj.abs()), "objective {} vs {obj}", svm.objective);
}

fn ovr_y(labels: &[usize], c: usize) -> Vec<f64> {
    labels.iter().map(|&l| if l == c { 1.0 } else { -1.0 }).collect()
}

/// Fits every golden problem (one-vs-rest, shared Gram) at the golden tight `tol` and at
/// libsvm's default `1e-3`, and compares with scikit-learn. The Gram is float32-exact, so
/// libsvm ran the same double-precision SMO: iteration counts must agree exactly and the
/// solutions to rounding.
fn check_golden(name: &str, same_support: bool) {
    let g = golden(name);
    let (m, p, k) = (g.m, g.p, g.k);
    let blocks = repeat(&g.gram, k);
    let cross = repeat(&g.cross, k);
    for fit in &g.fits {
        for tight in [true, false] {
            let tol = if tight { g.tol } else { 1e-3 };
            let params = SvmParams::new().c(fit.c).tol(tol);
            let ovr = params.fit_ovr(&blocks, &g.labels, m, k).unwrap();
            assert_eq!((ovr.k, ovr.m, ovr.classes.len()), (k, m, k));
            let dec = ovr.decision(&cross, p).unwrap();
            for (c, (ours, sk)) in ovr.classes.iter().zip(&fit.classes).enumerate() {
                let d_ours: Vec<f64> = (0..p).map(|r| dec[r * k + c]).collect();
                let (sk_dec, sk_iter) =
                    if tight { (&sk.decision, sk.n_iter) } else { (&sk.decision_tol1e3, sk.n_iter_tol1e3) };
                let d_dec = max_abs_diff(&d_ours, sk_dec);
                println!(
                    "{} C={} tol={tol:e} class {c}: |Δdecision|={d_dec:.2e} nSV {} iterations {} (sklearn {sk_iter})",
                    g.name,
                    fit.c,
                    ours.support.len(),
                    ours.iterations,
                );
                assert!(d_dec <= 1e-9, "decision differs by {d_dec}");
                assert_eq!(ours.iterations, sk_iter, "iteration count differs from libsvm");
                assert_kkt(ours, &g.gram, &ovr_y(&g.labels, c), m, fit.c, tol);
                if tight {
                    let d_coef = max_abs_diff(&ours.dual_coef, &sk.dual_coef);
                    let d_b = (ours.intercept - sk.intercept).abs();
                    println!("    |Δdual_coef|={d_coef:.2e} |Δintercept|={d_b:.2e}");
                    assert!(d_coef <= 1e-9 * fit.c, "dual_coef differs by {d_coef}");
                    assert!(d_b <= 1e-9, "intercept differs by {d_b}");
                    if same_support {
                        assert_eq!(ours.support, sk.support, "support set differs");
                    }
                }
            }
            let pred = ovr.predict(&cross, p).unwrap();
            let acc = agreement(&pred, &g.test_labels);
            println!("{} C={} tol={tol:e}: held-out accuracy {acc:.3}", g.name, fit.c);
        }
    }
}

#[test]
fn golden_separable_linear_matches_sklearn() {
    check_golden("separable_linear", true);
}

#[test]
fn golden_overlap_rbf_matches_sklearn() {
    check_golden("overlap_rbf", true);
}

#[test]
fn golden_indefinite_sigmoid_matches_sklearn() {
    // 122 pairs with K_ii + K_jj − 2K_ij ≤ 0: the τ = 1e−12 branch must match libsvm.
    check_golden("indefinite_sigmoid", true);
}

#[test]
fn two_points_closed_form() {
    // x = 3 (y = +1), x = 1 (y = −1), linear kernel: w = 1, b = −2, α = (½, ½).
    let gram = [9.0, 3.0, 3.0, 1.0];
    let y = [1.0, -1.0];
    let svm = SvmParams::new().fit_binary(&gram, &y, 2).unwrap();
    assert!(
        (svm.dual_coef[0] - 0.5).abs() < 1e-12 && (svm.dual_coef[1] + 0.5).abs() < 1e-12,
        "{:?}",
        svm.dual_coef
    );
    assert!((svm.intercept + 2.0).abs() < 1e-12, "b = {}", svm.intercept);
    assert!((svm.objective + 0.5).abs() < 1e-12, "objective {}", svm.objective);
    assert_eq!(svm.support, vec![0, 1]);
    // f(x) = x − 2 at x = 0, 2, 5: K(x, x_i) = x x_i.
    let k_cross = [0.0, 0.0, 6.0, 2.0, 15.0, 5.0];
    let f = svm.decision(&k_cross, 3).unwrap();
    assert!(max_abs_diff(&f, &[-2.0, 0.0, 3.0]) < 1e-12, "{f:?}");

    // Symmetric version ±1, plus a far point with α = 0: w = 1, b = 0.
    let xs = [1.0, -1.0, 4.0];
    let gram: Vec<f64> = xs.iter().flat_map(|a| xs.iter().map(move |b| a * b)).collect();
    let svm = SvmParams::new().fit_binary(&gram, &[1.0, -1.0, 1.0], 3).unwrap();
    assert!(max_abs_diff(&svm.dual_coef, &[0.5, -0.5, 0.0]) < 1e-12, "{:?}", svm.dual_coef);
    assert!(svm.intercept.abs() < 1e-12);
    assert_eq!(svm.support, vec![0, 1]);

    // C = 0.1 < ½: both at the bound, b from the midpoint rule: f(x) = 0.2 x − 0.4.
    let svm = SvmParams::new().c(0.1).fit_binary(&[9.0, 3.0, 3.0, 1.0], &y, 2).unwrap();
    assert!(max_abs_diff(&svm.dual_coef, &[0.1, -0.1]) < 1e-15, "{:?}", svm.dual_coef);
    assert!((svm.intercept + 0.4).abs() < 1e-12, "b = {}", svm.intercept);
}

fn random_points(rng: &mut ChaCha8Rng, m: usize, d: usize) -> Vec<f64> {
    (0..m * d).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

fn rbf_gram(x: &[f64], z: &[f64], d: usize, gamma: f64) -> Vec<f64> {
    let (n, p) = (x.len() / d, z.len() / d);
    let mut k = vec![0.0; n * p];
    for i in 0..n {
        for j in 0..p {
            let d2: f64 = (0..d).map(|t| (x[i * d + t] - z[j * d + t]).powi(2)).sum();
            k[i * p + j] = (-gamma * d2).exp();
        }
    }
    k
}

#[test]
fn kkt_on_random_problems_including_indefinite() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for trial in 0..6 {
        let (m, d) = (80, 3);
        let x = random_points(&mut rng, m, d);
        let y: Vec<f64> = (0..m)
            .map(|i| if x[i * d] + 0.3 * x[i * d + 1] + rng.gen_range(-0.3..0.3) > 0.0 { 1.0 } else { -1.0 })
            .collect();
        let mut gram = rbf_gram(&x, &x, d, 2.0);
        if trial % 2 == 1 {
            // Indefinite: subtract a rank-one term (like a slightly non-PSD numerical EPK)
            // and a sigmoid-ish distortion, keeping symmetry.
            for i in 0..m {
                for j in 0..m {
                    gram[i * m + j] = (gram[i * m + j] * 2.0 - 1.2).tanh() - 0.05 * x[i * d] * x[j * d];
                }
            }
        }
        for &(c, tol) in &[(1.0, 1e-3), (10.0, 1e-6)] {
            let svm = SvmParams::new().c(c).tol(tol).fit_binary(&gram, &y, m).unwrap();
            assert!(!svm.support.is_empty());
            assert_kkt(&svm, &gram, &y, m, c, tol);
        }
    }
}

#[test]
fn ovr_uses_the_class_block() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (m, d, k, p) = (45, 2, 3, 10);
    let x = random_points(&mut rng, m, d);
    let z = random_points(&mut rng, p, d);
    let labels: Vec<usize> = (0..m).map(|i| (i * 7 + 1) % k).collect();
    let gammas = [0.5, 2.0, 8.0];
    let blocks: Vec<f64> = gammas.iter().flat_map(|&g| rbf_gram(&x, &x, d, g)).collect();
    let cross: Vec<f64> = gammas.iter().flat_map(|&g| rbf_gram(&z, &x, d, g)).collect();
    let params = SvmParams::new().c(5.0);
    let ovr = params.fit_ovr(&blocks, &labels, m, k).unwrap();
    let dec = ovr.decision(&cross, p).unwrap();
    for c in 0..k {
        let block = &blocks[c * m * m..(c + 1) * m * m];
        let single = params.fit_binary(block, &ovr_y(&labels, c), m).unwrap();
        assert_eq!(single, ovr.classes[c], "class {c}");
        let d = single.decision(&cross[c * p * m..(c + 1) * p * m], p).unwrap();
        for r in 0..p {
            assert_eq!(d[r], dec[r * k + c]);
        }
    }
    let pred = ovr.predict(&cross, p).unwrap();
    for r in 0..p {
        let row = &dec[r * k..(r + 1) * k];
        assert!(row.iter().all(|&v| v <= row[pred[r]]));
    }
}

#[test]
fn agreement_counts() {
    assert_eq!(agreement(&[0, 1, 2, 2], &[0, 1, 1, 2]), 0.75);
    assert_eq!(agreement(&[3], &[3]), 1.0);
    assert!(agreement(&[], &[]).is_nan());
}

#[test]
fn params_defaults_and_serde() {
    let p = SvmParams::new();
    assert_eq!((p.c, p.tol, p.max_iter), (1.0, 1e-3, 1_000_000));
    let q: SvmParams = serde_json::from_str(r#"{"c": 10.0}"#).unwrap();
    assert_eq!(q, SvmParams::new().c(10.0));
    let r = SvmParams::new().c(2.0).tol(1e-5).max_iter(7);
    assert_eq!(serde_json::from_str::<SvmParams>(&serde_json::to_string(&r).unwrap()).unwrap(), r);
}

#[test]
fn errors_are_values_not_panics() {
    let g = golden("overlap_rbf");
    let m = g.m;
    let y = ovr_y(&g.labels, 1);
    // Non-convergence.
    match SvmParams::new().max_iter(1).fit_binary(&g.gram, &y, m) {
        Err(Error::Numerical(s)) => {
            assert!(s.contains("did not converge within 1 iterations"), "{s}");
            assert!(s.contains("max KKT violation"), "{s}");
        }
        other => panic!("expected non-convergence, got {other:?}"),
    }
    // Single class.
    assert!(matches!(SvmParams::new().fit_binary(&g.gram, &vec![1.0; m], m), Err(Error::Data(_))));
    let labels0 = vec![0usize; m];
    let blocks = repeat(&g.gram, 2);
    assert!(matches!(SvmParams::new().fit_ovr(&blocks, &labels0, m, 2), Err(Error::Data(_))));
    // Labels out of range, labels not ±1.
    let mut bad = g.labels.clone();
    bad[3] = 3;
    assert!(matches!(SvmParams::new().fit_ovr(&repeat(&g.gram, 3), &bad, m, 3), Err(Error::Data(_))));
    let mut y0 = y.clone();
    y0[5] = 0.0;
    assert!(matches!(SvmParams::new().fit_binary(&g.gram, &y0, m), Err(Error::Data(_))));
    // NaN in the Gram, NaN in C.
    let mut gram = g.gram.clone();
    gram[7] = f64::NAN;
    assert!(matches!(SvmParams::new().fit_binary(&gram, &y, m), Err(Error::Data(_))));
    assert!(matches!(SvmParams::new().c(f64::NAN).fit_binary(&g.gram, &y, m), Err(Error::Config(_))));
    assert!(matches!(SvmParams::new().c(0.0).fit_binary(&g.gram, &y, m), Err(Error::Config(_))));
    assert!(matches!(SvmParams::new().tol(-1.0).fit_binary(&g.gram, &y, m), Err(Error::Config(_))));
    // Asymmetric Gram (beyond 1e-10 relative), and within it (accepted).
    let mut gram = g.gram.clone();
    gram[m + 4] += 1e-6;
    assert!(
        matches!(SvmParams::new().fit_binary(&gram, &y, m), Err(Error::Data(s)) if s.contains("not symmetric"))
    );
    let mut gram = g.gram.clone();
    gram[m + 4] += 1e-13;
    assert!(SvmParams::new().fit_binary(&gram, &y, m).is_ok());
    for (i, j) in [(5, 50), (50, 5), (40, 59)] {
        // off the diagonal tiles, both triangles
        let mut gram = g.gram.clone();
        gram[i * m + j] -= 1e-7;
        match SvmParams::new().fit_binary(&gram, &y, m) {
            Err(Error::Data(s)) => assert!(s.contains("not symmetric"), "{s}"),
            other => panic!("asymmetry at ({i},{j}) not caught: {other:?}"),
        }
    }
    // ±inf anywhere, including the tail after the 8-lane chunks (M = 3: 9 entries).
    let mut gram = g.gram.clone();
    gram[m * m - 1] = f64::NEG_INFINITY;
    assert!(matches!(SvmParams::new().fit_binary(&gram, &y, m), Err(Error::Data(_))));
    let small = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, f64::INFINITY];
    assert!(
        matches!(SvmParams::new().fit_binary(&small, &[1.0, -1.0, 1.0], 3), Err(Error::Data(s)) if s.contains("(2, 2)"))
    );
    // Shapes.
    assert!(matches!(SvmParams::new().fit_binary(&g.gram, &y, m - 1), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(SvmParams::new().fit_binary(&g.gram, &y[1..], m), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(SvmParams::new().fit_binary(&[], &[], 0), Err(Error::Data(_))));
    assert!(matches!(SvmParams::new().fit_ovr(&g.gram, &g.labels, m, 3), Err(Error::ShapeMismatch { .. })));
    let svm = SvmParams::new().fit_binary(&g.gram, &y, m).unwrap();
    assert!(matches!(svm.decision(&g.cross, g.p + 1), Err(Error::ShapeMismatch { .. })));
    let mut cross = g.cross.clone();
    cross[0] = f64::INFINITY;
    assert!(matches!(svm.decision(&cross, g.p), Err(Error::Data(_))));
    let ovr = SvmParams::new().fit_ovr(&repeat(&g.gram, 3), &g.labels, m, 3).unwrap();
    assert!(matches!(ovr.predict(&g.cross, g.p), Err(Error::ShapeMismatch { .. })));
}

/// splitmix64, mirrored by `splitmix64` in tests/data/svm/make_golden.py.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The M = 3000 speed problem, mirrored by `bench_problem` in make_golden.py.
fn bench_problem(m: usize, seed: u64, gamma: f64) -> (Vec<f64>, Vec<f64>) {
    let unit = |v: u64| (v >> 11) as f64 * 2f64.powi(-53);
    let mut s = seed;
    let mut x = vec![0.0; 2 * m];
    let mut y = vec![0.0; m];
    for i in 0..m {
        let (a, b, u) = (splitmix64(&mut s), splitmix64(&mut s), splitmix64(&mut s));
        x[2 * i] = unit(a);
        x[2 * i + 1] = unit(b);
        let inside = (x[2 * i] - 0.5).powi(2) + (x[2 * i + 1] - 0.5).powi(2) < 0.09;
        let flip = unit(u) < 0.1;
        y[i] = if inside != flip { 1.0 } else { -1.0 };
    }
    (rbf_gram(&x, &x, 2, gamma), y)
}

#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn speed_m3000_rbf() {
    let m = 3000;
    let (gram, y) = bench_problem(m, 42, 10.0);
    let params = SvmParams::new();
    let mut times = Vec::new();
    let mut svm = None;
    for _ in 0..5 {
        let t0 = std::time::Instant::now();
        svm = Some(params.fit_binary(&gram, &y, m).unwrap());
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let svm = svm.unwrap();
    let t0 = std::time::Instant::now();
    check_gram(&gram, m, "bench").unwrap();
    let t_check = t0.elapsed().as_secs_f64();
    let t0 = std::time::Instant::now();
    let s2 = solve(&gram, &y, m, &params).unwrap();
    let t_solve = t0.elapsed().as_secs_f64();
    assert_eq!(s2, svm);
    println!("M={m}: validation {t_check:.4} s, SMO {t_solve:.4} s");
    println!(
        "M={m} RBF fit_binary: median {:.4} s (min {:.4} s, includes the O(M²) symmetry check), \
         iterations {}, nSV {}, b {:.6}",
        times[2],
        times[0],
        svm.iterations,
        svm.support.len(),
        svm.intercept
    );
}
