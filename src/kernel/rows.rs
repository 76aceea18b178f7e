//! Which rows a Gram is on: one [`Rows`] for the CLI's `--points`, a study's `points =`, the
//! notebook API and the Gram file, with one text form (`test`, `train`, `grid:N`,
//! `class-means`, `inputs`) through `FromStr`/`Display` (and serde).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::types::Points;
use crate::error::{Error, Result};
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
/// assert_eq!("grid:40".parse::<Rows>()?, Rows::Grid(40));
/// assert_eq!(Rows::ClassMeans.to_string(), "class-means");
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// The run's held-out test set.
    Test,
    /// The run's training set.
    Train,
    /// An `n × n` grid over 2-D training data (10 % margin), x fastest.
    Grid(usize),
    /// The mean of the training points of each class (the EPK paper's Fig. 6 points).
    ClassMeans,
    /// Inputs given by the caller.
    Inputs,
}

impl std::str::FromStr for Rows {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "test" => Ok(Rows::Test),
            "train" => Ok(Rows::Train),
            "class-means" => Ok(Rows::ClassMeans),
            "inputs" => Ok(Rows::Inputs),
            _ => match s.strip_prefix("grid:").map(str::parse::<usize>) {
                Some(Ok(n)) if (2..=2000).contains(&n) => Ok(Rows::Grid(n)),
                _ => Err(Error::Config(format!("--points `{s}`: expected test, train, class-means or grid:N with 2 <= N <= 2000"))),
            },
        }
    }
}

/// The text form `FromStr` reads.
impl fmt::Display for Rows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rows::Test => f.write_str("test"),
            Rows::Train => f.write_str("train"),
            Rows::Grid(n) => write!(f, "grid:{n}"),
            Rows::ClassMeans => f.write_str("class-means"),
            Rows::Inputs => f.write_str("inputs"),
        }
    }
}

impl Serialize for Rows {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Rows {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e: Error| serde::de::Error::custom(e.to_string()))
    }
}

impl Rows {
    /// The points for a dataset.
    pub fn resolve(&self, data: &crate::data::Dataset) -> Result<Points> {
        let x = match self {
            Rows::Test => data.x_test.clone(),
            Rows::Train => data.x_train.clone(),
            Rows::Grid(n) => {
                if data.dim != 2 {
                    return Err(Error::Config(format!("--points grid:{n} needs 2-D data; this dataset has d = {}", data.dim)));
                }
                crate::data::grid_2d(&data.x_train, *n, 0.1)?
            }
            Rows::Inputs => return Err(Error::Config("`inputs` rows are given by the caller, not derived from the dataset".into())),
            Rows::ClassMeans => {
                let crate::data::Targets::Labels(y) = &data.y_train else {
                    return Err(Error::Config("--points class-means needs a classification dataset".into()));
                };
                let d = data.dim;
                let mut sums = vec![0.0; data.num_outputs * d];
                let mut counts = vec![0usize; data.num_outputs];
                for (i, &c) in y.iter().enumerate() {
                    counts[c] += 1;
                    for j in 0..d {
                        sums[c * d + j] += data.x_train[i * d + j];
                    }
                }
                let mut x = Vec::new();
                for c in 0..data.num_outputs {
                    if counts[c] > 0 {
                        x.extend(sums[c * d..(c + 1) * d].iter().map(|v| v / counts[c] as f64));
                    }
                }
                x
            }
        };
        if x.is_empty() {
            return Err(Error::Data(format!("the {self:?} point set is empty")));
        }
        Ok(Points { x, dim: data.dim })
    }

    /// The rows `points` are, for a run: `Train`/`Test` when they equal that set, else `Inputs`.
    pub fn of_points(points: &Points, run: &Run) -> Rows {
        if points.x == run.dataset.x_train {
            Rows::Train
        } else if points.x == run.dataset.x_test {
            Rows::Test
        } else {
            Rows::Inputs
        }
    }

    /// A short description for tables (`test`, `train`, `grid 25×25`, `class-mean`, `given`).
    pub fn describe(&self) -> String {
        match self {
            Rows::Test => "test".into(),
            Rows::Train => "train".into(),
            Rows::Grid(n) => format!("grid {n}×{n}"),
            Rows::ClassMeans => "class-mean".into(),
            Rows::Inputs => "given".into(),
        }
    }
}
