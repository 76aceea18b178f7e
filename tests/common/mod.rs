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

/// Writes IDX files of seeded random 28×28 "MNIST" images and labels into `dir`.
pub fn fake_mnist(dir: &std::path::Path, n_train: u32, n_test: u32) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let idx = |ty: u8, dims: &[u32], data: Vec<u8>| -> Vec<u8> {
        let mut b = vec![0u8, 0, ty, dims.len() as u8];
        dims.iter().for_each(|d| b.extend_from_slice(&d.to_be_bytes()));
        b.extend(data);
        b
    };
    for (prefix, n) in [("train", n_train), ("t10k", n_test)] {
        // Sparse like MNIST: most pixels 0.
        let pixels: Vec<u8> = (0..n * 784).map(|_| if rng.gen_bool(0.3) { rng.gen_range(1..=255) } else { 0 }).collect();
        let labels: Vec<u8> = (0..n).map(|_| rng.gen_range(0..10)).collect();
        std::fs::write(dir.join(format!("{prefix}-images.idx3-ubyte")), idx(8, &[n, 28, 28], pixels)).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels.idx1-ubyte")), idx(8, &[n], labels)).unwrap();
    }
}
