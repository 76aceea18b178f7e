//! Notebook source for `uncertainty.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
use std::path::{Path, PathBuf};

use pathkernel::gp::{mc_softmax, GpParams};
use pathkernel::kernel::{self, KernelKind, KernelRequest, PointsSpec, Rule, Side};
use pathkernel::plot::{Chart, Grid2d, Heatmap};
use pathkernel::train::{train_to_dir, RunConfig, TrainOptions};
use pathkernel::trajectory::Run;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Uncertainty from the exact kernel: GP logit regression and Monte-Carlo softmax
    //
    // The EPK paper (§4.2) uses the kernel as the covariance of a Gaussian process that regresses the
    // network's logits, then pushes GP samples through the softmax. Here: the 2-D three-class toy,
    // the EPK between training points (train side, for the GP's covariance) and on a grid (test side),
    // one GP per class, and the standard deviation of the probabilities across the grid.
    // %%
    let config = RunConfig::from_toml(
        "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 40\nn_test = 30\n[model]\nkind = \"mlp\"\nhidden = [16]\n[train]\nlr = 0.5\nsteps = 80\n",
        Path::new("notebook"),
    )?;
    let out = PathBuf::from("../runs/notebook-uncertainty");
    train_to_dir(&config, &out, &TrainOptions { progress: false, force: true, base_dir: PathBuf::from(".."), memory_budget: None })?;
    let run = Run::open(&out)?;
    let states = run.load_all()?;
    // evcxr keeps every top-level variable between cells: none may be a closure or a borrow
    // (`tests/notebooks.rs` checks), so the progress callbacks below are passed inline.
    let train_req = KernelRequest { kind: KernelKind::Epk, rule: Rule::Auto(1e-12), side: Side::Train, ntk_step: None, per_step: false, steps: None };
    let train = kernel::compute(&run.manifest, &run.dataset, &states, &PointsSpec::Train.resolve(&run.dataset)?, &train_req, 1 << 32, &|_, _| {})?;
    let grid_req = KernelRequest { side: Side::Test, ..train_req.clone() };
    let grid_x = PointsSpec::Grid(25).resolve(&run.dataset)?;
    let grid = kernel::compute(&run.manifest, &run.dataset, &states, &grid_x, &grid_req, 1 << 32, &|_, _| {})?;
    println!("train x train: {train}");
    println!("grid x train: {grid}");
    // %% md
    // One GP per class k with covariance `s·K^{kk}`: the class blocks of the Gram. Targets are the
    // network's outputs at the training points minus the bias `b = log(1/3)`; noise and output scale
    // are fitted by maximising the log marginal likelihood.
    // %%
    // A function, not a closure: evcxr keeps every top-level variable between cells and cannot
    // keep a closure.
    /// The class-`c` block `[rows, m]` of a Gram `[rows, m, k, k]`.
    fn class_block(g: &[f64], rows: usize, m: usize, k: usize, c: usize) -> Vec<f64> {
        (0..rows * m).map(|idx| g[(idx * k + c) * k + c]).collect()
    }
    let (m, k, p) = (train.m, train.k, grid.p);
    let mut k_train = Vec::new();
    let mut k_cross = Vec::new();
    let mut k_diag = Vec::new();
    let gdiag = grid.diag.clone().expect("epk has a self-kernel");
    for c in 0..k {
        let mut b = class_block(&train.gram, m, m, k, c);
        for i in 0..m {
            for j in 0..i {
                let v = 0.5 * (b[i * m + j] + b[j * m + i]);
                b[i * m + j] = v;
                b[j * m + i] = v;
            }
        }
        k_train.extend(b);
        k_cross.extend(class_block(&grid.gram, p, m, k, c));
        k_diag.extend((0..p).map(|q| gdiag[(q * k + c) * k + c]));
    }
    let targets: Vec<f64> = train.network.iter().zip(&train.bias).map(|(f, b)| f - b).collect();
    let fitted = GpParams::new().fit_hyper(true).fit(&k_train, &targets, m, k)?;
    println!("noise {:?}\noutput scale {:?}\njitter {:?}", fitted.noise(), fitted.output_scale(), fitted.jitter_used());
    // %% md
    // Posterior at the grid points and the Monte-Carlo softmax posterior (1000 seeded samples per
    // point): where is the model unsure?
    // %%
    let post = fitted.predict(&k_cross, &k_diag, p)?;
    let mc = mc_softmax(&post, 1000, 0)?;
    let prob_std: Vec<f64> = mc.std_prob.chunks(k).map(|r| r.iter().sum::<f64>() / k as f64).collect();
    let kval: Vec<f64> = (0..p).map(|q| (0..k).map(|c| gdiag[(q * k + c) * k + c]).sum::<f64>() / k as f64).collect();
    let x = grid_x.x.clone();
    for q in (0..p).step_by(p / 12) {
        println!("x = ({:6.2}, {:6.2})  K(x,x) = {:10.1}  std of probabilities = {:.4}", x[2 * q], x[2 * q + 1], kval[q], prob_std[q]);
    }
    // %% md
    // A chart of both over the grid (shown here, and written next to the notebook): where does the
    // kernel's self-value grow, and where is the spread of the probabilities largest? (The paper's
    // Figure 5 reports larger kernel values and more confident probabilities far from the data;
    // `data/studies/toy-2d.toml` measures this along rays.)
    // %%
    /// Values at the 25 × 25 grid points `x` ([625, 2], x fastest) as a plottable grid.
    fn grid25(x: &[f64], values: Vec<f64>) -> Grid2d {
        Grid2d { nx: 25, ny: 25, x0: x[0], x1: x[2 * 24], y0: x[1], y1: x[2 * 624 + 1], values }
    }
    let fig5 = Chart::heatmaps(
        "EPK self-value and MC std of the softmax probabilities",
        &[
            Heatmap::new("log10 K(x, x), mean over classes", grid25(&x, kval.iter().map(|v| v.log10()).collect()), "log10 K(x, x)"),
            Heatmap::new("MC std of the probabilities, mean over classes", grid25(&x, prob_std), "std of p(class)"),
        ],
        None,
    )?;
    fig5.save(Path::new("uncertainty-fig5.png"))?;
    show(&fig5);
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr; a chart
/// inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
