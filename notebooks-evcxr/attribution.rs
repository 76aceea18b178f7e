//! Notebook source for `attribution.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
use std::path::{Path, PathBuf};

use pathkernel::analysis::{attribute, contributions};
use pathkernel::kernel::{self, KernelKind, KernelRequest, PointsSpec, Rule, Side};
use pathkernel::train::{train_to_dir, RunConfig, TrainOptions};
use pathkernel::trajectory::Run;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Who supports a prediction?
    //
    // With cross-entropy on log-softmax outputs the kernel machine is a single machine
    // `f(x) = b + Σ_i Σ_k' a_{i,k'} K(x, x_i)[·, k']` (EPK paper, Theorem 3.7), so every prediction splits
    // exactly into one contribution per training point. We take the three class means of the 2-D toy as
    // test points (the paper's Figure 6) and list the training points that push each output up or down.
    // %%
    let config = RunConfig::from_toml(
        "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 40\nn_test = 30\n[model]\nkind = \"mlp\"\nhidden = [16]\n[train]\nlr = 0.5\nsteps = 80\n",
        Path::new("notebook"),
    )?;
    let out = PathBuf::from("../runs/notebook-attribution");
    train_to_dir(&config, &out, &TrainOptions { progress: false, force: true, base_dir: PathBuf::from(".."), memory_budget: None })?;
    let run = Run::open(&out)?;
    let states = run.load_all()?;
    let points = PointsSpec::ClassMeans.resolve(&run.dataset)?;
    let req = KernelRequest { kind: KernelKind::Epk, rule: Rule::Auto(1e-12), side: Side::Test, ntk_step: None, per_step: false, steps: None };
    let epk = kernel::compute(&run.manifest, &run.dataset, &states, &points, &req, 1 << 30, &|_, _| {})?;
    show(&epk);
    // %% md
    // Contributions `c[p, i, k] = Σ_k' a_{i,k'} K(x_p, x_i)[k, k']` and, for each class mean and
    // output, the five strongest supporters and opponents. The residual checks that the contributions
    // sum to the network's output minus the bias.
    // %%
    let (p, m, k) = (epk.p, epk.m, epk.k);
    let c = contributions(&epk.gram, &epk.a[..m * k], p, m, k)?;
    let at = attribute(&c, &epk.bias, &epk.network, &[0, 1, 2], p, m, k, 5)?;
    for a in &at {
        println!(
            "class mean {} output {}: f = {:8.4}, b = {:.4}, sum of contributions = {:8.4}, residual {:.1e}",
            a.point, a.class, a.output, a.bias, a.total, a.residual
        );
        println!("   supporters {:?}", a.supporters.iter().map(|(i, v)| (*i, (v * 1e3).round() / 1e3)).collect::<Vec<_>>());
        println!("   opponents  {:?}", a.opponents.iter().map(|(i, v)| (*i, (v * 1e3).round() / 1e3)).collect::<Vec<_>>());
    }
    // %% md
    // Where are the supporters? The training points' labels and positions of the top supporters of the
    // first class mean's own output:
    // %%
    let labels = match &run.dataset.y_train {
        pathkernel::data::Targets::Labels(y) => y.clone(),
        _ => unreachable!("classification"),
    };
    for (i, v) in &at[0].supporters {
        let x = &run.dataset.x_train[2 * i..2 * i + 2];
        println!("train point {i:3} (class {}) at ({:5.2}, {:5.2}): {v:+.4}", labels[*i], x[0], x[1]);
    }
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
