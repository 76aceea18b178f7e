//! The recorded training path on disk — an interchange format Python reads with `safetensors`.
//!
//! ```text
//! DIR/manifest.json                       format, version, run id, architecture, loss, optimizer,
//!                                         learning rate per step, seed, steps N, parameter names
//!                                         and shapes, dataset description, the full config
//! DIR/dataset.safetensors                 x_train [M,d] f64, y_train [M] i64 (or [M,K] f64),
//!                                         x_test [P,d] f64, y_test [P] i64 (or [P,K] f64)
//! DIR/trajectory/step-000000.safetensors  w_0 … w_N, one file per state, f64 tensors named as in
//!                                         the manifest (dense weights [out, in]); metadata holds
//!                                         the run id and the step number
//! DIR/trajectory/precond-000000.safetensors  Adam(W), RMSprop, Adagrad only: `scale` [W] = κ_s D_s of steps 0 … N−1,
//!                                         the preconditioner each update used (crate::optim)
//! DIR/train_log.parquet                   step, loss, accuracy, test_accuracy, grad_norm, weight_norm
//! ```
//! All files are written atomically; [`Run::open`] validates everything and reports the first
//! problem precisely (missing or garbled step, wrong names, shapes, dtypes, a step file from
//! another run).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::io::{self, NamedArray, SafeFile};
use crate::model::net::LossKind;
use crate::model::{Architecture, ParamSpec, Params};

/// Format name written into every manifest.
pub(crate) const FORMAT: &str = "pathkernel-trajectory";
/// Current format version.
pub(crate) const VERSION: u32 = 1;

/// Description of the dataset stored beside the trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetInfo {
    /// Dataset name.
    pub name: String,
    /// One-line description with all generation parameters.
    pub description: String,
    /// Features per row.
    pub dim: usize,
    /// `[C, H, W]` for images.
    pub image_shape: Option<[usize; 3]>,
    /// The vocabulary size when rows are token sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
    /// Classes or regression outputs K.
    pub num_outputs: usize,
    /// Training rows M.
    pub n_train: usize,
    /// Test rows P.
    pub n_test: usize,
    /// `classification` or `regression`.
    pub task: String,
}

/// What a run recorded per step besides its learning rates, when it changed from step to step
/// (part of the record; the recursion that reads it is [`crate::optim`]):
/// the momentum (SGD's `momentum`, Adam's β1; a scheduler cycling it) and the factor
/// gradient clipping by norm multiplied the data gradient by (`clip_grad_norm_`).
///
/// With momenta `β_s` the recursion reads `m_s = β_s m_{s−1} + γ_s ĝ_s` (Adam: `γ_s = 1 − β_s`,
/// κ_s from the step's own β1 as PyTorch's bias correction), and the backward recursion
/// `H_r = ε_r κ_r D_r ⊙ J̄_r + β_{r+1} H_{r+1}`. With clip factors `c_s`,
/// `ĝ_s = c_s g_s + λ_c w_s`: step s's per-point terms are scaled by `c_s`, so
/// `a_{i,s} = −ε_s c_s ∂L_s/∂f(x_i)`; the weight decay is not clipped (PyTorch clips `p.grad`
/// before the optimizer adds it).
///
/// # Shapes
/// Each present vector is `[N]`, one entry per update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepFactors {
    /// β_s of every step (`None`: the record's constant momentum / β1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momenta: Option<Vec<f64>>,
    /// `c_s ∈ (0, 1]` of every step (`None`: no clipping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_scales: Option<Vec<f64>>,
}

impl StepFactors {
    /// Nothing recorded per step.
    pub fn is_empty(&self) -> bool {
        self.momenta.is_none() && self.grad_scales.is_none()
    }
}

/// The optimizer as recorded in the manifest (the update rules are in [`crate::optim`]).
/// Fields at their defaults (no momentum, no weight decay) are omitted, so plain GD/SGD
/// manifests read `{"kind": "gd", "lr": …}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum OptimizerRecord {
    /// Full-batch gradient descent (forward Euler): `w_{s+1} = w_s − ε_s ∇L(w_s)`, optionally with
    /// heavy-ball momentum and weight decay.
    Gd {
        /// Base learning rate ε.
        lr: f64,
        /// Heavy-ball momentum μ (PyTorch convention: the first buffer is the first gradient).
        #[serde(default, skip_serializing_if = "is_zero")]
        momentum: f64,
        /// Momentum dampening τ (PyTorch's `dampening`: later gradients enter the buffer
        /// scaled by 1 − τ).
        #[serde(default, skip_serializing_if = "is_zero")]
        dampening: f64,
        /// Nesterov momentum (PyTorch's `nesterov`): the step is `g + μ·buffer`.
        #[serde(default, skip_serializing_if = "is_false")]
        nesterov: bool,
        /// Weight decay λ.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
        /// Decoupled (`w ← w − ε λ w`) rather than coupled (L2 added to the gradient).
        #[serde(default, skip_serializing_if = "is_false")]
        decoupled_weight_decay: bool,
        /// The recorded updates are rounded versions of this rule's (an imported float32 run):
        /// kernels replay the optimizer and carry each step's difference as a residual term of
        /// no training point, even for plain steps.
        #[serde(default, skip_serializing_if = "is_false")]
        rounded_updates: bool,
        /// Momentum and clip factors recorded per step (an imported run).
        #[serde(default, skip_serializing_if = "StepFactors::is_empty")]
        per_step: StepFactors,
    },
    /// Mini-batch SGD: `w_{s+1} = w_s − ε_s ∇L_{B_s}(w_s)` with `L_B` the mean loss over the batch
    /// `B_s` ([`batch_schedule`]; also stored in `trajectory/batches.safetensors`), optionally with
    /// momentum and weight decay.
    Sgd {
        /// Base learning rate ε.
        lr: f64,
        /// Batch size (the last batch of an epoch may be smaller).
        batch_size: usize,
        /// Seed of the per-epoch shuffles.
        shuffle_seed: u64,
        /// Heavy-ball momentum μ.
        #[serde(default, skip_serializing_if = "is_zero")]
        momentum: f64,
        /// Momentum dampening τ.
        #[serde(default, skip_serializing_if = "is_zero")]
        dampening: f64,
        /// Nesterov momentum.
        #[serde(default, skip_serializing_if = "is_false")]
        nesterov: bool,
        /// Weight decay λ.
        #[serde(default, skip_serializing_if = "is_zero")]
        weight_decay: f64,
        /// Decoupled rather than coupled weight decay.
        #[serde(default, skip_serializing_if = "is_false")]
        decoupled_weight_decay: bool,
        /// The recorded updates are rounded versions of this rule's (see `Gd`).
        #[serde(default, skip_serializing_if = "is_false")]
        rounded_updates: bool,
        /// The batch of every step as recorded by another trainer (`pathkernel import`); when
        /// present it replaces the shuffle schedule of `batch_size` and `shuffle_seed`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recorded_batches: Option<Vec<Vec<usize>>>,
        /// Momentum and clip factors recorded per step (an imported run).
        #[serde(default, skip_serializing_if = "StepFactors::is_empty")]
        per_step: StepFactors,
    },
    /// Adam (coupled weight decay) or AdamW (decoupled), full-batch or on mini-batches.
    Adam {
        /// Base learning rate ε.
        lr: f64,
        /// β1.
        beta1: f64,
        /// β2.
        beta2: f64,
        /// eps.
        eps: f64,
        /// Weight decay λ.
        weight_decay: f64,
        /// AdamW's decoupled weight decay.
        decoupled_weight_decay: bool,
        /// Mini-batch size (`None`: full batch).
        batch_size: Option<usize>,
        /// Seed of the per-epoch shuffles.
        shuffle_seed: u64,
        /// The batch of every step as recorded by another trainer (`pathkernel import`); when
        /// present it replaces the shuffle schedule.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recorded_batches: Option<Vec<Vec<usize>>>,
        /// β1 and clip factors recorded per step (an imported run).
        #[serde(default, skip_serializing_if = "StepFactors::is_empty")]
        per_step: StepFactors,
    },
    /// PyTorch's RMSprop without momentum (coupled weight decay), imported; its `κ_s D_s` are
    /// recorded like Adam's.
    Rmsprop {
        /// Base learning rate ε.
        lr: f64,
        /// α, the second moment's decay.
        alpha: f64,
        /// eps.
        eps: f64,
        /// Divide by the centred second moment.
        centered: bool,
        /// Weight decay λ (coupled).
        weight_decay: f64,
        /// Mini-batch size (`None`: full batch).
        batch_size: Option<usize>,
        /// The batch of every step as recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recorded_batches: Option<Vec<Vec<usize>>>,
        /// Clip factors recorded per step.
        #[serde(default, skip_serializing_if = "StepFactors::is_empty")]
        per_step: StepFactors,
    },
    /// PyTorch's Adagrad (coupled weight decay), imported; its `κ_s D_s` are recorded like
    /// Adam's.
    Adagrad {
        /// Base learning rate ε.
        lr: f64,
        /// The learning rate's decay per step.
        lr_decay: f64,
        /// eps.
        eps: f64,
        /// The accumulator's initial value.
        initial_accumulator_value: f64,
        /// Weight decay λ (coupled).
        weight_decay: f64,
        /// Mini-batch size (`None`: full batch).
        batch_size: Option<usize>,
        /// The batch of every step as recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recorded_batches: Option<Vec<Vec<usize>>>,
        /// Clip factors recorded per step.
        #[serde(default, skip_serializing_if = "StepFactors::is_empty")]
        per_step: StepFactors,
    },
}

impl OptimizerRecord {
    /// Whether the run records a diagonal preconditioner `κ_s D_s` per step beside its states
    /// (Adam, AdamW, RMSprop, Adagrad).
    pub fn preconditioned(&self) -> bool {
        matches!(self, OptimizerRecord::Adam { .. } | OptimizerRecord::Rmsprop { .. } | OptimizerRecord::Adagrad { .. })
    }
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl std::fmt::Display for OptimizerRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extras = |f: &mut std::fmt::Formatter<'_>, (momentum, dampening, nesterov): (f64, f64, bool), wd: f64, decoupled: bool| -> std::fmt::Result {
            if momentum != 0.0 {
                write!(f, ", {}momentum {momentum}", if nesterov { "nesterov " } else { "" })?;
            }
            if dampening != 0.0 {
                write!(f, ", dampening {dampening}")?;
            }
            if wd != 0.0 {
                write!(f, ", weight decay {wd} ({})", if decoupled { "decoupled" } else { "coupled" })?;
            }
            Ok(())
        };
        match *self {
            OptimizerRecord::Gd { lr, momentum, dampening, nesterov, weight_decay, decoupled_weight_decay, rounded_updates, .. } => {
                write!(f, "gd (lr {lr}, full batch")?;
                extras(f, (momentum, dampening, nesterov), weight_decay, decoupled_weight_decay)?;
                if rounded_updates {
                    f.write_str(", rounded updates")?;
                }
            }
            OptimizerRecord::Sgd { lr, batch_size, momentum, dampening, nesterov, weight_decay, decoupled_weight_decay, rounded_updates, .. } => {
                write!(f, "sgd (lr {lr}, batch {batch_size}")?;
                extras(f, (momentum, dampening, nesterov), weight_decay, decoupled_weight_decay)?;
                if rounded_updates {
                    f.write_str(", rounded updates")?;
                }
            }
            OptimizerRecord::Adam { lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay, batch_size, .. } => {
                let name = if decoupled_weight_decay { "adamw" } else { "adam" };
                write!(f, "{name} (lr {lr}, betas {beta1}/{beta2}, eps {eps:e}, ")?;
                match batch_size {
                    Some(b) => write!(f, "batch {b}")?,
                    None => write!(f, "full batch")?,
                }
                if weight_decay != 0.0 {
                    write!(f, ", weight decay {weight_decay}")?;
                }
            }
            OptimizerRecord::Rmsprop { lr, alpha, eps, centered, weight_decay, batch_size, .. } => {
                write!(f, "rmsprop (lr {lr}, alpha {alpha}, eps {eps:e}{}, ", if centered { ", centered" } else { "" })?;
                match batch_size {
                    Some(b) => write!(f, "batch {b}")?,
                    None => write!(f, "full batch")?,
                }
                if weight_decay != 0.0 {
                    write!(f, ", weight decay {weight_decay}")?;
                }
            }
            OptimizerRecord::Adagrad { lr, lr_decay, eps, initial_accumulator_value, weight_decay, batch_size, .. } => {
                write!(f, "adagrad (lr {lr}, lr_decay {lr_decay}, eps {eps:e}, initial accumulator {initial_accumulator_value}, ")?;
                match batch_size {
                    Some(b) => write!(f, "batch {b}")?,
                    None => write!(f, "full batch")?,
                }
                if weight_decay != 0.0 {
                    write!(f, ", weight decay {weight_decay}")?;
                }
            }
        }
        let (OptimizerRecord::Gd { per_step, .. }
        | OptimizerRecord::Sgd { per_step, .. }
        | OptimizerRecord::Adam { per_step, .. }
        | OptimizerRecord::Rmsprop { per_step, .. }
        | OptimizerRecord::Adagrad { per_step, .. }) = self;
        if per_step.momenta.is_some() {
            f.write_str(", momentum per step")?;
        }
        if per_step.grad_scales.is_some() {
            f.write_str(", gradient clipped by norm")?;
        }
        f.write_str(")")
    }
}

/// The mini-batches of SGD: each epoch is a seeded permutation of `0..m` cut into consecutive
/// batches of `batch_size` (the last one smaller when `batch_size` does not divide `m`); epoch e
/// uses the permutation drawn from `ChaCha8Rng::seed_from_u64(seed)` on stream e.
pub fn batch_schedule(m: usize, batch_size: usize, steps: usize, seed: u64) -> Vec<Vec<usize>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut out = Vec::with_capacity(steps);
    let mut epoch = 0u64;
    while out.len() < steps {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(epoch);
        let mut perm: Vec<usize> = (0..m).collect();
        perm.shuffle(&mut rng);
        for chunk in perm.chunks(batch_size.max(1)) {
            if out.len() == steps {
                break;
            }
            let mut b = chunk.to_vec();
            b.sort_unstable();
            out.push(b);
        }
        epoch += 1;
    }
    out
}

impl Manifest {
    /// The training points of each step's update (`None` for full-batch gradient descent).
    pub fn batches(&self) -> Option<Vec<Vec<usize>>> {
        match self.optimizer {
            OptimizerRecord::Sgd { recorded_batches: Some(ref b), .. }
            | OptimizerRecord::Adam { recorded_batches: Some(ref b), .. }
            | OptimizerRecord::Rmsprop { recorded_batches: Some(ref b), .. }
            | OptimizerRecord::Adagrad { recorded_batches: Some(ref b), .. } => Some(b.clone()),
            OptimizerRecord::Gd { .. } | OptimizerRecord::Adam { batch_size: None, .. } | OptimizerRecord::Rmsprop { .. } | OptimizerRecord::Adagrad { .. } => None,
            OptimizerRecord::Sgd { batch_size, shuffle_seed, .. } | OptimizerRecord::Adam { batch_size: Some(batch_size), shuffle_seed, .. } => {
                Some(batch_schedule(self.dataset.n_train, batch_size, self.steps, shuffle_seed))
            }
        }
    }
}

/// Writes `trajectory/batches.safetensors`: `batch_indices` `[N, B]` i64 (−1 pads a smaller last
/// batch) and `batch_sizes` `[N]` i64, for readers that do not recompute the schedule.
pub(crate) fn write_batches(dir: &Path, batches: &[Vec<usize>], run_id: &str) -> Result<()> {
    let n = batches.len();
    let b = batches.iter().map(Vec::len).max().unwrap_or(0);
    let mut idx = vec![-1i64; n * b];
    for (s, batch) in batches.iter().enumerate() {
        for (j, &i) in batch.iter().enumerate() {
            idx[s * b + j] = i as i64;
        }
    }
    let mut meta = HashMap::new();
    meta.insert("run_id".to_string(), run_id.to_string());
    io::write_safetensors(
        &dir.join("trajectory").join("batches.safetensors"),
        &[
            NamedArray::i64("batch_indices", vec![n, b], idx),
            NamedArray::i64("batch_sizes", vec![n], batches.iter().map(|v| v.len() as i64).collect()),
        ],
        Some(meta),
    )
}

/// `DIR/manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `FORMAT`.
    pub format: String,
    /// Format version.
    pub version: u32,
    /// Identifier shared by every file of this run (a hash of the configuration).
    pub run_id: String,
    /// Network architecture.
    pub architecture: Architecture,
    /// Training loss (mean over the training set).
    pub loss: LossKind,
    /// Optimizer and its hyper-parameters.
    pub optimizer: OptimizerRecord,
    /// ε_s for every update s = 0 … N−1.
    pub learning_rates: Vec<f64>,
    /// Initialisation seed.
    pub seed: u64,
    /// Number of updates N; states w_0 … w_N are stored.
    pub steps: usize,
    /// Parameter names and shapes, in order.
    pub params: Vec<ParamSpec>,
    /// Total parameter count W.
    pub num_params: usize,
    /// The dataset.
    pub dataset: DatasetInfo,
    /// The configuration that produced the run (as JSON).
    pub config: serde_json::Value,
    /// Writer version.
    pub created_by: String,
    /// Where w_0 came from when it was not drawn from `seed` (`[model] init`, `pathkernel import`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitRecord>,
}

/// The file a run's w_0 was read from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitRecord {
    /// The file, as given (a PyTorch `state_dict` in safetensors).
    pub path: String,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
    /// What it is: `pytorch-state-dict`.
    pub format: String,
}

/// Path of step file `s` inside a run directory.
pub fn step_path(dir: &Path, s: usize) -> PathBuf {
    dir.join("trajectory").join(format!("step-{s:06}.safetensors"))
}

/// Path of the Adam preconditioner file of step `s` (`κ_s D_s`, see [`crate::optim`]).
pub(crate) fn preconditioner_path(dir: &Path, s: usize) -> PathBuf {
    dir.join("trajectory").join(format!("precond-{s:06}.safetensors"))
}

/// Loads and validates Adam's `κ_s D_s` (`[W]`, finite and > 0) of step `s < N`.
pub(crate) fn load_preconditioner(dir: &Path, manifest: &Manifest, s: usize) -> Result<Vec<f64>> {
    let path = preconditioner_path(dir, s);
    if !path.exists() {
        return Err(Error::trajectory(&path, format!("missing Adam preconditioner of step {s} (the kernel of an Adam run needs every step's)")));
    }
    let f = SafeFile::open(&path)?;
    let meta = f.metadata();
    if meta.get("run_id") != Some(&manifest.run_id) {
        return Err(Error::trajectory(&path, format!("belongs to run {:?}, not to this run {}", meta.get("run_id"), manifest.run_id)));
    }
    if meta.get("step").map(String::as_str) != Some(s.to_string().as_str()) {
        return Err(Error::trajectory(&path, format!("metadata says step {:?}, expected {s}", meta.get("step"))));
    }
    let (_, v) = f.f64("scale", Some(&[manifest.num_params]))?;
    if let Some(i) = v.iter().position(|x| !(x.is_finite() && *x > 0.0)) {
        return Err(Error::trajectory(&path, format!("scale[{i}] = {} is not a finite positive number", v[i])));
    }
    Ok(v)
}

/// Writes a run directory incrementally: manifest and dataset first, then one file per state.
pub(crate) struct Writer {
    dir: PathBuf,
    manifest: Manifest,
}

impl Writer {
    /// Re-opens a partially written run directory for resuming (its manifest must equal
    /// `manifest`).
    pub(crate) fn reopen(dir: &Path, manifest: Manifest) -> Result<Self> {
        let on_disk = read_manifest(dir)?;
        if on_disk != manifest {
            return Err(Error::trajectory(dir, "the recorded manifest differs from the configuration being resumed"));
        }
        Ok(Writer { dir: dir.to_path_buf(), manifest })
    }

    /// Creates `dir` (and `dir/trajectory`), writing the manifest and the dataset.
    pub(crate) fn create(dir: &Path, manifest: Manifest, data: &Dataset) -> Result<Self> {
        io::create_dir_all(&dir.join("trajectory"))?;
        io::write_json(&dir.join("manifest.json"), &manifest)?;
        write_dataset(&dir.join("dataset.safetensors"), data, &manifest.run_id)?;
        Ok(Writer { dir: dir.to_path_buf(), manifest })
    }

    /// Writes state `w_s`.
    pub(crate) fn write_step(&self, s: usize, params: &Params) -> Result<()> {
        if params.specs != self.manifest.params {
            return Err(Error::Data("parameters do not match the manifest".into()));
        }
        let arrays: Vec<NamedArray> = params
            .specs
            .iter()
            .zip(&params.data)
            .map(|(sp, d)| NamedArray::f64(sp.name.clone(), sp.shape.clone(), d.clone()))
            .collect();
        let mut meta = HashMap::new();
        meta.insert("run_id".to_string(), self.manifest.run_id.clone());
        meta.insert("step".to_string(), s.to_string());
        io::write_safetensors(&step_path(&self.dir, s), &arrays, Some(meta))
    }

    /// Writes Adam's `κ_s D_s` of step s (`[W]`): the preconditioner the update used, recorded
    /// so that the kernel decomposes exactly the update that was made (it is a sensitive
    /// function of gradients near zero; recomputing it would not reproduce it to the last bit).
    pub(crate) fn write_preconditioner(&self, s: usize, scale: &[f64]) -> Result<()> {
        let mut meta = HashMap::new();
        meta.insert("run_id".to_string(), self.manifest.run_id.clone());
        meta.insert("step".to_string(), s.to_string());
        io::write_safetensors(&preconditioner_path(&self.dir, s), &[NamedArray::f64("scale", vec![scale.len()], scale.to_vec())], Some(meta))
    }
}

fn targets_array(name: &str, t: &Targets, n: usize, k: usize) -> NamedArray {
    match t {
        Targets::Labels(v) => NamedArray::i64(name, vec![n], v.iter().map(|&c| c as i64).collect()),
        Targets::Values(v) => NamedArray::f64(name, vec![n, k], v.clone()),
    }
}

/// Writes `dataset.safetensors` (see the module docs for names and shapes).
pub(crate) fn write_dataset(path: &Path, data: &Dataset, run_id: &str) -> Result<()> {
    let (m, p, d, k) = (data.n_train(), data.n_test(), data.dim, data.num_outputs);
    let arrays = vec![
        NamedArray::f64("x_train", vec![m, d], data.x_train.clone()),
        targets_array("y_train", &data.y_train, m, k),
        NamedArray::f64("x_test", vec![p, d], data.x_test.clone()),
        targets_array("y_test", &data.y_test, p, k),
    ];
    let mut meta = HashMap::new();
    meta.insert("run_id".to_string(), run_id.to_string());
    meta.insert("name".to_string(), data.name.clone());
    io::write_safetensors(path, &arrays, Some(meta))
}

/// A validated run directory.
#[derive(Clone, Debug)]
pub struct Run {
    /// The run directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its dataset.
    pub dataset: Dataset,
}

impl Run {
    /// Opens and validates a run: manifest (format, version, consistency), dataset (names,
    /// shapes, dtypes), and every step file 0…N (present, parseable, same run id, step number,
    /// names, shapes, dtypes, finite values). Reports the first problem found.
    pub fn open(dir: &Path) -> Result<Run> {
        if !dir.is_dir() {
            return Err(Error::trajectory(dir, "not a directory (expected a run written by `pathkernel train`)"));
        }
        let manifest = read_manifest(dir)?;
        let dataset = read_dataset(&dir.join("dataset.safetensors"), &manifest)?;
        let run = Run { dir: dir.to_path_buf(), manifest, dataset };
        for s in 0..=run.manifest.steps {
            run.load_step(s)?;
        }
        if let Some(batches) = run.manifest.batches() {
            let path = dir.join("trajectory").join("batches.safetensors");
            let f = SafeFile::open(&path)?;
            let b = batches.iter().map(Vec::len).max().unwrap_or(0);
            let (_, idx) = f.i64("batch_indices", Some(&[batches.len(), b]))?;
            for (s, batch) in batches.iter().enumerate() {
                let stored: Vec<usize> = idx[s * b..(s + 1) * b].iter().filter(|&&v| v >= 0).map(|&v| v as usize).collect();
                if &stored != batch {
                    return Err(Error::trajectory(&path, format!("the batch of step {s} differs from the manifest's schedule")));
                }
            }
        }
        let extra = step_path(dir, run.manifest.steps + 1);
        if extra.exists() {
            return Err(Error::trajectory(&extra, format!("step file beyond the manifest's {} steps", run.manifest.steps)));
        }
        Ok(run)
    }

    /// Loads and validates state `w_s`.
    pub fn load_step(&self, s: usize) -> Result<Params> {
        load_step(&self.dir, &self.manifest, s)
    }

    /// Loads all states `w_0 … w_N`.
    pub fn load_all(&self) -> Result<Vec<Params>> {
        (0..=self.manifest.steps).map(|s| self.load_step(s)).collect()
    }

    /// Adam's recorded `κ_s D_s` for every step (`None` for other optimizers).
    pub fn load_preconditioners(&self) -> Result<Option<Vec<Vec<f64>>>> {
        match self.manifest.optimizer {
            ref o if o.preconditioned() => (0..self.manifest.steps).map(|s| load_preconditioner(&self.dir, &self.manifest, s)).collect::<Result<Vec<_>>>().map(Some),
            _ => Ok(None),
        }
    }
}

/// Loads and validates state `w_s` of the run in `dir` described by `manifest`: the file exists,
/// parses, carries this run's id and step number, and has exactly the manifest's f64 tensors,
/// all finite.
pub fn load_step(dir: &Path, manifest: &Manifest, s: usize) -> Result<Params> {
    if s > manifest.steps {
        return Err(Error::trajectory(dir, format!("step {s} is beyond the last step {}", manifest.steps)));
    }
    let path = step_path(dir, s);
    if !path.exists() {
        return Err(Error::trajectory(&path, format!("missing step file for step {s} of {}", manifest.steps)));
    }
    let f = SafeFile::open(&path)?;
    let meta = f.metadata();
    match meta.get("run_id") {
        Some(id) if *id == manifest.run_id => {}
        Some(id) => return Err(Error::trajectory(&path, format!("belongs to run {id}, not to this run {}", manifest.run_id))),
        None => return Err(Error::trajectory(&path, "has no run_id metadata")),
    }
    if meta.get("step").map(String::as_str) != Some(s.to_string().as_str()) {
        return Err(Error::trajectory(&path, format!("metadata says step {:?}, expected {s}", meta.get("step"))));
    }
    let mut expected: Vec<String> = manifest.params.iter().map(|p| p.name.clone()).collect();
    expected.sort();
    if f.names() != expected {
        return Err(Error::trajectory(&path, format!("tensor names {:?} differ from the manifest's {:?}", f.names(), expected)));
    }
    let mut data = Vec::with_capacity(manifest.params.len());
    for sp in &manifest.params {
        let (_, v) = f.f64(&sp.name, Some(&sp.shape))?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::trajectory(&path, format!("tensor {} has a non-finite value at index {i}", sp.name)));
        }
        data.push(v);
    }
    Ok(Params { specs: manifest.params.clone(), data })
}

/// Reads and checks `DIR/manifest.json` (format, version, internal consistency).
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let mpath = dir.join("manifest.json");
    let text = std::fs::read_to_string(&mpath).map_err(|e| Error::io(&mpath, e))?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| Error::format(&mpath, format!("invalid manifest: {e}")))?;
    if manifest.format != FORMAT {
        return Err(Error::format(&mpath, format!("format is `{}`, expected `{FORMAT}`", manifest.format)));
    }
    if manifest.version != VERSION {
        return Err(Error::format(&mpath, format!("format version {} is not supported (this build reads {VERSION})", manifest.version)));
    }
    manifest.architecture.validate().map_err(|e| Error::format(&mpath, format!("invalid architecture: {e}")))?;
    if manifest.architecture.param_specs() != manifest.params {
        return Err(Error::format(&mpath, "parameter list does not match the architecture"));
    }
    let w: usize = manifest.params.iter().map(ParamSpec::numel).sum();
    if w != manifest.num_params {
        return Err(Error::format(&mpath, format!("num_params is {} but the parameter shapes sum to {w}", manifest.num_params)));
    }
    if manifest.learning_rates.len() != manifest.steps {
        return Err(Error::format(&mpath, format!("{} learning rates for {} steps", manifest.learning_rates.len(), manifest.steps)));
    }
    Ok(manifest)
}

fn read_targets(f: &SafeFile, name: &str, n: usize, k: usize, task: &str) -> Result<Targets> {
    if task == "classification" {
        let (_, v) = f.i64(name, Some(&[n]))?;
        let mut out = Vec::with_capacity(n);
        for (i, c) in v.into_iter().enumerate() {
            if c < 0 || c as usize >= k {
                return Err(Error::Data(format!("{name}[{i}] = {c} is not a class in 0..{k}")));
            }
            out.push(c as usize);
        }
        Ok(Targets::Labels(out))
    } else {
        Ok(Targets::Values(f.f64(name, Some(&[n, k]))?.1))
    }
}

/// Reads `dataset.safetensors` against the manifest's description.
pub fn read_dataset(path: &Path, manifest: &Manifest) -> Result<Dataset> {
    let f = SafeFile::open(path)?;
    if f.metadata().get("run_id") != Some(&manifest.run_id) {
        return Err(Error::trajectory(path, "dataset belongs to a different run"));
    }
    let info = &manifest.dataset;
    let (m, p, d, k) = (info.n_train, info.n_test, info.dim, info.num_outputs);
    let x_train = f.f64("x_train", Some(&[m, d]))?.1;
    let x_test = f.f64("x_test", Some(&[p, d]))?.1;
    let y_train = read_targets(&f, "y_train", m, k, &info.task)?;
    let y_test = read_targets(&f, "y_test", p, k, &info.task)?;
    let mut ds = Dataset::from_arrays(info.name.clone(), info.description.clone(), d, k, x_train, y_train, x_test, y_test)
        .map_err(|e| Error::trajectory(path, e.to_string()))?;
    ds.image_shape = info.image_shape;
    ds.vocab = info.vocab;
    if ds.vocab.is_some() {
        ds.validate().map_err(|e| Error::trajectory(path, e.to_string()))?;
    }
    Ok(ds)
}
