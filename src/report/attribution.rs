//! Per-training-point contributions to chosen outputs of a row Gram, their strongest supporters
//! and opponents: `attribution.json`, `attribution.parquet` and `contributions.safetensors`.

use std::path::Path;

use serde::Serialize;

use crate::attribution::{self, Attribution};
use crate::api::{Gram, Trained};
use crate::error::{Error, Result};
use crate::io::{self, Column, NamedArray, Table};

/// Summary of `pathkernel attribute` (`attribution.json`).
#[derive(Clone, Debug, Serialize)]
pub struct AttributionSummary {
    /// Per chosen point and class.
    pub attributions: Vec<Attribution>,
    /// Largest |residual| = |network − bias − Σ_i contributions| (NaN if any is NaN).
    pub max_abs_residual: f64,
    /// Which machine the contributions come from.
    pub form: String,
}

/// Contributions `Σ_s a_{i,s} K_s(x_p, x_i)` of every training point to the outputs of rows
/// `points` of `gram` ([`Gram::contributions`]: the single machine, or the ensemble from the
/// per-step Grams), the `top` supporters and opponents of each, and the check that they sum to
/// the network output minus the [`Gram::baseline`] (the network by its forward pass). Writes
/// `attribution.parquet`, `contributions.safetensors` and `attribution.json` into `out_dir`.
///
/// Errors: no points or one out of range, and those of [`Gram::contributions`].
pub fn attribution_report(net: &Trained, gram: &Gram, points: &[usize], top: usize, out_dir: &Path) -> Result<AttributionSummary> {
    let (p, m, k) = gram.shape();
    if let Some(&bad) = points.iter().find(|&&q| q >= p) {
        return Err(Error::Config(format!("point {bad} is out of range: the kernel has {p} row points")));
    }
    if points.is_empty() {
        return Err(Error::Config("no points chosen".into()));
    }
    let contrib = gram.contributions()?;
    let form = if gram.constant_a() { "single machine (Theorem 3.7)" } else { "ensemble (Theorem 3.6)" };
    let network = net.network(&gram.points().x)?;
    let at = attribution::attribute(&contrib, &gram.baseline(), &network, points, p, m, k, top)?;
    let max_abs_residual = at.iter().map(|a| a.residual.abs()).fold(0.0, crate::kernel::nan_max);
    let (mut point, mut class, mut role, mut rank, mut train_index, mut value) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for a in &at {
        for (name, list) in [("supporter", &a.supporters), ("opponent", &a.opponents)] {
            for (r, (i, c)) in list.iter().enumerate() {
                point.push(a.point as i64);
                class.push(a.class as i64);
                role.push(name.to_string());
                rank.push(r as i64);
                train_index.push(*i as i64);
                value.push(*c);
            }
        }
    }
    Table::new()
        .with("point", Column::I64(point))
        .with("class", Column::I64(class))
        .with("role", Column::Str(role))
        .with("rank", Column::I64(rank))
        .with("train_index", Column::I64(train_index))
        .with("contribution", Column::F64(value))
        .write_parquet(&out_dir.join("attribution.parquet"))?;
    let sel: Vec<f64> = points.iter().flat_map(|&q| contrib[q * m * k..(q + 1) * m * k].iter().copied()).collect();
    io::write_safetensors(
        &out_dir.join("contributions.safetensors"),
        &[
            NamedArray::f64("contributions", vec![points.len(), m, k], sel),
            NamedArray::i64("points", vec![points.len()], points.iter().map(|&q| q as i64).collect()),
        ],
        None,
    )?;
    let s = AttributionSummary { attributions: at, max_abs_residual, form: form.to_string() };
    io::write_json(&out_dir.join("attribution.json"), &s)?;
    Ok(s)
}
