//! The Gaussian-process family, one home: everything that turns a Gram (or the network's last
//! layer) into a posterior over the logits.
//!
//! - [`regression`]: the EPK paper's §4.2 GP — one GP per class regressing the network's outputs
//!   on a kernel block with Gaussian noise, and the Monte-Carlo softmax ([`mc_softmax`]).
//! - [`functional`]: function-space (linearised) Laplace on a kernel of the network —
//!   laplace-torch's `FunctionalLaplace` with any kernel (NTK at `w_N`, the exact path kernel):
//!   GP prior `k/δ` on the logits, softmax-Hessian curvature (class-diagonal or full), the
//!   network as the mean, δ by evidence or a validation grid, probit and Monte-Carlo links,
//!   validation calibration of a temperature and a variance scale.
//! - [`crossclass`]: the same on the cross-class kernel (every `K^{cc'}` block, the
//!   `[M K, M K]` system): laplace-torch's `independent_outputs=False` (diagonal λ) and the
//!   GGN-exact posterior (full per-point `Λ_i`), a `K × K` covariance per point.
//! - [`lastlayer`]: last-layer Laplace with the exact GGN (laplace-torch's `LLLaplace`, full
//!   Hessian).
//!
//! The regression GP's items are re-exported here (`crate::gp::GpParams`, …), its long-standing
//! paths.

pub mod crossclass;
pub mod functional;
pub mod kxk;
pub mod lastlayer;
pub mod regression;

pub use crossclass::{CrossClassLaplace, KxkRows, KxkTrain};
pub use kxk::{KxkNumbers, KxkSeconds, KxkSolver};
pub use functional::{Calibration, Curvature, FslFit, FslPredictive, FslRows, FslTrain, FunctionalLaplace, KernelBlocks, Prior};
pub use lastlayer::{LaplaceParams, LastLayerLaplace, LogitPosterior};
pub use regression::*;
