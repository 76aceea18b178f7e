//! Influence functions with the damped Gauss–Newton matrix (Koh & Liang 2017 with the GGN in
//! place of the Hessian): `τ(x, i) = g(x)ᵀ (H + λI)⁻¹ g_i`, `g = ∇_w log p_y` at `w_N`, the
//! effect on `log p_{y_x}(x)` of up-weighting training point `i` (up to the positive factor
//! `1/M`), with `H = (1/M) Σ_i J_iᵀ (diag p_i − p_i p_iᵀ) J_i` the GGN of the mean training loss.
//!
//! Two solvers: [`Ggn::cg`], conjugate gradients on the matrix-free GGN–vector product (the
//! method as the issue states it), and [`FunctionSpace`], the same inverse through Woodbury,
//! `(ZᵀZ/M + λI)⁻¹ = (I − Zᵀ(ZZᵀ + MλI)⁻¹Z)/λ`, with `Z`'s rows `√σ_a J_iᵀ v_a` from the
//! eigenpairs of each point's softmax Hessian: exact, one Cholesky per damping, affordable for
//! the whole damping sweep. The tests hold both to a dense parameter-space solve.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor::{cholesky_in_place, cholesky_in_place_scratch, LltRegularization};
use faer::linalg::triangular_solve::{solve_lower_triangular_in_place, solve_upper_triangular_in_place};
use faer::{Mat, Par};

use super::grads::ScalarGrads;
use super::mlp::{Forward, Mlp1};
use crate::linalg::gemm;
use crate::error::{Error, Result};

/// The GGN of the mean cross-entropy at one network over the training rows, as a matrix-free
/// product.
///
/// # Shapes
/// `x [M, d]`; vectors are flat parameters `[W]` in the crate's order.
pub struct Ggn<'a> {
    net: &'a Mlp1,
    x: &'a [f64],
    fwd: Forward,
    m: usize,
}

/// What [`Ggn::cg`] returns.
#[derive(Clone, Debug)]
pub struct CgSolution {
    /// `(H + λI)⁻¹ b`. # Shapes `[W]`.
    pub x: Vec<f64>,
    /// Iterations used.
    pub iterations: usize,
    /// `‖b − (H + λI)x‖ / ‖b‖` at the end.
    pub rel_residual: f64,
}

impl<'a> Ggn<'a> {
    /// The GGN of `net` on the rows `x`.
    pub fn new(net: &'a Mlp1, x: &'a [f64]) -> Ggn<'a> {
        let fwd = net.forward(x);
        Ggn { net, x, fwd, m: x.len() / net.d }
    }

    /// The logit Jacobian–vector products `J_i v` at every training row. # Shapes `v [W]` →
    /// `[M, K]`.
    pub fn jvp(&self, v: &[f64]) -> Vec<f64> {
        let (d, h, k, m) = (self.net.d, self.net.h, self.net.k, self.m);
        let (v1, rest) = v.split_at(h * d);
        let (vb1, rest) = rest.split_at(h);
        let (v2, vb2) = rest.split_at(k * h);
        // dz = W2 (mask ⊙ (V1 x + vb1)) + V2 h + vb2.
        let mut t = vec![0.0; m * h];
        gemm(&mut t, self.x, false, v1, true, (m, h, d), 1.0, false);
        for (i, row) in t.chunks_exact_mut(h).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = if self.fwd.pre[i * h + j] > 0.0 { *v + vb1[j] } else { 0.0 };
            }
        }
        let mut dz = vec![0.0; m * k];
        gemm(&mut dz, &t, false, &self.net.w2, true, (m, k, h), 1.0, false);
        gemm(&mut dz, &self.fwd.hid, false, v2, true, (m, k, h), 1.0, true);
        for row in dz.chunks_exact_mut(k) {
            row.iter_mut().zip(vb2).for_each(|(a, b)| *a += b);
        }
        dz
    }

    /// `H v`. # Shapes `v [W]` → `[W]`.
    pub fn hvp(&self, v: &[f64]) -> Vec<f64> {
        let (d, h, k, m) = (self.net.d, self.net.h, self.net.k, self.m);
        let mut dz = self.jvp(v);
        // r_i = (diag p − p pᵀ) dz_i / M.
        for (i, row) in dz.chunks_exact_mut(k).enumerate() {
            let p: Vec<f64> = self.fwd.logp[i * k..(i + 1) * k].iter().map(|l| l.exp()).collect();
            let pd: f64 = p.iter().zip(row.iter()).map(|(a, b)| a * b).sum();
            row.iter_mut().zip(&p).for_each(|(a, pc)| *a = pc * (*a - pd) / m as f64);
        }
        // Jᵀ r.
        let mut out = vec![0.0; v.len()];
        let (o1, orest) = out.split_at_mut(h * d);
        let (ob1, orest) = orest.split_at_mut(h);
        let (o2, ob2) = orest.split_at_mut(k * h);
        gemm(o2, &dz, true, &self.fwd.hid, false, (k, h, m), 1.0, false);
        for c in 0..k {
            ob2[c] = (0..m).map(|i| dz[i * k + c]).sum();
        }
        let mut dp = vec![0.0; m * h];
        gemm(&mut dp, &dz, false, &self.net.w2, false, (m, h, k), 1.0, false);
        dp.iter_mut().zip(&self.fwd.pre).for_each(|(g, &p)| {
            if p <= 0.0 {
                *g = 0.0
            }
        });
        gemm(o1, &dp, true, self.x, false, (h, d, m), 1.0, false);
        for j in 0..h {
            ob1[j] = (0..m).map(|i| dp[i * h + j]).sum();
        }
        out
    }

    /// Conjugate gradients for `(H + λI) x = b`, from `x = 0`, until `‖r‖ ≤ tol ‖b‖` or
    /// `max_iter` iterations.
    ///
    /// Errors: [`Error::Numerical`] when the damping is not positive or a curvature `pᵀ(H+λI)p`
    /// is not positive (cannot happen for a PSD `H` and `λ > 0` unless the numbers are not finite).
    pub fn cg(&self, b: &[f64], damping: f64, tol: f64, max_iter: usize) -> Result<CgSolution> {
        if !(damping > 0.0) {
            return Err(Error::Numerical(format!("CG needs a positive damping, got {damping}")));
        }
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let bn = dot(b, b).sqrt();
        let mut x = vec![0.0; b.len()];
        if bn == 0.0 {
            return Ok(CgSolution { x, iterations: 0, rel_residual: 0.0 });
        }
        let mut r = b.to_vec();
        let mut p = r.clone();
        let mut rr = dot(&r, &r);
        let mut it = 0;
        while it < max_iter && rr.sqrt() > tol * bn {
            let mut ap = self.hvp(&p);
            ap.iter_mut().zip(&p).for_each(|(a, q)| *a += damping * q);
            let pap = dot(&p, &ap);
            if !(pap > 0.0) {
                return Err(Error::Numerical(format!("CG: curvature pᵀ(H + λI)p = {pap} at iteration {it}")));
            }
            let alpha = rr / pap;
            x.iter_mut().zip(&p).for_each(|(a, q)| *a += alpha * q);
            r.iter_mut().zip(&ap).for_each(|(a, q)| *a -= alpha * q);
            let rr_new = dot(&r, &r);
            let beta = rr_new / rr;
            p.iter_mut().zip(&r).for_each(|(a, q)| *a = q + beta * *a);
            rr = rr_new;
            it += 1;
        }
        Ok(CgSolution { x, iterations: it, rel_residual: rr.sqrt() / bn })
    }
}

/// The rows of the GGN's factor `Z` (`H = ZᵀZ/M`): for each training point the eigenpairs
/// `(σ_a, v_a)` of `diag p − p pᵀ` with `σ_a > 1e-14` give the rows `√σ_a J_iᵀ v_a`.
///
/// # Shapes
/// `x [M, d]`; the result holds `n_z ≤ M(K − 1)` factored gradients and, for each, the training
/// point it belongs to.
pub fn ggn_factor(net: &Mlp1, x: &[f64]) -> (ScalarGrads, Vec<usize>) {
    let k = net.k;
    let fwd = net.forward(x);
    let m = x.len() / net.d;
    let mut rows = Vec::new();
    let mut u = Vec::new();
    for i in 0..m {
        let p: Vec<f64> = fwd.logp[i * k..(i + 1) * k].iter().map(|l| l.exp()).collect();
        let hm = nalgebra::DMatrix::from_fn(k, k, |a, b| if a == b { p[a] } else { 0.0 } - p[a] * p[b]);
        let eig = nalgebra::SymmetricEigen::new(hm);
        for a in 0..k {
            let s = eig.eigenvalues[a];
            if s > 1e-14 {
                rows.push(i);
                u.extend((0..k).map(|c| s.sqrt() * eig.eigenvectors[(c, a)]));
            }
        }
    }
    let (d, h) = (net.d, net.h);
    let gx: Vec<f64> = rows.iter().flat_map(|&i| x[i * d..(i + 1) * d].iter().copied()).collect();
    let f = Forward {
        pre: rows.iter().flat_map(|&i| fwd.pre[i * h..(i + 1) * h].iter().copied()).collect(),
        hid: rows.iter().flat_map(|&i| fwd.hid[i * h..(i + 1) * h].iter().copied()).collect(),
        logits: vec![],
        logp: vec![],
    };
    (ScalarGrads::new(net, &gx, &f, u), rows)
}

/// Influence functions through the function-space (Woodbury) form of the damped GGN inverse.
///
/// # Shapes
/// `P` test gradients, `M` training gradients, `n_z` factor rows.
pub struct FunctionSpace {
    z: ScalarGrads,
    rows: Vec<usize>,
    xx: Vec<f64>,
    zx: Vec<f64>,
    zt: Vec<f64>,
    base: Vec<f64>,
    m: usize,
    p: usize,
    mean_eig: f64,
}

impl FunctionSpace {
    /// Prepares `τ` for test gradients `gx` and training gradients `gt` (at the training rows
    /// `x`, `[M, d]`) with the GGN factor `(z, rows)` of [`ggn_factor`] on the same rows.
    pub fn new((z, rows): (ScalarGrads, Vec<usize>), x: &[f64], gx: &ScalarGrads, gt: &ScalarGrads) -> FunctionSpace {
        let (p, m) = (gx.len(), gt.len());
        let d = x.len() / m.max(1);
        let mut xx = vec![0.0; m * m];
        gemm(&mut xx, x, false, x, true, (m, m, d), 1.0, false);
        let zx = z.gram(gx);
        let mut zt = vec![0.0; z.len() * m];
        let f = |a: usize, j: usize| xx[rows[a] * m + j];
        z.gram_rows(gt, Some(&f), &mut |a, row| zt[a * m..(a + 1) * m].copy_from_slice(row));
        let base = gx.gram(gt);
        // tr(H)/n_z: the mean non-zero eigenvalue scale of H = ZᵀZ/M.
        let tr: f64 = z.sq_norms().iter().sum::<f64>() / m as f64;
        let mean_eig = tr / z.len().max(1) as f64;
        FunctionSpace { z, rows, xx, zx, zt, base, m, p, mean_eig }
    }

    /// `tr(H)/n_z`, the unit of the relative damping.
    pub fn mean_eigenvalue(&self) -> f64 {
        self.mean_eig
    }

    /// Number of factor rows `n_z`.
    pub fn rank(&self) -> usize {
        self.z.len()
    }

    /// `τ = g(x)ᵀ (H + λI)⁻¹ g_i` at `λ = λ_rel · tr(H)/n_z`, and the number of factor rows
    /// kept. # Shapes `[P, M]`.
    ///
    /// Rows of `Z` are dropped, smallest `‖z‖²` first, while their sum stays at most
    /// `tol · Mλ`: the dropped part of `H` then has norm at most `tol · λ`, so `(H + λI)⁻¹`
    /// changes by at most the relative amount `tol` (`tol = 0` keeps every row, exact).
    ///
    /// Errors: [`Error::NotPositiveDefinite`] when the Cholesky of `ZZᵀ + MλI` fails.
    pub fn apply(&self, damping_rel: f64, tol: f64) -> Result<(Vec<f64>, usize)> {
        let lambda = damping_rel * self.mean_eig;
        let m = self.m;
        let norms = self.z.sq_norms();
        let mut order: Vec<usize> = (0..norms.len()).collect();
        order.sort_by(|&a, &b| norms[a].total_cmp(&norms[b]));
        let budget = tol * m as f64 * lambda;
        let mut dropped = 0.0;
        let mut cut = 0;
        while cut < order.len() && dropped + norms[order[cut]] <= budget {
            dropped += norms[order[cut]];
            cut += 1;
        }
        let mut keep: Vec<usize> = order[cut..].to_vec();
        keep.sort_unstable();
        let z = self.z.select(&keep);
        let rows: Vec<usize> = keep.iter().map(|&a| self.rows[a]).collect();
        let nz = keep.len();
        // ZZᵀ + MλI written straight into the (column-major) matrix the Cholesky overwrites.
        let mut a = Mat::<f64>::zeros(nz, nz);
        let f = |i: usize, j: usize| self.xx[rows[i] * m + rows[j]];
        z.gram_rows(&z, Some(&f), &mut |i, row| {
            a.col_as_slice_mut(i).copy_from_slice(row);
        });
        for i in 0..nz {
            a[(i, i)] += m as f64 * lambda;
        }
        let par = Par::rayon(0);
        let mut buf = MemBuffer::new(cholesky_in_place_scratch::<f64>(nz, par, Default::default()));
        cholesky_in_place(a.as_mut(), LltRegularization::default(), par, MemStack::new(&mut buf), Default::default())
            .map_err(|_| Error::NotPositiveDefinite { pivot: 0, jitter_tried: m as f64 * lambda })?;
        drop(buf);
        // Y = (ZZᵀ + MλI)⁻¹ Z g(x), [n_z, P].
        let mut y = Mat::from_fn(nz, self.p, |i, j| self.zx[keep[i] * self.p + j]);
        solve_lower_triangular_in_place(a.as_ref(), y.as_mut(), par);
        solve_upper_triangular_in_place(a.as_ref().transpose(), y.as_mut(), par);
        drop(a);
        let yr: Vec<f64> = (0..nz * self.p).map(|q| y[(q / self.p, q % self.p)]).collect();
        let zt: Vec<f64> = keep.iter().flat_map(|&r| self.zt[r * m..(r + 1) * m].iter().copied()).collect();
        let mut corr = vec![0.0; self.p * m];
        gemm(&mut corr, &yr, true, &zt, false, (self.p, m, nz), 1.0, false);
        Ok((self.base.iter().zip(&corr).map(|(b, c)| (b - c) / lambda).collect(), nz))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::grads::{directions, Direction, Projection};
    use crate::attribution::mlp::small_arch;

    /// CG and the function-space form against a dense parameter-space solve of `(H + λI)`,
    /// with `H` written out from `Z`.
    #[test]
    fn cg_and_woodbury_match_a_dense_solve() {
        let arch = small_arch(4, 5, 3);
        let mut p = arch.init(7);
        p.data[2].iter_mut().enumerate().for_each(|(i, v)| *v += 0.3 * (i as f64 * 1.3).sin());
        let net = Mlp1::from_params(&arch, &p).unwrap();
        let m = 12;
        let x: Vec<f64> = (0..m * 4).map(|i| ((i as f64) * 0.41).cos()).collect();
        let y: Vec<usize> = (0..m).map(|i| i % 3).collect();
        let xt: Vec<f64> = (0..3 * 4).map(|i| ((i as f64) * 0.9).sin()).collect();
        let yt = vec![2, 0, 1];
        let w = net.numel();
        let (z, rows) = ggn_factor(&net, &x);
        assert!(z.len() <= m * 2 && rows.len() == z.len());
        let zm = z.project(Projection::Identity); // [n_z, W]
        let nz = z.len();
        let hd = nalgebra::DMatrix::from_fn(w, w, |a, b| (0..nz).map(|r| zm[r * w + a] * zm[r * w + b]).sum::<f64>() / m as f64);
        // The matrix-free product is H (to 1e-10 relative: the two sum their terms in different
        // orders, the explicit H from per-point eigendecompositions, with cancellation; the
        // differences seen are about 1e-11).
        let ggn = Ggn::new(&net, &x);
        let v: Vec<f64> = (0..w).map(|i| (i as f64 * 0.17).sin()).collect();
        let hv = ggn.hvp(&v);
        let want = &hd * nalgebra::DVector::from_column_slice(&v);
        for i in 0..w {
            assert!((hv[i] - want[i]).abs() < 1e-10 * (1.0 + want[i].abs()), "{} vs {}", hv[i], want[i]);
        }
        let ft = net.forward(&x);
        let fx = net.forward(&xt);
        let gt = ScalarGrads::new(&net, &x, &ft, directions(&ft.logp, &y, 3, Direction::LogProb));
        let gx = ScalarGrads::new(&net, &xt, &fx, directions(&fx.logp, &yt, 3, Direction::LogProb));
        let fs = FunctionSpace::new((z, rows), &x, &gx, &gt);
        let rel = 0.05;
        let lambda = rel * fs.mean_eigenvalue();
        let (tau, kept) = fs.apply(rel, 0.0).unwrap();
        assert_eq!(kept, fs.rank());
        // Dropping rows within the tolerance moves τ by at most about that relative amount: a
        // tolerance just above the smallest row's share (so that at least one row goes).
        let smallest = (0..nz).map(|r| zm[r * w..(r + 1) * w].iter().map(|v| v * v).sum::<f64>()).fold(f64::INFINITY, f64::min);
        let tol = 1.5 * smallest / (m as f64 * lambda);
        let (loose, kept_loose) = fs.apply(rel, tol).unwrap();
        assert!(kept_loose < kept, "{kept_loose} of {kept} (tol {tol:.2e})");
        let scale = tau.iter().map(|v| v.abs()).fold(0.0, f64::max);
        assert!(tau.iter().zip(&loose).all(|(a, b)| (a - b).abs() <= 2.0 * tol * scale), "tol {tol:.2e}");
        let a = &hd + nalgebra::DMatrix::identity(w, w) * lambda;
        let chol = a.cholesky().unwrap();
        for q in 0..3 {
            let gq = nalgebra::DVector::from_vec(gx.explicit(q));
            let s = chol.solve(&gq);
            let cg = ggn.cg(gq.as_slice(), lambda, 1e-13, 10 * w).unwrap();
            assert!(cg.rel_residual <= 1e-13, "{cg:?}");
            for i in 0..w {
                assert!((cg.x[i] - s[i]).abs() < 1e-9 * (1.0 + s[i].abs()), "{} vs {}", cg.x[i], s[i]);
            }
            for i in 0..m {
                let want = s.dot(&nalgebra::DVector::from_vec(gt.explicit(i)));
                assert!((tau[q * m + i] - want).abs() < 1e-8 * (1.0 + want.abs()), "{} vs {want}", tau[q * m + i]);
            }
        }
    }
}
