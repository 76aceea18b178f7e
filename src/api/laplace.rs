//! Function-space Laplace in the notebook style: a GP prior `k/δ` on the logits with the
//! network as the mean and the softmax Hessian as the likelihood's curvature
//! ([`crate::gp::functional`]), fitted from the [`Gram`]s a notebook computes.
//!
//! ```
//! use pathkernel::api::*;
//! # fn main() -> Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let net = Trained::train_toml(
//!     "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 12\nn_test = 6\n[model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 20\n",
//!     dir.path().join("run"),
//! )?;
//! // The kernels on the logits: train × train (gradients at w_s on both sides) and test rows.
//! let train = net.epk().train_side().logits().layout(Layout::Diag).compute()?;
//! let rows = net.epk().logits().layout(Layout::Diag).compute()?;
//! let fsl = FslModel::fit(&net, &train, Curvature::Full, Prior::Evidence)?; // δ by the evidence
//! let pred = fsl.predict(&net, &rows)?;
//! let p = pred.probit();                       // [P, K] probabilities, rows sum to 1
//! assert!((p[..3].iter().sum::<f64>() - 1.0).abs() < 1e-12);
//! let mc = pred.mc(200, 0)?;                   // Monte Carlo from the K × K covariances
//! assert_eq!(mc.len(), p.len());
//! assert!(pred.variance().iter().all(|v| *v >= 0.0));
//! # Ok(()) }
//! ```

use std::fmt;

use super::gram::Gram;
use super::trained::Trained;
use crate::error::{Error, Result};
use crate::gp::functional::{calibrate, calibration_scales};
use crate::gp::{Calibration, Curvature, FslPredictive, FslRows, FslTrain, FunctionalLaplace, LogitPosterior, Prior};
use crate::kernel::max_abs_diff;

/// A function-space Laplace fit on a train × train Gram of a [`Trained`] network.
#[derive(Clone, Debug)]
pub struct FslModel {
    fsl: FunctionalLaplace,
    run_id: String,
    kind: crate::kernel::KernelKind,
    /// The train Gram's side: on the training side (both sides at `w_s`) the EPK's train × train
    /// Gram is the DPK's, so DPK rows may use it.
    side: crate::kernel::Side,
}

/// Whether rows of kind `rows` go with a fit on a train Gram of kind `fit` on side `side`: the
/// same kind, or DPK rows with the EPK's training-side Gram (every gradient at `w_s`: the DPK's
/// own train × train Gram, the same numbers).
fn rows_fit(fit: crate::kernel::KernelKind, side: crate::kernel::Side, rows: crate::kernel::KernelKind) -> bool {
    use crate::kernel::{KernelKind, Side};
    fit == rows || (fit == KernelKind::Epk && side == Side::Train && rows == KernelKind::Dpk)
}

/// The network's logits at `x` (`[P, d]` → `[P, K]`).
fn logits(net: &Trained, x: &[f64]) -> Result<Vec<f64>> {
    let run = net.run();
    let mut arch = run.manifest.architecture.clone();
    arch.output = crate::model::OutputKind::Identity;
    let states = net.states();
    arch.forward(&states[states.len() - 1], Some(&states[0]), x)
}

/// The class blocks `[K, P, M]` of a `diag` or `full` Gram.
fn class_blocks(g: &Gram) -> Result<Vec<f64>> {
    let (p, m, k) = g.shape();
    let mut out = Vec::with_capacity(k * p * m);
    for c in 0..k {
        let b = g.class_block(c)?;
        for q in 0..p {
            out.extend((0..m).map(|i| b[(q, i)]));
        }
    }
    Ok(out)
}

/// The class blocks `[K, P, M]` and the rows' self-kernel `[K, P]` of a rows Gram.
fn row_blocks(g: &Gram) -> Result<(Vec<f64>, Vec<f64>)> {
    let (p, _, k) = g.shape();
    let mut k_diag = Vec::with_capacity(k * p);
    for c in 0..k {
        k_diag.extend(g.self_kernel(c)?);
    }
    Ok((class_blocks(g)?, k_diag))
}

/// Refuses a Gram whose outputs are not the network's logits at its rows.
fn check_logits(net: &Trained, g: &Gram, what: &str) -> Result<()> {
    if g.run_id() != net.run().manifest.run_id {
        return Err(Error::Config(format!("the {what} Gram is of run {}, not of this network ({})", g.run_id(), net.run().manifest.run_id)));
    }
    let z = logits(net, &g.points().x)?;
    let net_out = &g.output().network;
    let scale = z.iter().fold(1.0f64, |a, v| a.max(v.abs()));
    if max_abs_diff(&z, net_out) > 1e-9 * scale {
        return Err(Error::Config(format!("the {what} Gram is not on the logits: compute it with `.logits()`")));
    }
    Ok(())
}

impl FslModel {
    /// Fits on `train`, the train × train Gram on the logits (`.train_side().logits()`, layout
    /// `diag` or `full`), with the curvature and δ (`Prior::Evidence` or `Prior::Fixed(δ)`).
    ///
    /// Errors: a Gram of another run, not on the logits or not on the training points; a
    /// regression run; every error of [`FunctionalLaplace::fit`].
    pub fn fit(net: &Trained, train: &Gram, curvature: Curvature, prior: Prior) -> Result<FslModel> {
        train.require_train_rows("function-space Laplace")?;
        check_logits(net, train, "training")?;
        let labels = match &net.run().dataset.y_train {
            crate::data::Targets::Labels(y) => y.clone(),
            crate::data::Targets::Values(_) => return Err(Error::Config("function-space Laplace needs a classification run".into())),
        };
        let (m, _, k) = train.shape();
        let out = train.output();
        let k_train = class_blocks(train)?;
        let t = FslTrain { k_train: &k_train, logits: &out.network, bias: &out.bias, labels: &labels, m, k };
        Ok(FslModel { fsl: FunctionalLaplace::fit(&t, curvature, prior)?, run_id: train.run_id().to_string(), kind: train.kind(), side: train.side() })
    }

    /// The predictive at the rows of `rows` (a Gram of the same kernel on the logits, with its
    /// self-kernel, layout `diag` or `full`; DPK rows also from the EPK's training-side fit,
    /// which is the DPK's train × train Gram).
    ///
    /// Errors: another kernel or run, not on the logits, no self-kernel, a `trace` layout.
    pub fn predict(&self, net: &Trained, rows: &Gram) -> Result<FslPrediction> {
        if !rows_fit(self.kind, self.side, rows.kind()) || rows.run_id() != self.run_id {
            return Err(Error::Config(format!("a fit on the {} of run {} cannot predict from {} rows of run {}", self.kind, self.run_id, rows.kind(), rows.run_id())));
        }
        check_logits(net, rows, "rows'")?;
        let (k_cross, k_diag) = row_blocks(rows)?;
        let r = FslRows { k_cross: &k_cross, k_diag: &k_diag, mean: &rows.output().network, p: rows.shape().0 };
        Ok(FslPrediction { pred: self.fsl.predict(&r)? })
    }

    /// δ by the validation NLL of the probit predictive over `logspace(−4, 4, 100)` (laplace-torch's
    /// `optimize_prior_precision(method='gridsearch')`), on validation rows with their labels; returns the sweep `(δ, NLL)`.
    ///
    /// Errors: as [`FslModel::predict`], and labels not matching the rows.
    pub fn grid_search(&mut self, net: &Trained, val: &Gram, labels: &[usize]) -> Result<Vec<(f64, f64)>> {
        check_logits(net, val, "validation")?;
        let (k_cross, k_diag) = row_blocks(val)?;
        let r = FslRows { k_cross: &k_cross, k_diag: &k_diag, mean: &val.output().network, p: val.shape().0 };
        self.fsl.grid_search(&r, labels, -4.0, 4.0, 100)
    }

    /// The prior precision δ (the GP prior is `k/δ`).
    pub fn delta(&self) -> f64 {
        self.fsl.delta()
    }

    /// The library fit (evidence, eigenvalues, δ's provenance).
    pub fn inner(&self) -> &FunctionalLaplace {
        &self.fsl
    }
}

impl fmt::Display for FslModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "function-space Laplace on the {} (logits), {} curvature: δ = {:.4e}", self.kind, self.fsl.curvature(), self.fsl.delta())
    }
}

/// A function-space Laplace predictive at some rows: the network's logits as the mean and the
/// `K × K` covariance `Σ*` per row.
#[derive(Clone, Debug)]
pub struct FslPrediction {
    pred: FslPredictive,
}

impl FslPrediction {
    /// The logit posterior (mean `[P, K]`, covariance `[P, K, K]`).
    pub fn posterior(&self) -> &LogitPosterior {
        &self.pred.post
    }

    /// The probit predictive `softmax(μ / √(1 + π/8 Σ_cc))`. # Shapes `[P, K]`.
    pub fn probit(&self) -> Vec<f64> {
        self.pred.post.probit(1.0, 1.0)
    }

    /// The probit predictive with a validation calibration (T on the mean, s on `Σ*`).
    /// # Shapes `[P, K]`.
    pub fn probit_calibrated(&self, cal: &Calibration) -> Vec<f64> {
        self.pred.post.probit(cal.temperature, cal.scale)
    }

    /// The Monte-Carlo softmax mean over `samples` seeded draws from each row's `Σ*`.
    /// # Shapes `[P, K]`.
    ///
    /// Errors: `samples = 0`.
    pub fn mc(&self, samples: usize, seed: u64) -> Result<Vec<f64>> {
        self.pred.post.mc_softmax(samples, seed)
    }

    /// Fits (T, s) on these rows, taken as validation rows with `labels`, by the probit NLL
    /// (every s of `calibration_scales`, T refitted at each; s = 0 is temperature scaling).
    ///
    /// Errors: labels not matching the rows.
    pub fn calibrate(&self, labels: &[usize]) -> Result<Calibration> {
        calibrate(&self.pred.post, labels, &calibration_scales())
    }

    /// The posterior variances `Σ*_cc` (clamped at 0). # Shapes `[P, K]`.
    pub fn variance(&self) -> Vec<f64> {
        let (p, k) = (self.pred.post.p, self.pred.post.k);
        (0..p * k).map(|i| self.pred.post.cov[(i / k * k + i % k) * k + i % k].max(0.0)).collect()
    }

    /// How many variances within rounding below 0 were set to 0, and the smallest before.
    pub fn clamped(&self) -> (usize, f64) {
        (self.pred.clamped, self.pred.min_variance)
    }
}

impl fmt::Display for FslPrediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.variance();
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        write!(f, "function-space Laplace predictive at {} rows × {} classes: mean variance {mean:.4e}, smallest {:.4e} ({} clamped)", self.pred.post.p, self.pred.post.k, self.pred.min_variance, self.pred.clamped)
    }
}
