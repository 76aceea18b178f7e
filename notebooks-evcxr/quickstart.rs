//! Notebook source for `quickstart.ipynb` (evcxr). `cargo test` compiles this file as an example and
//! checks that the notebook's cells are exactly the ones below; regenerate the notebook with
//! `UPDATE_NOTEBOOKS=1 cargo test --release --test notebooks`.
use std::path::{Path, PathBuf};

use pathkernel::kernel::{self, KernelKind, KernelRequest, PointsSpec, Rule, Side};
use pathkernel::train::{train_to_dir, RunConfig, TrainOptions};
use pathkernel::trajectory::Run;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Quick start: train → exact path kernel → exactness
    //
    // We train a small ReLU network on the 2-D version of the EPK paper's three-class Gaussian
    // mixture with full-batch gradient descent, recording every weight state, and then rebuild the
    // network as a kernel machine with the Exact Path Kernel (EPK). The kernel machine must agree with
    // the network to machine precision; the discrete path kernel (DPK) of prior work does not.
    // %%
    let config = RunConfig::from_toml(
        r#"
[data]
kind = "gaussian-mixture"
dim = 2
per_class = 50
n_test = 30
seed = 0

[model]
kind = "mlp"
hidden = [16]
activation = "relu"

[train]
lr = 0.5
steps = 60
"#,
        Path::new("notebook"),
    )?;
    let out = PathBuf::from("../runs/notebook-quickstart");
    let summary = train_to_dir(&config, &out, &TrainOptions { progress: false, force: true, base_dir: PathBuf::from(".."), memory_budget: None })?;
    show(&summary);
    // %% md
    // The run directory holds the manifest, the dataset and one safetensors file per weight state
    // `w_0 … w_N`. Open it and compute the EPK between the 30 held-out points and the 150 training
    // points with the adaptive, kink-aware quadrature (`auto:1e-12`).
    // %%
    let run = Run::open(&out)?;
    let states = run.load_all()?;
    let points = PointsSpec::Test.resolve(&run.dataset)?;
    let epk = kernel::compute(
        &run.manifest,
        &run.dataset,
        &states,
        &points,
        &KernelRequest { kind: KernelKind::Epk, rule: Rule::Auto(1e-12), side: Side::Test, ntk_step: None, per_step: false, steps: None },
        1 << 30,
        &|_, _| {},
    )?;
    show(&epk);
    // %% md
    // `max |err|` is the largest difference between the kernel machine
    // `b + Σ_s Σ_i a_{i,s} K_s(x, x_i)` and the network's log-softmax output over all points and
    // classes. The same with a single evaluation per step at `t = 0` (Domingos' discrete path
    // kernel):
    // %%
    let dpk = kernel::compute(
        &run.manifest,
        &run.dataset,
        &states,
        &points,
        &KernelRequest { kind: KernelKind::Dpk, rule: Rule::Gauss(1), side: Side::Test, ntk_step: None, per_step: false, steps: None },
        1 << 30,
        &|_, _| {},
    )?;
    println!("EPK max |kernel machine - network| = {:.2e}", epk.max_abs_error());
    println!("DPK max |kernel machine - network| = {:.2e}", dpk.max_abs_error());
    assert!(epk.max_abs_error() < 1e-11);
    // %% md
    // Per step, the predicted change of the output (from that step's kernel) against the network's
    // actual change, and the quadrature work the adaptive rule needed:
    // %%
    for r in epk.records.iter().step_by(10) {
        println!(
            "step {:3}: max |predicted - actual change| {:.1e} (change up to {:.3}), {:.1} gradient evaluations/point, {:.2} pieces",
            r.step, r.max_abs_error, r.max_abs_change, r.mean_evaluations, r.mean_pieces
        );
    }
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
