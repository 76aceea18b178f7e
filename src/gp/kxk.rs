//! What a cross-class function-space Laplace fit ([`super::crossclass`]) reports and how it
//! factors its system: kept apart so that [`super::functional::FslFit`] can carry the numbers
//! without depending on the fit.

use serde::{Deserialize, Serialize};

/// The numbers of a cross-class fit (in [`super::functional::FslFit::kxk`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KxkNumbers {
    /// Size of the system, M·K.
    pub n: usize,
    /// The factorisation route (absent in a file: the eigen route).
    #[serde(default, skip_serializing_if = "KxkSolver::is_eigen")]
    pub solver: KxkSolver,
    /// Smallest and largest eigenvalue of the `[M K, M K]` kernel (eigen route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k_eig: Option<[f64; 2]>,
    /// Its eigenvalues left out of `rᵀ K⁺ r` (below `1e-12 ·` the largest; eigen route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinv_dropped: Option<usize>,
    /// `rᵀ K⁺ r`.
    pub rkr: f64,
    /// Cholesky route: the `τ` of `rᵀ (K + τ I)⁻¹ r` (0 where `K` itself factored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scatter_jitter: Option<f64>,
    /// Smallest eigenvalue of `G = Fᵀ K F` before clamping at 0 (eigen route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub g_min_eig: Option<f64>,
    /// Diagonal curvature: `λ_ic` exactly 0, taken as 1/10 (laplace-torch's convention).
    pub lambda_zero: usize,
    /// Wall seconds of the pieces (per route).
    pub seconds: KxkSeconds,
    /// `|log det(I + G/δ)|` by the Cholesky minus by the eigenvalues, relative (eigen route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logdet_rel_diff: Option<f64>,
    /// Cholesky route: the factorisations the evidence's δ search took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_factorisations: Option<usize>,
}

/// How a cross-class fit factors its `[M K, M K]` system ([`super::crossclass`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KxkSolver {
    /// One eigendecomposition of `G` (and one of `K`) serves every δ; `O(n³)` with about ten
    /// times a Cholesky's constant.
    #[default]
    Eigen,
    /// One Cholesky of `δ I + G` per δ tried (`crossclass/cholesky.rs`).
    Cholesky,
}

impl KxkSolver {
    pub(crate) fn is_eigen(&self) -> bool {
        *self == KxkSolver::Eigen
    }
}

impl std::fmt::Display for KxkSolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KxkSolver::Eigen => "eigen",
            KxkSolver::Cholesky => "cholesky",
        })
    }
}

/// Wall seconds of a cross-class fit's factorisations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KxkSeconds {
    /// Eigendecomposition of K (for `rᵀ K⁺ r`; eigen route) or its Cholesky (Cholesky route).
    pub eig_k: f64,
    /// Forming `G = Fᵀ K F`.
    pub form_g: f64,
    /// Eigendecomposition of G (serves every δ; eigen route) or the whole δ search (Cholesky
    /// route: every factorisation it took).
    pub eig_g: f64,
    /// Cholesky of `I + G/δ` at one δ (eigen route: timed beside; Cholesky route: the mean of
    /// the search's factorisations, each with the filling of `δ I + G`).
    pub cholesky: f64,
}

