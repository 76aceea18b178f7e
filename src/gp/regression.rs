//! Gaussian-process uncertainty from precomputed Gram matrices (EPK paper §4.2).
//!
//! "We use a GP to regress to logits, then Monte-Carlo to estimate posteriors w.r.t.
//! probabilities": [`GpParams::fit`] fits one independent GP per output class `c` with covariance
//! `s·K^{cc}` (a class block of an exact path kernel Gram, or any other PSD Gram) and Gaussian
//! noise `σ²`; [`FittedGp::predict`] / [`FittedGp::predict_cov`] give the posterior over the
//! logits at test points; [`mc_softmax`] pushes that posterior through the softmax by seeded
//! Monte Carlo.
//!
//! All matrices are `f64`, row-major, flattened. The Cholesky factorisation and the triangular
//! solves are done with `faer` (parallel over the global rayon pool).
//!
//! Model of class `c` (targets `y = targets[:, c]`, `A = s·K + (σ² + j)·I`, `j` the jitter used):
//! * `α = A⁻¹ y`, `log p(y) = −½ yᵀα − Σᵢ log Lᵢᵢ − (M/2) log 2π` with `A = L Lᵀ`;
//! * `mean(x) = s·k_*ᵀ α`, `var(x) = s·k(x, x) − s²·k_*ᵀ A⁻¹ k_*`.

use crate::error::{Error, Result};
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{
    cholesky_in_place, cholesky_in_place_scratch, LltError, LltRegularization,
};
use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::{
    solve_lower_triangular_in_place, solve_upper_triangular_in_place,
};
use faer::{Accum, Mat, Par};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Largest accepted relative asymmetry `max|a_ij − a_ji| / max|a_ij|` of a kernel block.
pub(crate) const SYMMETRY_TOL: f64 = 1e-10;
/// First non-zero jitter of the escalation, relative to the mean diagonal of `s·K`.
pub(crate) const JITTER_FLOOR_REL: f64 = 1e-12;
/// Hyper-parameter search range of `log10(σ² / (s·d̄))`, `d̄` the mean diagonal of `K`.
pub(crate) const HYPER_NOISE_RATIO_LOG10: (f64, f64) = (-10.0, 2.0);
/// Hyper-parameter search range of the prior variance `s·d̄` (`d̄` the mean diagonal of `K`).
pub(crate) const HYPER_PRIOR_VARIANCE: (f64, f64) = (1e-12, 1e12);

const LN_2PI: f64 = 1.837_877_066_409_345_5;

fn par() -> Par {
    Par::rayon(0)
}

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

/// Estimator parameters of the per-class GP regression, checked once in [`GpParams::fit`].
///
/// Builder style: `GpParams::new().noise(1e-4).output_scale(2.0).fit(...)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpParams {
    /// Observation-noise variance `σ² ≥ 0` added to the diagonal of `s·K` (default `1e-6`).
    /// With `fit_hyper` this is the starting value of the search.
    pub noise: f64,
    /// First jitter `j₀ ≥ 0` tried on top of the noise (default `0`).
    pub jitter: f64,
    /// Largest jitter tried, **relative to the mean diagonal of `s·K`** (default `1e-2`): the
    /// escalation stops at `max_jitter · mean(diag(s·K))`.
    pub max_jitter: f64,
    /// Output scale `s > 0` multiplying the kernel (default `1`). With `fit_hyper` this is the
    /// starting value of the search.
    pub output_scale: f64,
    /// Maximise the log marginal likelihood over `σ²` and `s`, per class (default `false`).
    pub fit_hyper: bool,
}

impl Default for GpParams {
    fn default() -> Self {
        Self { noise: 1e-6, jitter: 0.0, max_jitter: 1e-2, output_scale: 1.0, fit_hyper: false }
    }
}

impl GpParams {
    /// The defaults: `noise = 1e-6`, `jitter = 0`, `max_jitter = 1e-2`, `output_scale = 1`,
    /// `fit_hyper = false`.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the noise variance `σ²`.
    pub fn noise(mut self, v: f64) -> Self {
        self.noise = v;
        self
    }
    /// Sets the first jitter tried (absolute, added to the diagonal).
    pub fn jitter(mut self, v: f64) -> Self {
        self.jitter = v;
        self
    }
    /// Sets the largest jitter, relative to the mean diagonal of `s·K`.
    pub fn max_jitter(mut self, v: f64) -> Self {
        self.max_jitter = v;
        self
    }
    /// Sets the output scale `s`.
    pub fn output_scale(mut self, v: f64) -> Self {
        self.output_scale = v;
        self
    }
    /// Switches the marginal-likelihood fit of `σ²` and `s` on or off.
    pub fn fit_hyper(mut self, b: bool) -> Self {
        self.fit_hyper = b;
        self
    }

    fn check(&self) -> Result<()> {
        if !(self.noise.is_finite() && self.noise >= 0.0) {
            return Err(Error::Config(format!("GP noise must be finite and >= 0, got {}", self.noise)));
        }
        if !(self.jitter.is_finite() && self.jitter >= 0.0) {
            return Err(Error::Config(format!("GP jitter must be finite and >= 0, got {}", self.jitter)));
        }
        if !(self.max_jitter.is_finite() && self.max_jitter >= 0.0) {
            return Err(Error::Config(format!(
                "GP max_jitter must be finite and >= 0, got {}",
                self.max_jitter
            )));
        }
        if !(self.output_scale.is_finite() && self.output_scale > 0.0) {
            return Err(Error::Config(format!(
                "GP output_scale must be finite and > 0, got {}",
                self.output_scale
            )));
        }
        Ok(())
    }

    /// Fits one independent GP per output class `c` with covariance `s·K^{cc}` and noise `σ²`.
    ///
    /// Per class: `A = s·K^{cc} + (σ² + j)·I = L Lᵀ` (faer Cholesky), `α = A⁻¹ y_c`.
    ///
    /// **Jitter escalation.** `j = jitter` is tried first (0 allowed); if the factorisation fails,
    /// `j = max(10·jitter, 1e-12·d̄ₛ)` and then ×10 per attempt, capped at (and ending with)
    /// `max_jitter·d̄ₛ`, where `d̄ₛ` is the mean diagonal of `s·K^{cc}` (1 if that is not
    /// positive). A factorisation *fails* when faer meets a non-positive pivot, or when a pivot
    /// `Lᵢᵢ²` is below the rounding floor `M·ε·Aᵢᵢ` (numerically singular: such a factor would be
    /// garbage). The jitter used is reported per class (`FittedGp::jitter_used`); if the last
    /// attempt fails, `Err(NotPositiveDefinite { pivot, jitter_tried })` gives its failing pivot
    /// and jitter.
    ///
    /// **Hyper-parameters** (`fit_hyper`): per class, `log p(y)` is maximised over
    /// `r = σ²/s` with `s` profiled out exactly (`s*(r) = yᵀ(K + r I)⁻¹y / M`, clamped so that the
    /// prior variance `s·d̄` lies in `HYPER_PRIOR_VARIANCE`); `log10(r/d̄)` is searched in
    /// `HYPER_NOISE_RATIO_LOG10` = `[−10, 2]` (i.e. `σ² ∈ [1e-10, 1e2]·s·d̄`, `d̄` the mean
    /// diagonal of `K^{cc}`) by a 13-point grid (one per decade) followed by golden-section
    /// refinement to 1e-3 decades around the best grid point. Candidates whose factorisation
    /// fails count as `−∞`. The starting point (`noise`, `output_scale`) is kept if its
    /// likelihood is higher than the search's, so the fit never lowers the LML. The search uses
    /// no jitter; the final fit then applies the usual escalation from `jitter` (so with a
    /// non-zero `jitter` the reported LML is that of `σ² + j`). Cost: ≈ 32 Cholesky
    /// factorisations per class.
    ///
    /// Errors: `Config` (bad parameters), `Data` (empty, non-finite or asymmetric input),
    /// `ShapeMismatch`, `NotPositiveDefinite`, `Numerical`.
    ///
    /// # Shapes
    /// * `k_train`: `[K, M, M]` — `K = k` class blocks, each symmetric (relative asymmetry
    ///   ≤ `SYMMETRY_TOL`);
    /// * `targets`: `[M, K]` — regression targets (logits) per training point and class.
    pub fn fit(&self, k_train: &[f64], targets: &[f64], m: usize, k: usize) -> Result<FittedGp> {
        self.check()?;
        if m == 0 || k == 0 {
            return Err(Error::Data(format!(
                "GP fit needs at least one training point and one class (got M = {m}, K = {k})"
            )));
        }
        check_len("k_train [K, M, M]", k_train.len(), &[k, m, m])?;
        check_len("targets [M, K]", targets.len(), &[m, k])?;
        check_finite("k_train [K, M, M]", k_train, &[k, m, m])?;
        check_finite("targets [M, K]", targets, &[m, k])?;
        let mm = m * m;
        for c in 0..k {
            check_symmetric(&format!("k_train class {c}"), &k_train[c * mm..(c + 1) * mm], m)?;
        }
        let mut classes = Vec::with_capacity(k);
        for c in 0..k {
            let kb = &k_train[c * mm..(c + 1) * mm];
            let y: Vec<f64> = (0..m).map(|i| targets[i * k + c]).collect();
            let (noise, scale) = if self.fit_hyper {
                optimise_hyper(kb, &y, m, self.noise, self.output_scale, c)?
            } else {
                (self.noise, self.output_scale)
            };
            classes.push(fit_class(kb, &y, m, noise, scale, self.jitter, self.max_jitter)?);
        }
        Ok(FittedGp { m, k, classes })
    }
}

// ---------------------------------------------------------------------------------------------
// Fitted model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct ClassFit {
    /// Lower Cholesky factor of `A = s·K + (σ² + j)·I` (only the lower triangle is meaningful).
    l: Mat<f64>,
    /// `A⁻¹ y`.
    alpha: Vec<f64>,
    jitter: f64,
    noise: f64,
    scale: f64,
    lml: f64,
    /// `tr(A)`, used for the rounding tolerance of the posterior variance.
    trace: f64,
}

/// A fitted per-class GP: Cholesky factors, `α`, and the hyper-parameters actually used.
///
/// Memory: one dense `M × M` factor per class (`8·K·M²` bytes). `Debug` prints a summary (not
/// the factors).
#[derive(Clone)]
pub struct FittedGp {
    m: usize,
    k: usize,
    classes: Vec<ClassFit>,
}

/// Posterior over the logits at `p` test points (independent classes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Posterior {
    /// Posterior means `s·k_*ᵀα`. # Shapes `[P, K]`.
    pub mean: Vec<f64>,
    /// Posterior variances `s·k(x,x) − s²·k_*ᵀA⁻¹k_*` (≥ 0). # Shapes `[P, K]`.
    pub var: Vec<f64>,
    /// Number of test points `P`.
    pub p: usize,
    /// Number of classes `K`.
    pub k: usize,
}

impl std::fmt::Debug for FittedGp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FittedGp")
            .field("m", &self.m)
            .field("k", &self.k)
            .field("noise", &self.noise())
            .field("output_scale", &self.output_scale())
            .field("jitter_used", &self.jitter_used())
            .field("log_marginal_likelihood", &self.log_marginal_likelihood())
            .finish()
    }
}

impl FittedGp {
    /// Number of training points `M`.
    pub fn n_train(&self) -> usize {
        self.m
    }
    /// Number of classes `K`.
    pub(crate) fn n_classes(&self) -> usize {
        self.k
    }
    /// Jitter added on top of the noise, per class (0 when the first attempt succeeded with
    /// `jitter = 0`). # Shapes `[K]`.
    pub(crate) fn jitter_used(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.jitter).collect()
    }
    /// Noise variance `σ²` per class (fitted when `fit_hyper`). # Shapes `[K]`.
    pub fn noise(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.noise).collect()
    }
    /// Output scale `s` per class (fitted when `fit_hyper`). # Shapes `[K]`.
    pub fn output_scale(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.scale).collect()
    }
    /// Log marginal likelihood `−½yᵀα − Σ log Lᵢᵢ − (M/2) log 2π` per class, of the matrix
    /// actually factorised (jitter included). # Shapes `[K]`.
    pub fn log_marginal_likelihood(&self) -> Vec<f64> {
        self.classes.iter().map(|c| c.lml).collect()
    }
    /// `α = A⁻¹ y` of class `class` (the kernel-machine weights, up to the factor `s`), or
    /// `None` if `class ≥ K`. # Shapes `[M]`.
    pub fn alpha(&self, class: usize) -> Option<&[f64]> {
        self.classes.get(class).map(|c| c.alpha.as_slice())
    }

    /// Posterior mean and variance of the logits at `p` test points.
    ///
    /// `mean = s·k_*ᵀα`, `var = s·k_** − ‖L⁻¹(s·k_*)‖²`. A negative variance is clamped to 0 only
    /// if it is within the first-order rounding bound
    /// `4(M+1)ε·tr(A)·‖A⁻¹s·k_*‖² + 4ε(s·k_** + ‖L⁻¹s·k_*‖²)`; otherwise `Err(Numerical)` (the
    /// test kernels are inconsistent with the training Gram, or the Gram is too ill-conditioned
    /// for the noise).
    ///
    /// # Shapes
    /// * `k_cross`: `[K, P, M]`, `k_cross[c, p, i] = K^{cc}(x_p, x_i)`;
    /// * `k_test_diag`: `[K, P]`, `K^{cc}(x_p, x_p)`;
    /// * returns `Posterior { mean: [P, K], var: [P, K] }`.
    pub fn predict(&self, k_cross: &[f64], k_test_diag: &[f64], p: usize) -> Result<Posterior> {
        let (m, k) = (self.m, self.k);
        check_len("k_cross [K, P, M]", k_cross.len(), &[k, p, m])?;
        check_len("k_test_diag [K, P]", k_test_diag.len(), &[k, p])?;
        check_finite("k_cross [K, P, M]", k_cross, &[k, p, m])?;
        check_finite("k_test_diag [K, P]", k_test_diag, &[k, p])?;
        let mut mean = vec![0.0; p * k];
        let mut var = vec![0.0; p * k];
        for (c, cf) in self.classes.iter().enumerate() {
            let kc = &k_cross[c * p * m..(c + 1) * p * m];
            for q in 0..p {
                mean[q * k + c] = cf.scale * dot(&kc[q * m..(q + 1) * m], &cf.alpha);
            }
            let v = self.whiten(cf, kc, p);
            for q in 0..p {
                let col = v.col_as_slice(q);
                let prior = cf.scale * k_test_diag[c * p + q];
                var[q * k + c] = checked_var(cf, c, q, prior, col)?;
            }
        }
        check_output_finite("posterior mean", &mean)?;
        Ok(Posterior { mean, var, p, k })
    }

    /// Full posterior covariance of the logits per class:
    /// `s·K_** − s²·K_*ᵀ A⁻¹ K_*` (symmetrised; the diagonal is computed and checked exactly as
    /// in [`FittedGp::predict`], so it equals `predict`'s `var` when `k_test`'s diagonal equals
    /// `k_test_diag`).
    ///
    /// # Shapes
    /// * `k_cross`: `[K, P, M]`;
    /// * `k_test`: `[K, P, P]`, each block symmetric (relative asymmetry ≤ `SYMMETRY_TOL`);
    /// * returns `[K, P, P]`.
    pub fn predict_cov(&self, k_cross: &[f64], k_test: &[f64], p: usize) -> Result<Vec<f64>> {
        let (m, k) = (self.m, self.k);
        check_len("k_cross [K, P, M]", k_cross.len(), &[k, p, m])?;
        check_len("k_test [K, P, P]", k_test.len(), &[k, p, p])?;
        check_finite("k_cross [K, P, M]", k_cross, &[k, p, m])?;
        check_finite("k_test [K, P, P]", k_test, &[k, p, p])?;
        let pp = p * p;
        for c in 0..k {
            check_symmetric(&format!("k_test class {c}"), &k_test[c * pp..(c + 1) * pp], p)?;
        }
        let mut out = vec![0.0; k * pp];
        for (c, cf) in self.classes.iter().enumerate() {
            let kc = &k_cross[c * p * m..(c + 1) * p * m];
            let kt = &k_test[c * pp..(c + 1) * pp];
            let v = self.whiten(cf, kc, p);
            let s = cf.scale;
            let mut cov = Mat::from_fn(p, p, |i, j| s * kt[j * p + i]);
            matmul(cov.as_mut(), Accum::Add, v.as_ref().transpose(), v.as_ref(), -1.0, par());
            let o = &mut out[c * pp..(c + 1) * pp];
            for i in 0..p {
                for j in 0..i {
                    let x = 0.5 * (cov[(i, j)] + cov[(j, i)]);
                    o[i * p + j] = x;
                    o[j * p + i] = x;
                }
                o[i * p + i] = checked_var(cf, c, i, s * kt[i * p + i], v.col_as_slice(i))?;
            }
            check_output_finite("posterior covariance", o)?;
        }
        Ok(out)
    }

    /// `V = L⁻¹ (s·K_*ᵀ)`, `M × P`.
    fn whiten(&self, cf: &ClassFit, kc: &[f64], p: usize) -> Mat<f64> {
        let m = self.m;
        let s = cf.scale;
        let mut v = Mat::from_fn(m, p, |i, q| s * kc[q * m + i]);
        solve_lower_triangular_in_place(cf.l.as_ref(), v.as_mut(), par());
        v
    }
}

/// `prior − ‖v‖²`, clamped at 0 within rounding, else an error.
fn checked_var(cf: &ClassFit, c: usize, q: usize, prior: f64, v: &[f64]) -> Result<f64> {
    let vv: f64 = v.iter().map(|x| x * x).sum();
    let d = prior - vv;
    if d >= 0.0 {
        return Ok(d);
    }
    // First-order rounding bound: the computed ‖v‖² is k_*ᵀ(A + E)⁻¹k_* with
    // ‖E‖₂ ≲ (M+1)ε·tr(A); its error is ≲ ‖E‖·‖A⁻¹k_*‖², A⁻¹k_* = L⁻ᵀv.
    let m = v.len();
    let mut w = Mat::from_fn(m, 1, |i, _| v[i]);
    solve_upper_triangular_in_place(cf.l.as_ref().transpose(), w.as_mut(), Par::Seq);
    let ww: f64 = w.col_as_slice(0).iter().map(|x| x * x).sum();
    let eps = f64::EPSILON;
    let tol = 4.0 * (m as f64 + 1.0) * eps * cf.trace * ww + 4.0 * eps * (prior.abs() + vv);
    if -d <= tol {
        Ok(0.0)
    } else {
        Err(Error::Numerical(format!(
            "GP class {c}, test point {q}: posterior variance {d:e} is negative beyond rounding \
             (tolerance {tol:e}; prior s·k(x,x) = {prior:e}, explained {vv:e}); the test kernels \
             are inconsistent with the training Gram or it is too ill-conditioned (raise noise)"
        )))
    }
}

// ---------------------------------------------------------------------------------------------
// Factorisation, escalation, hyper-parameters
// ---------------------------------------------------------------------------------------------

/// Cholesky of `scale·K + diag_add·I`; `Err(pivot)` on a non-positive or sub-rounding pivot.
/// Returns the factor and `tr(A)`.
fn factor(kb: &[f64], m: usize, scale: f64, diag_add: f64) -> std::result::Result<(Mat<f64>, f64), usize> {
    // Column-major fill from the row-major block, read contiguously (kb[j*m+i] = K[j][i]); the
    // block is symmetric to SYMMETRY_TOL, faer reads the lower triangle.
    let mut a = Mat::from_fn(m, m, |i, j| {
        let x = scale * kb[j * m + i];
        if i == j {
            x + diag_add
        } else {
            x
        }
    });
    let diag: Vec<f64> = (0..m).map(|i| a[(i, i)]).collect();
    let trace: f64 = diag.iter().sum();
    let par = par();
    let mut buf = MemBuffer::new(cholesky_in_place_scratch::<f64>(m, par, Default::default()));
    let res = cholesky_in_place(
        a.as_mut(),
        LltRegularization::default(),
        par,
        MemStack::new(&mut buf),
        Default::default(),
    );
    if let Err(LltError::NonPositivePivot { index }) = res {
        return Err(index);
    }
    let floor = m as f64 * f64::EPSILON;
    for (i, &aii) in diag.iter().enumerate() {
        let l = a[(i, i)];
        let d = l * l;
        if !(d.is_finite() && d > floor * aii.max(0.0)) {
            return Err(i);
        }
    }
    Ok((a, trace))
}

/// `A⁻¹ b` from the lower factor `L` of `A`.
fn chol_solve(l: &Mat<f64>, b: &[f64]) -> Vec<f64> {
    let mut x = Mat::from_fn(b.len(), 1, |i, _| b[i]);
    solve_lower_triangular_in_place(l.as_ref(), x.as_mut(), par());
    solve_upper_triangular_in_place(l.as_ref().transpose(), x.as_mut(), par());
    x.col_as_slice(0).to_vec()
}

fn sum_log_diag(l: &Mat<f64>) -> f64 {
    (0..l.nrows()).map(|i| l[(i, i)].ln()).sum()
}

fn mean_diag(kb: &[f64], m: usize) -> f64 {
    (0..m).map(|i| kb[i * m + i]).sum::<f64>() / m as f64
}

/// Positive reference level for relative jitters/bounds: `x` if positive and finite, else 1.
fn positive_ref(x: f64) -> f64 {
    if x > 0.0 && x.is_finite() {
        x
    } else {
        1.0
    }
}

fn fit_class(
    kb: &[f64],
    y: &[f64],
    m: usize,
    noise: f64,
    scale: f64,
    j0: f64,
    max_jitter_rel: f64,
) -> Result<ClassFit> {
    let refd = positive_ref(scale * mean_diag(kb, m));
    let jmax = max_jitter_rel * refd;
    let mut j = j0;
    let mut first = true;
    loop {
        match factor(kb, m, scale, noise + j) {
            Ok((l, trace)) => {
                let alpha = chol_solve(&l, y);
                if alpha.iter().any(|x| !x.is_finite()) {
                    return Err(Error::Numerical(format!(
                        "GP fit: non-finite weights α (noise {noise:e}, jitter {j:e}, scale {scale:e})"
                    )));
                }
                let lml = -0.5 * dot(y, &alpha) - sum_log_diag(&l) - 0.5 * m as f64 * LN_2PI;
                if !lml.is_finite() {
                    return Err(Error::Numerical(format!("GP fit: non-finite log marginal likelihood {lml}")));
                }
                return Ok(ClassFit { l, alpha, jitter: j, noise, scale, lml, trace });
            }
            Err(pivot) => {
                if j >= jmax {
                    return Err(Error::NotPositiveDefinite { pivot, jitter_tried: j });
                }
                let next = if first { (j0 * 10.0).max(JITTER_FLOOR_REL * refd) } else { j * 10.0 };
                first = false;
                j = next.min(jmax);
            }
        }
    }
}

/// Profile log-likelihood at ratio `r = σ²/s`: returns `(lml, s*, σ²)` or `None` if
/// `K + r·I` is not numerically positive definite.
fn profile_lml(kb: &[f64], y: &[f64], m: usize, r: f64, dbar: f64) -> Option<(f64, f64, f64)> {
    let (l, _) = factor(kb, m, 1.0, r).ok()?;
    let a = chol_solve(&l, y);
    let q = dot(y, &a);
    let mf = m as f64;
    let s = (q / mf).clamp(HYPER_PRIOR_VARIANCE.0 / dbar, HYPER_PRIOR_VARIANCE.1 / dbar);
    let lml = -0.5 * q / s - 0.5 * mf * s.ln() - sum_log_diag(&l) - 0.5 * mf * LN_2PI;
    lml.is_finite().then_some((lml, s, r * s))
}

/// LML at fixed `(σ², s)` without jitter, or `None` if not PD.
fn fixed_lml(kb: &[f64], y: &[f64], m: usize, noise: f64, scale: f64) -> Option<f64> {
    let (l, _) = factor(kb, m, scale, noise).ok()?;
    let a = chol_solve(&l, y);
    let lml = -0.5 * dot(y, &a) - sum_log_diag(&l) - 0.5 * m as f64 * LN_2PI;
    lml.is_finite().then_some(lml)
}

/// Maximises the LML of one class over `(σ², s)`; returns `(σ², s)`.
fn optimise_hyper(kb: &[f64], y: &[f64], m: usize, noise0: f64, scale0: f64, c: usize) -> Result<(f64, f64)> {
    let dbar = positive_ref(mean_diag(kb, m));
    let (lo, hi) = HYPER_NOISE_RATIO_LOG10;
    // best = (lml, σ², s)
    let mut best: Option<(f64, f64, f64)> = None;
    let eval = |t: f64, best: &mut Option<(f64, f64, f64)>| -> f64 {
        match profile_lml(kb, y, m, 10f64.powf(t) * dbar, dbar) {
            Some((lml, s, noise)) => {
                if best.is_none_or(|b| lml > b.0) {
                    *best = Some((lml, noise, s));
                }
                lml
            }
            None => f64::NEG_INFINITY,
        }
    };
    let n_grid = (hi - lo).round() as usize + 1;
    let grid: Vec<f64> = (0..n_grid).map(|i| lo + i as f64).collect();
    let vals: Vec<f64> = grid.iter().map(|&t| eval(t, &mut best)).collect();
    let (ib, &vb) = vals
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .expect("grid is non-empty");
    if vb == f64::NEG_INFINITY {
        return Err(Error::Numerical(format!(
            "GP hyper-parameter search, class {c}: K + σ²/s·I is not numerically positive \
             definite for any σ²/s in [1e{lo}, 1e{hi}]·mean_diag(K)"
        )));
    }
    // Golden-section maximisation on the bracket around the best grid point.
    let gr = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = ((grid[ib] - 1.0).max(lo), (grid[ib] + 1.0).min(hi));
    let mut x1 = b - gr * (b - a);
    let mut x2 = a + gr * (b - a);
    let mut f1 = eval(x1, &mut best);
    let mut f2 = eval(x2, &mut best);
    while b - a > 1e-3 {
        if f1 >= f2 {
            b = x2;
            x2 = x1;
            f2 = f1;
            x1 = b - gr * (b - a);
            f1 = eval(x1, &mut best);
        } else {
            a = x1;
            x1 = x2;
            f1 = f2;
            x2 = a + gr * (b - a);
            f2 = eval(x2, &mut best);
        }
    }
    let (lml, noise, scale) = best.expect("at least one feasible grid point");
    match fixed_lml(kb, y, m, noise0, scale0) {
        Some(l0) if l0 >= lml => Ok((noise0, scale0)),
        _ => Ok((noise, scale)),
    }
}

// ---------------------------------------------------------------------------------------------
// Monte-Carlo softmax
// ---------------------------------------------------------------------------------------------

/// Monte-Carlo estimate of the predictive class probabilities under a logit posterior.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct McSoftmax {
    /// `E[softmax(z)]` estimated by the sample mean. # Shapes `[P, K]`.
    pub mean_prob: Vec<f64>,
    /// Sample standard deviation (denominator `n − 1`) of `softmax(z)_c`. # Shapes `[P, K]`.
    pub std_prob: Vec<f64>,
    /// Monte-Carlo standard error of `mean_prob`: `std_prob / √n`. # Shapes `[P, K]`.
    pub se_mean_prob: Vec<f64>,
    /// Predictive entropy `H(p̄) = −Σ_c p̄_c ln p̄_c` (nats) of the mean probability vector.
    /// (The plug-in estimate has an `O(1/n)` bias, negligible against `se_entropy` for large
    /// `n`.) # Shapes `[P]`.
    pub entropy: Vec<f64>,
    /// Standard error of `entropy` by the **delta method**:
    /// `√(gᵀ Ĉ g / n)`, `g_c = −(ln p̄_c + 1)`, `Ĉ` the sample covariance of the probability
    /// vectors (computed exactly in a second pass over the same draws). # Shapes `[P]`.
    pub se_entropy: Vec<f64>,
    /// Number of Monte-Carlo draws `n` per point.
    pub samples: usize,
}

/// Shaped views of the estimate (no flat index arithmetic in a notebook cell).
///
/// # Example
///
/// ```
/// use pathkernel::gp::{mc_softmax, Posterior};
/// let post = Posterior { mean: vec![2.0, 0.0, 0.0, 0.0, 0.1, 0.0], var: vec![0.1; 6], p: 2, k: 3 };
/// let mc = mc_softmax(&post, 500, 0)?;
/// assert_eq!((mc.mean().nrows(), mc.mean().ncols()), (2, 3)); // [P, K]
/// assert_eq!(mc.std()[(1, 2)], mc.std_prob[1 * 3 + 2]);
/// assert_eq!(mc.predicted(), vec![0, 1]);                      // arg-max of each mean row
/// assert_eq!(mc.least_confident(1), vec![1]);                   // the flatter point first
/// # Ok::<(), pathkernel::Error>(())
/// ```
impl McSoftmax {
    /// `(P, K)`: points and classes.
    pub fn shape(&self) -> (usize, usize) {
        let p = self.entropy.len();
        (p, if p == 0 { 0 } else { self.mean_prob.len() / p })
    }
    /// `E[softmax(z)]` as a matrix view of [`McSoftmax::mean_prob`]. # Shapes `[P, K]`.
    pub fn mean(&self) -> faer::MatRef<'_, f64> {
        let (p, k) = self.shape();
        faer::MatRef::from_row_major_slice(&self.mean_prob, p, k)
    }
    /// The sample standard deviation of `softmax(z)_c`, a view of [`McSoftmax::std_prob`].
    /// # Shapes `[P, K]`.
    pub fn std(&self) -> faer::MatRef<'_, f64> {
        let (p, k) = self.shape();
        faer::MatRef::from_row_major_slice(&self.std_prob, p, k)
    }
    /// The Monte-Carlo standard error of the mean, a view of [`McSoftmax::se_mean_prob`].
    /// # Shapes `[P, K]`.
    pub fn se(&self) -> faer::MatRef<'_, f64> {
        let (p, k) = self.shape();
        faer::MatRef::from_row_major_slice(&self.se_mean_prob, p, k)
    }
    /// The arg-max class of each point's mean probabilities (the first on ties). # Shapes `[P]`.
    pub fn predicted(&self) -> Vec<usize> {
        let k = self.shape().1;
        self.mean_prob.chunks(k.max(1)).map(argmax).collect()
    }
    /// The largest mean probability of each point (its [`McSoftmax::predicted`] class's).
    /// # Shapes `[P]`.
    pub fn confidence(&self) -> Vec<f64> {
        let k = self.shape().1;
        self.mean_prob.chunks(k.max(1)).map(|r| r[argmax(r)]).collect()
    }
    /// The `n` points of lowest [`McSoftmax::confidence`], least confident first (ties in point
    /// order; all points when `n ≥ P`). # Shapes `[min(n, P)]`.
    pub fn least_confident(&self, n: usize) -> Vec<usize> {
        let c = self.confidence();
        let mut order: Vec<usize> = (0..c.len()).collect();
        order.sort_by(|&a, &b| c[a].total_cmp(&c[b]));
        order.truncate(n);
        order
    }
}

/// The index of the largest value (the first on ties; 0 for an empty slice; NaN never wins).
fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

/// Monte-Carlo softmax posterior: for each point `p`, draws `samples` logit vectors
/// `z ~ N(mean_p, diag(var_p))` (classes independent) and pushes them through the softmax.
///
/// Randomness: point `p` uses `ChaCha8Rng::seed_from_u64(seed)` on stream `p`
/// (`set_stream(p)`), drawing `K` standard normals (`rand_distr::StandardNormal`) per sample in
/// class order; so the result is deterministic for a given seed, independent of thread count,
/// and point `p`'s draws do not depend on the other points. Points run in parallel (rayon).
///
/// Errors: `Config` if `samples < 2`; `ShapeMismatch`; `Data` if a mean/variance is
/// non-finite or a variance is negative (or `K = 0`).
///
/// # Shapes
/// `post.mean`, `post.var`: `[P, K]`; returns `mean_prob`, `std_prob`, `se_mean_prob`: `[P, K]`,
/// `entropy`, `se_entropy`: `[P]`.
pub fn mc_softmax(post: &Posterior, samples: usize, seed: u64) -> Result<McSoftmax> {
    let (p, k) = (post.p, post.k);
    if samples < 2 {
        return Err(Error::Config(format!("mc_softmax needs samples >= 2, got {samples}")));
    }
    if k == 0 {
        return Err(Error::Data("mc_softmax: posterior has no classes (K = 0)".into()));
    }
    check_len("posterior mean [P, K]", post.mean.len(), &[p, k])?;
    check_len("posterior var [P, K]", post.var.len(), &[p, k])?;
    check_finite("posterior mean [P, K]", &post.mean, &[p, k])?;
    check_finite("posterior var [P, K]", &post.var, &[p, k])?;
    if let Some(i) = post.var.iter().position(|&v| v < 0.0) {
        return Err(Error::Data(format!(
            "mc_softmax: negative variance {} at point {}, class {}",
            post.var[i],
            i / k,
            i % k
        )));
    }
    let per_point: Vec<(Vec<f64>, Vec<f64>, f64, f64)> = (0..p)
        .into_par_iter()
        .map(|q| {
            mc_point(&post.mean[q * k..(q + 1) * k], &post.var[q * k..(q + 1) * k], samples, seed, q as u64)
        })
        .collect();
    let n = samples as f64;
    let mut out = McSoftmax {
        mean_prob: Vec::with_capacity(p * k),
        std_prob: Vec::with_capacity(p * k),
        se_mean_prob: Vec::with_capacity(p * k),
        entropy: Vec::with_capacity(p),
        se_entropy: Vec::with_capacity(p),
        samples,
    };
    for (mean, std, h, se_h) in per_point {
        out.se_mean_prob.extend(std.iter().map(|s| s / n.sqrt()));
        out.mean_prob.extend(mean);
        out.std_prob.extend(std);
        out.entropy.push(h);
        out.se_entropy.push(se_h);
    }
    Ok(out)
}

fn point_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// Draws one softmax sample into `x`.
fn draw_softmax(rng: &mut ChaCha8Rng, mu: &[f64], sd: &[f64], x: &mut [f64]) {
    let mut zmax = f64::NEG_INFINITY;
    for c in 0..mu.len() {
        let xi: f64 = StandardNormal.sample(rng);
        x[c] = mu[c] + sd[c] * xi;
        zmax = zmax.max(x[c]);
    }
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - zmax).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// `(mean, std, entropy, se_entropy)` for one point.
fn mc_point(mu: &[f64], var: &[f64], n: usize, seed: u64, stream: u64) -> (Vec<f64>, Vec<f64>, f64, f64) {
    let k = mu.len();
    let sd: Vec<f64> = var.iter().map(|v| v.sqrt()).collect();
    let mut x = vec![0.0; k];
    let mut mean = vec![0.0; k];
    let mut m2 = vec![0.0; k];
    // Pass 1: Welford mean and variance per class.
    let mut rng = point_rng(seed, stream);
    for t in 1..=n {
        draw_softmax(&mut rng, mu, &sd, &mut x);
        for c in 0..k {
            let delta = x[c] - mean[c];
            mean[c] += delta / t as f64;
            m2[c] += delta * (x[c] - mean[c]);
        }
    }
    let nf = n as f64;
    let std: Vec<f64> = m2.iter().map(|v| (v.max(0.0) / (nf - 1.0)).sqrt()).collect();
    let entropy: f64 = -mean.iter().filter(|&&p| p > 0.0).map(|&p| p * p.ln()).sum::<f64>();
    // Pass 2 (same draws): delta-method variance of H(p̄), gᵀĈg with g = ∇H(p̄).
    let g: Vec<f64> = mean.iter().map(|&p| if p > 0.0 { -(p.ln() + 1.0) } else { 0.0 }).collect();
    let mut rng = point_rng(seed, stream);
    let mut s2 = 0.0;
    for _ in 0..n {
        draw_softmax(&mut rng, mu, &sd, &mut x);
        let proj: f64 = (0..k).map(|c| g[c] * (x[c] - mean[c])).sum();
        s2 += proj * proj;
    }
    let se_entropy = (s2 / (nf - 1.0) / nf).sqrt();
    (mean, std, entropy, se_entropy)
}

// ---------------------------------------------------------------------------------------------
// Validation helpers
// ---------------------------------------------------------------------------------------------

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn check_len(what: &str, len: usize, shape: &[usize]) -> Result<()> {
    let expected = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if expected != Some(len) {
        return Err(Error::ShapeMismatch {
            what: format!("{what} = {shape:?} (element count)"),
            expected: vec![expected.unwrap_or(usize::MAX)],
            got: vec![len],
        });
    }
    Ok(())
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            idx[d] = i % n;
            i /= n;
        }
    }
    idx
}

fn check_finite(what: &str, x: &[f64], shape: &[usize]) -> Result<()> {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!(
            "{what} has a non-finite value ({}) at index {:?}",
            x[i],
            unravel(i, shape)
        )));
    }
    Ok(())
}

fn check_output_finite(what: &str, x: &[f64]) -> Result<()> {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Numerical(format!("GP {what} is non-finite ({}) at flat index {i}", x[i])));
    }
    Ok(())
}

/// Relative asymmetry `max_{i<j}|a_ij − a_ji| / max|a|` of a row-major `n × n` block.
fn check_symmetric(what: &str, a: &[f64], n: usize) -> Result<()> {
    let maxabs = a.iter().fold(0.0f64, |acc, v| acc.max(v.abs()));
    if maxabs == 0.0 {
        return Ok(());
    }
    let (mut worst, mut at) = (0.0f64, (0, 0));
    for i in 0..n {
        for j in (i + 1)..n {
            let d = (a[i * n + j] - a[j * n + i]).abs();
            if d > worst {
                worst = d;
                at = (i, j);
            }
        }
    }
    let rel = worst / maxabs;
    if rel > SYMMETRY_TOL {
        return Err(Error::Data(format!(
            "{what} is not symmetric: max |a_ij - a_ji| = {worst:e} at {at:?}, relative {rel:e} > {SYMMETRY_TOL:e}"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests (nalgebra is the independent cross-check; faer is the production path)
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::{DMatrix, DVector};
    use rand::Rng;

    fn rng(seed: u64) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(seed)
    }

    fn points(r: &mut ChaCha8Rng, n: usize, d: usize) -> Vec<Vec<f64>> {
        (0..n).map(|_| (0..d).map(|_| r.gen_range(-1.0..1.0)).collect()).collect()
    }

    fn rbf(a: &[f64], b: &[f64], amp: f64, ell: f64) -> f64 {
        let d2: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        amp * (-d2 / (2.0 * ell * ell)).exp()
    }

    /// Class c kernel: RBF with class-dependent amplitude and length scale.
    fn kern(c: usize, a: &[f64], b: &[f64]) -> f64 {
        match c {
            0 => rbf(a, b, 1.0, 0.5),
            _ => rbf(a, b, 2.5, 1.2) + 0.1 * a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>(),
        }
    }

    struct Problem {
        m: usize,
        p: usize,
        k: usize,
        k_train: Vec<f64>,
        targets: Vec<f64>,
        k_cross: Vec<f64>,
        k_test: Vec<f64>,
        k_test_diag: Vec<f64>,
    }

    /// K = 2 classes, M training points, P test points (the first 3 test points are training
    /// points), 2-D inputs.
    fn problem(m: usize, p: usize, seed: u64) -> Problem {
        let k = 2;
        let mut r = rng(seed);
        let xtr = points(&mut r, m, 2);
        let mut xte = points(&mut r, p, 2);
        for q in 0..3.min(p).min(m) {
            xte[q] = xtr[q].clone();
        }
        let mut k_train = vec![0.0; k * m * m];
        let mut k_cross = vec![0.0; k * p * m];
        let mut k_test = vec![0.0; k * p * p];
        let mut k_test_diag = vec![0.0; k * p];
        for c in 0..k {
            for i in 0..m {
                for j in 0..m {
                    k_train[c * m * m + i * m + j] = kern(c, &xtr[i], &xtr[j]);
                }
            }
            for q in 0..p {
                for i in 0..m {
                    k_cross[c * p * m + q * m + i] = kern(c, &xte[q], &xtr[i]);
                }
                for q2 in 0..p {
                    k_test[c * p * p + q * p + q2] = kern(c, &xte[q], &xte[q2]);
                }
                k_test_diag[c * p + q] = kern(c, &xte[q], &xte[q]);
            }
        }
        let targets: Vec<f64> = (0..m)
            .flat_map(|i| {
                let x = &xtr[i];
                [(3.0 * x[0]).sin() + x[1], (x[0] * x[1]).cos() - 0.5 * x[0]]
            })
            .collect();
        Problem { m, p, k, k_train, targets, k_cross, k_test, k_test_diag }
    }

    fn block(x: &[f64], c: usize, r: usize, cols: usize) -> DMatrix<f64> {
        DMatrix::from_row_slice(r, cols, &x[c * r * cols..(c + 1) * r * cols])
    }

    /// Dense reference posterior (LU solve): (mean [P], var [P], cov [P,P]).
    fn dense_reference(pb: &Problem, c: usize, noise: f64, s: f64) -> (DVector<f64>, DVector<f64>, DMatrix<f64>, f64) {
        let (m, p) = (pb.m, pb.p);
        let kk = block(&pb.k_train, c, m, m);
        let a = &kk * s + DMatrix::identity(m, m) * noise;
        let y = DVector::from_iterator(m, (0..m).map(|i| pb.targets[i * pb.k + c]));
        let ks = block(&pb.k_cross, c, p, m); // P x M
        let kt = block(&pb.k_test, c, p, p);
        let lu = a.clone().lu();
        let alpha = lu.solve(&y).unwrap();
        let mean = &ks * &alpha * s;
        let ainv_kst = lu.solve(&ks.transpose()).unwrap(); // M x P
        let cov = &kt * s - &ks * &ainv_kst * (s * s);
        let var = DVector::from_iterator(p, (0..p).map(|q| cov[(q, q)]));
        let lml = -0.5 * y.dot(&alpha) - 0.5 * a.determinant().ln() - 0.5 * m as f64 * LN_2PI;
        (mean, var, cov, lml)
    }

    #[test]
    fn posterior_matches_dense_nalgebra_solve() {
        let pb = problem(30, 12, 1);
        let (noise, s) = (1e-2, 1.7);
        let gp = GpParams::new().noise(noise).output_scale(s).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
        assert_eq!(gp.jitter_used(), vec![0.0, 0.0]);
        let post = gp.predict(&pb.k_cross, &pb.k_test_diag, pb.p).unwrap();
        let cov = gp.predict_cov(&pb.k_cross, &pb.k_test, pb.p).unwrap();
        let (p, k) = (pb.p, pb.k);
        for c in 0..k {
            let (mean_ref, var_ref, cov_ref, _) = dense_reference(&pb, c, noise, s);
            for q in 0..p {
                let (m1, v1) = (post.mean[q * k + c], post.var[q * k + c]);
                assert!((m1 - mean_ref[q]).abs() < 1e-10, "class {c} point {q}: mean {m1} vs {}", mean_ref[q]);
                assert!((v1 - var_ref[q]).abs() < 1e-10, "class {c} point {q}: var {v1} vs {}", var_ref[q]);
                // predict_cov's diagonal is predict's var, exactly.
                assert_eq!(cov[c * p * p + q * p + q], v1);
                for q2 in 0..p {
                    let x = cov[c * p * p + q * p + q2];
                    assert!((x - cov_ref[(q, q2)]).abs() < 1e-10, "cov[{c},{q},{q2}] {x} vs {}", cov_ref[(q, q2)]);
                    assert_eq!(x, cov[c * p * p + q2 * p + q]);
                }
            }
        }
        // The two classes really are different problems.
        assert!((post.mean[0] - post.mean[1]).abs() > 1e-3);
    }

    #[test]
    fn variance_is_nonnegative_and_below_prior() {
        for (noise, s) in [(1e-6, 1.0), (1e-2, 0.3), (0.0, 2.0)] {
            let pb = problem(40, 25, 2);
            let gp = GpParams::new().noise(noise).output_scale(s).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
            let post = gp.predict(&pb.k_cross, &pb.k_test_diag, pb.p).unwrap();
            for q in 0..pb.p {
                for c in 0..pb.k {
                    let v = post.var[q * pb.k + c];
                    let prior = s * pb.k_test_diag[c * pb.p + q];
                    assert!(v >= 0.0 && v <= prior * (1.0 + 1e-12), "noise {noise}: var {v}, prior {prior}");
                }
            }
            // A test point unrelated to every training point (zero cross kernel, zero prior):
            // mean and variance exactly 0.
            let kc = vec![0.0; pb.k * pb.m];
            let post0 = gp.predict(&kc, &vec![0.0; pb.k], 1).unwrap();
            assert_eq!((post0.mean.clone(), post0.var.clone()), (vec![0.0; pb.k], vec![0.0; pb.k]));
            // At a training point the variance collapses towards the noise level.
            if noise > 0.0 {
                assert!(post.var[0] < 2.0 * noise + 1e-9, "var at training point {}", post.var[0]);
            }
        }
    }

    #[test]
    fn inconsistent_test_kernel_gives_error_not_clamp() {
        let pb = problem(20, 4, 3);
        let gp = GpParams::new().noise(1e-3).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
        let mut diag = pb.k_test_diag.clone();
        diag[0] *= 0.5; // prior variance far below what the cross kernel explains
        match gp.predict(&pb.k_cross, &diag, pb.p) {
            Err(Error::Numerical(msg)) => assert!(msg.contains("negative"), "{msg}"),
            other => panic!("expected Numerical error, got {other:?}"),
        }
    }

    fn rank2_gram(m: usize) -> Vec<f64> {
        let mut r = rng(5);
        let x: Vec<[f64; 2]> = (0..m).map(|_| [r.gen_range(-1.0..1.0), r.gen_range(-1.0..1.0)]).collect();
        let mut g = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                g[i * m + j] = x[i][0] * x[j][0] + x[i][1] * x[j][1];
            }
        }
        g
    }

    #[test]
    fn jitter_escalation_on_rank_deficient_gram() {
        let m = 20;
        let g = rank2_gram(m);
        let y: Vec<f64> = (0..m).map(|i| (i as f64).sin()).collect();
        let mean_diag = (0..m).map(|i| g[i * m + i]).sum::<f64>() / m as f64;
        let gp = GpParams::new().noise(0.0).fit(&g, &y, m, 1).unwrap();
        let j = gp.jitter_used()[0];
        assert!(j > 0.0 && j < 1e-2 * mean_diag, "jitter used {j}");
        // On the ladder 1e-12·d̄·10^n.
        let n = (j / (1e-12 * mean_diag)).log10();
        assert!((n - n.round()).abs() < 1e-9 && n.round() >= 0.0, "jitter {j} not on the ladder (n = {n})");
        let dbg = format!("{gp:?}");
        assert!(dbg.contains("jitter_used") && dbg.len() < 400, "{dbg}");
        assert!(gp.log_marginal_likelihood()[0].is_finite());
        let kd: Vec<f64> = (0..m).map(|i| g[i * m + i]).collect();
        let post = gp.predict(&g, &kd, m).unwrap();
        assert!(post.mean.iter().chain(&post.var).all(|v| v.is_finite()));
        assert!(post.var.iter().all(|&v| v >= 0.0));

        // max_jitter tiny: an error with the failing pivot, never a panic.
        match GpParams::new().noise(0.0).max_jitter(1e-15).fit(&g, &y, m, 1) {
            Err(Error::NotPositiveDefinite { pivot, jitter_tried }) => {
                assert!(pivot >= 2 && pivot < m, "pivot {pivot}");
                assert!(jitter_tried > 0.0 && jitter_tried <= 1e-15 * mean_diag * (1.0 + 1e-12), "{jitter_tried}");
            }
            other => panic!("expected NotPositiveDefinite, got {other:?}"),
        }
        // max_jitter 0: only the first attempt.
        match GpParams::new().noise(0.0).max_jitter(0.0).fit(&g, &y, m, 1) {
            Err(Error::NotPositiveDefinite { jitter_tried, .. }) => assert_eq!(jitter_tried, 0.0),
            other => panic!("expected NotPositiveDefinite, got {other:?}"),
        }
        // An explicit first jitter that suffices is used as is.
        let gp = GpParams::new().noise(0.0).jitter(1e-3).fit(&g, &y, m, 1).unwrap();
        assert_eq!(gp.jitter_used(), vec![1e-3]);
    }

    #[test]
    fn non_finite_inputs_are_errors() {
        let pb = problem(10, 3, 4);
        let mut kt = pb.k_train.clone();
        kt[pb.m * pb.m + 3 * pb.m + 4] = f64::NAN;
        match GpParams::new().fit(&kt, &pb.targets, pb.m, pb.k) {
            Err(Error::Data(msg)) => assert!(msg.contains("[1, 3, 4]"), "{msg}"),
            other => panic!("expected Data error, got {other:?}"),
        }
        let mut y = pb.targets.clone();
        y[5] = f64::INFINITY;
        assert!(matches!(GpParams::new().fit(&pb.k_train, &y, pb.m, pb.k), Err(Error::Data(_))));
        let gp = GpParams::new().noise(1e-3).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
        let mut kc = pb.k_cross.clone();
        kc[7] = f64::NAN;
        assert!(matches!(gp.predict(&kc, &pb.k_test_diag, pb.p), Err(Error::Data(_))));
        let mut kd = pb.k_test_diag.clone();
        kd[1] = f64::NEG_INFINITY;
        assert!(matches!(gp.predict(&pb.k_cross, &kd, pb.p), Err(Error::Data(_))));
    }

    #[test]
    fn asymmetric_gram_is_an_error() {
        let pb = problem(10, 3, 6);
        let mut kt = pb.k_train.clone();
        kt[2 * pb.m + 5] += 1e-6;
        match GpParams::new().fit(&kt, &pb.targets, pb.m, pb.k) {
            Err(Error::Data(msg)) => assert!(msg.contains("not symmetric") && msg.contains("(2, 5)"), "{msg}"),
            other => panic!("expected Data error, got {other:?}"),
        }
        // Below the tolerance it is accepted.
        let mut kt = pb.k_train.clone();
        kt[2 * pb.m + 5] += 1e-13;
        assert!(GpParams::new().fit(&kt, &pb.targets, pb.m, pb.k).is_ok());
        // Asymmetric test block in predict_cov.
        let gp = GpParams::new().noise(1e-3).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
        let mut ktest = pb.k_test.clone();
        ktest[pb.p * pb.p + 1] += 1e-3;
        assert!(matches!(gp.predict_cov(&pb.k_cross, &ktest, pb.p), Err(Error::Data(_))));
    }

    #[test]
    fn shapes_and_parameters_are_validated() {
        let pb = problem(10, 3, 7);
        let fit = |p: GpParams| p.fit(&pb.k_train, &pb.targets, pb.m, pb.k);
        assert!(matches!(fit(GpParams::new().noise(-1.0)), Err(Error::Config(_))));
        assert!(matches!(fit(GpParams::new().noise(f64::NAN)), Err(Error::Config(_))));
        assert!(matches!(fit(GpParams::new().output_scale(0.0)), Err(Error::Config(_))));
        assert!(matches!(fit(GpParams::new().jitter(-1e-3)), Err(Error::Config(_))));
        assert!(matches!(fit(GpParams::new().max_jitter(f64::INFINITY)), Err(Error::Config(_))));
        assert!(matches!(
            GpParams::new().fit(&pb.k_train[1..], &pb.targets, pb.m, pb.k),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            GpParams::new().fit(&pb.k_train, &pb.targets, pb.m, 3),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(GpParams::new().fit(&[], &[], 0, 1), Err(Error::Data(_))));
        let gp = fit(GpParams::new().noise(1e-3)).unwrap();
        assert!(matches!(gp.predict(&pb.k_cross, &pb.k_test_diag, pb.p + 1), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(gp.predict_cov(&pb.k_cross, &pb.k_test_diag, pb.p), Err(Error::ShapeMismatch { .. })));
        // P = 0 is a valid, empty request.
        let empty = gp.predict(&[], &[], 0).unwrap();
        assert!(empty.mean.is_empty() && empty.var.is_empty());
        assert!(gp.predict_cov(&[], &[], 0).unwrap().is_empty());
        assert!(mc_softmax(&empty, 10, 0).unwrap().entropy.is_empty());
        // Serde round trip of the parameters (partial configs take defaults).
        let p = GpParams::new().noise(0.5).fit_hyper(true);
        let s = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<GpParams>(&s).unwrap(), p);
        assert_eq!(serde_json::from_str::<GpParams>(r#"{"noise": 0.25}"#).unwrap(), GpParams::new().noise(0.25));
    }

    #[test]
    fn log_marginal_likelihood_matches_nalgebra() {
        let pb = problem(30, 2, 8);
        for (noise, s) in [(1e-2, 1.0), (0.3, 2.2)] {
            let gp = GpParams::new().noise(noise).output_scale(s).fit(&pb.k_train, &pb.targets, pb.m, pb.k).unwrap();
            let lml = gp.log_marginal_likelihood();
            for c in 0..pb.k {
                let (_, _, _, lml_ref) = dense_reference(&pb, c, noise, s);
                assert!((lml[c] - lml_ref).abs() < 1e-9, "class {c}: {} vs {lml_ref}", lml[c]);
            }
        }
    }

    /// Dense LML for given (noise, s) via nalgebra's Cholesky.
    fn lml_nalgebra(g: &[f64], y: &[f64], m: usize, noise: f64, s: f64) -> f64 {
        let a = DMatrix::from_row_slice(m, m, g) * s + DMatrix::identity(m, m) * noise;
        let ch = a.cholesky().unwrap();
        let yv = DVector::from_column_slice(y);
        let alpha = ch.solve(&yv);
        -0.5 * yv.dot(&alpha) - 0.5 * ch.ln_determinant() - 0.5 * m as f64 * LN_2PI
    }

    #[test]
    fn fit_hyper_increases_lml_and_recovers_noise() {
        // y ~ GP(0, s·K + σ²I) with s = 2, σ² = 0.05, RBF on 2-D points.
        let m = 150;
        let (s_true, noise_true) = (2.0, 0.05);
        let mut r = rng(9);
        let x = points(&mut r, m, 2);
        let mut g = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                g[i * m + j] = rbf(&x[i], &x[j], 1.0, 0.4);
            }
        }
        let cov = DMatrix::from_row_slice(m, m, &g) * s_true + DMatrix::identity(m, m) * noise_true;
        let lchol = cov.cholesky().unwrap().l();
        let z = DVector::from_iterator(m, (0..m).map(|_| StandardNormal.sample(&mut r)));
        let y: Vec<f64> = (lchol * z).iter().copied().collect();

        let start = GpParams::new().noise(1e-4).output_scale(1.0);
        let gp0 = start.fit(&g, &y, m, 1).unwrap();
        let gp1 = start.clone().fit_hyper(true).fit(&g, &y, m, 1).unwrap();
        let (l0, l1) = (gp0.log_marginal_likelihood()[0], gp1.log_marginal_likelihood()[0]);
        let (n1, s1) = (gp1.noise()[0], gp1.output_scale()[0]);
        assert!(l1 > l0 + 1.0, "LML start {l0}, fitted {l1}");
        assert!(n1 > noise_true / 3.0 && n1 < noise_true * 3.0, "fitted noise {n1}");
        assert!(s1 > s_true / 4.0 && s1 < s_true * 4.0, "fitted scale {s1}");
        // The reported LML is the nalgebra LML at the reported hyper-parameters...
        assert!((l1 - lml_nalgebra(&g, &y, m, n1, s1)).abs() < 1e-8);
        // ...and no point of a 2-D log grid around it is better.
        for a in -8..=8 {
            for b in -8..=8 {
                let (n, s) = (n1 * 2f64.powf(a as f64 / 4.0), s1 * 2f64.powf(b as f64 / 4.0));
                let l = lml_nalgebra(&g, &y, m, n, s);
                assert!(l <= l1 + 1e-6, "grid point noise {n}, scale {s}: {l} > fitted {l1}");
            }
        }
        // A start that is already optimal is kept (the fit never lowers the LML).
        let gp2 = GpParams::new().noise(n1).output_scale(s1).fit_hyper(true).fit(&g, &y, m, 1).unwrap();
        assert!(gp2.log_marginal_likelihood()[0] >= l1 - 1e-12);
    }

    fn softmax(z: &[f64]) -> Vec<f64> {
        let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = z.iter().map(|v| (v - mx).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    fn post_of(mean: Vec<f64>, var: Vec<f64>, k: usize) -> Posterior {
        let p = mean.len() / k;
        Posterior { mean, var, p, k }
    }

    #[test]
    fn mc_softmax_small_variance_limit() {
        let mean = vec![0.3, -1.2, 2.0, 0.0, 5.0, -3.0];
        let analytic: Vec<f64> = mean.chunks(3).flat_map(softmax).collect();
        let mc = mc_softmax(&post_of(mean.clone(), vec![1e-12; 6], 3), 2000, 1).unwrap();
        for i in 0..6 {
            assert!((mc.mean_prob[i] - analytic[i]).abs() < 1e-6, "{} vs {}", mc.mean_prob[i], analytic[i]);
            assert!(mc.std_prob[i] < 1e-5 && mc.se_mean_prob[i] < 1e-6);
        }
        // Exactly zero variance: exactly the softmax, zero spread.
        let mc = mc_softmax(&post_of(mean.clone(), vec![0.0; 6], 3), 100, 1).unwrap();
        for i in 0..6 {
            assert!((mc.mean_prob[i] - analytic[i]).abs() < 1e-15);
            assert_eq!(mc.std_prob[i], 0.0);
        }
        for q in 0..2 {
            let h: f64 = -analytic[q * 3..q * 3 + 3].iter().map(|p| p * p.ln()).sum::<f64>();
            assert!((mc.entropy[q] - h).abs() < 1e-14);
            assert_eq!(mc.se_entropy[q], 0.0);
        }
    }

    /// Each view of `McSoftmax` equals the flat data it views, read the slow obvious way.
    #[test]
    fn mc_softmax_views_equal_the_flat_vectors() {
        let mean = vec![0.5, -0.5, 1.0, 0.0, 0.0, 0.0, 2.0, -1.0, 0.5, 0.1, 0.2, 3.0];
        let mc = mc_softmax(&post_of(mean, vec![0.4; 12], 3), 200, 3).unwrap();
        assert_eq!(mc.shape(), (4, 3));
        for q in 0..4 {
            for c in 0..3 {
                assert_eq!(mc.mean()[(q, c)], mc.mean_prob[q * 3 + c]);
                assert_eq!(mc.std()[(q, c)], mc.std_prob[q * 3 + c]);
                assert_eq!(mc.se()[(q, c)], mc.se_mean_prob[q * 3 + c]);
            }
            let row = &mc.mean_prob[q * 3..q * 3 + 3];
            let best = (0..3).filter(|&c| (0..3).all(|j| row[j] <= row[c])).min().unwrap();
            assert_eq!((mc.predicted()[q], mc.confidence()[q]), (best, row[best]));
        }
        // Point 1 has equal means (flattest), point 3 the largest gap.
        let order = mc.least_confident(10);
        assert_eq!(order.len(), 4);
        assert_eq!(order[0], 1);
        assert!(order.windows(2).all(|w| mc.confidence()[w[0]] <= mc.confidence()[w[1]]));
        assert_eq!(mc.least_confident(2), order[..2]);
    }

    #[test]
    fn mc_softmax_agrees_with_high_sample_reference() {
        let mean = vec![0.5, -0.5, 1.0, 0.0, 0.0, 0.0, 2.0, -1.0, 0.5];
        let var = vec![1.0, 0.5, 2.0, 0.3, 0.3, 0.3, 0.1, 4.0, 1.0];
        let post = post_of(mean, var, 3);
        let mc = mc_softmax(&post, 4000, 11).unwrap();
        let reference = mc_softmax(&post, 400_000, 12345).unwrap();
        for i in 0..9 {
            let se = (mc.se_mean_prob[i].powi(2) + reference.se_mean_prob[i].powi(2)).sqrt();
            assert!(se > 0.0);
            let d = (mc.mean_prob[i] - reference.mean_prob[i]).abs();
            assert!(d < 4.0 * se, "entry {i}: |{} - {}| = {d} > 4·{se}", mc.mean_prob[i], reference.mean_prob[i]);
            // The MC standard error is roughly right: std agrees with the reference's to 10 %.
            assert!((mc.std_prob[i] / reference.std_prob[i] - 1.0).abs() < 0.1);
        }
        for q in 0..3 {
            let se = (mc.se_entropy[q].powi(2) + reference.se_entropy[q].powi(2)).sqrt();
            let d = (mc.entropy[q] - reference.entropy[q]).abs();
            assert!(se > 0.0 && d < 4.0 * se, "entropy {q}: {d} vs se {se}");
            let s: f64 = mc.mean_prob[q * 3..q * 3 + 3].iter().sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
    }

    /// E[σ(u)] and E[σ(u)²] for u ~ N(a, b) by a fine trapezoid rule (independent of the MC code).
    fn logistic_normal_moments(a: f64, b: f64) -> (f64, f64) {
        let sd = b.sqrt();
        let n = 20_000;
        let (lo, hi) = (a - 12.0 * sd, a + 12.0 * sd);
        let h = (hi - lo) / n as f64;
        let (mut m1, mut m2) = (0.0, 0.0);
        for i in 0..=n {
            let u = lo + i as f64 * h;
            let w = if i == 0 || i == n { 0.5 } else { 1.0 } * h * (-(u - a).powi(2) / (2.0 * b)).exp()
                / (2.0 * std::f64::consts::PI * b).sqrt();
            let sg = 1.0 / (1.0 + (-u).exp());
            m1 += w * sg;
            m2 += w * sg * sg;
        }
        (m1, m2)
    }

    #[test]
    fn mc_softmax_two_classes_matches_quadrature() {
        // K = 2: softmax(z)_0 = σ(z0 − z1), z0 − z1 ~ N(μ0 − μ1, v0 + v1).
        let post = post_of(vec![0.7, -0.2, 0.0, 1.5], vec![2.0, 0.5, 0.3, 0.1], 2);
        let mc = mc_softmax(&post, 20_000, 3).unwrap();
        for q in 0..2 {
            let (mu, v) = (&post.mean[2 * q..2 * q + 2], &post.var[2 * q..2 * q + 2]);
            let (m1, m2) = logistic_normal_moments(mu[0] - mu[1], v[0] + v[1]);
            let std = (m2 - m1 * m1).sqrt();
            let d = (mc.mean_prob[2 * q] - m1).abs();
            assert!(d < 4.0 * mc.se_mean_prob[2 * q], "point {q}: MC {} vs quadrature {m1}", mc.mean_prob[2 * q]);
            assert!((mc.mean_prob[2 * q + 1] - (1.0 - m1)).abs() < 4.0 * mc.se_mean_prob[2 * q + 1]);
            assert!((mc.std_prob[2 * q] / std - 1.0).abs() < 0.05, "std {} vs {std}", mc.std_prob[2 * q]);
            assert!((mc.se_mean_prob[2 * q] - mc.std_prob[2 * q] / (20_000f64).sqrt()).abs() < 1e-15);
            let h = -(m1 * m1.ln() + (1.0 - m1) * (1.0 - m1).ln());
            assert!((mc.entropy[q] - h).abs() < 4.0 * mc.se_entropy[q] + 1e-4, "entropy {} vs {h}", mc.entropy[q]);
        }
    }

    #[test]
    fn mc_softmax_is_deterministic_per_seed() {
        let post = post_of(vec![0.1, 0.2, -0.3, 1.0], vec![0.5, 0.5, 1.0, 1.0], 2);
        let a = mc_softmax(&post, 500, 7).unwrap();
        let b = mc_softmax(&post, 500, 7).unwrap();
        let c = mc_softmax(&post, 500, 8).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.mean_prob, c.mean_prob);
        // Point p's draws do not depend on the other points.
        let more = post_of(vec![0.1, 0.2, -0.3, 1.0, 3.0, 0.0], vec![0.5, 0.5, 1.0, 1.0, 2.0, 0.1], 2);
        let d = mc_softmax(&more, 500, 7).unwrap();
        assert_eq!(d.mean_prob[..4], a.mean_prob[..]);
        assert_eq!(d.se_entropy[..2], a.se_entropy[..]);
        // Identical points get independent draws (one stream per point).
        let twins = post_of(vec![0.0, 1.0, 0.0, 1.0], vec![1.0, 1.0, 1.0, 1.0], 2);
        let t = mc_softmax(&twins, 500, 7).unwrap();
        assert_ne!(t.mean_prob[..2], t.mean_prob[2..]);
        assert!(matches!(mc_softmax(&post, 1, 7), Err(Error::Config(_))));
        let bad = post_of(vec![0.0, 0.0], vec![-1.0, 0.0], 2);
        assert!(matches!(mc_softmax(&bad, 10, 7), Err(Error::Data(_))));
        let bad = post_of(vec![f64::NAN, 0.0], vec![1.0, 0.0], 2);
        assert!(matches!(mc_softmax(&bad, 10, 7), Err(Error::Data(_))));
    }
}
