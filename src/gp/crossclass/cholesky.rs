//! The Cholesky route of a cross-class fit (`KxkSolver::Cholesky`): no
//! eigendecomposition, one Cholesky of `B(δ) = δ I + G` per δ tried.
//!
//! - **Evidence.** `log det(I + G/δ) = log det B(δ) − n log δ` from the factor's diagonal; the
//!   log evidence is concave in `u = log δ` (its second derivative is
//!   `−(δ/2) rᵀK⁺r − ½ Σ_j δ e_j/(δ + e_j)²`), so its maximum is bracketed by walking uphill from a
//!   start and found by Brent's minimisation (parabolic steps, golden-section fallback) to
//!   `|Δu| ≤` `SEARCH_TOL`; each step costs one factorisation.
//! - **Scatter.** `rᵀ K⁺ r` by a Cholesky of `K` (exact where `K` is positive definite in
//!   floating point); where that fails, of `K + τ I` with `τ = 1e-12 · λ_max(K)` (λ_max by power
//!   iteration, `τ` raised tenfold until the factorisation succeeds), recorded in the fit. The
//!   eigen route's pseudo-inverse drops the eigenvalues below `1e-12 · λ_max` instead, so the two
//!   routes agree exactly only where `K` has none.
//! - **Predictive.** `Σ* = k**/δ − Wᵀ W / δ` with `W = L⁻¹ Fᵀ k*` (`L Lᵀ = B(δ)`), one
//!   triangular solve per block of rows: `n²` flops per right-hand side, half of the eigen
//!   route's projection `Uᵀ Fᵀ k*`.
//! - **Validation grid.** The grid's values coarse to fine: every `stride`-th (and the last),
//!   then a golden-section search over the grid's indices between the best coarse value's
//!   neighbours; exact to the whole grid where the validation NLL is unimodal there.
//!
//! Memory: `G`'s lower triangle packed (`n(n+1)/2` values) and one `[n, n]` factor; with the
//! caller's `[M, M, K, K]` Gram, `2.5 n²` values in all (8.0 GB at `n = 20 000`).
//!
//! # Shapes
//! `G` packed by rows, entry `(r, s)`, `s ≤ r`, at `r (r + 1)/2 + s`; the factor `[n, n]`
//! (lower triangle), `n = M K`, index `i K + c`.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch, LltRegularization};
use faer::linalg::triangular_solve::solve_lower_triangular_in_place;
use faer::Mat;
use rayon::prelude::*;

use super::{par, KxkRows};
use crate::error::{Error, Result};

/// The δ search stops when its bracket in `log δ` is this narrow.
pub(crate) const SEARCH_TOL: f64 = 1e-6;
/// The δ search gives up after this many factorisations.
const MAX_EVALS: usize = 60;

/// `G`'s lower triangle packed and the Cholesky factor of `δ I + G` at one δ (module docs).
#[derive(Clone, Debug)]
pub(super) struct CholFactor {
    /// `G`, lower triangle packed by rows. # Shapes `[n (n + 1) / 2]`.
    g: Vec<f64>,
    /// The lower factor of `δ I + G` at `delta` (upper triangle: stale). # Shapes `[n, n]`.
    pub(super) l: Mat<f64>,
    /// The δ the factor is at.
    pub(super) delta: f64,
    /// `log det(δ I + G)` at that δ.
    pub(super) logdet_b: f64,
}

fn packed(r: usize, s: usize) -> usize {
    r * (r + 1) / 2 + s
}

/// Factors the lower triangle of `a` in place (upper triangle ignored). Returns the failing
/// pivot's index on failure.
pub(super) fn cholesky_lower(a: &mut Mat<f64>) -> std::result::Result<(), usize> {
    let n = a.nrows();
    let mut buf = MemBuffer::new(cholesky_in_place_scratch::<f64>(n, par(), Default::default()));
    match cholesky_in_place(a.as_mut(), LltRegularization::default(), par(), MemStack::new(&mut buf), Default::default()) {
        Ok(_) => Ok(()),
        Err(faer::linalg::cholesky::llt::factor::LltError::NonPositivePivot { index }) => Err(index),
    }
}

/// `log det` from a lower Cholesky factor.
pub(super) fn logdet_of(l: &Mat<f64>) -> f64 {
    2.0 * (0..l.nrows()).map(|i| l[(i, i)].ln()).sum::<f64>()
}

/// The symmetrised kernel block `½ (K_ij + K_jiᵀ)` entry `(c, c')` from the `[M, M, K, K]` Gram.
#[inline]
fn ksym(k_train: &[f64], m: usize, k: usize, i: usize, j: usize, c: usize, c2: usize) -> f64 {
    0.5 * (k_train[((i * m + j) * k + c) * k + c2] + k_train[((j * m + i) * k + c2) * k + c])
}

/// `G = Fᵀ K F` packed (module docs), block by block from the Gram: `G_ij = F_iᵀ K_ij F_j` with
/// `K_ij` symmetrised. # Shapes `k_train [M, M, K, K]`, `f [M, K, K]` → `[n (n + 1) / 2]`.
pub(super) fn form_g_packed(k_train: &[f64], f: &[f64], m: usize, k: usize) -> Vec<f64> {
    let n = m * k;
    let kk = k * k;
    let mut g = vec![0.0; n * (n + 1) / 2];
    // Split into the rows of each training point: point i holds rows i K .. (i + 1) K.
    let mut parts: Vec<(usize, &mut [f64])> = Vec::with_capacity(m);
    let mut rest = g.as_mut_slice();
    for i in 0..m {
        let len = packed((i + 1) * k, 0) - packed(i * k, 0);
        let (a, b) = rest.split_at_mut(len);
        parts.push((i, a));
        rest = b;
    }
    parts.into_par_iter().for_each(|(i, out)| {
        let base = packed(i * k, 0);
        let fi = &f[i * kk..(i + 1) * kk];
        let mut tmp = vec![0.0; kk];
        for j in 0..=i {
            let fj = &f[j * kk..(j + 1) * kk];
            // tmp[c][b] = Σ_c' K_ij[c][c'] F_j[c'][b].
            for c in 0..k {
                for b in 0..k {
                    tmp[c * k + b] = (0..k).map(|c2| ksym(k_train, m, k, i, j, c, c2) * fj[c2 * k + b]).sum();
                }
            }
            for a in 0..k {
                let r = i * k + a;
                let top = if j == i { a + 1 } else { k };
                for b in 0..top {
                    out[packed(r, j * k + b) - base] = (0..k).map(|c| fi[c * k + a] * tmp[c * k + b]).sum();
                }
            }
        }
    });
    g
}

/// Fills the lower triangle of `out` with `G + δ I` from the packed `G`.
fn fill_shifted(g: &[f64], delta: f64, out: &mut Mat<f64>) {
    let n = out.nrows();
    out.par_col_chunks_mut(1).enumerate().for_each(|(s, mut col)| {
        for r in s..n {
            col[(r, 0)] = g[packed(r, s)] + if r == s { delta } else { 0.0 };
        }
    });
}

/// `rᵀ K⁺ r` (module docs): by a Cholesky of the symmetrised `K`, or of `K + τ I` where that
/// fails. Returns `(rᵀ (K + τ I)⁻¹ r, τ)`. Uses `buf` `[n, n]` as work space.
pub(super) fn scatter(k_train: &[f64], r: &[f64], m: usize, k: usize, buf: &mut Mat<f64>) -> Result<(f64, f64)> {
    let n = m * k;
    let fill = |buf: &mut Mat<f64>, tau: f64| {
        buf.par_col_chunks_mut(1).enumerate().for_each(|(s, mut col)| {
            for rr in s..n {
                col[(rr, 0)] = ksym(k_train, m, k, rr / k, s / k, rr % k, s % k) + if rr == s { tau } else { 0.0 };
            }
        });
    };
    let mut tau = 0.0;
    fill(buf, tau);
    if cholesky_lower(buf).is_err() {
        let top = lambda_max(k_train, m, k);
        tau = super::PINV_REL * top;
        loop {
            fill(buf, tau);
            if cholesky_lower(buf).is_ok() {
                break;
            }
            tau *= 10.0;
            if tau > 1e-4 * top {
                return Err(Error::Numerical(format!("cross-class function-space Laplace: K + τ I is not positive definite up to τ = {tau:e} (λ_max {top:e})")));
            }
        }
    }
    let mut y = Mat::from_fn(n, 1, |i, _| r[i]);
    solve_lower_triangular_in_place(buf.as_ref(), y.as_mut(), par());
    Ok(((0..n).map(|i| y[(i, 0)] * y[(i, 0)]).sum(), tau))
}

/// The largest eigenvalue of the symmetrised `K` by power iteration (relative change `1e-6`, at
/// most 500 products; from the all-ones start, which no PSD kernel's top eigenvector is
/// orthogonal to unless it has negative entries there — a lower estimate only raises `τ`'s
/// retries).
fn lambda_max(k_train: &[f64], m: usize, k: usize) -> f64 {
    let n = m * k;
    let mut x = vec![1.0 / (n as f64).sqrt(); n];
    let mut est = 0.0f64;
    for _ in 0..500 {
        let y: Vec<f64> = (0..n).into_par_iter().map(|rr| (0..n).map(|s| ksym(k_train, m, k, rr / k, s / k, rr % k, s % k) * x[s]).sum()).collect();
        let norm = y.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm == 0.0 {
            return 0.0;
        }
        let done = (norm - est).abs() <= 1e-6 * norm;
        est = norm;
        x = y.into_iter().map(|v| v / norm).collect();
        if done {
            break;
        }
    }
    est
}

impl CholFactor {
    /// `G` packed, with a factor buffer (not yet factored: `delta` is NaN).
    pub(super) fn new(g: Vec<f64>, buf: Mat<f64>) -> Self {
        CholFactor { g, l: buf, delta: f64::NAN, logdet_b: f64::NAN }
    }

    /// The system's size n.
    pub(super) fn n(&self) -> usize {
        self.l.nrows()
    }

    /// Factors `δ I + G` (a no-op at the δ already factored).
    pub(super) fn factor(&mut self, delta: f64) -> Result<()> {
        if delta == self.delta {
            return Ok(());
        }
        if self.g.is_empty() {
            return Err(Error::Numerical(format!("cross-class function-space Laplace: G was released after the δ searches; cannot refactor at δ = {delta:e}")));
        }
        fill_shifted(&self.g, delta, &mut self.l);
        self.delta = f64::NAN;
        cholesky_lower(&mut self.l).map_err(|i| Error::Numerical(format!("cross-class function-space Laplace: δ I + G (δ = {delta:e}) is not positive definite (pivot {i})")))?;
        self.delta = delta;
        self.logdet_b = logdet_of(&self.l);
        Ok(())
    }

    /// Frees `G` (`n (n + 1) / 2` values): the factor at its δ is all a prediction needs;
    /// [`Self::factor`] at another δ is an error afterwards.
    pub(super) fn release_g(&mut self) {
        self.g = Vec::new();
    }

    /// `log det(I + G/δ)` at the factored δ.
    pub(super) fn logdet_ratio(&self) -> f64 {
        self.logdet_b - self.n() as f64 * self.delta.ln()
    }

    /// `tr G` (the δ search's lower bound).
    fn trace(&self) -> f64 {
        (0..self.n()).map(|i| self.g[packed(i, i)]).sum()
    }

    /// `W = L⁻¹ A` in place. # Shapes `a [n, R]`.
    pub(super) fn solve_in_place(&self, a: &mut Mat<f64>) {
        solve_lower_triangular_in_place(self.l.as_ref(), a.as_mut(), par());
    }

    /// δ maximising `evidence(δ) = log_lik − (δ/2) rkr − ½ log det(I + G/δ)` (module docs), left
    /// factored. Returns `(δ, factorisations)` (the search's, and the refactorisation at the
    /// maximiser where it was not the last one evaluated).
    pub(super) fn evidence_argmax(&mut self, log_lik: f64, rkr: f64) -> Result<(f64, usize)> {
        let n = self.n() as f64;
        // Bounds on the maximiser: d/du = ½ (−δ rkr + Σ e/(δ + e)), Σ e/(δ + e) ∈ [T/(δ + T), n).
        let t = self.trace();
        if rkr <= 0.0 || t <= 0.0 {
            // No scatter: the evidence rises with δ forever (the eigen route's bisection stops at 1e30).
            let d = if rkr <= 0.0 { 1e30 } else { 1e-30 };
            self.factor(d)?;
            return Ok((d, 1));
        }
        let hi = (n / rkr).ln();
        let lo = ((-t + (t * t + 4.0 * t / rkr).sqrt()) / 2.0).ln().min(hi);
        let mut evals = 0usize;
        let mut phi = |me: &mut Self, u: f64| -> Result<f64> {
            evals += 1;
            if evals > MAX_EVALS {
                return Err(Error::Numerical(format!("cross-class function-space Laplace: the evidence search took more than {MAX_EVALS} factorisations")));
            }
            me.factor(u.exp())?;
            Ok(log_lik - 0.5 * me.delta * rkr - 0.5 * me.logdet_ratio())
        };
        // Brent's minimisation of −φ on [lo, hi] (φ concave: one maximum there).
        let (x, _) = brent_max(|u| phi(self, u), lo, hi, SEARCH_TOL)?;
        let d = x.exp();
        // The maximiser is an evaluated point, but not always the last one: then once more.
        let again = usize::from(d != self.delta);
        self.factor(d)?;
        Ok((d, evals + again))
    }
}

/// Brent's minimisation (Numerical Recipes' `brent`) of `−φ` on `[a, b]`: the maximiser and the
/// maximum, to `|Δx| ≤ tol` (absolute) — parabolic steps through the three best points, golden
/// sections where they do not shrink the bracket.
pub(crate) fn brent_max(mut phi: impl FnMut(f64) -> Result<f64>, a: f64, b: f64, tol: f64) -> Result<(f64, f64)> {
    const CGOLD: f64 = 0.381_966_011_250_105_1;
    let (mut a, mut b) = (a.min(b), a.max(b));
    let mut x = a + CGOLD * (b - a);
    let (mut w, mut v) = (x, x);
    let mut fx = -phi(x)?;
    let (mut fw, mut fv) = (fx, fx);
    let (mut d, mut e) = (0.0f64, 0.0f64);
    for _ in 0..200 {
        let xm = 0.5 * (a + b);
        let tol1 = tol * 0.5 + 1e-12 * x.abs();
        let tol2 = 2.0 * tol1;
        if (x - xm).abs() <= tol2 - 0.5 * (b - a) {
            return Ok((x, -fx));
        }
        let mut golden = true;
        if e.abs() > tol1 {
            let r = (x - w) * (fx - fv);
            let mut q = (x - v) * (fx - fw);
            let mut p = (x - v) * q - (x - w) * r;
            q = 2.0 * (q - r);
            if q > 0.0 {
                p = -p;
            }
            q = q.abs();
            let etemp = e;
            if p.abs() < (0.5 * q * etemp).abs() && p > q * (a - x) && p < q * (b - x) {
                e = d;
                d = p / q;
                let u = x + d;
                if u - a < tol2 || b - u < tol2 {
                    d = tol1.copysign(xm - x);
                }
                golden = false;
            }
        }
        if golden {
            e = if x >= xm { a - x } else { b - x };
            d = CGOLD * e;
        }
        let u = if d.abs() >= tol1 { x + d } else { x + tol1.copysign(d) };
        let fu = -phi(u)?;
        if fu <= fx {
            if u >= x {
                a = x;
            } else {
                b = x;
            }
            (v, fv, w, fw, x, fx) = (w, fw, x, fx, u, fu);
        } else {
            if u < x {
                a = u;
            } else {
                b = u;
            }
            if fu <= fw || w == x {
                (v, fv, w, fw) = (w, fw, u, fu);
            } else if fu <= fv || v == x || v == w {
                (v, fv) = (u, fu);
            }
        }
    }
    Ok((x, -fx))
}

/// The indices of a `points`-value grid a coarse-to-fine search visits (module docs), given the
/// score of an index (lower is better). Returns the visited `(index, score)` sorted by index.
pub(crate) fn coarse_to_fine(points: usize, stride: usize, mut score: impl FnMut(usize) -> Result<f64>) -> Result<Vec<(usize, f64)>> {
    let stride = stride.max(1);
    let mut seen: std::collections::BTreeMap<usize, f64> = std::collections::BTreeMap::new();
    let mut eval = |i: usize, seen: &mut std::collections::BTreeMap<usize, f64>| -> Result<f64> {
        if let Some(&v) = seen.get(&i) {
            return Ok(v);
        }
        let v = score(i)?;
        seen.insert(i, v);
        Ok(v)
    };
    let mut coarse: Vec<usize> = (0..points).step_by(stride).collect();
    if coarse.last() != Some(&(points - 1)) {
        coarse.push(points - 1);
    }
    for &i in &coarse {
        eval(i, &mut seen)?;
    }
    let best = |seen: &std::collections::BTreeMap<usize, f64>| seen.iter().filter(|v| v.1.is_finite()).min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0))).map(|(&i, _)| i);
    let Some(b) = best(&seen) else {
        return Ok(seen.into_iter().collect());
    };
    // Golden-section search over the integers of [b − stride, b + stride].
    let (mut lo, mut hi) = (b.saturating_sub(stride), (b + stride).min(points - 1));
    while hi - lo > 2 {
        let m1 = lo + ((hi - lo) as f64 * 0.381_966_011_250_105_1).round() as usize;
        let m2 = hi - (m1 - lo);
        let (m1, m2) = if m1 < m2 { (m1, m2) } else { (lo + (hi - lo) / 3, hi - (hi - lo) / 3) };
        let (f1, f2) = (eval(m1, &mut seen)?, eval(m2, &mut seen)?);
        if f1 <= f2 {
            hi = m2;
        } else {
            lo = m1;
        }
    }
    for i in lo..=hi {
        eval(i, &mut seen)?;
    }
    Ok(seen.into_iter().collect())
}

/// `Σ*` at the factored δ for rows `q0..q1` from `A = Fᵀ k*` (solved in place). # Shapes
/// `a [n, (q1 − q0) K]`, `out [(q1 − q0), K, K]`.
pub(super) fn covariances_block(fac: &CholFactor, rows: &KxkRows<'_>, a: &mut Mat<f64>, k: usize, q0: usize, out: &mut [f64]) {
    fac.solve_in_place(a);
    let delta = fac.delta;
    let n = fac.n();
    out.par_chunks_mut(k * k).enumerate().for_each(|(dq, o)| {
        let q = q0 + dq;
        for c in 0..k {
            let wa = a.col(dq * k + c);
            for b in 0..=c {
                let wb = a.col(dq * k + b);
                let red: f64 = (0..n).map(|j| wa[j] * wb[j]).sum::<f64>() / delta;
                let prior = 0.5 * (rows.k_self[(q * k + c) * k + b] + rows.k_self[(q * k + b) * k + c]) / delta;
                o[c * k + b] = prior - red;
                o[b * k + c] = prior - red;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brent_finds_the_maximum_of_a_concave_function() {
        let mut calls = 0;
        let (x, f) = brent_max(
            |u| {
                calls += 1;
                Ok(-(u - 1.3).powi(2) * 2.0 - (u - 1.3).exp() + 3.0 * u)
            },
            -5.0,
            8.0,
            1e-8,
        )
        .unwrap();
        // A concave function; its stationary point by bisection on the derivative.
        let g = |u: f64| -4.0 * (u - 1.3) - (u - 1.3).exp() + 3.0;
        let (mut lo, mut hi) = (-5.0, 8.0);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if g(mid) > 0.0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        assert!((x - lo).abs() < 1e-7, "{x} vs {lo}");
        assert!(f.is_finite());
        assert!(calls < 20, "{calls} evaluations");
    }

    #[test]
    fn coarse_to_fine_finds_the_best_index_of_a_unimodal_score() {
        for best in [0usize, 1, 5, 11, 37, 50, 88, 98, 99] {
            let visited = coarse_to_fine(100, 11, |i| Ok(((i as f64) - best as f64).abs().sqrt() + 0.01 * i as f64)).unwrap();
            let (i, _) = visited.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
            let want = (0..100).min_by(|&a, &b| (((a as f64) - best as f64).abs().sqrt() + 0.01 * a as f64).total_cmp(&(((b as f64) - best as f64).abs().sqrt() + 0.01 * b as f64))).unwrap();
            assert_eq!(i, want, "best {best}");
            assert!(visited.len() <= 22, "best {best}: {} evaluations", visited.len());
        }
    }

    #[test]
    fn packed_g_is_the_dense_product() {
        use rand::{Rng, SeedableRng};
        let (m, k) = (4, 3);
        let n = m * k;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let phi: Vec<f64> = (0..n * 7).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut kt = vec![0.0; n * n];
        for i in 0..m {
            for j in 0..m {
                for c in 0..k {
                    for c2 in 0..k {
                        kt[((i * m + j) * k + c) * k + c2] = (0..7).map(|t| phi[(i * k + c) * 7 + t] * phi[(j * k + c2) * 7 + t]).sum();
                    }
                }
            }
        }
        let f: Vec<f64> = (0..m * k * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let g = form_g_packed(&kt, &f, m, k);
        for r in 0..n {
            for s in 0..=r {
                let (i, a, j, b) = (r / k, r % k, s / k, s % k);
                let mut want = 0.0;
                for c in 0..k {
                    for c2 in 0..k {
                        want += f[(i * k + c) * k + a] * kt[((i * m + j) * k + c) * k + c2] * f[(j * k + c2) * k + b];
                    }
                }
                assert!((g[packed(r, s)] - want).abs() < 1e-12, "({r}, {s})");
            }
        }
    }
}
