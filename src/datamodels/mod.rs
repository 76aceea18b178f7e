//! The attribution benchmark of issue #28 §2: how well attributions from one trained network
//! predict retraining (the linear datamodeling score of TRAK, Park et al. 2023), for the exact
//! path kernel's attribution and the field's baselines on the same run.
//!
//! One concept per file, data flowing down the list:
//! - [`mlp`]: the one-hidden-layer ReLU MLP as four matrices and its batched forward pass;
//! - [`subsets`]: the seeded half-subsets (tuning / evaluation) and the seeded label noise;
//! - [`retrain`]: full-batch GD on a subset from `w_0` (the fast path of the crate's dfdx training);
//! - [`grads`]: factored per-example gradients of scalar outputs, their Grams and projections;
//! - [`pathattr`]: EPK and DPK (TracIn) attributions through the front door, the path Gram;
//! - [`ridge`]: the kernel-regression solve of TRAK and of its kernel counterparts;
//! - [`influence`]: influence functions with the damped GGN (CG and the function-space form);
//! - [`lds`]: Spearman, LDS, bootstrap intervals, AUC;
//! - [`cache`]: the stage hook a study engine plugs its cache into;
//! - [`benchmark`]: the typed spec, the run of every method, the results and their tables.

pub mod benchmark;
pub mod cache;
pub mod grads;
pub mod influence;
pub mod lds;
pub mod mlp;
pub mod pathattr;
pub mod retrain;
pub mod ridge;
pub mod subsets;

pub use benchmark::{run, trak, AttributionSpec, BenchmarkResult};
pub use cache::{JsonDir, NoCache, Stages};
