//! [`Rows`]: what the rows of a kernel are. The vocabulary [`Gram`](super::Gram) and
//! [`KernelBuilder`](super::KernelBuilder) share, below both.

use std::fmt;

use crate::kernel::Points;
use crate::trajectory::Run;

/// What the rows of a kernel are.
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
/// #             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
/// # let net = Trained::train_toml(toml, dir.path().join("run"))?;
/// let means = net.epk().class_means().compute()?;   // one row per class mean
/// assert_eq!((means.rows(), means.shape().0), (&Rows::ClassMeans, 3));
/// let test = net.epk().compute()?;
/// assert_eq!(test.rows(), &Rows::Test);
/// assert_eq!(test.rows().to_string(), "test");
/// # Ok(()) }
/// ```
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
