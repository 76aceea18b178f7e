//! Training-data attribution: which training points make a prediction, by the exact path
//! kernel's own decomposition and by the field's methods, on one recorded run. Everything here
//! sits below the front door, [`crate::api`], which calls it (`Gram::contributions`,
//! `Gram::attribute`, `api::trak` on a `Trained` run) and re-exports [`extremes`] and
//! [`lds::spearman`]; the benchmark that scores these methods against retraining is
//! [`crate::datamodels`], above it. Nothing here uses `api`.
//!
//! One method or shared piece per file, data flowing down the list:
//! - [`contributions`](mod@contributions): the kernel machine's term of every training point (EPK paper Fig. 6,
//!   any path kernel, per step or not) and the strongest supporters and opponents of an output;
//! - [`mlp`]: the one-hidden-layer ReLU MLP as four matrices and its batched forward pass;
//! - [`grads`]: factored per-example gradients of scalar outputs, their Grams and projections;
//! - [`path`]: the EPK's and the DPK's (TracIn's) attributions of `log p_y` through the kernel
//!   engine, and the path Gram on factored gradients;
//! - [`ridge`]: the kernel-regression solve of the representers (a path kernel in place of
//!   TRAK's) and of TRAK, with their `1 − p` reweighting;
//! - [`trak`](mod@trak): TRAK (Park et al. 2023), for one model at one setting and over a grid;
//! - [`influence`]: influence functions with the damped GGN (CG and the function-space form);
//! - [`lds`]: the scores attributions are judged by: Spearman, LDS, bootstrap intervals, AUC.

pub mod contributions;
pub mod grads;
pub mod influence;
pub mod lds;
pub mod mlp;
pub mod path;
pub mod ridge;
pub mod trak;

pub use contributions::{attribute, baseline, constant_a, contributions, contributions_per_step, extremes, machine_contributions, require_path_machine, Attribution};
pub use trak::trak;
