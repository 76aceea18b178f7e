//! [`RunConfig`] built by setters in a notebook cell: a data set, the default MLP and plain
//! gradient descent, then `.mlp(..)`, `.lr(..)`, `.steps(..)`, `.seed(..)`. The TOML text of
//! `pathkernel train --config` stays the other way in ([`RunConfig::from_toml`],
//! [`super::Trained::train_toml`]) and [`RunConfig::to_toml`] writes it back.
//!
//! # Example
//!
//! ```
//! use pathkernel::api::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = RunConfig::mixture(2, 10, 6).mlp(&[8]).lr(0.5).steps(10);
//! let toml = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 10\nn_test = 6\n\
//!             [model]\nkind = \"mlp\"\nhidden = [8]\n[train]\nlr = 0.5\nsteps = 10\n";
//! assert_eq!(cfg, RunConfig::from_toml(toml, "<text>".as_ref())?);  // the same run
//! let dir = tempfile::tempdir()?;
//! let net = Trained::train(&cfg, dir.path().join("run"))?;
//! assert_eq!(net.states().len(), 11);
//! assert_eq!(RunConfig::from_toml(&cfg.to_toml()?, "<text>".as_ref())?, cfg);
//! # Ok(()) }
//! ```

use crate::data::DataConfig;
use crate::error::{Error, Result};
use crate::model::ModelConfig;
use crate::train::{DeviceKind, OptimizerKind, RunConfig, Schedule, TrainConfig};

impl RunConfig {
    /// A run on `data` with the defaults of the TOML format: the default MLP (one hidden layer
    /// of 64 ReLU units, biases, final layer zero-initialised), full-batch gradient descent,
    /// learning rate 0.1, 100 steps, seed 0, cross-entropy for labels (MSE for values).
    pub fn new(data: DataConfig) -> RunConfig {
        let train = TrainConfig {
            optimizer: OptimizerKind::Gd,
            lr: 0.1,
            steps: 100,
            seed: 0,
            loss: None,
            device: DeviceKind::default(),
            batch_size: None,
            schedule: Schedule::default(),
            momentum: 0.0,
            weight_decay: 0.0,
            weight_decay_mode: None,
            betas: None,
            eps: None,
        };
        RunConfig { data, model: ModelConfig::default(), init: None, train }
    }

    /// The EPK paper's three-class Gaussian mixture (§4.1) in `dim` dimensions (2 to plot it):
    /// `per_class` training points per class, `n_test` test points, noise sd 1, seed 0; the rest
    /// as [`RunConfig::new`].
    pub fn mixture(dim: usize, per_class: usize, n_test: usize) -> RunConfig {
        RunConfig::new(DataConfig::GaussianMixture { dim, per_class, n_test, std: 1.0, seed: 0 })
    }

    /// An MLP with hidden widths `hidden` (ReLU, biases, final layer zero-initialised).
    pub fn mlp(mut self, hidden: &[usize]) -> RunConfig {
        let ModelConfig::Mlp { hidden: h, .. } = &mut self.model else {
            self.model = ModelConfig::default();
            return self.mlp(hidden);
        };
        *h = hidden.to_vec();
        self
    }
    /// The learning rate ε (checked `> 0` when the run is trained).
    pub fn lr(mut self, lr: f64) -> RunConfig {
        self.train.lr = lr;
        self
    }
    /// The number of updates N (states `w_0 … w_N` are recorded).
    pub fn steps(mut self, steps: usize) -> RunConfig {
        self.train.steps = steps;
        self
    }
    /// The initialisation (and batch shuffling) seed.
    pub fn seed(mut self, seed: u64) -> RunConfig {
        self.train.seed = seed;
        self
    }
    /// The optimizer (`sgd` also needs [`RunConfig::batch_size`]).
    pub fn optimizer(mut self, optimizer: OptimizerKind) -> RunConfig {
        self.train.optimizer = optimizer;
        self
    }
    /// The mini-batch size of `sgd`, `adam`, `adamw`.
    pub fn batch_size(mut self, batch_size: usize) -> RunConfig {
        self.train.batch_size = Some(batch_size);
        self
    }

    /// The configuration as the TOML text `pathkernel train --config` reads.
    ///
    /// Errors: a value TOML cannot hold (a non-finite number).
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::Config(format!("the configuration as TOML: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// The setters build exactly what the TOML text of the notebooks describes (so the run id,
    /// and every number after it, is the same either way).
    #[test]
    fn setters_equal_the_toml_they_replace() {
        let quickstart = "[data]\nkind = \"gaussian-mixture\"\ndim = 2\nper_class = 50\nn_test = 30\nseed = 0\n\
                          [model]\nkind = \"mlp\"\nhidden = [16]\nactivation = \"relu\"\n[train]\nlr = 0.5\nsteps = 60\n";
        let from_text = RunConfig::from_toml(quickstart, Path::new("<test>")).unwrap();
        assert_eq!(RunConfig::mixture(2, 50, 30).mlp(&[16]).lr(0.5).steps(60), from_text);
        let defaults = RunConfig::from_toml("[train]\nlr = 0.1\nsteps = 100\n", Path::new("<test>")).unwrap();
        assert_eq!(RunConfig::new(DataConfig::default()), defaults);
        let sgd = "[data]\nkind = \"gaussian-mixture\"\ndim = 3\nper_class = 5\nn_test = 4\n[model]\nkind = \"mlp\"\nhidden = [4, 4]\n\
                   [train]\noptimizer = \"sgd\"\nbatch_size = 3\nlr = 0.2\nsteps = 7\nseed = 9\n";
        let built = RunConfig::mixture(3, 5, 4).mlp(&[4, 4]).optimizer(OptimizerKind::Sgd).batch_size(3).lr(0.2).steps(7).seed(9);
        assert_eq!(built, RunConfig::from_toml(sgd, Path::new("<test>")).unwrap());
        assert_eq!(RunConfig::from_toml(&built.to_toml().unwrap(), Path::new("<test>")).unwrap(), built);
    }
}
