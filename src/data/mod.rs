//! Datasets: the EPK paper's Gaussian mixture and two small toys from the reference notebooks
//! (`mixtures`), MNIST and other IDX image sets ([`idx`]), CSV/parquet tables ([`table`]) and
//! named arrays in safetensors/npz/npy files ([`arrays`]); [`prep`] holds the preprocessing the
//! file-backed kinds share.
//!
//! One file per source; this module holds the in-memory [`Dataset`] and the `[data]` section
//! ([`DataConfig`]) that selects a source by `kind`.
//!
//! All arrays are flat `Vec<f64>` in row-major order. A dataset holds `M` training rows and `P` test
//! rows of `dim` features each, with integer class labels (classification) or real-valued targets
//! (regression). Generated datasets are deterministic functions of their configuration: randomness
//! comes from [`rand_chacha::ChaCha8Rng`] seeded with [`rand::SeedableRng::seed_from_u64`] and
//! normal draws from [`rand_distr::StandardNormal`], both platform-stable.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod arrays;
pub mod idx;
pub(crate) mod mixtures;
pub mod modular;
pub mod prep;
pub mod table;

pub use arrays::ArraysConfig;
pub use idx::IdxConfig;
pub use modular::ModOp;
pub use prep::Task;
pub use table::TableConfig;

pub use idx::{load_mnist, load_mnist_per_class, parse_idx, IdxArray, MnistSplit};
use mixtures::{gaussian_mixture, linear_2d, regression_1d};

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
    /// The vocabulary size V when rows are sequences of `dim` token ids (each an integer in
    /// `0..V` stored as an `f64`; the `modular` kind), else `None`.
    pub vocab: Option<usize>,
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
    pub(crate) fn validate(&self) -> Result<()> {
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
        if let Some(v) = self.vocab {
            if self.image_shape.is_some() {
                return Err(what("rows are either images or token sequences, not both".into()));
            }
            let splits = [("train", &self.x_train), ("test", &self.x_test)].into_iter().chain(self.validation.as_ref().map(|s| ("val", &s.x)));
            for (split, x) in splits {
                if let Some(i) = x.iter().position(|&t| !(t >= 0.0 && t < v as f64 && t.fract() == 0.0)) {
                    return Err(what(format!("x_{split}[{}, {}] = {} is not a token id in 0..{v}", i / self.dim, i % self.dim, x[i])));
                }
            }
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
    pub(crate) fn from_arrays(
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
            vocab: None,
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
fn default_mod_p() -> usize {
    7
}
fn default_mod_op() -> ModOp {
    ModOp::Add
}
fn default_train_frac() -> f64 {
    0.5
}

/// The `[data]` section of a TOML config, selected by `kind`.
///
/// Keys are the snake_case field names; every field has a default, and unknown keys are rejected.
/// ```toml
/// [data]
/// kind = "gaussian-mixture"   # or "linear2d", "regression1d", "mnist", "idx", "table", "arrays"
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
    /// A CSV or parquet table: feature columns, a label column, a split column or a seeded
    /// stratified split (see [`table`]).
    Table(TableConfig),
    /// Named arrays from a `.safetensors` file, an `.npz` archive or a directory of `.npy` files
    /// (see [`arrays`]).
    Arrays(ArraysConfig),
    /// Any IDX image set in MNIST's format (Fashion-MNIST, KMNIST, EMNIST, ...), with `mnist`'s
    /// selection (see [`idx::IdxConfig`]).
    Idx(IdxConfig),
    /// Modular arithmetic `a ∘ b mod p` as token sequences `[a, p, b, p + 1]` (ExPLAIND's grokking
    /// task; see [`modular`]): `vocab = K = p + 2`, a seeded split by `train_frac`.
    /// ```toml
    /// [data]
    /// kind = "modular"
    /// p = 7
    /// op = "+"            # or "-", "*"
    /// train_frac = 0.5
    /// seed = 0
    /// ```
    Modular {
        /// The modulus p (default 7).
        #[serde(default = "default_mod_p")]
        p: usize,
        /// The operation (default `+`).
        #[serde(default = "default_mod_op")]
        op: ModOp,
        /// The fraction of the examples used for training (default 0.5); the rest are the test set.
        #[serde(default = "default_train_frac")]
        train_frac: f64,
        /// Seed of the split (default 0).
        #[serde(default)]
        seed: u64,
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
            DataConfig::Table(_) => "table",
            DataConfig::Arrays(_) => "arrays",
            DataConfig::Idx(_) => "idx",
            DataConfig::Modular { .. } => "modular",
        }
    }

    /// Checks the values (zero sizes, `std <= 0` or non-finite, `dim < 2`, sizes whose product
    /// overflows, ...), returning a precise [`Error::Config`] naming the offending key.
    pub(crate) fn validate(&self) -> Result<()> {
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
            DataConfig::Table(ref c) => c.validate()?,
            DataConfig::Arrays(ref c) => c.validate()?,
            DataConfig::Idx(ref c) => c.validate()?,
            DataConfig::Modular { p, op, train_frac, seed: _ } => {
                modular::validate(p, op, train_frac)?;
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
                idx::IdxConfig::mnist(&dir, path, n_train, n_test, offset, normalize, per_class, val_per_class)?
            }
            DataConfig::Table(ref c) => c.load(base_dir)?,
            DataConfig::Arrays(ref c) => c.load(base_dir)?,
            DataConfig::Idx(ref c) => c.load(base_dir)?,
            DataConfig::Modular { p, op, train_frac, seed } => modular::modular(p, op, train_frac, seed)?,
        };
        ds.validate()?;
        Ok(ds)
    }
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
pub(crate) fn grid_2d(x: &[f64], n: usize, margin: f64) -> Result<Vec<f64>> {
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

/// The class of a row of scores (probabilities, logits, log-probabilities): the index of the
/// largest entry, the first one on ties, in [`f64::total_cmp`] order (so a NaN entry wins and
/// shows; for finite rows this is the first maximum). The one arg-max of the crate: accuracies,
/// agreements, ECE bins and model selection all count with it.
///
/// # Panics
/// If `row` is empty.
pub(crate) fn argmax(row: &[f64]) -> usize {
    assert!(!row.is_empty(), "argmax of an empty row");
    let mut best = 0;
    for (j, v) in row.iter().enumerate().skip(1) {
        if v.total_cmp(&row[best]).is_gt() {
            best = j;
        }
    }
    best
}

#[cfg(test)]
mod tests;
