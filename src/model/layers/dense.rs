//! `dense`: a fully connected layer on a flat feature vector, PyTorch's `Linear(in, out)`.
//!
//! Parameters `weight [out, in]` and `bias [out]` (optional). Linear in its input and in its
//! parameters, so along a step's path `w_s(t)` its output's degree in t rises by one. Its
//! per-sample gradient factors as `δ[k] ⊗ [a, 1]` (input activations `a`, output sensitivities
//! `δ`): the kernel engine contracts the two factors separately, never the `out × in` product.

use crate::linalg::{gemm, gemm_abt};

/// A resolved dense layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Dense {
    pub n_in: usize,
    pub n_out: usize,
    pub bias: bool,
}

impl Dense {
    /// `y = x Wᵀ + b`.
    ///
    /// # Shapes
    /// `w` `[out, in]`, `b` `[out]`, `x` `[n, in]`; returns `[n, out]`.
    pub(crate) fn forward(&self, w: &[f64], b: Option<&[f64]>, x: &[f64]) -> Vec<f64> {
        let n = x.len() / self.n_in;
        let mut y = vec![0.0; n * self.n_out];
        gemm_abt(&mut y, x, w, n, self.n_out, self.n_in, 1.0, false);
        if let Some(b) = b {
            y.chunks_exact_mut(self.n_out).for_each(|r| r.iter_mut().zip(b).for_each(|(v, bv)| *v += bv));
        }
        y
    }

    /// Tangent of the output along `(ẋ, ΔW, Δb)`: `ẏ = ẋ Wᵀ + x ΔWᵀ + Δb`.
    ///
    /// # Shapes
    /// As [`Dense::forward`]; `xdot` `[n, in]` (`None`: zero).
    pub(crate) fn tangent(&self, w: &[f64], dw: &[f64], db: Option<&[f64]>, x: &[f64], xdot: Option<&[f64]>) -> Vec<f64> {
        let n = x.len() / self.n_in;
        let mut y = vec![0.0; n * self.n_out];
        gemm_abt(&mut y, x, dw, n, self.n_out, self.n_in, 1.0, false);
        if let Some(xd) = xdot {
            gemm_abt(&mut y, xd, w, n, self.n_out, self.n_in, 1.0, true);
        }
        if let Some(b) = db {
            y.chunks_exact_mut(self.n_out).for_each(|r| r.iter_mut().zip(b).for_each(|(v, bv)| *v += bv));
        }
        y
    }

    /// Input sensitivities `dx[n, k] = dy[n, k] W`.
    ///
    /// # Shapes
    /// `dy` `[n, K, out]`; returns `[n, K, in]`.
    pub(crate) fn input_grad(&self, w: &[f64], dy: &[f64]) -> Vec<f64> {
        let rows = dy.len() / self.n_out;
        let mut dx = vec![0.0; rows * self.n_in];
        gemm(&mut dx, dy, false, w, false, (rows, self.n_in, self.n_out), 1.0, false);
        dx
    }
}
