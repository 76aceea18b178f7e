//! Notebook source for `uncertainty.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Uncertainty from the exact kernel: GP logit regression and Monte-Carlo softmax
    //
    // The EPK paper (§4.2) uses the kernel as the covariance of a Gaussian process that regresses the
    // network's logits, then pushes GP samples through the softmax. Here: the 2-D three-class toy,
    // the EPK between training points (train side, for the GP's covariance) and on a grid (test side),
    // one GP per class, and the standard deviation of the probabilities across the grid.
    // %%
    let net = Trained::train(&RunConfig::mixture(2, 40, 30).mlp(&[16]).lr(0.5).steps(80), "../runs/notebook-uncertainty")?;
    show(&net);
    // %% md
    // The GP needs only the class-diagonal blocks `K^{cc}` (`Layout::Diag`, a tenth of the work and
    // memory of all `K × K` blocks for ten classes). Its covariance is the train-side Gram: the
    // gradients at `t = 0` on both sides, `Σ_s ⟨∇f_{w_s}(x_i), ∇f_{w_s}(x_j)⟩`, symmetric. That Gram is
    // *not* the network's kernel machine (its `max |err|` is large by design: the exact machine
    // integrates the rows over each step); the grid's rows are on the test side, where it is exact.
    // %%
    let train = net.epk().train_side().layout(Layout::Diag).compute()?;
    show(&train);
    // %%
    let grid = net.epk().grid(25).layout(Layout::Diag).compute()?;
    show(&grid);
    // %% md
    // One GP per class `c` with covariance `s·K^{cc}`, targets the network's outputs at the training
    // points minus the bias `b = f_{w_0}`; noise and output scale by maximising the log marginal
    // likelihood. Then the posterior at the grid and the Monte-Carlo softmax (1000 seeded samples
    // per point).
    // %%
    let gp = GpModel::fit(&train)?;
    show(&gp);
    // %%
    let post = gp.predict(&grid)?;
    let mc = post.mc_softmax(1000, 0)?;
    show(&post);
    // %% md
    // Both over the grid: where does the kernel's self-value grow, and where is the spread of the
    // probabilities largest? (The paper's Figure 5 reports larger kernel values and more confident
    // probabilities far from the data; `data/studies/toy-2d.toml` measures this along rays.)
    // %%
    let log_self: Vec<f64> = grid.self_kernel_trace()?.iter().map(|v| (v / 3.0).log10()).collect();
    let prob_std: Vec<f64> = mc.std().row_iter().map(|r| r.iter().sum::<f64>() / 3.0).collect();
    let fig5 = Chart::heatmaps(
        "EPK self-value and MC std of the softmax probabilities",
        &[
            Heatmap::new("log10 K(x, x), mean over classes", grid.on_grid(log_self)?, "log10 K(x, x)"),
            Heatmap::new("MC std of the probabilities, mean over classes", grid.on_grid(prob_std)?, "std of p(class)"),
        ],
        None,
    )?;
    show(&fig5);
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
