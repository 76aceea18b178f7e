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
mod tests;
