//! The crate's one error type.
//!
//! Data-dependent failures are values of [`Error`]; panics are reserved for programmer errors.
//! The CLI prints the error (one line) and exits with status 2.

use std::path::PathBuf;

/// Everything that can go wrong in pathkernel, with the data needed to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value or CLI argument is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An input file does not have the expected format.
    #[error("{path}: {msg}")]
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// Input data is unusable (empty, NaN, wrong labels, ...).
    #[error("invalid data: {0}")]
    Data(String),
    /// Two shapes that must agree do not.
    #[error("shape mismatch in {what}: expected {expected:?}, got {got:?}")]
    ShapeMismatch {
        /// What was being checked.
        what: String,
        /// The expected shape.
        expected: Vec<usize>,
        /// The shape found.
        got: Vec<usize>,
    },
    /// Training produced a non-finite loss or weight.
    #[error("training diverged at step {step}: {what} (loss = {loss})")]
    Diverged {
        /// The step at which the non-finite value appeared.
        step: usize,
        /// The loss at that step.
        loss: f64,
        /// What was non-finite.
        what: String,
    },
    /// A trajectory directory is incomplete or inconsistent.
    #[error("trajectory {path}: {msg}")]
    Trajectory {
        /// The run directory or file involved.
        path: PathBuf,
        /// The first problem found.
        msg: String,
    },
    /// A matrix that must be positive definite is not, even with the jitter tried.
    #[error("matrix not positive definite (failing pivot {pivot}, jitter tried up to {jitter_tried:e})")]
    NotPositiveDefinite {
        /// Index of the failing pivot.
        pivot: usize,
        /// Largest jitter tried.
        jitter_tried: f64,
    },
    /// An allocation would exceed the memory budget.
    #[error("{what} needs about {needed_bytes} bytes, over the budget of {budget_bytes} bytes; {hint}")]
    OutOfMemoryBudget {
        /// What was to be allocated.
        what: String,
        /// Estimated bytes.
        needed_bytes: u64,
        /// Budget in bytes.
        budget_bytes: u64,
        /// How to make it fit.
        hint: String,
    },
    /// A numerical procedure failed (non-convergence, non-finite values).
    #[error("numerical failure: {0}")]
    Numerical(String),
    /// A failure reported by the tensor backend (dfdx).
    #[error("tensor backend: {0}")]
    Backend(String),
    /// A failure reported by polars while writing or reading a table.
    #[error("table {path}: {msg}")]
    Table {
        /// The table file.
        path: PathBuf,
        /// The polars message.
        msg: String,
    },
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    /// A format error on `path`.
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Format { path: path.into(), msg: msg.into() }
    }
    /// A trajectory error on `path`.
    pub fn trajectory(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Trajectory { path: path.into(), msg: msg.into() }
    }
}
