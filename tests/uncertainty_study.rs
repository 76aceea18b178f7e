//! The uncertainty study (`[uncertainty]` in a study file) end to end on small MNIST-format files
//! written here: selection, every method in every setting, the report re-scored from its parquet
//! files, reruns from the cache byte for byte, resuming after a lost stage; and the in-memory
//! kernel GP against the `gp` report on kernel directories read back from disk.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pathkernel::api::{Gram, Trained};
use pathkernel::gp::GpParams;
use pathkernel::io::{Column, SafeFile, Table};
use pathkernel::kernel::{self, KernelKind, Layout, Outputs, Points, Request, Rows, Rule, Side};
use pathkernel::report::{self, GpTargets};
use pathkernel::study::{self, StudyOptions};
use pathkernel::train::{train_to_dir, RunConfig, TrainOptions};
use pathkernel::trajectory::Run;
use pathkernel::uncertainty::kernel_gp::{self, KernelGp, KernelGpSpec, TrainGram};
use pathkernel::uncertainty::metrics;

fn study_toml(mnist: &Path) -> String {
    format!(
        r#"
name = "uq-tiny"
description = "a tiny uncertainty study"

[data]
kind = "mnist"
path = "{}"
per_class = 8
val_per_class = 4
n_test = 40
normalize = false

[model]
kind = "mlp"
hidden = [8]

[train]
lr = 0.5
steps = 4
seed = 0

[uncertainty]
lrs = [0.5, 1.0]
steps = [4, 8]
ensemble_seeds = [0, 1]
disagreement_images = 6
ablations = ["netmean", "sym"]
kernel_gps = ["epk", "ntk", "window:2"]
fsl = ["class-diagonal"]
fsl_kxk = ["class-diagonal", "full"]
fsl_kxk_kernels = ["ntk", "window:2"]
notes = "Author's notes."

[uncertainty.benchmark]
angles = [0, 90]
shift_points = 20
noise_points = 20
mc_samples = 64
"#,
        mnist.display()
    )
}

fn run_study(file: &Path, out: &Path, cache: &Path) -> study::StudySummary {
    let opts = StudyOptions { out: Some(out.to_path_buf()), cache: Some(cache.to_path_buf()), base_dir: PathBuf::from("."), progress: false, command: "test".into() };
    study::run(file, &opts).unwrap()
}

fn strings(t: &Table, name: &str) -> Vec<String> {
    match &t.columns.iter().find(|(n, _)| n == name).unwrap().1 {
        Column::Str(v) => v.clone(),
        _ => panic!("{name} is not a string column"),
    }
}

/// Every file under `dir` (relative path → bytes).
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn uncertainty_study_end_to_end_reruns_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let mnist = tmp.path().join("mnist");
    std::fs::create_dir(&mnist).unwrap();
    common::write_square_mnist(&mnist, 400, 60);
    let file = tmp.path().join("uq.toml");
    std::fs::write(&file, study_toml(&mnist)).unwrap();
    let (out, cache) = (tmp.path().join("report"), tmp.path().join("cache"));
    let first = run_study(&file, &out, &cache);
    assert!(!first.reused_run);

    // The selection: 2 rates × 2 step counts, the first best validation accuracy chosen.
    let sel: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("selection.json")).unwrap()).unwrap();
    let rows = sel["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let best = rows.iter().map(|r| r["val_accuracy"].as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
    let chosen = rows.iter().find(|r| r["val_accuracy"].as_f64().unwrap() == best).unwrap();
    assert_eq!((sel["lr"].as_f64(), sel["steps"].as_u64()), (chosen["lr"].as_f64(), chosen["steps"].as_u64()));
    if sel["steps"].as_u64() == Some(4) {
        assert_eq!(sel["prefix_identical"].as_bool(), Some(true), "the chosen 4-step run is the selection run's prefix");
    }

    // Every method in every setting; the metrics re-scored from the predictions.
    let p = Table::read_parquet(&out.join("predictions.parquet")).unwrap();
    let m = Table::read_parquet(&out.join("metrics.parquet")).unwrap();
    let (pm, ps) = (strings(&p, "method"), strings(&p, "setting"));
    let mut methods: Vec<&str> = pm.iter().map(String::as_str).collect();
    methods.dedup();
    for want in [
        "map",
        "temperature",
        "laplace",
        "ensemble",
        "epk-gp",
        "ntk-gp",
        "epk-gp-netmean",
        "ntk-gp-netmean",
        "window2-gp",
        "window2-gp-netmean",
        "fsl-epk-diag",
        "fsl-window2-diag-Ts",
        "fsl-ntk-kxk-diag",
        "fsl-ntk-kxk-full-mc",
        "fsl-window2-kxk-full-grid",
        "fsl-window2-kxk-diag-Ts",
    ] {
        assert!(methods.contains(&want), "{want} missing from {methods:?}");
    }
    let k = 10;
    let probs: Vec<&[f64]> = (0..k).map(|c| p.f64(&format!("p{c}")).unwrap()).collect();
    let label = p.i64("label").unwrap();
    let score = p.f64("ood_score").unwrap();
    let rows_of = |method: &str, setting: &str| -> Vec<usize> { (0..pm.len()).filter(|&i| pm[i] == method && ps[i] == setting).collect() };
    let probs_of = |idx: &[usize]| -> Vec<f64> { idx.iter().flat_map(|&i| (0..k).map(|c| probs[c][i]).collect::<Vec<_>>()).collect() };
    let (mm, ms, mk) = (strings(&m, "method"), strings(&m, "setting"), strings(&m, "metric"));
    let value = m.f64("value").unwrap();
    for i in 0..mm.len() {
        let idx = rows_of(&mm[i], &ms[i]);
        let pr = probs_of(&idx);
        let y: Vec<usize> = idx.iter().map(|&j| label[j] as usize).collect();
        let clean = rows_of(&mm[i], "clean");
        let want = match mk[i].as_str() {
            "accuracy" => metrics::accuracy(&pr, &y, k).unwrap(),
            "nll" => metrics::nll(&pr, &y, k).unwrap(),
            "brier" => metrics::brier(&pr, &y, k).unwrap(),
            "ece" => metrics::ece(&pr, &y, k, 15).unwrap(),
            "auroc_msp" => metrics::auroc(&metrics::max_prob(&probs_of(&clean), k).unwrap(), &metrics::max_prob(&pr, k).unwrap()).unwrap(),
            "auroc_variance" => metrics::auroc(&idx.iter().map(|&j| score[j]).collect::<Vec<_>>(), &clean.iter().map(|&j| score[j]).collect::<Vec<_>>()).unwrap(),
            other => panic!("unknown metric {other}"),
        };
        assert_eq!(value[i], want, "{} / {} / {}", mm[i], ms[i], mk[i]);
    }
    // Rotating by 0° changes nothing: every method's `rot-0` is its `clean` on the first 20
    // images (the GPs' Monte-Carlo draws use the same stream per point; their Grams are the
    // same rows computed in a smaller batch).
    for method in &methods {
        let (a, b) = (probs_of(&rows_of(method, "rot-0")), probs_of(&rows_of(method, "clean")));
        assert_eq!(a.len(), 20 * k);
        let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(err <= 1e-12, "{method}: rot-0 vs clean {err:e}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for needle in ["## Selection of the learning rate", "## Fitted hyper-parameters", "## Exactness of the Grams used", "### `rot-90`", "## Where the EPK-GP wins", "EPK rows"] {
        assert!(summary.contains(needle), "summary lacks {needle}");
    }
    for chart in ["reliability_clean.png", "reliability_rot-90.png", "nll_vs_angle.png", "ece_vs_angle.png", "accuracy_vs_angle.png", "ood_auroc.png", "disagreement.png"] {
        assert!(out.join("charts").join(chart).is_file(), "{chart}");
    }
    // Each setting's rows are their own kernel computation (the study holds one setting's rows
    // at a time), and so are the validation split's.
    let timings = std::fs::read_to_string(out.join("timings.md")).unwrap();
    for fam in ["EPK", "NTK", "WINDOW2"] {
        for (setting, n) in [("val", 40), ("clean", 40), ("rot-0", 20), ("rot-90", 20), ("noise", 20), ("inverted", 20)] {
            let stage = format!("| {fam} Gram at `{setting}` ({n} points) |");
            assert_eq!(timings.matches(&stage).count(), 1, "{stage} in\n{timings}");
        }
    }
    assert!(!timings.contains("at every setting"), "{timings}");
    // Cross-class fits only where asked, with their K × K covariances in the cache, which
    // carry cross-class terms; the fits report both factorisations' agreement.
    assert!(!methods.iter().any(|m| m.starts_with("fsl-epk-kxk")), "{methods:?}");
    let cached = pathkernel::io::SafeFile::open(&cache.join("ntk-gp").join("clean.safetensors")).unwrap();
    let cov = cached.f64("fsl-ntk-kxk-diag/cov", Some(&[40, k, k])).unwrap().1;
    let off = (0..40).flat_map(|q| (0..k).flat_map(move |a| (0..k).filter(move |&b| b != a).map(move |b| (q * k + a) * k + b))).map(|i| cov[i].abs()).fold(0.0, f64::max);
    assert!(off > 0.0, "no cross-class covariance");
    assert_eq!(rows_of("fsl-ntk-kxk-diag", "clean").len(), 40);
    let fits_json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("gp_fits.json")).unwrap()).unwrap();
    let kxk_fits: Vec<&serde_json::Value> = fits_json["functional_laplace"].as_array().unwrap().iter().filter(|f| f["fit"]["blocks"] == "cross-class").collect();
    assert_eq!(kxk_fits.len(), 4, "ntk and window2, two curvatures");
    for f in &kxk_fits {
        assert!(f["fit"]["kxk"]["logdet_rel_diff"].as_f64().unwrap() < 1e-10, "{f}");
        assert!(f["grid"].is_array(), "every cross-class fit has its δ grid");
    }
    // The EPK's test-side rows are exact.
    let fits: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("gp_fits.json")).unwrap()).unwrap();
    let epk_rows = fits["row_grams"].as_array().unwrap().iter().find(|r| r["kernel"] == "epk").unwrap();
    for c in epk_rows["checks"].as_array().unwrap() {
        assert!(c["max_abs_error"].as_f64().unwrap() < 1e-10, "{c}");
    }

    // A rerun reuses every stage and rewrites the report byte for byte (timings included).
    let before = files(&out);
    let again = run_study(&file, &out, &cache);
    assert!(again.reused_run, "every stage reused");
    let after = files(&out);
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    for (path, bytes) in &before {
        assert!(&after[path] == bytes, "{} changed on the rerun:\n{}\n---\n{}", path.display(), String::from_utf8_lossy(bytes), String::from_utf8_lossy(&after[path]));
    }

    // A lost stage is recomputed alone (the GPs refitted, deterministic) with the same results.
    std::fs::remove_file(cache.join("epk-gp").join("rot-90.json")).unwrap();
    let resumed = run_study(&file, &out, &cache);
    assert!(!resumed.reused_run);
    let after = files(&out);
    for (path, bytes) in &before {
        if !path.ends_with("timings.md") && !path.ends_with("timings.json") {
            assert!(after.get(path) == Some(bytes), "{} changed after resuming", path.display());
        }
    }
}

#[test]
fn row_memory_blocks_give_the_same_predictions_and_are_part_of_the_keys() {
    // The tiny study, then the same study with a row memory budget that splits the settings'
    // rows into blocks, on the same cache: the budget is in the settings' keys, so they are
    // recomputed (the network, the ensemble and the built-in methods reused); every prediction
    // equal within 1e-12 relative.
    let tmp = tempfile::tempdir().unwrap();
    let mnist = tmp.path().join("mnist");
    std::fs::create_dir(&mnist).unwrap();
    common::write_square_mnist(&mnist, 400, 60);
    let base = study_toml(&mnist);
    let budget = base.replace("disagreement_images = 6", "disagreement_images = 6\nrow_memory = \"12M\"");
    assert_ne!(budget, base);
    let cache = tmp.path().join("cache");
    let mut outs = Vec::new();
    for (name, text) in [("whole", &base), ("blocks", &budget)] {
        let file = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = tmp.path().join(format!("report-{name}"));
        // The second run would reuse every stage if the budget were not in the keys.
        let s = run_study(&file, &out, &cache);
        assert!(!s.reused_run, "{name}: the settings are computed");
        outs.push(out);
    }
    let k = 10;
    let read = |out: &Path| {
        let p = Table::read_parquet(&out.join("predictions.parquet")).unwrap();
        let mut cols: Vec<Vec<f64>> = (0..k).map(|c| p.f64(&format!("p{c}")).unwrap().to_vec()).collect();
        cols.push(p.f64("ood_score").unwrap().to_vec());
        let m = Table::read_parquet(&out.join("metrics.parquet")).unwrap();
        cols.push(m.f64("value").unwrap().to_vec());
        (strings(&p, "method"), strings(&p, "setting"), cols)
    };
    let (m1, s1, c1) = read(&outs[0]);
    let (m2, s2, c2) = read(&outs[1]);
    assert_eq!((&m1, &s1), (&m2, &s2));
    for (a, b) in c1.iter().zip(&c2) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            let ok = x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-12 * x.abs().max(y.abs());
            assert!(ok, "row {i}: {x:e} vs {y:e}");
        }
    }
}

#[test]
fn cholesky_solver_gives_the_eigen_solvers_predictions() {
    // The same tiny study with the cross-class fits by the Cholesky route: every other method
    // bit for bit, the cross-class ones within the δ search's tolerance (|Δ log δ| ≤ 1e-6).
    let tmp = tempfile::tempdir().unwrap();
    let mnist = tmp.path().join("mnist");
    std::fs::create_dir(&mnist).unwrap();
    common::write_square_mnist(&mnist, 400, 60);
    let base = study_toml(&mnist);
    let chol = base.replace("fsl_kxk_kernels = [\"ntk\", \"window:2\"]", "fsl_kxk_kernels = [\"ntk\", \"window:2\"]\nfsl_kxk_solver = \"cholesky\"");
    assert_ne!(chol, base);
    let mut outs = Vec::new();
    for (name, text) in [("eigen", &base), ("cholesky", &chol)] {
        let file = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let (out, cache) = (tmp.path().join(format!("report-{name}")), tmp.path().join(format!("cache-{name}")));
        run_study(&file, &out, &cache);
        outs.push(out);
    }
    let k = 10;
    let read = |out: &Path| {
        let p = Table::read_parquet(&out.join("predictions.parquet")).unwrap();
        let probs: Vec<Vec<f64>> = (0..k).map(|c| p.f64(&format!("p{c}")).unwrap().to_vec()).collect();
        (strings(&p, "method"), strings(&p, "setting"), probs)
    };
    let (m1, s1, p1) = read(&outs[0]);
    let (m2, s2, p2) = read(&outs[1]);
    assert_eq!((&m1, &s1), (&m2, &s2));
    let mut kxk_rows = 0;
    for i in 0..m1.len() {
        let err = (0..k).map(|c| (p1[c][i] - p2[c][i]).abs()).fold(0.0, f64::max);
        if m1[i].contains("-kxk-") {
            kxk_rows += 1;
            assert!(err < 1e-6, "{} / {} row {i}: {err:e}", m1[i], s1[i]);
        } else {
            assert_eq!(err, 0.0, "{} / {} row {i}", m1[i], s1[i]);
        }
    }
    assert!(kxk_rows > 0);
    let fits = |out: &Path| -> Vec<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("gp_fits.json")).unwrap()).unwrap();
        v["functional_laplace"].as_array().unwrap().iter().filter(|f| f["fit"]["blocks"] == "cross-class").cloned().collect()
    };
    let (f1, f2) = (fits(&outs[0]), fits(&outs[1]));
    assert_eq!(f1.len(), 4);
    for (a, b) in f1.iter().zip(&f2) {
        let (da, db) = (a["fit"]["delta"].as_f64().unwrap(), b["fit"]["delta"].as_f64().unwrap());
        assert!((da - db).abs() < 1e-5 * da, "δ {da} vs {db}");
        assert_eq!(b["fit"]["kxk"]["solver"], "cholesky");
        assert!(b["fit"]["kxk"]["search_factorisations"].as_u64().unwrap() > 0);
        assert_eq!(a["grid"][0], b["grid"][0], "the grid's δ");
    }
    let summary = std::fs::read_to_string(outs[1].join("summary.md")).unwrap();
    assert!(summary.contains("Cross-class fits by the Cholesky route"), "summary lacks the Cholesky route's table");

    // A study stopped after the searches resumes from their records: a lost setting refits the
    // family, its training Gram read back and the cross-class fits at the recorded δ (one
    // factorisation each, timed apart), and every output but the timings is byte for byte the
    // same.
    let (file, out, cache) = (tmp.path().join("cholesky.toml"), &outs[1], tmp.path().join("cache-cholesky"));
    for fam in ["ntk-gp", "window2-gp"] {
        for c in ["diag", "full"] {
            let memo: serde_json::Value = serde_json::from_slice(&std::fs::read(cache.join(fam).join(format!("fsl-kxk-{c}.search.json"))).unwrap()).unwrap();
            assert!(memo["fit"]["prior"] == "evidence" && memo["grid"].as_array().is_some_and(|g| !g.is_empty()), "{fam} {c}: {memo}");
        }
    }
    let before = files(out);
    std::fs::remove_file(cache.join("ntk-gp").join("rot-90.json")).unwrap();
    let resumed = run_study(&file, out, &cache);
    assert!(!resumed.reused_run);
    let after = files(out);
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
    for (path, bytes) in &before {
        if !path.ends_with("timings.md") && !path.ends_with("timings.json") {
            assert!(&after[path] == bytes, "{} changed after resuming:\n{}\n---\n{}", path.display(), String::from_utf8_lossy(bytes), String::from_utf8_lossy(&after[path]));
        }
    }
    let timings = std::fs::read_to_string(out.join("timings.md")).unwrap();
    for m in ["fsl-ntk-kxk-diag", "fsl-ntk-kxk-full"] {
        for what in ["refactored at the evidence's recorded δ (resumed)", "validation calibration at the grid's recorded δ (resumed)"] {
            assert_eq!(timings.matches(&format!("{m}: {what}")).count(), 1, "{m}: {what} in\n{timings}");
        }
    }
    assert!(!timings.contains("fsl-window2-kxk-diag: refactored"), "the window's family was not refitted:\n{timings}");
    // Its training Gram (full layout, [M, M, K, K] = 80 × 80 × 10 × 10) was read back, not computed.
    assert_eq!(std::fs::metadata(cache.join("ntk-gp").join("train-gram.f64")).unwrap().len(), 8 * 80 * 80 * 100);
    assert_eq!(timings.matches("ntk-gp: training Gram read from the cache, GP refitted (resumed)").count(), 1, "{timings}");
}

#[test]
fn uncertainty_section_is_validated() {
    let tmp = tempfile::tempdir().unwrap();
    let base = study_toml(Path::new("data/mnist"));
    let check = |text: &str, needle: &str| {
        let e = study::StudyConfig::from_toml(text, Path::new("s.toml")).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    };
    check(&base.replace("lr = 0.5\nsteps = 4", "lr = 0.3\nsteps = 4"), "selection grid");
    check(&base.replace("ensemble_seeds = [0, 1]", "ensemble_seeds = [0, 0]"), "duplicates");
    check(&base.replace("kernel_gps = [\"epk\", \"ntk\", \"window:2\"]", "kernel_gps = [\"dpk\"]"), "`dpk` is not epk, ntk, path or window:L");
    check(&base.replace("kernel_gps = [\"epk\", \"ntk\", \"window:2\"]", "kernel_gps = [\"window:0\"]"), "`window:0` is not");
    check(&base.replace("kernel_gps = [\"epk\", \"ntk\", \"window:2\"]", "kernel_gps = [\"path\", \"path\"]"), "duplicates");
    check(&base.replace("disagreement_images = 6", "quadrature = \"simpson\""), "");
    check(&base.replace("disagreement_images = 6", "colour = 1"), "unknown field");
    check(&(base.clone() + "\n[[kernel]]\nkind = \"epk\"\n"), "benchmark only");
    check(&base.replace("lrs = [0.5, 1.0]", "lrs = []"), "lrs");
    check(&base.replace("disagreement_images = 6", "row_memory = \"lots\""), "row_memory");
    check(&base.replace("fsl_kxk_kernels = [\"ntk\", \"window:2\"]", "fsl_kxk_kernels = [\"path\"]"), "`path` is not one of kernel_gps");
    check(&base.replace("fsl_kxk = [\"class-diagonal\", \"full\"]", "fsl_kxk = [\"full\", \"full\"]"), "must not repeat");
    check(&base.replace("ablations = [\"netmean\", \"sym\"]", "ablations = [\"fancy\"]"), "not sym or netmean");
    let _ = tmp;
    assert!(study::StudyConfig::from_toml(&base, Path::new("s.toml")).unwrap().uncertainty.is_some());
}

/// A small run on the fake MNIST files.
fn small_run(dir: &Path) -> Run {
    let mnist = dir.join("mnist");
    std::fs::create_dir_all(&mnist).unwrap();
    common::write_square_mnist(&mnist, 200, 20);
    let toml =
        format!("[data]\nkind = \"mnist\"\npath = \"{}\"\nper_class = 4\nn_test = 12\nnormalize = false\n\n[model]\nkind = \"mlp\"\nhidden = [6]\n\n[train]\nlr = 0.5\nsteps = 6\n", mnist.display());
    let cfg = RunConfig::from_toml(&toml, Path::new("c.toml")).unwrap();
    train_to_dir(&cfg, &dir.join("run"), &TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }).unwrap();
    Run::open(&dir.join("run")).unwrap()
}

fn f64s(path: &Path, name: &str) -> Vec<f64> {
    SafeFile::open(path).unwrap().f64(name, None).unwrap().1
}

/// The in-memory kernel GP equals the `gp` report on kernel directories written to disk (the
/// same Grams, class blocks, targets, hyper-parameter search and posterior), for the EPK and the
/// NTK; the symmetrised test-side training Gram is exact and really asymmetric before.
#[test]
fn kernel_gp_matches_the_gp_workflow() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let run = small_run(d);
    let states = run.load_all().unwrap();
    let net = Trained::open(&run.dir).unwrap();
    let noop = |_: usize, _: usize| {};
    let train_pts = Points { x: run.dataset.x_train.clone(), dim: run.dataset.dim };
    let test_pts = Points { x: run.dataset.x_test.clone(), dim: run.dataset.dim };
    let rule = Rule::Auto(1e-12);
    // On the network's outputs, as the `gp` workflow on kernel directories.
    for (kind, spec) in [(KernelKind::Epk, KernelGpSpec { outputs: Outputs::Network, ..KernelGpSpec::epk(rule) }), (KernelKind::Ntk, KernelGpSpec { outputs: Outputs::Network, ..KernelGpSpec::ntk() })]
    {
        let gp = KernelGp::fit(&run, &states, &spec, &noop).unwrap();
        let rows = kernel_gp::row_gram(&run, &states, kind, rule, Outputs::Network, &run.dataset.x_test, "test", &noop).unwrap();
        let post = gp.posterior(&rows).unwrap();
        let (mean, var, noise) = if kind == KernelKind::Epk {
            // The reference: the same kernels written as kernel directories, then `gp`.
            let write = |pts: &Points, side: Side, name: &str| {
                let req = Request::new(kind).rule(rule).side(side);
                let o = kernel::compute(&run, &states, pts, &req.clone().layout(Layout::Diag), &noop).unwrap();
                let dir = d.join(format!("{kind}-{name}"));
                std::fs::create_dir_all(&dir).unwrap();
                kernel::output::write(&dir, &o, pts, Rows::of_points(pts, &run), &run.manifest.run_id).unwrap();
                Gram::open(&dir, &net).unwrap()
            };
            let (kt, kp) = (write(&train_pts, Side::Train, "train"), write(&test_pts, Side::Test, "test"));
            let gdir = d.join(format!("{kind}-gp"));
            std::fs::create_dir_all(&gdir).unwrap();
            report::gp_report(&net, &kt, &kp, &GpParams::new().fit_hyper(true), GpTargets::Network, 16, 0, &gdir).unwrap();
            let f = gdir.join("gp.safetensors");
            (f64s(&f, "mean"), f64s(&f, "var"), f64s(&f, "noise"))
        } else {
            // The reference for the NTK: the
            // full-layout Grams' diagonal blocks and a GP fitted on them directly.
            let full = |pts: &Points| {
                let req = Request::new(kind).rule(rule);
                kernel::compute(&run, &states, pts, &req, &noop).unwrap()
            };
            let (ot, op) = (full(&train_pts), full(&test_pts));
            let (m, p, k) = (ot.m, op.p, ot.k);
            let block = |o: &kernel::KernelOutput, c: usize| -> Vec<f64> { (0..o.p * o.m).map(|idx| o.gram[(idx * k + c) * k + c]).collect() };
            let mut k_train = Vec::new();
            let (mut k_cross, mut k_diag) = (Vec::new(), Vec::new());
            for c in 0..k {
                let mut b = block(&ot, c);
                for i in 0..m {
                    for j in i + 1..m {
                        let v = 0.5 * (b[i * m + j] + b[j * m + i]);
                        (b[i * m + j], b[j * m + i]) = (v, v);
                    }
                }
                k_train.extend(b);
                k_cross.extend(block(&op, c));
                k_diag.extend((0..p).map(|q| op.diag.as_ref().unwrap()[(q * k + c) * k + c]));
            }
            let targets: Vec<f64> = ot.network.iter().zip(&ot.bias).map(|(f, b)| f - b).collect();
            let fitted = GpParams::new().fit_hyper(true).fit(&k_train, &targets, m, k).unwrap();
            let mut post = fitted.predict(&k_cross, &k_diag, p).unwrap();
            post.mean.iter_mut().zip(&op.bias).for_each(|(v, b)| *v += b);
            (post.mean, post.var, fitted.noise())
        };
        let scale = mean.iter().fold(1.0f64, |a, v| a.max(v.abs()));
        let dm = mean.iter().zip(&post.mean).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let dv = var.iter().zip(&post.var).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        let vscale = var.iter().fold(1e-300f64, |a, v| a.max(v.abs()));
        assert!(dm <= 1e-12 * scale, "{kind}: posterior means differ by {dm:e}");
        assert!(dv <= 1e-10 * vscale, "{kind}: posterior variances differ by {dv:e} (scale {vscale:e})");
        // The same hyper-parameters (the report's targets come from another forward pass).
        for (a, b) in gp.fit.noise.iter().zip(noise) {
            assert!((a - b).abs() <= 1e-8 * b.abs(), "{kind}: noise {a:e} vs {b:e}");
        }
        assert!(gp.fit.asymmetry.iter().all(|&a| a <= 1e-12), "{:?}", gp.fit.asymmetry);
        if kind == KernelKind::Epk {
            assert!(rows.check.max_abs_error < 1e-10, "the EPK's test rows are exact: {}", rows.check.max_abs_error);
        }
    }
    // The ablation's training Gram: the training points on the test side, an exact machine and a
    // Gram that is not symmetric before symmetrisation.
    let sym = KernelGpSpec::epk(rule).train_gram(TrainGram::SymmetrisedTestSide);
    match KernelGp::fit(&run, &states, &sym, &noop) {
        Ok(g) => {
            assert!(g.fit.train_check.max_abs_error < 1e-10, "{:?}", g.fit.train_check);
            assert!(g.fit.asymmetry.iter().any(|&a| a > 1e-6), "{:?}", g.fit.asymmetry);
        }
        Err(e) => assert!(e.to_string().contains("positive"), "{e}"),
    }
    // A GP on one kernel refuses the rows of another; the NTK has no test side to symmetrise.
    let gp = KernelGp::fit(&run, &states, &KernelGpSpec::ntk(), &noop).unwrap();
    let rows = kernel_gp::row_gram(&run, &states, KernelKind::Epk, rule, Outputs::Logits, &run.dataset.x_test[..784], "one", &noop).unwrap();
    assert!(gp.posterior(&rows).is_err());
    assert!(KernelGp::fit(&run, &states, &KernelGpSpec::ntk().train_gram(TrainGram::SymmetrisedTestSide), &noop).is_err());
}

/// The study computes each setting's rows alone (to hold one setting's rows at a time): one set
/// computed alone gives the rows it has in a joint computation over every set (EPK with the
/// adaptive rule and the NTK; diag and full layouts; every array of the row Gram, ≤ 1e-12
/// relative), and its check is its own rows' machine; under a memory budget its rows come in
/// blocks with the same values, and a budget below one row's work is refused.
#[test]
fn row_grams_of_one_set_alone_are_its_rows_of_a_joint_computation() {
    let tmp = tempfile::tempdir().unwrap();
    let run = small_run(tmp.path());
    let states = run.load_all().unwrap();
    let noop = |_: usize, _: usize| {};
    let d = run.dataset.dim;
    let x = &run.dataset.x_test;
    // Three sets of unequal sizes (5, 4, 3 rows), the last one inverted test images.
    let inverted: Vec<f64> = x[..3 * d].iter().map(|v| 1.0 - v).collect();
    let sets: Vec<(&[f64], &str)> = vec![(&x[..5 * d], "a"), (&x[5 * d..9 * d], "b"), (&inverted, "c")];
    let close = |what: &str, a: &[f64], b: &[f64]| {
        assert_eq!(a.len(), b.len(), "{what}");
        let scale = a.iter().fold(f64::MIN_POSITIVE, |s, v| s.max(v.abs()));
        let err = a.iter().zip(b).map(|(u, v)| (u - v).abs()).fold(0.0, f64::max);
        assert!(err <= 1e-12 * scale, "{what}: {err:e} (scale {scale:e})");
    };
    for kind in [KernelKind::Epk, KernelKind::Ntk] {
        for layout in [Layout::Diag, Layout::Full] {
            let joint = kernel_gp::row_grams(&run, &states, kind, Rule::Auto(1e-12), Outputs::Logits, None, layout, &sets, None, &noop).unwrap();
            for (set, j) in sets.iter().zip(&joint) {
                let alone = kernel_gp::row_grams(&run, &states, kind, Rule::Auto(1e-12), Outputs::Logits, None, layout, &[*set], None, &noop).unwrap().pop().unwrap();
                // Under a memory budget that holds the output and two rows' work: blocks of two
                // rows, concatenated, are the rows of one block.
                let p = set.0.len() / d;
                let req = Request::new(kind).rule(Rule::Auto(1e-12)).layout(layout).outputs(Outputs::Logits);
                let plan = kernel::engine::blocked::plan(&run.manifest, p, run.dataset.n_train(), &req, u64::MAX).unwrap();
                let budget = plan.output_bytes + plan.fixed_bytes + 2 * plan.row_bytes;
                assert_eq!(kernel::engine::blocked::plan(&run.manifest, p, run.dataset.n_train(), &req, budget).unwrap().block_rows, 2);
                let blocked = kernel_gp::row_grams(&run, &states, kind, Rule::Auto(1e-12), Outputs::Logits, None, layout, &[*set], Some(budget), &noop).unwrap().pop().unwrap();
                let tight = plan.output_bytes + plan.fixed_bytes + plan.row_bytes - 1;
                assert!(kernel_gp::row_grams(&run, &states, kind, Rule::Auto(1e-12), Outputs::Logits, None, layout, &[*set], Some(tight), &noop).unwrap_err().to_string().contains("memory"));
                for (what, a, b) in [("blocked k_cross", &blocked.k_cross, &alone.k_cross), ("blocked k_test_diag", &blocked.k_test_diag, &alone.k_test_diag), ("blocked network", &blocked.network, &alone.network)] {
                    close(&format!("{kind} {layout} set {}: {what}", set.1), a, b);
                }
                if layout == Layout::Full {
                    close(&format!("{kind} {layout} set {}: blocked k_cross_full", set.1), blocked.k_cross_full.as_ref().unwrap(), alone.k_cross_full.as_ref().unwrap());
                }
                let what = |a: &str| format!("{kind} {layout} set {}: {a}", set.1);
                assert_eq!(alone.p, j.p, "{}", what("rows"));
                close(&what("k_cross"), &alone.k_cross, &j.k_cross);
                close(&what("k_test_diag"), &alone.k_test_diag, &j.k_test_diag);
                close(&what("network"), &alone.network, &j.network);
                close(&what("bias"), &alone.bias, &j.bias);
                assert_eq!(alone.k_cross_full.is_some(), layout == Layout::Full);
                if layout == Layout::Full {
                    close(&what("k_cross_full"), alone.k_cross_full.as_ref().unwrap(), j.k_cross_full.as_ref().unwrap());
                    close(&what("k_self"), alone.k_self.as_ref().unwrap(), j.k_self.as_ref().unwrap());
                    // The full Gram's class-diagonal blocks are the class-diagonal rows.
                    let (m, k, p) = (run.dataset.n_train(), run.dataset.num_outputs, alone.p);
                    let full = alone.k_cross_full.as_ref().unwrap();
                    for c in 0..k {
                        for idx in 0..p * m {
                            assert_eq!(alone.k_cross[c * p * m + idx], full[(idx * k + c) * k + c]);
                        }
                    }
                }
                assert_eq!((alone.check.rows.as_str(), alone.check.points), (set.1, j.check.points), "{}", what("check"));
                assert!((alone.check.max_abs_error - j.check.max_abs_error).abs() <= 1e-12, "{}", what("check"));
            }
        }
    }
}
