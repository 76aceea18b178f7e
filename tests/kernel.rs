//! Kernel engine: fast structured path vs generic autodiff, finite differences, symmetry/PSD,
//! exactness of the kernel machine, quadrature convergence, and an independent NTK.

mod common;

use common::*;
use pathkernel::kernel::{self, generic, KernelKind, KernelOutput, Request, Points, Rows, Rule, Side};
use pathkernel::model::Params;
use pathkernel::trajectory::Run;

fn compute(run: &Run, kind: KernelKind, rule: Rule, side: Side, points: Rows) -> KernelOutput {
    let states = run.load_all().unwrap();
    let pts = points.resolve(&run.dataset).unwrap();
    let req = Request::new(kind).rule(rule).side(side);
    kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap()
}

#[test]
fn fast_gram_equals_generic_autodiff_gram() {
    let dir = tempfile::tempdir().unwrap();
    for (name, hidden, act) in [("d1", "[6]", "relu"), ("d2", "[5, 4]", "tanh"), ("d3", "[4, 5, 3]", "relu"), ("d0", "[]", "relu")] {
        let run = train(dir.path(), name, &toy2d(hidden, act, 3, 0.5, 6, 4));
        let states = run.load_all().unwrap();
        let rule = Rule::Gauss(3);
        let fast = compute(&run, KernelKind::Epk, rule, Side::Test, Rows::Test);
        let arch = &run.manifest.architecture;
        let mut slow = vec![0.0; fast.gram.len()];
        let mut slow_diag = vec![0.0; fast.p * fast.k * fast.k];
        for s in 0..run.manifest.steps {
            generic::step_gram(arch, &states[s], Some(&states[s + 1]), &states[0], &run.dataset.x_test, &rule.fixed_nodes().unwrap(), &run.dataset.x_train, &mut slow, &mut slow_diag).unwrap();
        }
        let rel = max_abs_diff(&fast.gram, &slow) / max_abs(&slow);
        assert!(rel <= 1e-12, "{name}: relative difference {rel:e}");
        let fast_diag = fast.diag.as_ref().expect("epk has a self-kernel");
        let rel = max_abs_diff(fast_diag, &slow_diag) / max_abs(&slow_diag);
        assert!(rel <= 1e-12, "{name}: self-kernel relative difference {rel:e}");
        assert!(max_abs(&slow) > 1e-6, "{name}: trivial Gram");
        // NTK and DPK too (t = 0 on both sides).
        for kind in [KernelKind::Ntk, KernelKind::Dpk] {
            let fast = compute(&run, kind, rule, Side::Test, Rows::Train);
            let mut slow = vec![0.0; fast.gram.len()];
            let mut slow_diag = vec![0.0; fast.p * fast.k * fast.k];
            let range: Vec<usize> = if kind == KernelKind::Ntk { vec![run.manifest.steps] } else { (0..run.manifest.steps).collect() };
            for s in range {
                generic::step_gram(arch, &states[s], None, &states[0], &run.dataset.x_train, &[(0.0, 1.0)], &run.dataset.x_train, &mut slow, &mut slow_diag).unwrap();
            }
            let rel = max_abs_diff(&fast.gram, &slow) / max_abs(&slow);
            assert!(rel <= 1e-12, "{name} {kind}: relative difference {rel:e}");
            let rel = max_abs_diff(fast.diag.as_ref().unwrap(), &slow_diag) / max_abs(&slow_diag);
            assert!(rel <= 1e-12, "{name} {kind}: self-kernel relative difference {rel:e}");
        }
        // The EPK's training side under the auto rule (the rows' gradients at `t = 0`, every
        // step): the MLP preset runs it on its layer stack.
        let fast = compute(&run, KernelKind::Epk, Rule::Auto(1e-12), Side::Train, Rows::Test);
        let mut slow = vec![0.0; fast.gram.len()];
        let mut slow_diag = vec![0.0; fast.p * fast.k * fast.k];
        for s in 0..run.manifest.steps {
            generic::step_gram(arch, &states[s], None, &states[0], &run.dataset.x_test, &[(0.0, 1.0)], &run.dataset.x_train, &mut slow, &mut slow_diag).unwrap();
        }
        let rel = max_abs_diff(&fast.gram, &slow) / max_abs(&slow);
        assert!(rel <= 1e-12, "{name} epk train side: relative difference {rel:e}");
    }
}

#[test]
fn generic_gradient_equals_central_differences() {
    let dir = tempfile::tempdir().unwrap();
    for (name, hidden, act) in [("relu", "[5, 4]", "relu"), ("tanh", "[6]", "tanh")] {
        let run = train(dir.path(), name, &toy2d(hidden, act, 5, 0.5, 5, 3));
        let arch = &run.manifest.architecture;
        let w = run.load_step(run.manifest.steps).unwrap();
        let x = &run.dataset.x_test[0..2];
        let j = generic::jacobians(arch, &w, &run.load_step(0).unwrap(), x).unwrap();
        let flat = w.flat();
        let k = arch.outputs();
        let h = 1e-6;
        for widx in 0..flat.len() {
            let mut plus = flat.clone();
            let mut minus = flat.clone();
            plus[widx] += h;
            minus[widx] -= h;
            let fp = arch.forward(&Params::from_flat(w.specs.clone(), &plus).unwrap(), None, x).unwrap();
            let fm = arch.forward(&Params::from_flat(w.specs.clone(), &minus).unwrap(), None, x).unwrap();
            for c in 0..k {
                let fd = (fp[c] - fm[c]) / (2.0 * h);
                let ad = j[c * flat.len() + widx];
                assert!((fd - ad).abs() <= 1e-7 * (1.0 + ad.abs()), "{name} w{widx} class {c}: fd {fd} vs autodiff {ad}");
            }
        }
    }
}

/// Smallest eigenvalue of a symmetric `n × n` matrix (row-major), by nalgebra's `SymmetricEigen`
/// (an independent check: the library's own linear algebra is faer). NaN if any eigenvalue is.
fn min_eigenvalue(a: Vec<f64>, n: usize) -> f64 {
    let ev = nalgebra::DMatrix::from_row_slice(n, n, &a).symmetric_eigenvalues();
    ev.iter().copied().fold(f64::INFINITY, |m, v| if m.is_nan() || v.is_nan() { f64::NAN } else { m.min(v) })
}

#[test]
fn epk_train_gram_is_symmetric_and_psd() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "sym", &toy2d("[8]", "relu", 20, 0.5, 8, 3));
    let out = compute(&run, KernelKind::Epk, Rule::Auto(1e-12), Side::Train, Rows::Train);
    let (m, k) = (out.m, out.k);
    let n = m * k;
    // As an (i,k) x (j,k') matrix.
    let mut a = vec![0.0; n * n];
    for i in 0..m {
        for j in 0..m {
            for kt in 0..k {
                for ks in 0..k {
                    a[(i * k + kt) * n + j * k + ks] = out.gram[((i * m + j) * k + kt) * k + ks];
                }
            }
        }
    }
    let scale = max_abs(&a);
    for r in 0..n {
        for c in 0..n {
            assert!((a[r * n + c] - a[c * n + r]).abs() <= 1e-12 * scale, "asymmetric at {r},{c}");
        }
    }
    // The self-kernel equals the Gram's diagonal blocks.
    let dg = out.diag.as_ref().unwrap();
    for i in 0..m {
        for kt in 0..k {
            for ks in 0..k {
                let g = out.gram[((i * m + i) * k + kt) * k + ks];
                assert!((dg[(i * k + kt) * k + ks] - g).abs() <= 1e-12 * scale, "diag {i} {kt} {ks}");
            }
        }
    }
    let lmin = min_eigenvalue(a, n);
    assert!(lmin >= -1e-10 * scale, "smallest eigenvalue {lmin:e} (scale {scale:e})");
    // The test-side EPK on the same points is not symmetric in general (Definition 3.4's asymmetry).
    let test_side = compute(&run, KernelKind::Epk, Rule::Auto(1e-12), Side::Test, Rows::Train);
    assert!(max_abs_diff(&test_side.gram, &out.gram) > 1e-8);
}

#[test]
fn epk_kernel_machine_reproduces_the_network_on_the_2d_toy() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "exact", &toy2d("[16]", "relu", 60, 1.0, 20, 30));
    let epk = compute(&run, KernelKind::Epk, Rule::Auto(1e-12), Side::Test, Rows::Test);
    assert!(epk.max_abs_error() <= 1e-11, "EPK auto:1e-12 error {:e}", epk.max_abs_error());
    let single = epk.single_machine.as_ref().expect("cross-entropy: constant a_i");
    assert!(max_abs_diff(single, &epk.network) <= 1e-11);
    // The network actually moved, and the DPK does not reproduce it.
    assert!(max_abs_diff(&epk.network, &epk.bias) > 0.5);
    let dpk = compute(&run, KernelKind::Dpk, Rule::Auto(1e-12), Side::Test, Rows::Test);
    assert!(dpk.max_abs_error() > 1e3 * epk.max_abs_error().max(1e-14), "dpk {:e}", dpk.max_abs_error());
    // Deeper and tanh networks too.
    for (name, hidden, act) in [("deep", "[8, 6]", "relu"), ("tanh", "[8]", "tanh"), ("deep3", "[6, 5, 4]", "relu")] {
        let run = train(dir.path(), name, &toy2d(hidden, act, 30, 1.0, 15, 20));
        let epk = compute(&run, KernelKind::Epk, Rule::Auto(1e-12), Side::Test, Rows::Test);
        assert!(epk.max_abs_error() <= 1e-11, "{name}: EPK auto:1e-12 error {:e}", epk.max_abs_error());
    }
}

#[test]
fn left_riemann_error_shrinks_as_one_over_t() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "riemann", &toy2d("[8]", "tanh", 10, 1.0, 10, 10));
    let errs: Vec<f64> = [8, 16, 32, 64]
        .iter()
        .map(|&t| compute(&run, KernelKind::Epk, Rule::Left(t), Side::Test, Rows::Test).max_abs_error())
        .collect();
    for w in errs.windows(2) {
        let ratio = w[0] / w[1];
        assert!((1.7..2.3).contains(&ratio), "errors {errs:?}: ratio {ratio}");
    }
}

/// Closed-form gradients of a one-hidden-layer ReLU MLP with log-softmax output (no dfdx, no faer).
fn closed_form_grad(w1: &[f64], b1: &[f64], w2: &[f64], b2: &[f64], d: usize, h: usize, k: usize, x: &[f64]) -> Vec<Vec<f64>> {
    let z1: Vec<f64> = (0..h).map(|j| b1[j] + (0..d).map(|i| w1[j * d + i] * x[i]).sum::<f64>()).collect();
    let a1: Vec<f64> = z1.iter().map(|v| v.max(0.0)).collect();
    let z2: Vec<f64> = (0..k).map(|c| b2[c] + (0..h).map(|j| w2[c * h + j] * a1[j]).sum::<f64>()).collect();
    let mx = z2.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z2.iter().map(|v| (v - mx).exp()).collect();
    let s: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|v| v / s).collect();
    (0..k)
        .map(|c| {
            let g2: Vec<f64> = (0..k).map(|o| if o == c { 1.0 - p[o] } else { -p[o] }).collect();
            let g1: Vec<f64> = (0..h).map(|j| if z1[j] > 0.0 { (0..k).map(|o| g2[o] * w2[o * h + j]).sum() } else { 0.0 }).collect();
            let mut g = Vec::new();
            for j in 0..h {
                for i in 0..d {
                    g.push(g1[j] * x[i]);
                }
            }
            g.extend_from_slice(&g1);
            for o in 0..k {
                for j in 0..h {
                    g.push(g2[o] * a1[j]);
                }
            }
            g.extend_from_slice(&g2);
            g
        })
        .collect()
}

#[test]
fn ntk_matches_an_independent_closed_form() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "ntk", &toy2d("[7]", "relu", 15, 0.5, 6, 5));
    let s = 9;
    let states = run.load_all().unwrap();
    let pts = Points { x: run.dataset.x_test.clone(), dim: 2 };
    let req = Request::new(KernelKind::Ntk).rule(Rule::Gauss(1)).ntk_step(Some(s));
    let out = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    let w = &states[s];
    let (d, h, k) = (2, 7, 3);
    let (w1, b1, w2, b2) = (&w.data[0], &w.data[1], &w.data[2], &w.data[3]);
    let (p, m) = (out.p, out.m);
    let mut worst: f64 = 0.0;
    let mut scale: f64 = 0.0;
    for pi in 0..p {
        let gx = closed_form_grad(w1, b1, w2, b2, d, h, k, &run.dataset.x_test[pi * d..(pi + 1) * d]);
        for i in 0..m {
            let gi = closed_form_grad(w1, b1, w2, b2, d, h, k, &run.dataset.x_train[i * d..(i + 1) * d]);
            for kt in 0..k {
                for ks in 0..k {
                    let v: f64 = gx[kt].iter().zip(&gi[ks]).map(|(a, b)| a * b).sum();
                    worst = worst.max((v - out.gram[((pi * m + i) * k + kt) * k + ks]).abs());
                    scale = scale.max(v.abs());
                }
            }
        }
    }
    assert!(scale > 1e-3);
    assert!(worst <= 1e-12 * scale, "NTK differs from closed form by {worst:e} (scale {scale:e})");
}

#[test]
fn row_blocked_kernels_equal_unblocked() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "blocked", &toy2d("[8, 6]", "relu", 12, 1.0, 15, 13));
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let cases = [
        (KernelKind::Epk, Rule::Auto(1e-12), false, None),
        (KernelKind::Epk, Rule::Gauss(3), true, Some((2, 9))),
        (KernelKind::Ntk, Rule::Gauss(1), false, None),
        (KernelKind::Dpk, Rule::Gauss(1), false, None),
        (KernelKind::Chen, Rule::Gauss(1), false, None),
        (KernelKind::Kprime, Rule::Auto(1e-10), false, None),
    ];
    for (kind, rule, per_step, steps) in cases {
        let req = Request::new(kind).rule(rule).ntk_step(Some(5).filter(|_| kind == KernelKind::Ntk)).per_step(per_step).steps(steps);
        let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
        for block in [1, 4, 5, 12] {
            let b = kernel::compute(&run, &states, &pts, &req.clone().block_rows(Some(block)), &|_, _| {}).unwrap();
            let rel = |x: &[f64], y: &[f64]| max_abs_diff(x, y) / max_abs(y).max(1e-300);
            let what = format!("{kind} block {block}");
            assert_eq!(b.p, whole.p, "{what}");
            assert!(rel(&b.gram, &whole.gram) <= 1e-12, "{what}: gram {:e}", rel(&b.gram, &whole.gram));
            if let (Some(x), Some(y)) = (&b.per_step, &whole.per_step) {
                assert!(rel(x, y) <= 1e-12, "{what}: per-step");
            }
            assert_eq!(b.per_step.is_some(), whole.per_step.is_some());
            if let (Some(x), Some(y)) = (&b.diag, &whole.diag) {
                assert!(rel(x, y) <= 1e-12, "{what}: diag");
            }
            assert!(rel(&b.machine, &whole.machine) <= 1e-12, "{what}: machine");
            assert!(rel(&b.bias, &whole.bias) <= 1e-12 && rel(&b.network, &whole.network) <= 1e-12, "{what}");
            assert_eq!(b.a, whole.a, "{what}");
            assert_eq!(b.records.len(), whole.records.len());
            for (x, y) in b.records.iter().zip(&whole.records) {
                // Machine-vs-network errors sit at rounding level; they agree to the scale of f.
                let scale = y.max_abs_change.max(max_abs(&whole.network));
                assert!((x.max_abs_error - y.max_abs_error).abs() <= 1e-12 * scale, "{what}: {} vs {}", x.max_abs_error, y.max_abs_error);
                assert!((x.mean_evaluations - y.mean_evaluations).abs() <= 1e-12 * y.mean_evaluations, "{what}");
                assert_eq!(x.max_evaluations, y.max_evaluations, "{what}");
                assert_eq!(x.unconverged_pieces, y.unconverged_pieces, "{what}");
            }
        }
    }
    // A budget that holds the output but not the whole computation blocks; one that cannot
    // hold the output refuses with the estimate.
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let p = pts.len();
    let m = run.dataset.n_train();
    let full = kernel::engine::blocked::plan(&run.manifest, p, m, &req, u64::MAX).unwrap();
    assert_eq!(full.blocks, 1);
    // The smallest budget (within 2 %) that the planner accepts: it must block.
    let mut tight = full.estimated_peak();
    while kernel::engine::blocked::plan(&run.manifest, p, m, &req, tight * 49 / 50).is_ok() {
        tight = tight * 49 / 50;
    }
    let (out, plan) = compute_blocked(&run, &states, &pts, &req, tight);
    assert!(plan.blocks > 1 && plan.estimated_peak() <= tight, "{plan:?} for {tight}");
    let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    assert!(max_abs_diff(&out.gram, &whole.gram) <= 1e-12 * max_abs(&whole.gram));
    let err = kernel::engine::blocked::plan(&run.manifest, p, m, &req, full.output_bytes).unwrap_err();
    assert!(matches!(err, pathkernel::Error::OutOfMemoryBudget { .. }), "{err}");
}

/// The kernel within a memory budget: the planner's row blocks through the one entry.
fn compute_blocked(run: &Run, states: &[Params], pts: &Points, req: &Request, budget: u64) -> (KernelOutput, kernel::engine::blocked::BlockPlan) {
    let plan = kernel::engine::blocked::plan(&run.manifest, pts.len(), run.dataset.n_train(), req, budget).unwrap();
    let out = kernel::compute(run, states, pts, &req.clone().block_rows(Some(plan.block_rows)), &|_, _| {}).unwrap();
    (out, plan)
}

#[test]
fn chunked_node_evaluation_equals_small_blocks() {
    // 1600 grid points with the auto rule give more nodes than one evaluation chunk (2048 rows)
    // and are processed in chunks of 32 points inside each step; blocks of 16 points stay below
    // both, so the two paths differ only in chunking.
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "chunks", &toy2d("[8]", "relu", 6, 1.0, 10, 5));
    let states = run.load_all().unwrap();
    let pts = Rows::Grid(40).resolve(&run.dataset).unwrap();
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    assert!(whole.mean_evaluations() * whole.p as f64 > 2048.0);
    let small = kernel::compute(&run, &states, &pts, &req.clone().block_rows(Some(16)), &|_, _| {}).unwrap();
    assert!(max_abs_diff(&whole.gram, &small.gram) <= 1e-12 * max_abs(&whole.gram));
    assert!(max_abs_diff(&whole.machine, &small.machine) <= 1e-12 * max_abs(&whole.machine));
    assert!(max_abs_diff(whole.diag.as_ref().unwrap(), small.diag.as_ref().unwrap()) <= 1e-12 * max_abs(whole.diag.as_ref().unwrap()));
    for (x, y) in whole.records.iter().zip(&small.records) {
        assert!((x.dpk_cosine_error - y.dpk_cosine_error).abs() <= 1e-12, "{} vs {}", x.dpk_cosine_error, y.dpk_cosine_error);
        assert_eq!(x.max_evaluations, y.max_evaluations);
    }
    assert!(whole.max_abs_error() <= 1e-11, "{:e}", whole.max_abs_error());
}


/// A small CNN on fake MNIST, trained by full-batch gradient descent.
fn cnn_run(dir: &std::path::Path, name: &str, model: &str) -> Run {
    let data = dir.join(format!("{name}-mnist"));
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 12, 4);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 12\nn_test = 4\n\n[model]\nkind = \"cnn\"\n{model}\n\n[train]\nlr = 0.5\nsteps = 3\nseed = 2\n",
        data.to_str().unwrap()
    );
    train(dir, name, &toml)
}

#[test]
fn cnn_fast_path_equals_generic_path_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut worst: f64 = 0.0;
    for (name, model) in [
        ("relu", "channels = 2\nkernel = 5\nstride = 2\npool = 2"),
        ("tanh-nobias", "channels = 3\nkernel = 3\nstride = 2\npadding = 1\npool = 2\nactivation = \"tanh\"\nbias = false\nzero_output = true"),
    ] {
        let run = cnn_run(dir.path(), name, model);
        let states = run.load_all().unwrap();
        for (kind, rule, points) in [
            (KernelKind::Epk, Rule::Gauss(3), Rows::Test),
            (KernelKind::Dpk, Rule::Gauss(1), Rows::Train),
            (KernelKind::Ntk, Rule::Gauss(1), Rows::Test),
            (KernelKind::Chen, Rule::Gauss(1), Rows::Test),
        ] {
            let pts = points.resolve(&run.dataset).unwrap();
            let req = Request::new(kind).rule(rule);
            let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic]
                .map(|path| kernel::compute(&run, &states, &pts, &req.clone().path(path), &|_, _| {}).unwrap());
            let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
            assert!(rel <= 1e-12, "{name} {kind}: Gram relative difference {rel:e}");
            worst = worst.max(rel);
            if let (Some(a), Some(b)) = (&fast.diag, &slow.diag) {
                let rel = max_abs_diff(a, b) / max_abs(b);
                assert!(rel <= 1e-12, "{name} {kind}: self-kernel relative difference {rel:e}");
                worst = worst.max(rel);
            }
            let rel = max_abs_diff(&fast.machine, &slow.machine) / max_abs(&slow.machine);
            assert!(rel <= 1e-12, "{name} {kind}: kernel machine relative difference {rel:e}");
        }
    }
    eprintln!("CNN fast vs generic through compute(): max relative difference {worst:e}");
}

#[test]
fn cnn_epk_auto_reproduces_the_network() {
    let dir = tempfile::tempdir().unwrap();
    for (name, model) in [
        ("relu", "channels = 2\nkernel = 5\nstride = 2\npool = 2"),
        ("tanh", "channels = 2\nkernel = 3\nstride = 1\npool = 2\nactivation = \"tanh\""),
    ] {
        let run = cnn_run(dir.path(), name, model);
        let epk = compute(&run, KernelKind::Epk, Rule::Auto(1e-12), Side::Test, Rows::Test);
        eprintln!("{name}: EPK auto:1e-12 max |machine − network| {:e}, {:.1} evaluations/point/step", epk.max_abs_error(), epk.mean_evaluations());
        assert!(epk.max_abs_error() <= 1e-11, "{name}: EPK auto:1e-12 error {:e}", epk.max_abs_error());
        assert!(max_abs_diff(&epk.network, &epk.bias) > 0.1, "{name}: the network barely moved");
        let dpk = compute(&run, KernelKind::Dpk, Rule::Gauss(1), Side::Test, Rows::Test);
        assert!(dpk.max_abs_error() > 1e3 * epk.max_abs_error().max(1e-14), "{name}: dpk {:e}", dpk.max_abs_error());
    }
}


/// Kernels on the logits: the machine reproduces the network's logits (the pre-log-softmax
/// values, checked against an independent forward pass through the identity output map) to
/// machine precision, for the one-hidden-layer pieces path, a deeper tanh MLP and SGD; the NTK's
/// logit Gram equals the generic autodiff Gram of the identity-output network; momentum runs are
/// refused.
#[test]
fn logit_kernels_reproduce_the_logits() {
    use pathkernel::kernel::Outputs;
    use pathkernel::model::OutputKind;
    let dir = tempfile::tempdir().unwrap();
    for (name, hidden, act, rule) in [("relu1", "[6]", "relu", Rule::Auto(1e-12)), ("tanh2", "[5, 4]", "tanh", Rule::Gauss(8))] {
        let run = train(dir.path(), name, &toy2d(hidden, act, 3, 0.5, 8, 4));
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        let req = Request::new(KernelKind::Epk).rule(rule);
        let o = kernel::compute(&run, &states, &pts, &req.clone().outputs(Outputs::Logits), &|_, _| {}).unwrap();
        let mut arch = run.manifest.architecture.clone();
        arch.output = OutputKind::Identity;
        let logits = arch.forward(&states[run.manifest.steps], Some(&states[0]), &run.dataset.x_test).unwrap();
        assert!(max_abs_diff(&o.network, &logits) < 1e-12, "{name}: network values are not the logits");
        let logsm = run.manifest.architecture.forward(&states[run.manifest.steps], Some(&states[0]), &run.dataset.x_test).unwrap();
        assert!(max_abs_diff(&logits, &logsm) > 1e-3, "{name}: logits equal log-softmax outputs");
        assert!(o.max_abs_error() < 1e-11, "{name}: machine vs logits {:e}", o.max_abs_error());
        // The NTK on the logits against the generic autodiff Gram of the identity-output network.
        let ntk = Request::new(KernelKind::Ntk).rule(Rule::Gauss(1));
        let o = kernel::compute(&run, &states, &pts, &ntk.outputs(Outputs::Logits), &|_, _| {}).unwrap();
        let mut slow = vec![0.0; o.gram.len()];
        let mut slow_diag = vec![0.0; o.p * o.k * o.k];
        let n = run.manifest.steps;
        generic::step_gram(&arch, &states[n], None, &states[0], &run.dataset.x_test, &[(0.0, 1.0)], &run.dataset.x_train, &mut slow, &mut slow_diag).unwrap();
        let rel = max_abs_diff(&o.gram, &slow) / max_abs(&slow);
        assert!(rel <= 1e-12, "{name}: logit NTK vs generic {rel:e}");
    }
    let sgd = train(dir.path(), "sgd", &toy2d("[6]", "relu", 3, 0.3, 10, 4).replace("seed = 7\n", "seed = 7\noptimizer = \"sgd\"\nbatch_size = 7\n"));
    let states = sgd.load_all().unwrap();
    let pts = Rows::Test.resolve(&sgd.dataset).unwrap();
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let o = kernel::compute(&sgd, &states, &pts, &req.clone().outputs(Outputs::Logits), &|_, _| {}).unwrap();
    assert!(o.max_abs_error() < 1e-11, "sgd: machine vs logits {:e}", o.max_abs_error());
    let mom = train(dir.path(), "mom", &toy2d("[6]", "relu", 3, 0.3, 5, 4).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\n"));
    let states = mom.load_all().unwrap();
    let err = kernel::compute(&mom, &states, &pts, &req.clone().outputs(Outputs::Logits), &|_, _| {}).unwrap_err();
    assert!(err.to_string().contains("plain gradient steps"), "{err}");
}

/// The path kernel of a run's test points against its training points over every step, `J̄`
/// formed from autodiff Jacobians at the fixed `nodes` (no kinks): `([P, M, K, K], [P, K, K])`.
fn explicit_path_kernel(run: &Run, states: &[Params], nodes: &[(f64, f64)], logits: bool) -> (Vec<f64>, Vec<f64>) {
    let mut arch = run.manifest.architecture.clone();
    if logits {
        arch.output = pathkernel::model::OutputKind::Identity;
    }
    let (d, k, wn) = (arch.input_dim(), arch.outputs(), states[0].numel());
    let (xr, xt) = (&run.dataset.x_test, &run.dataset.x_train);
    let (p, m) = (xr.len() / d, xt.len() / d);
    let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(x, y)| x * y).sum::<f64>();
    let (mut g, mut diag) = (vec![0.0; p * m * k * k], vec![0.0; p * k * k]);
    for s in 0..run.manifest.steps {
        let jbar = |x: &[f64]| -> Vec<f64> {
            let mut out = vec![0.0; k * wn];
            for &(t, w) in nodes {
                let at = generic::interpolate(&states[s], Some(&states[s + 1]), t);
                let j = generic::jacobians(&arch, &at, &states[0], x).unwrap();
                out.iter_mut().zip(&j).for_each(|(o, v)| *o += w * v);
            }
            out
        };
        let jr: Vec<Vec<f64>> = xr.chunks(d).map(jbar).collect();
        let jt: Vec<Vec<f64>> = xt.chunks(d).map(jbar).collect();
        for (pi, a) in jr.iter().enumerate() {
            for kt in 0..k {
                for ks in 0..k {
                    diag[(pi * k + kt) * k + ks] += dot(&a[kt * wn..(kt + 1) * wn], &a[ks * wn..(ks + 1) * wn]);
                    for (i, b) in jt.iter().enumerate() {
                        g[((pi * m + i) * k + kt) * k + ks] += dot(&a[kt * wn..(kt + 1) * wn], &b[ks * wn..(ks + 1) * wn]);
                    }
                }
            }
        }
    }
    (g, diag)
}

/// The path kernel `Σ_s ⟨J̄_s(x), J̄_s(x′)⟩` (both sides integrated, on the logits) against the
/// slow obvious one: every step's Jacobians from autodiff at 5 Gauss nodes on each piece
/// between the hidden units' kinks (the logits' gradient is polynomial of degree ≤ 2 in t
/// there, so the rule is exact), J̄ formed explicitly and the inner products summed. The
/// training Gram is symmetric PSD, a window of the last steps is the sum over those steps; the
/// layer stack's path equals it, and the generic reference where the closed form does not apply.
#[test]
fn path_kernel_equals_explicit_integrated_jacobians() {
    use pathkernel::kernel::{Layout, Outputs};
    use pathkernel::model::OutputKind;
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "relu1", &toy2d("[6]", "relu", 4, 0.5, 8, 4));
    let states = run.load_all().unwrap();
    let n = run.manifest.steps;
    let mut arch = run.manifest.architecture.clone();
    arch.output = OutputKind::Identity;
    let (d, k) = (arch.input_dim(), arch.outputs());
    let gauss = Rule::Gauss(5).fixed_nodes().unwrap();
    // J̄_s(x) [K, W], explicitly.
    let jbar = |s: usize, x: &[f64]| -> Vec<f64> {
        let (w0, b0, w1, b1) = (&states[s].data[0], &states[s].data[1], &states[s + 1].data[0], &states[s + 1].data[1]);
        let h = b0.len();
        let mut cuts = vec![0.0, 1.0];
        for j in 0..h {
            let z0: f64 = (0..d).map(|c| w0[j * d + c] * x[c]).sum::<f64>() + b0[j];
            let z1: f64 = (0..d).map(|c| w1[j * d + c] * x[c]).sum::<f64>() + b1[j];
            let t = z0 / (z0 - z1);
            if t > 0.0 && t < 1.0 {
                cuts.push(t);
            }
        }
        cuts.sort_by(f64::total_cmp);
        let mut out = vec![0.0; k * states[s].numel()];
        for piece in cuts.windows(2) {
            for &(t, w) in &gauss {
                let at = generic::interpolate(&states[s], Some(&states[s + 1]), piece[0] + t * (piece[1] - piece[0]));
                let j = generic::jacobians(&arch, &at, &states[0], x).unwrap();
                out.iter_mut().zip(&j).for_each(|(o, v)| *o += w * (piece[1] - piece[0]) * v);
            }
        }
        out
    };
    let (xr, xt) = (&run.dataset.x_test, &run.dataset.x_train);
    let (p, m) = (xr.len() / d, xt.len() / d);
    let wn = states[0].numel();
    let slow = |steps: std::ops::Range<usize>, rows: &[f64]| -> (Vec<f64>, Vec<f64>) {
        let pr = rows.len() / d;
        let (mut g, mut diag) = (vec![0.0; pr * m * k * k], vec![0.0; pr * k * k]);
        for s in steps {
            let jr: Vec<Vec<f64>> = rows.chunks(d).map(|x| jbar(s, x)).collect();
            let jt: Vec<Vec<f64>> = xt.chunks(d).map(|x| jbar(s, x)).collect();
            for (pi, a) in jr.iter().enumerate() {
                for kt in 0..k {
                    for ks in 0..k {
                        let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(x, y)| x * y).sum::<f64>();
                        diag[(pi * k + kt) * k + ks] += dot(&a[kt * wn..(kt + 1) * wn], &a[ks * wn..(ks + 1) * wn]);
                        for (i, b) in jt.iter().enumerate() {
                            g[((pi * m + i) * k + kt) * k + ks] += dot(&a[kt * wn..(kt + 1) * wn], &b[ks * wn..(ks + 1) * wn]);
                        }
                    }
                }
            }
        }
        (g, diag)
    };
    let req = |steps| Request::new(KernelKind::Path).rule(Rule::Auto(1e-13)).steps(steps);
    let test_pts = Rows::Test.resolve(&run.dataset).unwrap();
    for steps in [None, Some((n - 2, n))] {
        let o = kernel::compute(&run, &states, &test_pts, &req(steps).outputs(Outputs::Logits), &|_, _| {}).unwrap();
        let (g, diag) = slow(steps.map_or(0..n, |(a, b)| a..b), xr);
        let rel = max_abs_diff(&o.gram, &g) / max_abs(&g);
        assert!(rel <= 1e-12, "path rows {steps:?} vs explicit J̄: {rel:e}");
        let rel = max_abs_diff(o.diag.as_ref().unwrap(), &diag) / max_abs(&diag);
        assert!(rel <= 1e-12, "path self-kernel {steps:?} vs explicit |J̄|²: {rel:e}");
        assert_eq!((o.p, o.m), (p, m));
        // The closed form (no forward-mode node search), not the stack's path.
        assert!(o.records.iter().all(|r| r.mean_jvp_evaluations == 0.0), "the logits of a one-hidden-layer ReLU MLP left the closed form");
    }
    // The training Gram: symmetric, PSD, equal to the explicit one; its diagonal is the self-kernel.
    let train_pts = Points { x: xt.clone(), dim: d };
    let o = kernel::compute(&run, &states, &train_pts, &req(None).outputs(Outputs::Logits).layout(Layout::Diag), &|_, _| {}).unwrap();
    let (g, diag) = slow(0..n, xt);
    let scale = max_abs(&g);
    for i in 0..m {
        for c in 0..k {
            for j in 0..m {
                let (a, b) = (o.gram[(i * m + j) * k + c], o.gram[(j * m + i) * k + c]);
                assert!((a - b).abs() <= 1e-12 * scale, "asymmetric at ({i}, {j}, {c}): {a} vs {b}");
                assert!((a - g[((i * m + j) * k + c) * k + c]).abs() <= 1e-12 * scale, "train Gram vs explicit at ({i}, {j}, {c})");
            }
            let dd = o.diag.as_ref().unwrap()[(i * k + c) * k + c];
            assert!((o.gram[(i * m + i) * k + c] - dd).abs() <= 1e-12 * scale && (dd - diag[(i * k + c) * k + c]).abs() <= 1e-12 * scale);
        }
    }
    for c in 0..k {
        let kc = nalgebra::DMatrix::from_fn(m, m, |i, j| 0.5 * (o.gram[(i * m + j) * k + c] + o.gram[(j * m + i) * k + c]));
        let min = kc.symmetric_eigenvalues().min();
        assert!(min >= -1e-12 * scale, "class {c}: min eigenvalue {min:e}");
    }
    // The same kernel on the MLP's layer stack (`kernel::stack::path`: J̄ formed for every
    // layer, the nodes from the stack's kink sweep), split by layer: equal to the explicit one,
    // the layers summing to it.
    let o = kernel::compute(&run, &states, &test_pts, &req(None).outputs(Outputs::Logits).per_layer(true), &|_, _| {}).unwrap();
    let (g, diag) = slow(0..n, xr);
    let rel = max_abs_diff(&o.gram, &g) / max_abs(&g);
    assert!(rel <= 1e-12, "path kernel on the stack vs explicit J̄: {rel:e}");
    let rel = max_abs_diff(o.diag.as_ref().unwrap(), &diag) / max_abs(&diag);
    assert!(rel <= 1e-12, "path self-kernel on the stack vs explicit |J̄|²: {rel:e}");
    let layers = o.layers.as_ref().unwrap();
    let mut sum = vec![0.0; g.len()];
    layers.gram.iter().for_each(|l| sum.iter_mut().zip(l).for_each(|(a, b)| *a += b));
    assert!(max_abs_diff(&sum, &o.gram) <= 1e-12 * max_abs(&g), "the layers' path Grams sum to the whole");
    // What the closed form does not cover takes the stack too: a fixed rule, the log-softmax
    // outputs, another activation; each equal to J̄ formed from autodiff Jacobians at that rule.
    let tanh = train(dir.path(), "tanh", &toy2d("[6]", "tanh", 2, 0.5, 8, 4));
    let ts = tanh.load_all().unwrap();
    for (name, r, st, rule, logits) in [("relu gauss:4 logits", &run, &states, 4, true), ("relu gauss:3 log-softmax", &run, &states, 3, false), ("tanh gauss:3 logits", &tanh, &ts, 3, true)] {
        let rq = req(None).rule(Rule::Gauss(rule)).outputs(if logits { Outputs::Logits } else { Outputs::Network });
        let fast = kernel::compute(r, st, &test_pts, &rq, &|_, _| {}).unwrap();
        let (g, diag) = explicit_path_kernel(r, st, Rule::Gauss(rule).fixed_nodes().unwrap().as_slice(), logits);
        let rel = max_abs_diff(&fast.gram, &g) / max_abs(&g);
        assert!(rel <= 1e-12, "{name}: path kernel on the stack vs explicit {rel:e}");
        let rel = max_abs_diff(fast.diag.as_ref().unwrap(), &diag) / max_abs(&diag);
        assert!(rel <= 1e-12, "{name}: path self-kernel on the stack vs explicit {rel:e}");
    }
    // Refused: momentum.
    let mom = train(dir.path(), "mom", &toy2d("[6]", "relu", 3, 0.3, 5, 4).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\n"));
    let ms = mom.load_all().unwrap();
    assert!(kernel::compute(&mom, &ms, &test_pts, &req(None).outputs(Outputs::Logits), &|_, _| {}).unwrap_err().to_string().contains("plain gradient steps"));
}
