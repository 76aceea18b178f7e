//! Notebook source for `mnist.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
//! Needs the MNIST files: `bash data/fetch-mnist.sh` from the repository root.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Real MNIST: the network as a kernel machine, its uncertainty, and who supports a digit
    //
    // A 784-128-10 ReLU MLP (final layer zero-initialised) trained by full-batch gradient descent on
    // 500 MNIST images (the first 50 of each digit), 100 steps, pixels in [0, 1]. The notebook runs
    // in a few minutes on two cores; `data/studies/mnist-mlp.toml` does the same at 2 000 × 2 000 and
    // 200 steps.
    // %%
    let net = Trained::train_toml(
        r#"
[data]
kind = "mnist"
path = "../data/mnist"
per_class = 50
n_test = 200
normalize = false

[model]
kind = "mlp"
hidden = [128]
activation = "relu"
zero_last = true

[train]
optimizer = "gd"
lr = 0.5
steps = 100
seed = 0
"#,
        "../runs/notebook-mnist",
    )?;
    println!("test accuracy {:.1} %", 100.0 * net.test_accuracy()?);
    show(&net);
    // %% md
    // The EPK between the 200 test images and the 500 training images, class-diagonal blocks only
    // (what a per-class GP needs: a tenth of the work and memory of all `10 × 10` blocks). The kernel
    // machine is checked against the network for every layout: contracted with `a_{i,s}` on the fly.
    // %%
    let rows = net.epk().layout(Layout::Diag).compute()?;
    show(&rows);
    // %% md
    // ## GP posterior on the EPK
    //
    // One GP per class on the train-side Gram (gradients at `t = 0` on both sides: symmetric; it is
    // the covariance, not the exact machine, so its `max |err|` is large by design), targets the
    // network's outputs minus the bias, hyper-parameters by marginal likelihood; Monte-Carlo softmax
    // with 1 000 samples.
    // %%
    let train = net.epk().train_side().layout(Layout::Diag).compute()?;
    let gp = GpModel::fit(&train)?;
    show(&gp);
    // %%
    let post = gp.predict(&rows)?;
    let mc = post.mc_softmax(1000, 0)?;
    show(&post);
    // %% md
    // The test digits on which the GP is least sure: each image with its label, the network's
    // softmax probability of its arg-max and the GP's Monte-Carlo probability (± its standard
    // deviation across samples).
    // %%
    let grid = {
        let (x, y, f, p, sd) = (net.x_test(), net.y_test()?, rows.network(), mc.mean(), mc.std());
        let (cn, cg) = (rows.predicted(), mc.predicted());
        let tiles: Vec<ImageTile> = mc.least_confident(12).into_iter().map(|q| {
            let caption = vec![format!("label {}", y[q]), format!("net {}: {:.2}", cn[q], f[(q, cn[q])].exp()), format!("GP {}: {:.2} ± {:.2}", cg[q], p[(q, cg[q])], sd[(q, cg[q])])];
            ImageTile::square(x.row(q).iter(), caption)
        }).collect();
        Chart::image_grid("The 12 test digits with the least confident EPK-GP", &tiles, 6)?
    };
    show(&grid);
    // %% md
    // ## Who supports a digit?
    //
    // The exact machine splits every output into one contribution per training image (Theorem 3.7).
    // That needs all `10 × 10` blocks, so for three test images only: the full-layout EPK at those
    // inputs, the contributions to each image's predicted class, and the training images that push
    // it up most (supporters) and down most (opponents).
    // %%
    let three = net.epk().inputs(&net.run().dataset.x_test[..3 * 784]).compute()?;
    show(&three);
    // %%
    let at = three.attribute(&[0, 1, 2], 4)?;
    let support = {
        let (x, x_train, y, c) = (net.x_test(), net.x_train(), net.y_train()?, three.predicted());
        let mut tiles = Vec::new();
        for q in 0..3 {
            let a = at.of(q, c[q])?;
            tiles.push(ImageTile::square(x.row(q).iter(), vec![format!("test {q}: class {}", c[q]), format!("residual {:.0e}", a.residual)]));
            for (i, v) in a.supporters.iter().chain(&a.opponents) {
                tiles.push(ImageTile::square(x_train.row(*i).iter(), vec![format!("train {i} ({})", y[*i]), format!("{v:+.3}")]));
            }
        }
        Chart::image_grid("Each test image, then its 4 strongest supporters and 4 strongest opponents", &tiles, 9)?
    };
    show(&support);
    // %% md
    // ## The EPK and TRAK side by side
    //
    // TRAK (Park et al. 2023), the data-attribution field's standard, scores the same output,
    // `log p_c` of the predicted class, by a kernel regression on the final network's gradients
    // (of the log-odds `log(p/(1 − p))`, reweighted by `1 − p_i`): here with one model,
    // unprojected, at the relative ridge `λ = 1` that the attribution benchmark chose for it
    // on its tuning subsets (`reports/mnist-attribution`, which measures which of the two predicts
    // retraining better). Test image 0, its 4 strongest supporters and 4 strongest opponents by
    // the EPK's exact contributions (top row) and by TRAK (bottom row), and how the two rankings
    // agree over all 500 training images.
    // %%
    let (c0, m) = (three.predicted()[0], net.y_train()?.len());
    let epk0: Vec<f64> = {
        let (c, k) = (three.contributions()?, three.shape().2);
        (0..m).map(|i| c[i * k + c0]).collect()
    };
    let trak0 = trak(&net, &net.run().dataset.x_test[..784], &[c0], None, 1.0, 0)?;
    println!("Spearman correlation of the EPK's and TRAK's scores over the training images: {:.2}", spearman(&epk0, &trak0).unwrap_or(f64::NAN));
    let side = {
        let (x, x_train, y) = (net.x_test(), net.x_train(), net.y_train()?);
        let mut tiles = Vec::new();
        for (name, s) in [("EPK", &epk0), ("TRAK", &trak0)] {
            let (sup, opp) = extremes(s, 4);
            tiles.push(ImageTile::square(x.row(0).iter(), vec![format!("test 0: class {c0}"), format!("by {name}")]));
            for (i, v) in sup.iter().chain(&opp) {
                tiles.push(ImageTile::square(x_train.row(*i).iter(), vec![format!("train {i} ({})", y[*i]), format!("{v:+.2e}")]));
            }
        }
        Chart::image_grid("Test image 0, then its 4 strongest supporters and 4 strongest opponents: EPK (top), TRAK (bottom)", &tiles, 9)?
    };
    show(&side);
    // %% md
    // The EPK's supporters of this 7 are 7s and its opponents 9s and a 2: what pushed `log p_7` up
    // and down along the training path. TRAK's regression shares the credit among similar images,
    // so it ranks them differently, and can even call a 7 that the EPK ranks second (train 421) an
    // opponent: with the other 7s present, the regression predicts that leaving it out would raise
    // `log p_7`. Which of the two predicts retraining better is measured, not argued, in
    // `reports/mnist-attribution` (LDS over 50 retrainings): TRAK's, by a wide margin (0.68
    // against 0.22), while the EPK's self-attribution is the better detector of flipped labels.
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
