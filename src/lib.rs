//! # pathkernel
//!
//! A trained neural network seen as the kernel machine it exactly is (Bell et al., "An Exact
//! Kernel Equivalence for Finite Classification Models"): train MLPs and small CNNs with dfdx in
//! f64 while recording every weight state, then compute the empirical NTK, Domingos' discrete
//! path kernel, the Exact Path Kernel and the kernel machine that reproduces the network.
#![warn(missing_docs)]
// Numerical kernels index several arrays with one loop variable and take their shapes as explicit
// arguments; these two lints would only obscure that.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

pub mod analysis;
pub mod api;
#[cfg(feature = "cli")]
pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod data;
pub mod error;
pub mod gp;
pub mod interop;
pub mod io;
pub mod kernel;
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
