//! The attribution methods on a [`Trained`] run (the methods themselves are
//! [`crate::attribution`]'s; the EPK's own is [`Gram::attribute`](super::Gram::attribute)).

use super::trained::Trained;
use crate::error::Result;

/// TRAK's attributions with one model, the run at `w_N`, of `log p_y` at inputs `x` with labels
/// `labels`: `τ = φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ diag(1 − p_i)` with `φ` the gradient of TRAK's model output
/// `log(p/(1 − p))` projected to `dim` by the seeded Gaussian projection (`None`: unprojected,
/// `g(x)ᵀGᵀ(GGᵀ + λI)⁻¹`), `λ = ridge · tr(ΦᵀΦ)/M` (relative, as in the benchmark):
/// [`crate::attribution::trak()`] on the run's states.
///
/// # Shapes
/// `x [P, d]`, `labels [P]` → `τ [P, M]`.
///
/// Errors: a run the benchmark does not cover (a one-hidden-layer ReLU MLP with log-softmax
/// outputs), inputs of the wrong width, a dimension of 0 or above 4 096, a failed
/// eigendecomposition.
pub fn trak(net: &Trained, x: &[f64], labels: &[usize], dim: Option<usize>, ridge: f64, seed: u64) -> Result<Vec<f64>> {
    crate::attribution::trak(net.run(), net.states(), x, labels, dim, ridge, seed)
}
