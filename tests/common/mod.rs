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

fn idx_bytes(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8, 0, 8, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

/// MNIST-format files (the uncertainty tests'): digit `c` is a bright 6×6 square at a
/// class-specific place plus noise, in random order (so that per-class selection has work to
/// do), with 15 % label noise.
pub fn write_square_mnist(dir: &Path, n_train: usize, n_test: usize) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for (prefix, n) in [("train", n_train), ("t10k", n_test)] {
        let mut pixels = Vec::with_capacity(n * 784);
        let mut labels = Vec::with_capacity(n);
        for _ in 0..n {
            let c: usize = rng.gen_range(0..10);
            let (r0, c0) = (2 + 5 * (c / 5) * 2, 2 + 5 * (c % 5));
            for r in 0..28 {
                for col in 0..28 {
                    let inside = (r0..r0 + 6).contains(&r) && (c0..c0 + 6).contains(&col);
                    let base: f64 = if inside { 200.0 } else { 10.0 };
                    let v = base + rng.gen_range(-10.0..40.0);
                    pixels.push(v.clamp(0.0, 255.0) as u8);
                }
            }
            // Some label noise, so that no split is classified perfectly (the temperature's
            // optimum would then run off to T → 0).
            let label = if rng.gen_bool(0.15) { rng.gen_range(0..10) } else { c };
            labels.push(label as u8);
        }
        std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte")), idx_bytes(&[n as u32, 28, 28], &pixels)).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), idx_bytes(&[n as u32], &labels)).unwrap();
    }
}

/// `tests/data/REL` of this checkout.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

/// Copies the files of the fixture folder `tests/data/NAME` into `dst`.
pub fn copy_fixture(name: &str, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
}

/// Runs the binary with `args` in `cwd`; asserts success and returns stdout.
pub fn run_ok(args: &[&str], cwd: &Path) -> String {
    let o = std::process::Command::new(bin()).args(args).current_dir(cwd).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}
