//! The uncertainty benchmark end to end on small MNIST-format files (written here, so the test
//! always runs): per-class data selection with a validation split, training and an ensemble with
//! the existing trainer, every method in every setting, and the written tables read back and
//! re-scored.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pathkernel::data::Targets;
use pathkernel::gp::Posterior;
use pathkernel::io::Table;
use pathkernel::train::{train_to_dir, RunConfig, TrainOptions};
use pathkernel::trajectory::Run;
use pathkernel::uncertainty::{self, metrics, BenchmarkConfig, ExternalMethod, Metric, Network, Predictive, SettingKind};

fn config(mnist: &Path, steps: usize) -> RunConfig {
    let toml = format!(
        r#"
[data]
kind = "mnist"
path = "{}"
per_class = 8
val_per_class = 4
n_test = 60
normalize = false

[model]
kind = "mlp"
hidden = [16]

[train]
lr = 0.5
steps = {steps}
"#,
        mnist.display()
    );
    RunConfig::from_toml(&toml, Path::new("uq.toml")).unwrap()
}

fn opts() -> TrainOptions {
    TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }
}

/// Reads the two parquet tables back and re-scores every (method, setting) with the metric
/// functions, against the metrics table.
fn rescore_from_files(dir: &Path, k: usize) {
    let p = Table::read_parquet(&dir.join("predictions.parquet")).unwrap();
    let m = Table::read_parquet(&dir.join("metrics.parquet")).unwrap();
    let col_str = |t: &Table, name: &str| -> Vec<String> {
        match &t.columns.iter().find(|(n, _)| n == name).unwrap().1 {
            pathkernel::io::Column::Str(v) => v.clone(),
            _ => panic!("{name} is not a string column"),
        }
    };
    let (pm, ps) = (col_str(&p, "method"), col_str(&p, "setting"));
    let label = p.i64("label").unwrap();
    let score = p.f64("ood_score").unwrap();
    let probs: Vec<&[f64]> = (0..k).map(|c| p.f64(&format!("p{c}")).unwrap()).collect();
    let rows = |method: &str, setting: &str| -> (Vec<f64>, Vec<i64>, Vec<f64>) {
        let idx: Vec<usize> = (0..pm.len()).filter(|&i| pm[i] == method && ps[i] == setting).collect();
        let pr = idx.iter().flat_map(|&i| (0..k).map(|c| probs[c][i]).collect::<Vec<_>>()).collect();
        (pr, idx.iter().map(|&i| label[i]).collect(), idx.iter().map(|&i| score[i]).collect())
    };
    let (mm, ms, mk) = (col_str(&m, "method"), col_str(&m, "setting"), col_str(&m, "metric"));
    let value = m.f64("value").unwrap();
    assert!(!mm.is_empty());
    for i in 0..mm.len() {
        let (pr, lab, sc) = rows(&mm[i], &ms[i]);
        let y: Vec<usize> = lab.iter().map(|&l| l as usize).collect();
        let (cp, _, csc) = rows(&mm[i], "clean");
        let want = match mk[i].as_str() {
            "accuracy" => metrics::accuracy(&pr, &y, k).unwrap(),
            "nll" => metrics::nll(&pr, &y, k).unwrap(),
            "brier" => metrics::brier(&pr, &y, k).unwrap(),
            "ece" => metrics::ece(&pr, &y, k, 15).unwrap(),
            "auroc_msp" => metrics::auroc(&metrics::max_prob(&cp, k).unwrap(), &metrics::max_prob(&pr, k).unwrap()).unwrap(),
            "auroc_variance" => metrics::auroc(&sc, &csc).unwrap(),
            other => panic!("unknown metric {other}"),
        };
        assert_eq!(value[i], want, "{} / {} / {}", mm[i], ms[i], mk[i]);
    }
}

#[test]
fn benchmark_end_to_end_on_mnist_format_files() {
    let tmp = tempfile::tempdir().unwrap();
    let mnist = tmp.path().join("mnist");
    std::fs::create_dir(&mnist).unwrap();
    common::write_square_mnist(&mnist, 400, 80);
    let cfg = config(&mnist, 25);
    let data = cfg.data.load(Path::new(".")).unwrap();
    assert_eq!((data.n_train(), data.n_val(), data.n_test()), (80, 40, 60));
    let summary = train_to_dir(&cfg, &tmp.path().join("run"), &opts()).unwrap();
    let run = Run::open(&tmp.path().join("run")).unwrap();
    // The run's dataset is the training/test part of the configuration's dataset.
    assert_eq!(run.dataset.x_train, data.x_train);
    assert!(run.dataset.validation.is_none());
    let (init, last) = (run.load_step(0).unwrap(), run.load_step(run.manifest.steps).unwrap());
    let arch = &run.manifest.architecture;

    let ens_dir = tmp.path().join("ensemble");
    let ens = uncertainty::train_ensemble(&cfg, &[0, 1], &ens_dir, &opts()).unwrap();
    assert_eq!(ens.members.len(), 2);
    assert!(ens.members.iter().all(|m| !m.reused));
    // Seed 0 is the main run's configuration: the same parameters.
    assert_eq!(ens.members[0].last, last);
    assert_ne!(ens.members[1].last, last);
    let again = uncertainty::train_ensemble(&cfg, &[0, 1], &ens_dir, &opts()).unwrap();
    assert!(again.members.iter().all(|m| m.reused));
    assert_eq!(again.members.iter().map(|m| &m.last).collect::<Vec<_>>(), ens.members.iter().map(|m| &m.last).collect::<Vec<_>>());

    let bc = BenchmarkConfig { angles: vec![0.0, 90.0], shift_points: None, noise_points: Some(30), mc_samples: 200, ..BenchmarkConfig::default() };
    let settings = uncertainty::settings(&data, &bc).unwrap();
    let names: Vec<&str> = settings.iter().map(|s| s.info.name.as_str()).collect();
    assert_eq!(names, ["clean", "rot-0", "rot-90", "noise", "inverted"]);
    assert_eq!(settings[3].info.kind, SettingKind::Ood);
    assert_eq!(settings[3].info.n, 30);
    // An external method: a made-up GP posterior around the network's logits.
    let k = 10;
    let mut posteriors = BTreeMap::new();
    for s in &settings {
        let z = uncertainty::network_logits(arch, &last, Some(&init), &s.x).unwrap();
        let n = s.info.n;
        posteriors.insert(s.info.name.clone(), Posterior { mean: z, var: vec![0.3; n * k], p: n, k });
    }
    let gp = ExternalMethod::from_gp_posteriors("toy-gp", &posteriors, 100, 5).unwrap();
    let one = Predictive::from_gp(&posteriors["noise"], 100, 5).unwrap();
    assert_eq!(gp.settings["noise"], one);
    assert!((one.ood_score.as_ref().unwrap()[0] - 3.0).abs() < 1e-14, "summed variance");
    let net = Network { arch, params: &last, init: Some(&init) };
    let res = uncertainty::run_benchmark(net, &data, Some(&ens), std::slice::from_ref(&gp), &bc).unwrap();
    assert_eq!(res.methods(), ["map", "temperature", "laplace", "ensemble", "toy-gp"]);

    let find = |m: &str, s: &str| res.predictions.iter().find(|p| p.method == m && p.setting == s).unwrap();
    let Targets::Labels(y_test) = &data.y_test else { panic!() };
    // MAP: the network's softmax; its accuracy is the trainer's test accuracy.
    let fwd = arch.forward(&last, Some(&init), &data.x_test).unwrap();
    let soft: Vec<f64> = fwd.iter().map(|v| v.exp()).collect();
    for (a, b) in find("map", "clean").probs.iter().zip(&soft) {
        assert!((a - b).abs() < 1e-12);
    }
    assert_eq!(res.metric("map", "clean", Metric::Accuracy), summary.test_accuracy);
    assert_eq!(res.metric("map", "clean", Metric::Accuracy).unwrap(), metrics::accuracy(&soft, y_test, k).unwrap());
    // Rotation by 0 changes nothing, for every method (same MC seed and streams).
    for m in res.methods() {
        assert_eq!(find(m, "rot-0").probs, find(m, "clean").probs, "{m}");
        assert_eq!(res.metric(m, "rot-0", Metric::Nll), res.metric(m, "clean", Metric::Nll));
    }
    assert_ne!(find("map", "rot-90").probs, find("map", "clean").probs);
    // Temperature: fitted on the validation split, softmax(z / T).
    let t = res.temperature.unwrap();
    assert!(t.temperature > 0.0 && t.nll_after <= t.nll_before);
    assert_eq!(t.n, 40);
    let z = uncertainty::network_logits(arch, &last, Some(&init), &data.x_test).unwrap();
    let zt: Vec<f64> = z.iter().map(|v| v / t.temperature).collect();
    assert_eq!(find("temperature", "clean").probs, metrics::softmax_rows(&zt, k).unwrap());
    // Ensemble: the members' mean softmax.
    let mp = ens.member_probs(&data.x_test).unwrap();
    for (i, v) in find("ensemble", "clean").probs.iter().enumerate() {
        assert!((v - (mp[0][i] + mp[1][i]) / 2.0).abs() < 1e-15);
    }
    // Laplace: λ from the evidence, a variance score on every setting, larger off-distribution
    // on average for noise images than on the test set.
    let lap = res.laplace.as_ref().unwrap();
    assert!(lap.prior_precision > 0.0 && lap.num_params == 10 * 17);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (vc, vn) = (find("laplace", "clean").ood_score.clone().unwrap(), find("laplace", "noise").ood_score.clone().unwrap());
    assert!(vc.iter().all(|v| *v > 0.0));
    assert!(mean(&vn) > mean(&vc), "noise {} vs clean {}", mean(&vn), mean(&vc));
    assert!(res.metric("laplace", "noise", Metric::AurocVariance).is_some());
    assert!(res.metric("map", "noise", Metric::AurocVariance).is_none());
    assert!(res.metric("toy-gp", "inverted", Metric::AurocVariance).is_some());

    let out = tmp.path().join("report");
    res.write(&out).unwrap();
    rescore_from_files(&out, k);
    let text = res.to_string();
    assert!(text.contains("| laplace | noise |"), "{text}");

    // Errors: no validation split; an external method without every setting or with a taken name.
    let mut no_val = data.clone();
    no_val.validation = None;
    let e = uncertainty::run_benchmark(net, &no_val, None, &[], &bc).unwrap_err().to_string();
    assert!(e.contains("val_per_class"), "{e}");
    let mut partial = gp.clone();
    partial.settings.remove("noise");
    assert!(uncertainty::run_benchmark(net, &data, None, &[partial], &bc).unwrap_err().to_string().contains("noise"));
    let taken = ExternalMethod { name: "laplace".into(), ..gp };
    assert!(uncertainty::run_benchmark(net, &data, None, &[taken], &bc).unwrap_err().to_string().contains("taken"));
}

/// The rotation against scipy's `ndimage.rotate(..., reshape=False, order=1, mode="grid-constant")`
/// (golden values made by `tests/data/uncertainty/make_rotation_golden.py`).
#[test]
fn rotation_matches_scipy_golden_values() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/uncertainty/rotation_golden.json");
    let golden: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let img: Vec<f64> = (0..28).flat_map(|r| (0..28).map(move |c| ((7 * r + 13 * c) % 17) as f64 / 16.0)).collect();
    let rots = golden["rotations"].as_object().unwrap();
    assert_eq!(rots.len(), 4);
    for (angle, want) in rots {
        let want: Vec<f64> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let got = uncertainty::shift::rotate_image(&img, angle.parse().unwrap());
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(err < 1e-12, "{angle}°: max difference {err}");
    }
}

/// The protocol of issue 15 on the real MNIST files (about a minute; run with `--ignored` after
/// `bash data/fetch-mnist.sh`): 200 + 50 images per digit, 2 000 test images, 784-128-10,
/// full-batch GD, a five-member ensemble, the default settings.
#[test]
#[ignore]
fn real_mnist_protocol() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    if !dir.join("train-images.idx3-ubyte").is_file() && !dir.join("train-images-idx3-ubyte").is_file() {
        eprintln!("skipping: {} not present", dir.display());
        return;
    }
    let steps: usize = std::env::var("UQ_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    let toml = format!(
        "[data]\nkind = \"mnist\"\npath = \"{}\"\nper_class = 200\nval_per_class = 50\nn_test = 2000\nnormalize = false\n\n[model]\nkind = \"mlp\"\nhidden = [128]\n\n[train]\nlr = 0.5\nsteps = {steps}\n",
        dir.display()
    );
    let cfg = RunConfig::from_toml(&toml, Path::new("uq.toml")).unwrap();
    let data = cfg.data.load(Path::new(".")).unwrap();
    let work = std::env::var("UQ_WORK").map(PathBuf::from).unwrap_or_else(|_| std::env::temp_dir().join("pathkernel-uq-real"));
    let t0 = std::time::Instant::now();
    let ens = uncertainty::train_ensemble(&cfg, &uncertainty::ensemble::ENSEMBLE_SEEDS, &work.join("ensemble"), &opts()).unwrap();
    eprintln!("ensemble: {:.1} s", t0.elapsed().as_secs_f64());
    let m0 = &ens.members[0];
    let net = Network { arch: &m0.arch, params: &m0.last, init: Some(&m0.init) };
    let t1 = std::time::Instant::now();
    let res = uncertainty::run_benchmark(net, &data, Some(&ens), &[], &BenchmarkConfig::default()).unwrap();
    eprintln!("benchmark: {:.1} s", t1.elapsed().as_secs_f64());
    res.write(&work.join("report")).unwrap();
    println!("{res}");
    rescore_from_files(&work.join("report"), 10);
}
