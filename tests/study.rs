//! The study engine's cache: a study run twice with one field changed recomputes the stage that
//! field determines and the stages downstream of it, and reuses everything else.

use std::path::{Path, PathBuf};

use pathkernel::study::{self, StudyOptions, StudySummary};

fn toml(data_seed: u64, hidden: usize, lr: f64, steps: usize, quadrature: &str) -> String {
    format!(
        r#"
name = "cache-check"

[data]
kind = "gaussian-mixture"
dim = 2
per_class = 8
n_test = 6
seed = {data_seed}

[model]
kind = "mlp"
hidden = [{hidden}]

[train]
lr = {lr}
steps = {steps}
seed = 0

[[kernel]]
kind = "epk"
quadrature = "{quadrature}"
points = "test"

[[kernel]]
kind = "dpk"
points = "test"

[analysis]
charts = false
"#
    )
}

fn run(dir: &Path, text: &str) -> StudySummary {
    let file = dir.join("s.toml");
    std::fs::write(&file, text).unwrap();
    let opts = StudyOptions { out: Some(dir.join("report")), cache: Some(dir.join("cache")), base_dir: PathBuf::from("."), progress: false, command: "test".into() };
    study::run(&file, &opts).unwrap()
}

/// (training reused, each kernel reused).
fn reused(s: &StudySummary) -> (bool, Vec<bool>) {
    (s.reused_run, s.kernels.iter().map(|k| k.1).collect())
}

/// A kernel that misses its tolerance fails the study (after the report is written, with the
/// miss in its summary); `strict = false` accepts it and says so all the same.
#[test]
fn a_study_with_an_inexact_kernel_fails_unless_it_says_strict_false() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let text = toml(0, 4, 0.5, 3, "auto:1e-300");
    let file = d.join("s.toml");
    std::fs::write(&file, &text).unwrap();
    let opts = StudyOptions { out: Some(d.join("report")), cache: Some(d.join("cache")), base_dir: PathBuf::from("."), progress: false, command: "test".into() };
    let e = study::run(&file, &opts).unwrap_err().to_string();
    assert!(e.contains("study cache-check: 1 kernel(s) missed their tolerance") && e.contains("epk-test") && !e.contains('\n'), "{e}");
    let summary = std::fs::read_to_string(d.join("report/summary.md")).unwrap();
    assert!(summary.contains("**INEXACT** — epk-test: the epk kernel's rule auto:1e-300 missed its tolerance"), "{summary}");
    std::fs::write(&file, text.replace("name = \"cache-check\"", "name = \"cache-check\"\nstrict = false")).unwrap();
    let s = study::run(&file, &opts).unwrap();
    assert_eq!(s.kernels.len(), 2);
    assert!(std::fs::read_to_string(d.join("report/summary.md")).unwrap().contains("**INEXACT**"));
}

#[test]
fn a_changed_field_recomputes_its_stage_and_only_those_downstream() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let base = toml(0, 4, 0.5, 5, "auto:1e-12");
    assert_eq!(reused(&run(d, &base)), (false, vec![false, false]), "an empty cache");
    assert_eq!(reused(&run(d, &base)), (true, vec![true, true]), "nothing changed");
    // A kernel setting: that kernel only.
    assert_eq!(reused(&run(d, &toml(0, 4, 0.5, 5, "gauss:3"))), (true, vec![false, true]));
    assert_eq!(reused(&run(d, &base)), (true, vec![false, true]), "and back: recomputed again, not a stale hit");
    // Any field of the training configuration: the run and every kernel on it.
    for changed in [toml(1, 4, 0.5, 5, "auto:1e-12"), toml(0, 5, 0.5, 5, "auto:1e-12"), toml(0, 4, 0.25, 5, "auto:1e-12"), toml(0, 4, 0.5, 6, "auto:1e-12")] {
        assert_eq!(reused(&run(d, &changed)), (false, vec![false, false]), "{changed}");
        assert_eq!(reused(&run(d, &changed)), (true, vec![true, true]), "{changed}: rerun");
    }
    // A field outside the model that still changes the run (the optimizer's weight decay).
    let wd = base.replace("seed = 0\n\n[[kernel]]", "seed = 0\nweight_decay = 0.01\n\n[[kernel]]");
    assert_ne!(wd, base);
    assert_eq!(reused(&run(d, &wd)), (false, vec![false, false]));
}

#[test]
fn the_attribution_benchmark_runs_as_a_study_and_its_stages_come_from_the_engine_cache() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"
name = "attribution-check"

[data]
kind = "gaussian-mixture"
dim = 2
per_class = 8
n_test = 6
seed = 0

[model]
kind = "mlp"
hidden = [6]
zero_last = true

[train]
lr = 0.5
steps = 12
seed = 0

[attribution]
subsets = 8
tuning_subsets = 3
test_points = 4
trak_dims = [8]
trak_ridges = [1e-2]
representer_ridges = [1e-2]
if_dampings = [1e-1]
ensemble_seeds = [1, 2]
noise_fraction = 0.25
bootstrap = 50
chunk_rows = 4
cg_check_points = 1
"#;
    let first = run(dir.path(), text);
    assert!(!first.reused_run);
    let report = dir.path().join("report");
    for f in ["summary.md", "lds.parquet", "sweep.parquet", "noisy.parquet", "result.json", "study.toml", "timings.json"] {
        assert!(report.join(f).exists(), "{f}");
    }
    // The attributions (`P·M` numbers per method) stay in the cache; the report has the rest.
    assert!(dir.path().join("cache/tau.safetensors").exists() && !report.join("tau.safetensors").exists());
    let stored = std::fs::read_dir(dir.path().join("cache").join("stages")).unwrap().count();
    assert!(stored > 0, "the benchmark's stages are stored in the engine's cache");
    let lds_of = |p: &Path| {
        let t = pathkernel::io::Table::read_parquet(&p.join("lds.parquet")).unwrap();
        ["tune", "lds", "lds_lo", "lds_hi", "lds_margin"].map(|c| t.f64(c).unwrap_or_else(|| panic!("column {c}")).to_vec())
    };
    let lds = lds_of(&report);
    let summary = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(summary.starts_with("# Study `attribution-check`") && summary.contains("| epk |") && summary.contains("[attribution]"));
    assert!(summary.contains("## Cost") && summary.contains("(this run computed every stage)"), "{summary}");
    // Every chart is written and named on the front page (window-rep ran: L = 1 and 10 < 12 steps).
    for f in ["lds.png", "lds_ridge.png", "lds_window.png", "noisy_auc.png"] {
        assert!(report.join("charts").join(f).exists() && summary.contains(&format!("`charts/{f}`")), "{f}");
    }
    // Rerun: the run and every stage reused, no new stage files, the same tables.
    let second = run(dir.path(), text);
    assert!(second.reused_run);
    assert_eq!(std::fs::read_dir(dir.path().join("cache").join("stages")).unwrap().count(), stored);
    assert_eq!(lds_of(&report), lds);
    let again = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(again.contains("of stages reused from the cache, counted at their seconds when computed"), "{again}");
    // A changed benchmark setting recomputes the stages it determines (new stage files).
    let third = run(dir.path(), &text.replace("subset_seed = 0\n", "").replace("subsets = 8", "subsets = 8\nsubset_seed = 1"));
    assert!(third.reused_run, "the network does not depend on the subsets");
    assert!(std::fs::read_dir(dir.path().join("cache").join("stages")).unwrap().count() > stored);
    // [attribution] is a study kind of its own.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("{text}\n[analysis]\ncharts = false\n")).unwrap();
    let opts = StudyOptions { out: Some(dir.path().join("r2")), cache: Some(dir.path().join("c2")), base_dir: PathBuf::from("."), progress: false, command: "test".into() };
    let e = study::run(&bad, &opts).unwrap_err().to_string();
    assert!(e.contains("[attribution] runs the attribution benchmark only"), "{e}");
}

/// `[analysis] fsl`: function-space Laplace on each kernel of the logits, equal to the notebook
/// API's fit on the same network (the train × train EPK on the logits, class-diagonal curvature,
/// δ by the evidence); kernels of the network's outputs get none, and asking for it without a
/// kernel of the logits is refused.
#[test]
fn fsl_analysis_fits_on_the_logits_kernels() {
    use pathkernel::api::{FslModel, Trained};
    use pathkernel::gp::{Curvature, Prior};
    use pathkernel::kernel::Layout;
    let dir = tempfile::tempdir().unwrap();
    let base = toml(3, 6, 0.5, 12, "auto:1e-12").replace("[analysis]\ncharts = false", "[[kernel]]\nkind = \"epk\"\npoints = \"test\"\noutputs = \"logits\"\nlabel = \"epk-logits\"\nblocks = \"diag\"\n\n[analysis]\ncharts = false");
    let text = base.clone() + "fsl = true\n";
    run(dir.path(), &text);
    let report = dir.path().join("report");
    assert!(!report.join("analysis/fsl-epk-test").exists(), "a kernel of the log-softmax outputs got a fit");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report.join("analysis/fsl-epk-logits/fsl.json")).unwrap()).unwrap();
    let summary = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(summary.contains("Function-space Laplace on `epk-logits`"), "{summary}");
    // The same fit through the API.
    let net = Trained::open(dir.path().join("cache/run")).unwrap();
    let train = net.epk().train_side().logits().layout(Layout::Diag).compute().unwrap();
    let rows = net.epk().test().logits().layout(Layout::Diag).compute().unwrap();
    let fsl = FslModel::fit(&net, &train, Curvature::ClassDiagonal, Prior::Evidence).unwrap();
    let probs = fsl.predict(&net, &rows).unwrap().probit();
    let study: Vec<f64> = json["probit"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    assert_eq!(study.len(), probs.len());
    let gap = study.iter().zip(&probs).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
    assert!(gap <= 1e-12, "study vs API probit {gap:e}");
    assert!((json["delta"].as_f64().unwrap() - fsl.delta()).abs() <= 1e-9 * fsl.delta());
    let nll = json["nll"].as_f64().unwrap();
    assert!(nll.is_finite() && nll > 0.0);
    // Without a kernel of the logits: refused before any work.
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, toml(3, 6, 0.5, 12, "auto:1e-12").replace("charts = false", "charts = false\nfsl = true")).unwrap();
    let opts = StudyOptions { out: Some(dir.path().join("bad-report")), cache: Some(dir.path().join("bad-cache")), base_dir: PathBuf::from("."), progress: false, command: "test".into() };
    let err = study::run(&file, &opts).unwrap_err().to_string();
    assert!(err.contains("outputs = \"logits\""), "{err}");
    assert!(!dir.path().join("bad-report").exists() && !dir.path().join("bad-cache").exists());
}

/// `[analysis] gp` on a kernel of the logits: the GP regresses the logits' change
/// (`z_{w_N} − z_{w_0}` at the training points, the engine's own copy of them agreeing to
/// 1e-12) over the logits' train × train Gram (the one function-space Laplace uses), and the
/// network it is compared with is the softmax of the logits; a GP asked to pair Grams on
/// different outputs is refused.
#[test]
fn gp_analysis_on_a_kernel_of_the_logits() {
    use pathkernel::api::Trained;
    use pathkernel::gp::GpParams;
    use pathkernel::kernel::Layout;
    use pathkernel::report::{gp_report, GpTargets};
    let dir = tempfile::tempdir().unwrap();
    let text = toml(3, 6, 0.5, 12, "auto:1e-12")
        .replace("kind = \"dpk\"\npoints = \"test\"\n", "kind = \"dpk\"\npoints = \"test\"\noutputs = \"logits\"\nlabel = \"dpk-logits\"\nblocks = \"diag\"\n")
        .replace("quadrature = \"auto:1e-12\"\npoints = \"test\"", "quadrature = \"auto:1e-12\"\npoints = \"test\"\noutputs = \"logits\"\nlabel = \"epk-logits\"\nblocks = \"diag\"")
        .replace("charts = false", "charts = false\ngp = true\nfsl = true");
    run(dir.path(), &text);
    let report = dir.path().join("report");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report.join("analysis/gp-epk-logits/gp.json")).unwrap()).unwrap();
    assert_eq!(json["outputs"], "logits", "{json}");
    let summary = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert!(summary.contains("GP on `epk-logits` (targets: the logits minus bias"), "{summary}");
    assert!(summary.contains("Function-space Laplace on `epk-logits`"), "{summary}");
    // The DPK's rows take function-space Laplace on the EPK's training-side Gram (the DPK's own
    // train × train Gram); only EPK kernels get the GP.
    assert!(summary.contains("Function-space Laplace on `dpk-logits`"), "{summary}");
    assert!(report.join("analysis/fsl-dpk-logits/fsl.json").exists() && !report.join("analysis/gp-dpk-logits").exists());
    // The targets the GP was fitted to, against the engine's logits at w_N and w_0.
    let bytes = std::fs::read(dir.path().join("cache/analysis/gp-epk-logits/gp.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let targets: Vec<f64> = st.tensor("targets").unwrap().data().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
    let net = Trained::open(dir.path().join("cache/run")).unwrap();
    let train = net.epk().train_side().logits().layout(Layout::Diag).compute().unwrap();
    let out = train.output();
    let change: Vec<f64> = out.network.iter().zip(&out.bias).map(|(f, b)| f - b).collect();
    assert_eq!(targets.len(), change.len());
    let scale = change.iter().fold(1.0f64, |a, v| a.max(v.abs()));
    let gap = targets.iter().zip(&change).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
    assert!(gap <= 1e-12 * scale, "GP targets vs the logits' change {gap:e}");
    // The network's outputs are not the logits here: a log-softmax train Gram is a different
    // target, and pairing it with rows on the logits is refused.
    assert!(out.network.iter().any(|v| *v > 0.0), "logits, not log-probabilities");
    let rows = net.epk().test().logits().layout(Layout::Diag).compute().unwrap();
    let train_net = net.epk().train_side().layout(Layout::Diag).compute().unwrap();
    let e = gp_report(&net, &train_net, &rows, &GpParams::new(), GpTargets::Network, 10, 0, dir.path()).unwrap_err().to_string();
    assert!(e.contains("same --outputs"), "{e}");
    // Function-space Laplace: DPK rows from the EPK's training-side fit, NTK rows refused.
    use pathkernel::api::FslModel;
    use pathkernel::gp::{Curvature, Prior};
    let fsl = FslModel::fit(&net, &train, Curvature::ClassDiagonal, Prior::Evidence).unwrap();
    let dpk = net.dpk().test().logits().layout(Layout::Diag).compute().unwrap();
    assert!(fsl.predict(&net, &dpk).is_ok());
    let ntk = net.ntk().test().logits().layout(Layout::Diag).compute().unwrap();
    let e = fsl.predict(&net, &ntk).unwrap_err().to_string();
    assert!(e.contains("cannot predict from ntk rows"), "{e}");
}
