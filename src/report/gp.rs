//! The per-class GP (EPK paper §4.2) on a train Gram, predicted at a row Gram with a
//! Monte-Carlo softmax: `gp.json`, `gp.parquet`, `gp_points.parquet` and `gp.safetensors`.

use std::path::Path;

use serde::Serialize;

use super::{argmax_rows, block, forward_on, outputs_minus_bias, outputs_of, train_labels};
use crate::api::{Gram, GpModel, GpPrediction, Rows, Trained};
use crate::error::{Error, Result};
use crate::gp::{GpParams, McSoftmax};
use crate::io::{self, Column, NamedArray, Table};
use crate::kernel::{Layout, Outputs};
use crate::svm;

/// Which GP regression targets to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GpTargets {
    /// The outputs the Grams are on (the network's as trained, or its logits for Grams computed
    /// with `--outputs logits`) at the training points minus the bias `b` (what the kernel part
    /// of the machine explains); the bias is added back to the posterior mean.
    Network,
    /// One-hot labels (1 for the class, 0 otherwise).
    Labels,
}

/// Summary of `pathkernel gp` (`gp.json`).
#[derive(Clone, Debug, Serialize)]
pub struct GpSummary {
    /// Targets used.
    pub targets: GpTargets,
    /// The outputs the Grams and the targets are on (the network's, or its logits).
    pub outputs: Outputs,
    /// Parameters.
    pub params: GpParams,
    /// Noise per class (after fitting when requested).
    pub noise: Vec<f64>,
    /// Output scale per class.
    pub output_scale: Vec<f64>,
    /// Jitter actually added per class.
    pub jitter: Vec<f64>,
    /// Log marginal likelihood per class.
    pub log_marginal_likelihood: Vec<f64>,
    /// Monte-Carlo samples per point and the seed.
    pub samples: usize,
    /// MC seed.
    pub seed: u64,
    /// Row points P.
    pub points: usize,
    /// Mean posterior standard deviation over points and classes.
    pub mean_std: f64,
    /// Mean predictive entropy over points.
    pub mean_entropy: f64,
    /// Accuracy of the MC mean probabilities against the row points' labels (test points only).
    pub accuracy: Option<f64>,
    /// Agreement of the MC arg-max with the network's.
    pub agreement_with_network: f64,
    /// Calibration of the MC mean probabilities against the row points' labels (test points only).
    pub calibration: Option<Calibration>,
    /// The same measures for the network's own softmax probabilities, for comparison.
    pub network_calibration: Option<Calibration>,
}

/// What [`gp_report`] computed: the summary and the arrays behind the tables.
#[derive(Clone, Debug)]
pub struct GpReport {
    /// `gp.json`.
    pub summary: GpSummary,
    /// The logit posterior at the rows (bias included for [`GpTargets::Network`]).
    pub prediction: GpPrediction,
    /// The Monte-Carlo softmax at the rows. # Shapes `[P, K]` per field (`entropy`: `[P]`).
    pub mc: McSoftmax,
}

/// Calibration measures of predicted class probabilities against labels.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    /// Mean Brier score `Σ_k (p_k − [y = k])²`.
    pub brier: f64,
    /// Mean negative log-likelihood `−ln p_y` (unclamped: `+∞` for a true class given 0).
    pub nll: f64,
    /// Expected calibration error of the top-class probability over `GP_ECE_BINS` equal-width
    /// bins (conventions of [`crate::uncertainty::metrics`]).
    pub ece: f64,
}

/// Calibration of probabilities `probs` against `labels`, by the benchmark's metrics
/// ([`crate::uncertainty::metrics`]) with `GP_ECE_BINS` ECE bins.
///
/// Errors: those of the metrics (probabilities that are not a distribution, a label out of
/// range). # Shapes `probs: [P, K]`, `labels: [P]`.
pub fn calibration(probs: &[f64], labels: &[usize], k: usize) -> Result<Calibration> {
    use crate::uncertainty::metrics;
    Ok(Calibration { brier: metrics::brier(probs, labels, k)?, nll: metrics::nll(probs, labels, k)?, ece: metrics::ece(probs, labels, k, GP_ECE_BINS)? })
}

/// ECE bins of the `[analysis] gp` report (the uncertainty benchmark uses
/// [`crate::uncertainty::metrics::ECE_BINS`]).
pub(crate) const GP_ECE_BINS: usize = 10;

/// GP logit regression with `train`'s class blocks as covariance ([`GpModel`]), predicted at the
/// rows of `rows` (cross blocks and self-kernels), and a Monte-Carlo softmax posterior. Writes
/// `gp.safetensors` (its exact inputs and outputs), `gp.parquet`, `gp_points.parquet` and
/// `gp.json` into `out_dir`.
///
/// The targets are computed by the network's forward pass (not the kernel engine's copy of the
/// outputs, which can differ in the last bits).
///
/// Errors: those of [`GpModel::fit_targets`] and [`GpModel::predict`] (a train Gram whose rows
/// are not the training points, a `trace` layout, rows without a self-kernel), a regression run.
pub fn gp_report(net: &Trained, train: &Gram, rows: &Gram, params: &GpParams, targets: GpTargets, samples: usize, seed: u64, out_dir: &Path) -> Result<GpReport> {
    train.require_train_rows("a GP")?;
    train.require_layout(Layout::Diag, "a per-class GP")?;
    rows.require_layout(Layout::Diag, "a per-class GP")?;
    rows.self_kernel(0)?;
    let (m, _, k) = train.shape();
    let p = rows.shape().0;
    let y = train_labels(net)?;
    // The outputs both Grams are on: the network's (a classifier's log-softmax) or its logits.
    let outputs = outputs_of(net, train, "train")?;
    if outputs_of(net, rows, "row")? != outputs {
        return Err(Error::Config(format!("the train Gram is on the {outputs} outputs and the row Gram is not: compute both with the same --outputs")));
    }
    let tgt: Vec<f64> = match targets {
        GpTargets::Network => outputs_minus_bias(net, outputs)?,
        GpTargets::Labels => (0..m * k).map(|idx| if y[idx / k] == idx % k { 1.0 } else { 0.0 }).collect(),
    };
    let model = GpModel::fit_targets(train, params, &tgt, targets == GpTargets::Network)?;
    let prediction = model.predict(rows)?;
    let post = &prediction.posterior;
    let mc = prediction.mc_softmax(samples, seed)?;
    let network = forward_on(net, outputs, &rows.points().x, net.states().len() - 1)?;
    let net_arg = argmax_rows(&network, k);
    let mc_arg = argmax_rows(&mc.mean_prob, k);
    let test_labels = match (rows.rows(), &net.run().dataset.y_test) {
        (Rows::Test, crate::data::Targets::Labels(yt)) => Some(yt),
        _ => None,
    };
    let accuracy = test_labels.map(|yt| svm::agreement(&mc_arg, yt));
    let calib = test_labels.map(|yt| calibration(&mc.mean_prob, yt, k)).transpose()?;
    let net_probs: Vec<f64> = match outputs {
        Outputs::Network => network.iter().map(|v| v.exp()).collect(),
        Outputs::Logits => crate::uncertainty::metrics::softmax_rows(&network, k)?,
    };
    let net_calib = test_labels.map(|yt| calibration(&net_probs, yt, k)).transpose()?;
    let fitted = model.fitted();
    let mut k_train = Vec::with_capacity(k * m * m);
    let mut k_cross = Vec::with_capacity(k * p * m);
    let mut k_test_diag = Vec::with_capacity(k * p);
    for c in 0..k {
        let b = train.symmetric_class_block(c)?;
        k_train.extend((0..m * m).map(|idx| b[(idx / m, idx % m)]));
        k_cross.extend(block(rows, c)?);
        k_test_diag.extend(rows.self_kernel(c)?);
    }
    io::write_safetensors(
        &out_dir.join("gp.safetensors"),
        &[
            NamedArray::f64("k_train", vec![k, m, m], k_train),
            NamedArray::f64("k_cross", vec![k, p, m], k_cross),
            NamedArray::f64("k_test_diag", vec![k, p], k_test_diag),
            NamedArray::f64("targets", vec![m, k], tgt),
            NamedArray::f64("noise", vec![k], fitted.noise()),
            NamedArray::f64("output_scale", vec![k], fitted.output_scale()),
            NamedArray::f64("jitter", vec![k], fitted.jitter_used()),
            NamedArray::f64("mean", vec![p, k], post.mean.clone()),
            NamedArray::f64("var", vec![p, k], post.var.clone()),
            NamedArray::f64("points", vec![p, rows.points().dim], rows.points().x.clone()),
        ],
        None,
    )?;
    let point: Vec<i64> = (0..p * k).map(|idx| (idx / k) as i64).collect();
    let class: Vec<i64> = (0..p * k).map(|idx| (idx % k) as i64).collect();
    let std: Vec<f64> = post.var.iter().map(|v| v.sqrt()).collect();
    Table::new()
        .with("point", Column::I64(point))
        .with("class", Column::I64(class))
        .with("mean", Column::F64(post.mean.clone()))
        .with("var", Column::F64(post.var.clone()))
        .with("std", Column::F64(std.clone()))
        .with("network", Column::F64(network))
        .with("mc_mean_prob", Column::F64(mc.mean_prob.clone()))
        .with("mc_std_prob", Column::F64(mc.std_prob.clone()))
        .with("mc_se_mean_prob", Column::F64(mc.se_mean_prob.clone()))
        .write_parquet(&out_dir.join("gp.parquet"))?;
    Table::new()
        .with("point", Column::I64((0..p as i64).collect()))
        .with("entropy", Column::F64(mc.entropy.clone()))
        .with("se_entropy", Column::F64(mc.se_entropy.clone()))
        .with("mean_std", Column::F64(std.chunks(k).map(|r| r.iter().sum::<f64>() / k as f64).collect()))
        .write_parquet(&out_dir.join("gp_points.parquet"))?;
    let summary = GpSummary {
        targets,
        outputs,
        params: params.clone(),
        noise: fitted.noise(),
        output_scale: fitted.output_scale(),
        jitter: fitted.jitter_used(),
        log_marginal_likelihood: fitted.log_marginal_likelihood(),
        samples,
        seed,
        points: p,
        mean_std: std.iter().sum::<f64>() / std.len().max(1) as f64,
        mean_entropy: mc.entropy.iter().sum::<f64>() / p.max(1) as f64,
        accuracy,
        agreement_with_network: svm::agreement(&mc_arg, &net_arg),
        calibration: calib,
        network_calibration: net_calib,
    };
    io::write_json(&out_dir.join("gp.json"), &summary)?;
    Ok(GpReport { summary, prediction, mc })
}
