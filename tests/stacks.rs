//! Layer-stack models end to end: trained through dfdx, every kernel on the structured stack
//! path equal to the generic autodiff path, and the EPK's kernel machine equal to the network.

mod common;

use common::*;
use pathkernel::kernel::{self, KernelKind, Layout, Request, Rows, Rule};
use pathkernel::trajectory::Run;

/// A stack on the 2-D three-class mixture.
fn mixture_run(dir: &std::path::Path, name: &str, layers: &str, train: &str) -> Run {
    let toml = format!(
        "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 6\nn_test = 5\nseed = 3\n\n[model]\nkind = \"layers\"\nlayers = {layers}\n\n[train]\n{train}\nseed = 7\n"
    );
    common::train(dir, name, &toml)
}

/// A stack on fake MNIST digits.
fn image_run(dir: &std::path::Path, name: &str, layers: &str, train: &str) -> Run {
    let data = dir.join(format!("{name}-mnist"));
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 10, 3);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 3\n\n[model]\nkind = \"layers\"\nlayers = {layers}\n\n[train]\n{train}\nseed = 2\n",
        data.to_str().unwrap()
    );
    common::train(dir, name, &toml)
}

const DEEP_RELU: &str = r#"[{ dense = 12 }, "relu", { dense = 12 }, { leaky_relu = 0.1 }, { residual = [{ dense = 12 }, "relu", { dense = 12 }] }, "relu", { dense = 3 }]"#;
const SMOOTH: &str = r#"[{ dense = 10 }, "gelu", "layer_norm", { dense = 8 }, "silu", { residual = [{ dense = 6 }, "softplus"] }, "tanh", { dense = 3 }]"#;
const LENET_MINI: &str = r#"[{ conv2d = { channels = 3, kernel = 5, stride = 2, padding = 2 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 4, kernel = 3 } }, "relu", { max_pool2d = { kernel = 2, stride = 2 } }, "flatten", { dense = 8 }, "relu", { dense = 10 }]"#;
const RES_CNN: &str = r#"[{ conv2d = { channels = 3, kernel = 3, stride = 3 } }, "gelu", { residual = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "layer_norm", "gelu"] }, { residual = [{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "relu"] }, { avg_pool2d = 2 }, "flatten", { dense = 10 }]"#;

fn runs(dir: &std::path::Path) -> Vec<(&'static str, Run)> {
    vec![
        ("deep relu", mixture_run(dir, "deep", DEEP_RELU, "lr = 0.5\nsteps = 4")),
        ("gelu layer-norm", mixture_run(dir, "smooth", SMOOTH, "lr = 0.5\nsteps = 4")),
        ("lenet-mini", image_run(dir, "lenet", LENET_MINI, "lr = 0.5\nsteps = 3")),
        ("residual cnn", image_run(dir, "rescnn", RES_CNN, "lr = 0.5\nsteps = 3")),
    ]
}

#[test]
fn stack_fast_path_equals_generic_path_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut worst: f64 = 0.0;
    for (name, run) in runs(dir.path()) {
        let states = run.load_all().unwrap();
        for (kind, rule, points, layout) in [
            (KernelKind::Epk, Rule::Gauss(3), Rows::Test, Layout::Full),
            (KernelKind::Epk, Rule::Gauss(2), Rows::Test, Layout::Diag),
            (KernelKind::Dpk, Rule::Gauss(1), Rows::Train, Layout::Trace),
            (KernelKind::Ntk, Rule::Gauss(1), Rows::Test, Layout::Full),
            (KernelKind::Chen, Rule::Gauss(1), Rows::Test, Layout::Diag),
            (KernelKind::Kprime, Rule::Gauss(2), Rows::Train, Layout::Full),
            (KernelKind::Path, Rule::Gauss(2), Rows::Train, Layout::Full),
            (KernelKind::Path, Rule::Gauss(3), Rows::Test, Layout::Diag),
        ] {
            let pts = points.resolve(&run.dataset).unwrap();
            let req = Request::new(kind).rule(rule).layout(layout);
            let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic]
                .map(|path| kernel::compute(&run, &states, &pts, &req.clone().path(path), &|_, _| {}).unwrap());
            let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
            assert!(rel <= 1e-12, "{name} {kind} {layout}: Gram relative difference {rel:e}");
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
    eprintln!("stacks, fast vs generic through compute(): max relative difference {worst:e}");
}

#[test]
fn stack_epk_auto_reproduces_the_network() {
    let dir = tempfile::tempdir().unwrap();
    for (name, run) in runs(dir.path()) {
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
        let scale = max_abs(&epk.network).max(1.0);
        eprintln!("{name}: EPK auto:1e-12 max |machine − network| {:e}, {:.2} evaluations/point/step", epk.max_abs_error(), epk.mean_evaluations());
        assert!(epk.max_abs_error() <= 1e-11 * scale, "{name}: EPK auto error {:e}", epk.max_abs_error());
        // Its ReLU sits behind GELU and layer norm: the kinks are located by Newton's method
        // (399 evaluations per point and step when they were bisected).
        if name == "residual cnn" {
            assert!(epk.mean_evaluations() <= 100.0, "{name}: {:.1} evaluations per point and step", epk.mean_evaluations());
        }
        assert!(max_abs_diff(&epk.network, &epk.bias) > 1e-3, "{name}: the network barely moved");
        let dpk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Dpk), &|_, _| {}).unwrap();
        assert!(dpk.max_abs_error() > 1e3 * epk.max_abs_error().max(1e-15), "{name}: dpk {:e}", dpk.max_abs_error());
    }
}

/// A smooth layer ahead of a leaky ReLU that feeds a max-pool (the class of stack whose
/// max-pool switches the polynomial sweep cannot reach, left unconverged once): the kink
/// location finds the switches, every piece converges and the machine is the network.
const HIDDEN_POOL: &str = r#"[{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "silu", { avg_pool2d = 2 }, { conv2d = { channels = 6, kernel = 3 } }, { leaky_relu = 0.05 }, { max_pool2d = { kernel = 3, stride = 2 } }, "flatten", { dense = 16 }, "tanh", { dense = 10 }]"#;

#[test]
fn max_pool_switches_behind_a_smooth_layer_are_exact() {
    let dir = tempfile::tempdir().unwrap();
    let run = image_run(dir.path(), "hidden", HIDDEN_POOL, "lr = 1.0\nsteps = 6");
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
    let unconverged: usize = epk.records.iter().map(|r| r.unconverged_pieces).sum();
    let rel = epk.max_abs_error() / max_abs(&epk.network).max(1.0);
    eprintln!("hidden max-pool: EPK max |machine − network| {:e} ({rel:e} relative), {unconverged} unconverged, {:.1} evaluations/point/step", epk.max_abs_error(), epk.mean_evaluations());
    assert!(max_abs_diff(&epk.network, &epk.bias) > 1e-3, "the network barely moved");
    assert_eq!(unconverged, 0, "unconverged pieces");
    assert!(rel <= 1e-12, "machine vs network {rel:e}");
    assert!(epk.inexactness().is_none(), "{:?}", epk.inexactness());
}

#[test]
fn stack_with_adam_and_momentum_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    for (name, train) in [
        ("adamw", "lr = 0.02\nsteps = 4\noptimizer = \"adamw\"\nweight_decay = 0.01"),
        ("momentum", "lr = 0.2\nsteps = 4\noptimizer = \"sgd\"\nmomentum = 0.9\nbatch_size = 6"),
    ] {
        let run = mixture_run(dir.path(), name, DEEP_RELU, train);
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        let epk = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)), &|_, _| {}).unwrap();
        eprintln!("{name}: EPK max |machine − network| {:e}", epk.max_abs_error());
        assert!(epk.max_abs_error() <= 1e-11, "{name}: {:e}", epk.max_abs_error());
    }
}

#[test]
fn stack_stateful_structured_path_equals_dense_jacobians() {
    // Momentum and AdamW walk the path backwards (kernel::engine::stateful): the stack's per-layer
    // factors on the training side and at the rows' nodes against dense dfdx Jacobians.
    let dir = tempfile::tempdir().unwrap();
    for (name, layers, train) in [
        ("momentum, deep relu", DEEP_RELU, "lr = 0.2\nsteps = 4\noptimizer = \"sgd\"\nmomentum = 0.9\nweight_decay = 0.01\nbatch_size = 6"),
        ("adamw, gelu layer-norm", SMOOTH, "lr = 0.02\nsteps = 3\noptimizer = \"adamw\"\nweight_decay = 0.01"),
    ] {
        let run = mixture_run(dir.path(), &name[..4], layers, train);
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        for (kind, rule, layout) in [(KernelKind::Epk, Rule::Gauss(3), Layout::Full), (KernelKind::Dpk, Rule::Gauss(1), Layout::Diag)] {
            let req = Request::new(kind).rule(rule).layout(layout);
            let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic].map(|path| kernel::compute(&run, &states, &pts, &req.clone().path(path), &|_, _| {}).unwrap());
            let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
            assert!(rel <= 1e-12, "{name} {kind}: Gram relative difference {rel:e}");
            let rel = max_abs_diff(&fast.machine, &slow.machine) / max_abs(&slow.machine);
            assert!(rel <= 1e-12, "{name} {kind}: machine relative difference {rel:e}");
        }
        let image = image_run(dir.path(), &format!("{}-img", &name[..4]), LENET_MINI, &train.replace("batch_size = 6", "batch_size = 5"));
        let states = image.load_all().unwrap();
        let pts = Rows::Test.resolve(&image.dataset).unwrap();
        let req = Request::new(KernelKind::Epk).rule(Rule::Gauss(2));
        let [fast, slow] = [kernel::GramPath::Fast, kernel::GramPath::Generic].map(|path| kernel::compute(&image, &states, &pts, &req.clone().path(path), &|_, _| {}).unwrap());
        let rel = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
        assert!(rel <= 1e-12, "{name} lenet-mini: Gram relative difference {rel:e}");
    }
}
