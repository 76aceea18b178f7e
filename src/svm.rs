//! Support-vector refit of the kernel machine's weights on a precomputed Gram.
//!
//! The exact path kernel turns a trained network into a kernel machine
//! `f(x) = Σ_i a_i K(x, x_i) + b` whose weights `a_i` come from the training trajectory. EPK
//! paper §4.1 (Fig. 3) then lets the weights be *retrained* with a support-vector machine on
//! the same kernel; this module is that refit.
//!
//! # The problem solved
//!
//! Binary C-SVC in libsvm's dual form, on a precomputed Gram `K` (`[M, M]`) and labels
//! `y_i ∈ {−1, +1}`:
//!
//! ```text
//! minimise   ½ αᵀ Q α − Σ_i α_i        Q_ij = y_i y_j K_ij
//! subject to Σ_i y_i α_i = 0,   0 ≤ α_i ≤ C
//! ```
//!
//! solved by SMO with libsvm's second-order working-set selection (WSS3 of Fan, Chen & Lin,
//! JMLR 2005), libsvm's two-variable update with its bound clipping, its stopping rule
//! `m(α) − M(α) < tol` and its intercept (the mean of `y_i ∇_i` over free support vectors, else
//! the midpoint of the bounds). Non-positive curvature `K_ii + K_jj − 2 K_ij ≤ 0` is replaced by
//! `τ = 1e−12`, as libsvm does, so a slightly indefinite Gram (numerical EPK) still solves.
//! The candidates are scanned in libsvm's order (the `+1` points, then the `−1` points, each
//! in input order), which fixes the tie-breaking. So this is *the same algorithm*, not just
//! the same problem: on a Gram whose entries are float32 values (libsvm caches `Q` in
//! float32) the iterates equal those of scikit-learn's
//! `SVC(kernel="precomputed", shrinking=False)` with the `+1` class as `classes_[0]` —
//! identical iteration counts, decision values equal to rounding (`tests/data/svm/`). On a general
//! f64 Gram libsvm's f32 rounding of `Q` makes the paths drift apart by rounding; with
//! shrinking (scikit-learn's default), or with `y = ±1` given to scikit-learn directly (its
//! first class is then `−1`, so libsvm solves the label-flipped problem), the paths differ
//! but both solutions meet the same stopping rule, so they agree to `O(tol)`.
//!
//! The Gram is used in place (dense, row-major): each SMO iteration reads rows `i` and `j`
//! (`= columns`, the Gram being symmetric) and allocates nothing; `M = 3000` fits in a few
//! tens of milliseconds (validation included), on par with or faster than libsvm.
//!
//! # Conventions
//!
//! * [`BinarySvm::dual_coef`] is `y_i α_i` for **all** `M` training points (zero off the support),
//!   and `f(x) = Σ_i dual_coef_i K(x, x_i) + intercept`, positive for the `+1` class. With
//!   `y = ±1` given to scikit-learn (`classes_ = [−1, 1]`) this is its `dual_coef_` scattered
//!   from `support_` to full length, its `intercept_` and its `decision_function`; with the
//!   `+1` class as `classes_[0]` (as in the golden data) all three change sign.
//! * [`BinarySvm::objective`] is libsvm's `obj`: the minimised dual value `½ αᵀQα − Σ α`
//!   (≤ 0), not the (maximised) textbook dual.
//! * A Gram is accepted as symmetric when `|K_ij − K_ji| ≤ 1e−10 · max_kl |K_kl|`; only the row
//!   `K_i·` is read, so accepted asymmetry is below rounding level.
//! * One-vs-rest ([`SvmParams::fit_ovr`]) takes one Gram per class, because the EPK of class `c`
//!   is the path kernel of output `c`; pass the same Gram `K` times for a shared kernel.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// libsvm's curvature floor for non-positive-definite pairs (`TAU` in svm.cpp).
const TAU: f64 = 1e-12;

/// Relative tolerance of the symmetry check, against the largest |entry| of the Gram.
const SYMMETRY_RTOL: f64 = 1e-10;

/// Hyper-parameters of the C-SVC refit.
///
/// Built with [`SvmParams::new`] (or `Default`) and the chained setters; every field has a
/// default when deserialised, so a config may give only the fields it changes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SvmParams {
    /// Box constraint `C > 0` (upper bound on each `α_i`). Default `1.0`.
    pub c: f64,
    /// KKT tolerance `tol > 0` of the stopping rule `m(α) − M(α) < tol`; libsvm's `-e`,
    /// scikit-learn's `tol`. Default `1e−3`, as in libsvm.
    pub tol: f64,
    /// Maximum number of SMO updates before giving up with [`Error::Numerical`].
    /// Default `1_000_000`.
    pub max_iter: usize,
}

impl Default for SvmParams {
    fn default() -> Self {
        SvmParams { c: 1.0, tol: 1e-3, max_iter: 1_000_000 }
    }
}

/// A fitted binary C-SVC: the kernel machine `f(x) = Σ_i dual_coef_i K(x, x_i) + intercept`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BinarySvm {
    /// `y_i α_i` for every training point (zero for non-support points).
    ///
    /// # Shapes
    /// `[M]`
    pub dual_coef: Vec<f64>,
    /// Intercept `b` (libsvm's `−rho`).
    pub intercept: f64,
    /// Indices `i` with `α_i > 0`, sorted ascending.
    pub support: Vec<usize>,
    /// Number of SMO updates performed (scikit-learn's `n_iter_`).
    pub iterations: usize,
    /// libsvm's objective: the minimised dual `½ αᵀQα − Σ_i α_i`.
    pub objective: f64,
}

/// One-vs-rest C-SVC over `K` classes: one [`BinarySvm`] per class (`+1` = that class).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OvrSvm {
    /// The per-class machines, class `c` at index `c`.
    ///
    /// # Shapes
    /// `[K]`, each with `dual_coef` of shape `[M]`
    pub classes: Vec<BinarySvm>,
    /// Number of classes `K`.
    pub k: usize,
    /// Number of training points `M`.
    pub m: usize,
}

impl SvmParams {
    /// The defaults: `c = 1.0`, `tol = 1e−3`, `max_iter = 1_000_000`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the box constraint `C`.
    pub fn c(mut self, v: f64) -> Self {
        self.c = v;
        self
    }

    /// Sets the KKT tolerance of the stopping rule.
    pub fn tol(mut self, v: f64) -> Self {
        self.tol = v;
        self
    }

    /// Sets the maximum number of SMO updates.
    pub fn max_iter(mut self, v: usize) -> Self {
        self.max_iter = v;
        self
    }

    fn validate(&self) -> Result<()> {
        if !(self.c.is_finite() && self.c > 0.0) {
            return Err(Error::Config(format!("SVM: C must be finite and > 0, got {}", self.c)));
        }
        if !(self.tol.is_finite() && self.tol > 0.0) {
            return Err(Error::Config(format!("SVM: tol must be finite and > 0, got {}", self.tol)));
        }
        Ok(())
    }

    /// Binary C-SVC dual on a precomputed Gram, labels ±1, solved by SMO with libsvm's
    /// working-set selection (WSS3: second-order, Fan, Chen & Lin 2005) — same problem and
    /// stopping rule as libsvm, so results match scikit-learn's `SVC(kernel="precomputed")`.
    ///
    /// Errors: [`Error::ShapeMismatch`] for wrong lengths; [`Error::Data`] for `m = 0`, a
    /// non-finite or non-symmetric Gram, labels other than ±1 or only one of them present;
    /// [`Error::Config`] for `C` or `tol` not finite and positive; [`Error::Numerical`] when SMO
    /// does not reach `tol` within `max_iter` updates.
    ///
    /// # Shapes
    /// `gram` is `[M, M]` (row-major, symmetric), `y` is `[M]` (each ±1).
    pub fn fit_binary(&self, gram: &[f64], y: &[f64], m: usize) -> Result<BinarySvm> {
        self.validate()?;
        check_gram(gram, m, "SVM Gram")?;
        if y.len() != m {
            return Err(Error::ShapeMismatch { what: "SVM labels y".into(), expected: vec![m], got: vec![y.len()] });
        }
        if let Some(i) = y.iter().position(|&v| v != 1.0 && v != -1.0) {
            return Err(Error::Data(format!("SVM labels must be +1 or -1, got y[{i}] = {}", y[i])));
        }
        let n_pos = y.iter().filter(|&&v| v > 0.0).count();
        if n_pos == 0 || n_pos == m {
            return Err(Error::Data(format!(
                "SVM needs both classes, got {n_pos} labels +1 and {} labels -1 (M = {m})",
                m - n_pos
            )));
        }
        solve(gram, y, m, self)
    }

    /// One-vs-rest over `K` classes using per-class Gram blocks: class `c` is trained on
    /// `gram_blocks[c]` (shape `[M, M]`) with `y = +1` for label `c`, `−1` otherwise.
    ///
    /// Errors as [`SvmParams::fit_binary`], plus [`Error::Data`] for a label `≥ K` or a class
    /// with no training point (its binary problem would have one class only). On a failure of
    /// class `c`, the message names `c`.
    ///
    /// # Shapes
    /// `gram_blocks` is `[K, M, M]`, `labels` is `[M]` (values in `0..K`).
    pub fn fit_ovr(&self, gram_blocks: &[f64], labels: &[usize], m: usize, k: usize) -> Result<OvrSvm> {
        self.validate()?;
        if k == 0 {
            return Err(Error::Data("SVM one-vs-rest needs at least one class (K = 0)".into()));
        }
        if gram_blocks.len() != k * m * m {
            return Err(Error::ShapeMismatch {
                what: "SVM one-vs-rest Gram blocks".into(),
                expected: vec![k, m, m],
                got: vec![gram_blocks.len()],
            });
        }
        if labels.len() != m {
            return Err(Error::ShapeMismatch { what: "SVM labels".into(), expected: vec![m], got: vec![labels.len()] });
        }
        if let Some(i) = labels.iter().position(|&l| l >= k) {
            return Err(Error::Data(format!("SVM label {} at index {i} is out of range 0..{k}", labels[i])));
        }
        let mut counts = vec![0usize; k];
        for &l in labels {
            counts[l] += 1;
        }
        if let Some(c) = counts.iter().position(|&n| n == 0 || n == m) {
            return Err(Error::Data(format!(
                "SVM one-vs-rest: class {c} has {} of {m} training points; each class needs at least one \
                 point in and one out",
                counts[c]
            )));
        }
        let mut y = vec![0.0; m];
        let mut classes = Vec::with_capacity(k);
        for c in 0..k {
            for (yi, &l) in y.iter_mut().zip(labels) {
                *yi = if l == c { 1.0 } else { -1.0 };
            }
            let block = &gram_blocks[c * m * m..(c + 1) * m * m];
            let fit = self.fit_binary(block, &y, m).map_err(|e| with_class(e, c))?;
            classes.push(fit);
        }
        Ok(OvrSvm { classes, k, m })
    }
}

/// Prefixes the class index to the message of a per-class failure.
fn with_class(e: Error, c: usize) -> Error {
    match e {
        Error::Data(s) => Error::Data(format!("class {c}: {s}")),
        Error::Numerical(s) => Error::Numerical(format!("class {c}: {s}")),
        Error::ShapeMismatch { what, expected, got } => {
            Error::ShapeMismatch { what: format!("{what} (class {c})"), expected, got }
        }
        other => other,
    }
}

/// Shape, finiteness and symmetry of a square Gram.
fn check_gram(gram: &[f64], m: usize, what: &str) -> Result<()> {
    if m == 0 {
        return Err(Error::Data(format!("{what}: no training points (M = 0)")));
    }
    if gram.len() != m * m {
        return Err(Error::ShapeMismatch { what: what.into(), expected: vec![m, m], got: vec![gram.len()] });
    }
    // One pass over row bands on the rayon pool: each band's asymmetry, max |entry| and
    // finiteness (every entry is read as a row entry or as a transposed one); the first
    // offending band (in band order, as a serial scan would find it) is located afterwards.
    let bands: Vec<(f64, f64, bool)> = (0..m.div_ceil(TILE)).into_par_iter().map(|t| band_scan(gram, m, t * TILE)).collect();
    let scale = bands.iter().fold(0.0f64, |a, b| a.max(b.1));
    if !bands.iter().all(|b| b.2) {
        let idx = gram.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(Error::Data(format!("{what}: non-finite entry {} at ({}, {})", gram[idx], idx / m, idx % m)));
    }
    let atol = SYMMETRY_RTOL * scale;
    if let Some(t) = bands.iter().position(|b| b.0 > atol) {
        let bi = t * TILE;
        for bj in (bi..m).step_by(TILE) {
            for i in bi..(bi + TILE).min(m) {
                for j in bj..(bj + TILE).min(m) {
                    let (a, b) = (gram[i * m + j], gram[j * m + i]);
                    if (a - b).abs() > atol {
                        return Err(Error::Data(format!(
                            "{what} is not symmetric: K[{i},{j}] = {a:e} but K[{j},{i}] = {b:e} \
                             (tolerance {atol:e} = {SYMMETRY_RTOL:e} × max |K|)"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Tile size of the symmetry check.
const TILE: usize = 32;

/// Over rows `bi..bi + TILE` and columns `j ≥ bi` (and their transposes): `(max |K_ij − K_ji|,
/// max |K_ij|, all finite)`. Tiled so that both the (bi, bj) tile and its transpose stay in L1
/// (a plain column-strided scan costs a cache miss per entry), branch-free inside a tile
/// (`v · 0` is NaN exactly for ±inf and NaN).
fn band_scan(gram: &[f64], m: usize, bi: usize) -> (f64, f64, bool) {
    let i_end = (bi + TILE).min(m);
    let (mut worst, mut mx, mut nan) = (0.0f64, 0.0f64, 0.0f64);
    for bj in (bi..m).step_by(TILE) {
        let j_end = (bj + TILE).min(m);
        for i in bi..i_end {
            let row = &gram[i * m + bj..i * m + j_end];
            for (jj, &a) in row.iter().enumerate() {
                let b = gram[(bj + jj) * m + i];
                let d = (a - b).abs();
                worst = if d > worst { d } else { worst };
                let e = a.abs().max(b.abs());
                mx = if e > mx { e } else { mx };
                nan += (a + b) * 0.0;
            }
        }
    }
    (worst, mx, nan == 0.0)
}

/// SMO on a validated problem. State is kept as `F_t = y_t ∇_t f(α)` (libsvm's `y[t]*G[t]`),
/// so the gradient update is two plain axpys on Gram rows.
fn solve(gram: &[f64], y: &[f64], m: usize, p: &SvmParams) -> Result<BinarySvm> {
    let c = p.c;
    let mut alpha = vec![0.0f64; m];
    // ∇ = Qα − e = −e at α = 0, so F = y ∘ ∇ = −y.
    let mut f: Vec<f64> = y.iter().map(|&v| -v).collect();
    let pos: Vec<bool> = y.iter().map(|&v| v > 0.0).collect();
    let diag: Vec<f64> = (0..m).map(|i| gram[i * m + i]).collect();
    // libsvm (as called by scikit-learn) sees the points grouped by class, its +1 class first,
    // each group in input order. Scanning in that order reproduces its tie-breaking in the
    // working-set selection (`>=` / `<=`: the last of equal candidates wins) and its
    // summation order, hence its iterates; memory access stays in the input layout.
    let order: Vec<usize> = (0..m).filter(|&t| pos[t]).chain((0..m).filter(|&t| !pos[t])).collect();
    // Membership in libsvm's I_up (may move "up" in y-space) and I_low.
    let mut up: Vec<bool> = pos.clone();
    let mut low: Vec<bool> = pos.iter().map(|&b| !b).collect();
    let set_status = |t: usize, a: f64, up: &mut [bool], low: &mut [bool]| {
        let at_upper = a >= c;
        let at_lower = a <= 0.0;
        if pos[t] {
            up[t] = !at_upper;
            low[t] = !at_lower;
        } else {
            up[t] = !at_lower;
            low[t] = !at_upper;
        }
    };

    let mut iter = 0usize;
    loop {
        // ---- working-set selection (libsvm Solver::select_working_set, no shrinking) ----
        let mut gmax = f64::NEG_INFINITY;
        let mut gmax_idx = usize::MAX;
        for &t in &order {
            if up[t] && -f[t] >= gmax {
                gmax = -f[t];
                gmax_idx = t;
            }
        }
        let mut gmax2 = f64::NEG_INFINITY;
        let mut gmin_idx = usize::MAX;
        let mut obj_diff_min = f64::INFINITY;
        if gmax_idx != usize::MAX {
            let i = gmax_idx;
            let k_i = &gram[i * m..(i + 1) * m];
            let qd_i = diag[i];
            for &j in &order {
                if !low[j] {
                    continue;
                }
                let fj = f[j];
                if fj >= gmax2 {
                    gmax2 = fj;
                }
                let grad_diff = gmax + fj;
                if grad_diff > 0.0 {
                    let quad_coef = qd_i + diag[j] - 2.0 * k_i[j];
                    let obj_diff = if quad_coef > 0.0 {
                        -(grad_diff * grad_diff) / quad_coef
                    } else {
                        -(grad_diff * grad_diff) / TAU
                    };
                    if obj_diff <= obj_diff_min {
                        gmin_idx = j;
                        obj_diff_min = obj_diff;
                    }
                }
            }
        } else {
            for &j in &order {
                if low[j] && f[j] >= gmax2 {
                    gmax2 = f[j];
                }
            }
        }
        let violation = gmax + gmax2;
        if violation < p.tol || gmin_idx == usize::MAX {
            break;
        }
        if iter >= p.max_iter {
            return Err(Error::Numerical(format!(
                "SMO did not converge within {} iterations (max KKT violation {violation:.3e}, tol {:e}, C = {}, M = {m})",
                p.max_iter, p.tol, c
            )));
        }
        if !violation.is_finite() {
            return Err(Error::Numerical(format!("SMO: non-finite KKT violation {violation} at iteration {iter}")));
        }
        iter += 1;

        // ---- two-variable update (libsvm Solver::Solve) ----
        let (i, j) = (gmax_idx, gmin_idx);
        let k_i = &gram[i * m..(i + 1) * m];
        let k_j = &gram[j * m..(j + 1) * m];
        let (yi, yj) = (y[i], y[j]);
        let (g_i, g_j) = (yi * f[i], yj * f[j]);
        let (old_ai, old_aj) = (alpha[i], alpha[j]);
        let (c_i, c_j) = (c, c);
        let mut quad_coef = diag[i] + diag[j] - 2.0 * k_i[j];
        if quad_coef <= 0.0 {
            quad_coef = TAU;
        }
        let (mut ai, mut aj) = (old_ai, old_aj);
        if yi != yj {
            let delta = (-g_i - g_j) / quad_coef;
            let diff = ai - aj;
            ai += delta;
            aj += delta;
            if diff > 0.0 {
                if aj < 0.0 {
                    aj = 0.0;
                    ai = diff;
                }
            } else if ai < 0.0 {
                ai = 0.0;
                aj = -diff;
            }
            if diff > c_i - c_j {
                if ai > c_i {
                    ai = c_i;
                    aj = c_i - diff;
                }
            } else if aj > c_j {
                aj = c_j;
                ai = c_j + diff;
            }
        } else {
            let delta = (g_i - g_j) / quad_coef;
            let sum = ai + aj;
            ai -= delta;
            aj += delta;
            if sum > c_i {
                if ai > c_i {
                    ai = c_i;
                    aj = sum - c_i;
                }
            } else if aj < 0.0 {
                aj = 0.0;
                ai = sum;
            }
            if sum > c_j {
                if aj > c_j {
                    aj = c_j;
                    ai = sum - c_j;
                }
            } else if ai < 0.0 {
                ai = 0.0;
                aj = sum;
            }
        }
        alpha[i] = ai;
        alpha[j] = aj;
        // ΔF_k = y_k ΔG_k = K_ik y_i Δα_i + K_jk y_j Δα_j
        let ci = yi * (ai - old_ai);
        let cj = yj * (aj - old_aj);
        for ((fk, &kik), &kjk) in f.iter_mut().zip(k_i).zip(k_j) {
            *fk += kik * ci + kjk * cj;
        }
        set_status(i, ai, &mut up, &mut low);
        set_status(j, aj, &mut up, &mut low);
    }

    // ---- intercept (libsvm Solver::calculate_rho) ----
    let (mut ub, mut lb, mut sum_free, mut nr_free) = (f64::INFINITY, f64::NEG_INFINITY, 0.0, 0usize);
    for &t in &order {
        let yg = f[t];
        let a = alpha[t];
        if a >= c {
            if pos[t] {
                lb = lb.max(yg);
            } else {
                ub = ub.min(yg);
            }
        } else if a <= 0.0 {
            if pos[t] {
                ub = ub.min(yg);
            } else {
                lb = lb.max(yg);
            }
        } else {
            nr_free += 1;
            sum_free += yg;
        }
    }
    let rho = if nr_free > 0 { sum_free / nr_free as f64 } else { (ub + lb) / 2.0 };

    // obj = ½ Σ α_i (G_i + p_i), p = −e.
    let objective = 0.5 * order.iter().map(|&t| alpha[t] * (y[t] * f[t] - 1.0)).sum::<f64>();
    if !rho.is_finite() || !objective.is_finite() {
        return Err(Error::Numerical(format!(
            "SMO produced a non-finite intercept ({}) or objective ({objective}) after {iter} iterations",
            -rho
        )));
    }
    let dual_coef: Vec<f64> = alpha.iter().zip(y).map(|(&a, &yy)| a * yy).collect();
    let support: Vec<usize> = (0..m).filter(|&t| alpha[t] > 0.0).collect();
    Ok(BinarySvm { dual_coef, intercept: -rho, support, iterations: iter, objective })
}

/// Checks a cross Gram's length and finiteness.
fn check_cross(k_cross: &[f64], expected: Vec<usize>, what: &str) -> Result<()> {
    let n: usize = expected.iter().product();
    if k_cross.len() != n {
        return Err(Error::ShapeMismatch { what: what.into(), expected, got: vec![k_cross.len()] });
    }
    if let Some(idx) = k_cross.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!("{what}: non-finite entry {} at flat index {idx}", k_cross[idx])));
    }
    Ok(())
}

impl BinarySvm {
    /// Number of training points `M` the machine was fitted on.
    pub fn m(&self) -> usize {
        self.dual_coef.len()
    }

    /// Decision values `f(x) = Σ_i y_i α_i K(x, x_i) + b` (positive: class `+1`).
    ///
    /// Errors: [`Error::ShapeMismatch`] on a wrong length, [`Error::Data`] on a non-finite entry.
    ///
    /// # Shapes
    /// `k_cross` is `[P, M]` (`K(x_p, x_i)`, training points along columns) → `[P]`.
    pub fn decision(&self, k_cross: &[f64], p: usize) -> Result<Vec<f64>> {
        let m = self.m();
        check_cross(k_cross, vec![p, m], "SVM cross Gram")?;
        Ok(self.decision_unchecked(k_cross, p))
    }

    fn decision_unchecked(&self, k_cross: &[f64], p: usize) -> Vec<f64> {
        let m = self.m();
        (0..p)
            .map(|r| {
                let row = &k_cross[r * m..(r + 1) * m];
                self.support.iter().map(|&i| self.dual_coef[i] * row[i]).sum::<f64>() + self.intercept
            })
            .collect()
    }
}

impl OvrSvm {
    /// Decision values of every class machine on its own cross-Gram block.
    ///
    /// Errors: [`Error::ShapeMismatch`] on a wrong length, [`Error::Data`] on a non-finite entry.
    ///
    /// # Shapes
    /// `k_cross` is `[K, P, M]` (block `c` = class-`c` kernel between test and training
    /// points) → `[P, K]`.
    pub fn decision(&self, k_cross: &[f64], p: usize) -> Result<Vec<f64>> {
        let (k, m) = (self.k, self.m);
        if self.classes.len() != k || self.classes.iter().any(|c| c.m() != m) {
            return Err(Error::ShapeMismatch {
                what: "OvrSvm classes (inconsistent model)".into(),
                expected: vec![k, m],
                got: vec![self.classes.len(), self.classes.first().map_or(0, BinarySvm::m)],
            });
        }
        check_cross(k_cross, vec![k, p, m], "SVM one-vs-rest cross Gram")?;
        let mut out = vec![0.0; p * k];
        for (c, svm) in self.classes.iter().enumerate() {
            let d = svm.decision_unchecked(&k_cross[c * p * m..(c + 1) * p * m], p);
            for (r, v) in d.into_iter().enumerate() {
                out[r * k + c] = v;
            }
        }
        Ok(out)
    }

    /// Predicted class: arg-max of the decision values over classes (lowest index on ties).
    ///
    /// # Shapes
    /// `k_cross` is `[K, P, M]` → `[P]`.
    pub fn predict(&self, k_cross: &[f64], p: usize) -> Result<Vec<usize>> {
        let k = self.k;
        let d = self.decision(k_cross, p)?;
        Ok((0..p)
            .map(|r| {
                let row = &d[r * k..(r + 1) * k];
                let mut best = 0;
                for c in 1..k {
                    if row[c] > row[best] {
                        best = c;
                    }
                }
                best
            })
            .collect())
    }
}

/// Fraction of equal entries (accuracy against labels, or agreement with the network's
/// arg-max). Returns `NaN` for empty inputs.
///
/// # Panics
/// If the lengths differ (a programmer error).
///
/// # Shapes
/// `a` and `b` are `[P]`.
pub fn agreement(a: &[usize], b: &[usize]) -> f64 {
    assert_eq!(a.len(), b.len(), "agreement: lengths differ");
    if a.is_empty() {
        return f64::NAN;
    }
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// One golden file. `gram` and `cross` hold float32 values (what libsvm's f32 Q cache
    /// represents exactly), read as f32 and widened.
    #[derive(serde::Deserialize)]
    struct GoldenFile {
        name: String,
        m: usize,
        p: usize,
        k: usize,
        tol: f64,
        gram: Vec<f32>,
        labels: Vec<usize>,
        cross: Vec<f32>,
        test_labels: Vec<usize>,
        fits: Vec<GoldenFit>,
    }

    struct Golden {
        name: String,
        m: usize,
        p: usize,
        k: usize,
        tol: f64,
        gram: Vec<f64>,
        labels: Vec<usize>,
        cross: Vec<f64>,
        test_labels: Vec<usize>,
        fits: Vec<GoldenFit>,
    }

    #[derive(serde::Deserialize)]
    struct GoldenFit {
        c: f64,
        classes: Vec<GoldenClass>,
    }

    #[derive(serde::Deserialize)]
    struct GoldenClass {
        dual_coef: Vec<f64>,
        intercept: f64,
        support: Vec<usize>,
        decision: Vec<f64>,
        n_iter: usize,
        decision_tol1e3: Vec<f64>,
        n_iter_tol1e3: usize,
    }

    fn golden(name: &str) -> Golden {
        let path = format!("{}/tests/data/svm/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let f: GoldenFile = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        let widen = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
        Golden {
            name: f.name,
            m: f.m,
            p: f.p,
            k: f.k,
            tol: f.tol,
            gram: widen(f.gram),
            labels: f.labels,
            cross: widen(f.cross),
            test_labels: f.test_labels,
            fits: f.fits,
        }
    }

    /// `K` copies of `block` (a shared kernel for every one-vs-rest class).
    fn repeat(block: &[f64], k: usize) -> Vec<f64> {
        block.repeat(k)
    }

    fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
    }

    /// KKT check recomputed from scratch (not from the solver's gradient): box, equality
    /// constraint, `m(α) − M(α) ≤ tol`, and the margin conditions with the returned intercept.
    fn assert_kkt(svm: &BinarySvm, gram: &[f64], y: &[f64], m: usize, c: f64, tol: f64) {
        let slack = 1e-9 * (1.0 + c * m as f64);
        let alpha: Vec<f64> = svm.dual_coef.iter().zip(y).map(|(d, yy)| d * yy).collect();
        for (i, &a) in alpha.iter().enumerate() {
            assert!((0.0..=c).contains(&a), "alpha[{i}] = {a} outside [0, {c}]");
            assert_eq!(a > 0.0, svm.support.binary_search(&i).is_ok(), "support set wrong at {i}");
        }
        assert!(svm.support.windows(2).all(|w| w[0] < w[1]), "support not sorted");
        let sum: f64 = svm.dual_coef.iter().sum();
        assert!(sum.abs() <= slack, "Σ y_i α_i = {sum}");
        // f(x_i) without intercept, and F_i = y_i ∇_i = f0_i − y_i.
        let f0: Vec<f64> = (0..m).map(|i| (0..m).map(|j| gram[i * m + j] * svm.dual_coef[j]).sum::<f64>()).collect();
        let (mut m_up, mut m_low) = (f64::NEG_INFINITY, f64::INFINITY);
        for i in 0..m {
            let neg_f = -(f0[i] - y[i]);
            let in_up = (y[i] > 0.0 && alpha[i] < c) || (y[i] < 0.0 && alpha[i] > 0.0);
            let in_low = (y[i] > 0.0 && alpha[i] > 0.0) || (y[i] < 0.0 && alpha[i] < c);
            if in_up {
                m_up = m_up.max(neg_f);
            }
            if in_low {
                m_low = m_low.min(neg_f);
            }
        }
        assert!(m_up - m_low <= tol + slack, "KKT gap m − M = {} > tol {tol}", m_up - m_low);
        for i in 0..m {
            let margin = y[i] * (f0[i] + svm.intercept);
            if alpha[i] <= 0.0 {
                assert!(margin >= 1.0 - tol - slack, "α_{i} = 0 but y f = {margin}");
            } else if alpha[i] >= c {
                assert!(margin <= 1.0 + tol + slack, "α_{i} = C but y f = {margin}");
            } else {
                assert!((margin - 1.0).abs() <= tol + slack, "free α_{i} but y f = {margin}");
            }
        }
        let q = |i: usize, j: usize| y[i] * y[j] * gram[i * m + j];
        let obj: f64 = 0.5 * (0..m).map(|i| (0..m).map(|j| alpha[i] * q(i, j) * alpha[j]).sum::<f64>()).sum::<f64>()
            - alpha.iter().sum::<f64>();
        assert!((obj - svm.objective).abs() <= 1e-8 * (1.0 + obj.abs()), "objective {} vs {obj}", svm.objective);
    }

    fn ovr_y(labels: &[usize], c: usize) -> Vec<f64> {
        labels.iter().map(|&l| if l == c { 1.0 } else { -1.0 }).collect()
    }

    /// Fits every golden problem (one-vs-rest, shared Gram) at the golden tight `tol` and at
    /// libsvm's default `1e-3`, and compares with scikit-learn. The Gram is float32-exact, so
    /// libsvm ran the same double-precision SMO: iteration counts must agree exactly and the
    /// solutions to rounding.
    fn check_golden(name: &str, same_support: bool) {
        let g = golden(name);
        let (m, p, k) = (g.m, g.p, g.k);
        let blocks = repeat(&g.gram, k);
        let cross = repeat(&g.cross, k);
        for fit in &g.fits {
            for tight in [true, false] {
                let tol = if tight { g.tol } else { 1e-3 };
                let params = SvmParams::new().c(fit.c).tol(tol);
                let ovr = params.fit_ovr(&blocks, &g.labels, m, k).unwrap();
                assert_eq!((ovr.k, ovr.m, ovr.classes.len()), (k, m, k));
                let dec = ovr.decision(&cross, p).unwrap();
                for (c, (ours, sk)) in ovr.classes.iter().zip(&fit.classes).enumerate() {
                    let d_ours: Vec<f64> = (0..p).map(|r| dec[r * k + c]).collect();
                    let (sk_dec, sk_iter) =
                        if tight { (&sk.decision, sk.n_iter) } else { (&sk.decision_tol1e3, sk.n_iter_tol1e3) };
                    let d_dec = max_abs_diff(&d_ours, sk_dec);
                    println!(
                        "{} C={} tol={tol:e} class {c}: |Δdecision|={d_dec:.2e} nSV {} iterations {} (sklearn {sk_iter})",
                        g.name,
                        fit.c,
                        ours.support.len(),
                        ours.iterations,
                    );
                    assert!(d_dec <= 1e-9, "decision differs by {d_dec}");
                    assert_eq!(ours.iterations, sk_iter, "iteration count differs from libsvm");
                    assert_kkt(ours, &g.gram, &ovr_y(&g.labels, c), m, fit.c, tol);
                    if tight {
                        let d_coef = max_abs_diff(&ours.dual_coef, &sk.dual_coef);
                        let d_b = (ours.intercept - sk.intercept).abs();
                        println!("    |Δdual_coef|={d_coef:.2e} |Δintercept|={d_b:.2e}");
                        assert!(d_coef <= 1e-9 * fit.c, "dual_coef differs by {d_coef}");
                        assert!(d_b <= 1e-9, "intercept differs by {d_b}");
                        if same_support {
                            assert_eq!(ours.support, sk.support, "support set differs");
                        }
                    }
                }
                let pred = ovr.predict(&cross, p).unwrap();
                let acc = agreement(&pred, &g.test_labels);
                println!("{} C={} tol={tol:e}: held-out accuracy {acc:.3}", g.name, fit.c);
            }
        }
    }

    #[test]
    fn golden_separable_linear_matches_sklearn() {
        check_golden("separable_linear", true);
    }

    #[test]
    fn golden_overlap_rbf_matches_sklearn() {
        check_golden("overlap_rbf", true);
    }

    #[test]
    fn golden_indefinite_sigmoid_matches_sklearn() {
        // 122 pairs with K_ii + K_jj − 2K_ij ≤ 0: the τ = 1e−12 branch must match libsvm.
        check_golden("indefinite_sigmoid", true);
    }

    #[test]
    fn two_points_closed_form() {
        // x = 3 (y = +1), x = 1 (y = −1), linear kernel: w = 1, b = −2, α = (½, ½).
        let gram = [9.0, 3.0, 3.0, 1.0];
        let y = [1.0, -1.0];
        let svm = SvmParams::new().fit_binary(&gram, &y, 2).unwrap();
        assert!(
            (svm.dual_coef[0] - 0.5).abs() < 1e-12 && (svm.dual_coef[1] + 0.5).abs() < 1e-12,
            "{:?}",
            svm.dual_coef
        );
        assert!((svm.intercept + 2.0).abs() < 1e-12, "b = {}", svm.intercept);
        assert!((svm.objective + 0.5).abs() < 1e-12, "objective {}", svm.objective);
        assert_eq!(svm.support, vec![0, 1]);
        // f(x) = x − 2 at x = 0, 2, 5: K(x, x_i) = x x_i.
        let k_cross = [0.0, 0.0, 6.0, 2.0, 15.0, 5.0];
        let f = svm.decision(&k_cross, 3).unwrap();
        assert!(max_abs_diff(&f, &[-2.0, 0.0, 3.0]) < 1e-12, "{f:?}");

        // Symmetric version ±1, plus a far point with α = 0: w = 1, b = 0.
        let xs = [1.0, -1.0, 4.0];
        let gram: Vec<f64> = xs.iter().flat_map(|a| xs.iter().map(move |b| a * b)).collect();
        let svm = SvmParams::new().fit_binary(&gram, &[1.0, -1.0, 1.0], 3).unwrap();
        assert!(max_abs_diff(&svm.dual_coef, &[0.5, -0.5, 0.0]) < 1e-12, "{:?}", svm.dual_coef);
        assert!(svm.intercept.abs() < 1e-12);
        assert_eq!(svm.support, vec![0, 1]);

        // C = 0.1 < ½: both at the bound, b from the midpoint rule: f(x) = 0.2 x − 0.4.
        let svm = SvmParams::new().c(0.1).fit_binary(&[9.0, 3.0, 3.0, 1.0], &y, 2).unwrap();
        assert!(max_abs_diff(&svm.dual_coef, &[0.1, -0.1]) < 1e-15, "{:?}", svm.dual_coef);
        assert!((svm.intercept + 0.4).abs() < 1e-12, "b = {}", svm.intercept);
    }

    fn random_points(rng: &mut ChaCha8Rng, m: usize, d: usize) -> Vec<f64> {
        (0..m * d).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    fn rbf_gram(x: &[f64], z: &[f64], d: usize, gamma: f64) -> Vec<f64> {
        let (n, p) = (x.len() / d, z.len() / d);
        let mut k = vec![0.0; n * p];
        for i in 0..n {
            for j in 0..p {
                let d2: f64 = (0..d).map(|t| (x[i * d + t] - z[j * d + t]).powi(2)).sum();
                k[i * p + j] = (-gamma * d2).exp();
            }
        }
        k
    }

    #[test]
    fn kkt_on_random_problems_including_indefinite() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for trial in 0..6 {
            let (m, d) = (80, 3);
            let x = random_points(&mut rng, m, d);
            let y: Vec<f64> = (0..m)
                .map(|i| if x[i * d] + 0.3 * x[i * d + 1] + rng.gen_range(-0.3..0.3) > 0.0 { 1.0 } else { -1.0 })
                .collect();
            let mut gram = rbf_gram(&x, &x, d, 2.0);
            if trial % 2 == 1 {
                // Indefinite: subtract a rank-one term (like a slightly non-PSD numerical EPK)
                // and a sigmoid-ish distortion, keeping symmetry.
                for i in 0..m {
                    for j in 0..m {
                        gram[i * m + j] = (gram[i * m + j] * 2.0 - 1.2).tanh() - 0.05 * x[i * d] * x[j * d];
                    }
                }
            }
            for &(c, tol) in &[(1.0, 1e-3), (10.0, 1e-6)] {
                let svm = SvmParams::new().c(c).tol(tol).fit_binary(&gram, &y, m).unwrap();
                assert!(!svm.support.is_empty());
                assert_kkt(&svm, &gram, &y, m, c, tol);
            }
        }
    }

    #[test]
    fn ovr_uses_the_class_block() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (m, d, k, p) = (45, 2, 3, 10);
        let x = random_points(&mut rng, m, d);
        let z = random_points(&mut rng, p, d);
        let labels: Vec<usize> = (0..m).map(|i| (i * 7 + 1) % k).collect();
        let gammas = [0.5, 2.0, 8.0];
        let blocks: Vec<f64> = gammas.iter().flat_map(|&g| rbf_gram(&x, &x, d, g)).collect();
        let cross: Vec<f64> = gammas.iter().flat_map(|&g| rbf_gram(&z, &x, d, g)).collect();
        let params = SvmParams::new().c(5.0);
        let ovr = params.fit_ovr(&blocks, &labels, m, k).unwrap();
        let dec = ovr.decision(&cross, p).unwrap();
        for c in 0..k {
            let block = &blocks[c * m * m..(c + 1) * m * m];
            let single = params.fit_binary(block, &ovr_y(&labels, c), m).unwrap();
            assert_eq!(single, ovr.classes[c], "class {c}");
            let d = single.decision(&cross[c * p * m..(c + 1) * p * m], p).unwrap();
            for r in 0..p {
                assert_eq!(d[r], dec[r * k + c]);
            }
        }
        let pred = ovr.predict(&cross, p).unwrap();
        for r in 0..p {
            let row = &dec[r * k..(r + 1) * k];
            assert!(row.iter().all(|&v| v <= row[pred[r]]));
        }
    }

    #[test]
    fn agreement_counts() {
        assert_eq!(agreement(&[0, 1, 2, 2], &[0, 1, 1, 2]), 0.75);
        assert_eq!(agreement(&[3], &[3]), 1.0);
        assert!(agreement(&[], &[]).is_nan());
    }

    #[test]
    fn params_defaults_and_serde() {
        let p = SvmParams::new();
        assert_eq!((p.c, p.tol, p.max_iter), (1.0, 1e-3, 1_000_000));
        let q: SvmParams = serde_json::from_str(r#"{"c": 10.0}"#).unwrap();
        assert_eq!(q, SvmParams::new().c(10.0));
        let r = SvmParams::new().c(2.0).tol(1e-5).max_iter(7);
        assert_eq!(serde_json::from_str::<SvmParams>(&serde_json::to_string(&r).unwrap()).unwrap(), r);
    }

    #[test]
    fn errors_are_values_not_panics() {
        let g = golden("overlap_rbf");
        let m = g.m;
        let y = ovr_y(&g.labels, 1);
        // Non-convergence.
        match SvmParams::new().max_iter(1).fit_binary(&g.gram, &y, m) {
            Err(Error::Numerical(s)) => {
                assert!(s.contains("did not converge within 1 iterations"), "{s}");
                assert!(s.contains("max KKT violation"), "{s}");
            }
            other => panic!("expected non-convergence, got {other:?}"),
        }
        // Single class.
        assert!(matches!(SvmParams::new().fit_binary(&g.gram, &vec![1.0; m], m), Err(Error::Data(_))));
        let labels0 = vec![0usize; m];
        let blocks = repeat(&g.gram, 2);
        assert!(matches!(SvmParams::new().fit_ovr(&blocks, &labels0, m, 2), Err(Error::Data(_))));
        // Labels out of range, labels not ±1.
        let mut bad = g.labels.clone();
        bad[3] = 3;
        assert!(matches!(SvmParams::new().fit_ovr(&repeat(&g.gram, 3), &bad, m, 3), Err(Error::Data(_))));
        let mut y0 = y.clone();
        y0[5] = 0.0;
        assert!(matches!(SvmParams::new().fit_binary(&g.gram, &y0, m), Err(Error::Data(_))));
        // NaN in the Gram, NaN in C.
        let mut gram = g.gram.clone();
        gram[7] = f64::NAN;
        assert!(matches!(SvmParams::new().fit_binary(&gram, &y, m), Err(Error::Data(_))));
        assert!(matches!(SvmParams::new().c(f64::NAN).fit_binary(&g.gram, &y, m), Err(Error::Config(_))));
        assert!(matches!(SvmParams::new().c(0.0).fit_binary(&g.gram, &y, m), Err(Error::Config(_))));
        assert!(matches!(SvmParams::new().tol(-1.0).fit_binary(&g.gram, &y, m), Err(Error::Config(_))));
        // Asymmetric Gram (beyond 1e-10 relative), and within it (accepted).
        let mut gram = g.gram.clone();
        gram[m + 4] += 1e-6;
        assert!(
            matches!(SvmParams::new().fit_binary(&gram, &y, m), Err(Error::Data(s)) if s.contains("not symmetric"))
        );
        let mut gram = g.gram.clone();
        gram[m + 4] += 1e-13;
        assert!(SvmParams::new().fit_binary(&gram, &y, m).is_ok());
        for (i, j) in [(5, 50), (50, 5), (40, 59)] {
            // off the diagonal tiles, both triangles
            let mut gram = g.gram.clone();
            gram[i * m + j] -= 1e-7;
            match SvmParams::new().fit_binary(&gram, &y, m) {
                Err(Error::Data(s)) => assert!(s.contains("not symmetric"), "{s}"),
                other => panic!("asymmetry at ({i},{j}) not caught: {other:?}"),
            }
        }
        // ±inf anywhere, including the tail after the 8-lane chunks (M = 3: 9 entries).
        let mut gram = g.gram.clone();
        gram[m * m - 1] = f64::NEG_INFINITY;
        assert!(matches!(SvmParams::new().fit_binary(&gram, &y, m), Err(Error::Data(_))));
        let small = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, f64::INFINITY];
        assert!(
            matches!(SvmParams::new().fit_binary(&small, &[1.0, -1.0, 1.0], 3), Err(Error::Data(s)) if s.contains("(2, 2)"))
        );
        // Shapes.
        assert!(matches!(SvmParams::new().fit_binary(&g.gram, &y, m - 1), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(SvmParams::new().fit_binary(&g.gram, &y[1..], m), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(SvmParams::new().fit_binary(&[], &[], 0), Err(Error::Data(_))));
        assert!(matches!(SvmParams::new().fit_ovr(&g.gram, &g.labels, m, 3), Err(Error::ShapeMismatch { .. })));
        let svm = SvmParams::new().fit_binary(&g.gram, &y, m).unwrap();
        assert!(matches!(svm.decision(&g.cross, g.p + 1), Err(Error::ShapeMismatch { .. })));
        let mut cross = g.cross.clone();
        cross[0] = f64::INFINITY;
        assert!(matches!(svm.decision(&cross, g.p), Err(Error::Data(_))));
        let ovr = SvmParams::new().fit_ovr(&repeat(&g.gram, 3), &g.labels, m, 3).unwrap();
        assert!(matches!(ovr.predict(&g.cross, g.p), Err(Error::ShapeMismatch { .. })));
    }

    /// splitmix64, mirrored by `splitmix64` in tests/data/svm/make_golden.py.
    fn splitmix64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The M = 3000 speed problem, mirrored by `bench_problem` in make_golden.py.
    fn bench_problem(m: usize, seed: u64, gamma: f64) -> (Vec<f64>, Vec<f64>) {
        let unit = |v: u64| (v >> 11) as f64 * 2f64.powi(-53);
        let mut s = seed;
        let mut x = vec![0.0; 2 * m];
        let mut y = vec![0.0; m];
        for i in 0..m {
            let (a, b, u) = (splitmix64(&mut s), splitmix64(&mut s), splitmix64(&mut s));
            x[2 * i] = unit(a);
            x[2 * i + 1] = unit(b);
            let inside = (x[2 * i] - 0.5).powi(2) + (x[2 * i + 1] - 0.5).powi(2) < 0.09;
            let flip = unit(u) < 0.1;
            y[i] = if inside != flip { 1.0 } else { -1.0 };
        }
        (rbf_gram(&x, &x, 2, gamma), y)
    }

    #[test]
    #[ignore = "timing; run with --release -- --ignored --nocapture"]
    fn speed_m3000_rbf() {
        let m = 3000;
        let (gram, y) = bench_problem(m, 42, 10.0);
        let params = SvmParams::new();
        let mut times = Vec::new();
        let mut svm = None;
        for _ in 0..5 {
            let t0 = std::time::Instant::now();
            svm = Some(params.fit_binary(&gram, &y, m).unwrap());
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let svm = svm.unwrap();
        let t0 = std::time::Instant::now();
        check_gram(&gram, m, "bench").unwrap();
        let t_check = t0.elapsed().as_secs_f64();
        let t0 = std::time::Instant::now();
        let s2 = solve(&gram, &y, m, &params).unwrap();
        let t_solve = t0.elapsed().as_secs_f64();
        assert_eq!(s2, svm);
        println!("M={m}: validation {t_check:.4} s, SMO {t_solve:.4} s");
        println!(
            "M={m} RBF fit_binary: median {:.4} s (min {:.4} s, includes the O(M²) symmetry check), \
             iterations {}, nSV {}, b {:.6}",
            times[2],
            times[0],
            svm.iterations,
            svm.support.len(),
            svm.intercept
        );
    }
}
