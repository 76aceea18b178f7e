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
    let net = Trained::train(&RunConfig::mixture(2, 40, 30).mlp(&[16]).lr(0.5).steps(80), "../runs/notebook-attribution")?;
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
        let (x, y, m) = (net.x_train(), net.y_train()?, epk.points());
        let own: Vec<_> = at.items.iter().filter(|a| a.class == a.point).collect();
        let xy = |label: &str, idx: Vec<usize>| Series::xy(label, idx.iter().map(|&i| x[(i, 0)]), idx.iter().map(|&i| x[(i, 1)]));
        let mut series: Vec<Series> = (0..3).map(|c| xy(&format!("class {c}"), (0..y.len()).filter(|&i| y[i] == c).collect())).collect();
        series.push(xy("top supporters of the own class", own.iter().flat_map(|a| a.supporters.iter().map(|s| s.0)).collect()));
        series.push(xy("top opponents", own.iter().flat_map(|a| a.opponents.iter().map(|s| s.0)).collect()));
        series.push(Series::xy("class means", m.x.iter().step_by(2), m.x.iter().skip(1).step_by(2)));
        Chart::scatter("Training points, and who supports each class mean's own output", "x1", "x2", &series).draw()?
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
    // %% md
    // ## An SVM on the same Gram
    //
    // Would a one-vs-rest SVM (C = 1, SMO as in libsvm) on the train-side Gram choose weights
    // that predict like the network? The labels come from the run the Gram belongs to; the
    // predictions are at the test rows (class-diagonal blocks).
    // %%
    let rows = net.epk().layout(Layout::Diag).compute()?;
    let svm = SvmModel::fit(&train, &SvmParams::default())?;
    let predicted = svm.predict(&rows)?;
    println!("SVM test accuracy {:.1} %, agreeing with the network on {:.1} %", 100.0 * agreement(&predicted, net.y_test()?), 100.0 * agreement(&predicted, &rows.predicted()));
    show(&svm);
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
