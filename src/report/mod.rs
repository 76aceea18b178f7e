//! Report writers: the tables and JSON summaries of the analyses of a run's Grams, written by
//! `pathkernel gp`, `svm`, `attribute` and `stationarity` and by a study's `[analysis]`.
//!
//! Each writer takes typed values ([`Trained`], [`Gram`]), computes through [`crate::api`]
//! ([`GpModel`](crate::api::GpModel), [`SvmModel`](crate::api::SvmModel),
//! [`Gram::contributions`]) and returns what it wrote as a typed value, so a caller that charts
//! the result never reads the files back. A *train Gram* is a train × train kernel
//! (`.train_side()`, `pathkernel kernel --points train --side train`); a *row Gram* holds the
//! points of interest (test points, a grid) against the training set.
//!
//! | writer | files |
//! |---|---|
//! | [`gp_report`] | `gp.json`, `gp.parquet`, `gp_points.parquet`, `gp.safetensors` |
//! | [`svm_report`] | `svm.json`, `svm.parquet` |
//! | [`attribution_report`] | `attribution.json`, `attribution.parquet`, `contributions.safetensors` |
//! | [`stationarity_report`] | `stationarity.json`, `far_field.parquet`, `far_profile.parquet` |

mod attribution;
mod gp;
mod stationarity;
mod svm;

pub use attribution::{attribution_report, AttributionSummary};
pub use gp::{calibration, gp_report, Calibration, GpReport, GpSummary, GpTargets};
pub use stationarity::{kernel_stationarity, settings_far_field_report, stationarity_report, SettingFarField, SettingsFarField, StationarityReport, StationaritySummary};
pub use svm::{svm_report, svm_sweep_report, SvmReport, SvmSummary, SvmSweep, SvmSweepRow, SvmVsPath};

use crate::api::{Gram, Rows, Trained};
use crate::kernel::Outputs;
use crate::data::Targets;
use crate::error::{Error, Result};

/// The run's training labels (classification runs).
fn train_labels(net: &Trained) -> Result<&[usize]> {
    match &net.run().dataset.y_train {
        Targets::Labels(y) => Ok(y),
        Targets::Values(_) => Err(Error::Config("this analysis needs a classification run".into())),
    }
}

/// The labels of a Gram's rows, when they are the run's test or training points.
fn row_labels<'a>(net: &'a Trained, rows: &Gram) -> Option<&'a [usize]> {
    let ds = &net.run().dataset;
    match (rows.rows(), &ds.y_test, &ds.y_train) {
        (Rows::Test, Targets::Labels(y), _) | (Rows::Train, _, Targets::Labels(y)) => Some(y),
        _ => None,
    }
}

/// The GP's regression targets at the training points: `f_{w_N}(x_i) − f_{w_0}(x_i)` on the
/// outputs `outputs`, both from the network's forward pass. # Shapes `[M, K]`.
fn outputs_minus_bias(net: &Trained, outputs: Outputs) -> Result<Vec<f64>> {
    let x = &net.run().dataset.x_train;
    let f = forward_on(net, outputs, x, net.states().len() - 1)?;
    let b = forward_on(net, outputs, x, 0)?;
    Ok(f.iter().zip(&b).map(|(f, b)| f - b).collect())
}

/// The network at state `s` on the outputs `outputs` (as trained, or the logits).
/// # Shapes `x: [P, d]`, returns `[P, K]`.
fn forward_on(net: &Trained, outputs: Outputs, x: &[f64], s: usize) -> Result<Vec<f64>> {
    let mut arch = net.run().manifest.architecture.clone();
    if outputs == Outputs::Logits {
        arch.output = crate::model::OutputKind::Identity;
    }
    let states = net.states();
    arch.forward(&states[s], Some(&states[0]), x)
}

/// Which outputs a Gram is on, read off its `network` (the outputs at its row points at `w_N`)
/// against the network's two forward passes; for a network whose outputs are its logits
/// (regression) both agree and the answer is [`Outputs::Network`].
///
/// Errors: a Gram whose outputs are neither (another run, or rows that are not its points).
fn outputs_of(net: &Trained, g: &Gram, what: &str) -> Result<Outputs> {
    let x = &g.points().x;
    let held = &g.output().network;
    let last = net.states().len() - 1;
    for outputs in [Outputs::Network, Outputs::Logits] {
        let f = forward_on(net, outputs, x, last)?;
        let scale = f.iter().fold(1.0f64, |a, v| a.max(v.abs()));
        if f.len() == held.len() && crate::kernel::max_abs_diff(&f, held) <= 1e-9 * scale {
            return Ok(outputs);
        }
    }
    Err(Error::Config(format!("the {what} Gram's outputs are neither this network's outputs nor its logits at its points: a Gram of another run?")))
}

/// The arg-max of each row of `v`. # Shapes `v: [P, K]`, returns `[P]`.
fn argmax_rows(v: &[f64], k: usize) -> Vec<usize> {
    v.chunks(k).map(crate::data::argmax).collect()
}

/// Class block `c` of `g`, row-major. # Shapes `[P, M]`.
fn block(g: &Gram, c: usize) -> Result<Vec<f64>> {
    let b = g.class_block(c)?;
    Ok((0..b.nrows()).flat_map(|i| (0..b.ncols()).map(move |j| b[(i, j)])).collect())
}
