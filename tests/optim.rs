//! Momentum, weight decay and Adam(W) stay exact. For every optimizer, on a small MLP:
//! - the slow, obvious per-point decomposition (per-point momentum buffers built from dfdx
//!   Jacobians) plus the non-data term sums to every recorded weight change to 1e-12;
//! - the kernel machine (auto quadrature) reproduces the network to 1e-11;
//! - its per-training-point contributions `Σ_r a_{i,r}·K_r(x, x_i)` equal the obvious
//!   `Σ_s J̄_s(x)·u_{i,s}` (same fixed quadrature on both sides) to 1e-10 relative.

mod common;

use common::*;
use pathkernel::kernel::{self, generic, KernelForm, KernelKind, Rows, Request, Rule};
use pathkernel::optim::UpdateRule;
use pathkernel::trajectory::Run;

fn config(extra: &str) -> String {
    config_with("[10]", "relu", extra)
}

fn config_with(hidden: &str, activation: &str, extra: &str) -> String {
    toy2d(hidden, activation, 20, 0.05, 10, 8).replace("seed = 7\n", &format!("seed = 7\n{extra}\n"))
}

/// The obvious decomposition: per-point updates `u[s][i]` (`[W]`) and non-data terms `r[s]`.
fn obvious_decomposition(run: &Run) -> (Vec<Vec<Vec<f64>>>, Vec<Vec<f64>>) {
    let arch = &run.manifest.architecture;
    let states = run.load_all().unwrap();
    let rule = UpdateRule::of(&run.manifest.optimizer);
    let (m, k, n) = (run.dataset.n_train(), arch.outputs(), run.manifest.steps);
    let w = states[0].numel();
    let batches = run.manifest.batches();
    let precond = run.load_preconditioners().unwrap();
    let mut mbuf = vec![vec![0.0; w]; m];
    let mut mreg = vec![0.0; w];
    let mut v = vec![0.0; w];
    let (mut us, mut rs) = (Vec::new(), Vec::new());
    for s in 0..n {
        let ws = states[s].flat();
        let j = generic::jacobians(arch, &states[s], &states[0], &run.dataset.x_train).unwrap();
        let f = arch.forward(&states[s], Some(&states[0]), &run.dataset.x_train).unwrap();
        let lg = kernel::loss_gradient(run.manifest.loss, &f, &run.dataset.y_train, m, k, batches.as_ref().map(|b| b[s].as_slice())).unwrap();
        let mut gfull = vec![0.0; w];
        // γ_s: PyTorch's first momentum buffer is the first gradient, later ones enter scaled
        // by 1 − dampening.
        let gamma = rule.gamma_at(s);
        let mut gs = Vec::with_capacity(m);
        for i in 0..m {
            let mut gi = vec![0.0; w];
            for c in 0..k {
                for (x, y) in gi.iter_mut().zip(&j[(i * k + c) * w..(i * k + c + 1) * w]) {
                    *x += lg[i * k + c] * y;
                }
            }
            for q in 0..w {
                mbuf[i][q] = rule.beta * mbuf[i][q] + gamma * gi[q];
                gfull[q] += gi[q];
            }
            gs.push(gi);
        }
        for q in 0..w {
            mreg[q] = rule.beta * mreg[q] + gamma * rule.wd_coupled * ws[q];
        }
        let lr = run.manifest.learning_rates[s];
        let scale: Vec<f64> = match rule.adam {
            None => vec![1.0; w],
            Some(pre) => {
                let pathkernel::optim::Preconditioner::Adam { beta2, eps } = pre else { panic!("an Adam run: {pre:?}") };
                let beta1 = rule.beta;
                let formula: Vec<f64> = (0..w)
                    .map(|q| {
                        let ge = gfull[q] + rule.wd_coupled * ws[q];
                        v[q] = beta2 * v[q] + (1.0 - beta2) * ge * ge;
                        let vh: f64 = v[q] / (1.0 - beta2.powi(s as i32 + 1));
                        1.0 / ((1.0 - beta1.powi(s as i32 + 1)) * (vh.sqrt() + eps))
                    })
                    .collect();
                // The recorded κ_s D_s is Adam's formula; the decomposition uses the recorded
                // one, because m̂/(√v̂ + eps) amplifies the last-bit differences of gradients
                // near zero (|g| ~ eps) far beyond 1e-12.
                let recorded = precond.as_ref().expect("adam runs record their preconditioners")[s].clone();
                for (q, (x, y)) in recorded.iter().zip(&formula).enumerate() {
                    assert!((x - y).abs() <= 1e-6 * y, "step {s} parameter {q}: recorded κD {x} vs formula {y}");
                }
                recorded
            }
        };
        if rule.nesterov {
            // PyTorch's Nesterov step: ĝ_s + μ·buffer.
            us.push((0..m).map(|i| (0..w).map(|q| -lr * (gs[i][q] + rule.beta * mbuf[i][q])).collect()).collect());
            rs.push((0..w).map(|q| -lr * (rule.wd_coupled * ws[q] + rule.beta * mreg[q] + rule.wd_decoupled * ws[q])).collect());
            continue;
        }
        us.push((0..m).map(|i| (0..w).map(|q| -lr * scale[q] * mbuf[i][q]).collect()).collect());
        rs.push((0..w).map(|q| -lr * (scale[q] * mreg[q] + rule.wd_decoupled * ws[q])).collect());
    }
    (us, rs)
}

fn check(name: &str, extra: &str, form: KernelForm) {
    check_net(name, "[10]", "relu", extra, form);
}

fn check_net(name: &str, hidden: &str, activation: &str, extra: &str, form: KernelForm) {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), name, &config_with(hidden, activation, extra));
    check_run(name, &run, form);
}

/// Steps 1–3 of the module docs on a recorded run (trained here or imported).
fn check_run(name: &str, run: &Run, form: KernelForm) {
    let rule = UpdateRule::of(&run.manifest.optimizer);
    let states = run.load_all().unwrap();
    let arch = &run.manifest.architecture;
    let (m, k, n) = (run.dataset.n_train(), arch.outputs(), run.manifest.steps);
    let w = states[0].numel();
    assert_eq!(KernelForm::of(&UpdateRule::of(&run.manifest.optimizer)), form, "{name}");

    // 1. The obvious decomposition sums to the recorded weight change.
    let (us, rs) = obvious_decomposition(run);
    for s in 0..n {
        let (w0, w1) = (states[s].flat(), states[s + 1].flat());
        let actual: Vec<f64> = w1.iter().zip(&w0).map(|(a, b)| a - b).collect();
        let mut sum = rs[s].clone();
        for u in &us[s] {
            sum.iter_mut().zip(u).for_each(|(a, b)| *a += b);
        }
        // Tolerance 1e-12·|Δw|, plus the rounding of the sum itself: Adam multiplies gradients by
        // up to 1/eps, so where per-point gradients cancel (|g| ≲ eps) the terms are much larger
        // than their sum and the sum can only be as exact as ε·Σ_i |u_i|.
        let dwmax = max_abs(&actual);
        let mut worst: f64 = 0.0;
        for q in 0..w {
            let mass: f64 = us[s].iter().map(|u| u[q].abs()).sum::<f64>() + rs[s][q].abs();
            let err = (sum[q] - actual[q]).abs();
            // The recorded change w_{s+1} − w_s is itself only known to the rounding of the
            // stored weights, ε·|w| (a PyTorch run's last steps of a cosine schedule are ~1e-5).
            let stored = 2.0 * f64::EPSILON * w1[q].abs().max(w0[q].abs());
            let tol = 1e-12 * dwmax + stored + if form == KernelForm::Preconditioned { 64.0 * f64::EPSILON * mass } else { 0.0 };
            assert!(err <= tol, "{name} step {s} parameter {q}: decomposition off by {err:e} (|Δw| {dwmax:e}, Σ|u| {mass:e})");
            worst = worst.max(err / dwmax);
        }
        if s == 0 {
            eprintln!("{name}: step 0 decomposition error / |Δw| = {worst:e}");
        }
    }
    assert!(max_abs(&states[n].flat().iter().zip(states[0].flat()).map(|(a, b)| a - b).collect::<Vec<_>>()) > 1e-3, "{name}: the net must move");

    // 2. The kernel machine reproduces the network (auto quadrature).
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12));
    let out = kernel::compute(run, &states, &pts, &req, &|_, _| {}).unwrap();
    assert_eq!(out.form, form);
    assert!(out.max_abs_error() <= 1e-11, "{name}: machine error {:e}", out.max_abs_error());
    let resid = out.decomposition_residual.unwrap();
    let rounding = max_abs(out.rounding.as_ref().unwrap());
    eprintln!("{name}: machine error {:e}, decomposition residual {resid:e}, rounding term {rounding:e}", out.max_abs_error());
    // Adam's replay can only be as exact as its 1/eps amplification of gradient rounding allows
    // (module docs of kernel::engine::stateful); a wrong preconditioner or buffer would be off by O(1).
    let tol = if form == KernelForm::Preconditioned { 1e-9 } else { 1e-12 };
    assert!(resid <= tol, "{name}: residual {resid:e}");
    assert!(rounding <= tol, "{name}: rounding term {rounding:e}");
    assert!(max_abs_diff(&out.network, &out.bias) > 0.05, "{name}: the outputs must move");
    let has_decay = rule.wd_coupled != 0.0 || rule.wd_decoupled != 0.0;
    assert_eq!(out.reg.is_some(), has_decay, "{name}");
    if let Some(r) = &out.reg {
        assert!(max_abs(r) > 1e-6, "{name}: weight decay must show in R(x)");
    }

    // 3. Per-point contributions against the obvious Σ_s J̄_s(x)·u_{i,s} (gauss:4 on both sides).
    let req = Request::new(KernelKind::Epk).rule(Rule::Gauss(4)).per_step(true);
    let out = kernel::compute(run, &states, &pts, &req, &|_, _| {}).unwrap();
    let p = pts.len();
    let gs = out.per_step.as_ref().unwrap();
    assert_eq!(out.steps, (0..n).collect::<Vec<_>>());
    let mut fast = vec![0.0; p * m * k];
    for (j, &r) in out.steps.iter().enumerate() {
        for pi in 0..p {
            for i in 0..m {
                for kt in 0..k {
                    for ks in 0..k {
                        fast[(pi * m + i) * k + kt] += out.a[(r * m + i) * k + ks] * gs[(((j * p + pi) * m + i) * k + kt) * k + ks];
                    }
                }
            }
        }
    }
    let nodes = Rule::Gauss(4).fixed_nodes().unwrap();
    let mut slow = vec![0.0; p * m * k];
    let mut reg = vec![0.0; p * k];
    for s in 0..n {
        let mut jbar = vec![0.0; p * k * w];
        for &(t, wq) in &nodes {
            let at = generic::interpolate(&states[s], Some(&states[s + 1]), t);
            let j = generic::jacobians(arch, &at, &states[0], &pts.x).unwrap();
            jbar.iter_mut().zip(&j).for_each(|(a, b)| *a += wq * b);
        }
        for pi in 0..p {
            for kt in 0..k {
                let row = &jbar[(pi * k + kt) * w..(pi * k + kt + 1) * w];
                for i in 0..m {
                    slow[(pi * m + i) * k + kt] += row.iter().zip(&us[s][i]).map(|(a, b)| a * b).sum::<f64>();
                }
                reg[pi * k + kt] += row.iter().zip(&rs[s]).map(|(a, b)| a * b).sum::<f64>();
            }
        }
    }
    let err = max_abs_diff(&fast, &slow);
    assert!(err <= 1e-10 * max_abs(&slow), "{name}: contributions off by {err:e} (max {:e})", max_abs(&slow));
    if let Some(r) = &out.reg {
        let err = max_abs_diff(r, &reg);
        assert!(err <= 1e-10 * max_abs(&reg).max(1e-300), "{name}: reg term off by {err:e}");
    }
}

#[test]
fn heavy_ball_momentum() {
    check("momentum", "momentum = 0.9", KernelForm::Momentum);
}

#[test]
fn momentum_on_a_deeper_tanh_net_and_its_ntk() {
    check_net("momentum-deep", "[8, 6]", "tanh", "momentum = 0.8", KernelForm::Momentum);
    // The NTK of a momentum run is the plain NTK at w_N (its machine is the frozen-Jacobian one).
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "m", &config_with("[8, 6]", "relu", "momentum = 0.8"));
    let states = run.load_all().unwrap();
    let arch = &run.manifest.architecture;
    let (m, k, n) = (run.dataset.n_train(), arch.outputs(), run.manifest.steps);
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let req = Request::new(KernelKind::Ntk).rule(Rule::Gauss(1));
    let out = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    let w = states[n].numel();
    let jt = generic::jacobians(arch, &states[n], &states[0], &run.dataset.x_train).unwrap();
    let jr = generic::jacobians(arch, &states[n], &states[0], &pts.x).unwrap();
    let p = pts.len();
    let mut want = vec![0.0; p * m * k * k];
    for pi in 0..p {
        for i in 0..m {
            for kt in 0..k {
                for ks in 0..k {
                    let a = &jr[(pi * k + kt) * w..(pi * k + kt + 1) * w];
                    let b = &jt[(i * k + ks) * w..(i * k + ks + 1) * w];
                    want[((pi * m + i) * k + kt) * k + ks] = a.iter().zip(b).map(|(x, y)| x * y).sum();
                }
            }
        }
    }
    let err = max_abs_diff(&out.gram, &want);
    assert!(err <= 1e-12 * max_abs(&want), "NTK of a momentum run off by {err:e}");
    assert!(out.max_abs_error().is_finite());
}

#[test]
fn sgd_momentum_with_coupled_weight_decay() {
    check("sgd-momentum-wd", "optimizer = \"sgd\"\nbatch_size = 7\nmomentum = 0.5\nweight_decay = 0.01", KernelForm::Momentum);
}

#[test]
fn decoupled_weight_decay_keeps_the_gradient_kernel() {
    check("sgdw", "weight_decay = 0.05\nweight_decay_mode = \"decoupled\"", KernelForm::GradientWithDecay);
}

#[test]
fn adam_with_coupled_weight_decay() {
    check("adam", "optimizer = \"adam\"\nweight_decay = 0.01", KernelForm::Preconditioned);
}

#[test]
fn adamw_on_mini_batches_with_a_cosine_schedule() {
    check(
        "adamw",
        "optimizer = \"adamw\"\nbatch_size = 7\nweight_decay = 0.1\nbetas = [0.8, 0.99]\nschedule = { kind = \"cosine\", min_lr = 0.001 }",
        KernelForm::Preconditioned,
    );
}

/// PyTorch runs imported from the committed recordings (scripts/make_torch_fixture.py): Nesterov
/// SGD with weight decay on mini-batches (an MLP), momentum with dampening and weight decay on
/// the full batch (a CNN: dense Jacobians on both sides), AdamW on mini-batches with a cosine
/// schedule.
#[test]
fn imported_pytorch_nesterov_dampened_momentum_and_adamw_runs() {
    for (fixture, name, form) in [
        ("torch-nesterov", "pytorch nesterov sgd", KernelForm::Momentum),
        ("torch-cnn-momentum", "pytorch cnn momentum + dampening", KernelForm::Momentum),
        ("torch-adamw", "pytorch adamw", KernelForm::Preconditioned),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let rec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(fixture);
        let opts = pathkernel::interop::ImportOptions::default();
        pathkernel::interop::import_torch(&rec, &dir.path().join("run"), &opts).unwrap();
        let run = Run::open(&dir.path().join("run")).unwrap();
        check_run(name, &run, form);
    }
}

#[test]
fn optimizer_configs_are_checked() {
    use pathkernel::train::RunConfig;
    let p = std::path::Path::new("t.toml");
    for (extra, msg) in [
        ("momentum = 1.0", "train.momentum"),
        ("momentum = -0.1", "train.momentum"),
        ("optimizer = \"adam\"\nmomentum = 0.9", "betas"),
        ("weight_decay = -1.0", "train.weight_decay"),
        ("optimizer = \"adamw\"\nweight_decay = 0.1\nweight_decay_mode = \"coupled\"", "that is adam"),
        ("weight_decay_mode = \"decoupled\"", "weight_decay is 0"),
        ("betas = [0.9, 0.999]", "are for optimizer"),
        ("optimizer = \"adam\"\nbetas = [1.0, 0.999]", "train.betas"),
        ("optimizer = \"adam\"\neps = 0.0", "train.eps"),
        ("optimizer = \"adam\"\nbatch_size = 0", "batch_size = 0"),
    ] {
        let err = RunConfig::from_toml(&config(extra), p).unwrap_err().to_string();
        assert!(err.contains(msg), "{extra:?}: {err}");
    }
}
