//! Output layouts: the `diag` and `trace` Grams equal the corresponding parts of the `full` Gram
//! for every step model (MLP, CNN on its structured and generic paths, the stateful optimizers),
//! the kernel machine is the same in every layout, and a NaN machine is never reported exact.

mod common;

use common::*;
use pathkernel::kernel::{self, GramPath, KernelKind, KernelOutput, Layout, Rows, Request, Rule, Side};
use pathkernel::trajectory::Run;

fn req(kind: KernelKind, rule: Rule, side: Side) -> Request {
    Request::new(kind).rule(rule).side(side)
}

fn in_layout(run: &Run, r: &Request, points: Rows, layout: Layout, path: GramPath) -> KernelOutput {
    let states = run.load_all().unwrap();
    let pts = points.resolve(&run.dataset).unwrap();
    kernel::compute(run, &states, &pts, &r.clone().layout(layout).path(path).memory_budget(1 << 32), &|_, _| {}).unwrap()
}

/// Every layout against the full Gram of the same job, and the machine against the full one's.
fn check_layouts(name: &str, run: &Run, r: &Request, points: Rows, path: GramPath) {
    let full = in_layout(run, r, points, Layout::Full, path);
    let (p, m, k) = (full.p, full.m, full.k);
    assert!(max_abs(&full.gram) > 1e-8, "{name}: trivial Gram");
    for layout in [Layout::Diag, Layout::Trace] {
        let got = in_layout(run, r, points, layout, path);
        assert_eq!(got.layout, layout);
        assert_eq!(got.gram.len(), layout.shape(p, m, k).iter().product::<usize>(), "{name} {layout}: shape");
        let want = layout.from_full(&full.gram, p, m, k);
        let rel = max_abs_diff(&got.gram, &want) / max_abs(&want);
        assert!(rel <= 1e-12, "{name} {layout}: relative difference to the full Gram {rel:e}");
        let rel = max_abs_diff(&got.machine, &full.machine) / max_abs(&full.machine);
        assert!(rel <= 1e-12, "{name} {layout}: kernel machine differs from the full layout's by {rel:e}");
        assert_eq!(got.records.len(), full.records.len());
        for (a, b) in got.records.iter().zip(&full.records) {
            assert!((a.max_abs_error - b.max_abs_error).abs() <= 1e-12 * (1.0 + b.max_abs_error), "{name} {layout}: step {} record", a.step);
        }
        assert!(got.single_machine.is_none(), "{name} {layout}: the single machine needs the off-diagonal blocks");
    }
}

#[test]
fn mlp_layouts_are_parts_of_the_full_gram() {
    let dir = tempfile::tempdir().unwrap();
    for (name, hidden, act) in [("relu2", "[5, 4]", "relu"), ("tanh1", "[6]", "tanh"), ("linear", "[]", "relu")] {
        let run = train(dir.path(), name, &toy2d(hidden, act, 4, 0.5, 6, 4));
        check_layouts(name, &run, &req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test), Rows::Test, GramPath::Fast);
        check_layouts(name, &run, &req(KernelKind::Epk, Rule::Gauss(3), Side::Train), Rows::Train, GramPath::Fast);
        check_layouts(name, &run, &req(KernelKind::Ntk, Rule::Gauss(1), Side::Test), Rows::Test, GramPath::Fast);
        check_layouts(name, &run, &req(KernelKind::Chen, Rule::Gauss(1), Side::Test), Rows::Test, GramPath::Fast);
    }
}

#[test]
fn stateful_optimizer_layouts_are_parts_of_the_full_gram() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("momentum", "momentum = 0.9"), ("adamw", "optimizer = \"adamw\"\nweight_decay = 0.01")] {
        let toml = toy2d("[5]", "relu", 6, 0.05, 6, 4).replace("seed = 7\n", &format!("seed = 7\n{extra}\n"));
        let run = train(dir.path(), name, &toml);
        check_layouts(name, &run, &req(KernelKind::Epk, Rule::Gauss(3), Side::Test), Rows::Test, GramPath::Fast);
        check_layouts(name, &run, &req(KernelKind::Ntk, Rule::Gauss(1), Side::Test), Rows::Test, GramPath::Fast);
    }
}


#[test]
fn cnn_layouts_are_parts_of_the_full_gram_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mnist");
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 10, 3);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 3\n\n[model]\nkind = \"cnn\"\nchannels = 2\nkernel = 5\nstride = 2\npool = 2\n\n[train]\nlr = 0.5\nsteps = 2\nseed = 2\n",
        data.to_str().unwrap()
    );
    let run = train(dir.path(), "cnn", &toml);
    for path in [GramPath::Fast, GramPath::Generic] {
        check_layouts(&format!("cnn {path:?} epk"), &run, &req(KernelKind::Epk, Rule::Gauss(2), Side::Test), Rows::Test, path);
        check_layouts(&format!("cnn {path:?} chen"), &run, &req(KernelKind::Chen, Rule::Gauss(1), Side::Test), Rows::Test, path);
    }
    check_layouts("cnn auto", &run, &req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test), Rows::Test, GramPath::Fast);
    // A momentum CNN goes through the stateful path with dense Jacobians.
    let run = train(dir.path(), "cnn-mom", &toml.replace("seed = 2\n", "seed = 2\nmomentum = 0.5\n"));
    check_layouts("cnn momentum", &run, &req(KernelKind::Epk, Rule::Gauss(2), Side::Test), Rows::Test, GramPath::Fast);
}

#[test]
fn a_nan_machine_is_not_exact() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "r", &toy2d("[4]", "relu", 2, 0.5, 4, 3));
    let mut out = in_layout(&run, &req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test), Rows::Test, Layout::Diag, GramPath::Fast);
    assert!(out.max_abs_error() <= 1e-12);
    // One entry of the machine becomes NaN: the verdict must say so, not drop it.
    out.machine[1] = f64::NAN;
    assert!(out.max_abs_error().is_nan(), "a NaN machine reported max error {}", out.max_abs_error());
    let ex = kernel::output::Exactness::of(&out, "run");
    assert!(ex.max_abs_error.is_nan());
    assert_eq!(ex.tolerance_met, Some(false), "a NaN machine must not meet the tolerance");
    assert!(kernel::max_abs_diff(&[1e-14, f64::NAN], &[0.0, 0.0]).is_nan());
    assert!(kernel::nan_max(f64::NAN, 1.0).is_nan() && kernel::nan_max(1.0, f64::NAN).is_nan());
    assert_eq!(kernel::nan_max(1.0, 2.0), 2.0);
}

#[test]
fn row_blocks_keep_every_blocks_non_data_terms() {
    // Momentum with weight decay: reg and rounding are per row point and must be assembled from
    // every block, not only the first.
    let dir = tempfile::tempdir().unwrap();
    let toml = toy2d("[5]", "relu", 6, 0.05, 6, 5).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\nweight_decay = 0.01\n");
    let run = train(dir.path(), "m", &toml);
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let r = req(KernelKind::Epk, Rule::Gauss(2), Side::Test);
    let whole = kernel::compute(&run, &states, &pts, &r, &|_, _| {}).unwrap();
    let blocked = kernel::compute(&run, &states, &pts, &r.clone().block_rows(Some(2)), &|_, _| {}).unwrap();
    for (name, a, b) in [("reg", &whole.reg, &blocked.reg), ("rounding", &whole.rounding, &blocked.rounding)] {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert_eq!(a.len(), b.len(), "{name}: blocked length");
        assert!(max_abs_diff(a, b) <= 1e-12 * max_abs(a).max(1e-300), "{name}: blocked differs");
    }
    assert!(max_abs_diff(&whole.machine, &blocked.machine) <= 1e-12 * max_abs(&whole.machine));
}
