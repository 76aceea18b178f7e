//! Last-layer Laplace approximation (as laplace-torch's `FullLLLaplace`, what
//! `Laplace(model, 'classification', subset_of_weights='last_layer', hessian_structure='full')`
//! builds (`laplace/lllaplace.py`), with `pred_type = "glm"`, `link_approx = "mc"`; checked
//! against it by `scripts/laplace_torch_check.py --check lastlayer`).
//!
//! The network's logits are `z(x) = α (W φ(x) + b) − [zero_output] α g_{w_0}(x)` with `φ` the
//! last hidden activations (MLP) or pooled feature maps (CNN). Only the final layer
//! `θ = (W [K, h], b [K])` is treated as random. Writing `ψ(x) = α [φ(x), 1]` (`q = h + 1`
//! features; `q = h` and no 1 without biases), the logits are linear in `θ` with Jacobian
//! `J(x) = I_K ⊗ ψ(x)ᵀ`. Parameter index `k·q + j` holds `W[k, j]` for `j < h` and `b[k]` for
//! `j = h` (class-blocked; laplace-torch's `parameters_to_vector` of the last `nn.Linear` is the
//! weight `[K, h]` row-major then `b`, a permutation of the same vector, which changes no
//! result).
//!
//! - **Hessian.** The exact generalised Gauss–Newton matrix of the summed cross-entropy at the
//!   trained `θ*`, `H = Σ_i J_iᵀ (diag(p_i) − p_i p_iᵀ) J_i`, i.e. block `(k, k′)` is
//!   `Σ_i p_{ik}(δ_{kk′} − p_{ik′}) ψ_i ψ_iᵀ` (for the last layer this is also the exact Hessian,
//!   as `z` is linear in `θ`).
//! - **Prior.** `θ ~ N(0, λ⁻¹ I)`; `λ` maximises the Laplace evidence
//!   `log p(D | θ*) − ½ λ ‖θ*‖² + (D/2) log λ − ½ log det(H + λ I)` (`D = K q`), evaluated in
//!   `O(D)` per `λ` from one symmetric eigendecomposition `H = U diag(e) Uᵀ` (faer): a grid over
//!   `log₁₀ λ`, then Newton steps in `log λ` safeguarded by bisection. The evidence is strictly
//!   concave in `log λ` when `θ* ≠ 0`, so the grid's best point brackets the maximum.
//! - **Predictive.** `Σ = (H + λ I)⁻¹`; at a point `x` the logits are `N(z(x), J Σ Jᵀ)` (a `K × K`
//!   covariance); the class probabilities are the Monte-Carlo mean of the softmax of seeded draws.

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par, Side};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::model::{conv, Architecture, Body, OutputKind, Params};

use crate::model::softmax_in_place;

fn par() -> Par {
    Par::rayon(0)
}

// ---------------------------------------------------------------------------------------------
// Last-layer features
// ---------------------------------------------------------------------------------------------

/// The last layer's inputs and the network's logits at a set of points.
#[derive(Clone, Debug, PartialEq)]
pub struct LastLayerFeatures {
    /// `ψ_i = α [φ_i, 1]` (the 1 only when the network has biases). # Shapes `[N, q]`.
    pub psi: Vec<f64>,
    /// The network's logits `z_i` (log-softmax of these is the network output). # Shapes `[N, K]`.
    pub logits: Vec<f64>,
    /// Points N.
    pub n: usize,
    /// Features per point q.
    pub q: usize,
    /// Classes K.
    pub k: usize,
}

/// A layer stack must end in a dense layer with a bias (the last layer of last-layer Laplace).
fn check_last_dense(arch: &Architecture) -> Result<()> {
    match &arch.body {
        Body::Layers { .. } if !arch.stack()?.ends_in_dense_with_bias() => {
            Err(Error::Config("last-layer Laplace needs a layer stack that ends in a dense layer with a bias".into()))
        }
        _ => Ok(()),
    }
}

/// Names of the final layer's weight and bias tensors.
fn last_layer_names(arch: &Architecture) -> (String, String) {
    match &arch.body {
        Body::Mlp { widths } => {
            let l = widths.len() - 2;
            (format!("layers.{l}.weight"), format!("layers.{l}.bias"))
        }
        Body::Cnn { .. } => ("dense.weight".into(), "dense.bias".into()),
        Body::Layers { .. } => {
            let p = arch.stack().expect("validated").last_prefix();
            (format!("{p}weight"), format!("{p}bias"))
        }
    }
}

/// `Y = act(X Wᵀ + b)` for a dense layer with weights `[no, ni]` (faer GEMM).
fn dense(x: &[f64], n: usize, ni: usize, w: &[f64], b: Option<&[f64]>, no: usize, act: Option<crate::model::Activation>) -> Vec<f64> {
    let xm = faer::MatRef::from_row_major_slice(x, n, ni);
    let wm = faer::MatRef::from_row_major_slice(w, no, ni);
    let mut y = Mat::<f64>::zeros(n, no);
    matmul(y.as_mut(), Accum::Replace, xm, wm.transpose(), 1.0, par());
    let mut out = vec![0.0; n * no];
    for i in 0..n {
        for o in 0..no {
            let v = y[(i, o)] + b.map_or(0.0, |b| b[o]);
            out[i * no + o] = act.map_or(v, |a| a.apply(v));
        }
    }
    out
}

/// The final layer's inputs `φ` at `x` (`[N, h]`).
fn penultimate(arch: &Architecture, params: &Params, x: &[f64], n: usize) -> Vec<f64> {
    match &arch.body {
        Body::Layers { .. } => arch.stack().expect("validated").forward_penultimate(&params.data, x),
        Body::Mlp { widths } => {
            let mut a = x.to_vec();
            for l in 0..widths.len() - 2 {
                let w = params.get(&format!("layers.{l}.weight")).expect("checked params");
                let b = if arch.bias { params.get(&format!("layers.{l}.bias")) } else { None };
                a = dense(&a, n, widths[l], w, b, widths[l + 1], Some(arch.activation));
            }
            a
        }
        Body::Cnn { image, channels, kernel, stride, padding, pool, .. } => {
            let g = arch.cnn_geometry().expect("validated");
            let cw = params.get("conv.weight").expect("checked params");
            let zero_b = vec![0.0; *channels];
            let cb = params.get("conv.bias").unwrap_or(&zero_b);
            let (c, _) = conv::conv2d_direct(x, [n, image[0], image[1], image[2]], cw, [*channels, image[0], *kernel, *kernel], cb, *stride, *padding);
            let c: Vec<f64> = c.into_iter().map(|v| arch.activation.apply(v)).collect();
            conv::max_pool2d_direct(&c, [n, *channels, g.ho, g.wo], *pool).0
        }
    }
}

/// The last layer's features `ψ = α [φ, 1]` and the network's logits at the rows of `x`.
/// `init` (the step-0 parameters) is needed when the architecture has `zero_output`.
///
/// Errors for a regression network (identity output), mismatched parameters or input width.
///
/// # Shapes
/// `x: [N, d]`; returns `psi: [N, q]`, `logits: [N, K]`.
pub(crate) fn last_layer_features(arch: &Architecture, params: &Params, init: Option<&Params>, x: &[f64]) -> Result<LastLayerFeatures> {
    if arch.output != OutputKind::LogSoftmax {
        return Err(Error::Config("last-layer Laplace needs a classification network (log-softmax output)".into()));
    }
    check_last_dense(arch)?;
    arch.check_params(params)?;
    let d = arch.input_dim();
    if x.len() % d != 0 {
        return Err(Error::ShapeMismatch { what: "input rows".into(), expected: vec![d], got: vec![x.len()] });
    }
    let n = x.len() / d;
    let k = arch.outputs();
    let phi = penultimate(arch, params, x, n);
    let h = phi.len().checked_div(n).unwrap_or(0);
    let (wn, bn) = last_layer_names(arch);
    let w = params.get(&wn).expect("checked params");
    let b = if arch.bias { params.get(&bn) } else { None };
    let mut logits = dense(&phi, n, h, w, b, k, None);
    let a = arch.alpha;
    logits.iter_mut().for_each(|v| *v *= a);
    if arch.zero_output {
        let init = init.ok_or_else(|| Error::Data("zero_output needs the initial parameters".into()))?;
        arch.check_params(init)?;
        let z0 = arch.raw_forward(init, x);
        for (v, o) in logits.iter_mut().zip(z0) {
            *v -= a * o;
        }
    }
    let q = h + usize::from(arch.bias);
    let mut psi = Vec::with_capacity(n * q);
    for i in 0..n {
        psi.extend(phi[i * h..(i + 1) * h].iter().map(|v| a * v));
        if arch.bias {
            psi.push(a);
        }
    }
    Ok(LastLayerFeatures { psi, logits, n, q, k })
}

/// The trained final layer as the class-blocked vector `θ` (`θ[k q + j] = W[k, j]`, `b[k]` at
/// `j = h`).
///
/// # Shapes
/// Returns `[K q]`.
pub(crate) fn last_layer_theta(arch: &Architecture, params: &Params) -> Result<Vec<f64>> {
    check_last_dense(arch)?;
    arch.check_params(params)?;
    let (wn, bn) = last_layer_names(arch);
    let w = params.get(&wn).expect("checked params");
    let k = arch.outputs();
    let h = w.len() / k;
    let b = if arch.bias { params.get(&bn) } else { None };
    let mut theta = Vec::with_capacity(k * (h + 1));
    for c in 0..k {
        theta.extend_from_slice(&w[c * h..(c + 1) * h]);
        if let Some(b) = b {
            theta.push(b[c]);
        }
    }
    Ok(theta)
}

// ---------------------------------------------------------------------------------------------
// The generalised Gauss–Newton matrix
// ---------------------------------------------------------------------------------------------

/// The GGN of the summed cross-entropy of a linear-softmax layer:
/// `H[(k, ·), (k′, ·)] = Σ_i p_{ik}(δ_{kk′} − p_{ik′}) ψ_i ψ_iᵀ`, one `q × q` block per class pair
/// (faer GEMMs `Ψᵀ diag(w) Ψ`), mirrored across the diagonal.
///
/// # Shapes
/// `psi: [N, q]`, `probs: [N, K]`; returns `[K q, K q]`.
pub(crate) fn ggn(psi: &[f64], probs: &[f64], n: usize, q: usize, k: usize) -> Mat<f64> {
    assert_eq!(psi.len(), n * q, "ggn: psi is not [N, q]");
    assert_eq!(probs.len(), n * k, "ggn: probs is not [N, K]");
    let d = k * q;
    let psim = faer::MatRef::from_row_major_slice(psi, n, q);
    let mut hm = Mat::<f64>::zeros(d, d);
    let mut scaled = Mat::<f64>::zeros(n, q);
    let mut block = Mat::<f64>::zeros(q, q);
    for a in 0..k {
        for b in a..k {
            for i in 0..n {
                let (pa, pb) = (probs[i * k + a], probs[i * k + b]);
                let w = if a == b { pa * (1.0 - pa) } else { -pa * pb };
                for j in 0..q {
                    scaled[(i, j)] = w * psi[i * q + j];
                }
            }
            matmul(block.as_mut(), Accum::Replace, psim.transpose(), scaled.as_ref(), 1.0, par());
            for r in 0..q {
                for c in 0..q {
                    // Symmetrise the diagonal blocks exactly.
                    let v = if a == b { 0.5 * (block[(r, c)] + block[(c, r)]) } else { block[(r, c)] };
                    hm[(a * q + r, b * q + c)] = v;
                    hm[(b * q + c, a * q + r)] = v;
                }
            }
        }
    }
    hm
}

// ---------------------------------------------------------------------------------------------
// The posterior
// ---------------------------------------------------------------------------------------------

/// How the prior precision λ is chosen.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LaplaceParams {
    /// A fixed λ; `None` (the default) maximises the marginal likelihood.
    pub prior_precision: Option<f64>,
    /// Smallest `log₁₀ λ` of the search grid (default −8).
    pub log10_min: f64,
    /// Largest `log₁₀ λ` of the search grid (default 8).
    pub log10_max: f64,
    /// Grid points, ends included (default 161, i.e. steps of 0.1 decades).
    pub grid_points: usize,
}

impl Default for LaplaceParams {
    fn default() -> Self {
        LaplaceParams { prior_precision: None, log10_min: -8.0, log10_max: 8.0, grid_points: 161 }
    }
}

impl LaplaceParams {
    /// The defaults: λ by marginal likelihood on `log₁₀ λ ∈ [−8, 8]`, 161 grid points.
    pub fn new() -> Self {
        Self::default()
    }
    /// A fixed prior precision instead of the marginal-likelihood search.
    pub fn prior_precision(mut self, lambda: f64) -> Self {
        self.prior_precision = Some(lambda);
        self
    }
    /// The search grid: `points` values of `log₁₀ λ` from `min` to `max`.
    pub fn grid(mut self, min: f64, max: f64, points: usize) -> Self {
        (self.log10_min, self.log10_max, self.grid_points) = (min, max, points);
        self
    }
    fn validate(&self) -> Result<()> {
        if let Some(l) = self.prior_precision {
            if !(l.is_finite() && l > 0.0) {
                return Err(Error::Config(format!("laplace prior_precision must be finite and > 0, got {l}")));
            }
        }
        if !(self.log10_min.is_finite() && self.log10_max.is_finite() && self.log10_min < self.log10_max && self.grid_points >= 3) {
            return Err(Error::Config(format!(
                "laplace grid needs finite log10_min < log10_max and at least 3 points, got [{}, {}] with {}",
                self.log10_min, self.log10_max, self.grid_points
            )));
        }
        Ok(())
    }
}

/// A fitted last-layer Laplace posterior `N(θ*, (H + λ I)⁻¹)` over a linear-softmax layer.
#[derive(Clone, Debug)]
pub struct LaplacePosterior {
    k: usize,
    q: usize,
    theta: Vec<f64>,
    hessian: Mat<f64>,
    eigvals: Vec<f64>,
    eigvecs: Mat<f64>,
    log_likelihood: f64,
    theta_sq: f64,
    prior_precision: f64,
    grid: Vec<[f64; 2]>,
    clamped: usize,
    most_negative: f64,
    covariance: Mat<f64>,
}

/// Relative size below which a negative eigenvalue of the (PSD by construction) GGN is taken as
/// rounding and set to 0.
const EIG_TOL: f64 = 1e-9;

impl LaplacePosterior {
    /// Fits the posterior from the training points' features and labels and the trained `θ*`
    /// (see the module docs). Errors: shapes, labels, non-finite values ([`Error::Data`]); a
    /// GGN with an eigenvalue below `−1e-9 · max eigenvalue` or a failed eigendecomposition, or
    /// a marginal-likelihood maximum at the edge of the grid ([`Error::Numerical`]).
    ///
    /// # Shapes
    /// `train.psi: [N, q]`, `train.logits: [N, K]`, `labels: [N]`, `theta: [K q]`.
    pub fn fit(train: &LastLayerFeatures, labels: &[usize], theta: &[f64], params: &LaplaceParams) -> Result<Self> {
        params.validate()?;
        let (n, q, k) = (train.n, train.q, train.k);
        check_features(train)?;
        if labels.len() != n {
            return Err(Error::ShapeMismatch { what: "laplace: labels vs training points".into(), expected: vec![n], got: vec![labels.len()] });
        }
        if let Some(i) = labels.iter().position(|&y| y >= k) {
            return Err(Error::Data(format!("laplace: label {i} is {}, not < K = {k}", labels[i])));
        }
        let d = k * q;
        if theta.len() != d {
            return Err(Error::ShapeMismatch { what: "laplace: theta [K q]".into(), expected: vec![d], got: vec![theta.len()] });
        }
        if let Some(i) = theta.iter().position(|v| !v.is_finite()) {
            return Err(Error::Data(format!("laplace: non-finite parameter theta[{i}]")));
        }
        let mut probs = train.logits.clone();
        let mut log_likelihood = 0.0;
        for (row, &y) in probs.chunks_exact_mut(k).zip(labels) {
            let m = row[crate::data::argmax(row)];
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            log_likelihood += row[y] - lse;
            softmax_in_place(row);
        }
        let hessian = ggn(&train.psi, &probs, n, q, k);
        let evd = hessian
            .self_adjoint_eigen(Side::Lower)
            .map_err(|e| Error::Numerical(format!("laplace: eigendecomposition of the GGN failed: {e:?}")))?;
        let raw: Vec<f64> = evd.S().column_vector().iter().copied().collect();
        if let Some(i) = raw.iter().position(|v| !v.is_finite()) {
            return Err(Error::Numerical(format!("laplace: GGN eigenvalue {i} is {}", raw[i])));
        }
        let top = raw.iter().copied().fold(0.0f64, |a, b| a.max(b.abs()));
        let most_negative = raw.iter().copied().fold(0.0f64, f64::min);
        if most_negative < -EIG_TOL * top {
            return Err(Error::Numerical(format!(
                "laplace: the GGN has eigenvalue {most_negative:e} against a largest of {top:e}; it should be positive semi-definite"
            )));
        }
        let clamped = raw.iter().filter(|&&v| v < 0.0).count();
        let eigvals: Vec<f64> = raw.iter().map(|&v| v.max(0.0)).collect();
        let eigvecs = evd.U().to_owned();
        let theta_sq = theta.iter().map(|v| v * v).sum();
        let mut post = LaplacePosterior {
            k,
            q,
            theta: theta.to_vec(),
            hessian,
            eigvals,
            eigvecs,
            log_likelihood,
            theta_sq,
            prior_precision: f64::NAN,
            grid: Vec::new(),
            clamped,
            most_negative,
            covariance: Mat::zeros(0, 0),
        };
        post.prior_precision = match params.prior_precision {
            Some(l) => l,
            None => post.maximise_evidence(params)?,
        };
        post.covariance = post.covariance_at(post.prior_precision);
        Ok(post)
    }

    /// `log p(D | θ*) − ½ λ ‖θ*‖² + (D/2) log λ − ½ log det(H + λ I)`, `O(D)` from the
    /// eigenvalues (negative rounding eigenvalues count as 0).
    pub fn log_marginal_likelihood(&self, lambda: f64) -> f64 {
        let d = self.eigvals.len() as f64;
        let logdet: f64 = self.eigvals.iter().map(|e| (e + lambda).ln()).sum();
        self.log_likelihood - 0.5 * lambda * self.theta_sq + 0.5 * d * lambda.ln() - 0.5 * logdet
    }

    /// First and second derivatives of the evidence in `t = ln λ`.
    fn evidence_derivatives(&self, t: f64) -> (f64, f64) {
        let l = t.exp();
        let d = self.eigvals.len() as f64;
        let (mut s1, mut s2) = (0.0, 0.0);
        for &e in &self.eigvals {
            let r = l / (e + l);
            s1 += r;
            s2 += r * e / (e + l);
        }
        (-0.5 * l * self.theta_sq + 0.5 * d - 0.5 * s1, -0.5 * l * self.theta_sq - 0.5 * s2)
    }

    fn maximise_evidence(&mut self, params: &LaplaceParams) -> Result<f64> {
        let m = params.grid_points;
        let step = (params.log10_max - params.log10_min) / (m - 1) as f64;
        self.grid = (0..m)
            .map(|i| {
                let t10 = if i == m - 1 { params.log10_max } else { params.log10_min + i as f64 * step };
                [t10, self.log_marginal_likelihood(10f64.powf(t10))]
            })
            .collect();
        if let Some(g) = self.grid.iter().find(|g| !g[1].is_finite()) {
            return Err(Error::Numerical(format!("laplace: marginal likelihood {} at log10 λ = {}", g[1], g[0])));
        }
        let best = (0..m).max_by(|&a, &b| self.grid[a][1].total_cmp(&self.grid[b][1])).expect("m >= 3");
        if best == 0 || best == m - 1 {
            return Err(Error::Numerical(format!(
                "laplace: the marginal likelihood is largest at the edge of the grid, log10 λ = {} (‖θ*‖² = {:e}); widen the grid or fix the prior precision",
                self.grid[best][0], self.theta_sq
            )));
        }
        let ln10 = std::f64::consts::LN_10;
        let (mut lo, mut hi) = (self.grid[best - 1][0] * ln10, self.grid[best + 1][0] * ln10);
        let mut t = self.grid[best][0] * ln10;
        for _ in 0..200 {
            let (g, h) = self.evidence_derivatives(t);
            if g == 0.0 {
                break;
            }
            if g > 0.0 {
                lo = lo.max(t);
            } else {
                hi = hi.min(t);
            }
            let newton = t - g / h;
            let next = if newton > lo && newton < hi && newton.is_finite() { newton } else { 0.5 * (lo + hi) };
            let done = (next - t).abs() <= 1e-14 * (1.0 + t.abs()) || hi - lo <= 1e-14 * (1.0 + t.abs());
            t = next;
            if done {
                break;
            }
        }
        Ok(t.exp())
    }

    /// `Σ = (H + λ I)⁻¹ = U diag(1/(e + λ)) Uᵀ`.
    fn covariance_at(&self, lambda: f64) -> Mat<f64> {
        let d = self.eigvals.len();
        let v = Mat::from_fn(d, d, |i, j| self.eigvecs[(i, j)] / (self.eigvals[j] + lambda).sqrt());
        let mut s = Mat::<f64>::zeros(d, d);
        matmul(s.as_mut(), Accum::Replace, v.as_ref(), v.as_ref().transpose(), 1.0, par());
        for i in 0..d {
            for j in 0..i {
                let a = 0.5 * (s[(i, j)] + s[(j, i)]);
                s[(i, j)] = a;
                s[(j, i)] = a;
            }
        }
        s
    }

    /// The posterior over the logits at new points: mean `z(x)` and covariance `J Σ Jᵀ`, block
    /// `(k, k′)` of `Σ` contracted with `ψ(x)` on both sides (faer GEMMs `Ψ Σ_{kk′}`).
    ///
    /// # Shapes
    /// `at.psi: [P, q]`, `at.logits: [P, K]`; returns mean `[P, K]`, covariance `[P, K, K]`.
    pub fn predict(&self, at: &LastLayerFeatures) -> Result<LogitPosterior> {
        check_features(at)?;
        if at.q != self.q || at.k != self.k {
            return Err(Error::ShapeMismatch { what: "laplace predict: features [q] and classes [K]".into(), expected: vec![self.q, self.k], got: vec![at.q, at.k] });
        }
        let (p, q, k) = (at.n, self.q, self.k);
        let psim = faer::MatRef::from_row_major_slice(&at.psi, p, q);
        let mut cov = vec![0.0; p * k * k];
        let mut m = Mat::<f64>::zeros(p, q);
        for a in 0..k {
            for b in a..k {
                let block = self.covariance.as_ref().submatrix(a * q, b * q, q, q);
                matmul(m.as_mut(), Accum::Replace, psim, block, 1.0, par());
                for i in 0..p {
                    let mut s = 0.0;
                    for j in 0..q {
                        s += m[(i, j)] * at.psi[i * q + j];
                    }
                    cov[(i * k + a) * k + b] = s;
                    cov[(i * k + b) * k + a] = s;
                }
            }
        }
        Ok(LogitPosterior { mean: at.logits.clone(), cov, p, k })
    }

    /// The chosen prior precision λ.
    pub fn prior_precision(&self) -> f64 {
        self.prior_precision
    }
    /// `log p(D | θ*) = −Σ_i CE_i` at the trained parameters.
    pub(crate) fn log_likelihood(&self) -> f64 {
        self.log_likelihood
    }
    /// The marginal likelihood at the chosen λ.
    pub fn evidence(&self) -> f64 {
        self.log_marginal_likelihood(self.prior_precision)
    }
    /// The search grid `[log₁₀ λ, evidence]` (empty for a fixed λ).
    pub fn grid(&self) -> &[[f64; 2]] {
        &self.grid
    }
    /// The GGN `H` (`[D, D]`, class-blocked order).
    pub fn hessian(&self) -> faer::MatRef<'_, f64> {
        self.hessian.as_ref()
    }
    /// The posterior covariance `Σ = (H + λ I)⁻¹` (`[D, D]`).
    pub fn covariance(&self) -> faer::MatRef<'_, f64> {
        self.covariance.as_ref()
    }
    /// How many eigenvalues were negative (rounding) and set to 0, and the most negative one.
    pub(crate) fn clamped_eigenvalues(&self) -> (usize, f64) {
        (self.clamped, self.most_negative)
    }
    /// `θ*` (class-blocked, `[K q]`).
    pub fn theta(&self) -> &[f64] {
        &self.theta
    }
    /// Number of parameters `D = K q`.
    pub fn num_params(&self) -> usize {
        self.k * self.q
    }
    /// Features per class `q` (the final layer's inputs, plus 1 with biases).
    pub fn features(&self) -> usize {
        self.q
    }
    /// Classes `K`.
    pub fn classes(&self) -> usize {
        self.k
    }
    /// The posterior precision `H + λ I` (class-blocked order), as laplace-torch's
    /// `posterior_precision` in its own parameter order (see the module docs).
    ///
    /// # Shapes
    /// Returns `[D, D]`.
    pub fn precision(&self) -> Mat<f64> {
        let d = self.num_params();
        Mat::from_fn(d, d, |i, j| self.hessian[(i, j)] + if i == j { self.prior_precision } else { 0.0 })
    }
}

/// A `faer` matrix as a row-major vector.
fn row_major(m: faer::MatRef<'_, f64>) -> Vec<f64> {
    (0..m.nrows()).flat_map(|i| (0..m.ncols()).map(move |j| m[(i, j)])).collect()
}

fn check_features(f: &LastLayerFeatures) -> Result<()> {
    if f.k == 0 || f.q == 0 || f.psi.len() != f.n * f.q || f.logits.len() != f.n * f.k {
        return Err(Error::ShapeMismatch {
            what: "last-layer features psi [N, q], logits [N, K]".into(),
            expected: vec![f.n * f.q, f.n * f.k],
            got: vec![f.psi.len(), f.logits.len()],
        });
    }
    if let Some(i) = f.psi.iter().chain(&f.logits).position(|v| !v.is_finite()) {
        return Err(Error::Data(format!("last-layer features: non-finite value at flat index {i} (psi then logits)")));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Logit posterior and Monte-Carlo predictive
// ---------------------------------------------------------------------------------------------

/// A Gaussian posterior over the logits at `P` points, with a full `K × K` covariance per point.
#[derive(Clone, Debug, PartialEq)]
pub struct LogitPosterior {
    /// Means `z(x)`. # Shapes `[P, K]`.
    pub mean: Vec<f64>,
    /// Covariances `J Σ Jᵀ`. # Shapes `[P, K, K]`.
    pub cov: Vec<f64>,
    /// Points P.
    pub p: usize,
    /// Classes K.
    pub k: usize,
}

/// Lower Cholesky factor of a symmetric positive semi-definite `K × K` matrix; pivots at or below
/// `1e-13 ·` the largest diagonal entry are taken as 0 (their column set to 0), more negative
/// than `−1e-9 ·` it are an error.
fn psd_cholesky(c: &[f64], k: usize) -> Result<Vec<f64>> {
    let scale = (0..k).map(|i| c[i * k + i]).fold(0.0f64, f64::max);
    let mut l = vec![0.0; k * k];
    for j in 0..k {
        let d = c[j * k + j] - (0..j).map(|m| l[j * k + m] * l[j * k + m]).sum::<f64>();
        if d < -1e-9 * scale || d.is_nan() {
            return Err(Error::Numerical(format!("logit covariance not positive semi-definite (pivot {j} = {d:e})")));
        }
        if d <= 1e-13 * scale {
            continue;
        }
        let ljj = d.sqrt();
        l[j * k + j] = ljj;
        for i in j + 1..k {
            let s = c[i * k + j] - (0..j).map(|m| l[i * k + m] * l[j * k + m]).sum::<f64>();
            l[i * k + j] = s / ljj;
        }
    }
    Ok(l)
}

impl LogitPosterior {
    /// Per-class logit variances (the covariance diagonals). # Shapes `[P, K]`.
    pub fn variance(&self) -> Vec<f64> {
        (0..self.p).flat_map(|i| (0..self.k).map(move |c| (i, c))).map(|(i, c)| self.cov[(i * self.k + c) * self.k + c]).collect()
    }

    /// The OOD score `Σ_k Var(z_k)` (trace of the logit covariance; larger = more OOD).
    /// # Shapes `[P]`.
    pub(crate) fn total_variance(&self) -> Vec<f64> {
        (0..self.p).map(|i| (0..self.k).map(|c| self.cov[(i * self.k + c) * self.k + c]).sum()).collect()
    }

    /// Monte-Carlo predictive `E[softmax(z)]`, `z ~ N(mean_p, cov_p)`, from `samples` draws per
    /// point: `z = mean + L ξ` with `L` the lower Cholesky factor of `cov_p` and `ξ` `K` standard
    /// normals drawn in class order from `ChaCha8Rng::seed_from_u64(seed)` on stream `p`
    /// (`set_stream(p)`), the convention of [`crate::gp::mc_softmax`]. Deterministic for a seed,
    /// independent of thread count; points run in parallel.
    ///
    /// # Shapes
    /// Returns `[P, K]`.
    pub fn mc_softmax(&self, samples: usize, seed: u64) -> Result<Vec<f64>> {
        let (p, k) = (self.p, self.k);
        if samples == 0 {
            return Err(Error::Config("mc_softmax needs samples >= 1".into()));
        }
        if self.mean.len() != p * k || self.cov.len() != p * k * k || k == 0 {
            return Err(Error::ShapeMismatch { what: "logit posterior mean [P, K], cov [P, K, K]".into(), expected: vec![p * k, p * k * k], got: vec![self.mean.len(), self.cov.len()] });
        }
        if let Some(i) = self.mean.iter().chain(&self.cov).position(|v| !v.is_finite()) {
            return Err(Error::Data(format!("logit posterior: non-finite value at flat index {i} (mean then cov)")));
        }
        let rows: Vec<Result<Vec<f64>>> = (0..p)
            .into_par_iter()
            .map(|i| {
                let l = psd_cholesky(&self.cov[i * k * k..(i + 1) * k * k], k)?;
                let mu = &self.mean[i * k..(i + 1) * k];
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(i as u64);
                let mut xi = vec![0.0; k];
                let mut z = vec![0.0; k];
                let mut acc = vec![0.0; k];
                for _ in 0..samples {
                    for v in xi.iter_mut() {
                        *v = StandardNormal.sample(&mut rng);
                    }
                    for r in 0..k {
                        let mut s = mu[r];
                        for c in 0..=r {
                            s += l[r * k + c] * xi[c];
                        }
                        z[r] = s;
                    }
                    softmax_in_place(&mut z);
                    for (a, v) in acc.iter_mut().zip(&z) {
                        *a += v;
                    }
                }
                Ok(acc.into_iter().map(|a| a / samples as f64).collect())
            })
            .collect();
        let mut out = Vec::with_capacity(p * k);
        for r in rows {
            out.extend(r?);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// The network-level front door
// ---------------------------------------------------------------------------------------------

/// A last-layer Laplace approximation of a trained classification network.
#[derive(Clone, Debug)]
pub struct LastLayerLaplace {
    arch: Architecture,
    params: Params,
    init: Option<Params>,
    posterior: LaplacePosterior,
}

impl LastLayerLaplace {
    /// Fits the posterior of the final layer of the network `params` (`init`: the step-0
    /// parameters, needed with `zero_output`) on the training set `x_train`, `labels`.
    ///
    /// # Shapes
    /// `x_train: [N, d]`, `labels: [N]`.
    pub fn fit(arch: &Architecture, params: &Params, init: Option<&Params>, x_train: &[f64], labels: &[usize], lp: &LaplaceParams) -> Result<Self> {
        let feats = last_layer_features(arch, params, init, x_train)?;
        let theta = last_layer_theta(arch, params)?;
        let posterior = LaplacePosterior::fit(&feats, labels, &theta, lp)?;
        Ok(LastLayerLaplace { arch: arch.clone(), params: params.clone(), init: init.cloned(), posterior })
    }

    /// The logit posterior at the rows of `x`.
    ///
    /// # Shapes
    /// `x: [P, d]`; returns mean `[P, K]`, covariance `[P, K, K]`.
    pub fn predict(&self, x: &[f64]) -> Result<LogitPosterior> {
        let f = last_layer_features(&self.arch, &self.params, self.init.as_ref(), x)?;
        self.posterior.predict(&f)
    }

    /// The fitted posterior (λ, evidence, H, Σ).
    pub fn posterior(&self) -> &LaplacePosterior {
        &self.posterior
    }

    /// Writes the posterior and the logit posterior at the rows of `x` as one safetensors file
    /// (f64, written atomically) and returns that logit posterior. Arrays, parameters in the
    /// class-blocked order of the module docs (`θ[k q + j] = W[k, j]`, `b[k]` at `j = h`):
    /// `precision` `H + λ I` `[D, D]`, `hessian` `H` `[D, D]`, `covariance` `(H + λ I)⁻¹`
    /// `[D, D]`, `theta` `θ*` `[D]`, `points` `x` `[P, d]`, `mean` the logits `[P, K]`, `cov`
    /// `J Σ Jᵀ` `[P, K, K]`, `variance` its diagonals `[P, K]`. Metadata: `format`
    /// (`pathkernel-lastlayer-laplace`), `prior_precision`, `classes`, `features` (q),
    /// `hidden` (h), `bias`, `alpha`, `order`, and the caller's `metadata`.
    ///
    /// # Shapes
    /// `x: [P, d]`; returns mean `[P, K]`, covariance `[P, K, K]`.
    pub fn save(&self, path: &std::path::Path, x: &[f64], metadata: std::collections::HashMap<String, String>) -> Result<LogitPosterior> {
        let pred = self.predict(x)?;
        let post = &self.posterior;
        let (d, q, k, p) = (post.num_params(), post.q, post.k, pred.p);
        let h = q - usize::from(self.arch.bias);
        let dim = self.arch.input_dim();
        use crate::io::NamedArray;
        let arrays = vec![
            NamedArray::f64("precision", vec![d, d], row_major(post.precision().as_ref())),
            NamedArray::f64("hessian", vec![d, d], row_major(post.hessian())),
            NamedArray::f64("covariance", vec![d, d], row_major(post.covariance())),
            NamedArray::f64("theta", vec![d], post.theta.clone()),
            NamedArray::f64("points", vec![p, dim], x.to_vec()),
            NamedArray::f64("mean", vec![p, k], pred.mean.clone()),
            NamedArray::f64("cov", vec![p, k, k], pred.cov.clone()),
            NamedArray::f64("variance", vec![p, k], pred.variance()),
        ];
        let mut meta = metadata;
        for (key, v) in [
            ("format", "pathkernel-lastlayer-laplace".to_string()),
            ("prior_precision", post.prior_precision.to_string()),
            ("classes", k.to_string()),
            ("features", q.to_string()),
            ("hidden", h.to_string()),
            ("bias", self.arch.bias.to_string()),
            ("alpha", self.arch.alpha.to_string()),
            ("order", format!("class-blocked: index k*{q} + j holds W[k, j] for j < {h} and b[k] for j = {h} (the stored W, b; the logits' Jacobian rows are alpha*[phi, 1])")),
        ] {
            meta.insert(key.to_string(), v);
        }
        crate::io::write_safetensors(path, &arrays, Some(meta))?;
        Ok(pred)
    }
}

#[cfg(test)]
mod tests;
