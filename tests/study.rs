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
