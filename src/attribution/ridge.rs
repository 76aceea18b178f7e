//! The kernel-regression ("representer") solve shared by TRAK and its kernel counterparts:
//! `τ(λ) = k(x, X)(K + λI)⁻¹` in kernel form, or `φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ` in feature form
//! (equal when `K = ΦΦᵀ`, `k(x, X) = φ(x)Φᵀ`), through one eigendecomposition, so a whole ridge
//! grid costs one GEMM per value. The ridge is relative: `λ = λ_rel · tr(K)/M` (the mean
//! eigenvalue of the `M × M` Gram), which makes it independent of the kernel's and the
//! projection's scale.

use faer::{Mat, MatRef, Side};

use crate::linalg::gemm;
use crate::error::{Error, Result};

/// One factored ridge regression, `τ(λ) = A diag(1/(s + λ)) Bᵀ`.
///
/// # Shapes
/// `A [P, r]`, `B [M, r]`, `s [r]`; [`Ridge::apply`] returns `[P, M]`.
#[derive(Clone, Debug)]
pub struct Ridge {
    a: Vec<f64>,
    b: Vec<f64>,
    s: Vec<f64>,
    p: usize,
    m: usize,
    mean_eig: f64,
}

fn eigen(k: &[f64], n: usize, what: &str) -> Result<(Vec<f64>, Vec<f64>)> {
    let mat = MatRef::from_row_major_slice(k, n, n);
    let sym = Mat::from_fn(n, n, |i, j| 0.5 * (mat[(i, j)] + mat[(j, i)]));
    let evd = sym.self_adjoint_eigen(Side::Lower).map_err(|e| Error::Numerical(format!("{what}: eigendecomposition failed: {e:?}")))?;
    let s: Vec<f64> = evd.S().column_vector().iter().map(|v| v.max(0.0)).collect();
    let u = evd.U();
    let v: Vec<f64> = (0..n * n).map(|q| u[(q / n, q % n)]).collect(); // row-major [n, n]
    Ok((s, v))
}

impl Ridge {
    /// Kernel form from `k(x, X)` and the symmetric `K(X, X)`.
    ///
    /// # Shapes
    /// `kx [P, M]`, `kk [M, M]`.
    pub fn kernel(kx: &[f64], kk: &[f64], m: usize) -> Result<Ridge> {
        if m == 0 || kx.len() % m != 0 || kk.len() != m * m {
            return Err(Error::ShapeMismatch { what: "ridge: k(x, X) [P, M], K [M, M]".into(), expected: vec![m, m], got: vec![kx.len(), kk.len()] });
        }
        let p = kx.len() / m;
        let (s, v) = eigen(kk, m, "ridge: K(X, X)")?;
        let mut a = vec![0.0; p * m];
        gemm(&mut a, kx, false, &v, false, (p, m, m), 1.0, false);
        let mean_eig = (0..m).map(|i| kk[i * m + i]).sum::<f64>() / m as f64;
        Ok(Ridge { a, b: v, s, p, m, mean_eig })
    }

    /// Feature form from `φ(x)` and `Φ`.
    ///
    /// # Shapes
    /// `fx [P, D]`, `ff [M, D]`.
    pub fn features(fx: &[f64], ff: &[f64], dim: usize) -> Result<Ridge> {
        if dim == 0 || fx.len() % dim != 0 || ff.len() % dim != 0 {
            return Err(Error::ShapeMismatch { what: "ridge: φ(x) [P, D], Φ [M, D]".into(), expected: vec![dim], got: vec![fx.len(), ff.len()] });
        }
        let (p, m) = (fx.len() / dim, ff.len() / dim);
        let mut ftf = vec![0.0; dim * dim];
        gemm(&mut ftf, ff, true, ff, false, (dim, dim, m), 1.0, false);
        let (s, v) = eigen(&ftf, dim, "ridge: ΦᵀΦ")?;
        let mut a = vec![0.0; p * dim];
        gemm(&mut a, fx, false, &v, false, (p, dim, dim), 1.0, false);
        let mut b = vec![0.0; m * dim];
        gemm(&mut b, ff, false, &v, false, (m, dim, dim), 1.0, false);
        let mean_eig = (0..dim).map(|i| ftf[i * dim + i]).sum::<f64>() / m as f64;
        Ok(Ridge { a, b, s, p, m, mean_eig })
    }

    /// `tr(K)/M`, the unit of the relative ridge.
    pub fn mean_eigenvalue(&self) -> f64 {
        self.mean_eig
    }

    /// `τ` at the relative ridge `λ_rel` (`λ = λ_rel · tr(K)/M`); at `λ = 0` the pseudo-inverse
    /// (eigenvalues below `1e-12 · max` dropped). # Shapes `[P, M]`.
    pub fn apply(&self, lambda_rel: f64) -> Vec<f64> {
        let r = self.s.len();
        let lambda = lambda_rel * self.mean_eig;
        let smax = self.s.iter().cloned().fold(0.0, f64::max);
        let w: Vec<f64> = self.s.iter().map(|&s| if s + lambda > 1e-12 * smax { 1.0 / (s + lambda) } else { 0.0 }).collect();
        let aw: Vec<f64> = self.a.iter().enumerate().map(|(q, v)| v * w[q % r]).collect();
        let mut out = vec![0.0; self.p * self.m];
        gemm(&mut out, &aw, false, &self.b, true, (self.p, self.m, r), 1.0, false);
        out
    }
}

/// `τ[:, i] *= q[i]`: TRAK's and the representers' `1 − p_i` reweighting of the columns.
/// # Shapes `τ [P, M]`, `q [M]`.
pub fn scale_columns(tau: &mut [f64], q: &[f64]) {
    let m = q.len();
    tau.iter_mut().enumerate().for_each(|(j, v)| *v *= q[j % m]);
}

/// `1 − p_{y_i}(x_i)`, as `Σ_{c≠y} p_c`. # Shapes `logp [M, K]` → `[M]`.
pub fn one_minus_p(logp: &[f64], labels: &[usize], k: usize) -> Vec<f64> {
    labels.iter().enumerate().map(|(i, &y)| (0..k).filter(|&c| c != y).map(|c| logp[i * k + c].exp()).sum()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernel and feature forms agree with each other and with a dense solve.
    #[test]
    fn kernel_and_feature_forms_agree_with_a_direct_solve() {
        let (p, m, d) = (3, 5, 4);
        let fx: Vec<f64> = (0..p * d).map(|i| (i as f64 * 0.7).sin()).collect();
        let ff: Vec<f64> = (0..m * d).map(|i| (i as f64 * 0.3).cos()).collect();
        let mut kx = vec![0.0; p * m];
        gemm(&mut kx, &fx, false, &ff, true, (p, m, d), 1.0, false);
        let mut kk = vec![0.0; m * m];
        gemm(&mut kk, &ff, false, &ff, true, (m, m, d), 1.0, false);
        let rk = Ridge::kernel(&kx, &kk, m).unwrap();
        let rf = Ridge::features(&fx, &ff, d).unwrap();
        assert!((rk.mean_eigenvalue() - rf.mean_eigenvalue()).abs() < 1e-12);
        let lam = 0.3;
        let (tk, tf) = (rk.apply(lam), rf.apply(lam));
        // Direct: solve (K + λI) Y = k(x, X)ᵀ with nalgebra.
        let l = lam * rk.mean_eigenvalue();
        let a = nalgebra::DMatrix::from_fn(m, m, |i, j| kk[i * m + j] + if i == j { l } else { 0.0 });
        let rhs = nalgebra::DMatrix::from_fn(m, p, |i, j| kx[j * m + i]);
        let y = a.lu().solve(&rhs).unwrap();
        for q in 0..p * m {
            let want = y[(q % m, q / m)];
            assert!((tk[q] - want).abs() < 1e-10 && (tf[q] - want).abs() < 1e-10, "{} {} {want}", tk[q], tf[q]);
        }
    }
}
