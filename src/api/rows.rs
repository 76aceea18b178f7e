//! [`Rows`]: what the rows of a kernel are. The vocabulary [`Gram`](super::Gram) and
//! [`KernelBuilder`](super::KernelBuilder) share, below both.

use std::fmt;

use crate::kernel::Points;
use crate::trajectory::Run;

/// What the rows of a kernel are.
#[derive(Clone, Debug, PartialEq)]
pub enum Rows {
    /// The run's held-out test set.
    Test,
    /// The run's training set.
    Train,
    /// An `n × n` grid over 2-D training data (10 % margin).
    Grid(usize),
    /// The mean of the training points of each class (the EPK paper's Fig. 6 points).
    ClassMeans,
    /// Inputs given by the caller.
    Inputs,
}

impl Rows {
    /// The rows `points` are, for a run: `Train`/`Test` when they equal that set, else `Inputs`.
    pub(super) fn of_points(points: &Points, run: &Run) -> Rows {
        if points.x == run.dataset.x_train {
            Rows::Train
        } else if points.x == run.dataset.x_test {
            Rows::Test
        } else {
            Rows::Inputs
        }
    }
}

impl fmt::Display for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rows::Test => write!(f, "test"),
            Rows::Train => write!(f, "train"),
            Rows::Grid(n) => write!(f, "grid {n}×{n}"),
            Rows::ClassMeans => write!(f, "class-mean"),
            Rows::Inputs => write!(f, "given"),
        }
    }
}
