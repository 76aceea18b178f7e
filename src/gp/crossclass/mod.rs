//! Function-space Laplace with the **cross-class** kernel: the whole `[M·K, M·K]` kernel on the
//! logits, `K_{(i,c),(j,c')} = k^{cc'}(x_i, x_j)` (a full-layout Gram, K × K blocks per pair),
//! instead of one GP per class ([`super::functional`]).
//!
//! With `σ0² = 1/δ`, the curvature `Λ = F Fᵀ` block-diagonal over the training points and
//! `G = Fᵀ K F`, the logits at `x*` are `N(f(x*), Σ*)`, a `K × K` covariance per point,
//!
//! `Σ* = k**/δ − k*ᵀ F (δ I + G)⁻¹ Fᵀ k* / δ`,
//!
//! (`k*` `[M·K, K]`, `k**` `[K, K]`), never forming `Λ⁻¹`. Two curvatures ([`Curvature`]):
//!
//! - [`Curvature::ClassDiagonal`] — **laplace-torch's `independent_outputs=False`** (its default):
//!   laplace-torch's `FunctionalLaplace._build_L` keeps only the diagonal of the per-point
//!   softmax Hessian, `λ_ic = p_ic − p_ic²`, and `_build_Sigma_inv` factors `K/δ + diag(1/λ)`
//!   with `1/λ = ∞` (`λ` exactly 0 in float64) replaced by 10 (`torch.nan_to_num(…, posinf=10)`),
//!   so here `F = diag(√λ)` with such a `λ` taken as 0.1 (counted in [`super::KxkNumbers::lambda_zero`];
//!   its `log_det_ratio` takes them as 0, so the evidences differ by design where any exist).
//! - [`Curvature::Full`] — the **GGN-exact** posterior: `Λ_i = diag(p_i) − p_i p_iᵀ` per point
//!   (rank K − 1), `F_i = diag(√p_i) − p_i √p_iᵀ` (`F_i F_iᵀ = Λ_i`).
//!
//! **Factorisation** ([`KxkSolver`]). The eigen route: `G` is eigendecomposed once, `G = U diag(e) Uᵀ` (`O((MK)³)`, about ten
//! times a Cholesky): then for every δ, `Σ* = k**/δ − Σ_j z_j z_jᵀ / (δ (δ + e_j))` with
//! `z = Uᵀ Fᵀ k*` and the evidence's log-determinant `Σ_j log(1 + e_j/δ)`, so δ by the evidence
//! and a validation grid cost no refactorisation. The fit also factors `I + G/δ` by Cholesky at
//! the chosen δ (the one-δ alternative; laplace-torch's `K/δ + diag(1/λ)` is the same size and
//! exists only for the diagonal curvature) and reports both wall times and their
//! log-determinants' difference ([`super::KxkNumbers`]). The Cholesky route (`cholesky.rs`) never
//! eigendecomposes: one Cholesky of `δ I + G` per δ tried (Brent's search on the evidence, a
//! coarse-to-fine validation grid), `rᵀK⁺r` by a Cholesky of `K` — the route for large systems,
//! where an eigendecomposition costs tens of Choleskys.
//!
//! **Evidence** (R&W eq. 3.32 with the targets `r = f − f(w_0)`):
//! `log Z(δ) = log p(y|f) − (δ/2) rᵀ K⁺ r − ½ log det(I + G/δ)`, `K⁺` the pseudo-inverse on the
//! eigenvalues above `1e-12 ·` the largest (the count left out is reported); its derivative in
//! `log δ` is strictly decreasing (one maximum, found by bisection).
//!
//! # Shapes
//! Train Gram `[M, M, K, K]` (`G[i, j, c, c']`, the kernel's full layout), logits and `f_{w_0}`
//! `[M, K]`, labels `[M]`; rows: `k*` `[P, M, K, K]` (`k^{cc'}(x*_p, x_j)`), `k**` `[P, K, K]`,
//! mean `[P, K]`. The system's index is point-major, `i K + c` (laplace-torch's order).

pub(crate) mod cholesky;

use std::time::Instant;

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par, Side};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::functional::{evidence_argmax, Curvature, FslFit, FslPredictive, KernelBlocks, Prior, PINV_REL};
use super::kxk::{KxkNumbers, KxkSeconds, KxkSolver};
use super::lastlayer::LogitPosterior;
use crate::error::{Error, Result};
use cholesky::CholFactor;

/// laplace-torch's `1/λ` where `λ` is exactly 0 (`_build_Sigma_inv`: `nan_to_num(posinf=10)`).
const LT_INV_LAMBDA_AT_ZERO: f64 = 10.0;
/// Test points per block of the predictive (bounds the `[M K, block K]` work arrays).
const BLOCK: usize = 128;

fn par() -> Par {
    Par::rayon(0)
}

/// The training side of a cross-class fit.
#[derive(Clone, Copy, Debug)]
pub struct KxkTrain<'a> {
    /// The train × train Gram, every class block. # Shapes `[M, M, K, K]`.
    pub k_train: &'a [f64],
    /// Logits `f_{w_N}(x_i)`. # Shapes `[M, K]`.
    pub logits: &'a [f64],
    /// Logits at the initial state (the prior mean). # Shapes `[M, K]`.
    pub bias: &'a [f64],
    /// Class labels. # Shapes `[M]`.
    pub labels: &'a [usize],
    /// Training points M.
    pub m: usize,
    /// Classes K.
    pub k: usize,
}

/// The rows a cross-class predictive is computed at.
#[derive(Clone, Copy, Debug)]
pub struct KxkRows<'a> {
    /// `k^{cc'}(x*_p, x_j)`. # Shapes `[P, M, K, K]`.
    pub k_cross: &'a [f64],
    /// `k^{cc'}(x*_p, x*_p)`. # Shapes `[P, K, K]`.
    pub k_self: &'a [f64],
    /// The predictive mean: the network's logits. # Shapes `[P, K]`.
    pub mean: &'a [f64],
    /// Rows P.
    pub p: usize,
}

/// Checks a cross-class fit's inputs: shapes, at least two classes, finite values, labels in
/// range, a valid fixed δ, and a symmetric train Gram.
fn check_train(train: &KxkTrain<'_>, prior: Prior) -> Result<()> {
    let (m, k) = (train.m, train.k);
    let n = m * k;
    if train.k_train.len() != n * n || train.logits.len() != n || train.bias.len() != n || train.labels.len() != m {
        return Err(Error::ShapeMismatch {
            what: "cross-class function-space Laplace train side: k_train [M, M, K, K], logits and bias [M, K], labels [M]".into(),
            expected: vec![n * n, n, n, m],
            got: vec![train.k_train.len(), train.logits.len(), train.bias.len(), train.labels.len()],
        });
    }
    if m == 0 || k < 2 {
        return Err(Error::Config("function-space Laplace needs training points and at least two classes".into()));
    }
    if let Some(i) = train.k_train.iter().chain(train.logits).chain(train.bias).position(|v| !v.is_finite()) {
        return Err(Error::Data(format!("cross-class function-space Laplace: non-finite input at flat index {i} (k_train, logits, bias)")));
    }
    if let Some(&y) = train.labels.iter().find(|&&y| y >= k) {
        return Err(Error::Data(format!("cross-class function-space Laplace: label {y} is not one of {k} classes")));
    }
    if let Prior::Fixed(d) = prior {
        if !(d > 0.0 && d.is_finite()) {
            return Err(Error::Config(format!("prior precision δ = {d}: must be positive and finite")));
        }
    }
    // The system's matrix, index i K + c: K[(i,c),(j,c')] = G[i, j, c, c'].
    let idx = |r: usize, s: usize| ((r / k * m + s / k) * k + r % k) * k + s % k;
    let scale = train.k_train.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let asym = (0..n).into_par_iter().find_map_first(|r| {
        (r + 1..n).find_map(|s| {
            let d = (train.k_train[idx(r, s)] - train.k_train[idx(s, r)]).abs();
            (d > 1e-9 * scale.max(f64::MIN_POSITIVE)).then_some((r, s, d))
        })
    });
    if let Some((r, s, d)) = asym {
        return Err(Error::Numerical(format!(
            "cross-class function-space Laplace: the train Gram is not symmetric ((point, class) {:?} against {:?}: {d:e} of {scale:e})",
            (r / k, r % k),
            (s / k, s % k)
        )));
    }
    Ok(())
}

/// A fitted cross-class function-space Laplace approximation (module docs).
#[derive(Clone, Debug)]
pub struct CrossClassLaplace {
    m: usize,
    k: usize,
    delta: f64,
    curvature: Curvature,
    /// Per-point factors `F_i`, row-major. # Shapes `[M, K, K]`.
    f: Vec<f64>,
    factor: Factor,
    rkr: f64,
    /// The fit's numbers.
    pub fit: FslFit,
}

/// The factorisation a fit keeps.
#[derive(Clone, Debug)]
enum Factor {
    /// Eigenvalues of G, clamped at 0, and its eigenvectors. # Shapes `e [M K]`, `u [M K, M K]`.
    Eigen { e: Vec<f64>, u: Mat<f64> },
    /// `G` packed and the Cholesky factor of `δ I + G` (`cholesky.rs`).
    Cholesky(CholFactor),
}

/// The per-point factors `F_i` (module docs) and the count of `λ` exactly 0.
fn factors(probs: &[f64], m: usize, k: usize, curvature: Curvature) -> (Vec<f64>, usize) {
    let mut f = vec![0.0; m * k * k];
    let mut zero = 0usize;
    for i in 0..m {
        let p = &probs[i * k..(i + 1) * k];
        let fi = &mut f[i * k * k..(i + 1) * k * k];
        match curvature {
            Curvature::ClassDiagonal => {
                for c in 0..k {
                    // laplace-torch: the diagonal of diag(p) − p pᵀ, p − p·p.
                    let lam = p[c] - p[c] * p[c];
                    let lam = if lam == 0.0 {
                        zero += 1;
                        1.0 / LT_INV_LAMBDA_AT_ZERO
                    } else {
                        lam.max(0.0)
                    };
                    fi[c * k + c] = lam.sqrt();
                }
            }
            Curvature::Full => {
                for a in 0..k {
                    for b in 0..k {
                        fi[a * k + b] = if a == b { p[b].sqrt() } else { 0.0 } - p[a] * p[b].sqrt();
                    }
                }
            }
        }
    }
    (f, zero)
}

fn eig_sym(a: &Mat<f64>, what: &str) -> Result<(Vec<f64>, Mat<f64>)> {
    let evd = a.self_adjoint_eigen(Side::Lower).map_err(|e| Error::Numerical(format!("{what}: eigendecomposition failed: {e:?}")))?;
    let e: Vec<f64> = evd.S().column_vector().iter().copied().collect();
    if let Some(i) = e.iter().position(|v| !v.is_finite()) {
        return Err(Error::Numerical(format!("{what}: eigenvalue {i} is {}", e[i])));
    }
    Ok((e, evd.U().to_owned()))
}

/// `A = Fᵀ k*` for rows `q0..q1`: column `(q − q0) K + c` holds `Σ_b F_j[b][a] k^{cb}(x*_q, x_j)`
/// at row `j K + a`. # Shapes `[M K, (q1 − q0) K]`.
fn project_rows(f: &[f64], rows: &KxkRows<'_>, m: usize, k: usize, q0: usize, q1: usize) -> Mat<f64> {
    let mut a = Mat::<f64>::zeros(m * k, (q1 - q0) * k);
    let kk = k * k;
    for q in q0..q1 {
        for c in 0..k {
            let col = (q - q0) * k + c;
            for j in 0..m {
                let blk = &rows.k_cross[(q * m + j) * kk + c * k..(q * m + j) * kk + c * k + k];
                let fj = &f[j * kk..(j + 1) * kk];
                for aa in 0..k {
                    let mut s = 0.0;
                    for b in 0..k {
                        s += fj[b * k + aa] * blk[b];
                    }
                    a[(j * k + aa, col)] = s;
                }
            }
        }
    }
    a
}

impl CrossClassLaplace {
    /// Fits on the training side by the eigen route ([`CrossClassLaplace::fit_with`]).
    ///
    /// Errors: as [`CrossClassLaplace::fit_with`].
    pub fn fit(train: &KxkTrain<'_>, curvature: Curvature, prior: Prior) -> Result<Self> {
        Self::fit_with(train, curvature, prior, KxkSolver::Eigen)
    }

    /// Fits on the training side (module docs): the curvature's factors, then by `solver` either
    /// the eigendecompositions of K and of `G = Fᵀ K F` (δ by `prior`, and the Cholesky of
    /// `I + G/δ` timed beside) or the Cholesky route (`cholesky.rs`: `rᵀK⁺r` by a Cholesky of K,
    /// one Cholesky of `δ I + G` per δ of the search).
    ///
    /// Errors: shapes, non-finite values, a non-symmetric Gram (relative `1e-9`), a kernel with
    /// an eigenvalue below `−1e-9 ·` its largest (not PSD; eigen route — the Cholesky route
    /// fails where `K + τ I` does not factor for any `τ ≤ 1e-4 λ_max`), δ ≤ 0, a failed
    /// factorisation.
    pub fn fit_with(train: &KxkTrain<'_>, curvature: Curvature, prior: Prior, solver: KxkSolver) -> Result<Self> {
        let (m, k) = (train.m, train.k);
        let n = m * k;
        check_train(train, prior)?;
        let idx = |r: usize, s: usize| ((r / k * m + s / k) * k + r % k) * k + s % k;
        let probs = crate::model::softmax_rows(train.logits, k)?;
        let loglik = super::functional::log_likelihood(train.logits, train.labels, k);
        let r: Vec<f64> = train.logits.iter().zip(train.bias).map(|(a, b)| a - b).collect();
        let (f, lambda_zero) = factors(&probs, m, k, curvature);
        let base = |delta: f64, factor: Factor, rkr: f64, numbers: KxkNumbers, how: &str| CrossClassLaplace {
            m,
            k,
            delta,
            curvature,
            f: f.clone(),
            factor,
            rkr,
            fit: FslFit { curvature, delta, prior: how.into(), log_evidence: 0.0, log_likelihood: loglik, classes: Vec::new(), blocks: KernelBlocks::CrossClass, kxk: Some(numbers) },
        };
        match solver {
            KxkSolver::Eigen => {
                let kmat = Mat::from_fn(n, n, |r, s| 0.5 * (train.k_train[idx(r, s)] + train.k_train[idx(s, r)]));
                let t = Instant::now();
                let (ke, ku) = eig_sym(&kmat, "the cross-class train kernel")?;
                let eig_k = t.elapsed().as_secs_f64();
                let top = ke.iter().fold(0.0f64, |a, b| a.max(b.abs()));
                if ke[0] < -1e-9 * top {
                    return Err(Error::Numerical(format!("cross-class function-space Laplace: the train kernel has eigenvalue {:e} against a largest of {top:e}: not positive semi-definite", ke[0])));
                }
                let (mut rkr, mut dropped) = (0.0, 0usize);
                let proj: Vec<f64> = (0..n).into_par_iter().map(|j| (0..n).map(|i| ku[(i, j)] * r[i]).sum::<f64>()).collect();
                for j in 0..n {
                    if ke[j] <= PINV_REL * top {
                        dropped += 1;
                    } else {
                        rkr += proj[j] * proj[j] / ke[j];
                    }
                }
                drop(ku);
                let t = Instant::now();
                let g = form_g(&kmat, &f, m, k);
                drop(kmat);
                let form_g_s = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let (mut e, u) = eig_sym(&g, "G = Fᵀ K F")?;
                let eig_g = t.elapsed().as_secs_f64();
                let g_min = e[0];
                e.iter_mut().for_each(|v| *v = v.max(0.0));
                let (delta, how) = match prior {
                    Prior::Fixed(d) => (d, "fixed"),
                    Prior::Evidence => (evidence_argmax(rkr, &[&e]), "evidence"),
                };
                // The one-δ alternative: Cholesky of I + G/δ, timed, its log-determinant against
                // the eigenvalues'.
                let t = Instant::now();
                let b = Mat::from_fn(n, n, |i, j| g[(i, j)] / delta + if i == j { 1.0 } else { 0.0 });
                drop(g);
                let llt = b.llt(Side::Lower).map_err(|e| Error::Numerical(format!("cross-class function-space Laplace: I + G/δ is not positive definite: {e:?}")))?;
                let cholesky = t.elapsed().as_secs_f64();
                let logdet_chol: f64 = 2.0 * (0..n).map(|i| llt.L()[(i, i)].ln()).sum::<f64>();
                let logdet_eig: f64 = e.iter().map(|v| (v / delta).ln_1p()).sum();
                let logdet_rel_diff = (logdet_chol - logdet_eig).abs() / logdet_eig.abs().max(f64::MIN_POSITIVE);
                let numbers = KxkNumbers {
                    n,
                    solver,
                    k_eig: Some([ke[0], ke[n - 1]]),
                    pinv_dropped: Some(dropped),
                    rkr,
                    scatter_jitter: None,
                    g_min_eig: Some(g_min),
                    lambda_zero,
                    seconds: KxkSeconds { eig_k, form_g: form_g_s, eig_g, cholesky },
                    logdet_rel_diff: Some(logdet_rel_diff),
                    search_factorisations: None,
                };
                let mut out = base(delta, Factor::Eigen { e, u }, rkr, numbers, how);
                out.set_delta(delta, how)?;
                Ok(out)
            }
            KxkSolver::Cholesky => {
                let mut buf = Mat::<f64>::zeros(n, n);
                let t = Instant::now();
                let (rkr, tau) = cholesky::scatter(train.k_train, &r, m, k, &mut buf)?;
                let factor_k = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let g = cholesky::form_g_packed(train.k_train, &f, m, k);
                let form_g_s = t.elapsed().as_secs_f64();
                let mut fac = CholFactor::new(g, buf);
                let t = Instant::now();
                let (delta, how, evals) = match prior {
                    Prior::Fixed(d) => {
                        fac.factor(d)?;
                        (d, "fixed", 1)
                    }
                    Prior::Evidence => {
                        let (d, evals) = fac.evidence_argmax(loglik, rkr)?;
                        (d, "evidence", evals)
                    }
                };
                let search = t.elapsed().as_secs_f64();
                let numbers = KxkNumbers {
                    n,
                    solver,
                    k_eig: None,
                    pinv_dropped: None,
                    rkr,
                    scatter_jitter: Some(tau),
                    g_min_eig: None,
                    lambda_zero,
                    seconds: KxkSeconds { eig_k: factor_k, form_g: form_g_s, eig_g: search, cholesky: search / evals as f64 },
                    logdet_rel_diff: None,
                    search_factorisations: Some(evals),
                };
                let mut out = base(delta, Factor::Cholesky(fac), rkr, numbers, how);
                out.set_delta(delta, how)?;
                Ok(out)
            }
        }
    }

    /// Sets δ (the Cholesky route refactors there) and the evidence at it.
    fn set_delta(&mut self, delta: f64, how: &str) -> Result<()> {
        if let Factor::Cholesky(fac) = &mut self.factor {
            fac.factor(delta)?;
        }
        self.delta = delta;
        self.fit.delta = delta;
        self.fit.prior = how.into();
        self.fit.log_evidence = self.evidence_at_factor(delta);
        Ok(())
    }

    /// The evidence at δ from the kept factorisation (the Cholesky route: at its factored δ).
    fn evidence_at_factor(&self, delta: f64) -> f64 {
        let logdet = match &self.factor {
            Factor::Eigen { e, .. } => e.iter().map(|v| (v / delta).ln_1p()).sum(),
            Factor::Cholesky(fac) => fac.logdet_ratio(),
        };
        self.fit.log_likelihood - 0.5 * delta * self.rkr - 0.5 * logdet
    }

    /// The prior precision δ.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// The curvature.
    pub fn curvature(&self) -> Curvature {
        self.curvature
    }

    /// The factorisation route.
    pub fn solver(&self) -> KxkSolver {
        match self.factor {
            Factor::Eigen { .. } => KxkSolver::Eigen,
            Factor::Cholesky(_) => KxkSolver::Cholesky,
        }
    }

    /// The log evidence at `delta` (module docs); the Cholesky route factors `δ I + G` once more
    /// (an `[M K, M K]` temporary).
    ///
    /// Errors: δ ≤ 0; a failed factorisation.
    pub fn log_evidence(&self, delta: f64) -> Result<f64> {
        if !(delta > 0.0 && delta.is_finite()) {
            return Err(Error::Config(format!("prior precision δ = {delta}: must be positive and finite")));
        }
        match &self.factor {
            Factor::Eigen { .. } => Ok(self.evidence_at_factor(delta)),
            Factor::Cholesky(fac) => {
                let mut other = fac.clone();
                other.factor(delta)?;
                Ok(self.fit.log_likelihood - 0.5 * delta * self.rkr - 0.5 * other.logdet_ratio())
            }
        }
    }

    fn check_rows(&self, rows: &KxkRows<'_>) -> Result<()> {
        let (m, k, p) = (self.m, self.k, rows.p);
        if rows.k_cross.len() != p * m * k * k || rows.k_self.len() != p * k * k || rows.mean.len() != p * k {
            return Err(Error::ShapeMismatch {
                what: "cross-class function-space Laplace rows: k_cross [P, M, K, K], k_self [P, K, K], mean [P, K]".into(),
                expected: vec![p * m * k * k, p * k * k, p * k],
                got: vec![rows.k_cross.len(), rows.k_self.len(), rows.mean.len()],
            });
        }
        if let Some(i) = rows.k_cross.iter().chain(rows.k_self).chain(rows.mean).position(|v| !v.is_finite()) {
            return Err(Error::Data(format!("cross-class function-space Laplace rows: non-finite value at flat index {i} (k_cross, k_self, mean)")));
        }
        Ok(())
    }

    /// `Z = Uᵀ Fᵀ k*` for every row (eigen route). # Shapes `[M K, P K]`.
    fn project(&self, u: &Mat<f64>, rows: &KxkRows<'_>) -> Mat<f64> {
        let (n, k, p) = (self.m * self.k, self.k, rows.p);
        let mut z = Mat::<f64>::zeros(n, p * k);
        let mut q0 = 0;
        while q0 < p {
            let q1 = (q0 + BLOCK).min(p);
            let a = project_rows(&self.f, rows, self.m, k, q0, q1);
            matmul(z.as_mut().subcols_mut(q0 * k, (q1 - q0) * k), Accum::Replace, u.as_ref().transpose(), a.as_ref(), 1.0, par());
            q0 = q1;
        }
        z
    }

    /// `Σ*` at δ from the projections `z` (eigen route; module docs).
    fn covariances(&self, e: &[f64], rows: &KxkRows<'_>, z: &Mat<f64>, delta: f64) -> Result<FslPredictive> {
        let (k, p) = (self.k, rows.p);
        let mut cov = vec![0.0; p * k * k];
        self.covariances_block(e, rows, z.as_ref(), 0, delta, &mut cov);
        finish_cov(cov, rows, k, delta)
    }

    /// [`Self::covariances`] of the rows `q0..` whose projections are `z`'s columns, into `cov`
    /// (`[q1 − q0, K, K]`).
    fn covariances_block(&self, e: &[f64], rows: &KxkRows<'_>, z: faer::MatRef<'_, f64>, q0: usize, delta: f64, cov: &mut [f64]) {
        let (n, k) = (self.m * self.k, self.k);
        let w: Vec<f64> = e.iter().map(|e| 1.0 / (delta * (delta + e))).collect();
        cov.par_chunks_mut(k * k).enumerate().for_each(|(i, out)| {
            let q = q0 + i;
            for a in 0..k {
                let za = z.col(i * k + a);
                for b in 0..=a {
                    let zb = z.col(i * k + b);
                    let red: f64 = (0..n).map(|j| za[j] * zb[j] * w[j]).sum();
                    let prior = 0.5 * (rows.k_self[(q * k + a) * k + b] + rows.k_self[(q * k + b) * k + a]) / delta;
                    out[a * k + b] = prior - red;
                    out[b * k + a] = prior - red;
                }
            }
        });
    }

    /// The eigen route's predictive at δ, block of rows by block: each block's projections
    /// (the blocks of [`Self::project`], so the same numbers) are used and dropped, so that no
    /// `[M·K, P·K]` projection of every row is held beside the rows.
    fn predict_eigen(&self, e: &[f64], u: &Mat<f64>, rows: &KxkRows<'_>, delta: f64) -> Result<FslPredictive> {
        let (n, k, p) = (self.m * self.k, self.k, rows.p);
        let mut cov = vec![0.0; p * k * k];
        let mut q0 = 0;
        while q0 < p {
            let q1 = (q0 + BLOCK).min(p);
            let a = project_rows(&self.f, rows, self.m, k, q0, q1);
            let mut z = Mat::<f64>::zeros(n, (q1 - q0) * k);
            matmul(z.as_mut(), Accum::Replace, u.as_ref().transpose(), a.as_ref(), 1.0, par());
            self.covariances_block(e, rows, z.as_ref(), q0, delta, &mut cov[q0 * k * k..q1 * k * k]);
            q0 = q1;
        }
        finish_cov(cov, rows, k, delta)
    }

    /// `Σ*` at the Cholesky route's factored δ: `A = Fᵀ k*` and one triangular solve per block
    /// of rows.
    fn covariances_chol(&self, fac: &CholFactor, rows: &KxkRows<'_>) -> Result<FslPredictive> {
        let (k, p) = (self.k, rows.p);
        let mut cov = vec![0.0; p * k * k];
        let mut q0 = 0;
        while q0 < p {
            let q1 = (q0 + BLOCK).min(p);
            let mut a = project_rows(&self.f, rows, self.m, k, q0, q1);
            cholesky::covariances_block(fac, rows, &mut a, k, q0, &mut cov[q0 * k * k..q1 * k * k]);
            q0 = q1;
        }
        finish_cov(cov, rows, k, fac.delta)
    }

    /// The logit predictive at `rows` (module docs): mean = the rows' network logits, `Σ*` the
    /// `K × K` covariance per point at the fitted δ.
    ///
    /// Errors: shapes, non-finite rows; a variance below `−1e-8 ·` its prior (smaller negatives
    /// are clamped to 0 with their row and column, counted in [`FslPredictive::clamped`]).
    pub fn predict(&self, rows: &KxkRows<'_>) -> Result<FslPredictive> {
        self.check_rows(rows)?;
        match &self.factor {
            Factor::Eigen { e, u } => self.predict_eigen(e, u, rows, self.delta),
            Factor::Cholesky(fac) => self.covariances_chol(fac, rows),
        }
    }

    /// δ by a validation grid (laplace-torch's `optimize_prior_precision(method='gridsearch')`): `points` values of
    /// `logspace(min_log10, max_log10)`, each scored by the probit predictive's NLL at `rows`
    /// with `labels`; the best becomes the fit's δ (`prior = "grid"`). The eigen route scores
    /// every value from one projection; the Cholesky route factors once per value it visits,
    /// coarse to fine (every `⌈√points⌉`-th value, then a golden-section search between the best
    /// one's neighbours; `cholesky.rs`). Returns the visited `[(δ, NLL)]` in increasing δ.
    pub(crate) fn grid_search(&mut self, rows: &KxkRows<'_>, labels: &[usize], min_log10: f64, max_log10: f64, points: usize) -> Result<Vec<(f64, f64)>> {
        self.check_rows(rows)?;
        if labels.len() != rows.p || points < 2 || !(max_log10 > min_log10) {
            return Err(Error::Config(format!("grid search: {} labels for {} rows, {points} points in [{min_log10}, {max_log10}]", labels.len(), rows.p)));
        }
        let grid = |i: usize| 10f64.powf(min_log10 + (max_log10 - min_log10) * i as f64 / (points - 1) as f64);
        let k = self.k;
        let sweep: Vec<(f64, f64)> = match &mut self.factor {
            Factor::Eigen { e, u } => {
                let (e, u) = (std::mem::take(e), std::mem::replace(u, Mat::zeros(0, 0)));
                let z = self.project(&u, rows);
                let sweep = (0..points).map(|i| {
                    let pred = self.covariances(&e, rows, &z, grid(i))?;
                    Ok((grid(i), super::functional::nll(&pred.post.probit(1.0, 1.0), labels, k)))
                });
                let sweep = sweep.collect::<Result<Vec<_>>>();
                self.factor = Factor::Eigen { e, u };
                sweep?
            }
            Factor::Cholesky(_) => {
                let Factor::Cholesky(mut fac) = std::mem::replace(&mut self.factor, Factor::Eigen { e: Vec::new(), u: Mat::zeros(0, 0) }) else { unreachable!() };
                let stride = (points as f64).sqrt().ceil() as usize;
                let visited = cholesky::coarse_to_fine(points, stride, |i| {
                    fac.factor(grid(i))?;
                    let pred = self.covariances_chol(&fac, rows)?;
                    Ok(super::functional::nll(&pred.post.probit(1.0, 1.0), labels, k))
                });
                self.factor = Factor::Cholesky(fac);
                visited?.into_iter().map(|(i, v)| (grid(i), v)).collect()
            }
        };
        self.adopt_grid(&sweep)?;
        Ok(sweep)
    }

    /// Takes the δ of a grid search's sweep `[(δ, NLL)]` (the lowest finite NLL; `prior =
    /// "grid"`): [`Self::grid_search`]'s last step, and a study's resumption from a recorded
    /// sweep (one factorisation on the Cholesky route).
    ///
    /// Errors: no finite NLL in the sweep; a failed factorisation.
    pub(crate) fn adopt_grid(&mut self, sweep: &[(f64, f64)]) -> Result<()> {
        let best = sweep.iter().copied().filter(|v| v.1.is_finite()).min_by(|a, b| a.1.total_cmp(&b.1));
        match best {
            Some((d, _)) => self.set_delta(d, "grid"),
            None => Err(Error::Numerical("grid search: no prior precision gave a finite validation NLL".into())),
        }
    }

    /// Frees what only the δ searches need (the Cholesky route's packed `G`, `n (n + 1) / 2`
    /// values; nothing on the eigen route): predictions at the fitted δ are unchanged, another δ
    /// (a search, [`Self::log_evidence`] on the Cholesky route) is an error afterwards.
    pub(crate) fn release_search(&mut self) {
        if let Factor::Cholesky(fac) = &mut self.factor {
            fac.release_g();
        }
    }
}

/// Clamps variances within rounding below 0 (with their row and column) and counts them.
fn finish_cov(mut cov: Vec<f64>, rows: &KxkRows<'_>, k: usize, delta: f64) -> Result<FslPredictive> {
    let p = rows.p;
    let (mut clamped, mut min_var) = (0usize, f64::INFINITY);
    for q in 0..p {
        for c in 0..k {
            let v = cov[(q * k + c) * k + c];
            min_var = min_var.min(v);
            if v < 0.0 {
                let prior = rows.k_self[(q * k + c) * k + c] / delta;
                if v < -1e-8 * prior.abs().max(f64::MIN_POSITIVE) {
                    return Err(Error::Numerical(format!("cross-class function-space Laplace: row {q}, class {c}: posterior variance {v:e} is negative beyond rounding (prior {prior:e})")));
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

/// Wall seconds of the cross-class factorisations at one size ([`factor_timings`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FactorTimings {
    /// Size of the system, M·K.
    pub n: usize,
    /// Cholesky of `I + G/δ`: one δ (laplace-torch's `K/δ + diag(1/λ)` is a Cholesky of the
    /// same size).
    pub cholesky: f64,
    /// Eigendecomposition of `G` (every δ), when asked for.
    pub eig: Option<f64>,
    /// Eigenvalues of `G` alone (tridiagonalisation, no vectors), when asked for.
    pub eigenvalues: Option<f64>,
}

/// Times the two factorisations a cross-class fit can use at size `n` (the bench subcommand's
/// `--fsl-kxk`) on a random symmetric positive definite `G` (seeded; dense factorisations'
/// cost depends on the size, not the values): the Cholesky of `I + G` and, with `eig`, the
/// symmetric eigendecomposition of `G` (faer, all threads).
///
/// Errors: a factorisation that fails.
pub fn factor_timings(n: usize, seed: u64, eig: bool) -> Result<FactorTimings> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let upper: Vec<f64> = (0..n * (n + 1) / 2).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let at = |i: usize, j: usize| {
        let (a, b) = if i <= j { (i, j) } else { (j, i) };
        upper[b * (b + 1) / 2 + a]
    };
    let g = Mat::from_fn(n, n, |i, j| at(i, j) + if i == j { n as f64 } else { 0.0 });
    drop(upper);
    let t = Instant::now();
    Mat::from_fn(n, n, |i, j| g[(i, j)] + if i == j { 1.0 } else { 0.0 }).llt(Side::Lower).map_err(|e| Error::Numerical(format!("factor_timings: I + G is not positive definite: {e:?}")))?;
    let cholesky = t.elapsed().as_secs_f64();
    let (eig, eigenvalues) = if eig {
        let t = Instant::now();
        g.self_adjoint_eigenvalues(Side::Lower).map_err(|e| Error::Numerical(format!("factor_timings: eigenvalues failed: {e:?}")))?;
        let values = t.elapsed().as_secs_f64();
        let t = Instant::now();
        eig_sym(&g, "G")?;
        (Some(t.elapsed().as_secs_f64()), Some(values))
    } else {
        (None, None)
    };
    Ok(FactorTimings { n, cholesky, eig, eigenvalues })
}

/// Wall seconds of a whole cross-class fit by the Cholesky route ([`fit_timings`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FitTimings {
    /// Training points M (classes K = 10; the system is `10 M`).
    pub m: usize,
    /// The fit's numbers (δ, evidence, the pieces' seconds).
    pub numbers: KxkNumbers,
    /// The evidence's δ.
    pub delta: f64,
    /// The whole fit (the scatter, G, the search), seconds.
    pub fit: f64,
    /// Rows predicted, and the seconds they took (`Fᵀ k*`, the triangular solves, `Σ*`).
    pub rows: usize,
    /// Seconds of the predictive at `rows` rows.
    pub predict: f64,
}

/// Times a cross-class fit by the Cholesky route at `M` training points and 10 classes (the
/// bench subcommand's `--fsl-kxk-fit`) on a seeded random problem: features `φ [10 M, 64]`,
/// `K = φφᵀ + 10⁻³ I` (full rank, as the EPK's train Gram is), logits `f_0 + K α` (α random), the full
/// curvature, δ by the evidence, then the predictive at `rows` random rows of the same features.
/// Memory: the `[M, M, 10, 10]` Gram, `G` packed and one factor — `2.5 (10 M)²` values.
///
/// Errors: a factorisation that fails.
pub fn fit_timings(m: usize, rows: usize, seed: u64) -> Result<FitTimings> {
    use rand::{Rng, SeedableRng};
    let k = 10usize;
    let feat = 64usize;
    let n = m * k;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let phi: Vec<f64> = (0..(m + rows) * k * feat).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let dot = |a: usize, b: usize| (0..feat).map(|t| phi[a * feat + t] * phi[b * feat + t]).sum::<f64>();
    let mut kt = vec![0.0; n * n];
    kt.par_chunks_mut(m * k * k).enumerate().for_each(|(i, out)| {
        for j in 0..m {
            for c in 0..k {
                for c2 in 0..k {
                    out[(j * k + c) * k + c2] = dot(i * k + c, j * k + c2) + if i == j && c == c2 { 1e-3 } else { 0.0 };
                }
            }
        }
    });
    // Targets in the kernel's range, r = K α, as a trained network's nearly are.
    let alpha: Vec<f64> = (0..n).map(|_| rng.gen_range(-1e-3..1e-3)).collect();
    let bias: Vec<f64> = (0..n).map(|_| rng.gen_range(-0.1..0.1)).collect();
    let logits: Vec<f64> = (0..n).into_par_iter().map(|r| bias[r] + (0..n).map(|s| kt[((r / k * m + s / k) * k + r % k) * k + s % k] * alpha[s]).sum::<f64>()).collect();
    let labels: Vec<usize> = (0..m).map(|i| crate::data::argmax(&logits[i * k..(i + 1) * k])).collect();
    let train = KxkTrain { k_train: &kt, logits: &logits, bias: &bias, labels: &labels, m, k };
    let t = Instant::now();
    let fsl = CrossClassLaplace::fit_with(&train, Curvature::Full, Prior::Evidence, KxkSolver::Cholesky)?;
    let fit = t.elapsed().as_secs_f64();
    let mut kx = vec![0.0; rows * m * k * k];
    kx.par_chunks_mut(m * k * k).enumerate().for_each(|(q, out)| {
        for j in 0..m {
            for c in 0..k {
                for c2 in 0..k {
                    out[(j * k + c) * k + c2] = dot((m + q) * k + c, j * k + c2);
                }
            }
        }
    });
    let ks: Vec<f64> = (0..rows * k * k).map(|i| dot((m + i / (k * k)) * k + i / k % k, (m + i / (k * k)) * k + i % k)).collect();
    let mean: Vec<f64> = (0..rows * k).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let t = Instant::now();
    fsl.predict(&KxkRows { k_cross: &kx, k_self: &ks, mean: &mean, p: rows })?;
    let predict = t.elapsed().as_secs_f64();
    Ok(FitTimings { m, numbers: fsl.fit.kxk.clone().expect("a cross-class fit has its numbers"), delta: fsl.delta(), fit, rows, predict })
}

/// `G = Fᵀ K F` with `F` block-diagonal (`F_i` per point), symmetrised. # Shapes `[M K, M K]`.
fn form_g(kmat: &Mat<f64>, f: &[f64], m: usize, k: usize) -> Mat<f64> {
    let n = m * k;
    let kk = k * k;
    // KF[r, (j, b)] = Σ_c' K[r, (j, c')] F_j[c'][b].
    let mut kf = Mat::<f64>::zeros(n, n);
    kf.par_col_chunks_mut(k).enumerate().for_each(|(j, mut cols)| {
        let fj = &f[j * kk..(j + 1) * kk];
        for r in 0..n {
            for b in 0..k {
                let mut s = 0.0;
                for c in 0..k {
                    s += kmat[(r, j * k + c)] * fj[c * k + b];
                }
                cols[(r, b)] = s;
            }
        }
    });
    // G[(i, a), s] = Σ_c F_i[c][a] KF[(i, c), s].
    let mut g = Mat::<f64>::zeros(n, n);
    g.par_col_chunks_mut(1).enumerate().for_each(|(s, mut col)| {
        for i in 0..m {
            let fi = &f[i * kk..(i + 1) * kk];
            for a in 0..k {
                let mut v = 0.0;
                for c in 0..k {
                    v += fi[c * k + a] * kf[(i * k + c, s)];
                }
                col[(i * k + a, 0)] = v;
            }
        }
    });
    Mat::from_fn(n, n, |i, j| 0.5 * (g[(i, j)] + g[(j, i)]))
}

#[cfg(test)]
mod tests;
