//! The one-vs-rest SVM refit of the kernel machine's weights on a train Gram's class blocks,
//! evaluated at a row Gram: `svm.json` and `svm.parquet`.

use std::path::Path;

use faer::MatRef;
use serde::Serialize;

use super::{argmax_rows, row_labels};
use crate::api::{Gram, SvmModel, Trained};
use crate::error::Result;
use crate::io::{self, Column, Table};
use crate::kernel::Layout;
use crate::svm::{self, SvmParams};

/// Summary of `pathkernel svm` (`svm.json`).
#[derive(Clone, Debug, Serialize)]
pub struct SvmSummary {
    /// Parameters.
    pub params: SvmParams,
    /// Support vectors per class.
    pub support: Vec<usize>,
    /// SMO iterations per class.
    pub iterations: Vec<usize>,
    /// Accuracy against the row points' labels (when the rows are the test or training set).
    pub accuracy: Option<f64>,
    /// Agreement of the SVM's arg-max with the network's.
    pub agreement_with_network: f64,
    /// Row points.
    pub points: usize,
}

/// What [`svm_report`] computed.
#[derive(Clone, Debug)]
pub struct SvmReport {
    /// `svm.json`.
    pub summary: SvmSummary,
    decision: Vec<f64>,
    k: usize,
    /// The arg-max class at the rows. # Shapes `[P]`.
    pub predicted: Vec<usize>,
}

impl SvmReport {
    /// Decision values at the rows. # Shapes `[P, K]`.
    pub fn decision(&self) -> MatRef<'_, f64> {
        MatRef::from_row_major_slice(&self.decision, self.predicted.len(), self.k)
    }
}

/// One-vs-rest SVM refit ([`SvmModel`]) of the kernel machine's weights on `train`'s class
/// blocks, with the run's training labels; decision values at the rows of `rows`. Writes
/// `svm.parquet` and `svm.json` into `out_dir`.
///
/// Errors: those of [`SvmModel::fit`] and [`SvmModel::decision`], a regression run.
pub fn svm_report(net: &Trained, train: &Gram, rows: &Gram, params: &SvmParams, out_dir: &Path) -> Result<SvmReport> {
    train.require_train_rows("an SVM")?;
    train.require_layout(Layout::Diag, "the one-vs-rest SVM")?;
    rows.require_layout(Layout::Diag, "the one-vs-rest SVM")?;
    let (p, _, k) = rows.shape();
    let model = SvmModel::fit(train, params)?;
    let decision = model.decision(rows)?;
    let predicted = model.predict(rows)?;
    let network = net.network(&rows.points().x)?;
    let net_arg = argmax_rows(&network, k);
    let accuracy = row_labels(net, rows).map(|y| svm::agreement(&predicted, y));
    let mut t = Table::new().with("point", Column::I64((0..p as i64).collect()));
    for c in 0..k {
        t = t.with(&format!("decision_{c}"), Column::F64((0..p).map(|pi| decision[pi * k + c]).collect()));
    }
    t.with("predicted", Column::I64(predicted.iter().map(|&v| v as i64).collect()))
        .with("network", Column::I64(net_arg.iter().map(|&v| v as i64).collect()))
        .write_parquet(&out_dir.join("svm.parquet"))?;
    let summary = SvmSummary {
        params: params.clone(),
        support: model.support(),
        iterations: model.iterations(),
        accuracy,
        agreement_with_network: svm::agreement(&predicted, &net_arg),
        points: p,
    };
    io::write_json(&out_dir.join("svm.json"), &summary)?;
    Ok(SvmReport { summary, decision, k, predicted })
}

/// One value of C in the validation sweep of [`svm_sweep_report`] (`svm_sweep.parquet`).
#[derive(Clone, Debug, Serialize)]
pub struct SvmSweepRow {
    /// The box constraint.
    pub c: f64,
    /// Accuracy on the validation rows (what C is chosen by; ties go to the smaller C).
    pub validation_accuracy: f64,
    /// Accuracy on the test rows.
    pub test_accuracy: f64,
    /// Agreement of the SVM's arg-max with the network's on the test rows.
    pub agreement_with_network: f64,
    /// Support vectors, summed over the K one-vs-rest machines.
    pub support_total: usize,
    /// Seconds of the K fits and the two predictions.
    pub seconds: f64,
}

/// The chosen SVM's weights against the path's (`svm_vs_path.json`), per class `c` of the
/// one-vs-rest machines on the class-`c` block.
///
/// The path's weight of training point `i` in the class-`c` logit machine is
/// `A_i^c = Σ_s a_{i,s}^c` with `a_{i,s}^c = −ε_s ∂L/∂z^c(x_i)` on the logits (`= ε_s (y_ic −
/// p_{s,ic}) / M` for the mean cross-entropy), signed like the SVM's `y_i α_i`.
#[derive(Clone, Debug, Serialize)]
pub struct SvmVsPath {
    /// Support vectors per class (of M training points).
    pub support: Vec<usize>,
    /// Training points M (every one has a nonzero path weight).
    pub m: usize,
    /// Spearman correlation over all M points of `y_i α_i` with `A_i^c`, per class.
    pub spearman: Vec<f64>,
    /// Pearson correlation of the same, per class.
    pub pearson: Vec<f64>,
    /// Share of the class's support vectors among the `|support|` points with the largest
    /// `|A_i^c|` (1 = the SVM keeps exactly the points the path weighted most), per class.
    pub top_overlap: Vec<f64>,
    /// Points at the bound `α_i = C`, per class.
    pub at_bound: Vec<usize>,
}

/// What [`svm_sweep_report`] computed.
#[derive(Clone, Debug, Serialize)]
pub struct SvmSweep {
    /// Every C of the grid, in order.
    pub rows: Vec<SvmSweepRow>,
    /// The chosen C (best validation accuracy, the smaller C on ties).
    pub chosen_c: f64,
    /// The network's own accuracy on the test rows.
    pub network_test_accuracy: f64,
    /// The chosen machine against the path's weights.
    pub vs_path: SvmVsPath,
}

/// The one-vs-rest SVM refit ([`SvmModel`]) on `train`'s class blocks for every C of `grid`,
/// C chosen by the accuracy on `val` (rows of the validation images, labels `val_labels`),
/// evaluated on `test` (the run's test rows); the chosen machine's weights against the path's
/// (`A` `[M, K]`, see [`SvmVsPath`]). Writes `svm_sweep.parquet` and `svm_sweep.json` into
/// `out_dir`.
///
/// Errors: an empty or non-positive grid, labels of the wrong length, and those of
/// [`SvmModel::fit`] and [`SvmModel::predict`].
pub fn svm_sweep_report(net: &Trained, train: &Gram, val: &Gram, val_labels: &[usize], test: &Gram, path_a: &[f64], grid: &[f64], out_dir: &Path) -> Result<SvmSweep> {
    if grid.is_empty() || grid.iter().any(|c| !(c.is_finite() && *c > 0.0)) {
        return Err(crate::error::Error::Config(format!("analysis.svm_c: every C must be positive and finite, got {grid:?}")));
    }
    let (m, _, k) = train.shape();
    let test_labels = row_labels(net, test).ok_or_else(|| crate::error::Error::Config("the SVM sweep needs the run's test rows".into()))?;
    if val_labels.len() != val.shape().0 || path_a.len() != m * k {
        return Err(crate::error::Error::ShapeMismatch { what: "SVM sweep: validation labels [P_val], path weights [M, K]".into(), expected: vec![val.shape().0, m * k], got: vec![val_labels.len(), path_a.len()] });
    }
        let net_arg = argmax_rows(&net.network(&test.points().x)?, k);
    let network_test_accuracy = svm::agreement(&net_arg, test_labels);
    let mut rows = Vec::with_capacity(grid.len());
    let mut best: Option<(f64, SvmModel)> = None;
    for &c in grid {
        let t0 = std::time::Instant::now();
        let model = SvmModel::fit(train, &SvmParams::new().c(c))?;
        let vacc = svm::agreement(&model.predict(val)?, val_labels);
        let pred = model.predict(test)?;
        rows.push(SvmSweepRow {
            c,
            validation_accuracy: vacc,
            test_accuracy: svm::agreement(&pred, test_labels),
            agreement_with_network: svm::agreement(&pred, &net_arg),
            support_total: model.support().iter().sum(),
            seconds: t0.elapsed().as_secs_f64(),
        });
        if best.as_ref().is_none_or(|(b, _)| vacc > *b) {
            best = Some((vacc, model));
        }
    }
    let (_, model) = best.expect("grid is not empty");
    let chosen_c = rows.iter().find(|r| r.validation_accuracy == rows.iter().map(|r| r.validation_accuracy).fold(f64::MIN, f64::max)).expect("rows").c;
    let coef = model.dual_coefficients();
    let mut vs = SvmVsPath { support: model.support(), m, spearman: Vec::new(), pearson: Vec::new(), top_overlap: Vec::new(), at_bound: Vec::new() };
    for (c, yc) in coef.iter().enumerate() {
        let a: Vec<f64> = (0..m).map(|i| path_a[i * k + c]).collect();
        vs.spearman.push(crate::analysis::spearman(yc, &a));
        vs.pearson.push(crate::attribution::lds::pearson(yc, &a).unwrap_or(f64::NAN));
        let ns = vs.support[c];
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&i, &j| a[j].abs().total_cmp(&a[i].abs()).then(i.cmp(&j)));
        let top: std::collections::HashSet<usize> = order[..ns].iter().copied().collect();
        let shared = (0..m).filter(|i| yc[*i] != 0.0 && top.contains(i)).count();
        vs.top_overlap.push(if ns == 0 { f64::NAN } else { shared as f64 / ns as f64 });
        vs.at_bound.push(yc.iter().filter(|v| (v.abs() - chosen_c).abs() <= 1e-9 * chosen_c).count());
    }
    let col = |f: &dyn Fn(&SvmSweepRow) -> f64| Column::F64(rows.iter().map(f).collect());
    Table::new()
        .with("c", col(&|r| r.c))
        .with("validation_accuracy", col(&|r| r.validation_accuracy))
        .with("test_accuracy", col(&|r| r.test_accuracy))
        .with("agreement_with_network", col(&|r| r.agreement_with_network))
        .with("support_total", Column::I64(rows.iter().map(|r| r.support_total as i64).collect()))
        .with("seconds", col(&|r| r.seconds))
        .write_parquet(&out_dir.join("svm_sweep.parquet"))?;
    let out = SvmSweep { rows, chosen_c, network_test_accuracy, vs_path: vs };
    io::write_json(&out_dir.join("svm_sweep.json"), &out)?;
    Ok(out)
}
