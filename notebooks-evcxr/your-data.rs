//! Notebook source for `your-data.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
//! Writes a small CSV under `../runs/notebook-your-data/` and imports the committed PyTorch
//! recordings `tests/data/torch-trajectory/` and `tests/data/torch-stack-adamw/`.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Your data, your PyTorch run: table → train → EPK → GP → attribution
    //
    // Two ways in for your own problem, each step a line or two: (1) a CSV or parquet table,
    // trained here; (2) a network trained in PyTorch, its training loop recorded by
    // `scripts/record_torch_trajectory.py` and imported as a run. Either way the result is a
    // `Trained` run, and everything after that is the same: the exact path kernel (EPK), the
    // GP posterior on it, and which training points make a prediction. Section 3 imports a
    // PyTorch CNN (convolutions, residual blocks, layer norm, GELU; AdamW on mini-batches) the
    // same way, and draws the training images that support and oppose its predictions.
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
    // %% md
    // ## 3. Your PyTorch CNN
    //
    // A network that is not an MLP, trained the way one trains in PyTorch: an `nn.Sequential`
    // of a 3 × 3 convolution with ReLU and 2 × 2 average pooling, a residual block (convolution,
    // channel layer norm, GELU, convolution), a strided residual block (convolution, GELU) with a
    // 1 × 1 projection shortcut, flatten, layer norm and a linear head, trained by AdamW (lr 0.01,
    // weight decay 0.05) for 30 steps on shuffled mini-batches of 8 (10 epochs) of 24 grey
    // 8 × 8 images of three classes (a bright horizontal band, a vertical band, or the diagonal,
    // on noise), in float64. `tests/data/torch-stack-adamw/` is that run as
    // recorded by `scripts/make_torch_fixture.py` (`torch_model.record`): the module structure,
    // the optimizer and its hyper-parameters, every `state_dict`, the batches and the data. One
    // line imports it: the layers are rebuilt from the recorded modules and every AdamW update is
    // replayed here and checked against the recorded one before the run is written.
    // %%
    let cnn = Trained::import_torch("../tests/data/torch-stack-adamw", "../runs/notebook-your-data/torch-cnn")?;
    show(&cnn);
    // %% md
    // Its EPK between the 8 test images and the 24 training images. Under AdamW each step's kernel
    // is preconditioned by Adam's per-parameter step sizes (the `preconditioned` form), the weight
    // decay adds a term that belongs to no training point, and each mini-batch gives its own
    // `a_{i,s}`: `.per_step()` keeps every step's Gram for the attribution below. `machine` is
    // the exactness: the kernel machine against the network, over all test images and classes.
    // %%
    let cnn_epk = cnn.epk().per_step().compute()?;
    show(&cnn_epk);
    // %% md
    // The same check per step (the change of the output predicted by step `s`'s kernel against
    // the network's actual change), next to the discrete path kernel of prior work (one gradient
    // per step, at its start), which is not exact:
    // %%
    let cnn_dpk = cnn.dpk().compute()?;
    let cnn_steps = Chart::line("Imported AdamW CNN, per step: |predicted − actual change of the output|", "step", "max abs error over test images and classes", &[cnn_epk.step_errors("EPK"), cnn_dpk.step_errors("DPK")]).log_y().draw()?;
    show(&cnn_steps);
    // %% md
    // Who makes a prediction? The first test image of each class, the network's log-probability of
    // the class it predicts split into one contribution per training image (summed over the steps
    // on which that image was in the batch), and the 4 training images that pushed it up most
    // (supporters) and down most (opponents), with their contributions; `residual` is the output
    // minus the baseline and the 24 contributions, zero to rounding.
    // %%
    let cnn_who = cnn_epk.attribute(&[0, 1, 2], 4)?;
    show(&cnn_who);
    // %%
    let cnn_support = {
        let kinds = ["horizontal", "vertical", "diagonal"];
        let (x, x_train, y, y_test, c) = (cnn.x_test(), cnn.x_train(), cnn.y_train()?, cnn.y_test()?, cnn_epk.predicted());
        let mut tiles = Vec::new();
        for q in 0..3 {
            let a = cnn_who.of(q, c[q])?;
            tiles.push(ImageTile::square(x.row(q).iter(), vec![format!("test {q}: {}", kinds[y_test[q]]), format!("net says {}", kinds[c[q]]), format!("residual {:.0e}", a.residual)]));
            for (i, v) in a.supporters.iter().chain(&a.opponents) {
                tiles.push(ImageTile::square(x_train.row(*i).iter(), vec![format!("train {i}"), kinds[y[*i]].to_string(), format!("{v:+.3}")]));
            }
        }
        Chart::image_grid("Each test image, then its 4 strongest supporters and 4 strongest opponents (AdamW CNN)", &tiles, 9)?
    };
    show(&cnn_support);
    // %% md
    // Through convolutions, residual blocks, layer norms, Adam's preconditioning and shuffled
    // mini-batches the machine stays exact: about `1e-15` per step and `2e-14` over the 30 steps,
    // where the DPK is off by `1e-2` to `0.4` a step. Each test image's supporters are training
    // images of its own class (a band in the same place, or the diagonal), and its opponents are
    // images of the other classes: the steps that fitted those lowered this image's
    // log-probability of its class.
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
