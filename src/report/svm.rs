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
