//! Notebook source for `your-data.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
//! Writes a small CSV under `../runs/notebook-your-data/` and imports the committed PyTorch
//! recording `tests/data/torch-trajectory/`.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Your data, your PyTorch run: table → train → EPK → GP → attribution
    //
    // Two ways in for your own problem, each step a line or two: (1) a CSV or parquet table,
    // trained here; (2) a network trained in PyTorch, its training loop recorded by
    // `scripts/record_torch_trajectory.py` and imported as a run. Either way the result is a
    // `Trained` run, and everything after that is the same: the exact path kernel (EPK), the
    // GP posterior on it, and which training points make a prediction.
    //
    // ## 1. A table file
    //
    // A CSV with a header row (a parquet file reads the same way). To keep the notebook
    // self-contained it writes its own: 150 fruits, three kinds (the label is a string column),
    // three measurements on very different scales and one column of noise. Point `path` at your
    // file instead.
    // %%
    std::fs::create_dir_all("../runs/notebook-your-data")?;
    let csv: String = std::iter::once("length_cm,width_cm,mass_g,ph,kind\n".to_string())
        .chain((0..150).map(|i| {
            // Deterministic noise of mean 0 and variance 1 (the sum of two incommensurate sines).
            let z = |j: f64| ((i as f64 + 1.0) * j).sin() + ((i as f64 + 1.0) * j * 1.618).sin();
            let (kind, length, width, mass) = match i % 3 {
                0 => ("apple", 7.0, 7.5, 180.0),
                1 => ("pear", 9.5, 6.5, 200.0),
                _ => ("quince", 9.0, 8.5, 290.0),
            };
            format!("{:.2},{:.2},{:.1},{:.2},{kind}\n", length + 0.9 * z(12.99), width + 0.8 * z(78.23), mass + 40.0 * z(37.72), 3.5 + 0.3 * z(4.14))
        }))
        .collect();
    std::fs::write("../runs/notebook-your-data/fruit.csv", &csv)?;
    println!("{}", csv.lines().take(4).collect::<Vec<_>>().join("\n"));
    // %% md
    // `[data] kind = "table"`: the label column (string classes are numbered in sorted order and
    // the mapping recorded), a stratified test split, and z-scores from the training split's
    // statistics. The rest is an ordinary run: a 4-16-3 ReLU MLP, 150 full-batch gradient steps,
    // every weight state recorded.
    // %%
    let net = Trained::train_toml(
        r#"
[data]
kind = "table"
path = "../runs/notebook-your-data/fruit.csv"
label = "kind"
test_fraction = 0.2
seed = 0
standardize = true

[model]
kind = "mlp"
hidden = [16]
activation = "relu"

[train]
lr = 0.5
steps = 150
"#,
        "../runs/notebook-your-data/run",
    )?;
    println!("{}", net.run().dataset.description);
    show(&net);
    // %% md
    // The EPK between the 30 held-out fruits and the 120 training fruits (all `K × K` blocks: the
    // attribution below needs them). Its kernel machine reproduces the network to rounding.
    // %%
    let epk = net.epk().compute()?;
    show(&epk);
    // %% md
    // The GP posterior of the logits: one GP per class on the train-side Gram (noise and scale
    // by marginal likelihood), predicting at the rows of `epk`.
    // %%
    let gp = GpModel::fit(&net.epk().train_side().compute()?)?;
    let post = gp.predict(&epk)?;
    show(&post);
    // %% md
    // Who makes the prediction for the first held-out fruit? Its output splits exactly into one
    // contribution per training fruit (the residual is rounding); the strongest supporters of
    // each class's output:
    // %%
    let who = epk.attribute(&[0], 5)?;
    {
        let (kinds, y_test, y_train) = (["apple", "pear", "quince"], net.y_test()?, net.y_train()?);
        let top = who.of(0, epk.predicted()[0])?;
        let support: Vec<&str> = top.supporters.iter().map(|s| kinds[y_train[s.0]]).collect();
        println!("test fruit 0 is a {}; the network says {}, supported most by training fruits of kinds {support:?}", kinds[y_test[0]], kinds[top.class]);
    }
    show(&who);
    // %% md
    // ## 2. A PyTorch training run
    //
    // `tests/data/torch-trajectory/` holds a recording made by `scripts/record_torch_trajectory.py`
    // (the few lines added to a float64 PyTorch loop): a 2-6-2 ReLU MLP trained by 20 SGD steps of
    // batch 8 on 24 two-moons points, one `state_dict` per step, the learning rates, the batches
    // and the data. The import checks every recorded update against `−ε_s ∇L_{B_s}(w_s)`
    // recomputed here before it writes the run (the same as `pathkernel import --from torch`).
    // %%
    let torch_net = Trained::import_torch("../tests/data/torch-trajectory", "../runs/notebook-your-data/torch")?;
    show(&torch_net);
    // %% md
    // SGD gives each step its own batch, so the weights `a_{i,s}` of the kernel machine change
    // from step to step: the attribution needs the per-step Grams (`.per_step()`).
    // %%
    let torch_epk = torch_net.epk().per_step().compute()?;
    show(&torch_epk);
    // %%
    let torch_gp = GpModel::fit(&torch_net.epk().train_side().compute()?)?;
    let torch_post = torch_gp.predict(&torch_epk)?;
    show(&torch_post);
    // %%
    let torch_who = torch_epk.attribute(&[0], 5)?;
    show(&torch_who);
    // %% md
    // The data are 2-D, so the GP's posterior can be drawn over the plane (class-diagonal blocks
    // suffice for the GP): its mean of the class-1 output minus the class-0 output (the network's
    // decision, > 0 for class 1) and the posterior standard deviation of the class-0 output, on a
    // 40 × 40 grid, with the 24 training points.
    // %%
    let grid = torch_net.epk().grid(40).layout(Layout::Diag).compute()?;
    let grid_post = torch_gp.predict(&grid)?;
    let margin: Vec<f64> = (0..grid_post.mean().nrows()).map(|p| grid_post.mean()[(p, 1)] - grid_post.mean()[(p, 0)]).collect();
    let sd0: Vec<f64> = grid_post.var().col(0).iter().map(|v| v.sqrt()).collect();
    let overlay = Overlay::points(torch_net.x_train().col(0).iter(), torch_net.x_train().col(1).iter(), torch_net.y_train()?);
    let plane = Chart::heatmaps(
        "GP on the EPK of the imported PyTorch run",
        &[
            Heatmap::new("posterior mean, output 1 − output 0", grid.on_grid(margin)?, "mean difference"),
            Heatmap::new("posterior sd of the class-0 output", grid.on_grid(sd0)?, "sd"),
        ],
        Some(&overlay),
    )?;
    show(&plane);
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
