//! The stack engine's tests: each fast route against the slow, obvious one.

use std::path::{Path, PathBuf};

use crate::kernel::{self, KernelKind, Layout, Outputs, Request, Rows, Rule};
use crate::train::{train_to_dir, RunConfig, TrainOptions};
use crate::trajectory::Run;

/// A run trained from `toml` into `dir/name`: the run, its states and its test rows.
pub(crate) fn trained(dir: &Path, name: &str, toml: &str) -> (Run, Vec<crate::model::Params>, crate::kernel::Points) {
    let cfg = RunConfig::from_toml(toml, Path::new("test.toml")).unwrap();
    let out = dir.join(name);
    train_to_dir(&cfg, &out, &TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }).unwrap();
    let run = Run::open(&out).unwrap();
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    (run, states, pts)
}

/// The dense layers' routes — folded node by node, `J̄_p` formed per point and contracted
/// once, and the default (the first layer's nodes summed per point, [`super::dense::SharedInput`];
/// the output layer as `K + 1` rows per point, [`super::dense::OutputRows`]) — give the same Gram,
/// self-kernel, machine and per-layer shares in every layout, on the network's log-softmax
/// outputs and on the logits, and the same Fig. 2 measure, to rounding (a dense-only stack and
/// one with a formed layer norm between).
#[test]
fn dense_routes_agree() {
    // Flips the process-wide test switches: no other test's kernel runs meanwhile.
    let _switches = crate::kernel::test_switches::exclusive();
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    for (name, layers) in [("mlp", r#"[{ dense = 9 }, "relu", { dense = 7 }, "tanh", { dense = 3 }]"#), ("norm", r#"[{ dense = 8 }, "relu", "layer_norm", { dense = 3 }]"#)] {
        let toml = format!("[data]\nkind = \"gaussian-mixture\"\ndim = 3\nper_class = 4\nn_test = 5\nseed = 2\n\n[model]\nkind = \"layers\"\nlayers = {layers}\n\n[train]\nlr = 0.7\nsteps = 3\nseed = 5\n");
        let (run, states, pts) = trained(dir.path(), name, &toml);
        for (layout, outputs) in [Layout::Full, Layout::Diag, Layout::Trace].into_iter().flat_map(|l| [(l, Outputs::Network), (l, Outputs::Logits)]) {
            for rule in [Rule::Auto(1e-12), Rule::Gauss(4)] {
                let req = Request::new(KernelKind::Epk).rule(rule).layout(layout).outputs(outputs).per_layer(true);
                super::DENSE_ROUTE_TEST.store(1, Relaxed);
                let folded = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                super::DENSE_ROUTE_TEST.store(2, Relaxed);
                let formed = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                super::DENSE_ROUTE_TEST.store(3, Relaxed);
                let summed = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                super::DENSE_ROUTE_TEST.store(0, Relaxed);
                let default = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                let (folded, formed, summed, default) = (folded.unwrap(), formed.unwrap(), summed.unwrap(), default.unwrap());
                let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
                for (route, other) in [("formed", &formed), ("folded, J̄ summed for the measure", &summed), ("default", &default)] {
                    let what = format!("{name} {layout:?} {outputs:?} {rule} {route}");
                    assert!(rel(&other.gram, &folded.gram) <= 1e-13, "{what}: Gram {:e}", rel(&other.gram, &folded.gram));
                    assert!(rel(&other.machine, &folded.machine) <= 1e-13, "{what}: machine");
                    assert!(rel(other.diag.as_ref().unwrap(), folded.diag.as_ref().unwrap()) <= 1e-13, "{what}: self-kernel");
                    let (lf, lo) = (other.layers.as_ref().unwrap(), folded.layers.as_ref().unwrap());
                    for (a, b) in lf.gram.iter().zip(&lo.gram) {
                        assert!(rel(a, b) <= 1e-13, "{what}: a layer's Gram {:e}", rel(a, b));
                    }
                    assert!(other.max_abs_error() <= 1e-11 || !matches!(rule, Rule::Auto(_)), "{what}: machine vs network {:e}", other.max_abs_error());
                    // The Fig. 2 measure from each route's J̄ (formed, shared input, output rows).
                    for (a, b) in other.records.iter().zip(&folded.records) {
                        let (x, y) = (a.dpk_cosine_error, b.dpk_cosine_error);
                        assert!(x.is_finite() && (x - y).abs() <= 1e-12, "{what} step {}: Fig. 2 measure {x} vs {y}", a.step);
                    }
                }
            }
        }
    }
}

/// The dense layers' fold in column tiles and row batches (a short last one of each)
/// equals the sum written out, `w_r (a_r·a_i) ⟨δ_r, δ_i⟩` per pair, in every layout.
#[test]
fn fold_in_tiles_equals_the_sum() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let (pc, r, m, k, ne, no) = (3, 7, 11, 3, 4, 5);
    let mut rand = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect() };
    let (acts, deltas, tacts, tdeltas, weight) = (rand(r * ne), rand(r * k * no), rand(m * ne), rand(m * k * no), rand(r));
    let point: Vec<usize> = (0..r).map(|i| (i * 2) % pc).collect();
    for layout in [Layout::Full, Layout::Diag, Layout::Trace] {
        let (rpp, cols) = (layout.rows_per_point(k), layout.cols_per_train(k));
        let mut slow = vec![0.0; pc * rpp * m * cols];
        for x in 0..r {
            let p = point[x];
            for i in 0..m {
                let aa = super::dot(&acts[x * ne..(x + 1) * ne], &tacts[i * ne..(i + 1) * ne]);
                let dd = |c: usize, c2: usize| super::dot(&deltas[(x * k + c) * no..(x * k + c + 1) * no], &tdeltas[(i * k + c2) * no..(i * k + c2 + 1) * no]);
                for c in 0..k {
                    match layout {
                        Layout::Full => (0..k).for_each(|c2| slow[((p * k + c) * m + i) * k + c2] += weight[x] * aa * dd(c, c2)),
                        Layout::Diag => slow[(p * k + c) * m + i] += weight[x] * aa * dd(c, c),
                        Layout::Trace => slow[p * m + i] += weight[x] * aa * dd(c, c),
                    }
                }
            }
        }
        for (ti, batch) in [(m, r), (3, 2), (4, 5), (1, 1)] {
            let mut out = vec![0.0; slow.len()];
            super::dense::fold_dense_tiled(layout, &mut out, &point, &weight, (&acts, &deltas), (&tacts, &tdeltas), (ne, no, m, k), ti, batch);
            assert!(kernel::max_abs_diff(&out, &slow) <= 1e-13, "{layout:?} tiles of {ti}, batches of {batch}: {:e}", kernel::max_abs_diff(&out, &slow));
        }
    }
}

/// The node search on the sweep's polynomials against the same search on the network in
/// forward mode (log-softmax outputs with offsets, ReLU, max pooling and a residual): no
/// forward-mode evaluation spent, and its nodes integrate the network's own `df/dt` to
/// `f(1) − f(0)`; polynomials that disagree with the network at the piece bounds are not
/// used (the point's search runs the network, as without them).
#[test]
fn node_search_on_the_sweep_polynomials_equals_the_network_search() {
    use rand::{Rng, SeedableRng};

    use super::{StackAlong, StackStep};
    use crate::kernel::quadrature::nodes::{choose_auto_nodes, AlongPath};
    use crate::model::{ModelConfig, OutputKind, Params};

    /// The stack without its polynomials, or with them shifted by `skew`.
    struct Network<'s, 'a>(StackAlong<'s, 'a>, Option<f64>);
    impl AlongPath for Network<'_, '_> {
        fn outputs(&self) -> usize {
            self.0.outputs()
        }
        fn kinks(&self, x: &[f64], p: usize, a: f64, b: f64) -> Vec<f64> {
            self.0.kinks(x, p, a, b)
        }
        fn jvp_points(&self, x: &[f64], idx: &[usize], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
            self.0.jvp_points(x, idx, t, off)
        }
        fn relative_check(&self) -> bool {
            self.0.relative_check()
        }
        fn pieces(&self, x: &[f64], p: usize, a: f64, b: f64) -> (Vec<f64>, Option<Vec<Vec<f64>>>) {
            let (kinks, polys) = self.0.pieces(x, p, a, b);
            match self.1 {
                None => (kinks, None),
                Some(skew) => (kinks, polys.map(|v| v.into_iter().map(|mut c| {
                    c[0] += skew;
                    c
                }).collect())),
            }
        }
        fn map_outputs(&self, g: Vec<f64>, gd: &[f64], off: Option<&[f64]>, q: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
            self.0.map_outputs(g, gd, off, q)
        }
    }

    let text = r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { max_pool2d = 2 }, "flatten", { residual = [{ dense = 6 }, "relu"] }, { dense = 6 }, "relu", { dense = 3 }]"#;
    let cfg: ModelConfig = toml::from_str(text).unwrap();
    for output in [OutputKind::LogSoftmax, OutputKind::Identity] {
        let arch = cfg.resolve(64, Some([1, 8, 8]), 3, output).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let w0 = arch.init(2);
        let w1 = Params { specs: w0.specs.clone(), data: w0.data.iter().map(|d| d.iter().map(|v| v + 0.4 * rng.gen_range(-1.0..1.0)).collect()).collect() };
        let step = StackStep::new(&arch, &w0, Some(&w1)).unwrap();
        let p = 5;
        let x: Vec<f64> = (0..p * 64).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let off: Vec<f64> = (0..p * 3).map(|_| rng.gen_range(-0.5..0.5)).collect();
        let tol = 1e-13;
        // The quadrature of the network's df/dt at the chosen nodes against f(1) − f(0).
        let check = |an: &crate::kernel::quadrature::nodes::AutoNodes, what: &str| {
            assert_eq!(an.unconverged, 0, "{what}");
            let (_, fd) = step.jvp(&x, Some(&off), &an.point, &an.times);
            let ends: Vec<usize> = (0..p).flat_map(|q| [q, q]).collect();
            let te: Vec<f64> = (0..p).flat_map(|_| [0.0, 1.0]).collect();
            let (fe, _) = step.jvp(&x, Some(&off), &ends, &te);
            for q in 0..p {
                for c in 0..3 {
                    let quad: f64 = an.point.iter().enumerate().filter(|&(_, &pp)| pp == q).map(|(j, _)| an.weight[j] * fd[j * 3 + c]).sum();
                    let exact = fe[(2 * q + 1) * 3 + c] - fe[2 * q * 3 + c];
                    assert!((quad - exact).abs() <= 1e-12 * fe[2 * q * 3 + c].abs().max(1.0), "{what}: point {q} class {c}: {quad:e} vs {exact:e}");
                }
            }
        };
        let along = StackAlong { step: &step };
        assert!(along.pieces(&x, 0, 0.0, 1.0).1.is_some(), "the sweep walks this whole stack");
        let poly = choose_auto_nodes(&along, &x, p, Some(&off), tol, None);
        let net = choose_auto_nodes(&Network(StackAlong { step: &step }, None), &x, p, Some(&off), tol, None);
        let skewed = choose_auto_nodes(&Network(StackAlong { step: &step }, Some(1e-6)), &x, p, Some(&off), tol, None);
        assert!(poly.pieces.iter().sum::<usize>() > 2 * p, "too few pieces to test: {:?}", poly.pieces);
        assert!(poly.jvp_evaluations.iter().all(|&e| e == 0), "forward-mode evaluations on the polynomials: {:?}", poly.jvp_evaluations);
        assert!(net.jvp_evaluations.iter().all(|&e| e > 0));
        assert!(skewed.jvp_evaluations.iter().all(|&e| e > 0), "skewed polynomials were used");
        assert_eq!((skewed.times.clone(), skewed.weight.clone()), (net.times.clone(), net.weight.clone()), "skewed polynomials changed the network's search");
        check(&poly, "polynomials");
        check(&net, "network");
        // Same pieces, so the same rule on each up to the order choice's rounding.
        assert_eq!(poly.pieces, net.pieces);
        // Each piece's quadrature is checked against its own polynomial's ends (the next
        // piece's differs there by rounding, which made pieces bisect to the depth limit).
        let (np, nn) = (poly.times.len() as f64, net.times.len() as f64);
        assert!((np - nn).abs() <= 0.1 * nn, "{output:?}: {np} nodes on the polynomials, {nn} on the network");
    }
}

/// The nodes' gradients taken one row at a time equal them taken all at once: Gram, self-kernel
/// and machine of a ReLU stack with a layer norm (a formed layer, whose J̄ is summed across
/// blocks, besides the dense layers' factors), auto EPK (many nodes per point) and a fixed
/// rule, to rounding.
#[test]
fn node_blocks_do_not_change_the_kernel() {
    // Flips the process-wide test switches: no other test's kernel runs meanwhile.
    let _switches = crate::kernel::test_switches::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let toml = r#"[data]
kind = "gaussian-mixture"
dim = 4
per_class = 5
n_test = 3
seed = 3

[model]
kind = "layers"
layers = [{ dense = 12 }, "relu", "layer_norm", { dense = 10 }, "relu", { dense = 3 }]

[train]
lr = 0.8
steps = 3
seed = 7
"#;
    let cfg = RunConfig::from_toml(toml, Path::new("test.toml")).unwrap();
    let out = dir.path().join("run");
    train_to_dir(&cfg, &out, &TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }).unwrap();
    let run = Run::open(&out).unwrap();
    let states = run.load_all().unwrap();
    let pts = Rows::Test.resolve(&run.dataset).unwrap();
    for rule in [Rule::Auto(1e-12), Rule::Gauss(3)] {
        let req = Request::new(KernelKind::Epk).rule(rule).layout(Layout::Full);
        let whole = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
        super::NODE_BYTES_TEST.store(1, std::sync::atomic::Ordering::Relaxed);
        let rows = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
        super::NODE_BYTES_TEST.store(super::NODE_BYTES, std::sync::atomic::Ordering::Relaxed);
        let rows = rows.unwrap();
        assert!(whole.mean_evaluations() >= 3.0, "too few nodes to split: {}", whole.mean_evaluations());
        let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b);
        assert!(rel(&rows.gram, &whole.gram) <= 1e-13, "{rule}: Gram {:e}", rel(&rows.gram, &whole.gram));
        assert!(rel(&rows.machine, &whole.machine) <= 1e-13, "{rule}: machine {:e}", rel(&rows.machine, &whole.machine));
        let (a, b) = (rows.diag.as_ref().unwrap(), whole.diag.as_ref().unwrap());
        assert!(rel(a, b) <= 1e-13, "{rule}: self-kernel {:e}", rel(a, b));
        if let Rule::Auto(_) = rule {
            assert!(whole.max_abs_error() <= 1e-11, "machine vs network {:e}", whole.max_abs_error());
        }
    }
}

/// `dir/mnist` holding [`tiny_mnist`]'s files.
fn mnist_dir(dir: &Path, n_train: u32, n_test: u32) -> PathBuf {
    let data = dir.join("mnist");
    std::fs::create_dir_all(&data).unwrap();
    tiny_mnist(&data, n_train, n_test);
    data
}

/// Seeded random 28×28 "MNIST" IDX files (sparse pixels) in `dir`.
pub(crate) fn tiny_mnist(dir: &Path, n_train: u32, n_test: u32) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let idx = |dims: &[u32], data: Vec<u8>| -> Vec<u8> {
        let mut b = vec![0u8, 0, 8, dims.len() as u8];
        dims.iter().for_each(|d| b.extend_from_slice(&d.to_be_bytes()));
        b.extend(data);
        b
    };
    for (prefix, n) in [("train", n_train), ("t10k", n_test)] {
        let pixels: Vec<u8> = (0..n * 784).map(|_| if rng.gen_bool(0.3) { rng.gen_range(1..=255) } else { 0 }).collect();
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        std::fs::write(dir.join(format!("{prefix}-images.idx3-ubyte")), idx(&[n, 28, 28], pixels)).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels.idx1-ubyte")), idx(&[n], labels)).unwrap();
    }
}

/// The formed layers contracted per wave of chunks (one product over many row points) give
/// the kernel of the contraction per chunk (a wave of one chunk, as before waves), with
/// waves that hold several chunks and a last one that holds fewer: Gram, self-kernel,
/// machine and per-layer shares in every layout, on convolutions and a formed layer norm
/// (a fixed rule: the waves do not depend on how the nodes were chosen).
#[test]
fn formed_layers_in_waves_agree() {
    // Flips the process-wide test switches: no other test's kernel runs meanwhile.
    let _switches = crate::kernel::test_switches::exclusive();
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let data = mnist_dir(dir.path(), 10, 37);
    let model = r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 4, kernel = 5 } }, "relu", { max_pool2d = 2 }, "flatten", { layer_norm = {} }, { dense = 12 }, "relu", { dense = 10 }]"#;
    let toml = format!("[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 37\n\n[model]\n{model}\n\n[train]\nlr = 0.3\nsteps = 2\nseed = 4\n", data.to_str().unwrap());
    let (run, states, pts) = trained(dir.path(), "waves", &toml);
    let chunk = super::chunk_points(37);
    assert!(chunk < 37 / 3, "the test wants several chunks per wave: {chunk}");
    for (layout, per_layer) in [(Layout::Full, false), (Layout::Diag, false), (Layout::Diag, true), (Layout::Trace, false)] {
        {
            let req = Request::new(KernelKind::Epk).rule(Rule::Gauss(2)).layout(layout).per_layer(per_layer);
            super::WAVE_POINTS_TEST.store(1, Relaxed);
            let per_chunk = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
            super::WAVE_POINTS_TEST.store(3 * chunk, Relaxed);
            let three = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
            super::WAVE_POINTS_TEST.store(0, Relaxed);
            let one_wave = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
            let (per_chunk, three, one_wave) = (per_chunk.unwrap(), three.unwrap(), one_wave.unwrap());
            let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
            for (what, other) in [("three chunks a wave", &three), ("one wave", &one_wave)] {
                let what = format!("{layout:?} per_layer {per_layer}: {what}");
                assert!(rel(&other.gram, &per_chunk.gram) <= 1e-14, "{what}: Gram {:e}", rel(&other.gram, &per_chunk.gram));
                assert!(rel(&other.machine, &per_chunk.machine) <= 1e-14, "{what}: machine");
                assert!(rel(other.diag.as_ref().unwrap(), per_chunk.diag.as_ref().unwrap()) <= 1e-14, "{what}: self-kernel");
                if per_layer {
                    for (a, b) in other.layers.as_ref().unwrap().gram.iter().zip(&per_chunk.layers.as_ref().unwrap().gram) {
                        assert!(rel(a, b) <= 1e-14, "{what}: a layer's Gram {:e}", rel(a, b));
                    }
                }
            }
        }
    }
}

/// A fixed rule reduced on each point's pieces ([`super::fixed`]) gives the rule's kernel node
/// by node: Gram, machine, self-kernel, per-layer shares and the Fig. 2 measure, on the
/// network's log-softmax outputs (the softmax's stand-ins) and on the logits, in the full and
/// the class-diagonal layouts — on the CNN preset's shape, a LeNet-like stack (two convolutions,
/// leaky ReLU, max and average pooling: gradients of degree 4 on a piece) and a deep MLP (three
/// classes, outputs of degree 4: the adaptive rule's simultaneous product nodes); and
/// with fewer evaluations than nodes. The adaptive rule's accepted nodes, reduced the same way,
/// give its kernel node by node too.
#[test]
fn reduced_fixed_rules_equal_the_rule_node_by_node() {
    let dir = tempfile::tempdir().unwrap();
    let data = mnist_dir(dir.path(), 10, 4);
    let mnist = |layers: &str| format!("[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 4\n\n[model]\nkind = \"layers\"\nzero_last = false\nlayers = {layers}\n\n[train]\nlr = 0.02\nsteps = 2\nseed = 4\n", data.to_str().unwrap());
    let cases = [
        ("cnn", mnist(r#"[{ conv2d = { channels = 3, kernel = 5 } }, "relu", { max_pool2d = 2 }, "flatten", { dense = 10 }]"#)),
        ("lenet", mnist(r#"[{ conv2d = { channels = 2, kernel = 5, padding = 2 } }, { leaky_relu = 0.1 }, { max_pool2d = 2 }, { conv2d = { channels = 3, kernel = 5 } }, "relu", { avg_pool2d = 2 }, "flatten", { dense = 8 }, "relu", { dense = 10 }]"#)),
        ("mlp", "[data]\nkind = \"gaussian-mixture\"\ndim = 6\nper_class = 6\nn_test = 5\nseed = 2\n\n[model]\nkind = \"layers\"\nlayers = [{ dense = 16 }, \"relu\", { dense = 16 }, \"relu\", { dense = 16 }, \"relu\", { dense = 3 }]\n\n[train]\nlr = 0.5\nsteps = 3\nseed = 5\n".to_string()),
    ];
    for (name, toml) in cases {
        let (run, states, pts) = trained(dir.path(), name, &toml);
        for (layout, outputs, rule) in [(Layout::Full, Outputs::Network, Rule::Left(200)), (Layout::Diag, Outputs::Logits, Rule::Gauss(64)), (Layout::Full, Outputs::Logits, Rule::Midpoint(120)), (Layout::Full, Outputs::Network, Rule::Auto(1e-12)), (Layout::Diag, Outputs::Logits, Rule::Auto(1e-12))] {
            let req = Request::new(KernelKind::Epk).rule(rule).layout(layout).outputs(outputs).per_layer(true);
            super::reduced::KEEP_NODES.with(|c| c.set(true));
            let plain = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
            super::reduced::KEEP_NODES.with(|c| c.set(false));
            let (plain, reduced) = (plain.unwrap(), kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap());
            let what = format!("{name} {layout:?} {outputs:?} {rule}");
            // A fixed rule's nodes; the adaptive rule's on log-softmax outputs where its relative
            // check takes more Gauss nodes per piece than the gradient's degree plus one.
            let (before, after) = (plain.mean_evaluations(), reduced.mean_evaluations());
            match rule.fixed_nodes() {
                Some(n) => {
                    assert_eq!(before, n.len() as f64, "{what}");
                    assert!(after < 0.6 * before, "{what}: {after} evaluations per point and step");
                }
                // (On the CNN, degree 1: 2 nodes per piece where its search takes 3 or more.)
                None if outputs == Outputs::Network && name == "cnn" => assert!(after < before, "{what}: {after} evaluations per point and step, {before} node by node"),
                None => assert!(after <= before, "{what}: {after} evaluations per point and step, {before} node by node"),
            }
            if let Rule::Auto(_) = rule {
                assert!(reduced.max_abs_error() <= 1e-11, "{what}: machine vs network {:e}", reduced.max_abs_error());
            }
            let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
            assert!(rel(&reduced.gram, &plain.gram) <= 1e-12, "{what}: Gram {:e}", rel(&reduced.gram, &plain.gram));
            assert!(rel(&reduced.machine, &plain.machine) <= 1e-12, "{what}: machine {:e}", rel(&reduced.machine, &plain.machine));
            let (a, b) = (reduced.diag.as_ref().unwrap(), plain.diag.as_ref().unwrap());
            assert!(rel(a, b) <= 1e-12, "{what}: self-kernel {:e}", rel(a, b));
            for (a, b) in reduced.layers.as_ref().unwrap().gram.iter().zip(&plain.layers.as_ref().unwrap().gram) {
                assert!(rel(a, b) <= 1e-12, "{what}: a layer's Gram {:e}", rel(a, b));
            }
            for (a, b) in reduced.records.iter().zip(&plain.records) {
                let (x, y) = (a.dpk_cosine_error, b.dpk_cosine_error);
                assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0), "{what} step {}: Fig. 2 measure {x} vs {y}", a.step);
            }
        }
    }
}

/// A stack trained with momentum walks the path backwards (`kernel::engine::stateful`), its
/// rows' nodes from the same adaptive search: with its pieces product-integrated the kernel is
/// the plain rule's to rounding (Gram, machine), with fewer evaluations, and the machine
/// reproduces the network.
#[test]
fn product_integration_on_the_stateful_row_side_equals_the_plain_rule() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 4\nper_class = 6\nn_test = 5\nseed = 3\n\n[model]\nkind = \"layers\"\nlayers = [{ dense = 12 }, \"relu\", { dense = 10 }, \"relu\", { dense = 8 }, \"relu\", { dense = 3 }]\n\n[train]\nlr = 0.3\nsteps = 6\noptimizer = \"sgd\"\nmomentum = 0.9\nbatch_size = 6\nseed = 2\n";
    let (run, states, pts) = trained(dir.path(), "momentum", toml);
    let req = Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)).layout(Layout::Full);
    super::reduced::KEEP_NODES.with(|c| c.set(true));
    let plain = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
    super::reduced::KEEP_NODES.with(|c| c.set(false));
    let (plain, product) = (plain.unwrap(), kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap());
    assert_eq!(product.form, crate::kernel::KernelForm::Momentum);
    let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
    assert!(rel(&product.gram, &plain.gram) <= 1e-12, "Gram {:e}", rel(&product.gram, &plain.gram));
    assert!(rel(&product.machine, &plain.machine) <= 1e-12, "machine {:e}", rel(&product.machine, &plain.machine));
    assert!(product.max_abs_error() <= 1e-11, "machine vs network {:e}", product.max_abs_error());
    let (before, after) = (plain.mean_evaluations(), product.mean_evaluations());
    assert!(after < before, "{after} evaluations per point and step, {before} with the plain rule");
}

/// The gradient evaluations through the device program (`crate::device`, on the host
/// backend: what a GPU runs, blocks of 13 rows) give the CPU engine's kernel — Gram,
/// machine, self-kernel and node counts — on a LeNet-shaped stack (padded convolutions, ReLU
/// ahead of max-pools, no-bias layers, average pooling, smooth activations), the CNN preset
/// and an MLP preset, under the adaptive and a fixed rule.
#[test]
fn device_program_nodes_give_the_cpu_engine_s_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let data = mnist_dir(dir.path(), 10, 3);
    let models = [
        ("lenet", r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 }, { conv2d = { channels = 4, kernel = 5, bias = false } }, "relu", { max_pool2d = { kernel = 3, stride = 2 } }, "flatten", { dense = 12 }, "tanh", { dense = 10 }]"#, false),
        ("smooth", r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 2, kernel = 3, stride = 2, padding = 1 } }, "silu", { avg_pool2d = 2 }, { conv2d = { channels = 3, kernel = 3 } }, { leaky_relu = 0.05 }, "flatten", { dense = 8 }, "gelu", { dense = { features = 10, bias = false } }]"#, false),
        ("resnorm", r#"kind = "layers"
zero_last = false
layers = [{ conv2d = { channels = 3, kernel = 5, stride = 3 } }, { layer_norm = {} }, { residual = [{ conv2d = { channels = 3, kernel = 3, padding = 1 } }, "relu", { conv2d = { channels = 3, kernel = 3, padding = 1 } }] }, { residual = [{ conv2d = { channels = 4, kernel = 3, stride = 2, padding = 1 } }, "relu"] }, "flatten", { residual = [{ layer_norm = {} }, { dense = 8 }, "relu", { dense = 8 }] }, { layer_norm = { eps = 0.5 } }, { dense = 10 }]"#, false),
        ("cnn", "kind = \"cnn\"\nchannels = 2\nkernel = 5\nstride = 2\npool = 2\nzero_last = false", true),
        ("mlp", "kind = \"mlp\"\nhidden = [6]\nzero_last = false", true),
    ];
    for (name, model, per_layer) in models {
        let toml = format!("[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 3\n\n[model]\n{model}\n\n[train]\nlr = 0.3\nsteps = 2\nseed = 4\n", data.to_str().unwrap());
        let (run, states, pts) = trained(dir.path(), name, &toml);
        for (rule, layout) in [(Rule::Auto(1e-12), Layout::Diag), (Rule::Gauss(3), Layout::Full)] {
            let req = Request::new(KernelKind::Epk).rule(rule).layout(layout).per_layer(per_layer);
            // Node by node, as the device evaluates them (the softmax's stand-ins of nodes
            // reduced on the pieces are the CPU engine's).
            super::reduced::KEEP_NODES.with(|c| c.set(true));
            let cpu = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
            super::reduced::KEEP_NODES.with(|c| c.set(false));
            let cpu = cpu.unwrap();
            crate::kernel::engine::driver::NODES_ON_HOST.with(|c| c.set(true));
            let dev = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
            crate::kernel::engine::driver::NODES_ON_HOST.with(|c| c.set(false));
            let dev = dev.unwrap();
            let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
            let what = format!("{name} {rule} {layout:?}");
            assert!(rel(&dev.gram, &cpu.gram) <= 1e-12, "{what}: Gram {:e}", rel(&dev.gram, &cpu.gram));
            assert!(rel(&dev.machine, &cpu.machine) <= 1e-12, "{what}: machine {:e}", rel(&dev.machine, &cpu.machine));
            if matches!(rule, Rule::Auto(_)) {
                assert!(dev.max_abs_error() <= 1e-10, "{what}: machine vs network {:e}", dev.max_abs_error());
            }
            if let (Some(a), Some(b)) = (&dev.diag, &cpu.diag) {
                assert!(rel(a, b) <= 1e-12, "{what}: self-kernel {:e}", rel(a, b));
            }
            let evals = |o: &crate::kernel::KernelOutput| o.records.iter().map(|s| s.mean_evaluations).sum::<f64>();
            assert_eq!(evals(&dev), evals(&cpu), "{what}: node evaluations");
        }
    }
}

/// The `dense → relu → dense` closed form on its device route — the rows by the kernel
/// `pk_mlp_pieces` (`dense_relu::device`), the Gram by the resident contraction
/// (`kernel::backend::resident`), both on the host backend: what a GPU runs with `--device
/// cuda` — gives the host's kernel — Gram, machine, self-kernel — for the EPK in every
/// layout on the network's outputs and on the logits, k′ and the path kernel on the logits (the
/// training side integrated too). Chen's column weights are `resident`'s own test.
#[test]
fn closed_form_device_route_gives_the_host_s_kernel() {
    use crate::kernel::stack::closed::dense_relu::model::WHOLE_STEPS;
    let dir = tempfile::tempdir().unwrap();
    let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 5\nper_class = 7\nn_test = 6\nseed = 4\n\n[model]\nkind = \"mlp\"\nhidden = [9]\nzero_last = false\n\n[train]\nlr = 0.8\nsteps = 9\nseed = 3\n";
    let (run, states, pts) = trained(dir.path(), "mlp", toml);
    let epk = |layout: Layout, outputs: Outputs| Request::new(KernelKind::Epk).rule(Rule::Auto(1e-12)).layout(layout).outputs(outputs);
    let mut reqs: Vec<Request> = [Layout::Full, Layout::Diag, Layout::Trace].into_iter().flat_map(|l| [epk(l, Outputs::Network), epk(l, Outputs::Logits)]).collect();
    reqs.push(Request::new(KernelKind::Kprime).rule(Rule::Auto(1e-12)).layout(Layout::Diag));
    reqs.push(Request::new(KernelKind::Path).rule(Rule::Auto(1e-12)).layout(Layout::Full).outputs(Outputs::Logits));
    // Per-step Grams (one resident accumulator a step) and row blocks (one a block).
    reqs.push(epk(Layout::Diag, Outputs::Network).per_step(true));
    reqs.push(epk(Layout::Trace, Outputs::Network).block_rows(Some(4)));
    // A share of the training columns.
    reqs.push(epk(Layout::Diag, Outputs::Network).columns(Some((3, 11))));
    for req in reqs {
        let host = kernel::compute(&run, &states, &pts, &req, &|_, _| {}).unwrap();
        crate::kernel::engine::driver::CLOSED_ON_HOST.with(|c| c.set(true));
        crate::kernel::engine::driver::RESIDENT_USED.with(|c| c.set(0));
        WHOLE_STEPS.with(|c| c.set(0));
        let dev = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
        crate::kernel::engine::driver::CLOSED_ON_HOST.with(|c| c.set(false));
        let dev = dev.unwrap();
        let rel = |a: &[f64], b: &[f64]| kernel::max_abs_diff(a, b) / kernel::max_abs(b).max(1e-300);
        let what = format!("{:?} {:?} {:?} per-step {} blocks {:?}", req.kind, req.layout, req.outputs, req.per_step, req.block_rows);
        assert!(kernel::max_abs(&host.gram) > 0.0, "{what}: an empty Gram");
        assert!(rel(&dev.gram, &host.gram) <= 1e-13, "{what}: Gram {:e}", rel(&dev.gram, &host.gram));
        if let (Some(a), Some(b)) = (&dev.per_step, &host.per_step) {
            assert!(rel(a, b) <= 1e-13, "{what}: per-step Grams {:e}", rel(a, b));
        }
        assert!(rel(&dev.machine, &host.machine) <= 1e-13, "{what}: machine {:e}", rel(&dev.machine, &host.machine));
        if let (Some(a), Some(b)) = (&dev.diag, &host.diag) {
            assert!(rel(a, b) <= 1e-13, "{what}: self-kernel {:e}", rel(a, b));
        }
        // The closed form ran, on the resident Gram; every step whole on the device but the
        // path kernel's (its training side is integrated on the host).
        assert!(crate::kernel::engine::driver::RESIDENT_USED.with(|c| c.get()) > 0, "{what}: not resident");
        let whole = WHOLE_STEPS.with(|c| c.get());
        if req.kind == KernelKind::Path {
            assert_eq!(whole, 0, "{what}: the path kernel's steps ran whole on the device");
        } else {
            assert_eq!(whole, host.steps.len() * if req.per_step { 1 } else { host.p.div_ceil(req.block_rows.unwrap_or(host.p)) }, "{what}: steps not whole on the device");
        }
    }
}
