//! The per-layer decomposition (`Request::per_layer`): each parameter layer's share of the Gram
//! and of the machine's change per step, on the structured stack path against the generic
//! autodiff reference, summing to the whole; MLPs and the CNN as presets of the stack.

mod common;

use common::*;
use pathkernel::kernel::{self, GramPath, KernelKind, KernelOutput, Layout, Request, Rows, Rule, Side};
use pathkernel::model::param_layers;
use pathkernel::trajectory::Run;

fn mixture_run(dir: &std::path::Path, name: &str, model: &str, train: &str) -> Run {
    let toml = format!("[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 6\nn_test = 5\nseed = 3\n\n[model]\n{model}\n\n[train]\n{train}\nseed = 7\n");
    common::train(dir, name, &toml)
}

fn image_run(dir: &std::path::Path, name: &str, model: &str, train: &str) -> Run {
    let data = dir.join(format!("{name}-mnist"));
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 10, 3);
    let toml = format!("[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 3\n\n[model]\n{model}\n\n[train]\n{train}\nseed = 2\n", data.to_str().unwrap());
    common::train(dir, name, &toml)
}

const DEEP_RELU: &str = r#"kind = "layers"
layers = [{ dense = 12 }, "relu", { dense = 12 }, { leaky_relu = 0.1 }, { residual = [{ dense = 12 }, "relu", { dense = 12 }] }, "relu", { dense = 3 }]"#;
const SMOOTH: &str = r#"kind = "layers"
layers = [{ dense = 10 }, "gelu", "layer_norm", { dense = 8 }, "silu", { residual = [{ dense = 6 }, "softplus"] }, "tanh", { dense = 3 }]"#;
const RES_CNN: &str = r#"kind = "layers"
layers = [{ conv2d = { channels = 3, kernel = 3, stride = 3 } }, "gelu", { residual = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "layer_norm", "gelu"] }, { residual = [{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "relu"] }, { avg_pool2d = 2 }, "flatten", { dense = 10 }]"#;
const MLP: &str = "kind = \"mlp\"\nhidden = [5, 4]";
const CNN: &str = "kind = \"cnn\"\nchannels = 2\nkernel = 5\nstride = 2\npool = 2";

/// Checks that the shares sum to the whole: the layers' Grams to `whole`'s Gram and their
/// changes over all steps, from the bias, to the machine, within `tol` relative. Returns the
/// largest relative gap.
fn check_sums(name: &str, out: &KernelOutput, whole: &KernelOutput, tol: f64) -> f64 {
    let l = out.layers.as_ref().expect("per-layer output");
    let mut sum = vec![0.0; out.gram.len()];
    for g in &l.gram {
        sum.iter_mut().zip(g).for_each(|(a, b)| *a += b);
    }
    let gram_gap = max_abs_diff(&sum, &whole.gram) / max_abs(&whole.gram);
    let pk = out.p * out.k;
    let mut machine = out.bias.clone();
    for chunk in l.change.chunks_exact(pk) {
        machine.iter_mut().zip(chunk).for_each(|(a, b)| *a += b);
    }
    let machine_gap = max_abs_diff(&machine, &whole.machine) / max_abs(&whole.machine).max(1.0);
    assert!(
        gram_gap <= tol,
        "{name}: the layers' Grams sum to the whole to {gram_gap:e}"
    );
    assert!(
        machine_gap <= tol,
        "{name}: the layers' changes sum to the machine to {machine_gap:e}"
    );
    assert_eq!(
        l.change.len(),
        out.steps.len() * l.names.len() * pk,
        "{name}: change is [S, L, P, K]"
    );
    gram_gap.max(machine_gap)
}

/// Each layer's Gram and change against a reference computation's.
fn check_layers(name: &str, fast: &KernelOutput, slow: &KernelOutput) -> f64 {
    let (a, b) = (fast.layers.as_ref().unwrap(), slow.layers.as_ref().unwrap());
    assert_eq!(a.names, b.names, "{name}");
    let scale = max_abs(&slow.gram);
    let mut worst: f64 = 0.0;
    for (li, (ga, gb)) in a.gram.iter().zip(&b.gram).enumerate() {
        let rel = max_abs_diff(ga, gb) / scale;
        assert!(
            rel <= 1e-12,
            "{name} layer {}: Gram relative difference {rel:e}",
            a.names[li]
        );
        worst = worst.max(rel);
    }
    let rel = max_abs_diff(&a.change, &b.change) / max_abs(&b.change).max(1e-300);
    assert!(rel <= 1e-12, "{name}: change relative difference {rel:e}");
    worst.max(rel)
}

#[test]
fn stack_shares_equal_the_generic_reference_and_sum_to_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let runs = [
        (
            "deep relu, mini-batches",
            mixture_run(
                dir.path(),
                "deep",
                DEEP_RELU,
                "lr = 0.5\nsteps = 4\noptimizer = \"sgd\"\nbatch_size = 6",
            ),
        ),
        (
            "gelu layer-norm",
            mixture_run(dir.path(), "smooth", SMOOTH, "lr = 0.5\nsteps = 3"),
        ),
        (
            "residual cnn",
            image_run(dir.path(), "rescnn", RES_CNN, "lr = 0.5\nsteps = 2"),
        ),
    ];
    let (mut worst_ref, mut worst_sum): (f64, f64) = (0.0, 0.0);
    for (name, run) in &runs {
        let states = run.load_all().unwrap();
        let names: Vec<String> = param_layers(&states[0].specs)
            .into_iter()
            .map(|l| l.name)
            .collect();
        for (kind, rule, rows, layout) in [
            (KernelKind::Epk, Rule::Gauss(3), Rows::Test, Layout::Full),
            (KernelKind::Dpk, Rule::Gauss(1), Rows::Train, Layout::Diag),
            (KernelKind::Ntk, Rule::Gauss(1), Rows::Test, Layout::Trace),
        ] {
            let pts = rows.resolve(&run.dataset).unwrap();
            let req = Request::new(kind).rule(rule).layout(layout);
            let whole = kernel::compute(run, &states, &pts, &req, &|_, _| {}).unwrap();
            let [fast, slow] = [GramPath::Fast, GramPath::Generic].map(|path| {
                kernel::compute(
                    run,
                    &states,
                    &pts,
                    &req.clone().per_layer(true).path(path),
                    &|_, _| {},
                )
                .unwrap()
            });
            assert_eq!(fast.layers.as_ref().unwrap().names, names, "{name}");
            let tag = format!("{name} {kind} {layout}");
            worst_ref = worst_ref.max(check_layers(&tag, &fast, &slow));
            worst_sum = worst_sum.max(check_sums(&tag, &fast, &whole, 1e-13));
            // Every layer carries part of the kernel.
            assert!(
                fast.layers
                    .as_ref()
                    .unwrap()
                    .gram
                    .iter()
                    .all(|g| max_abs(g) > 0.0),
                "{tag}: a layer with a zero Gram"
            );
        }
    }
    eprintln!("per-layer shares: stack path vs generic max relative difference {worst_ref:e}; shares vs whole {worst_sum:e}");
}

#[test]
fn auto_rule_shares_sum_to_the_exact_machine() {
    let dir = tempfile::tempdir().unwrap();
    let run = mixture_run(dir.path(), "deep", DEEP_RELU, "lr = 0.5\nsteps = 4");
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let req = Request::new(KernelKind::Epk)
        .rule(Rule::Auto(1e-12))
        .layout(Layout::Diag);
    let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
    let split = kernel::compute(
        &run,
        &states,
        &pts,
        &req.clone().per_layer(true),
        &|_, _| {},
    )
    .unwrap();
    check_sums("auto", &split, &whole, 1e-13);
    assert!(
        split.max_abs_error() <= 1e-11,
        "machine vs network {:e}",
        split.max_abs_error()
    );
    // Row blocks concatenate the shares.
    let blocked = kernel::compute(
        &run,
        &states,
        &pts,
        &req.clone().per_layer(true).block_rows(Some(2)),
        &|_, _| {},
    )
    .unwrap();
    check_layers("blocks", &blocked, &split);
}

#[test]
fn mlp_and_cnn_are_presets_of_the_stack() {
    let dir = tempfile::tempdir().unwrap();
    for (name, run) in [
        (
            "mlp",
            mixture_run(
                dir.path(),
                "mlp",
                MLP,
                "lr = 0.5\nsteps = 4\noptimizer = \"sgd\"\nbatch_size = 6",
            ),
        ),
        (
            "cnn",
            image_run(dir.path(), "cnn", CNN, "lr = 0.5\nsteps = 3"),
        ),
    ] {
        let states = run.load_all().unwrap();
        let arch = &run.manifest.architecture;
        // The same function under the stack's names.
        let stack = arch.as_stack().unwrap();
        let x = &run.dataset.x_test;
        for s in &states {
            let a = arch.forward(s, Some(&states[0]), x).unwrap();
            let b = stack
                .forward(
                    &arch.params_as_stack(s).unwrap(),
                    Some(&arch.params_as_stack(&states[0]).unwrap()),
                    x,
                )
                .unwrap();
            assert!(
                max_abs_diff(&a, &b) <= 1e-14 * max_abs(&a).max(1.0),
                "{name}: the stack's forward differs"
            );
        }
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        for (kind, rule) in [
            (KernelKind::Epk, Rule::Gauss(3)),
            (KernelKind::Epk, Rule::Auto(1e-12)),
            (KernelKind::Dpk, Rule::Gauss(1)),
        ] {
            let req = Request::new(kind).rule(rule);
            // The preset's own path (the two-hidden-layer MLP's is its stack, `mlp_on_stack`),
            // and the stack engine per layer.
            let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
            let split = kernel::compute(
                &run,
                &states,
                &pts,
                &req.clone().per_layer(true),
                &|_, _| {},
            )
            .unwrap();
            let tag = format!("{name} {kind} {rule}");
            // Same nodes for fixed rules; the auto rule's come from the preset's own node search
            // on one side and the stack's kink sweep on the other, both converged to 1e-12.
            let tol = if matches!(rule, Rule::Auto(_)) {
                1e-11
            } else {
                1e-13
            };
            let gap = check_sums(&tag, &split, &whole, tol);
            assert!(
                split.max_abs_error() <= 1e-11 * max_abs(&split.network).max(1.0)
                    || !matches!(rule, Rule::Auto(_)),
                "{tag}: machine vs network {:e}",
                split.max_abs_error()
            );
            let names = &split.layers.as_ref().unwrap().names;
            let want: Vec<String> = param_layers(&states[0].specs)
                .into_iter()
                .map(|l| l.name)
                .collect();
            assert_eq!(names, &want, "{tag}: the preset's own layer names");
            eprintln!(
                "{tag}: preset fast path vs the stack engine's layer sum {gap:e}; layers {names:?}"
            );
        }
        // The train side under the auto rule (both sides at `w_s`: what the GP, SVM and
        // similarity analyses fit on): the preset's closed form integrates test rows only, so this
        // runs on the stack, equal to the generic autodiff reference.
        let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)).side(Side::Train);
        let fast = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
        // (The generic path takes fixed rules only; the train side has its one node at `t = 0`.)
        let slow = kernel::compute(&run, &states, &pts, &req.clone().rule(Rule::Gauss(1)).path(GramPath::Generic), &|_, _| {}).unwrap();
        let gap = max_abs_diff(&fast.gram, &slow.gram) / max_abs(&slow.gram);
        assert!(gap <= 1e-12, "{name}: train-side EPK against the generic path {gap:e}");
        if name == "cnn" {
            // The CNN's generic path splits its own tensors.
            let req = Request::new(KernelKind::Epk)
                .rule(Rule::Gauss(2))
                .per_layer(true);
            let fast = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
            let slow = kernel::compute(
                &run,
                &states,
                &pts,
                &req.clone().path(GramPath::Generic),
                &|_, _| {},
            )
            .unwrap();
            check_layers("cnn generic", &fast, &slow);
        }
    }
}

/// A layer stack of a closed-form shape (`dense, relu, dense` with `flatten` ahead or not; `conv2d,
/// relu, max_pool2d, flatten, dense`), written by hand or a preset's, takes its closed form under
/// the auto rule (two gradient evaluations' worth per point and step, no node), equal to the
/// stack engine's kernel at its own nodes (`GramPath::Nodes`, and the per-layer decomposition);
/// one that is not (a leaky ReLU) stays on the stack engine.
#[test]
fn relu_stacks_of_the_presets_take_their_closed_forms() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("dense-relu-dense", mixture_run(dir.path(), "drd", "kind = \"layers\"\nlayers = [{ dense = 6 }, \"relu\", { dense = 3 }]", "lr = 0.5\nsteps = 6"), true),
        ("flatten first", image_run(dir.path(), "fdrd", "kind = \"layers\"\nzero_last = false\nlayers = [\"flatten\", { dense = 7 }, \"relu\", { dense = 10 }]", "lr = 0.5\nsteps = 4"), true),
        ("relu cnn", image_run(dir.path(), "rcnn", "kind = \"layers\"\nlayers = [{ conv2d = { channels = 2, kernel = 5, stride = 2 } }, \"relu\", { max_pool2d = 2 }, \"flatten\", { dense = 10 }]", "lr = 0.5\nsteps = 3"), true),
        ("without biases", mixture_run(dir.path(), "drd0", "kind = \"layers\"\nlayers = [{ dense = { features = 6, bias = false } }, \"relu\", { dense = { features = 3, bias = false } }]", "lr = 0.5\nsteps = 6"), true),
        ("relu cnn without biases", image_run(dir.path(), "rcnn0", "kind = \"layers\"\nlayers = [{ conv2d = { channels = 2, kernel = 5, stride = 2, bias = false } }, \"relu\", { max_pool2d = 2 }, \"flatten\", { dense = { features = 10, bias = false } }]", "lr = 0.5\nsteps = 3"), true),
        ("leaky", mixture_run(dir.path(), "leaky", "kind = \"layers\"\nlayers = [{ dense = 6 }, { leaky_relu = 0.1 }, { dense = 3 }]", "lr = 0.5\nsteps = 6"), false),
        ("mlp preset", mixture_run(dir.path(), "mlp1", "kind = \"mlp\"\nhidden = [6]", "lr = 0.5\nsteps = 6"), true),
        ("cnn preset", image_run(dir.path(), "cnn1", CNN, "lr = 0.5\nsteps = 3"), true),
    ];
    for (name, run, closed) in cases {
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)).layout(Layout::Full);
        let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
        // The stack engine (the per-layer decomposition always runs there).
        let split = kernel::compute(&run, &states, &pts, &req.clone().per_layer(true), &|_, _| {}).unwrap();
        let two = whole.records.iter().all(|r| r.mean_evaluations == 2.0);
        assert_eq!(two, closed, "{name}: closed form taken: {two}");
        let gap = check_sums(name, &split, &whole, 1e-11);
        // The engine at its own nodes, the whole Gram.
        let nodes = kernel::compute(&run, &states, &pts, &req.clone().path(GramPath::Nodes), &|_, _| {}).unwrap();
        assert!(nodes.records.iter().any(|r| r.mean_evaluations != 2.0), "{name}: --path nodes took a closed form");
        let node_gap = max_abs_diff(&nodes.gram, &whole.gram) / max_abs(&whole.gram);
        assert!(node_gap <= 1e-11, "{name}: closed form against the engine's nodes {node_gap:e}");
        assert!(max_abs_diff(nodes.diag.as_ref().unwrap(), whole.diag.as_ref().unwrap()) <= 1e-11 * max_abs(whole.diag.as_ref().unwrap()), "{name}: self-kernels");
        // A fixed rule runs on the stack engine with or without the decomposition (the MLP's
        // shape no longer takes its preset's node path): the same kernel to rounding.
        let fixed = Request::new(KernelKind::Epk).rule(Rule::Gauss(3)).layout(Layout::Full);
        let preset = kernel::compute(&run, &states, &pts, &fixed, &|_, _| {}).unwrap();
        let stack = kernel::compute(&run, &states, &pts, &fixed.clone().per_layer(true), &|_, _| {}).unwrap();
        check_sums(&format!("{name} gauss:3"), &stack, &preset, 1e-13);
        // The paper's Fig. 2 measure: the stack engine's (from its factors) against the presets'
        // closed forms (the MLP's and the CNN's, integrated exactly between the kinks) under
        // the auto rule, and against the stack engine's own without the decomposition at the same
        // nodes (gauss:3).
        for (tag, a, b, tol) in [("auto", &split, &whole, 1e-10), ("gauss:3", &stack, &preset, 1e-12)] {
            for (x, y) in a.records.iter().zip(&b.records) {
                assert!(x.dpk_cosine_error.is_finite() && x.dpk_cosine_error > 0.0, "{name} {tag}: stack engine's measure {}", x.dpk_cosine_error);
                let gap = (x.dpk_cosine_error - y.dpk_cosine_error).abs();
                assert!(gap <= tol, "{name} {tag} step {}: {} vs {}", x.step, x.dpk_cosine_error, y.dpk_cosine_error);
            }
        }
        assert!(whole.max_abs_error() <= 1e-11 * max_abs(&whole.network).max(1.0), "{name}: machine vs network {:e}", whole.max_abs_error());
        eprintln!("{name}: closed form {two}, against the stack engine {gap:e}");
    }
}

#[test]
fn momentum_and_adamw_shares_sum_to_the_machine() {
    // The backward recursion (kernel::engine::stateful) splits its Gram and every step's terms (data,
    // weight decay, rounding) by layer: on the stack path and on dense Jacobians alike.
    let dir = tempfile::tempdir().unwrap();
    for (name, model, train) in [
        ("momentum stack", DEEP_RELU, "lr = 0.2\nsteps = 4\noptimizer = \"sgd\"\nmomentum = 0.9\nweight_decay = 0.01\nbatch_size = 6"),
        ("adamw stack", SMOOTH, "lr = 0.02\nsteps = 3\noptimizer = \"adamw\"\nweight_decay = 0.01"),
        ("momentum mlp", MLP, "lr = 0.2\nsteps = 3\nmomentum = 0.9"),
    ] {
        let run = mixture_run(dir.path(), &name.replace(' ', "-"), model, train);
        let states = run.load_all().unwrap();
        let pts = Rows::Test.resolve(&run.dataset).unwrap();
        for (kind, rule, layout) in [(KernelKind::Epk, Rule::Gauss(3), Layout::Full), (KernelKind::Ntk, Rule::Gauss(1), Layout::Diag)] {
            let req = Request::new(kind).rule(rule).layout(layout);
            let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
            let tag = format!("{name} {kind}");
            let [fast, slow] = [GramPath::Fast, GramPath::Generic].map(|path| kernel::compute(&run, &states, &pts, &req.clone().per_layer(true).path(path), &|_, _| {}).unwrap());
            check_sums(&tag, &fast, &whole, 1e-12);
            if model != MLP {
                check_layers(&tag, &fast, &slow);
            }
        }
        let auto = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).per_layer(true), &|_, _| {}).unwrap();
        assert!(auto.max_abs_error() <= 1e-11, "{name}: machine vs network {:e}", auto.max_abs_error());
    }
}

#[test]
fn per_layer_refusals_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = mixture_run(dir.path(), "gd", MLP, "lr = 0.2\nsteps = 3");
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    let err = kernel::compute(&run, &states, &pts, &Request::new(KernelKind::Epk).per_layer(true).columns(Some((0, 4))), &|_, _| {}).unwrap_err().to_string();
    assert!(err.contains("all training points") && !err.contains('\n'), "{err}");
}

#[test]
fn cli_writes_a_layer_column() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = mixture_run(d, "run", DEEP_RELU, "lr = 0.5\nsteps = 3");
    let o = std::process::Command::new(bin())
        .args([
            "kernel",
            "-q",
            "--run",
            run.dir.to_str().unwrap(),
            "--kind",
            "epk",
            "--layout",
            "diag",
            "--per-layer",
            "--out",
            "kout",
        ])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("layer 4.body.0:"), "{stdout}");
    let t = pathkernel::io::Table::read_parquet(&d.join("kout/layers.parquet")).unwrap();
    let (step, layer, point, class, change) = (
        t.i64("step").unwrap(),
        t.str("layer").unwrap(),
        t.i64("point").unwrap(),
        t.i64("class").unwrap(),
        t.f64("change").unwrap(),
    );
    let pred = pathkernel::io::Table::read_parquet(&d.join("kout/predictions.parquet")).unwrap();
    let (network, machine) = (
        pred.f64("network").unwrap(),
        pred.f64("kernel_machine").unwrap(),
    );
    let back = kernel::output::read(&d.join("kout"), &run).unwrap().out;
    let names = &back.layers.as_ref().expect("layers read back").names;
    assert_eq!(names, &["0", "2", "4.body.0", "4.body.2", "6"]);
    // Over all steps (step −1), the layers' changes from the bias sum to the machine.
    let k = 3;
    let mut sum = back.bias.clone();
    for r in 0..step.len() {
        if step[r] == -1 {
            assert!(names.contains(&layer[r]));
            sum[point[r] as usize * k + class[r] as usize] += change[r];
        }
    }
    assert!(max_abs_diff(&sum, machine) <= 1e-13 * max_abs(machine).max(1.0));
    assert!(max_abs_diff(machine, network) <= 1e-11 * max_abs(network).max(1.0));
}
