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
mod tests {
    use super::*;
    use crate::model::{Activation, ModelConfig};
    use nalgebra::DMatrix;
    use rand::{Rng, SeedableRng};

    /// A small random problem: N points, q features (last one the bias 1, scaled by α), K classes.
    fn problem(n: usize, h: usize, k: usize, seed: u64) -> (LastLayerFeatures, Vec<usize>, Vec<f64>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let alpha = 1.3;
        let q = h + 1;
        let mut psi = Vec::new();
        for _ in 0..n {
            for _ in 0..h {
                // ReLU-like: some exact zeros.
                let v: f64 = rng.gen_range(-1.0..2.0);
                psi.push(alpha * v.max(0.0));
            }
            psi.push(alpha);
        }
        let theta: Vec<f64> = (0..k * q).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let logits = logits_of(&psi, &theta, n, q, k);
        let labels = (0..n).map(|_| rng.gen_range(0..k)).collect();
        (LastLayerFeatures { psi, logits, n, q, k }, labels, theta)
    }

    fn logits_of(psi: &[f64], theta: &[f64], n: usize, q: usize, k: usize) -> Vec<f64> {
        let mut z = vec![0.0; n * k];
        for i in 0..n {
            for c in 0..k {
                z[i * k + c] = (0..q).map(|j| theta[c * q + j] * psi[i * q + j]).sum();
            }
        }
        z
    }

    fn softmax(z: &[f64]) -> Vec<f64> {
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    /// Summed cross-entropy and its gradient `Σ_i (p_i − e_{y_i}) ⊗ ψ_i`.
    fn loss_and_grad(f: &LastLayerFeatures, labels: &[usize], theta: &[f64]) -> (f64, Vec<f64>) {
        let (n, q, k) = (f.n, f.q, f.k);
        let z = logits_of(&f.psi, theta, n, q, k);
        let mut loss = 0.0;
        let mut g = vec![0.0; k * q];
        for i in 0..n {
            let p = softmax(&z[i * k..(i + 1) * k]);
            loss -= p[labels[i]].ln();
            for c in 0..k {
                let r = p[c] - if c == labels[i] { 1.0 } else { 0.0 };
                for j in 0..q {
                    g[c * q + j] += r * f.psi[i * q + j];
                }
            }
        }
        (loss, g)
    }

    fn to_na(m: faer::MatRef<'_, f64>) -> DMatrix<f64> {
        DMatrix::from_fn(m.nrows(), m.ncols(), |i, j| m[(i, j)])
    }

    #[test]
    fn ggn_against_loops_and_finite_differences() {
        let (f, labels, theta) = problem(9, 3, 3, 1);
        let (n, q, k) = (f.n, f.q, f.k);
        let d = k * q;
        let probs: Vec<f64> = f.logits.chunks(k).flat_map(softmax).collect();
        let h = ggn(&f.psi, &probs, n, q, k);
        // Explicit loops over (i, k, k', j, j').
        let mut want = vec![0.0; d * d];
        for i in 0..n {
            for a in 0..k {
                for b in 0..k {
                    let lam = probs[i * k + a] * (if a == b { 1.0 } else { 0.0 } - probs[i * k + b]);
                    for j in 0..q {
                        for jj in 0..q {
                            want[(a * q + j) * d + b * q + jj] += lam * f.psi[i * q + j] * f.psi[i * q + jj];
                        }
                    }
                }
            }
        }
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for r in 0..d {
            for c in 0..d {
                assert!((h[(r, c)] - want[r * d + c]).abs() < 1e-13 * scale, "({r}, {c})");
                assert_eq!(h[(r, c)], h[(c, r)]);
            }
        }
        // The gradient against finite differences of the loss, then H against finite
        // differences of the gradient (z is linear in θ, so the GGN is the exact Hessian).
        let eps = 1e-5;
        let (_, g0) = loss_and_grad(&f, &labels, &theta);
        for a in 0..d {
            let mut tp = theta.clone();
            let mut tm = theta.clone();
            tp[a] += eps;
            tm[a] -= eps;
            let (lp, gp) = loss_and_grad(&f, &labels, &tp);
            let (lm, gm) = loss_and_grad(&f, &labels, &tm);
            assert!(((lp - lm) / (2.0 * eps) - g0[a]).abs() < 1e-8, "gradient {a}");
            for r in 0..d {
                let fd = (gp[r] - gm[r]) / (2.0 * eps);
                assert!((fd - h[(r, a)]).abs() < 1e-8, "H[{r}, {a}]: fd {fd} vs {}", h[(r, a)]);
            }
        }
    }

    #[test]
    fn evidence_matches_direct_determinant_and_is_maximised() {
        let (f, labels, theta) = problem(40, 4, 3, 2);
        let post = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new()).unwrap();
        let d = post.num_params();
        let h = to_na(post.hessian());
        let (loss, _) = loss_and_grad(&f, &labels, &theta);
        assert!((post.log_likelihood() + loss).abs() < 1e-12 * loss);
        let s: f64 = theta.iter().map(|v| v * v).sum();
        let direct = |lam: f64| {
            let a = &h + DMatrix::identity(d, d) * lam;
            let l = a.cholesky().expect("H + λI is positive definite");
            let logdet = 2.0 * l.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
            -loss - 0.5 * lam * s + 0.5 * d as f64 * lam.ln() - 0.5 * logdet
        };
        for lam in [1e-3, 0.1, 1.0, 7.5, 100.0] {
            let (a, b) = (post.log_marginal_likelihood(lam), direct(lam));
            assert!((a - b).abs() < 1e-9 * b.abs().max(1.0), "λ = {lam}: {a} vs {b}");
        }
        let lam = post.prior_precision();
        assert!(lam > 1e-8 && lam < 1e8);
        let best = direct(lam);
        for r in [0.999, 1.001, 0.9, 1.1, 0.5, 2.0] {
            assert!(direct(lam * r) <= best + 1e-12 * best.abs(), "λ·{r} beats λ = {lam}");
        }
        // The derivative in log λ vanishes at the optimum (central differences of the direct form).
        let t = lam.ln();
        let dd = (direct((t + 1e-4).exp()) - direct((t - 1e-4).exp())) / 2e-4;
        assert!(dd.abs() < 1e-6, "d evidence / d log λ = {dd}");
        assert_eq!(post.grid().len(), 161);
        assert!(post.grid().iter().all(|g| g[1] <= post.evidence() + 1e-9));
        // A fixed λ is used as given.
        let fixed = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().prior_precision(3.0)).unwrap();
        assert_eq!(fixed.prior_precision(), 3.0);
        assert!(fixed.grid().is_empty());
    }

    #[test]
    fn predictive_covariance_against_explicit_products() {
        let (f, labels, theta) = problem(30, 3, 4, 3);
        let post = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new()).unwrap();
        let (q, k) = (f.q, f.k);
        let d = k * q;
        let lam = post.prior_precision();
        let sigma = (to_na(post.hessian()) + DMatrix::identity(d, d) * lam).try_inverse().unwrap();
        let sig_fast = to_na(post.covariance());
        assert!((&sigma - &sig_fast).abs().max() < 1e-10 * sigma.abs().max());
        let (test, _, _) = problem(6, 3, 4, 4);
        let test = LastLayerFeatures { logits: logits_of(&test.psi, &theta, 6, q, k), ..test };
        let lp = post.predict(&test).unwrap();
        assert_eq!(lp.mean, test.logits);
        for p in 0..6 {
            // J = I_K ⊗ ψᵀ, K × D.
            let j = DMatrix::from_fn(k, d, |r, c| if c / q == r { test.psi[p * q + c % q] } else { 0.0 });
            let c = &j * &sigma * j.transpose();
            for a in 0..k {
                for b in 0..k {
                    let got = lp.cov[(p * k + a) * k + b];
                    assert!((got - c[(a, b)]).abs() < 1e-10 * c.abs().max(), "point {p} ({a}, {b})");
                }
            }
            let var = lp.variance();
            assert_eq!(var[p * k + 1], lp.cov[(p * k + 1) * k + 1]);
            let tv = lp.total_variance()[p];
            assert!((tv - c.trace()).abs() < 1e-10 * tv);
        }
    }

    #[test]
    fn mc_softmax_against_an_independent_sampler() {
        let (f, labels, theta) = problem(30, 3, 3, 5);
        let post = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new()).unwrap();
        let lp = post.predict(&f).unwrap();
        let k = lp.k;
        let probs = lp.mc_softmax(500, 9).unwrap();
        assert_eq!(probs, lp.mc_softmax(500, 9).unwrap());
        assert_ne!(probs, lp.mc_softmax(500, 10).unwrap());
        for p in [0, 7, 29] {
            let c = DMatrix::from_fn(k, k, |a, b| lp.cov[(p * k + a) * k + b]);
            let l = c.cholesky().unwrap().l();
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            rng.set_stream(p as u64);
            let mut acc = vec![0.0; k];
            for _ in 0..500 {
                let xi = nalgebra::DVector::from_fn(k, |_, _| StandardNormal.sample(&mut rng));
                let z = &l * xi;
                let s = softmax(&(0..k).map(|a| lp.mean[p * k + a] + z[a]).collect::<Vec<_>>());
                acc.iter_mut().zip(&s).for_each(|(a, v)| *a += v / 500.0);
            }
            for a in 0..k {
                assert!((probs[p * k + a] - acc[a]).abs() < 1e-12, "point {p} class {a}");
            }
        }
        // No posterior spread: the softmax of the mean.
        let flat = LogitPosterior { cov: vec![0.0; lp.cov.len()], ..lp.clone() };
        let p0 = flat.mc_softmax(3, 0).unwrap();
        for (a, b) in p0.iter().zip(lp.mean.chunks(k).flat_map(softmax)) {
            assert!((a - b).abs() < 1e-15);
        }
        // A strong prior shrinks the spread: the predictive approaches the MAP softmax.
        let tight = LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().prior_precision(1e9)).unwrap();
        let pt = tight.predict(&f).unwrap().mc_softmax(200, 1).unwrap();
        for (a, b) in pt.iter().zip(lp.mean.chunks(k).flat_map(softmax)) {
            assert!((a - b).abs() < 1e-3);
        }
        let mut bad = lp.clone();
        bad.cov[0] = f64::NAN;
        assert!(bad.mc_softmax(10, 0).is_err());
        assert!(lp.mc_softmax(0, 0).is_err());
    }

    #[test]
    fn fit_errors() {
        let (f, labels, theta) = problem(10, 2, 3, 6);
        assert!(LaplacePosterior::fit(&f, &labels[..9], &theta, &LaplaceParams::new()).is_err());
        assert!(LaplacePosterior::fit(&f, &labels, &theta[1..], &LaplaceParams::new()).is_err());
        let mut bad = labels.clone();
        bad[0] = 3;
        assert!(LaplacePosterior::fit(&f, &bad, &theta, &LaplaceParams::new()).is_err());
        let mut g = f.clone();
        g.psi[3] = f64::NAN;
        assert!(LaplacePosterior::fit(&g, &labels, &theta, &LaplaceParams::new()).unwrap_err().to_string().contains("non-finite"));
        assert!(LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().prior_precision(-1.0)).is_err());
        assert!(LaplacePosterior::fit(&f, &labels, &theta, &LaplaceParams::new().grid(1.0, 0.0, 10)).is_err());
        // θ* = 0 (an untrained zero-initialised layer): the evidence grows without bound in λ.
        let zero = vec![0.0; theta.len()];
        let z = LastLayerFeatures { logits: vec![0.0; f.logits.len()], ..f.clone() };
        let e = LaplacePosterior::fit(&z, &labels, &zero, &LaplaceParams::new()).unwrap_err().to_string();
        assert!(e.contains("edge of the grid"), "{e}");
    }

    fn mlp(hidden: Vec<usize>, bias: bool, alpha: f64, zero_output: bool) -> Architecture {
        ModelConfig::Mlp { hidden, activation: Activation::Relu, bias, zero_last: false, alpha, zero_output }
            .resolve(5, None, 3, OutputKind::LogSoftmax)
            .unwrap()
    }

    #[test]
    fn save_writes_the_precision_posterior_and_logit_posterior() {
        let arch = mlp(vec![4], true, 0.7, false);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let x: Vec<f64> = (0..12 * 5).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let labels: Vec<usize> = (0..12).map(|i| i % 3).collect();
        let params = arch.init(2);
        let fit = LastLayerLaplace::fit(&arch, &params, None, &x, &labels, &LaplaceParams::new().prior_precision(0.8)).unwrap();
        let post = fit.posterior();
        let (d, q) = (post.num_params(), post.features());
        assert_eq!((q, post.classes(), d), (5, 3, 15));
        let prec = post.precision();
        for i in 0..d {
            for j in 0..d {
                assert_eq!(prec[(i, j)], post.hessian()[(i, j)] + if i == j { 0.8 } else { 0.0 });
            }
        }
        // Σ is its inverse.
        let eye = to_na(prec.as_ref()) * to_na(post.covariance());
        assert!((eye - DMatrix::identity(d, d)).abs().max() < 1e-12);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ll.safetensors");
        let meta = std::collections::HashMap::from([("run_id".to_string(), "abc".to_string())]);
        let pred = fit.save(&path, &x[..4 * 5], meta).unwrap();
        assert_eq!(pred, fit.predict(&x[..4 * 5]).unwrap());
        let f = crate::io::SafeFile::open(&path).unwrap();
        let m = f.metadata();
        for (key, want) in [("format", "pathkernel-lastlayer-laplace"), ("prior_precision", "0.8"), ("classes", "3"), ("features", "5"), ("hidden", "4"), ("bias", "true"), ("alpha", "0.7"), ("run_id", "abc")] {
            assert_eq!(m[key], want, "{key}");
        }
        let read = |name: &str, shape: &[usize]| f.f64(name, Some(shape)).unwrap().1;
        let (pr, h, cov) = (read("precision", &[d, d]), read("hessian", &[d, d]), read("covariance", &[d, d]));
        for i in 0..d {
            for j in 0..d {
                assert_eq!(pr[i * d + j], prec[(i, j)]);
                assert_eq!(h[i * d + j], post.hessian()[(i, j)]);
                assert_eq!(cov[i * d + j], post.covariance()[(i, j)]);
            }
        }
        assert_eq!(read("theta", &[d]), last_layer_theta(&arch, &params).unwrap());
        assert_eq!(read("points", &[4, 5]), x[..20]);
        assert_eq!(read("mean", &[4, 3]), pred.mean);
        assert_eq!(read("cov", &[4, 3, 3]), pred.cov);
        assert_eq!(read("variance", &[4, 3]), pred.variance());
        // Rows of the wrong width: an error, nothing written.
        let bad = dir.path().join("bad.safetensors");
        assert!(fit.save(&bad, &x[..7], Default::default()).is_err());
        assert!(!bad.exists());
    }

    #[test]
    fn network_features_reproduce_the_forward_pass() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let x: Vec<f64> = (0..8 * 5).map(|_| rng.gen_range(-2.0..2.0)).collect();
        for (hidden, bias, alpha, zo) in [(vec![6], true, 1.0, false), (vec![4, 6], true, 0.7, true), (vec![6], false, 2.0, false), (vec![], true, 1.0, false)] {
            let arch = mlp(hidden.clone(), bias, alpha, zo);
            let init = arch.init(3);
            let mut params = arch.init(4);
            params.data.iter_mut().flatten().for_each(|v| *v += 0.1);
            let f = last_layer_features(&arch, &params, Some(&init), &x).unwrap();
            let fwd = arch.forward(&params, Some(&init), &x).unwrap();
            let mut ls = f.logits.clone();
            crate::model::log_softmax_rows(&mut ls, 3);
            for (a, b) in ls.iter().zip(&fwd) {
                assert!((a - b).abs() < 1e-12, "{hidden:?} bias {bias}: {a} vs {b}");
            }
            // z = Ψ θ_k (+ the zero-output offset): θ's class-blocked order matches ψ's.
            let theta = last_layer_theta(&arch, &params).unwrap();
            assert_eq!(theta.len(), 3 * f.q);
            let lin = logits_of(&f.psi, &theta, f.n, f.q, 3);
            let offset = if zo { arch.raw_forward(&init, &x) } else { vec![0.0; lin.len()] };
            for i in 0..lin.len() {
                assert!((lin[i] - alpha * offset[i] - f.logits[i]).abs() < 1e-12);
            }
            let fit = LastLayerLaplace::fit(&arch, &params, Some(&init), &x, &[0, 1, 2, 0, 1, 2, 0, 1], &LaplaceParams::new().prior_precision(1.0)).unwrap();
            let lp = fit.predict(&x[..10]).unwrap();
            assert_eq!((lp.p, lp.k), (2, 3));
            assert_eq!(lp.mean, f.logits[..6]);
        }
        // A CNN: the pooled maps are the features.
        let cnn = ModelConfig::Cnn { channels: 2, kernel: 3, stride: 1, padding: 0, pool: 2, activation: Activation::Relu, bias: true, zero_last: false, alpha: 1.0, zero_output: false }
            .resolve(36, Some([1, 6, 6]), 3, OutputKind::LogSoftmax)
            .unwrap();
        let p = cnn.init(1);
        let x: Vec<f64> = (0..3 * 36).map(|_| rng.gen_range(0.0..1.0)).collect();
        let f = last_layer_features(&cnn, &p, None, &x).unwrap();
        assert_eq!(f.q, 2 * 2 * 2 + 1);
        let mut ls = f.logits.clone();
        crate::model::log_softmax_rows(&mut ls, 3);
        for (a, b) in ls.iter().zip(&cnn.forward(&p, None, &x).unwrap()) {
            assert!((a - b).abs() < 1e-12);
        }
        let reg = ModelConfig::default().resolve(5, None, 3, OutputKind::Identity).unwrap();
        assert!(last_layer_features(&reg, &reg.init(0), None, &x[..5]).is_err());
    }
}
