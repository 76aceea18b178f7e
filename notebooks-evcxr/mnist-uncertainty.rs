//! Notebook source for `mnist-uncertainty.ipynb` (evcxr); see `quickstart.rs` for how notebooks are
//! built. Reads the committed report `reports/mnist-uncertainty/` (`pathkernel study run
//! data/studies/mnist-uncertainty.toml` writes it); computes no network or kernel.
use pathkernel::api::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // %% md
    // # MNIST uncertainty: calibration and rotation shift, read from the benchmark's report
    //
    // The benchmark (`data/studies/mnist-uncertainty.toml`) trains a 784-128-10 ReLU MLP on
    // 2 000 MNIST images and scores every method's predicted probabilities on the clean test set,
    // on the first 1 000 test images rotated by 15° … 180°, and on two out-of-distribution sets.
    // Its report keeps every per-point probability (`predictions.parquet`) and every metric
    // (`metrics.parquet`). This notebook opens that report (no network is trained, no kernel
    // computed): the metrics are recomputed from the probabilities on opening, and the charts
    // are drawn from them.
    // %%
    let uq = UqReport::open("../reports/mnist-uncertainty")?;
    show(&uq);
    // %% md
    // ## The best kernel predictive
    //
    // Function-space Laplace (`src/gp/functional.rs`) is fitted on each kernel of the study
    // (`fsl-{kernel}-{curvature}`: the NTK at `w_N`, the EPK, …; class-diagonal or full softmax
    // curvature), with the probit link, Monte Carlo (`-mc`), a validation temperature (`-T`), a
    // validation temperature and variance scale (`-Ts`), or δ by a validation grid (`-grid`).
    // The one shown below is picked here by the lowest NLL at 60° of rotation; the table holds
    // every variant's NLL, the best of each column marked.
    // %%
    let best = uq.best("fsl-", "rot-60", Metric::Nll)?;
    let fsl: Vec<String> = uq.methods().into_iter().filter(|m| m.starts_with("fsl-")).collect();
    let fsl_nll = uq.table(&fsl, Metric::Nll)?;
    println!("lowest rot-60 NLL among the {} fsl-* methods: {best}", fsl.len());
    show(&fsl_nll);
    // %% md
    // ## Four methods side by side
    //
    // The network's softmax (`map`), temperature scaling (one temperature fitted on 500 validation
    // images), last-layer Laplace (λ by the evidence, Monte-Carlo predictive) and that kernel
    // predictive. NLL and ECE in every labelled setting, and the OOD AUROC of the maximum
    // probability (uniform noise, inverted digits):
    // %%
    let shown = vec!["map".to_string(), "temperature".into(), "laplace".into(), best.clone()];
    let nll = uq.table(&shown, Metric::Nll)?;
    show(&nll);
    // %%
    let ece = uq.table(&shown, Metric::Ece)?;
    show(&ece);
    // %%
    let auroc = uq.table(&shown, Metric::AurocMsp)?;
    show(&auroc);
    // %% md
    // Reliability diagrams on the clean test set (2 000 images; 15 bins of the top-label
    // confidence, the bins of the ECE): a bar per bin up to its accuracy, the red band up to the
    // bin's mean confidence (the dot on the diagonal), and the bin's share of the points in grey.
    // %%
    let reliability = uq.reliability("clean", &shown)?;
    show(&reliability);
    // %% md
    // The NLL against the rotation angle (0° is the clean test set):
    // %%
    let nll_vs_angle = uq.vs_angle(Metric::Nll, &shown)?;
    show(&nll_vs_angle);
    // %% md
    // How to read them: the kernel predictive chosen for its NLL under shift is not the one to
    // use on clean data. In this report its clean reliability diagram has the accuracy above the
    // confidence in nearly every bin (under-confident: its probit variance softens the network's
    // probabilities where they were right), which gives it the worst clean ECE of the four;
    // from 30° on the same softening makes it the best of the four in NLL and ECE, and it is the
    // best of the four OOD detectors by maximum probability. The validation-calibrated variants
    // (`-T`, `-Ts`) trade back: on clean images their NLL is below temperature scaling's and
    // their ECE close to it; under shift they gain much less (first table).
    Ok(())
}

/// In the notebook, `show(&x);` is the cell's last expression `x` (rendered by evcxr: a table, or
/// a chart inline).
fn show<T: std::fmt::Display>(x: &T) {
    println!("{x}");
}
