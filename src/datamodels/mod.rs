//! The attribution benchmark of issue #28 §2: how well attributions from one trained network
//! predict retraining (the linear datamodeling score of TRAK, Park et al. 2023), for the exact
//! path kernel's attribution and the field's baselines on the same run. The methods and the
//! scores are [`crate::attribution`]'s (below the front door); the benchmark takes a
//! [`crate::api::Trained`] run and sits above it.
//!
//! One concept per file, data flowing down the list:
//! - [`subsets`]: the seeded half-subsets (tuning / evaluation) and the seeded label noise;
//! - [`retrain`]: full-batch GD on a subset from `w_0` (the fast path of the crate's dfdx training);
//! - [`cache`]: the stage hook a study engine plugs its cache into;
//! - [`benchmark`]: the typed spec, the run of every method, the results and their tables.

pub mod benchmark;
pub mod cache;
pub mod retrain;
pub mod subsets;

pub use benchmark::{run, AttributionSpec, BenchmarkResult};
pub use cache::{JsonDir, NoCache, Stages};
