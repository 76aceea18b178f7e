//! Deep ensembles (Lakshminarayanan et al. 2017): the same configuration trained from several
//! initialisation seeds with the existing trainer ([`crate::train::train_to_dir`]), the members'
//! softmax probabilities averaged.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::model::{Architecture, OutputKind, Params};
use crate::train::{self, RunConfig, TrainOptions};
use crate::trajectory;

use super::metrics::softmax_rows;

/// The seeds of the benchmark's five-member ensemble.
pub const ENSEMBLE_SEEDS: [u64; 5] = [0, 1, 2, 3, 4];

/// One trained member: its final parameters (and initial ones, for `zero_output`).
#[derive(Clone, Debug, PartialEq)]
pub struct EnsembleMember {
    /// The `train.seed` it was trained with.
    pub seed: u64,
    /// Its run directory.
    pub dir: PathBuf,
    /// Whether an existing run of the same configuration was reused instead of retrained.
    pub reused: bool,
    /// The architecture.
    pub arch: Architecture,
    /// `w_0`.
    pub init: Params,
    /// `w_N`.
    pub last: Params,
}

impl EnsembleMember {
    /// The member's logits `α (g_{w_N}(x) − [zero_output] g_{w_0}(x))` at the rows of `x`.
    ///
    /// # Shapes
    /// `x: [P, d]`; returns `[P, K]`.
    pub fn logits(&self, x: &[f64]) -> Result<Vec<f64>> {
        network_logits(&self.arch, &self.last, Some(&self.init), x)
    }
}

/// The logits of a classification network at the rows of `x`:
/// `α (g_w(x) − [zero_output] g_{w_0}(x))`, whose log-softmax is [`Architecture::forward`].
///
/// # Shapes
/// `x: [P, d]`; returns `[P, K]`.
pub fn network_logits(arch: &Architecture, params: &Params, init: Option<&Params>, x: &[f64]) -> Result<Vec<f64>> {
    if arch.output != OutputKind::LogSoftmax {
        return Err(Error::Config("network logits: not a classification network (log-softmax output)".into()));
    }
    let mut a = arch.clone();
    a.output = OutputKind::Identity;
    a.forward(params, init, x)
}

/// A trained ensemble.
#[derive(Clone, Debug, PartialEq)]
pub struct Ensemble {
    /// The members, in seed order.
    pub members: Vec<EnsembleMember>,
}

/// Trains `cfg` once per seed (`train.seed = s`, everything else unchanged) into
/// `out/seed-{s}` with [`train::train_to_dir`] and loads the members' parameters. A member
/// directory that already holds a complete run of exactly that configuration from this trainer
/// revision (same run id, configuration and `created_by`) is reused, as the study runner reuses
/// trajectories; one that holds something else is an error unless `opts.force`.
///
/// # Shapes
/// The members' parameters follow the configuration's architecture.
pub fn train_ensemble(cfg: &RunConfig, seeds: &[u64], out: &Path, opts: &TrainOptions) -> Result<Ensemble> {
    if seeds.is_empty() {
        return Err(Error::Config("an ensemble needs at least one seed".into()));
    }
    let mut members = Vec::with_capacity(seeds.len());
    for &seed in seeds {
        let mut c = cfg.clone();
        c.train.seed = seed;
        let dir = out.join(format!("seed-{seed}"));
        let member = match load_member(&dir, seed) {
            Ok(m) if train::holds_run(&dir, &c) => EnsembleMember { reused: true, ..m },
            _ => {
                train::train_to_dir(&c, &dir, opts)?;
                load_member(&dir, seed)?
            }
        };
        members.push(member);
    }
    Ok(Ensemble { members })
}


/// Loads `w_0` and `w_N` of the run in `dir`.
fn load_member(dir: &Path, seed: u64) -> Result<EnsembleMember> {
    let manifest = trajectory::read_manifest(dir)?;
    let init = trajectory::load_step(dir, &manifest, 0)?;
    let last = trajectory::load_step(dir, &manifest, manifest.steps)?;
    if manifest.seed != seed {
        return Err(Error::trajectory(dir, format!("run was trained with seed {}, not {seed}", manifest.seed)));
    }
    Ok(EnsembleMember { seed, dir: dir.to_path_buf(), reused: false, arch: manifest.architecture, init, last })
}

impl Ensemble {
    /// Loads an ensemble from existing run directories (each a complete `pathkernel train` run).
    pub fn open(dirs: &[PathBuf]) -> Result<Ensemble> {
        let mut members = Vec::with_capacity(dirs.len());
        for d in dirs {
            let m = trajectory::read_manifest(d)?;
            members.push(load_member(d, m.seed)?);
        }
        if members.is_empty() {
            return Err(Error::Config("an ensemble needs at least one member".into()));
        }
        Ok(Ensemble { members })
    }

    /// The members' softmax probabilities at the rows of `x`, one `[P, K]` matrix per member.
    pub fn member_probs(&self, x: &[f64]) -> Result<Vec<Vec<f64>>> {
        self.members.iter().map(|m| softmax_rows(&m.logits(x)?, m.arch.outputs())).collect()
    }

    /// The ensemble's predictive `(1/M) Σ_m softmax(z_m(x))`.
    ///
    /// # Shapes
    /// `x: [P, d]`; returns `[P, K]`.
    pub fn predict(&self, x: &[f64]) -> Result<Vec<f64>> {
        let all = self.member_probs(x)?;
        let first = all.first().ok_or_else(|| Error::Config("an ensemble needs at least one member".into()))?;
        let mut mean = vec![0.0; first.len()];
        for p in &all {
            if p.len() != mean.len() {
                return Err(Error::ShapeMismatch { what: "ensemble member outputs".into(), expected: vec![mean.len()], got: vec![p.len()] });
            }
            for (a, v) in mean.iter_mut().zip(p) {
                *a += v;
            }
        }
        let m = all.len() as f64;
        mean.iter_mut().for_each(|v| *v /= m);
        Ok(mean)
    }
}
