//! Datasets: the EPK paper's Gaussian mixture, two small toys from the reference notebooks, and
//! MNIST read from raw IDX files.
//!
//! All arrays are flat `Vec<f64>` in row-major order. A dataset holds `M` training rows and `P` test
//! rows of `dim` features each, with integer class labels (classification) or real-valued targets
//! (regression). Generated datasets are deterministic functions of their configuration: randomness
//! comes from [`ChaCha8Rng`] seeded with [`SeedableRng::seed_from_u64`] and normal draws from
//! [`StandardNormal`], both platform-stable. Training data use stream 0 of the seeded generator and
//! test data stream 1 ([`ChaCha8Rng::set_stream`]), so the test set does not depend on the size of
//! the training set.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Per-channel mean of the MNIST training pixels (after scaling to `[0, 1]`).
pub const MNIST_MEAN: f64 = 0.1307;
/// Per-channel standard deviation of the MNIST training pixels (after scaling to `[0, 1]`).
pub const MNIST_STD: f64 = 0.3081;

/// The class means of the EPK paper's §4.1 mixture in their first two coordinates (the remaining
/// coordinates are 0).
pub const MIXTURE_MEANS: [[f64; 2]; 3] = [[1.0, 4.0], [4.0, 1.0], [5.0, 5.0]];

/// The two training inputs of the 1-D regression toy.
pub const REGRESSION1D_X: [f64; 2] = [-3.0, 0.5];
/// The two training targets of the 1-D regression toy.
pub const REGRESSION1D_Y: [f64; 2] = [2.0, -1.0];

// ---------------------------------------------------------------------------------------------
// Dataset
// ---------------------------------------------------------------------------------------------

/// Targets of a dataset.
#[derive(Clone, Debug, PartialEq)]
pub enum Targets {
    /// Class labels in `0..num_outputs`, one per row.
    ///
    /// # Shapes
    /// `[n]`.
    Labels(Vec<usize>),
    /// Regression targets.
    ///
    /// # Shapes
    /// `[n, num_outputs]`, row-major.
    Values(Vec<f64>),
}

impl Targets {
    /// Number of rows these targets describe, given the number of outputs per row.
    /// (For [`Targets::Values`] this is `len / num_outputs`, rounded down; `0` if `num_outputs == 0`.)
    pub fn n_rows(&self, num_outputs: usize) -> usize {
        match self {
            Targets::Labels(l) => l.len(),
            Targets::Values(v) => v.len().checked_div(num_outputs).unwrap_or(0),
        }
    }
}

/// A held-out split besides the training and test sets (e.g. a validation set for fitting a
/// temperature or other post-hoc calibration parameters).
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Inputs, `[n, dim]` row-major.
    pub x: Vec<f64>,
    /// Targets of the same kind as the dataset's (`[n]` labels or `[n, K]` values).
    pub y: Targets,
}

/// An in-memory dataset: training and test inputs with their targets, and optionally a
/// validation split.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Short name, e.g. `"gaussian-mixture"`.
    pub name: String,
    /// One line with all generating parameters, e.g.
    /// `"gaussian mixture d=100, 1000/class train, 200 test, std 1, seed 0"`.
    pub description: String,
    /// Features per row (784 for MNIST).
    pub dim: usize,
    /// `[C, H, W]` when rows are images (MNIST: `[1, 28, 28]`); its product equals `dim`.
    pub image_shape: Option<[usize; 3]>,
    /// `K`: the number of classes, or the regression output dimension.
    pub num_outputs: usize,
    /// Training inputs, `[M, dim]` row-major.
    pub x_train: Vec<f64>,
    /// Training targets (`[M]` labels or `[M, K]` values).
    pub y_train: Targets,
    /// Test inputs, `[P, dim]` row-major.
    pub x_test: Vec<f64>,
    /// Test targets (`[P]` labels or `[P, K]` values).
    pub y_test: Targets,
    /// A validation split (`[V, dim]` inputs, `[V]`/`[V, K]` targets), `None` unless the
    /// configuration asks for one (MNIST's `val_per_class`). It is not part of a run's
    /// `dataset.safetensors`: training never sees it, and it is regenerated from the
    /// configuration when needed.
    pub validation: Option<Split>,
}

impl Dataset {
    /// Number of training rows `M` (`x_train.len() / dim`).
    pub fn n_train(&self) -> usize {
        self.x_train.len().checked_div(self.dim).unwrap_or(0)
    }

    /// Number of test rows `P` (`x_test.len() / dim`).
    pub fn n_test(&self) -> usize {
        self.x_test.len().checked_div(self.dim).unwrap_or(0)
    }

    /// The training labels (classification). # Shapes `[M]`.
    ///
    /// Errors: a regression dataset.
    pub fn train_labels(&self) -> Result<&[usize]> {
        match &self.y_train {
            Targets::Labels(y) => Ok(y),
            Targets::Values(_) => Err(Error::Config("labels need a classification dataset".into())),
        }
    }

    /// The test labels (classification). # Shapes `[P]`.
    ///
    /// Errors: a regression dataset.
    pub fn test_labels(&self) -> Result<&[usize]> {
        match &self.y_test {
            Targets::Labels(y) => Ok(y),
            Targets::Values(_) => Err(Error::Config("labels need a classification dataset".into())),
        }
    }

    /// Number of validation rows `V` (0 without a validation split).
    pub fn n_val(&self) -> usize {
        self.validation.as_ref().map_or(0, |v| v.x.len().checked_div(self.dim).unwrap_or(0))
    }

    /// True when the targets are class labels.
    pub fn is_classification(&self) -> bool {
        matches!(self.y_train, Targets::Labels(_))
    }

    /// Checks every invariant, returning the first problem as a precise one-line error:
    /// `dim >= 1`, `num_outputs >= 1`, `image_shape` product equal to `dim`, a non-empty training
    /// set, input lengths that are multiples of `dim` and consistent with the targets, train and
    /// test targets of the same kind, all values finite, labels `< num_outputs`, and at least two
    /// distinct classes among the training labels for classification. The test set may be empty.
    /// A validation split, when present, is checked like the test set (split name `val`).
    ///
    /// # Shapes
    /// `x_train: [M, dim]`, `x_test: [P, dim]`, labels `[M]`/`[P]`, values `[M, K]`/`[P, K]`;
    /// validation `x: [V, dim]`, `y: [V]`/`[V, K]`.
    pub fn validate(&self) -> Result<()> {
        let what = |m: String| Error::Data(format!("dataset '{}': {m}", self.name));
        if self.dim == 0 {
            return Err(what("dim must be >= 1, got 0".into()));
        }
        if self.num_outputs == 0 {
            return Err(what("num_outputs must be >= 1, got 0".into()));
        }
        if let Some(shape) = self.image_shape {
            let prod = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b));
            if prod != Some(self.dim) {
                return Err(Error::ShapeMismatch {
                    what: format!("dataset '{}': image_shape {:?} vs dim", self.name, shape),
                    expected: vec![self.dim],
                    got: vec![prod.unwrap_or(usize::MAX)],
                });
            }
        }
        if self.x_train.is_empty() {
            return Err(what("the training set is empty".into()));
        }
        match (&self.y_train, &self.y_test) {
            (Targets::Labels(_), Targets::Labels(_)) | (Targets::Values(_), Targets::Values(_)) => {
            }
            _ => {
                return Err(what(
                    "y_train and y_test are of different kinds (labels vs regression values)"
                        .into(),
                ))
            }
        }
        let mut splits = vec![
            ("train", &self.x_train, &self.y_train),
            ("test", &self.x_test, &self.y_test),
        ];
        if let Some(v) = &self.validation {
            if std::mem::discriminant(&v.y) != std::mem::discriminant(&self.y_train) {
                return Err(what(
                    "y_val and y_train are of different kinds (labels vs regression values)".into(),
                ));
            }
            splits.push(("val", &v.x, &v.y));
        }
        for (split, x, y) in splits {
            if x.len() % self.dim != 0 {
                return Err(what(format!(
                    "x_{split} has {} values, not a multiple of dim = {}",
                    x.len(),
                    self.dim
                )));
            }
            let n = x.len() / self.dim;
            match y {
                Targets::Labels(l) => {
                    if l.len() != n {
                        return Err(Error::ShapeMismatch {
                            what: format!(
                                "dataset '{}': y_{split} labels vs x_{split} rows",
                                self.name
                            ),
                            expected: vec![n],
                            got: vec![l.len()],
                        });
                    }
                    if let Some((i, &c)) =
                        l.iter().enumerate().find(|(_, &c)| c >= self.num_outputs)
                    {
                        return Err(what(format!(
                            "label y_{split}[{i}] = {c} is not < num_outputs = {}",
                            self.num_outputs
                        )));
                    }
                }
                Targets::Values(v) => {
                    if Some(v.len()) != n.checked_mul(self.num_outputs) {
                        return Err(what(format!(
                            "y_{split} has {} values, expected n_{split} * num_outputs = {n} * {} = {}",
                            v.len(),
                            self.num_outputs,
                            n.saturating_mul(self.num_outputs)
                        )));
                    }
                    if let Some(i) = v.iter().position(|t| !t.is_finite()) {
                        return Err(what(format!(
                            "non-finite target y_{split}[{}, {}] = {}",
                            i / self.num_outputs,
                            i % self.num_outputs,
                            v[i]
                        )));
                    }
                }
            }
            if let Some(i) = x.iter().position(|t| !t.is_finite()) {
                return Err(what(format!(
                    "non-finite input x_{split}[{}, {}] = {}",
                    i / self.dim,
                    i % self.dim,
                    x[i]
                )));
            }
        }
        if let Targets::Labels(l) = &self.y_train {
            let classes: BTreeSet<usize> = l.iter().copied().collect();
            if classes.len() < 2 {
                return Err(what(format!(
                    "classification needs at least 2 distinct classes in the training labels, found {:?}",
                    classes
                )));
            }
        }
        Ok(())
    }

    /// Builds and validates a dataset from arrays (`image_shape` is `None`; set the public field
    /// afterwards and re-validate if the rows are images).
    ///
    /// # Shapes
    /// `x_train: [M, dim]`, `y_train: [M]` labels or `[M, num_outputs]` values,
    /// `x_test: [P, dim]`, `y_test: [P]` or `[P, num_outputs]`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_arrays(
        name: impl Into<String>,
        description: impl Into<String>,
        dim: usize,
        num_outputs: usize,
        x_train: Vec<f64>,
        y_train: Targets,
        x_test: Vec<f64>,
        y_test: Targets,
    ) -> Result<Dataset> {
        let ds = Dataset {
            name: name.into(),
            description: description.into(),
            dim,
            image_shape: None,
            num_outputs,
            x_train,
            y_train,
            x_test,
            y_test,
            validation: None,
        };
        ds.validate()?;
        Ok(ds)
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

fn default_mixture_dim() -> usize {
    100
}
fn default_per_class() -> usize {
    1000
}
fn default_mixture_n_test() -> usize {
    200
}
fn default_std() -> f64 {
    1.0
}
fn default_linear_n_train() -> usize {
    20
}
fn default_linear_n_test() -> usize {
    100
}
fn default_regression_n_test() -> usize {
    101
}
fn default_mnist_path() -> String {
    "data/mnist".to_string()
}
fn default_mnist_n_train() -> usize {
    1000
}
fn default_mnist_n_test() -> usize {
    200
}
fn default_true() -> bool {
    true
}

/// The `[data]` section of a TOML config, selected by `kind`.
///
/// Keys are the snake_case field names; every field has a default, and unknown keys are rejected.
/// ```toml
/// [data]
/// kind = "gaussian-mixture"   # or "linear2d", "regression1d", "mnist"
/// dim = 100
/// per_class = 1000
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DataConfig {
    /// The EPK paper §4.1 mixture: `K = 3` classes with means `(1,4,0,…)`, `(4,1,0,…)`,
    /// `(5,5,0,…)` in `dim` dimensions (`dim >= 2`; `dim = 2` is the 2-D plotting version) and
    /// isotropic normal noise of standard deviation `std`. Training rows are blocked by class
    /// (all class-0 rows first); test row `i` has class `i % 3`.
    GaussianMixture {
        /// Input dimension (default 100, at least 2).
        #[serde(default = "default_mixture_dim")]
        dim: usize,
        /// Training points per class (default 1000).
        #[serde(default = "default_per_class")]
        per_class: usize,
        /// Number of test points (default 200).
        #[serde(default = "default_mixture_n_test")]
        n_test: usize,
        /// Noise standard deviation (default 1.0).
        #[serde(default = "default_std")]
        std: f64,
        /// Random seed (default 0).
        #[serde(default)]
        seed: u64,
    },
    /// The Domingos notebook's 2-D linear toy: `x ~ N(0, I_2)`, label 1 if `x0 + x1 > 0` else 0,
    /// `K = 2`.
    #[serde(alias = "linear-2d")]
    Linear2d {
        /// Number of training points (default 20).
        #[serde(default = "default_linear_n_train")]
        n_train: usize,
        /// Number of test points (default 100).
        #[serde(default = "default_linear_n_test")]
        n_test: usize,
        /// Random seed (default 0).
        #[serde(default)]
        seed: u64,
    },
    /// The NTK notebook's 1-D regression: training inputs `[-3, 0.5]` with targets `[2, -1]`
    /// (`K = 1`, [`Targets::Values`]); `n_test` test inputs evenly spaced on `[-4, 4]` (both ends
    /// included) with unknown targets stored as 0.
    #[serde(alias = "regression-1d")]
    Regression1d {
        /// Number of test points (default 101, at least 2).
        #[serde(default = "default_regression_n_test")]
        n_test: usize,
    },
    /// MNIST from the raw IDX files in `path`: training images `offset..offset + n_train` and test
    /// images `offset..offset + n_test`. `image_shape = [1, 28, 28]`, `K = 10`.
    ///
    /// With `per_class`, the training set is instead the first `per_class` images of each digit
    /// among the training images from `offset` on, kept in file order (digits interleaved as in
    /// the file); `val_per_class` then adds a validation split of the next `val_per_class`
    /// images of each digit (those after that digit's training images), also in file order.
    /// The uncertainty benchmark's protocol is
    /// ```toml
    /// [data]
    /// kind = "mnist"
    /// per_class = 200       # 2 000 training images
    /// val_per_class = 50    # 500 validation images
    /// n_test = 2000         # t10k images 0..2000
    /// normalize = false     # pixels x/255 in [0, 1]
    /// ```
    Mnist {
        /// Directory holding the IDX files (default `"data/mnist"`), relative to the `base_dir`
        /// passed to [`DataConfig::load`] unless absolute.
        #[serde(default = "default_mnist_path")]
        path: String,
        /// Number of training images (default 1000).
        #[serde(default = "default_mnist_n_train")]
        n_train: usize,
        /// Number of test images (default 200).
        #[serde(default = "default_mnist_n_test")]
        n_test: usize,
        /// Images skipped at the start of both files (default 0).
        #[serde(default)]
        offset: usize,
        /// Map pixels to `(x/255 − 0.1307)/0.3081` (default true), else to `x/255` (in `[0, 1]`).
        #[serde(default = "default_true")]
        normalize: bool,
        /// Select the training set per digit: the first `per_class` images of each digit from
        /// image `offset` on, in file order (default unset: `n_train` consecutive images).
        /// `n_train` is not used then and must be left out.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        per_class: Option<usize>,
        /// With `per_class`: a validation split of the next `val_per_class` images of each digit
        /// (default unset: no validation split).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        val_per_class: Option<usize>,
    },
}

impl Default for DataConfig {
    /// The Gaussian mixture with its defaults (`dim = 100`, 1000 per class, 200 test, std 1, seed 0).
    fn default() -> Self {
        DataConfig::GaussianMixture {
            dim: default_mixture_dim(),
            per_class: default_per_class(),
            n_test: default_mixture_n_test(),
            std: default_std(),
            seed: 0,
        }
    }
}

fn cfg_err(msg: String) -> Error {
    Error::Config(msg)
}

impl DataConfig {
    /// The `kind` string of this configuration, as written in TOML.
    pub fn kind(&self) -> &'static str {
        match self {
            DataConfig::GaussianMixture { .. } => "gaussian-mixture",
            DataConfig::Linear2d { .. } => "linear2d",
            DataConfig::Regression1d { .. } => "regression1d",
            DataConfig::Mnist { .. } => "mnist",
        }
    }

    /// Checks the values (zero sizes, `std <= 0` or non-finite, `dim < 2`, sizes whose product
    /// overflows, ...), returning a precise [`Error::Config`] naming the offending key.
    pub fn validate(&self) -> Result<()> {
        match *self {
            DataConfig::GaussianMixture {
                dim,
                per_class,
                n_test,
                std,
                seed: _,
            } => {
                if dim < 2 {
                    return Err(cfg_err(format!(
                        "data.dim must be >= 2 for gaussian-mixture, got {dim}"
                    )));
                }
                if per_class == 0 {
                    return Err(cfg_err("data.per_class must be >= 1, got 0".into()));
                }
                if n_test == 0 {
                    return Err(cfg_err("data.n_test must be >= 1, got 0".into()));
                }
                if !std.is_finite() || std <= 0.0 {
                    return Err(cfg_err(format!(
                        "data.std must be finite and > 0, got {std}"
                    )));
                }
                let total = per_class
                    .checked_mul(3)
                    .and_then(|m| m.checked_add(n_test))
                    .and_then(|m| m.checked_mul(dim));
                if total.is_none_or(|t| t > isize::MAX as usize / 8) {
                    return Err(cfg_err(format!(
                        "data: gaussian-mixture of (3 * {per_class} + {n_test}) rows x {dim} dims is too large"
                    )));
                }
            }
            DataConfig::Linear2d {
                n_train,
                n_test,
                seed: _,
            } => {
                if n_train < 2 {
                    return Err(cfg_err(format!(
                        "data.n_train must be >= 2 for linear2d (two classes are needed), got {n_train}"
                    )));
                }
                if n_test == 0 {
                    return Err(cfg_err("data.n_test must be >= 1, got 0".into()));
                }
                if n_train.max(n_test) > isize::MAX as usize / 16 {
                    return Err(cfg_err("data: linear2d sizes are too large".into()));
                }
            }
            DataConfig::Regression1d { n_test } => {
                if n_test < 2 {
                    return Err(cfg_err(format!(
                        "data.n_test must be >= 2 for regression1d (evenly spaced on [-4, 4] including both ends), got {n_test}"
                    )));
                }
                if n_test > isize::MAX as usize / 8 {
                    return Err(cfg_err("data.n_test is too large".into()));
                }
            }
            DataConfig::Mnist {
                ref path,
                n_train,
                n_test,
                offset,
                normalize: _,
                per_class,
                val_per_class,
            } => {
                if path.is_empty() {
                    return Err(cfg_err("data.path must not be empty".into()));
                }
                if n_train == 0 {
                    return Err(cfg_err("data.n_train must be >= 1, got 0".into()));
                }
                if n_test == 0 {
                    return Err(cfg_err("data.n_test must be >= 1, got 0".into()));
                }
                if offset.checked_add(n_train.max(n_test)).is_none() {
                    return Err(cfg_err("data.offset + data.n_train overflows".into()));
                }
                match (per_class, val_per_class) {
                    (None, Some(_)) => {
                        return Err(cfg_err(
                            "data.val_per_class needs data.per_class (the validation split is the next images of each digit after its training images)".into(),
                        ))
                    }
                    (Some(0), _) => {
                        return Err(cfg_err("data.per_class must be >= 1, got 0".into()))
                    }
                    (Some(_), Some(0)) => {
                        return Err(cfg_err(
                            "data.val_per_class must be >= 1, got 0 (leave it out for no validation split)".into(),
                        ))
                    }
                    (Some(pc), v) => {
                        if n_train != default_mnist_n_train() {
                            return Err(cfg_err(format!(
                                "data.n_train = {n_train} and data.per_class = {pc} both select the training set; give one of them"
                            )));
                        }
                        // 60 000 images in the real file; anything near usize::MAX is a typo.
                        if pc.checked_add(v.unwrap_or(0)).is_none_or(|t| t > isize::MAX as usize / (8 * 784 * 10)) {
                            return Err(cfg_err(format!(
                                "data.per_class = {pc} (+ val_per_class = {}) is too large",
                                v.unwrap_or(0)
                            )));
                        }
                    }
                    (None, None) => {}
                }
            }
        }
        Ok(())
    }

    /// Generates or loads the dataset (deterministic from the seed), validates it, and returns it.
    /// Relative MNIST paths are resolved against `base_dir` (typically the config file's directory).
    ///
    /// # Shapes
    /// The returned dataset has `x_train: [M, dim]`, `x_test: [P, dim]` (see [`Dataset`]).
    pub fn load(&self, base_dir: &Path) -> Result<Dataset> {
        self.validate()?;
        let ds = match *self {
            DataConfig::GaussianMixture {
                dim,
                per_class,
                n_test,
                std,
                seed,
            } => gaussian_mixture(dim, per_class, n_test, std, seed),
            DataConfig::Linear2d {
                n_train,
                n_test,
                seed,
            } => linear_2d(n_train, n_test, seed),
            DataConfig::Regression1d { n_test } => regression_1d(n_test),
            DataConfig::Mnist {
                ref path,
                n_train,
                n_test,
                offset,
                normalize,
                per_class,
                val_per_class,
            } => {
                let dir = base_dir.join(path);
                let (x_train, y_train, validation, train_desc) = match per_class {
                    None => {
                        let (x, y) =
                            load_mnist(&dir, MnistSplit::Train, offset, n_train, normalize)?;
                        (x, y, None, format!("train images {offset}..{}", offset + n_train))
                    }
                    Some(pc) => {
                        let sel = load_mnist_per_class(
                            &dir,
                            MnistSplit::Train,
                            offset,
                            &[pc, val_per_class.unwrap_or(0)],
                            normalize,
                        )?;
                        let mut sel = sel.into_iter();
                        let (x, y) = sel.next().expect("one selection per count");
                        let val = sel.next().filter(|_| val_per_class.is_some());
                        let mut desc = format!(
                            "train: the first {pc} images of each digit from image {offset} (file order)"
                        );
                        if let Some(v) = val_per_class {
                            desc += &format!(", validation: the next {v} of each digit");
                        }
                        let val = val.map(|(x, y)| Split { x, y: Targets::Labels(y) });
                        (x, y, val, desc)
                    }
                };
                let (x_test, y_test) =
                    load_mnist(&dir, MnistSplit::Test, offset, n_test, normalize)?;
                let pixels = if normalize {
                    format!("pixels (x/255 - {MNIST_MEAN})/{MNIST_STD}")
                } else {
                    "pixels x/255".to_string()
                };
                Dataset {
                    name: "mnist".into(),
                    description: format!(
                        "mnist from {path}, {train_desc}, test images {offset}..{}, {pixels}",
                        offset + n_test
                    ),
                    dim: 784,
                    image_shape: Some([1, 28, 28]),
                    num_outputs: 10,
                    x_train,
                    y_train: Targets::Labels(y_train),
                    x_test,
                    y_test: Targets::Labels(y_test),
                    validation,
                }
            }
        };
        ds.validate()?;
        Ok(ds)
    }
}

/// Mixture rows: row `i` of `labels` gets mean `MIXTURE_MEANS[label]` plus `std * N(0, I)` noise.
fn mixture_rows(rng: &mut ChaCha8Rng, labels: &[usize], dim: usize, std: f64) -> Vec<f64> {
    let mut x = Vec::with_capacity(labels.len() * dim);
    for &c in labels {
        let mean = MIXTURE_MEANS[c]
            .iter()
            .copied()
            .chain(std::iter::repeat(0.0));
        for m in mean.take(dim) {
            let z: f64 = rng.sample(StandardNormal);
            x.push(m + std * z);
        }
    }
    x
}

fn gaussian_mixture(dim: usize, per_class: usize, n_test: usize, std: f64, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let train_labels: Vec<usize> = (0..3)
        .flat_map(|c| std::iter::repeat_n(c, per_class))
        .collect();
    let x_train = mixture_rows(&mut rng, &train_labels, dim, std);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    let test_labels: Vec<usize> = (0..n_test).map(|i| i % 3).collect();
    let x_test = mixture_rows(&mut rng, &test_labels, dim, std);
    Dataset {
        name: "gaussian-mixture".into(),
        description: format!(
            "gaussian mixture d={dim}, {per_class}/class train, {n_test} test, std {std}, seed {seed}"
        ),
        dim,
        image_shape: None,
        num_outputs: 3,
        x_train,
        y_train: Targets::Labels(train_labels),
        x_test,
        y_test: Targets::Labels(test_labels),
        validation: None,
    }
}

fn linear_rows(rng: &mut ChaCha8Rng, n: usize) -> (Vec<f64>, Vec<usize>) {
    let mut x = Vec::with_capacity(2 * n);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let a: f64 = rng.sample(StandardNormal);
        let b: f64 = rng.sample(StandardNormal);
        x.push(a);
        x.push(b);
        y.push(usize::from(a + b > 0.0));
    }
    (x, y)
}

fn linear_2d(n_train: usize, n_test: usize, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (x_train, y_train) = linear_rows(&mut rng, n_train);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1);
    let (x_test, y_test) = linear_rows(&mut rng, n_test);
    Dataset {
        name: "linear2d".into(),
        description: format!(
            "linear 2-d toy x ~ N(0, I2), label = [x0 + x1 > 0], {n_train} train, {n_test} test, seed {seed}"
        ),
        dim: 2,
        image_shape: None,
        num_outputs: 2,
        x_train,
        y_train: Targets::Labels(y_train),
        x_test,
        y_test: Targets::Labels(y_test),
        validation: None,
    }
}

fn regression_1d(n_test: usize) -> Dataset {
    let denom = (n_test - 1) as f64;
    let x_test: Vec<f64> = (0..n_test)
        .map(|i| -4.0 + 8.0 * (i as f64) / denom)
        .collect();
    Dataset {
        name: "regression1d".into(),
        description: format!(
            "1-d regression: train x = [-3, 0.5], y = [2, -1]; {n_test} test points evenly spaced on [-4, 4] (targets unknown, stored as 0)"
        ),
        dim: 1,
        image_shape: None,
        num_outputs: 1,
        x_train: REGRESSION1D_X.to_vec(),
        y_train: Targets::Values(REGRESSION1D_Y.to_vec()),
        x_test,
        y_test: Targets::Values(vec![0.0; n_test]),
        validation: None,
    }
}

// ---------------------------------------------------------------------------------------------
// IDX files and MNIST
// ---------------------------------------------------------------------------------------------

/// A parsed IDX array (the MNIST file format, <http://yann.lecun.com/exdb/mnist/>) of unsigned bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdxArray {
    /// The dimensions, outermost first (e.g. `[60000, 28, 28]`).
    pub dims: Vec<usize>,
    /// The elements in row-major order.
    ///
    /// # Shapes
    /// `dims`, flattened row-major; `data.len()` equals the product of `dims`.
    pub data: Vec<u8>,
}

fn idx_type_name(t: u8) -> Option<&'static str> {
    match t {
        0x08 => Some("unsigned byte"),
        0x09 => Some("signed byte"),
        0x0B => Some("i16"),
        0x0C => Some("i32"),
        0x0D => Some("f32"),
        0x0E => Some("f64"),
        _ => None,
    }
}

/// Parses the bytes of an IDX file. The header is the magic number `0x00 0x00 TYPE NDIMS`
/// followed by `NDIMS` big-endian `u32` dimensions; the data follow, row-major.
///
/// Only element type `0x08` (unsigned byte) is supported; other types are rejected with a clear
/// message. Checks: at least 4 bytes, zero first two magic bytes, `1 <= NDIMS <= 4`, a complete
/// header, no overflow in the product of the dimensions, and a data length equal to that product
/// exactly (truncated data and trailing bytes are both errors). `path` is only used in error
/// messages ([`Error::Format`]). Never panics.
///
/// # Shapes
/// `bytes`: the whole file. Returns `data` of length `product(dims)`.
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray> {
    let fail = |msg: String| Err(Error::format(path, msg));
    if bytes.is_empty() {
        return fail("empty file (0 bytes), expected an IDX header".into());
    }
    if bytes.len() < 4 {
        return fail(format!(
            "truncated IDX header: file has {} bytes, the magic number alone needs 4",
            bytes.len()
        ));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        let hint = if bytes[0] == 0x1f && bytes[1] == 0x8b {
            " (this looks gzip-compressed; gunzip it first)"
        } else {
            ""
        };
        return fail(format!(
            "bad IDX magic number: first two bytes must be 0x00 0x00, got 0x{:02x} 0x{:02x}{hint}",
            bytes[0], bytes[1]
        ));
    }
    let ty = bytes[2];
    if ty != 0x08 {
        return match idx_type_name(ty) {
            Some(name) => fail(format!(
                "unsupported IDX element type 0x{ty:02x} ({name}); only 0x08 (unsigned byte) is supported"
            )),
            None => fail(format!(
                "unknown IDX element type 0x{ty:02x}; only 0x08 (unsigned byte) is supported"
            )),
        };
    }
    let ndims = bytes[3] as usize;
    if !(1..=4).contains(&ndims) {
        return fail(format!(
            "unsupported number of IDX dimensions {ndims} (expected 1 to 4)"
        ));
    }
    let header_len = 4 + 4 * ndims;
    if bytes.len() < header_len {
        return fail(format!(
            "truncated IDX header: {ndims} dimensions need a {header_len}-byte header, file has {} bytes",
            bytes.len()
        ));
    }
    let mut dims = Vec::with_capacity(ndims);
    for k in 0..ndims {
        let o = 4 + 4 * k;
        let d = u32::from_be_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        match usize::try_from(d) {
            Ok(d) => dims.push(d),
            Err(_) => return fail(format!("IDX dimension {k} = {d} does not fit in usize")),
        }
    }
    let Some(expected) = dims.iter().try_fold(1usize, |a, &b| a.checked_mul(b)) else {
        return fail(format!(
            "IDX dimensions {dims:?} overflow: their product does not fit in usize"
        ));
    };
    let found = bytes.len() - header_len;
    if found < expected {
        return fail(format!(
            "truncated IDX data: dimensions {dims:?} need {expected} data bytes, found {found}"
        ));
    }
    if found > expected {
        return fail(format!(
            "{} trailing bytes after the IDX data: dimensions {dims:?} need {expected} data bytes, found {found}",
            found - expected
        ));
    }
    Ok(IdxArray {
        dims,
        data: bytes[header_len..].to_vec(),
    })
}

/// Reads and parses an IDX file (see [`parse_idx`]).
///
/// # Shapes
/// Returns `data` of length `product(dims)`.
pub fn read_idx(path: &Path) -> Result<IdxArray> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse_idx(&bytes, path)
}

/// Which MNIST file pair to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MnistSplit {
    /// The 60 000 training images (`train-images`, `train-labels`).
    Train,
    /// The 10 000 test images (`t10k-images`, `t10k-labels`).
    Test,
}

impl MnistSplit {
    fn prefix(self) -> &'static str {
        match self {
            MnistSplit::Train => "train",
            MnistSplit::Test => "t10k",
        }
    }
}

const FETCH_HINT: &str = "run `bash data/fetch-mnist.sh` to download MNIST";

fn not_found(path: &Path, what: String) -> Error {
    Error::io(
        path,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{what}; {FETCH_HINT}"),
        ),
    )
}

/// Finds `{prefix}-{kind}.{idxN}-ubyte` or `{prefix}-{kind}-{idxN}-ubyte` in `dir`.
fn find_mnist_file(dir: &Path, split: MnistSplit, kind: &str, idx: &str) -> Result<PathBuf> {
    let p = split.prefix();
    let dotted = dir.join(format!("{p}-{kind}.{idx}-ubyte"));
    let dashed = dir.join(format!("{p}-{kind}-{idx}-ubyte"));
    for cand in [&dotted, &dashed] {
        if cand.is_file() {
            return Ok(cand.clone());
        }
    }
    for gz in [
        format!("{p}-{kind}.{idx}-ubyte.gz"),
        format!("{p}-{kind}-{idx}-ubyte.gz"),
    ] {
        let gz = dir.join(gz);
        if gz.is_file() {
            return Err(Error::format(
                &gz,
                format!("MNIST file is gzip-compressed; gunzip it (or {FETCH_HINT})"),
            ));
        }
    }
    Err(not_found(
        &dotted,
        format!("MNIST file not found (also tried {})", dashed.display()),
    ))
}

/// Loads `count` MNIST images and labels of `split`, starting at image `offset`, from the raw IDX
/// files in `dir`. Both file namings are accepted: `train-images.idx3-ubyte` and
/// `train-images-idx3-ubyte` (likewise `train-labels.idx1-ubyte`, `t10k-images.idx3-ubyte`,
/// `t10k-labels.idx1-ubyte`).
///
/// Checks that the images are 3-D `[n, 28, 28]`, the labels 1-D `[n]` with the same `n`, every
/// label is at most 9, and `offset + count <= n`. Pixels map to `(x/255 − 0.1307)/0.3081` when
/// `normalize`, else to `x/255`. A missing directory or file is an [`Error::Io`] (not found) whose
/// message says to run `bash data/fetch-mnist.sh`.
///
/// # Shapes
/// Returns `(x: [count, 784], labels: [count])`, rows in file order.
pub fn load_mnist(
    dir: &Path,
    split: MnistSplit,
    offset: usize,
    count: usize,
    normalize: bool,
) -> Result<(Vec<f64>, Vec<usize>)> {
    let (images, labels, img_path) = read_mnist_pair(dir, split)?;
    let n = images.dims[0];
    let end = match offset.checked_add(count) {
        Some(end) if end <= n => end,
        _ => {
            return Err(Error::Data(format!(
                "requested MNIST {split:?} images {offset}..{} but {} holds only {n}",
                offset as u128 + count as u128,
                img_path.display()
            )))
        }
    };
    let px = 28 * 28;
    let x: Vec<f64> = images.data[offset * px..end * px]
        .iter()
        .map(|&b| mnist_pixel(b, normalize))
        .collect();
    let y: Vec<usize> = labels.data[offset..end]
        .iter()
        .map(|&l| l as usize)
        .collect();
    Ok((x, y))
}

/// Pixel byte → `f64`: `(b/255 − 0.1307)/0.3081` when `normalize`, else `b/255`.
fn mnist_pixel(b: u8, normalize: bool) -> f64 {
    let v = f64::from(b) / 255.0;
    if normalize {
        (v - MNIST_MEAN) / MNIST_STD
    } else {
        v
    }
}

/// Loads consecutive per-digit selections of MNIST `split` from image `offset` on: selection
/// `s` holds, for every digit 0–9, that digit's images number `c_0 + … + c_{s−1}` to
/// `c_0 + … + c_s − 1` (counting that digit's images from `offset` in file order), where
/// `c = counts`. Rows of each selection stay in file order (digits interleaved as in the file).
/// With `counts = [200, 50]` this is "the first 200 images of each digit, and the next 50".
///
/// Files, checks and pixel mapping as in [`load_mnist`]; an [`Error::Data`] names the first
/// digit with too few images after `offset`.
///
/// # Shapes
/// Returns one `(x: [10·c_s, 784], labels: [10·c_s])` per entry of `counts`.
pub fn load_mnist_per_class(
    dir: &Path,
    split: MnistSplit,
    offset: usize,
    counts: &[usize],
    normalize: bool,
) -> Result<Vec<(Vec<f64>, Vec<usize>)>> {
    let (images, labels, img_path) = read_mnist_pair(dir, split)?;
    let n = images.dims[0];
    let need = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).ok_or_else(|| {
        Error::Data(format!("MNIST per-digit counts {counts:?} overflow"))
    })?;
    // Cumulative ends: selection s takes ranks ends[s-1]..ends[s] of each digit.
    let ends: Vec<usize> = counts
        .iter()
        .scan(0usize, |a, &c| {
            *a += c;
            Some(*a)
        })
        .collect();
    let px = 28 * 28;
    let mut out: Vec<(Vec<f64>, Vec<usize>)> = counts
        .iter()
        .map(|&c| (Vec::with_capacity(10 * c * px), Vec::with_capacity(10 * c)))
        .collect();
    let mut seen = [0usize; 10];
    for i in offset.min(n)..n {
        let d = labels.data[i] as usize;
        let rank = seen[d];
        if rank >= need {
            if seen.iter().all(|&s| s >= need) {
                break;
            }
            continue;
        }
        seen[d] += 1;
        let s = ends.iter().position(|&e| rank < e).expect("rank < need = last end");
        out[s].0.extend(images.data[i * px..(i + 1) * px].iter().map(|&b| mnist_pixel(b, normalize)));
        out[s].1.push(d);
    }
    if let Some(d) = (0..10).find(|&d| seen[d] < need) {
        return Err(Error::Data(format!(
            "{} holds only {} images of digit {d} from image {offset} on; {need} are needed ({counts:?} per digit)",
            img_path.display(),
            seen[d]
        )));
    }
    Ok(out)
}

/// Reads and checks an MNIST image/label file pair; returns `(images, labels, image path)`.
fn read_mnist_pair(dir: &Path, split: MnistSplit) -> Result<(IdxArray, IdxArray, PathBuf)> {
    if !dir.is_dir() {
        return Err(not_found(dir, "MNIST directory not found".into()));
    }
    let img_path = find_mnist_file(dir, split, "images", "idx3")?;
    let lbl_path = find_mnist_file(dir, split, "labels", "idx1")?;
    let images = read_idx(&img_path)?;
    let labels = read_idx(&lbl_path)?;
    if images.dims.len() != 3 || images.dims[1] != 28 || images.dims[2] != 28 {
        return Err(Error::format(
            &img_path,
            format!(
                "MNIST images must have dimensions [n, 28, 28], got {:?}",
                images.dims
            ),
        ));
    }
    if labels.dims.len() != 1 {
        return Err(Error::format(
            &lbl_path,
            format!(
                "MNIST labels must have dimensions [n], got {:?}",
                labels.dims
            ),
        ));
    }
    let n = images.dims[0];
    if labels.dims[0] != n {
        return Err(Error::ShapeMismatch {
            what: format!(
                "MNIST label count of {} vs image count of {}",
                lbl_path.display(),
                img_path.display()
            ),
            expected: vec![n],
            got: vec![labels.dims[0]],
        });
    }
    if let Some((i, &l)) = labels.data.iter().enumerate().find(|(_, &l)| l > 9) {
        return Err(Error::format(
            &lbl_path,
            format!("label {i} is {l}, not a digit 0..=9"),
        ));
    }
    Ok((images, labels, img_path))
}

// ---------------------------------------------------------------------------------------------
// Plotting grid
// ---------------------------------------------------------------------------------------------

/// A regular `n × n` grid over the bounding box of the 2-D points `x`, enlarged on each side by
/// `margin` times the box's extent along that axis (an axis with zero extent is treated as having
/// extent 1). Row `j * n + i` is `(lo0 + i * step0, lo1 + j * step1)`, i.e. `x0` varies fastest;
/// the first row is the lower-left corner and the last the upper-right one.
///
/// Errors if `x` is empty, has an odd length (not 2-D), holds non-finite values, `n < 2`, or
/// `margin` is negative or non-finite.
///
/// # Shapes
/// `x: [n_points, 2]`; returns `[n * n, 2]`.
pub fn grid_2d(x: &[f64], n: usize, margin: f64) -> Result<Vec<f64>> {
    if x.is_empty() {
        return Err(Error::Data("grid_2d: no points given".into()));
    }
    if x.len() % 2 == 1 {
        return Err(Error::Data(format!(
            "grid_2d: points must be 2-D ([n_points, 2]), got {} values (odd)",
            x.len()
        )));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!(
            "grid_2d: non-finite point coordinate x[{}, {}]",
            i / 2,
            i % 2
        )));
    }
    if n < 2 {
        return Err(Error::Data(format!("grid_2d: n must be >= 2, got {n}")));
    }
    if !margin.is_finite() || margin < 0.0 {
        return Err(Error::Data(format!(
            "grid_2d: margin must be finite and >= 0, got {margin}"
        )));
    }
    if n.checked_mul(n)
        .and_then(|m| m.checked_mul(2))
        .is_none_or(|m| m > isize::MAX as usize / 8)
    {
        return Err(Error::Data(format!("grid_2d: n = {n} is too large")));
    }
    let mut lo = [f64::INFINITY; 2];
    let mut hi = [f64::NEG_INFINITY; 2];
    for p in x.chunks_exact(2) {
        for a in 0..2 {
            lo[a] = lo[a].min(p[a]);
            hi[a] = hi[a].max(p[a]);
        }
    }
    let mut step = [0.0; 2];
    for a in 0..2 {
        let extent = if hi[a] > lo[a] { hi[a] - lo[a] } else { 1.0 };
        lo[a] -= margin * extent;
        hi[a] += margin * extent;
        step[a] = (hi[a] - lo[a]) / (n - 1) as f64;
    }
    let mut g = Vec::with_capacity(2 * n * n);
    for j in 0..n {
        // Use the exact upper bound on the last row/column to avoid rounding drift.
        let y = if j == n - 1 {
            hi[1]
        } else {
            lo[1] + j as f64 * step[1]
        };
        for i in 0..n {
            let xv = if i == n - 1 {
                hi[0]
            } else {
                lo[0] + i as f64 * step[0]
            };
            g.push(xv);
            g.push(y);
        }
    }
    Ok(g)
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn idx_bytes(ty: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8, 0, ty, dims.len() as u8];
        for d in dims {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b.extend_from_slice(data);
        b
    }

    fn p() -> &'static Path {
        Path::new("test.idx")
    }

    fn err_msg(r: Result<IdxArray>) -> String {
        match r {
            Ok(a) => panic!("expected an error, got {a:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn idx_round_trip() {
        for dims in [
            vec![5u32],
            vec![2, 3],
            vec![2, 3, 4],
            vec![1, 2, 3, 2],
            vec![0, 7],
        ] {
            let n: u32 = dims.iter().product();
            let data: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            let a = parse_idx(&idx_bytes(8, &dims, &data), p()).unwrap();
            assert_eq!(a.dims, dims.iter().map(|&d| d as usize).collect::<Vec<_>>());
            assert_eq!(a.data, data);
        }
    }

    #[test]
    fn idx_errors() {
        let good = idx_bytes(8, &[2, 3], &[1, 2, 3, 4, 5, 6]);
        assert!(err_msg(parse_idx(&[], p())).contains("empty"));
        assert!(err_msg(parse_idx(&[0, 0, 8], p())).contains("truncated IDX header"));
        let mut bad = good.clone();
        bad[0] = 1;
        let m = err_msg(parse_idx(&bad, p()));
        assert!(m.contains("magic") && m.contains("0x01"), "{m}");
        assert!(m.starts_with("test.idx: "), "{m}");
        let mut bad = good.clone();
        bad[1] = 0xff;
        assert!(err_msg(parse_idx(&bad, p())).contains("magic"));
        let gz = [0x1f, 0x8b, 8, 0, 0, 0];
        assert!(err_msg(parse_idx(&gz, p())).contains("gzip"));
        let m = err_msg(parse_idx(&idx_bytes(0x0D, &[2], &[0; 8]), p()));
        assert!(
            m.contains("unsupported IDX element type 0x0d") && m.contains("f32"),
            "{m}"
        );
        let m = err_msg(parse_idx(&idx_bytes(0x42, &[2], &[0; 2]), p()));
        assert!(m.contains("element type 0x42"), "{m}");
        let m = err_msg(parse_idx(&idx_bytes(8, &[], &[]), p()));
        assert!(m.contains("number of IDX dimensions 0"), "{m}");
        let m = err_msg(parse_idx(&idx_bytes(8, &[1, 1, 1, 1, 1], &[0]), p()));
        assert!(m.contains("number of IDX dimensions 5"), "{m}");
        let m = err_msg(parse_idx(&good[..9], p()));
        assert!(
            m.contains("truncated IDX header") && m.contains("12-byte"),
            "{m}"
        );
        let m = err_msg(parse_idx(&good[..good.len() - 1], p()));
        assert!(
            m.contains("truncated IDX data") && m.contains("need 6") && m.contains("found 5"),
            "{m}"
        );
        let mut long = good.clone();
        long.extend_from_slice(&[9, 9]);
        let m = err_msg(parse_idx(&long, p()));
        assert!(m.contains("2 trailing bytes"), "{m}");
        let m = err_msg(parse_idx(
            &idx_bytes(8, &[u32::MAX, u32::MAX, u32::MAX], &[]),
            p(),
        ));
        assert!(m.contains("overflow") || m.contains("truncated"), "{m}");
    }

    #[test]
    fn idx_never_panics() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let good = idx_bytes(8, &[3, 2, 2], &[7; 12]);
        for k in 0..=good.len() {
            let _ = parse_idx(&good[..k], p());
        }
        for _ in 0..20_000 {
            let len = rng.gen_range(0..40);
            let mut b: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if len >= 4 && rng.gen_bool(0.7) {
                b[0] = 0;
                b[1] = 0;
                b[2] = 8;
                b[3] = rng.gen_range(0..6);
            }
            if let Ok(a) = parse_idx(&b, p()) {
                assert_eq!(a.data.len(), a.dims.iter().product::<usize>());
            }
        }
    }

    #[test]
    fn read_idx_file_and_missing() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&idx_bytes(8, &[4], &[1, 2, 3, 4])).unwrap();
        f.flush().unwrap();
        let a = read_idx(f.path()).unwrap();
        assert_eq!(a.dims, vec![4]);
        assert_eq!(a.data, vec![1, 2, 3, 4]);
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.idx");
        match read_idx(&missing) {
            Err(Error::Io { path, source }) => {
                assert_eq!(path, missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected Io error, got {other:?}"),
        }
    }

    /// Writes fake MNIST files: `n` images where image `i` has every pixel `= (i * 10) % 256` and
    /// label `labels[i]`.
    fn write_fake_mnist(dir: &Path, prefix: &str, sep: &str, n_img: u32, labels: &[u8]) {
        let pixels: Vec<u8> = (0..n_img)
            .flat_map(|i| std::iter::repeat_n((i * 10 % 256) as u8, 784))
            .collect();
        std::fs::write(
            dir.join(format!("{prefix}-images{sep}idx3-ubyte")),
            idx_bytes(8, &[n_img, 28, 28], &pixels),
        )
        .unwrap();
        std::fs::write(
            dir.join(format!("{prefix}-labels{sep}idx1-ubyte")),
            idx_bytes(8, &[labels.len() as u32], labels),
        )
        .unwrap();
    }

    #[test]
    fn mnist_fake_files_both_namings() {
        let dir = tempfile::tempdir().unwrap();
        write_fake_mnist(dir.path(), "train", ".", 5, &[0, 1, 2, 3, 9]);
        write_fake_mnist(dir.path(), "t10k", "-", 3, &[7, 8, 9]);
        let (x, y) = load_mnist(dir.path(), MnistSplit::Train, 1, 3, false).unwrap();
        assert_eq!(y, vec![1, 2, 3]);
        assert_eq!(x.len(), 3 * 784);
        assert_eq!(x[0], 10.0 / 255.0);
        assert_eq!(x[784 * 2 + 783], 30.0 / 255.0);
        let (x, y) = load_mnist(dir.path(), MnistSplit::Test, 0, 3, true).unwrap();
        assert_eq!(y, vec![7, 8, 9]);
        assert_eq!(x[0], (0.0 - 0.1307) / 0.3081);
        assert!((x[784] - (10.0 / 255.0 - 0.1307) / 0.3081).abs() < 1e-15);
        assert!((x[784 * 2] - (20.0 / 255.0 - 0.1307) / 0.3081).abs() < 1e-15);
        // Requesting more than available.
        let e = load_mnist(dir.path(), MnistSplit::Test, 1, 3, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds only 3"), "{e}");
        let e = load_mnist(dir.path(), MnistSplit::Test, usize::MAX, 3, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("holds only 3"), "{e}");

        // Through DataConfig, with a path relative to base_dir.
        let sub = dir.path().join("m");
        std::fs::create_dir(&sub).unwrap();
        write_fake_mnist(&sub, "train", "-", 4, &[3, 3, 5, 5]);
        write_fake_mnist(&sub, "t10k", ".", 2, &[1, 2]);
        let cfg = DataConfig::Mnist {
            path: "m".into(),
            n_train: 3,
            n_test: 1,
            offset: 1,
            normalize: true,
            per_class: None,
            val_per_class: None,
        };
        let ds = cfg.load(dir.path()).unwrap();
        assert_eq!(
            (ds.n_train(), ds.n_test(), ds.dim, ds.num_outputs),
            (3, 1, 784, 10)
        );
        assert_eq!(ds.image_shape, Some([1, 28, 28]));
        assert_eq!(ds.y_train, Targets::Labels(vec![3, 5, 5]));
        assert_eq!(ds.y_test, Targets::Labels(vec![2]));
    }

    #[test]
    fn mnist_errors() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_mnist(&dir.path().join("absent"), MnistSplit::Train, 0, 1, true).unwrap_err();
        assert!(matches!(e, Error::Io { .. }));
        assert!(e.to_string().contains("bash data/fetch-mnist.sh"), "{e}");
        let e = load_mnist(dir.path(), MnistSplit::Train, 0, 1, true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train-images.idx3-ubyte") && e.contains("bash data/fetch-mnist.sh"),
            "{e}"
        );
        // Count mismatch.
        write_fake_mnist(dir.path(), "train", ".", 3, &[1, 2]);
        let e = load_mnist(dir.path(), MnistSplit::Train, 0, 1, true).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        assert!(e.to_string().contains("expected [3], got [2]"), "{e}");
        // Label out of range.
        write_fake_mnist(dir.path(), "train", ".", 3, &[1, 11, 2]);
        let e = load_mnist(dir.path(), MnistSplit::Train, 0, 1, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("label 1 is 11"), "{e}");
        // Wrong image shape.
        std::fs::write(
            dir.path().join("t10k-images.idx3-ubyte"),
            idx_bytes(8, &[2, 4], &[0; 8]),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("t10k-labels.idx1-ubyte"),
            idx_bytes(8, &[2], &[0, 1]),
        )
        .unwrap();
        let e = load_mnist(dir.path(), MnistSplit::Test, 0, 1, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[n, 28, 28]"), "{e}");
        // Gzipped file only.
        let gzdir = tempfile::tempdir().unwrap();
        std::fs::write(
            gzdir.path().join("train-images-idx3-ubyte.gz"),
            [0x1f, 0x8b],
        )
        .unwrap();
        let e = load_mnist(gzdir.path(), MnistSplit::Train, 0, 1, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gunzip"), "{e}");
    }

    /// The real files, when `bash data/fetch-mnist.sh` has been run (skipped otherwise).
    #[test]
    fn mnist_real_files_if_present() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
        if !dir.join("train-images.idx3-ubyte").is_file() {
            eprintln!("skipping: {} not present", dir.display());
            return;
        }
        let (x, y) = load_mnist(&dir, MnistSplit::Train, 0, 1000, true).unwrap();
        assert_eq!(&y[..5], &[5, 0, 4, 1, 9]);
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        assert!(mean.abs() < 0.05, "normalised mean {mean}");
        let (_, y) = load_mnist(&dir, MnistSplit::Test, 9998, 2, false).unwrap();
        assert_eq!(y.len(), 2);
        let (_, y) = load_mnist(&dir, MnistSplit::Test, 0, 5, false).unwrap();
        assert_eq!(y, vec![7, 2, 1, 0, 4]);
        assert!(load_mnist(&dir, MnistSplit::Test, 9998, 3, false).is_err());
    }

    /// The obvious per-digit selection: file indices of each selection, scanning from `offset`.
    fn select_by_rank(labels: &[usize], offset: usize, counts: &[usize]) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); counts.len()];
        let mut seen = [0usize; 10];
        for (i, &d) in labels.iter().enumerate().skip(offset) {
            let mut lo = 0;
            for (s, &c) in counts.iter().enumerate() {
                if seen[d] >= lo && seen[d] < lo + c {
                    out[s].push(i);
                }
                lo += c;
            }
            seen[d] += 1;
        }
        out
    }

    #[test]
    fn mnist_per_class_selection_fake_files() {
        let dir = tempfile::tempdir().unwrap();
        // 25 images; digit counts are uneven and interleaved. Image i has every pixel (10 i)/255.
        let labels: Vec<u8> = (0..25u32).map(|i| ((i * 7 + i / 10) % 10) as u8).collect();
        write_fake_mnist(dir.path(), "train", ".", 25, &labels);
        write_fake_mnist(dir.path(), "t10k", ".", 3, &[7, 8, 9]);
        let lab: Vec<usize> = labels.iter().map(|&l| l as usize).collect();
        // Every digit occurs at least twice from image 1 on.
        for offset in [0, 1] {
            let sel = load_mnist_per_class(dir.path(), MnistSplit::Train, offset, &[1, 1], false)
                .unwrap();
            let want = select_by_rank(&lab, offset, &[1, 1]);
            for (s, (x, y)) in sel.iter().enumerate() {
                assert_eq!(y.len(), 10);
                assert_eq!(x.len(), 10 * 784);
                assert_eq!(*y, want[s].iter().map(|&i| lab[i]).collect::<Vec<_>>());
                let ids: Vec<usize> = x.chunks(784).map(|r| (r[0] * 255.0 / 10.0).round() as usize).collect();
                assert_eq!(ids, want[s], "selection {s}, offset {offset}");
                // Rows in file order.
                assert!(ids.windows(2).all(|w| w[0] < w[1]));
            }
            let mut per_digit = [0; 10];
            sel[0].1.iter().for_each(|&d| per_digit[d] += 1);
            assert_eq!(per_digit, [1; 10]);
        }
        // Too few images of some digit.
        let e = load_mnist_per_class(dir.path(), MnistSplit::Train, 0, &[2, 2], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("images of digit") && e.contains("4 are needed"), "{e}");
        // Through DataConfig: per_class with a validation split, and without.
        let cfg: DataConfig = toml::from_str(
            "kind = \"mnist\"\npath = \".\"\nper_class = 1\nval_per_class = 1\nn_test = 3\nnormalize = false\n",
        )
        .unwrap();
        let ds = cfg.load(dir.path()).unwrap();
        assert_eq!((ds.n_train(), ds.n_val(), ds.n_test()), (10, 10, 3));
        let want = select_by_rank(&lab, 0, &[1, 1]);
        assert_eq!(ds.y_train, Targets::Labels(want[0].iter().map(|&i| lab[i]).collect()));
        let v = ds.validation.as_ref().unwrap();
        assert_eq!(v.y, Targets::Labels(want[1].iter().map(|&i| lab[i]).collect()));
        assert_eq!(v.x[0], (10 * want[1][0]) as f64 / 255.0);
        assert_eq!(ds.x_test[784], 10.0 / 255.0);
        assert!(
            ds.description.contains("first 1 images of each digit")
                && ds.description.contains("validation: the next 1 of each digit")
                && ds.description.contains("pixels x/255"),
            "{}",
            ds.description
        );
        let cfg: DataConfig =
            toml::from_str("kind = \"mnist\"\npath = \".\"\nper_class = 2\nn_test = 3\n").unwrap();
        let ds = cfg.load(dir.path()).unwrap();
        assert_eq!((ds.n_train(), ds.n_val()), (20, 0));
        assert!(ds.validation.is_none());
        // A validation split of the same kind is checked like the test set.
        let mut bad = ds.clone();
        bad.validation = Some(Split { x: vec![0.0; 784], y: Targets::Labels(vec![10]) });
        assert!(bad.validate().unwrap_err().to_string().contains("y_val[0] = 10"));
        bad.validation = Some(Split { x: vec![0.0; 783], y: Targets::Labels(vec![1]) });
        assert!(bad.validate().unwrap_err().to_string().contains("x_val has 783 values"));
        bad.validation = Some(Split { x: vec![f64::NAN; 784], y: Targets::Labels(vec![1]) });
        assert!(bad.validate().unwrap_err().to_string().contains("x_val[0, 0]"));
        bad.validation = Some(Split { x: vec![0.0; 784], y: Targets::Values(vec![0.0; 10]) });
        assert!(bad.validate().unwrap_err().to_string().contains("y_val and y_train"));
    }

    #[test]
    fn mnist_per_class_config_validation_and_stable_serialisation() {
        let bad = |s: &str, needle: &str| {
            let c: DataConfig = toml::from_str(s).unwrap();
            let e = c.validate().unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e}");
            assert!(e.to_string().contains(needle), "{s}: {e}");
        };
        bad("kind = \"mnist\"\nval_per_class = 5", "needs data.per_class");
        bad("kind = \"mnist\"\nper_class = 0", "per_class must be >= 1");
        bad("kind = \"mnist\"\nper_class = 3\nval_per_class = 0", "val_per_class must be >= 1");
        bad("kind = \"mnist\"\nper_class = 3\nn_train = 50", "give one of them");
        bad("kind = \"mnist\"\nper_class = 9223372036854775807", "too large");
        assert!(toml::from_str::<DataConfig>("kind = \"mnist\"\nper_class = -1").is_err());
        // Existing configurations serialise exactly as before (their run ids do not change).
        let old: DataConfig = toml::from_str("kind = \"mnist\"\nn_train = 100\nn_test = 20\n").unwrap();
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"kind":"mnist","path":"data/mnist","n_train":100,"n_test":20,"offset":0,"normalize":true}"#
        );
        let new: DataConfig =
            toml::from_str("kind = \"mnist\"\nper_class = 200\nval_per_class = 50\n").unwrap();
        let json = serde_json::to_string(&new).unwrap();
        assert!(json.ends_with(r#""normalize":true,"per_class":200,"val_per_class":50}"#), "{json}");
        assert_eq!(serde_json::from_str::<DataConfig>(&json).unwrap(), new);
        assert_eq!(toml::from_str::<DataConfig>(&toml::to_string(&new).unwrap()).unwrap(), new);
    }

    /// The uncertainty benchmark's split on the real files (skipped when absent): 200 + 50 per
    /// digit from the training file, checked against the obvious selection.
    #[test]
    fn mnist_real_per_class_if_present() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
        if !dir.join("train-images.idx3-ubyte").is_file() {
            eprintln!("skipping: {} not present", dir.display());
            return;
        }
        let cfg: DataConfig = toml::from_str(&format!(
            "kind = \"mnist\"\npath = \"{}\"\nper_class = 200\nval_per_class = 50\nn_test = 2000\nnormalize = false\n",
            dir.display()
        ))
        .unwrap();
        let ds = cfg.load(Path::new(".")).unwrap();
        assert_eq!((ds.n_train(), ds.n_val(), ds.n_test()), (2000, 500, 2000));
        let (xa, ya) = load_mnist(&dir, MnistSplit::Train, 0, 5000, false).unwrap();
        let want = select_by_rank(&ya, 0, &[200, 50]);
        assert_eq!(want[0].len(), 2000, "5000 images hold 250 of each digit");
        assert_eq!(want[1].len(), 500);
        let rows = |ids: &[usize]| -> Vec<f64> {
            ids.iter().flat_map(|&i| xa[i * 784..(i + 1) * 784].iter().copied()).collect()
        };
        assert_eq!(ds.x_train, rows(&want[0]));
        assert_eq!(ds.y_train, Targets::Labels(want[0].iter().map(|&i| ya[i]).collect()));
        let v = ds.validation.as_ref().unwrap();
        assert_eq!(v.x, rows(&want[1]));
        assert_eq!(v.y, Targets::Labels(want[1].iter().map(|&i| ya[i]).collect()));
        let Targets::Labels(y) = &ds.y_train else { panic!() };
        assert_eq!(&y[..5], &[5, 0, 4, 1, 9]);
        assert!(ds.x_train.iter().chain(&ds.x_test).all(|v| (0.0..=1.0).contains(v)));
        let (xt, _) = load_mnist(&dir, MnistSplit::Test, 0, 2000, false).unwrap();
        assert_eq!(ds.x_test, xt);
    }

    fn mixture(dim: usize, per_class: usize, n_test: usize, std: f64, seed: u64) -> Dataset {
        DataConfig::GaussianMixture {
            dim,
            per_class,
            n_test,
            std,
            seed,
        }
        .load(Path::new("."))
        .unwrap()
    }

    #[test]
    fn gaussian_mixture_statistics() {
        let (dim, per) = (5, 2000);
        let ds = mixture(dim, per, 30, 1.0, 3);
        assert_eq!(
            (ds.n_train(), ds.n_test(), ds.num_outputs),
            (3 * per, 30, 3)
        );
        let Targets::Labels(y) = &ds.y_train else {
            panic!()
        };
        for c in 0..3 {
            assert!(
                y[c * per..(c + 1) * per].iter().all(|&l| l == c),
                "train rows blocked by class"
            );
            let rows = &ds.x_train[c * per * dim..(c + 1) * per * dim];
            let mut want = [0.0; 5];
            want[..2].copy_from_slice(&MIXTURE_MEANS[c]);
            for (j, &w) in want.iter().enumerate() {
                let col: Vec<f64> = rows.iter().skip(j).step_by(dim).copied().collect();
                let m = col.iter().sum::<f64>() / per as f64;
                let s =
                    (col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (per - 1) as f64).sqrt();
                assert!((m - w).abs() < 0.1, "class {c} coord {j}: mean {m} vs {w}");
                assert!((s - 1.0).abs() < 0.05, "class {c} coord {j}: std {s}");
            }
        }
        assert_eq!(ds.y_test, Targets::Labels((0..30).map(|i| i % 3).collect()));
        // Noise scales with std.
        let ds2 = mixture(2, 2000, 3, 0.5, 3);
        let col: Vec<f64> = ds2.x_train[..4000].iter().step_by(2).copied().collect();
        let m = col.iter().sum::<f64>() / 2000.0;
        let s = (col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 1999.0).sqrt();
        assert!((s - 0.5).abs() < 0.03, "std {s}");
        assert!(ds.description.contains("d=5") && ds.description.contains("seed 3"));
    }

    #[test]
    fn gaussian_mixture_determinism() {
        let a = mixture(4, 10, 9, 1.0, 42);
        let b = mixture(4, 10, 9, 1.0, 42);
        assert_eq!(a, b);
        let c = mixture(4, 10, 9, 1.0, 43);
        assert_ne!(a.x_train, c.x_train);
        assert_ne!(a.x_test, c.x_test);
        // Test set is a separate stream: unaffected by the training-set size, and not a copy of it.
        let d = mixture(4, 20, 9, 1.0, 42);
        assert_eq!(a.x_test, d.x_test);
        assert_ne!(a.x_test[..], a.x_train[..a.x_test.len()]);
        let def = DataConfig::default().load(Path::new(".")).unwrap();
        assert_eq!((def.dim, def.n_train(), def.n_test()), (100, 3000, 200));
        assert_eq!(
            def.description,
            "gaussian mixture d=100, 1000/class train, 200 test, std 1, seed 0"
        );
    }

    #[test]
    fn linear2d_rule() {
        let ds = DataConfig::Linear2d {
            n_train: 500,
            n_test: 300,
            seed: 5,
        }
        .load(Path::new("."))
        .unwrap();
        assert_eq!(
            (ds.dim, ds.num_outputs, ds.n_train(), ds.n_test()),
            (2, 2, 500, 300)
        );
        for (x, y) in [(&ds.x_train, &ds.y_train), (&ds.x_test, &ds.y_test)] {
            let Targets::Labels(y) = y else { panic!() };
            for (p, &l) in x.chunks_exact(2).zip(y) {
                assert_eq!(l, usize::from(p[0] + p[1] > 0.0));
            }
            let ones = y.iter().filter(|&&l| l == 1).count() as f64 / y.len() as f64;
            assert!((ones - 0.5).abs() < 0.1, "fraction of 1s {ones}");
        }
        let def: DataConfig = toml::from_str("kind = \"linear2d\"").unwrap();
        let d = def.load(Path::new(".")).unwrap();
        assert_eq!((d.n_train(), d.n_test()), (20, 100));
        assert_eq!(d, def.load(Path::new(".")).unwrap());
    }

    #[test]
    fn regression1d_values() {
        let ds = DataConfig::Regression1d { n_test: 101 }
            .load(Path::new("."))
            .unwrap();
        assert!(!ds.is_classification());
        assert_eq!((ds.dim, ds.num_outputs), (1, 1));
        assert_eq!(ds.x_train, vec![-3.0, 0.5]);
        assert_eq!(ds.y_train, Targets::Values(vec![2.0, -1.0]));
        assert_eq!(ds.n_test(), 101);
        assert_eq!(ds.x_test[0], -4.0);
        assert_eq!(ds.x_test[50], 0.0);
        assert_eq!(ds.x_test[100], 4.0);
        assert!((ds.x_test[1] - -3.92).abs() < 1e-12);
        assert_eq!(ds.y_test, Targets::Values(vec![0.0; 101]));
        let ds = DataConfig::Regression1d { n_test: 2 }
            .load(Path::new("."))
            .unwrap();
        assert_eq!(ds.x_test, vec![-4.0, 4.0]);
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wrapper {
        data: DataConfig,
    }

    #[test]
    fn config_toml_parsing() {
        let w: Wrapper = toml::from_str("[data]\nkind = \"gaussian-mixture\"\n").unwrap();
        assert_eq!(w.data, DataConfig::default());
        let w: Wrapper =
            toml::from_str("[data]\nkind = \"gaussian-mixture\"\ndim = 2\nstd = 2\nseed = 9\n")
                .unwrap();
        assert_eq!(
            w.data,
            DataConfig::GaussianMixture {
                dim: 2,
                per_class: 1000,
                n_test: 200,
                std: 2.0,
                seed: 9
            }
        );
        let c: DataConfig = toml::from_str("kind = \"mnist\"\nn_train = 50\n").unwrap();
        assert_eq!(
            c,
            DataConfig::Mnist {
                path: "data/mnist".into(),
                n_train: 50,
                n_test: 200,
                offset: 0,
                normalize: true,
                per_class: None,
                val_per_class: None,
            }
        );
        let c: DataConfig = toml::from_str("kind = \"regression1d\"").unwrap();
        assert_eq!(c, DataConfig::Regression1d { n_test: 101 });
        let c: DataConfig = toml::from_str("kind = \"linear2d\"\nseed = 4").unwrap();
        assert_eq!(
            c,
            DataConfig::Linear2d {
                n_train: 20,
                n_test: 100,
                seed: 4
            }
        );
        // Round trip through serialisation.
        let s = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<DataConfig>(&s).unwrap(), c);

        // Unknown key, unknown kind, missing kind, wrong types.
        let e = toml::from_str::<Wrapper>("[data]\nkind = \"gaussian-mixture\"\nper_clas = 3\n")
            .unwrap_err();
        assert!(
            e.to_string().contains("unknown field") && e.to_string().contains("per_clas"),
            "{e}"
        );
        let e = toml::from_str::<DataConfig>("kind = \"regression1d\"\nseed = 1\n").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        let e = toml::from_str::<DataConfig>("kind = \"cifar\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown variant"), "{e}");
        assert!(toml::from_str::<DataConfig>("dim = 3\n").is_err());
        let e = toml::from_str::<DataConfig>("kind = \"gaussian-mixture\"\nper_class = \"many\"\n")
            .unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        assert!(
            toml::from_str::<DataConfig>("kind = \"gaussian-mixture\"\nper_class = -1\n").is_err()
        );
        assert!(toml::from_str::<DataConfig>("kind = \"mnist\"\nnormalize = 1\n").is_err());

        // Values rejected by validate.
        let bad = |s: &str, needle: &str| {
            let c: DataConfig = toml::from_str(s).unwrap();
            let e = c.validate().unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e}");
            assert!(e.to_string().contains(needle), "{s}: {e}");
            assert!(c.load(Path::new(".")).is_err());
        };
        bad("kind = \"gaussian-mixture\"\nper_class = 0", "per_class");
        bad("kind = \"gaussian-mixture\"\nstd = -1", "std");
        bad("kind = \"gaussian-mixture\"\nstd = 0.0", "std");
        bad("kind = \"gaussian-mixture\"\nstd = nan", "std");
        bad("kind = \"gaussian-mixture\"\nstd = inf", "std");
        bad("kind = \"gaussian-mixture\"\ndim = 1", "dim");
        bad("kind = \"gaussian-mixture\"\nn_test = 0", "n_test");
        bad(
            "kind = \"gaussian-mixture\"\nper_class = 9223372036854775807",
            "too large",
        );
        bad("kind = \"linear2d\"\nn_train = 1", "n_train");
        bad("kind = \"linear2d\"\nn_test = 0", "n_test");
        bad("kind = \"regression1d\"\nn_test = 1", "n_test");
        bad("kind = \"mnist\"\nn_train = 0", "n_train");
        bad("kind = \"mnist\"\nn_test = 0", "n_test");
        bad("kind = \"mnist\"\npath = \"\"", "path");
        let c = DataConfig::Mnist {
            path: "m".into(),
            n_train: 2,
            n_test: 1,
            offset: usize::MAX,
            normalize: true,
            per_class: None,
            val_per_class: None,
        };
        assert!(c.validate().unwrap_err().to_string().contains("overflow"));
        for c in [
            DataConfig::default(),
            DataConfig::Linear2d {
                n_train: 20,
                n_test: 100,
                seed: 0,
            },
            DataConfig::Regression1d { n_test: 101 },
        ] {
            c.validate().unwrap();
            assert_eq!(c.load(Path::new(".")).unwrap().name, c.kind());
        }
    }

    #[test]
    fn dataset_validate() {
        let ok = || {
            Dataset::from_arrays(
                "t",
                "test",
                2,
                3,
                vec![0.0, 1.0, 2.0, 3.0],
                Targets::Labels(vec![0, 2]),
                vec![5.0, 5.0],
                Targets::Labels(vec![1]),
            )
            .unwrap()
        };
        let ds = ok();
        assert!(ds.is_classification());
        assert_eq!((ds.n_train(), ds.n_test()), (2, 1));
        let check = |f: &dyn Fn(&mut Dataset), needle: &str| {
            let mut d = ok();
            f(&mut d);
            let e = d.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "expected '{needle}' in: {e}");
        };
        check(&|d| d.dim = 0, "dim must be >= 1");
        check(&|d| d.num_outputs = 0, "num_outputs");
        check(&|d| d.image_shape = Some([1, 1, 3]), "image_shape");
        check(
            &|d| {
                d.x_train.clear();
                d.y_train = Targets::Labels(vec![])
            },
            "empty",
        );
        check(
            &|d| d.x_train.push(1.0),
            "x_train has 5 values, not a multiple of dim = 2",
        );
        check(&|d| d.x_test.push(1.0), "x_test has 3 values");
        check(
            &|d| d.y_train = Targets::Labels(vec![0, 1, 2]),
            "expected [2], got [3]",
        );
        check(&|d| d.y_test = Targets::Labels(vec![]), "y_test labels");
        check(&|d| d.x_train[3] = f64::NAN, "x_train[1, 1]");
        check(&|d| d.x_test[0] = f64::INFINITY, "x_test[0, 0]");
        check(
            &|d| d.y_train = Targets::Labels(vec![0, 3]),
            "y_train[1] = 3 is not < num_outputs = 3",
        );
        check(&|d| d.y_test = Targets::Labels(vec![7]), "y_test[0] = 7");
        check(
            &|d| d.y_train = Targets::Labels(vec![1, 1]),
            "at least 2 distinct classes",
        );
        check(
            &|d| d.y_test = Targets::Values(vec![0.0; 3]),
            "different kinds",
        );
        let mut d = ok();
        d.image_shape = Some([1, 1, 2]);
        d.validate().unwrap();
        // Regression.
        let r = |yt: Vec<f64>| {
            Dataset::from_arrays(
                "r",
                "r",
                1,
                2,
                vec![1.0, 2.0],
                Targets::Values(yt),
                vec![],
                Targets::Values(vec![]),
            )
        };
        r(vec![0.0; 4]).unwrap();
        let e = r(vec![0.0; 3]).unwrap_err().to_string();
        assert!(
            e.contains("y_train has 3 values, expected n_train * num_outputs = 2 * 2 = 4"),
            "{e}"
        );
        let e = r(vec![0.0, 0.0, f64::NAN, 0.0]).unwrap_err().to_string();
        assert!(e.contains("y_train[1, 0]"), "{e}");
        assert!(!r(vec![0.0; 4]).unwrap().is_classification());
    }

    #[test]
    fn grid_2d_layout() {
        let pts = [0.0, 10.0, 2.0, 20.0, 1.0, 15.0];
        let g = grid_2d(&pts, 3, 0.5).unwrap();
        assert_eq!(g.len(), 3 * 3 * 2);
        // Box [0,2]x[10,20] enlarged by half the extent on each side: [-1,3]x[5,25].
        let row = |k: usize| (g[2 * k], g[2 * k + 1]);
        assert_eq!(row(0), (-1.0, 5.0));
        assert_eq!(row(1), (1.0, 5.0)); // x0 fastest
        assert_eq!(row(2), (3.0, 5.0));
        assert_eq!(row(3), (-1.0, 15.0));
        assert_eq!(row(8), (3.0, 25.0));
        let g = grid_2d(&pts, 11, 0.0).unwrap();
        assert_eq!(g.len(), 242);
        assert!(g
            .chunks_exact(2)
            .all(|p| (0.0..=2.0).contains(&p[0]) && (10.0..=20.0).contains(&p[1])));
        assert_eq!((g[240], g[241]), (2.0, 20.0));
        // Degenerate extent: a single point.
        let g = grid_2d(&[1.0, 1.0], 2, 0.5).unwrap();
        assert_eq!(g, vec![0.5, 0.5, 1.5, 0.5, 0.5, 1.5, 1.5, 1.5]);
        assert!(grid_2d(&[], 3, 0.1).is_err());
        assert!(grid_2d(&[1.0, 2.0, 3.0], 3, 0.1)
            .unwrap_err()
            .to_string()
            .contains("2-D"));
        assert!(grid_2d(&pts, 1, 0.1).is_err());
        assert!(grid_2d(&pts, 3, -0.1).is_err());
        assert!(grid_2d(&[f64::NAN, 0.0], 3, 0.1).is_err());
    }
}
