//! Function-space Laplace on the class-diagonal blocks of a kernel of the network
//! (laplace-torch's `FunctionalLaplace` with `independent_outputs=True`; Immer et al. 2021;
//! Rasmussen & Williams §3.4–3.5): a GP prior on the **logits** with covariance `k/δ`, one GP
//! per class, the likelihood's curvature from the softmax Hessian at the network's own outputs,
//! and the network itself as the predictive mean. The cross-class kernel (every `K^{cc'}`
//! block, laplace-torch's `independent_outputs=False` and the GGN-exact posterior) is
//! [`super::crossclass`].
//!
//! With `σ0² = 1/δ`, `Λ_i = diag(p_i) − p_i p_iᵀ = F_i F_iᵀ` the softmax Hessian at training point
//! `i` and `K` the (class-diagonal) kernel, the logits at `x*` are `N(f(x*), Σ*)`,
//!
//! `Σ* = σ0² k** − σ0⁴ k*ᵀ F (I + σ0² Fᵀ K F)⁻¹ Fᵀ k*`,
//!
//! never forming `Λ⁻¹` (it is singular). Two curvatures ([`Curvature`]):
//!
//! - **Class-diagonal** (laplace-torch's `independent_outputs=True`: `_build_L` keeps the
//!   diagonal of the softmax Hessian, `_build_Sigma_inv` one Cholesky per class): `λ_ic = p_ic(1 − p_ic)`,
//!   one GP per class, `Σ*` diagonal. Per class `S = diag(√λ_c)` and the eigendecomposition
//!   `S K_c S = U diag(e) Uᵀ`, computed once: then for every `δ`
//!   `Σ*_cc = k**/δ − Σ_j z_j² / (δ² (1 + e_j/δ))` with `z = Uᵀ S k*`, so a prior-precision grid
//!   costs `O(M P)` per value.
//! - **Full** per-point `Λ_i` with class-diagonal kernels: R&W's multi-class Laplace (§3.5,
//!   Algorithms 3.3–3.4: uncorrelated class processes, full `W`) — not laplace-torch's
//!   construction (it never keeps the off-diagonal `Λ`), and the GGN-exact posterior only for a
//!   prior without cross-class blocks, which the network's kernels have. With
//!   `D_c = diag(p_c)`, `E_c = (K_c/δ + D_c⁻¹)⁻¹ = D_c^{1/2}(I + D_c^{1/2} K_c D_c^{1/2}/δ)⁻¹D_c^{1/2}`
//!   and `L_M = chol(Σ_c E_c)`, `Σ*_{cc'} = δ_{cc'}(k**_c/δ − b_cᵀ k*_c/δ) + (L_M⁻¹ b_c)ᵀ(L_M⁻¹ b_c')`,
//!   `b_c = E_c k*_c/δ`: a full `K × K` covariance per point (tested against the dense formula
//!   above with `F_i = diag(√p_i) − p_i √p_iᵀ`).
//!
//! The prior precision ([`Prior`]): fixed, or by the function-space evidence (R&W eq. 3.32 with
//! the targets `r = f − f(w_0)`, the class-diagonal curvature)
//! `log Z(δ) = log p(y|f) − (δ/2) Σ_c r_cᵀ K_c⁻¹ r_c − ½ Σ_c log det(I + S_c K_c S_c/δ)`,
//! whose derivative in `log δ` is strictly decreasing (one maximum, found by bisection), or by a
//! validation grid (`FunctionalLaplace::grid_search`; laplace-torch's `optimize_prior_precision(method='gridsearch')`, its `_gridsearch` over `logspace(−4, 4, 100)` by default).
//! `K_c⁻¹ r_c` is the pseudo-inverse on the eigenvalues above `1e-12 ·` the largest (the count
//! left out is reported).
//!
//! The predictive ([`FslPredictive`]) is a [`LogitPosterior`]: probit
//! (`softmax(μ_c/√(1 + π/8 Σ*_cc))`) or Monte Carlo from the `K × K` `Σ*`, and both with a
//! temperature `T` on the mean and a scale `s` on `Σ*` ([`Calibration`], fitted on validation
//! points by NLL; `s = 0` is temperature scaling).
//!
//! # Shapes
//! Train kernel blocks `[K, M, M]` (class `c`'s block `K_c` row-major), train logits and
//! `f_{w_0}` `[M, K]`, labels `[M]`; rows: `k*` `[K, P, M]`, `k**` `[K, P]`, mean `[P, K]`.

use faer::linalg::matmul::matmul;
use faer::linalg::triangular_solve::solve_lower_triangular_in_place;
use faer::prelude::Solve;
use faer::{Accum, Mat, Par, Side};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::lastlayer::LogitPosterior;
use crate::error::{Error, Result};

/// Eigenvalues of `K_c` below this fraction of the largest are left out of `K_c⁻¹ r` (evidence).
pub(crate) const PINV_REL: f64 = 1e-12;
/// Probit's constant `π/8`.
const PI_8: f64 = std::f64::consts::PI / 8.0;

fn par() -> Par {
    Par::rayon(0)
}

/// The likelihood's curvature at the training points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Curvature {
    /// `λ_ic = p_ic(1 − p_ic)`, the diagonal of the softmax Hessian (laplace-torch's `_build_L`;
    /// with class-diagonal kernels `independent_outputs=True`, with the cross-class kernel
    /// `independent_outputs=False`).
    ClassDiagonal,
    /// The full `Λ_i = diag(p_i) − p_i p_iᵀ` (with class-diagonal kernels: R&W §3.5's
    /// multi-class Laplace; with the cross-class kernel: the GGN-exact posterior).
    Full,
}

impl std::fmt::Display for Curvature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Curvature::ClassDiagonal => "diag",
            Curvature::Full => "full",
        })
    }
}

/// How the prior precision δ is chosen at the fit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prior {
    /// A given δ > 0.
    Fixed(f64),
    /// The maximum of the function-space evidence (module docs).
    Evidence,
}

/// The training side of a function-space Laplace fit.
#[derive(Clone, Copy, Debug)]
pub struct FslTrain<'a> {
    /// Class blocks of the train × train kernel on the logits. # Shapes `[K, M, M]`.
    pub k_train: &'a [f64],
    /// Logits `f_{w_N}(x_i)`. # Shapes `[M, K]`.
    pub logits: &'a [f64],
    /// Logits at the initial state `f_{w_0}(x_i)` (the prior mean). # Shapes `[M, K]`.
    pub bias: &'a [f64],
    /// Class labels. # Shapes `[M]`.
    pub labels: &'a [usize],
    /// Training points M.
    pub m: usize,
    /// Classes K.
    pub k: usize,
}

/// The rows a predictive is computed at.
#[derive(Clone, Copy, Debug)]
pub struct FslRows<'a> {
    /// `k_c(x*_p, x_i)`. # Shapes `[K, P, M]`.
    pub k_cross: &'a [f64],
    /// `k_c(x*_p, x*_p)`. # Shapes `[K, P]`.
    pub k_diag: &'a [f64],
    /// The predictive mean: the network's logits. # Shapes `[P, K]`.
    pub mean: &'a [f64],
    /// Rows P.
    pub p: usize,
}

/// Per-class numbers of a fit, for reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FslClassFit {
    /// Smallest and largest eigenvalue of `K_c`.
    pub k_eig: [f64; 2],
    /// Eigenvalues of `K_c` left out of `K_c⁻¹ r_c` (below `PINV_REL ·` the largest).
    pub pinv_dropped: usize,
    /// `r_cᵀ K_c⁻¹ r_c`.
    pub rkr: f64,
    /// Smallest eigenvalue of `S_c K_c S_c` (class-diagonal curvature).
    pub sks_min_eig: f64,
}

/// What a fit reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FslFit {
    /// The curvature.
    pub curvature: Curvature,
    /// The prior precision δ.
    pub delta: f64,
    /// How δ was chosen (`fixed`, `evidence`, `grid`).
    pub prior: String,
    /// The log evidence at δ (class-diagonal curvature; module docs).
    pub log_evidence: f64,
    /// `log p(y | f)` at the network's logits.
    pub log_likelihood: f64,
    /// Per class (class-diagonal kernel; empty for the cross-class one).
    pub classes: Vec<FslClassFit>,
    /// The kernel's blocks: one GP per class, or the cross-class kernel.
    #[serde(default)]
    pub blocks: KernelBlocks,
    /// The cross-class fit's numbers ([`super::crossclass`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kxk: Option<super::kxk::KxkNumbers>,
}

/// Which blocks of the kernel the GP prior on the logits keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelBlocks {
    /// `K^{cc}` only: one GP per class (laplace-torch's `independent_outputs=True`).
    #[default]
    ClassDiagonal,
    /// Every `K^{cc'}`: the `[M K, M K]` kernel (laplace-torch's `independent_outputs=False`).
    CrossClass,
}

/// Per class: the eigendecomposition of `S K_c S` with `S = diag(√(p(1−p)))`.
#[derive(Clone, Debug)]
struct DiagClass {
    /// `√λ_c`. # Shapes `[M]`.
    s: Vec<f64>,
    /// Eigenvalues of `S K_c S` (negative rounding clamped to 0). # Shapes `[M]`.
    e: Vec<f64>,
    /// Eigenvectors `U` `[M, M]`.
    u: Mat<f64>,
}

/// The full curvature's factors at the fitted δ.
#[derive(Clone, Debug)]
struct FullFactors {
    /// `E_c` `[M, M]` per class.
    e: Vec<Mat<f64>>,
    /// Lower Cholesky factor of `Σ_c E_c`.
    l: Mat<f64>,
}

/// A fitted function-space Laplace approximation (module docs).
#[derive(Clone, Debug)]
pub struct FunctionalLaplace {
    m: usize,
    k: usize,
    delta: f64,
    curvature: Curvature,
    /// Softmax of the training logits. # Shapes `[M, K]`.
    probs: Vec<f64>,
    diag: Vec<DiagClass>,
    full: Option<FullFactors>,
    /// `K_c` kept for the full curvature at another δ. # Shapes `[K, M, M]`.
    k_train: Vec<f64>,
    /// `A = Σ_c r_cᵀ K_c⁻¹ r_c`.
    rkr: f64,
    /// The fit's numbers.
    pub fit: FslFit,
}

pub(crate) fn log_likelihood(z: &[f64], labels: &[usize], k: usize) -> f64 {
    z.chunks_exact(k)
        .zip(labels)
        .map(|(row, &y)| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row[y] - m - row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
        })
        .sum()
}

/// Symmetric eigendecomposition of a row-major symmetric block (its lower triangle).
fn eig(block: &[f64], m: usize, what: &str) -> Result<(Vec<f64>, Mat<f64>)> {
    let a = Mat::from_fn(m, m, |i, j| block[i * m + j]);
    let evd = a.self_adjoint_eigen(Side::Lower).map_err(|e| Error::Numerical(format!("{what}: eigendecomposition failed: {e:?}")))?;
    let e: Vec<f64> = evd.S().column_vector().iter().copied().collect();
    if let Some(i) = e.iter().position(|v| !v.is_finite()) {
        return Err(Error::Numerical(format!("{what}: eigenvalue {i} is {}", e[i])));
    }
    Ok((e, evd.U().to_owned()))
}

fn check_symmetric(block: &[f64], m: usize, c: usize) -> Result<()> {
    let scale = block.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    for i in 0..m {
        for j in i + 1..m {
            let d = (block[i * m + j] - block[j * m + i]).abs();
            if d > 1e-9 * scale.max(f64::MIN_POSITIVE) {
                return Err(Error::Numerical(format!("function-space Laplace: class {c}'s train kernel is not symmetric ({i}, {j}: {d:e} of {scale:e})")));
            }
        }
    }
    Ok(())
}

impl FunctionalLaplace {
    /// Fits on the training side (module docs): the softmax Hessian at the network's logits, the
    /// eigendecompositions of every class block, δ by `prior`, and for the full curvature its
    /// factors at δ.
    ///
    /// Errors: shapes, non-finite values, a non-symmetric kernel block, a class block with an
    /// eigenvalue below `−1e-9 ·` its largest (not PSD), δ ≤ 0.
    pub fn fit(train: &FslTrain<'_>, curvature: Curvature, prior: Prior) -> Result<Self> {
        let (m, k) = (train.m, train.k);
        if train.k_train.len() != k * m * m || train.logits.len() != m * k || train.bias.len() != m * k || train.labels.len() != m {
            return Err(Error::ShapeMismatch {
                what: "function-space Laplace train side: k_train [K, M, M], logits and bias [M, K], labels [M]".into(),
                expected: vec![k * m * m, m * k, m * k, m],
                got: vec![train.k_train.len(), train.logits.len(), train.bias.len(), train.labels.len()],
            });
        }
        if m == 0 || k < 2 {
            return Err(Error::Config("function-space Laplace needs training points and at least two classes".into()));
        }
        if let Some(i) = train.k_train.iter().chain(train.logits).chain(train.bias).position(|v| !v.is_finite()) {
            return Err(Error::Data(format!("function-space Laplace: non-finite input at flat index {i} (k_train, logits, bias)")));
        }
        if let Some(&y) = train.labels.iter().find(|&&y| y >= k) {
            return Err(Error::Data(format!("function-space Laplace: label {y} is not one of {k} classes")));
        }
        let probs = crate::model::softmax_rows(train.logits, k)?;
        let loglik = log_likelihood(train.logits, train.labels, k);
        let per_class: Vec<Result<(DiagClass, FslClassFit)>> = (0..k)
            .map(|c| {
                let kc = &train.k_train[c * m * m..(c + 1) * m * m];
                check_symmetric(kc, m, c)?;
                let (ke, ku) = eig(kc, m, &format!("class {c}'s train kernel"))?;
                let top = ke.iter().copied().fold(0.0f64, |a, b| a.max(b.abs()));
                if ke[0] < -1e-9 * top {
                    return Err(Error::Numerical(format!("function-space Laplace: class {c}'s train kernel has eigenvalue {:e} against a largest of {top:e}: not positive semi-definite", ke[0])));
                }
                // r_cᵀ K_c⁻¹ r_c on the eigenvalues above PINV_REL · top.
                let r: Vec<f64> = (0..m).map(|i| train.logits[i * k + c] - train.bias[i * k + c]).collect();
                let (mut rkr, mut dropped) = (0.0, 0usize);
                for j in 0..m {
                    if ke[j] <= PINV_REL * top {
                        dropped += 1;
                        continue;
                    }
                    let proj: f64 = (0..m).map(|i| ku[(i, j)] * r[i]).sum();
                    rkr += proj * proj / ke[j];
                }
                let s: Vec<f64> = (0..m).map(|i| (probs[i * k + c] * (1.0 - probs[i * k + c])).max(0.0).sqrt()).collect();
                let sks: Vec<f64> = (0..m * m).map(|idx| s[idx / m] * kc[idx] * s[idx % m]).collect();
                let (mut e, u) = eig(&sks, m, &format!("class {c}'s S K S"))?;
                let sks_min = e[0];
                e.iter_mut().for_each(|v| *v = v.max(0.0));
                Ok((DiagClass { s, e, u }, FslClassFit { k_eig: [ke[0], ke[m - 1]], pinv_dropped: dropped, rkr, sks_min_eig: sks_min }))
            })
            .collect();
        let mut diag = Vec::with_capacity(k);
        let mut classes = Vec::with_capacity(k);
        for r in per_class {
            let (d, f) = r?;
            diag.push(d);
            classes.push(f);
        }
        let rkr: f64 = classes.iter().map(|c| c.rkr).sum();
        let (delta, prior_name) = match prior {
            Prior::Fixed(d) => {
                if !(d > 0.0 && d.is_finite()) {
                    return Err(Error::Config(format!("prior precision δ = {d}: must be positive and finite")));
                }
                (d, "fixed")
            }
            Prior::Evidence => (evidence_argmax(rkr, &class_eigs(&diag)), "evidence"),
        };
        let mut fsl = FunctionalLaplace {
            m,
            k,
            delta,
            curvature,
            probs,
            diag,
            full: None,
            k_train: if curvature == Curvature::Full { train.k_train.to_vec() } else { Vec::new() },
            rkr,
            fit: FslFit { curvature, delta, prior: prior_name.into(), log_evidence: 0.0, log_likelihood: loglik, classes, blocks: KernelBlocks::ClassDiagonal, kxk: None },
        };
        fsl.set_delta(delta, prior_name)?;
        Ok(fsl)
    }

    /// Sets the prior precision (refactors the full curvature's factors).
    fn set_delta(&mut self, delta: f64, how: &str) -> Result<()> {
        self.delta = delta;
        self.fit.delta = delta;
        self.fit.prior = how.into();
        self.fit.log_evidence = self.fit.log_likelihood + log_evidence_terms(self.rkr, &self.diag, delta);
        if self.curvature == Curvature::Full {
            self.full = Some(self.full_factors()?);
        }
        Ok(())
    }

    /// `E_c` and `chol(Σ_c E_c)` at the current δ.
    fn full_factors(&self) -> Result<FullFactors> {
        let (m, k, delta) = (self.m, self.k, self.delta);
        let es: Vec<Result<Mat<f64>>> = (0..k)
            .map(|c| {
                let kc = &self.k_train[c * m * m..(c + 1) * m * m];
                let d: Vec<f64> = (0..m).map(|i| self.probs[i * k + c].sqrt()).collect();
                // B = I + D^{1/2} K D^{1/2} / δ; E = D^{1/2} B⁻¹ D^{1/2}.
                let b = Mat::from_fn(m, m, |i, j| d[i] * kc[i * m + j] * d[j] / delta + if i == j { 1.0 } else { 0.0 });
                let llt = b.llt(Side::Lower).map_err(|e| Error::Numerical(format!("function-space Laplace (full): I + D K D/δ of class {c} is not positive definite: {e:?}")))?;
                let mut x = Mat::from_fn(m, m, |i, j| if i == j { d[i] } else { 0.0 });
                x = llt.solve(&x);
                Ok(Mat::from_fn(m, m, |i, j| d[i] * x[(i, j)]))
            })
            .collect();
        let mut e = Vec::with_capacity(k);
        for r in es {
            e.push(r?);
        }
        let mut sum = Mat::<f64>::zeros(m, m);
        for ec in &e {
            sum += ec;
        }
        let sym = Mat::from_fn(m, m, |i, j| 0.5 * (sum[(i, j)] + sum[(j, i)]));
        let llt = sym.llt(Side::Lower).map_err(|e| Error::Numerical(format!("function-space Laplace (full): Σ_c E_c is not positive definite: {e:?}")))?;
        Ok(FullFactors { e, l: llt.L().to_owned() })
    }

    /// The prior precision δ.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// The curvature.
    pub fn curvature(&self) -> Curvature {
        self.curvature
    }

    /// The log evidence (class-diagonal curvature) at `delta`.
    pub fn log_evidence(&self, delta: f64) -> f64 {
        self.fit.log_likelihood + log_evidence_terms(self.rkr, &self.diag, delta)
    }

    /// The logit predictive at `rows` (module docs): mean = the rows' network logits, `Σ*` by the
    /// fitted curvature at δ.
    ///
    /// Errors: shapes; a variance below `−1e-8 ·` its prior (larger negative rounding is an
    /// inconsistency between rows and training kernel), smaller negatives are clamped to 0
    /// and counted in [`FslPredictive::clamped`].
    pub fn predict(&self, rows: &FslRows<'_>) -> Result<FslPredictive> {
        self.check_rows(rows)?;
        match self.curvature {
            Curvature::ClassDiagonal => {
                let z = self.project(rows);
                self.diag_predictive(rows, &z, self.delta)
            }
            Curvature::Full => self.full_predictive(rows),
        }
    }

    fn check_rows(&self, rows: &FslRows<'_>) -> Result<()> {
        let (m, k, p) = (self.m, self.k, rows.p);
        if rows.k_cross.len() != k * p * m || rows.k_diag.len() != k * p || rows.mean.len() != p * k {
            return Err(Error::ShapeMismatch {
                what: "function-space Laplace rows: k_cross [K, P, M], k_diag [K, P], mean [P, K]".into(),
                expected: vec![k * p * m, k * p, p * k],
                got: vec![rows.k_cross.len(), rows.k_diag.len(), rows.mean.len()],
            });
        }
        if let Some(i) = rows.k_cross.iter().chain(rows.k_diag).chain(rows.mean).position(|v| !v.is_finite()) {
            return Err(Error::Data(format!("function-space Laplace rows: non-finite value at flat index {i} (k_cross, k_diag, mean)")));
        }
        Ok(())
    }

    /// `Z_c = Uᵀ S k*` per class. # Shapes `[K]` of `[M, P]`.
    fn project(&self, rows: &FslRows<'_>) -> Vec<Mat<f64>> {
        let (m, p) = (self.m, rows.p);
        (0..self.k)
            .map(|c| {
                let dc = &self.diag[c];
                let kc = &rows.k_cross[c * p * m..(c + 1) * p * m];
                let sk = Mat::from_fn(m, p, |i, q| dc.s[i] * kc[q * m + i]);
                let mut z = Mat::<f64>::zeros(m, p);
                matmul(z.as_mut(), Accum::Replace, dc.u.as_ref().transpose(), sk.as_ref(), 1.0, par());
                z
            })
            .collect()
    }

    fn diag_predictive(&self, rows: &FslRows<'_>, z: &[Mat<f64>], delta: f64) -> Result<FslPredictive> {
        let (m, k, p) = (self.m, self.k, rows.p);
        let mut cov = vec![0.0; p * k * k];
        let mut clamped = 0usize;
        let mut min_var = f64::INFINITY;
        for c in 0..k {
            let dc = &self.diag[c];
            let w: Vec<f64> = dc.e.iter().map(|e| 1.0 / (delta * delta * (1.0 + e / delta))).collect();
            let vars: Vec<f64> = (0..p)
                .into_par_iter()
                .map(|q| {
                    let col = z[c].col(q);
                    let explained: f64 = (0..m).map(|j| col[j] * col[j] * w[j]).sum();
                    rows.k_diag[c * p + q] / delta - explained
                })
                .collect();
            for (q, v) in vars.into_iter().enumerate() {
                let prior = rows.k_diag[c * p + q] / delta;
                min_var = min_var.min(v);
                let v = if v < 0.0 {
                    if v < -1e-8 * prior.abs().max(f64::MIN_POSITIVE) {
                        return Err(Error::Numerical(format!("function-space Laplace: class {c}, row {q}: posterior variance {v:e} is negative beyond rounding (prior {prior:e})")));
                    }
                    clamped += 1;
                    0.0
                } else {
                    v
                };
                cov[(q * k + c) * k + c] = v;
            }
        }
        Ok(FslPredictive { post: LogitPosterior { mean: rows.mean.to_vec(), cov, p, k }, clamped, min_variance: min_var })
    }

    fn full_predictive(&self, rows: &FslRows<'_>) -> Result<FslPredictive> {
        let (m, k, p, delta) = (self.m, self.k, rows.p, self.delta);
        let full = self.full.as_ref().expect("full factors are set at the fit");
        // b_c = E_c k*_c / δ and v_c = L_M⁻¹ b_c, [M, P] each.
        let mut bs = Vec::with_capacity(k);
        let mut vs = Vec::with_capacity(k);
        for c in 0..k {
            let kc = &rows.k_cross[c * p * m..(c + 1) * p * m];
            let ks = Mat::from_fn(m, p, |i, q| kc[q * m + i] / delta);
            let mut b = Mat::<f64>::zeros(m, p);
            matmul(b.as_mut(), Accum::Replace, full.e[c].as_ref(), ks.as_ref(), 1.0, par());
            let mut v = b.clone();
            solve_lower_triangular_in_place(full.l.as_ref(), v.as_mut(), par());
            // bᵀ k*/δ per row, kept in b's first use below.
            let quad: Vec<f64> = (0..p).map(|q| (0..m).map(|i| b[(i, q)] * ks[(i, q)]).sum()).collect();
            bs.push(quad);
            vs.push(v);
        }
        let mut cov = vec![0.0; p * k * k];
        cov.par_chunks_mut(k * k).enumerate().for_each(|(q, out)| {
            for c in 0..k {
                for c2 in 0..=c {
                    let (a, b) = (vs[c].col(q), vs[c2].col(q));
                    let mut s: f64 = (0..m).map(|i| a[i] * b[i]).sum();
                    if c == c2 {
                        s += rows.k_diag[c * p + q] / delta - bs[c][q];
                    }
                    out[c * k + c2] = s;
                    out[c2 * k + c] = s;
                }
            }
        });
        let mut clamped = 0usize;
        let mut min_var = f64::INFINITY;
        for q in 0..p {
            for c in 0..k {
                let v = cov[(q * k + c) * k + c];
                min_var = min_var.min(v);
                if v < 0.0 {
                    let prior = rows.k_diag[c * p + q] / delta;
                    if v < -1e-8 * prior.abs().max(f64::MIN_POSITIVE) {
                        return Err(Error::Numerical(format!("function-space Laplace (full): class {c}, row {q}: posterior variance {v:e} is negative beyond rounding (prior {prior:e})")));
                    }
                    clamped += 1;
                    for c2 in 0..k {
                        cov[(q * k + c) * k + c2] = 0.0;
                        cov[(q * k + c2) * k + c] = 0.0;
                    }
                }
            }
        }
        Ok(FslPredictive { post: LogitPosterior { mean: rows.mean.to_vec(), cov, p, k }, clamped, min_variance: min_var })
    }

    /// δ by a validation grid (laplace-torch's `optimize_prior_precision(method='gridsearch')`): `points` values of
    /// `logspace(min_log10, max_log10)`, each scored by the probit predictive's NLL at `rows`
    /// with `labels`; the best becomes the fit's δ (`prior = "grid"`). Returns the whole sweep
    /// `[(δ, NLL)]`. The class-diagonal curvature scores every δ in `O(M P)` after one
    /// projection; the full one refactors per δ.
    pub(crate) fn grid_search(&mut self, rows: &FslRows<'_>, labels: &[usize], min_log10: f64, max_log10: f64, points: usize) -> Result<Vec<(f64, f64)>> {
        self.check_rows(rows)?;
        if labels.len() != rows.p || points < 2 || !(max_log10 > min_log10) {
            return Err(Error::Config(format!("grid search: {} labels for {} rows, {points} points in [{min_log10}, {max_log10}]", labels.len(), rows.p)));
        }
        let z = if self.curvature == Curvature::ClassDiagonal { Some(self.project(rows)) } else { None };
        let mut sweep = Vec::with_capacity(points);
        let saved = self.delta;
        for i in 0..points {
            let delta = 10f64.powf(min_log10 + (max_log10 - min_log10) * i as f64 / (points - 1) as f64);
            let pred = match &z {
                Some(z) => self.diag_predictive(rows, z, delta)?,
                None => {
                    self.set_delta(delta, "grid")?;
                    self.full_predictive(rows)?
                }
            };
            sweep.push((delta, nll(&pred.post.probit(1.0, 1.0), labels, self.k)));
        }
        let best = sweep.iter().copied().filter(|v| v.1.is_finite()).min_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((d, _)) => self.set_delta(d, "grid")?,
            None => {
                self.set_delta(saved, &self.fit.prior.clone())?;
                return Err(Error::Numerical("grid search: no prior precision gave a finite validation NLL".into()));
            }
        }
        Ok(sweep)
    }
}

/// `−(δ/2) A − ½ Σ_c Σ_j log(1 + e_cj/δ)`.
fn log_evidence_terms(rkr: f64, diag: &[DiagClass], delta: f64) -> f64 {
    let logdet: f64 = diag.iter().flat_map(|d| d.e.iter()).map(|e| (e / delta).ln_1p()).sum();
    -0.5 * delta * rkr - 0.5 * logdet
}

/// The eigenvalues of every class's `S K_c S`.
fn class_eigs(diag: &[DiagClass]) -> Vec<&[f64]> {
    diag.iter().map(|d| d.e.as_slice()).collect()
}

/// The δ maximising the evidence `−(δ/2) A − ½ Σ log(1 + e/δ)` over the eigenvalues `eigs` (of
/// `S K S` per class, or of the cross-class `Fᵀ K F`): the root in `u = ln δ` of
/// `g(u) = −(δ/2) A + ½ Σ e/(δ + e)`, strictly decreasing, by bisection on `[1e-30, 1e30]`.
pub(crate) fn evidence_argmax(rkr: f64, eigs: &[&[f64]]) -> f64 {
    let g = |u: f64| {
        let d = u.exp();
        -0.5 * d * rkr + 0.5 * eigs.iter().flat_map(|c| c.iter()).map(|e| e / (d + e)).sum::<f64>()
    };
    let (mut lo, mut hi) = ((1e-30f64).ln(), (1e30f64).ln());
    if g(lo) <= 0.0 {
        return lo.exp();
    }
    if g(hi) >= 0.0 {
        return hi.exp();
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if g(mid) > 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (0.5 * (lo + hi)).exp()
}

pub(crate) fn nll(probs: &[f64], labels: &[usize], k: usize) -> f64 {
    let n = labels.len().max(1) as f64;
    probs.chunks_exact(k).zip(labels).map(|(row, &y)| -row[y].max(f64::MIN_POSITIVE).ln()).sum::<f64>() / n
}

/// A function-space Laplace predictive at some rows.
#[derive(Clone, Debug)]
pub struct FslPredictive {
    /// Mean (the network's logits) and `Σ*`. # Shapes `mean [P, K]`, `cov [P, K, K]`.
    pub post: LogitPosterior,
    /// Variances within rounding below 0, set to 0.
    pub clamped: usize,
    /// The smallest posterior variance before clamping.
    pub min_variance: f64,
}

impl LogitPosterior {
    /// The probit predictive `softmax_c((μ_c/T) / √(1 + π/8 · s·Σ_cc))` (`T = s = 1`: the plain
    /// probit link). # Shapes Returns `[P, K]`.
    pub fn probit(&self, temperature: f64, scale: f64) -> Vec<f64> {
        let k = self.k;
        let mut out = vec![0.0; self.p * k];
        for (q, row) in out.chunks_exact_mut(k).enumerate() {
            for c in 0..k {
                let v = self.cov[(q * k + c) * k + c].max(0.0);
                row[c] = self.mean[q * k + c] / temperature / (1.0 + PI_8 * scale * v).sqrt();
            }
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut s = 0.0;
            for v in row.iter_mut() {
                *v = (*v - m).exp();
                s += *v;
            }
            row.iter_mut().for_each(|v| *v /= s);
        }
        out
    }

    /// The same posterior with the mean divided by `temperature` and the covariance times
    /// `scale` (the calibrated predictive's logits, for Monte Carlo).
    pub fn calibrated(&self, temperature: f64, scale: f64) -> LogitPosterior {
        LogitPosterior {
            mean: self.mean.iter().map(|v| v / temperature).collect(),
            cov: self.cov.iter().map(|v| v * scale).collect(),
            p: self.p,
            k: self.k,
        }
    }
}

/// A temperature on the mean and a scale on the covariance, fitted on validation points by the
/// probit predictive's NLL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Temperature T on the mean.
    pub temperature: f64,
    /// Scale s on `Σ*` (0: temperature scaling).
    pub scale: f64,
    /// Validation NLL at (T, s).
    pub val_nll: f64,
    /// The s-frontier: `[s, T*(s), NLL(s, T*(s))]` for every s tried.
    pub frontier: Vec<[f64; 3]>,
}

/// The scales the calibration tries: 0 and `10^{−3} … 10^{3}` in 61 steps.
pub(crate) fn calibration_scales() -> Vec<f64> {
    std::iter::once(0.0).chain((0..=60).map(|i| 10f64.powf(-3.0 + 0.1 * i as f64))).collect()
}

/// Fits (T, s) on validation points (`scales`: the s tried, each with T by golden section on
/// `log T ∈ [ln 0.02, ln 50]`); `scales = [1]` fits T alone.
///
/// Errors: no finite NLL, labels not matching rows.
pub fn calibrate(val: &LogitPosterior, labels: &[usize], scales: &[f64]) -> Result<Calibration> {
    if labels.len() != val.p || scales.is_empty() {
        return Err(Error::Config(format!("calibrate: {} labels for {} validation rows, {} scales", labels.len(), val.p, scales.len())));
    }
    let k = val.k;
    let mut frontier = Vec::with_capacity(scales.len());
    for &s in scales {
        let f = |lt: f64| nll(&val.probit(lt.exp(), s), labels, k);
        let gr = (5f64.sqrt() - 1.0) / 2.0;
        let (mut a, mut b) = ((0.02f64).ln(), (50f64).ln());
        let mut x1 = b - gr * (b - a);
        let mut x2 = a + gr * (b - a);
        let (mut f1, mut f2) = (f(x1), f(x2));
        while b - a > 1e-6 {
            if f1 <= f2 {
                b = x2;
                x2 = x1;
                f2 = f1;
                x1 = b - gr * (b - a);
                f1 = f(x1);
            } else {
                a = x1;
                x1 = x2;
                f1 = f2;
                x2 = a + gr * (b - a);
                f2 = f(x2);
            }
        }
        let lt = 0.5 * (a + b);
        frontier.push([s, lt.exp(), f(lt)]);
    }
    let best = frontier.iter().copied().filter(|v| v[2].is_finite()).min_by(|a, b| a[2].total_cmp(&b[2])).ok_or_else(|| Error::Numerical("calibrate: no finite validation NLL".into()))?;
    Ok(Calibration { temperature: best[1], scale: best[0], val_nll: best[2], frontier })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random PSD class blocks from features: K_c = Φ_c Φ_cᵀ over train + test points.
    fn problem(m: usize, p: usize, k: usize, feat: usize, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<usize>, Vec<f64>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = m + p;
        let mut k_train = vec![0.0; k * m * m];
        let mut k_cross = vec![0.0; k * p * m];
        let mut k_diag = vec![0.0; k * p];
        for c in 0..k {
            let phi: Vec<f64> = (0..n * feat).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let dot = |a: usize, b: usize| (0..feat).map(|f| phi[a * feat + f] * phi[b * feat + f]).sum::<f64>();
            for i in 0..m {
                for j in 0..m {
                    k_train[(c * m + i) * m + j] = dot(i, j);
                }
            }
            for q in 0..p {
                for i in 0..m {
                    k_cross[(c * p + q) * m + i] = dot(m + q, i);
                }
                k_diag[c * p + q] = dot(m + q, m + q);
            }
        }
        let logits: Vec<f64> = (0..m * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let bias: Vec<f64> = (0..m * k).map(|_| rng.gen_range(-0.1..0.1)).collect();
        let labels: Vec<usize> = (0..m).map(|_| rng.gen_range(0..k)).collect();
        let mean: Vec<f64> = (0..p * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
        (k_train, logits, bias, k_cross, k_diag, labels, mean)
    }

    /// The dense formula Σ* = σ0² k** − σ0⁴ k*ᵀ F (I + σ0² Fᵀ K F)⁻¹ Fᵀ k*, class-major index
    /// (c, i), with F_i = diag(√p_i) − p_i √p_iᵀ (full) or diag(√(p(1−p))) (class-diagonal).
    fn dense(kt: &[f64], kx: &[f64], kd: &[f64], probs: &[f64], m: usize, p: usize, k: usize, delta: f64, full: bool) -> Vec<f64> {
        let n = m * k;
        let mut kk = DMatrix::<f64>::zeros(n, n);
        for c in 0..k {
            for i in 0..m {
                for j in 0..m {
                    kk[(c * m + i, c * m + j)] = kt[(c * m + i) * m + j];
                }
            }
        }
        let mut f = DMatrix::<f64>::zeros(n, n);
        for i in 0..m {
            let pr = &probs[i * k..(i + 1) * k];
            for a in 0..k {
                for b in 0..k {
                    f[(a * m + i, b * m + i)] = if full {
                        (if a == b { pr[a].sqrt() } else { 0.0 }) - pr[a] * pr[b].sqrt()
                    } else if a == b {
                        (pr[a] * (1.0 - pr[a])).sqrt()
                    } else {
                        0.0
                    };
                }
            }
        }
        let s0 = 1.0 / delta;
        let b = DMatrix::<f64>::identity(n, n) + f.transpose() * &kk * &f * s0;
        let binv = b.try_inverse().unwrap();
        let mut out = vec![0.0; p * k * k];
        for q in 0..p {
            let mut ks = DMatrix::<f64>::zeros(n, k);
            for c in 0..k {
                for i in 0..m {
                    ks[(c * m + i, c)] = kx[(c * p + q) * m + i];
                }
            }
            let g = f.transpose() * &ks;
            let red = g.transpose() * &binv * &g;
            for a in 0..k {
                for b2 in 0..k {
                    let prior = if a == b2 { s0 * kd[a * p + q] } else { 0.0 };
                    out[(q * k + a) * k + b2] = prior - s0 * s0 * red[(a, b2)];
                }
            }
        }
        out
    }

    fn max_rel(a: &[f64], b: &[f64]) -> f64 {
        let scale = b.iter().fold(0.0f64, |s, v| s.max(v.abs()));
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
    }

    #[test]
    fn class_diagonal_and_full_match_the_dense_formula() {
        let (m, p, k) = (12, 5, 3);
        let (kt, logits, bias, kx, kd, labels, mean) = problem(m, p, k, 30, 1);
        let train = FslTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
        let rows = FslRows { k_cross: &kx, k_diag: &kd, mean: &mean, p };
        let probs = crate::model::softmax_rows(&logits, k).unwrap();
        for (curv, full) in [(Curvature::ClassDiagonal, false), (Curvature::Full, true)] {
            for delta in [0.3, 2.0, 50.0] {
                let fsl = FunctionalLaplace::fit(&train, curv, Prior::Fixed(delta)).unwrap();
                let got = fsl.predict(&rows).unwrap();
                let want = dense(&kt, &kx, &kd, &probs, m, p, k, delta, full);
                let e = max_rel(&got.post.cov, &want);
                assert!(e < 1e-10, "{curv} δ = {delta}: {e:e}");
                assert_eq!(got.post.mean, mean);
            }
        }
    }

    #[test]
    fn evidence_maximum_is_the_grid_maximum() {
        let (m, k) = (15, 3);
        let (kt, logits, bias, _, _, labels, _) = problem(m, 1, k, 40, 2);
        let train = FslTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
        let fsl = FunctionalLaplace::fit(&train, Curvature::ClassDiagonal, Prior::Evidence).unwrap();
        let best = fsl.log_evidence(fsl.delta());
        for i in 0..400 {
            let d = 10f64.powf(-6.0 + 12.0 * i as f64 / 399.0);
            assert!(fsl.log_evidence(d) <= best + 1e-9 * best.abs(), "δ = {d}: {} > {best}", fsl.log_evidence(d));
        }
        // The slow evidence: log p(y|f) − (δ/2) Σ rᵀK⁻¹r − ½ Σ log det(I + SKS/δ) by dense solves.
        let delta = fsl.delta();
        let probs = crate::model::softmax_rows(&logits, k).unwrap();
        let mut slow = log_likelihood(&logits, &labels, k);
        for c in 0..k {
            let kc = DMatrix::from_fn(m, m, |i, j| kt[(c * m + i) * m + j]);
            let r = DMatrix::from_fn(m, 1, |i, _| logits[i * k + c] - bias[i * k + c]);
            let s = DMatrix::from_fn(m, m, |i, j| if i == j { (probs[i * k + c] * (1.0 - probs[i * k + c])).sqrt() } else { 0.0 });
            slow -= 0.5 * delta * (r.transpose() * kc.clone().try_inverse().unwrap() * &r)[(0, 0)];
            slow -= 0.5 * (DMatrix::identity(m, m) + &s * &kc * &s / delta).determinant().ln();
        }
        assert!((slow - best).abs() < 1e-8 * slow.abs(), "{slow} vs {best}");
    }

    #[test]
    fn grid_search_picks_the_lowest_validation_nll_and_calibration_nests_temperature() {
        let (m, p, k) = (20, 30, 3);
        let (kt, logits, bias, kx, kd, _, mean) = problem(m, p, k, 25, 3);
        let labels: Vec<usize> = (0..m).map(|i| crate::data::argmax(&logits[i * k..(i + 1) * k])).collect();
        let vlabels: Vec<usize> = (0..p).map(|q| (q * 7) % k).collect();
        let train = FslTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
        let rows = FslRows { k_cross: &kx, k_diag: &kd, mean: &mean, p };
        for curv in [Curvature::ClassDiagonal, Curvature::Full] {
            let mut fsl = FunctionalLaplace::fit(&train, curv, Prior::Fixed(1.0)).unwrap();
            let sweep = fsl.grid_search(&rows, &vlabels, -2.0, 2.0, 9).unwrap();
            let best = sweep.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
            assert_eq!(fsl.delta(), best.0);
            let pred = fsl.predict(&rows).unwrap();
            assert!((nll(&pred.post.probit(1.0, 1.0), &vlabels, k) - best.1).abs() < 1e-12);
            let cal = calibrate(&pred.post, &vlabels, &calibration_scales()).unwrap();
            // s = 0 is temperature scaling; the chosen pair is at least as good as every s.
            assert_eq!(cal.frontier[0][0], 0.0);
            assert!(cal.frontier.iter().all(|f| cal.val_nll <= f[2]));
            let t_only = calibrate(&pred.post, &vlabels, &[1.0]).unwrap();
            assert!(cal.val_nll <= t_only.val_nll + 1e-12);
        }
    }

    #[test]
    fn bad_inputs_are_refused() {
        let (m, p, k) = (6, 2, 3);
        let (kt, logits, bias, kx, kd, labels, mean) = problem(m, p, k, 10, 4);
        let train = FslTrain { k_train: &kt[1..], logits: &logits, bias: &bias, labels: &labels, m, k };
        assert!(FunctionalLaplace::fit(&train, Curvature::ClassDiagonal, Prior::Evidence).is_err());
        let mut nonsym = kt.clone();
        nonsym[1] += 1.0;
        let train = FslTrain { k_train: &nonsym, logits: &logits, bias: &bias, labels: &labels, m, k };
        assert!(FunctionalLaplace::fit(&train, Curvature::ClassDiagonal, Prior::Evidence).unwrap_err().to_string().contains("not symmetric"));
        let train = FslTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
        assert!(FunctionalLaplace::fit(&train, Curvature::ClassDiagonal, Prior::Fixed(0.0)).is_err());
        let fsl = FunctionalLaplace::fit(&train, Curvature::ClassDiagonal, Prior::Fixed(1.0)).unwrap();
        let rows = FslRows { k_cross: &kx[1..], k_diag: &kd, mean: &mean, p };
        assert!(fsl.predict(&rows).is_err());
    }
}
