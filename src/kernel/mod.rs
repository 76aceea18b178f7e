//! Kernels of a recorded training path: NTK, DPK, EPK, Chen's kernel, the asymmetric k′,
//! and the kernel machine that reproduces the network.
//!
//! Notation (EPK paper §3): `f` is the network including its output map (log-softmax for
//! classification), `w_s(t) = w_s + t(w_{s+1} − w_s)`, `a_{i,s} = −ε_s ∂L/∂f(x_i)` at `w_s`
//! with L the mean training loss, `b = f_{w_0}(x)`. For one step s and output classes
//! `k` (row point) and `k'` (training point):
//!
//! - **NTK** at step S: `⟨∇f^k_{w_S}(x), ∇f^{k'}_{w_S}(x_i)⟩`.
//! - **DPK** (Domingos, discrete): `Σ_s ⟨∇f^k_{w_s}(x), ∇f^{k'}_{w_s}(x_i)⟩` (one evaluation at t = 0).
//! - **EPK** (Definition 3.4): `Σ_s ∫_0^1 ⟨∇f^k_{w_s(t)}(x), ∇f^{k'}_{w_s}(x_i)⟩ dt` for a test-side
//!   row; a train-side row is evaluated at t = 0 (the asymmetry of Definition 3.4).
//! - **Chen** (eq. 18): `Σ_s |∂L/∂f^{k'}(x_i)| ⟨∇f^k_{w_s}(x), ∇f^{k'}_{w_s}(x_i)⟩`.
//! - **k′** (eq. 13): like the EPK but rows are always integrated, whatever their side.
//!
//! The kernel machine (Theorem 3.6, ensemble form) is
//! `f(x) = b + Σ_s Σ_i Σ_{k'} a_{i,s}^{k'} K_s(x, x_i)[k, k']`; with cross-entropy on log-softmax
//! outputs and a constant learning rate `a_{i,s}` does not depend on s and the single machine
//! `b + Σ_i a_i·G` with `G = Σ_s K_s` (Theorem 3.7) is exact as well.
//!
//! Where things are: what a computation is asked and what it returns ([`Request`], [`Rows`],
//! `types`, [`layout`], the Gram file in [`output`]); the [`engine`] that runs it (one entry,
//! the checks, the plain driver, the optimizer-replaying recursion, row and column blocks); the
//! [`quadrature`] over a step (fixed rules and the adaptive kink-aware rule); the networks' own
//! step models, each in its structured factors: `stack` (any layer stack, one file per layer
//! kind under [`crate::model::layers`]; an MLP or CNN preset as its stack; `stack::closed`, the
//! closed forms of two stack shapes); the [`generic`] autodiff path every fast path is tested
//! against; and the contraction [`backend`]s.

pub mod backend;
pub mod engine;
pub mod generic;
pub mod gram;
pub mod layout;
pub mod output;
pub mod quadrature;
mod request;
mod rows;
pub(crate) mod stack;
pub(crate) mod step_model;
#[cfg(test)]
pub(crate) mod test_switches;
mod types;

pub use backend::Device;
pub use engine::entry::compute;
pub use layout::Layout;
pub use engine::prepare::loss_gradient;
pub use quadrature::Rule;
pub use request::{GramPath, Request};
pub use rows::Rows;
pub use types::*;
