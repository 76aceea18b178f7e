//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use pathkernel::train::{train_to_dir, RunConfig, TrainOptions};
use pathkernel::trajectory::Run;

/// Trains the configuration `toml` into `dir/name` and opens the run.
pub fn train(dir: &Path, name: &str, toml: &str) -> Run {
    let cfg = RunConfig::from_toml(toml, Path::new("test.toml")).expect("valid test config");
    let out = dir.join(name);
    train_to_dir(&cfg, &out, &TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }).expect("training succeeds");
    Run::open(&out).expect("run opens")
}

/// A small 2-D three-class mixture MLP configuration.
pub fn toy2d(hidden: &str, activation: &str, steps: usize, lr: f64, per_class: usize, n_test: usize) -> String {
    format!(
        r#"
[data]
kind = "gaussian-mixture"
dim = 2
per_class = {per_class}
n_test = {n_test}
seed = 3

[model]
kind = "mlp"
hidden = {hidden}
activation = "{activation}"

[train]
lr = {lr:?}
steps = {steps}
seed = 7
"#
    )
}

/// The path of the built binary.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pathkernel"))
}

/// Max |a − b|.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// Max |a| .
pub fn max_abs(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |m, v| m.max(v.abs()))
}
