//! Notebook source for `attribution.ipynb` (evcxr); see `quickstart.rs` for how notebooks are built.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # Who supports a prediction? And is the kernel stationary?
    //
    // With cross-entropy on log-softmax outputs the kernel machine is a single machine
    // `f(x) = b + Σ_i Σ_k' a_{i,k'} K(x, x_i)[·, k']` (EPK paper, Theorem 3.7), so every prediction splits
    // exactly into one contribution per training point. We take the three class means of the 2-D toy as
    // test points (the paper's Figure 6) and list the training points that push each output up or down.
    // %%
    let net = Trained::train_toml(
        "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 40\nn_test = 30\n[model]\nkind = \"mlp\"\nhidden = [16]\n[train]\nlr = 0.5\nsteps = 80\n",
        "../runs/notebook-attribution",
    )?;
    let epk = net.epk().class_means().compute()?;
    show(&epk);
    // %% md
    // Contributions `c[p, i, k] = Σ_k' a_{i,k'} K(x_p, x_i)[k, k']` need all `K × K` blocks (the default
    // layout). For each class mean and output: the total of the contributions, the residual
    // `f − b − Σ_i c` (zero to rounding: the machine is exact) and the three strongest supporters.
    // %%
    let at = epk.attribute(&[0, 1, 2], 5)?;
    show(&at);
    // %% md
    // Where are the supporters? The training points coloured by class, and the five strongest
    // supporters and opponents of each class mean's own output (the paper's Figure 6):
    // %%
    let fig6 = {
        let x = &net.run().dataset.x_train;
        let labels = net.run().dataset.train_labels()?;
        let own: Vec<_> = at.items.iter().filter(|a| a.class == a.point).collect();
        let xy = |idx: Vec<usize>| Series::new("", idx.iter().map(|i| x[2 * i]).collect(), idx.iter().map(|i| x[2 * i + 1]).collect());
        let mut series: Vec<Series> = (0..3).map(|c| Series { label: format!("class {c}"), ..xy((0..labels.len()).filter(|&i| labels[i] == c).collect()) }).collect();
        series.push(Series { label: "top supporters of the own class".into(), ..xy(own.iter().flat_map(|a| a.supporters.iter().map(|s| s.0)).collect()) });
        series.push(Series { label: "top opponents".into(), ..xy(own.iter().flat_map(|a| a.opponents.iter().map(|s| s.0)).collect()) });
        let m = epk.points();
        series.push(Series::new("class means", (0..3).map(|q| m.x[2 * q]).collect(), (0..3).map(|q| m.x[2 * q + 1]).collect()));
        Chart::scatter("Training points, and who supports each class mean's own output", "x1", "x2", &series, false)?
    };
    show(&fig6);
    // %% md
    // ## Stationarity
    //
    // A stationary kernel depends on `x' − x` only (an RBF kernel does). How far is the EPK on the
    // training points from that? The score is 1 for a stationary kernel; the train-side Gram's trace
    // over classes and each class block:
    // %%
    let train = net.epk().train_side().layout(Layout::Diag).compute()?;
    println!("trace over classes: {}", train.stationarity(None, &StationarityOptions::default())?);
    for c in 0..3 {
        println!("class {c}: {}", train.stationarity(Some(c), &StationarityOptions::default())?);
    }
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
