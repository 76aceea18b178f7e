//! # pathkernel
//!
//! A trained neural network seen as the kernel machine it exactly is (Bell et al., "An Exact
//! Kernel Equivalence for Finite Classification Models"): train MLPs and small CNNs with dfdx in
//! f64 while recording every weight state, then compute the empirical NTK, Domingos' discrete
//! path kernel, the Exact Path Kernel and the kernel machine that reproduces the network,
//!
//! `f_{w_N}(x) = b + Σ_s Σ_i a_{i,s} K_EPK(x, x_i, s)`, `a_{i,s} = −ε_s ∂L/∂f(x_i)` at `w_s`,
//! `b = f_{w_0}(x)`,
//!
//! and turn the kernels into GP posteriors, SVM refits, stationarity scores and attributions.
//!
//! # From a training run to its kernel machine
//!
//! The notebook path goes through [`api`]: a recorded run ([`api::Trained`]), its kernels as
//! typed values ([`api::Gram`]) and the estimators that take them. A 2-D, three-class Gaussian
//! mixture, a 2-8-3 ReLU network, ten steps of full-batch gradient descent:
//!
//! ```
//! use pathkernel::api::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let net = Trained::train_toml(
//!     r#"
//!     [data]
//!     kind = "gaussian-mixture"
//!     dim = 2
//!     per_class = 10
//!     n_test = 6
//!     [model]
//!     kind = "mlp"
//!     hidden = [8]
//!     [train]
//!     lr = 0.5
//!     steps = 10
//!     "#,
//!     dir.path().join("run"), // every state w_0 … w_10 is written here
//! )?;
//!
//! // The EPK between the 6 test points and the 30 training points (auto:1e-12 quadrature):
//! // its kernel machine is the network, to rounding.
//! let epk = net.epk().compute()?;
//! assert_eq!(epk.shape(), (6, 30, 3));
//! assert!(epk.max_abs_error() < 1e-10);
//! println!("{epk}");
//!
//! // One GP per class on the train × train EPK, predicted at the test rows.
//! let train = net.epk().train_side().layout(Layout::Diag).compute()?;
//! let rows = net.epk().layout(Layout::Diag).compute()?;
//! let probs = GpModel::fit(&train)?.predict(&rows)?.mc_softmax(200, 0)?;
//! assert_eq!(probs.mean_prob.len(), 6 * 3);
//!
//! // Which training points make the first test prediction: the contributions sum to the
//! // network output minus the bias.
//! let who = epk.attribute(&[0], 3)?;
//! assert!(who.items.iter().all(|a| a.residual.abs() < 1e-10));
//! # Ok(()) }
//! ```
//!
//! The command line (`pathkernel train | kernel | study run | …`, feature `cli`) writes the same
//! computations to files Python reads unchanged; the guide (`mdbook serve docs`) has the maths,
//! the studies and every command.
#![warn(missing_docs)]
// Numerical kernels index several arrays with one loop variable and take their shapes as explicit
// arguments; these two lints would only obscure that.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]
// Without the `cli` feature (the notebooks' build) the helpers only the command line calls
// (tile states, Slurm scripts, PyTorch export, resumed training) are unused; the default build
// still reports dead code, and CI type-checks this one.
#![cfg_attr(not(feature = "cli"), allow(dead_code, unused_imports))]

pub mod analysis;
pub mod api;
pub mod attribution;
#[cfg(feature = "cli")]
pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod data;
pub mod datamodels;
pub(crate) mod device;
pub mod error;
pub mod gp;
pub mod interop;
pub mod io;
pub mod kernel;
pub(crate) mod linalg;
pub mod model;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod report;
pub mod study;
pub mod svm;
pub mod tile;
pub mod train;
pub mod trajectory;
pub mod uncertainty;

pub use error::{Error, Result};
