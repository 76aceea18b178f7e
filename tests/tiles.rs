//! Tiled kernel jobs: tiles (row blocks × column blocks × step ranges) merged equal the
//! one-process result to 1e-13 relative, bit-identically on reruns; column blocks computed
//! apart are the columns of the whole on every path (MLP, CNN, generic, momentum, Adam); every fault (killed, missing, truncated, corrupted,
//! foreign tiles, edited plans) is one line on stderr, exit 2, nothing overwritten; Slurm scripts
//! and their submission (with a stand-in `sbatch`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;
use pathkernel::kernel::{self, GramPath, KernelKind, KernelOutput, Layout, Rows, Request, Rule, Side};
use pathkernel::tile::{self, Plan, PlanInput, Tiling};
use pathkernel::trajectory::Run;

fn req(kind: KernelKind, rule: Rule, side: Side) -> Request {
    Request::new(kind).rule(rule).side(side)
}

fn one_process(run: &Run, points: &str, r: &Request, layout: Layout) -> KernelOutput {
    let states = run.load_all().unwrap();
    let pts = points.parse::<Rows>().unwrap().resolve(&run.dataset).unwrap();
    kernel::compute(run, &states, &pts, &r.clone().layout(layout), &|_, _| {}).unwrap()
}

/// Plans, runs every tile and merges, in process.
fn tiled(run: &Run, out: &Path, points: &str, r: &Request, layout: Layout, tiling: Tiling, budget: u64) -> (Plan, KernelOutput) {
    let states = run.load_all().unwrap();
    let plan = tile::make_plan(&PlanInput { run, states: &states, points, req: &r.clone().layout(layout), memory_budget: budget, tiling, pilot: false }).unwrap();
    plan.write(out, true).unwrap();
    for t in &plan.tiles {
        tile::run_tile(out, t.index, &|_, _| {}).unwrap();
    }
    let pts = points.parse::<Rows>().unwrap().resolve(&run.dataset).unwrap();
    let merged = tile::merge_output(out, &Plan::read(out).unwrap(), &pts).unwrap();
    (plan, merged)
}

fn rel(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = max_abs(b);
    if scale == 0.0 {
        max_abs_diff(a, b)
    } else {
        max_abs_diff(a, b) / scale
    }
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A tile's arrays and metadata as bits, without its compute time (`seconds` and the checksum,
/// which covers it).
fn tile_content(path: &Path) -> Vec<(String, Vec<u64>)> {
    let f = pathkernel::io::SafeFile::open(path).unwrap();
    let mut out: Vec<(String, Vec<u64>)> = f
        .names()
        .into_iter()
        .filter(|n| n != "seconds")
        .map(|n| {
            let v = match f.f64(&n, None) {
                Ok((_, v)) => bits(&v),
                Err(_) => f.i64(&n, None).unwrap().1.into_iter().map(|x| x as u64).collect(),
            };
            (n, v)
        })
        .collect();
    let mut meta: Vec<(String, String)> = f.metadata().into_iter().filter(|(k, _)| k != "crc32").collect();
    meta.sort();
    out.extend(meta.into_iter().map(|(k, v)| (k, v.bytes().map(u64::from).collect())));
    out
}

/// The merged output against the one-process one: ≤ 1e-13 relative where sums are re-ordered,
/// exact where nothing is summed.
fn assert_same(name: &str, got: &KernelOutput, want: &KernelOutput) {
    assert_eq!((got.p, got.m, got.k, got.layout), (want.p, want.m, want.k, want.layout), "{name}: shape");
    assert_eq!(got.steps, want.steps, "{name}: steps");
    let close = |what: &str, a: &[f64], b: &[f64]| {
        let r = rel(a, b);
        assert!(r <= 1e-13, "{name}: {what} differs by {r:e} relative");
    };
    close("gram", &got.gram, &want.gram);
    close("machine", &got.machine, &want.machine);
    // f itself: the same states, but row blocks of other sizes may round the forward pass's
    // products differently in the last bit.
    close("bias", &got.bias, &want.bias);
    close("network", &got.network, &want.network);
    assert_eq!(got.a, want.a, "{name}: a");
    assert!(max_abs(&got.gram) > 1e-6, "{name}: trivial Gram");
    match (&got.diag, &want.diag) {
        (Some(a), Some(b)) => close("diag", a, b),
        (None, None) => {}
        _ => panic!("{name}: diag present in one only"),
    }
    match (&got.single_machine, &want.single_machine) {
        (Some(a), Some(b)) => close("single machine", a, b),
        (None, None) => {}
        _ => panic!("{name}: single machine present in one only"),
    }
    match (&got.per_step, &want.per_step) {
        (Some(a), Some(b)) => close("per-step Grams", a, b),
        (None, None) => {}
        _ => panic!("{name}: per-step Grams present in one only"),
    }
    for (what, a, b) in [("reg", &got.reg, &want.reg), ("rounding", &got.rounding, &want.rounding)] {
        match (a, b) {
            (Some(a), Some(b)) => assert!(max_abs_diff(a, b) <= 1e-13 * (1.0 + max_abs(b)), "{name}: {what}"),
            (None, None) => {}
            _ => panic!("{name}: {what} present in one only"),
        }
    }
    assert_eq!(got.decomposition_residual.is_some(), want.decomposition_residual.is_some(), "{name}: residual");
    assert_eq!(got.records.len(), want.records.len(), "{name}: records");
    for (a, b) in got.records.iter().zip(&want.records) {
        assert_eq!(a.step, b.step);
        assert!((a.max_abs_error - b.max_abs_error).abs() <= 1e-13 * (1.0 + b.max_abs_change), "{name}: step {} record {} vs {}", a.step, a.max_abs_error, b.max_abs_error);
        assert!((a.mean_abs_error - b.mean_abs_error).abs() <= 1e-13 * (1.0 + b.max_abs_change), "{name}: step {} mean error {} vs {}", a.step, a.mean_abs_error, b.mean_abs_error);
        assert!((a.max_abs_change - b.max_abs_change).abs() <= 1e-13 * (1.0 + b.max_abs_change), "{name}: step {} change", a.step);
        assert_eq!(a.max_evaluations, b.max_evaluations, "{name}: step {} evaluations", a.step);
        assert!((a.mean_evaluations - b.mean_evaluations).abs() <= 1e-12 * b.mean_evaluations.max(1.0));
    }
    let (e, w) = (got.max_abs_error(), want.max_abs_error());
    assert!((e - w).abs() <= 1e-12 * (1.0 + w), "{name}: machine vs network {e:e}, one process {w:e}");
}

#[test]
fn tiles_equal_the_one_process_kernel_in_every_split_and_layout() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "gd", &toy2d("[6, 5]", "relu", 9, 0.5, 10, 7));
    let epk = req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test);
    for layout in [Layout::Full, Layout::Diag] {
        let want = one_process(&run, "test", &epk, layout);
        for tiling in [Tiling::Grid { rows: 2, cols: 1, steps: 3 }, Tiling::Grid { rows: 1, cols: 1, steps: 9 }, Tiling::Count(3), Tiling::Count(20)] {
            let name = format!("epk {layout} {tiling:?}");
            let (plan, got) = tiled(&run, &dir.path().join("t"), "test", &epk, layout, tiling, 1 << 30);
            if tiling == Tiling::Count(20) {
                // 7 row points: one block each, then ⌈20 / 7⌉ = 3 step ranges.
                assert_eq!((plan.row_blocks, plan.step_ranges.len()), (7, 3), "{name}");
            }
            assert_same(&name, &got, &want);
            if layout == Layout::Full {
                assert!(got.single_machine.is_some(), "{name}: Theorem 3.7's machine is recomputed");
            }
        }
    }
    // Other kinds, sides, per-step Grams and a sub-range of the steps.
    let cases: Vec<(&str, &str, Request)> = vec![
        ("dpk", "test", req(KernelKind::Dpk, Rule::Gauss(1), Side::Test)),
        ("chen", "test", req(KernelKind::Chen, Rule::Gauss(1), Side::Test)),
        ("epk train side", "train", req(KernelKind::Epk, Rule::Gauss(3), Side::Train)),
        ("kprime per-step", "test", req(KernelKind::Kprime, Rule::Gauss(4), Side::Test).per_step(true)),
        ("epk steps 2:8", "class-means", req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test).steps(Some((2, 8)))),
    ];
    for (name, points, r) in cases {
        let want = one_process(&run, points, &r, Layout::Full);
        let (plan, got) = tiled(&run, &dir.path().join("t"), points, &r, Layout::Full, Tiling::Grid { rows: 2, cols: 1, steps: 3 }, 1 << 30);
        if name == "epk steps 2:8" {
            assert_eq!(plan.step_ranges, vec![[2, 4], [4, 6], [6, 8]]);
            assert!(got.single_machine.is_none(), "a is zero outside 2:8, so not constant");
        }
        assert_same(name, &got, &want);
    }
}

#[test]
fn ntk_and_coupled_optimizers_are_tiled_by_rows_only() {
    let dir = tempfile::tempdir().unwrap();
    let gd = train(dir.path(), "gd", &toy2d("[5]", "tanh", 6, 0.5, 8, 6));
    let ntk = req(KernelKind::Ntk, Rule::Gauss(1), Side::Test);
    let states = gd.load_all().unwrap();
    let input = |run: &'_ Run, states: &'_ [pathkernel::model::Params], r: &Request, tiling| {
        tile::make_plan(&PlanInput { run, states, points: "test", req: r, memory_budget: 1 << 30, tiling, pilot: false }).map(|p| (p.row_blocks, p.step_ranges.len()))
    };
    assert_eq!(input(&gd, &states, &ntk, Tiling::Count(12)).unwrap(), (6, 1));
    let e = input(&gd, &states, &ntk, Tiling::Grid { rows: 1, cols: 1, steps: 2 }).unwrap_err().to_string();
    assert!(e.contains("step ranges need plain gradient steps") && e.contains("the NTK is one kernel"), "{e}");
    let want = one_process(&gd, "test", &ntk, Layout::Full);
    let (_, got) = tiled(&gd, &dir.path().join("t"), "test", &ntk, Layout::Full, Tiling::Count(3), 1 << 30);
    assert_same("ntk", &got, &want);

    let epk = req(KernelKind::Epk, Rule::Gauss(3), Side::Test);
    let momentum = train(dir.path(), "mom", &toy2d("[5]", "relu", 6, 0.05, 8, 6).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\n"));
    let ms = momentum.load_all().unwrap();
    let e = input(&momentum, &ms, &epk, Tiling::Grid { rows: 2, cols: 1, steps: 2 }).unwrap_err().to_string();
    assert!(e.contains("couples its steps (kernel form momentum)"), "{e}");
    assert_eq!(input(&momentum, &ms, &epk, Tiling::Count(9)).unwrap(), (6, 1), "more tiles than rows: rows only");
    for (name, r) in [("momentum", epk.clone()), ("momentum steps 2:5", epk.clone().steps(Some((2, 5))))] {
        let want = one_process(&momentum, "test", &r, Layout::Full);
        let (_, got) = tiled(&momentum, &dir.path().join("t"), "test", &r, Layout::Full, Tiling::Count(3), 1 << 30);
        assert_same(name, &got, &want);
        assert_eq!(bits(&got.machine), bits(&want.machine), "{name}: row tiles alone are exact");
    }

    // Plain steps with weight decay split by steps too (the decay term is a sum over steps).
    let wd = train(dir.path(), "wd", &toy2d("[5]", "relu", 6, 0.3, 8, 6).replace("seed = 7\n", "seed = 7\nweight_decay = 0.05\nweight_decay_mode = \"decoupled\"\n"));
    let want = one_process(&wd, "test", &epk, Layout::Full);
    assert!(want.reg.is_some());
    let (plan, got) = tiled(&wd, &dir.path().join("t"), "test", &epk, Layout::Full, Tiling::Grid { rows: 2, cols: 1, steps: 3 }, 1 << 30);
    assert_eq!(plan.step_ranges.len(), 3);
    assert_same("gd + decoupled weight decay", &got, &want);
    // SGD mini-batches.
    let sgd = train(dir.path(), "sgd", &toy2d("[5]", "relu", 8, 0.3, 8, 6).replace("seed = 7\n", "seed = 7\noptimizer = \"sgd\"\nbatch_size = 7\n"));
    let want = one_process(&sgd, "test", &epk, Layout::Full);
    let (_, got) = tiled(&sgd, &dir.path().join("t"), "test", &epk, Layout::Full, Tiling::Grid { rows: 3, cols: 1, steps: 4 }, 1 << 30);
    assert_same("sgd", &got, &want);
}

#[test]
fn reruns_are_bit_identical_and_the_tiled_gram_streams() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "gd", &toy2d("[6]", "relu", 8, 0.5, 10, 9));
    let epk = req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test);
    let out = dir.path().join("t");
    let (plan, first) = tiled(&run, &out, "test", &epk, Layout::Full, Tiling::Grid { rows: 3, cols: 1, steps: 2 }, 1 << 30);
    let tile0 = tile_content(&tile::tile_path(&out, 0));
    // The same plan again (same id), every tile recomputed.
    let (again, second) = tiled(&run, &out, "test", &epk, Layout::Full, Tiling::Grid { rows: 3, cols: 1, steps: 2 }, 1 << 30);
    assert_eq!(plan.plan_id, again.plan_id, "planning the same job gives the same id");
    assert!(tile_content(&tile::tile_path(&out, 0)) == tile0, "tiles are bit-identical but for their seconds");
    assert_eq!(bits(&first.gram), bits(&second.gram));
    assert_eq!(bits(&first.machine), bits(&second.machine));
    assert_eq!(bits(first.single_machine.as_ref().unwrap()), bits(second.single_machine.as_ref().unwrap()));

    // The streaming reader gives the merged Gram's bits, a row block or a class block at a time.
    let g = tile::TiledGram::open(&out).unwrap();
    let (p, m, k) = (first.p, first.m, first.k);
    assert_eq!(g.shape(), vec![p, m, k, k]);
    let mut rows = Vec::new();
    for (b, r) in g.row_blocks().iter().enumerate() {
        let block = g.row_block(b).unwrap();
        assert_eq!(block.len(), r.len() * m * k * k);
        rows.extend(block);
    }
    assert_eq!(bits(&rows), bits(&first.gram));
    let c01 = g.class_block(0, 1).unwrap();
    let want: Vec<f64> = (0..p * m).map(|pm| first.gram[pm * k * k + 1]).collect();
    assert_eq!(bits(&c01), bits(&want));
    assert!(g.class_block(0, 3).is_err());
}

#[test]
fn each_tile_fits_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "gd", &toy2d("[8]", "relu", 5, 0.5, 40, 40));
    let epk = req(KernelKind::Epk, Rule::Gauss(2), Side::Train);
    let states = run.load_all().unwrap();
    let plan_with = |budget: u64| {
        tile::make_plan(&PlanInput { run: &run, states: &states, points: "train", req: &epk, memory_budget: budget, tiling: Tiling::Count(2), pilot: true })
    };
    let roomy = plan_with(1 << 30).unwrap();
    assert_eq!(roomy.row_blocks, 2);
    let pilot = roomy.pilot.as_ref().unwrap();
    assert!(pilot.row_seconds_per_step >= 0.0 && pilot.rows == 8);
    assert!(roomy.tiles.iter().all(|t| t.estimated_seconds.is_some_and(|s| s >= 0.0)));
    // Shrinking budgets: more row blocks, every tile within its budget.
    let mut grown = 0;
    let mut last = roomy.row_blocks;
    for mib in [64u64, 16, 8, 6, 5] {
        let budget = mib << 20;
        let Ok(plan) = plan_with(budget) else { break };
        assert!(plan.row_blocks >= last, "{plan}");
        assert!(plan.tiles.iter().all(|t| t.estimated_peak_bytes <= budget), "{plan}");
        if plan.row_blocks > 2 {
            assert!(plan.split.contains("grown to"), "{}", plan.split);
            grown += 1;
        }
        last = plan.row_blocks;
    }
    assert!(grown > 0, "no budget made the tiles grow");
    let e = plan_with(1 << 10).unwrap_err().to_string();
    assert!(e.contains("over the budget"), "{e}");
}

// ------------------------------------------------------------------------------------------
// Column blocks (training points).

/// A small CNN on fake MNIST (10 training images); `extra` goes into `[train]`.
fn cnn_run(dir: &Path, name: &str, extra: &str) -> Run {
    let data = dir.join(format!("{name}-mnist"));
    std::fs::create_dir_all(&data).unwrap();
    fake_mnist(&data, 10, 3);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = {:?}\nn_train = 10\nn_test = 3\n\n[model]\nkind = \"cnn\"\nchannels = 2\nkernel = 5\nstride = 2\npool = 2\n\n[train]\nlr = 0.5\nsteps = 2\nseed = 2\n{extra}",
        data.to_str().unwrap()
    );
    train(dir, name, &toml)
}

/// The NTK notebook's 1-D regression (M = 2, MSE, a zero_output network without biases).
fn regression_run(dir: &Path, name: &str) -> Run {
    let toml = "[data]\nkind = \"regression1d\"\nn_test = 5\n\n[model]\nkind = \"mlp\"\nhidden = [6]\nactivation = \"tanh\"\nbias = false\nzero_last = false\nalpha = 2.0\nzero_output = true\n\n[train]\nlr = 0.05\nsteps = 5\nloss = \"mse\"\n";
    train(dir, name, toml)
}

/// Uneven column blocks of M training points: one point, then two halves of the rest.
fn uneven(m: usize) -> Vec<(usize, usize)> {
    if m < 3 {
        return (0..m).map(|i| (i, i + 1)).collect();
    }
    let mid = 1 + (m - 1) / 2;
    vec![(0, 1), (1, mid), (mid, m)]
}

/// Column blocks computed apart against the one-process kernel: each block's Gram and `a` are
/// its columns of the whole (the slow, obvious reference: compute every column, then slice), and
/// the blocks assembled are the whole, per-step validation included.
fn check_column_blocks(name: &str, run: &Run, points: &str, r: &Request, layout: Layout, path: GramPath) {
    let states = run.load_all().unwrap();
    let pts = points.parse::<Rows>().unwrap().resolve(&run.dataset).unwrap();
    let opts = r.clone().path(path).layout(layout);
    let want = kernel::compute(run, &states, &pts, &opts, &|_, _| {}).unwrap();
    let (p, m, k) = (want.p, want.m, want.k);
    let (pp, n_a) = (layout.per_pair(k), want.a.len() / (m * k));
    let mut parts = Vec::new();
    for (c0, c1) in uneven(m) {
        let o = kernel::compute(run, &states, &pts, &opts.clone().columns(Some((c0, c1))), &|_, _| {}).unwrap();
        assert_eq!((o.p, o.m, o.k), (p, c1 - c0, k), "{name}: block {c0}..{c1}");
        let share = o.columns.as_ref().expect("a proper range is a share");
        assert_eq!((share.range, share.of), ((c0, c1), m), "{name}");
        assert!(o.single_machine.is_none(), "{name}: a share has no single machine");
        let cols = |g: &[f64], w: usize, rows: usize| -> Vec<f64> { (0..rows).flat_map(|q| g[(q * m + c0) * w..(q * m + c1) * w].to_vec()).collect() };
        let d = rel(&o.gram, &cols(&want.gram, pp, p));
        assert!(d <= 1e-13, "{name}: block {c0}..{c1}'s Gram differs from its columns of the whole by {d:e}");
        assert_eq!(o.a, cols(&want.a, k, n_a), "{name}: block {c0}..{c1}'s a");
        if let (Some(a), Some(b)) = (&o.per_step, &want.per_step) {
            assert!(rel(a, &cols(b, pp, b.len() / (m * pp))) <= 1e-13, "{name}: per-step Grams of {c0}..{c1}");
        }
        parts.push(o);
    }
    let got = kernel::engine::columns::assemble(parts).unwrap();
    assert!(got.columns.is_none());
    assert_same(name, &got, &want);
    // The whole range is no share: the same bits as no range at all.
    let whole = kernel::compute(run, &states, &pts, &opts.clone().columns(Some((0, m))), &|_, _| {}).unwrap();
    assert!(whole.columns.is_none() && bits(&whole.gram) == bits(&want.gram) && bits(&whole.machine) == bits(&want.machine), "{name}: columns 0..M");
}

#[test]
fn column_blocks_are_the_columns_of_the_whole_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let gd = train(d, "gd", &toy2d("[6, 5]", "relu", 9, 0.5, 10, 7));
    let epk = req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test);
    for layout in [Layout::Full, Layout::Diag, Layout::Trace] {
        check_column_blocks(&format!("mlp epk {layout}"), &gd, "test", &epk, layout, GramPath::Fast);
    }
    let cases: Vec<(&str, &str, Request)> = vec![
        ("mlp ntk", "test", req(KernelKind::Ntk, Rule::Gauss(1), Side::Test)),
        ("mlp dpk", "test", req(KernelKind::Dpk, Rule::Gauss(1), Side::Test)),
        ("mlp chen", "test", req(KernelKind::Chen, Rule::Gauss(1), Side::Test)),
        ("mlp epk train side", "train", req(KernelKind::Epk, Rule::Gauss(3), Side::Train)),
        ("mlp kprime per-step", "test", req(KernelKind::Kprime, Rule::Gauss(4), Side::Test).per_step(true)),
        ("mlp epk steps 2:8", "class-means", epk.clone().steps(Some((2, 8)))),
    ];
    for (name, points, r) in &cases {
        check_column_blocks(name, &gd, points, r, Layout::Full, GramPath::Fast);
    }
    let sgd = train(d, "sgd", &toy2d("[5]", "relu", 8, 0.3, 8, 6).replace("seed = 7\n", "seed = 7\noptimizer = \"sgd\"\nbatch_size = 7\n"));
    check_column_blocks("sgd epk", &sgd, "test", &epk, Layout::Full, GramPath::Fast);
    let reg = regression_run(d, "reg");
    check_column_blocks("mse epk", &reg, "test", &epk, Layout::Full, GramPath::Fast);
    check_column_blocks("mse ntk", &reg, "test", &req(KernelKind::Ntk, Rule::Gauss(1), Side::Test), Layout::Full, GramPath::Fast);

    // The CNN: its structured path (any rule) and the generic autodiff path.
    let cnn = cnn_run(d, "cnn", "");
    let gauss2 = req(KernelKind::Epk, Rule::Gauss(2), Side::Test);
    check_column_blocks("cnn fast gauss:2", &cnn, "test", &gauss2, Layout::Full, GramPath::Fast);
    check_column_blocks("cnn fast auto diag", &cnn, "test", &epk, Layout::Diag, GramPath::Fast);
    check_column_blocks("cnn generic gauss:2", &cnn, "test", &gauss2, Layout::Full, GramPath::Generic);
    check_column_blocks("cnn fast chen", &cnn, "test", &req(KernelKind::Chen, Rule::Gauss(1), Side::Test), Layout::Full, GramPath::Fast);

    // Momentum, Adam and weight decay: the backward recursion, with the replay over all M.
    let gauss3 = req(KernelKind::Epk, Rule::Gauss(3), Side::Test);
    let mom = train(d, "mom", &toy2d("[5]", "relu", 6, 0.05, 8, 6).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\nweight_decay = 0.01\n"));
    check_column_blocks("momentum + weight decay epk", &mom, "test", &gauss3, Layout::Full, GramPath::Fast);
    check_column_blocks("momentum + weight decay epk steps 2:5 diag", &mom, "test", &gauss3.clone().steps(Some((2, 5))), Layout::Diag, GramPath::Fast);
    check_column_blocks("momentum ntk", &mom, "test", &req(KernelKind::Ntk, Rule::Gauss(1), Side::Test), Layout::Full, GramPath::Fast);
    let adam = train(d, "adam", &toy2d("[5]", "tanh", 5, 0.05, 8, 6).replace("seed = 7\n", "seed = 7\noptimizer = \"adam\"\n"));
    check_column_blocks("adam epk auto", &adam, "test", &epk, Layout::Full, GramPath::Fast);
    let cnn_mom = cnn_run(d, "cnn-mom", "momentum = 0.5\n");
    check_column_blocks("cnn momentum (dense Jacobians)", &cnn_mom, "test", &gauss2, Layout::Full, GramPath::Fast);

    // Bad ranges are errors.
    let states = gd.load_all().unwrap();
    let pts = Rows::Test.resolve(&gd.dataset).unwrap();
    for bad in [(3, 3), (5, 2), (0, 31)] {
        let e = kernel::compute(&gd, &states, &pts, &epk.clone().columns(Some(bad)), &|_, _| {}).unwrap_err().to_string();
        assert!(e.contains("need 0 <= lo < hi <= M = 30"), "{e}");
    }
}

#[test]
fn column_tiles_equal_the_one_process_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("t");
    let run = train(d, "gd", &toy2d("[6, 5]", "relu", 9, 0.5, 10, 7));
    let epk = req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test);
    for layout in [Layout::Full, Layout::Diag] {
        let want = one_process(&run, "test", &epk, layout);
        for tiling in [Tiling::Grid { rows: 2, cols: 3, steps: 2 }, Tiling::Grid { rows: 1, cols: 4, steps: 1 }, Tiling::Grid { rows: 7, cols: 2, steps: 3 }] {
            let name = format!("epk {layout} {tiling}");
            let (plan, got) = tiled(&run, &out, "test", &epk, layout, tiling, 1 << 30);
            let Tiling::Grid { rows, cols, steps } = tiling else { unreachable!() };
            assert_eq!((plan.row_blocks, plan.col_blocks, plan.step_ranges.len(), plan.tiles.len()), (rows, cols, steps, rows * cols * steps), "{name}");
            assert_same(&name, &got, &want);
            if layout == Layout::Full {
                assert!(got.single_machine.is_some(), "{name}: Theorem 3.7's machine is recomputed");
            }
        }
    }
    // Per-step Grams, Chen, a sub-range of steps, the NTK, MSE.
    let cases: Vec<(&str, &Run, &str, Request, Tiling)> = vec![
        ("kprime per-step", &run, "test", req(KernelKind::Kprime, Rule::Gauss(4), Side::Test).per_step(true), Tiling::Grid { rows: 2, cols: 2, steps: 3 }),
        ("chen", &run, "test", req(KernelKind::Chen, Rule::Gauss(1), Side::Test), Tiling::Grid { rows: 2, cols: 3, steps: 2 }),
        ("epk steps 2:8", &run, "class-means", epk.clone().steps(Some((2, 8))), Tiling::Grid { rows: 3, cols: 2, steps: 3 }),
        ("ntk", &run, "test", req(KernelKind::Ntk, Rule::Gauss(1), Side::Test), Tiling::Grid { rows: 2, cols: 3, steps: 1 }),
    ];
    for (name, r_run, points, r, tiling) in cases {
        let want = one_process(r_run, points, &r, Layout::Full);
        let (_, got) = tiled(r_run, &out, points, &r, Layout::Full, tiling, 1 << 30);
        assert_same(name, &got, &want);
    }
    let reg = regression_run(d, "reg");
    let want = one_process(&reg, "test", &epk, Layout::Full);
    let (_, got) = tiled(&reg, &out, "test", &epk, Layout::Full, Tiling::Grid { rows: 2, cols: 2, steps: 2 }, 1 << 30);
    assert_same("mse", &got, &want);

    // The CNN, momentum and Adam (rows x columns; their steps are not separable).
    let gauss2 = req(KernelKind::Epk, Rule::Gauss(2), Side::Test);
    let cnn = cnn_run(d, "cnn", "");
    let want = one_process(&cnn, "test", &gauss2, Layout::Full);
    let (_, got) = tiled(&cnn, &out, "test", &gauss2, Layout::Full, Tiling::Grid { rows: 2, cols: 3, steps: 2 }, 1 << 30);
    assert_same("cnn", &got, &want);
    let mom = train(d, "mom", &toy2d("[5]", "relu", 6, 0.05, 8, 6).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\nweight_decay = 0.01\n"));
    let adam = train(d, "adam", &toy2d("[5]", "tanh", 5, 0.05, 8, 6).replace("seed = 7\n", "seed = 7\noptimizer = \"adam\"\n"));
    for (name, r_run, r) in [("momentum + weight decay", &mom, gauss2.clone()), ("adam", &adam, epk.clone()), ("momentum ntk", &mom, req(KernelKind::Ntk, Rule::Gauss(1), Side::Test))] {
        let want = one_process(r_run, "test", &r, Layout::Full);
        let (plan, got) = tiled(r_run, &out, "test", &r, Layout::Full, Tiling::Grid { rows: 2, cols: 3, steps: 1 }, 1 << 30);
        assert_eq!(plan.col_blocks, 3);
        assert_same(name, &got, &want);
        assert_eq!(got.records.len(), want.records.len());
    }
    let states = mom.load_all().unwrap();
    let e = tile::make_plan(&PlanInput { run: &mom, states: &states, points: "test", req: &gauss2, memory_budget: 1 << 30, tiling: Tiling::Grid { rows: 1, cols: 2, steps: 2 }, pilot: false })
        .unwrap_err()
        .to_string();
    assert!(e.contains("--tiles 1x2x2: step ranges need plain gradient steps") && e.contains("--tiles N or 1x2x1"), "{e}");
    let e = tile::make_plan(&PlanInput { run: &mom, states: &states, points: "test", req: &gauss2, memory_budget: 1 << 30, tiling: Tiling::Grid { rows: 1, cols: 25, steps: 1 }, pilot: false })
        .unwrap_err()
        .to_string();
    assert!(e.contains("25 column blocks for 24 training points"), "{e}");
}

#[test]
fn column_tiles_rerun_bit_identically_and_stream() {
    let dir = tempfile::tempdir().unwrap();
    let run = train(dir.path(), "gd", &toy2d("[6]", "relu", 8, 0.5, 10, 9));
    let epk = req(KernelKind::Epk, Rule::Auto(1e-12), Side::Test);
    let out = dir.path().join("t");
    let tiling = Tiling::Grid { rows: 3, cols: 4, steps: 2 };
    let (plan, first) = tiled(&run, &out, "test", &epk, Layout::Full, tiling, 1 << 30);
    // 30 training points in 4 even blocks of 8: 0..8, 8..16, 16..24, 24..30.
    assert_eq!((plan.block_cols, plan.tiles[2].cols, plan.tiles[7].cols), (8, [8, 16], [24, 30]));
    let contents: Vec<_> = plan.tiles.iter().map(|t| tile_content(&tile::tile_path(&out, t.index))).collect();
    let (again, second) = tiled(&run, &out, "test", &epk, Layout::Full, tiling, 1 << 30);
    assert_eq!(plan.plan_id, again.plan_id);
    for t in &plan.tiles {
        assert!(tile_content(&tile::tile_path(&out, t.index)) == contents[t.index], "tile {} differs on a rerun", t.index);
    }
    assert_eq!(bits(&first.gram), bits(&second.gram));
    assert_eq!(bits(&first.machine), bits(&second.machine));
    let recs = |o: &KernelOutput| o.records.iter().map(|r| (r.max_abs_error.to_bits(), r.mean_abs_error.to_bits())).collect::<Vec<_>>();
    assert_eq!(recs(&first), recs(&second), "the exactness records rerun bit-identically");
    // The streaming reader assembles the column blocks into the merged Gram's bits.
    let g = tile::TiledGram::open(&out).unwrap();
    let mut rows = Vec::new();
    for b in 0..g.row_blocks().len() {
        rows.extend(g.row_block(b).unwrap());
    }
    assert_eq!(bits(&rows), bits(&first.gram));
    let (m, k) = (first.m, first.k);
    let c21 = g.class_block(2, 1).unwrap();
    assert_eq!(bits(&c21), bits(&(0..first.p * m).map(|pm| first.gram[pm * k * k + 2 * k + 1]).collect::<Vec<_>>()));
}

#[test]
fn column_blocks_grow_when_a_tile_of_one_row_does_not_fit() {
    // M = 3000 training points over 60 steps: a and the loss gradients alone ([N, M, K] each)
    // are 8.6 MB, so small budgets need column blocks even for a single row point.
    let dir = tempfile::tempdir().unwrap();
    let gd = train(dir.path(), "gd", &toy2d("[8]", "relu", 60, 0.3, 1000, 12));
    let mom = train(dir.path(), "mom", &toy2d("[8]", "relu", 60, 0.05, 1000, 12).replace("seed = 7\n", "seed = 7\nmomentum = 0.9\n"));
    let epk = req(KernelKind::Epk, Rule::Gauss(2), Side::Test);
    let plan_with = |run: &Run, budget: u64, tiling: Tiling| {
        let states = run.load_all().unwrap();
        tile::make_plan(&PlanInput { run, states: &states, points: "test", req: &epk, memory_budget: budget, tiling, pilot: false })
    };
    let roomy = plan_with(&gd, 1 << 30, Tiling::Count(2)).unwrap();
    assert_eq!((roomy.row_blocks, roomy.col_blocks), (2, 1));
    let mut grown = false;
    for mib in [16u64, 12, 10, 8] {
        let budget = mib << 20;
        for (name, run) in [("gd", &gd), ("momentum", &mom)] {
            let Ok(plan) = plan_with(run, budget, Tiling::Count(2)) else { continue };
            let peak = plan.tiles.iter().map(|t| t.estimated_peak_bytes).max().unwrap();
            eprintln!("{name} --memory {mib}M: {} row blocks x {} column blocks; tile peak {:.2} MiB", plan.row_blocks, plan.col_blocks, peak as f64 / (1u64 << 20) as f64);
            assert!(peak <= budget, "{plan}");
            if plan.col_blocks > 1 {
                assert!(plan.split.contains("column blocks of") && plan.split.contains("so that a tile of one row point fits"), "{}", plan.split);
                grown = true;
            }
        }
    }
    assert!(grown, "no budget made the column blocks grow");
    // The estimate of a momentum tile holds the recursion's work (H and J̄ per row, the replay's
    // per-step vectors) on top of a plain tile's, less the plain path's accumulator scratch
    // (the recursion contracts without it).
    let (g, m) = (plan_with(&gd, 1 << 30, Tiling::Count(1)).unwrap(), plan_with(&mom, 1 << 30, Tiling::Count(1)).unwrap());
    let w = gd.manifest.num_params as u64;
    let scratch = 12 * pathkernel::kernel::gram::scratch_bytes_per_point(&[2, 8, 3], gd.dataset.n_train(), 3) as u64;
    assert!(m.tiles[0].estimated_peak_bytes >= g.tiles[0].estimated_peak_bytes - scratch + 60 * w * 8 + 12 * 2 * 3 * w * 8, "{} vs {} (scratch {scratch})", m.tiles[0].estimated_peak_bytes, g.tiles[0].estimated_peak_bytes);
    // Explicit column blocks shrink each tile's estimate.
    let c1 = plan_with(&gd, 1 << 30, Tiling::Grid { rows: 1, cols: 1, steps: 1 }).unwrap();
    let c4 = plan_with(&gd, 1 << 30, Tiling::Grid { rows: 1, cols: 4, steps: 1 }).unwrap();
    assert!(c4.tiles.iter().all(|t| t.estimated_peak_bytes < c1.tiles[0].estimated_peak_bytes), "{c4}");
    assert!(c4.tiles.iter().all(|t| t.output_bytes * 3 < c1.tiles[0].output_bytes), "{c4}");
    let e = plan_with(&gd, 1 << 10, Tiling::Count(1)).unwrap_err().to_string();
    assert!(e.contains("one tile of one row point and 1 training points") && e.contains("over the budget"), "{e}");
}

// ------------------------------------------------------------------------------------------
// Through the binary.

fn pk(args: &[&str], cwd: &Path) -> Output {
    Command::new(bin()).args(args).current_dir(cwd).output().unwrap()
}

fn ok(args: &[&str], cwd: &Path) -> String {
    let o = pk(args, cwd);
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn fails(args: &[&str], cwd: &Path, needle: &str) {
    let o = pk(args, cwd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("error: ") && !err.contains("panicked"), "{args:?}: {err}");
}

/// Every file under `dir` with its bytes (a snapshot to check that nothing changed).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
                out.push((p, Vec::new()));
            } else {
                let b = std::fs::read(&p).unwrap();
                out.push((p, b));
            }
        }
    }
    out.sort();
    out
}

fn train_bin(d: &Path, name: &str, toml: &str) {
    std::fs::write(d.join(format!("{name}.toml")), toml).unwrap();
    ok(&["train", "-q", "--config", &format!("{name}.toml"), "--out", name], d);
}

#[test]
fn cli_tiles_merge_to_the_one_process_output_and_rerun_bit_identically() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train_bin(d, "run", &toy2d("[6, 4]", "relu", 8, 0.5, 10, 9));
    for blocks in ["full", "diag"] {
        let one = format!("one-{blocks}");
        let tiles = format!("tiles-{blocks}");
        ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--layout", blocks, "--out", &one], d);
        let plan_out = ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--blocks", blocks, "--tiles", "2x2", "--out", &tiles], d);
        assert!(plan_out.contains("4 tiles = 2 row blocks") && plan_out.contains("2 step ranges"), "{plan_out}");
        assert!(!d.join(&tiles).join("gram.safetensors").exists(), "planning computes nothing");
        let plan = Plan::read(&d.join(&tiles)).unwrap();
        assert_eq!(plan.tiles.len(), 4);
        assert!(plan.run_dir.is_absolute());
        let st = ok(&["tile", "status", &tiles], d);
        assert!(st.contains("0 of 4 tiles complete") && st.contains("4 missing"), "{st}");
        for i in 0..4 {
            let o = ok(&["tile", "run", &tiles, "--index", &i.to_string(), "-q"], d);
            assert!(o.contains(&format!("tile {i}: computed")), "{o}");
        }
        let again = ok(&["tile", "run", &tiles, "--all", "-q"], d);
        assert_eq!(again.matches("already complete").count(), 4, "{again}");
        ok(&["tile", "merge", &tiles], d);
        let merged = format!("{tiles}/merged");
        let cmp = ok(&["tile", "compare", &merged, &one, "--tol", "1e-13"], d);
        assert!(cmp.contains("gram.safetensors:gram") && cmp.contains("max relative difference"), "{cmp}");
        let got = pathkernel::tile::compare_dirs(&d.join(&merged), &d.join(&one)).unwrap();
        for diff in &got {
            assert!(diff.rel <= 1e-13, "{blocks}: {diff:?}");
        }
        for f in ["exactness.json", "steps.parquet", "predictions.parquet"] {
            assert!(d.join(&merged).join(f).exists());
        }
        let ex: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join(&merged).join("exactness.json")).unwrap()).unwrap();
        assert_eq!(ex["layout"], blocks);
        assert!(ex["max_abs_error"].as_f64().unwrap() < 1e-11);

        // A rerun of the same plan from scratch: bit-identical outputs.
        let before: Vec<Vec<u8>> = ["gram.safetensors", "predictions.parquet", "steps.parquet"].iter().map(|f| std::fs::read(d.join(&merged).join(f)).unwrap()).collect();
        std::fs::remove_dir_all(d.join(&tiles).join("tiles")).unwrap();
        std::fs::create_dir(d.join(&tiles).join("tiles")).unwrap();
        fails(&["tile", "merge", &tiles], d, "4 of 4 tiles are missing");
        ok(&["tile", "run", &tiles, "--all", "-q"], d);
        fails(&["tile", "merge", &tiles], d, "already exists; choose another --out or pass --force");
        ok(&["tile", "merge", &tiles, "--force"], d);
        let after: Vec<Vec<u8>> = ["gram.safetensors", "predictions.parquet", "steps.parquet"].iter().map(|f| std::fs::read(d.join(&merged).join(f)).unwrap()).collect();
        assert!(before == after, "{blocks}: the rerun's outputs differ");
        let cmp = ok(&["tile", "compare", &merged, &merged], d);
        assert!(cmp.contains("all arrays bit-identical"), "{cmp}");
    }
    // A different request does not pass compare at the default tolerance.
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--quadrature", "gauss:2", "--out", "gauss2"], d);
    fails(&["tile", "compare", "gauss2", "one-full"], d, "relative (tolerance 1e-13)");
}

/// A merged kernel whose adaptive rule missed its tolerance says so, as `pathkernel kernel`
/// does: one warning line on stderr, or with `--strict` exit 2 with the merged outputs kept; a
/// met tolerance prints nothing there.
#[test]
fn cli_tile_merge_says_when_the_rule_missed_its_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train_bin(d, "run", &toy2d("[6]", "relu", 6, 0.5, 6, 5));
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--quadrature", "auto:1e-300", "--tiles", "2x2", "--out", "miss"], d);
    ok(&["tile", "run", "miss", "--all", "-q"], d);
    let o = pk(&["tile", "merge", "miss"], d);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.starts_with("warning: the epk kernel's rule auto:1e-300 missed its tolerance") && err.trim().lines().count() == 1, "{err}");
    fails(&["tile", "merge", "miss", "--force", "--strict"], d, "missed its tolerance: max |machine - network|");
    assert!(d.join("miss/merged/exactness.json").is_file());
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--tiles", "2x2", "--out", "met"], d);
    ok(&["tile", "run", "met", "--all", "-q"], d);
    let o = pk(&["tile", "merge", "met", "--strict"], d);
    assert!(o.status.success() && o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn cli_tile_faults_are_one_line_errors_that_overwrite_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train_bin(d, "run", &toy2d("[6]", "relu", 6, 0.5, 8, 8));
    train_bin(d, "other", &toy2d("[6]", "relu", 6, 0.4, 8, 8));
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--tiles", "2x2", "--out", "job"], d);
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--tiles", "4x1", "--out", "job4"], d);
    ok(&["kernel", "-q", "--run", "other", "--kind", "epk", "--tiles", "2x2", "--out", "jobo"], d);
    for job in ["job", "job4", "jobo"] {
        ok(&["tile", "run", job, "--all", "-q"], d);
    }
    let tile = |job: &str, i: usize| d.join(job).join("tiles").join(format!("tile-{i:06}.safetensors"));
    let check_untouched = |needle: &str, args: &[&str]| {
        let before = snapshot(d);
        fails(args, d, needle);
        assert!(snapshot(d) == before, "{args:?} changed the directory");
    };

    // Planning errors.
    check_untouched("--tiles `0`", &["kernel", "--run", "run", "--tiles", "0", "--out", "x"]);
    check_untouched("12 row blocks for 8 row points", &["kernel", "--run", "run", "--tiles", "12x1", "--out", "x"]);
    check_untouched("7 step ranges for 6 steps", &["kernel", "--run", "run", "--tiles", "1x7", "--out", "x"]);
    check_untouched("the NTK is one kernel at one state", &["kernel", "--run", "run", "--kind", "ntk", "--tiles", "2x2", "--out", "x"]);
    check_untouched("already exists", &["kernel", "--run", "run", "--tiles", "2", "--out", "job"]);
    // Planning the same job again leaves the plan and its tiles alone.
    let before = snapshot(d);
    let o = ok(&["kernel", "--run", "run", "--kind", "epk", "--tiles", "2x2", "--out", "job"], d);
    assert!(o.contains("already holds this plan"), "{o}");
    assert!(snapshot(d) == before, "re-planning changed the directory");
    check_untouched("--index 4: the plan", &["tile", "run", "job", "--index", "4"]);
    check_untouched("no plan here", &["tile", "run", "run", "--index", "0"]);

    // A missing tile at merge.
    let saved = std::fs::read(tile("job", 3)).unwrap();
    let saved_content = tile_content(&tile("job", 3));
    std::fs::remove_file(tile("job", 3)).unwrap();
    check_untouched("1 of 4 tiles are missing (index 3)", &["tile", "merge", "job"]);
    // Truncated.
    std::fs::write(tile("job", 3), &saved[..saved.len() - 100]).unwrap();
    check_untouched("truncated or extended", &["tile", "merge", "job"]);
    std::fs::write(tile("job", 3), &saved[..5]).unwrap();
    check_untouched("truncated", &["tile", "merge", "job"]);
    // Corrupted: one bit of the data flipped (header intact): the checksum catches it.
    let mut bad = saved.clone();
    let at = bad.len() - 200;
    bad[at] ^= 0x10;
    std::fs::write(tile("job", 3), &bad).unwrap();
    check_untouched("corrupted: the data's CRC-32", &["tile", "merge", "job"]);
    // A damaged tile is recomputed by `tile run` (and only that one).
    let o = pk(&["tile", "run", "job", "--all", "-q"], d);
    assert!(o.status.success());
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(out.matches("already complete").count(), 3, "{out}");
    assert!(out.contains("tile 3: computed") && err.contains("replaced a damaged file (corrupted"), "{out} {err}");
    assert!(tile_content(&tile("job", 3)) == saved_content, "the recomputed tile is bit-identical but for its seconds");

    // A tile of another plan (same run) and of another run.
    std::fs::copy(tile("job4", 1), tile("job", 1)).unwrap();
    check_untouched("belongs to plan", &["tile", "merge", "job"]);
    check_untouched("belongs to plan", &["tile", "run", "job", "--index", "1"]);
    std::fs::copy(tile("jobo", 1), tile("job", 1)).unwrap();
    check_untouched("belongs to run", &["tile", "merge", "job"]);
    check_untouched("belongs to run", &["tile", "run", "job", "--index", "1"]);
    // A tile of this plan under another index.
    std::fs::copy(tile("job", 2), tile("job", 1)).unwrap();
    check_untouched("is tile 2 (rows", &["tile", "merge", "job"]);
    std::fs::remove_file(tile("job", 1)).unwrap();
    ok(&["tile", "run", "job", "--index", "1", "-q"], d);

    // An edited plan.
    let plan_path = d.join("job").join("plan.json");
    let text = std::fs::read_to_string(&plan_path).unwrap();
    std::fs::write(&plan_path, text.replacen("\"auto:1e-12\"", "\"auto:1e-10\"", 1)).unwrap();
    check_untouched("does not match its contents", &["tile", "merge", "job"]);
    check_untouched("does not match its contents", &["tile", "run", "job", "--index", "0"]);
    std::fs::write(&plan_path, text.replacen("\"block_rows\": 4", "\"block_rows\": 3", 1)).unwrap();
    check_untouched("does not match the plan's row blocks", &["tile", "merge", "job"]);
    std::fs::write(&plan_path, &text).unwrap();
    // The run changed under the plan (retrained in place with another config).
    std::fs::rename(d.join("run"), d.join("run.saved")).unwrap();
    std::fs::rename(d.join("other"), d.join("run")).unwrap();
    std::fs::remove_file(tile("job", 0)).unwrap();
    check_untouched("but the plan was made for run", &["tile", "run", "job", "--index", "0"]);
    std::fs::rename(d.join("run"), d.join("other")).unwrap();
    std::fs::rename(d.join("run.saved"), d.join("run")).unwrap();
    ok(&["tile", "run", "job", "--index", "0", "-q"], d);

    // Leftover temporary files of killed writes are ignored; the merge then succeeds.
    std::fs::write(d.join("job/tiles/.tile-000002.safetensors.tmp-99999"), &saved[..1000]).unwrap();
    let st = ok(&["tile", "status", "job", "--verify"], d);
    assert!(st.contains("4 of 4 tiles complete (checksums verified)"), "{st}");
    ok(&["tile", "merge", "job"], d);
    assert!(d.join("job/merged/gram.safetensors").exists() && !d.join("job/merged.partial").exists());
}

#[test]
fn cli_a_killed_tile_leaves_no_valid_looking_file_and_a_rerun_does_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train_bin(d, "run", &toy2d("[16, 16]", "tanh", 30, 0.3, 60, 4));
    // 180 training rows as row points, 3 tiles of 60 rows.
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--points", "train", "--quadrature", "gauss:8", "--tiles", "3", "--out", "job"], d);
    ok(&["tile", "run", "job", "--index", "0", "-q"], d);
    let t0 = std::fs::read(d.join("job/tiles/tile-000000.safetensors")).unwrap();
    for delay_ms in [30u64, 150, 400] {
        let mut child = Command::new(bin()).args(["tile", "run", "job", "--index", "1", "-q"]).current_dir(d).spawn().unwrap();
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(delay_ms) && child.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().ok();
        child.wait().unwrap();
        let st = ok(&["tile", "status", "job", "--verify"], d);
        assert!(!st.contains("tile 1:"), "a killed tile run left a damaged tile: {st}");
        if d.join("job/tiles/tile-000001.safetensors").exists() {
            break; // it finished before the kill: complete and valid
        }
    }
    let o = ok(&["tile", "run", "job", "--all", "-q"], d);
    assert!(o.contains("tile 0: already complete"), "{o}");
    assert!(o.contains("tile 2: computed"), "{o}");
    assert!(std::fs::read(d.join("job/tiles/tile-000000.safetensors")).unwrap() == t0, "complete tiles are not rewritten");
    ok(&["tile", "merge", "job"], d);
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--points", "train", "--quadrature", "gauss:8", "--out", "one"], d);
    ok(&["tile", "compare", "job/merged", "one"], d);
}

#[cfg(unix)]
#[test]
fn cli_slurm_scripts_and_submission_with_a_stand_in_sbatch() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train_bin(d, "run", &toy2d("[6]", "relu", 6, 0.5, 8, 8));
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--tiles", "2x2", "--out", "job"], d);
    let out = std::fs::canonicalize(d.join("job")).unwrap();
    let o = ok(&["tile", "slurm", "job", "--max-parallel", "2", "--partition", "debug", "--time", "10:00", "--mem", "1G", "--sbatch=--account=proj"], d);
    assert!(o.contains("--array=0-3%2"), "{o}");
    let array = std::fs::read_to_string(out.join("slurm/array.sbatch")).unwrap();
    let binary = std::fs::canonicalize(bin()).unwrap();
    for line in [
        "#SBATCH --array=0-3%2".to_string(),
        "#SBATCH --partition=debug".into(),
        "#SBATCH --time=10:00".into(),
        "#SBATCH --mem=1G".into(),
        "#SBATCH --account=proj".into(),
        format!("#SBATCH --output={}/slurm/logs/tile-%a.out", out.display()),
        format!("exec '{}' tile run '{}' --index \"$SLURM_ARRAY_TASK_ID\" --quiet", binary.display(), out.display()),
    ] {
        assert!(array.lines().any(|l| l == line), "missing `{line}` in:\n{array}");
    }
    let merge = std::fs::read_to_string(out.join("slurm/merge.sbatch")).unwrap();
    assert!(merge.contains(&format!("exec '{}' tile merge '{}'", binary.display(), out.display())), "{merge}");
    assert!(out.join("slurm/logs").is_dir());
    fails(&["tile", "slurm", "job", "--partition", "a b"], d, "--partition `a b`");
    fails(&["tile", "slurm", "job", "--max-parallel", "0"], d, "--max-parallel 0");

    // A stand-in sbatch that logs its arguments and answers like `sbatch --parsable`.
    let fake = d.join("bin");
    std::fs::create_dir(&fake).unwrap();
    let log = d.join("sbatch.log");
    let script = format!(
        "#!/bin/sh\necho \"$@\" >> '{}'\nn=$(wc -l < '{}')\nif [ \"$FAKE_SBATCH_FAIL\" = 1 ]; then echo 'sbatch: error: invalid partition' >&2; exit 1; fi\necho \"$((4240 + n));cluster\"\n",
        log.display(),
        log.display()
    );
    std::fs::write(fake.join("sbatch"), script).unwrap();
    std::fs::set_permissions(fake.join("sbatch"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap_or_default());
    let submit = |env_fail: bool| Command::new(bin()).args(["tile", "slurm", "job", "--submit"]).env("PATH", &path).env("FAKE_SBATCH_FAIL", if env_fail { "1" } else { "0" }).current_dir(d).output().unwrap();
    let o = submit(false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("submitted array job 4241 (4 tasks) and merge job 4242"), "{stdout}");
    let calls = std::fs::read_to_string(&log).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls[0], format!("--parsable {}", out.join("slurm/array.sbatch").display()));
    assert_eq!(calls[1], format!("--parsable --dependency=afterok:4241 --kill-on-invalid-dep=yes {}", out.join("slurm/merge.sbatch").display()));
    let jobs: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("slurm/jobs.json")).unwrap()).unwrap();
    assert_eq!((jobs["array_job"].as_str(), jobs["merge_job"].as_str()), (Some("4241"), Some("4242")));
    let o = submit(true);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("invalid partition") && err.trim().lines().count() == 1, "{err}");

    // After some tiles are done, the array covers only the rest; with all done, only the merge.
    ok(&["tile", "run", "job", "--index", "0", "-q"], d);
    ok(&["tile", "run", "job", "--index", "2", "-q"], d);
    let o = ok(&["tile", "slurm", "job"], d);
    assert!(o.contains("--array=1,3)"), "{o}");
    ok(&["tile", "run", "job", "--all", "-q"], d);
    let o = Command::new(bin()).args(["tile", "slurm", "job", "--submit"]).env("PATH", &path).current_dir(d).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("every tile is complete: submitted merge job"), "{stdout}");
}

#[test]
fn cli_column_tiles_merge_to_the_one_process_output_with_the_same_exactness_report() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    train_bin(d, "run", &toy2d("[6, 4]", "relu", 8, 0.5, 10, 9));
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--out", "one"], d);
    let plan_out = ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--tiles", "2x3x2", "--out", "cols"], d);
    assert!(plan_out.contains("12 tiles = 2 row blocks (5 points each) x 3 column blocks (10 training points each) x 2 step ranges"), "{plan_out}");
    let plan = Plan::read(&d.join("cols")).unwrap();
    assert_eq!((plan.col_blocks, plan.tiles[4].cols, plan.tiles[4].steps), (3, [20, 30], [0, 4]));
    ok(&["tile", "run", "cols", "--all", "-q"], d);
    ok(&["tile", "merge", "cols"], d);
    for diff in pathkernel::tile::compare_dirs(&d.join("cols/merged"), &d.join("one")).unwrap() {
        assert!(diff.rel <= 1e-13, "{diff:?}");
    }
    ok(&["tile", "compare", "cols/merged", "one", "--tol", "1e-13"], d);
    // The exactness report and the per-step validation equal the one-process ones.
    let json = |p: &str| -> serde_json::Value { serde_json::from_slice(&std::fs::read(d.join(p)).unwrap()).unwrap() };
    let (got, want) = (json("cols/merged/exactness.json"), json("one/exactness.json"));
    for key in ["kind", "side", "quadrature", "shape", "steps", "evaluations_per_step", "unconverged_pieces", "tolerance", "tolerance_met", "layout", "form"] {
        assert_eq!(got[key], want[key], "exactness.json `{key}`");
    }
    for key in ["max_abs_error", "mean_abs_error", "single_machine_max_abs_error"] {
        let (a, b) = (got[key].as_f64().unwrap(), want[key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-14, "exactness.json `{key}`: {a:e} vs {b:e}");
    }
    let (ts, tw) = (pathkernel::io::Table::read_parquet(&d.join("cols/merged/steps.parquet")).unwrap(), pathkernel::io::Table::read_parquet(&d.join("one/steps.parquet")).unwrap());
    assert_eq!(ts.columns.iter().map(|c| &c.0).collect::<Vec<_>>(), tw.columns.iter().map(|c| &c.0).collect::<Vec<_>>());
    for (col, _) in &tw.columns {
        if let (Some(a), Some(b)) = (ts.f64(col), tw.f64(col)) {
            assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-14 || (x.is_nan() && y.is_nan())), "steps.parquet `{col}`: {a:?} vs {b:?}");
        }
    }
    // A rerun of the plan from scratch is byte-identical.
    let files = ["gram.safetensors", "predictions.parquet", "steps.parquet"];
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(d.join("cols/merged").join(f)).unwrap()).collect();
    std::fs::remove_dir_all(d.join("cols/tiles")).unwrap();
    std::fs::create_dir(d.join("cols/tiles")).unwrap();
    ok(&["tile", "run", "cols", "--all", "-q"], d);
    ok(&["tile", "merge", "cols", "--force"], d);
    let after: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(d.join("cols/merged").join(f)).unwrap()).collect();
    assert!(before == after, "the rerun's outputs differ");

    // Faults: one line, exit 2, nothing changed.
    ok(&["kernel", "-q", "--run", "run", "--kind", "epk", "--tiles", "2x2x1", "--out", "other"], d);
    ok(&["tile", "run", "other", "--all", "-q"], d);
    let tile = |job: &str, i: usize| d.join(job).join("tiles").join(format!("tile-{i:06}.safetensors"));
    let check_untouched = |needle: &str, args: &[&str]| {
        let before = snapshot(d);
        fails(args, d, needle);
        assert!(snapshot(d) == before, "{args:?} changed the directory");
    };
    let saved = std::fs::read(tile("cols", 5)).unwrap();
    std::fs::copy(tile("other", 1), tile("cols", 5)).unwrap();
    check_untouched("belongs to plan", &["tile", "merge", "cols", "--force"]);
    check_untouched("belongs to plan", &["tile", "run", "cols", "--index", "5"]);
    std::fs::copy(tile("cols", 4), tile("cols", 5)).unwrap();
    check_untouched("is tile 4 (rows 0..5, columns 20..30, steps 0..4)", &["tile", "merge", "cols", "--force"]);
    std::fs::remove_file(tile("cols", 5)).unwrap();
    check_untouched("1 of 12 tiles are missing (index 5)", &["tile", "merge", "cols", "--force"]);
    std::fs::write(tile("cols", 5), &saved).unwrap();
    check_untouched("31 column blocks for 30 training points", &["kernel", "--run", "run", "--tiles", "1x31x1", "--out", "x"]);
    check_untouched("expected N, RxS", &["kernel", "--run", "run", "--tiles", "1x2x2x2", "--out", "x"]);
    ok(&["tile", "merge", "cols", "--force"], d);
}
