//! Training with a recorded trajectory.
//!
//! Full-batch gradient descent (forward Euler, the EPK paper's setting) on the mean loss
//! `L(w) = (1/M) Σ_i ℓ(f_w(x_i), y_i)`: cross-entropy on the log-softmax output for
//! classification, MSE for regression. Every state `w_0 … w_N` is written to the run directory
//! (see [`crate::trajectory`]). Gradients come from dfdx; the update is done in f64 on the host.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::data::{DataConfig, Dataset, Targets};
use crate::error::{Error, Result};
use crate::io::{Column, Table};
use crate::model::net::{LossGrad, LossKind, Objective};
use crate::model::{Architecture, ModelConfig, OutputKind, Params};
use crate::optim::{OptimizerState, UpdateRule};
use crate::trajectory::{self, DatasetInfo, Manifest, OptimizerRecord, Writer};

/// Where dfdx runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// The CPU backend.
    #[default]
    Cpu,
    /// dfdx's CUDA backend (needs the `cuda` cargo feature and a GPU).
    Cuda,
}

/// Optimizer choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// Full-batch gradient descent (forward Euler, the EPK paper's setting).
    #[default]
    Gd,
    /// Mini-batch SGD (`train.batch_size` points per step, reshuffled every epoch).
    Sgd,
    /// Adam (`train.weight_decay` coupled, as an L2 term), full batch or with `train.batch_size`.
    Adam,
    /// AdamW (decoupled weight decay), full batch or with `train.batch_size`.
    Adamw,
}

/// How `train.weight_decay` enters the update ([`crate::optim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightDecayMode {
    /// An L2 term `λ w` added to the gradient (goes through momentum and Adam's moments).
    Coupled,
    /// `w ← w − ε_s λ w` applied to the weights directly (SGDW, AdamW).
    Decoupled,
}

/// Learning-rate schedule `ε_s` (recorded per step in the manifest).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Schedule {
    /// `ε_s = ε`.
    #[default]
    Constant,
    /// `ε_s = ε · gamma^⌊s / every⌋`.
    Step {
        /// Steps between decays.
        every: usize,
        /// Decay factor in (0, 1].
        gamma: f64,
    },
    /// `ε_s = min_lr + (ε − min_lr)(1 + cos(π s / N)) / 2`.
    Cosine {
        /// Final learning rate.
        #[serde(default)]
        min_lr: f64,
    },
}

impl Schedule {
    /// `ε_s` for step s of n with base rate `lr`.
    pub fn lr(&self, lr: f64, s: usize, n: usize) -> f64 {
        match *self {
            Schedule::Constant => lr,
            Schedule::Step { every, gamma } => lr * gamma.powi((s / every.max(1)) as i32),
            Schedule::Cosine { min_lr } => min_lr + (lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * s as f64 / n.max(1) as f64).cos()),
        }
    }
}

/// The `[train]` section of a run configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer (default `gd`).
    #[serde(default)]
    pub optimizer: OptimizerKind,
    /// Learning rate ε > 0.
    pub lr: f64,
    /// Number of updates N (states w_0 … w_N are recorded).
    pub steps: usize,
    /// Initialisation seed.
    #[serde(default)]
    pub seed: u64,
    /// Loss; default cross-entropy for classification data, MSE for regression data.
    #[serde(default)]
    pub loss: Option<LossKind>,
    /// Device for dfdx (default `cpu`).
    #[serde(default)]
    pub device: DeviceKind,
    /// Mini-batch size (required by `optimizer = "sgd"`).
    #[serde(default)]
    pub batch_size: Option<usize>,
    /// Learning-rate schedule (default constant).
    #[serde(default)]
    pub schedule: Schedule,
    /// Heavy-ball momentum μ in [0, 1) for `gd` and `sgd` (PyTorch convention).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub momentum: f64,
    /// Weight decay λ ≥ 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub weight_decay: f64,
    /// Coupled or decoupled weight decay (default: decoupled for `adamw`, coupled otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay_mode: Option<WeightDecayMode>,
    /// Adam's (β1, β2), default (0.9, 0.999).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub betas: Option<[f64; 2]>,
    /// Adam's eps, default 1e-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl TrainConfig {
    /// The optimizer as the manifest records it (call on a validated configuration).
    pub(crate) fn optimizer_record(&self, n_train: usize) -> OptimizerRecord {
        let decoupled = match self.weight_decay_mode {
            Some(m) => m == WeightDecayMode::Decoupled,
            None => self.optimizer == OptimizerKind::Adamw,
        };
        let [beta1, beta2] = self.betas.unwrap_or([0.9, 0.999]);
        let lr = self.lr;
        match self.optimizer {
            OptimizerKind::Gd => OptimizerRecord::Gd {
                lr,
                momentum: self.momentum,
                dampening: 0.0,
                nesterov: false,
                weight_decay: self.weight_decay,
                decoupled_weight_decay: decoupled,
                rounded_updates: false,
                per_step: Default::default(),
            },
            OptimizerKind::Sgd => OptimizerRecord::Sgd {
                lr,
                batch_size: self.batch_size.expect("validated").min(n_train),
                shuffle_seed: self.seed,
                momentum: self.momentum,
                dampening: 0.0,
                nesterov: false,
                weight_decay: self.weight_decay,
                decoupled_weight_decay: decoupled,
                rounded_updates: false,
                recorded_batches: None,
                per_step: Default::default(),
            },
            OptimizerKind::Adam | OptimizerKind::Adamw => OptimizerRecord::Adam {
                lr,
                beta1,
                beta2,
                eps: self.eps.unwrap_or(1e-8),
                weight_decay: self.weight_decay,
                decoupled_weight_decay: decoupled,
                batch_size: self.batch_size.map(|b| b.min(n_train)),
                shuffle_seed: self.seed,
                recorded_batches: None,
                per_step: Default::default(),
            },
        }
    }
}

/// A whole run configuration: the TOML file given to `pathkernel train`.
///
/// `[model] init = "weights.safetensors"` (the [`RunConfig::init`] field) starts from a PyTorch
/// `state_dict` instead of the seeded initialisation: names, shapes and dtypes are checked
/// against the architecture (`crate::model::torch::read_state_dict`), the path is resolved
/// against [`TrainOptions::base_dir`], and the manifest records the file and its SHA-256
/// ([`trajectory::InitRecord`]); `zero_last` is then recorded as `false`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawRunConfig", into = "RawRunConfig")]
pub struct RunConfig {
    /// `[data]`
    pub data: DataConfig,
    /// `[model]`
    pub model: ModelConfig,
    /// `[model] init`: a PyTorch `state_dict` (safetensors, f64) to start from.
    pub init: Option<PathBuf>,
    /// `[train]`
    pub train: TrainConfig,
}

/// The configuration as written: `init` sits in the `[model]` table beside the model's keys.
/// Without `init` it serialises exactly as before the key existed (same run ids).
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRunConfig {
    #[serde(default)]
    data: DataConfig,
    #[serde(default)]
    model: RawModel,
    train: TrainConfig,
}

#[derive(Clone, Default, Serialize, Deserialize)]
struct RawModel {
    #[serde(flatten)]
    config: ModelConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    init: Option<PathBuf>,
}

impl TryFrom<RawRunConfig> for RunConfig {
    type Error = String;
    fn try_from(r: RawRunConfig) -> std::result::Result<Self, String> {
        if r.model.init.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err("model.init is empty; give the path of a PyTorch state_dict (.safetensors)".into());
        }
        Ok(RunConfig { data: r.data, model: r.model.config, init: r.model.init, train: r.train })
    }
}

impl From<RunConfig> for RawRunConfig {
    fn from(c: RunConfig) -> Self {
        RawRunConfig { data: c.data, model: RawModel { config: c.model, init: c.init }, train: c.train }
    }
}

impl RunConfig {
    /// Parses a TOML configuration (unknown keys and wrong types are errors) and validates it.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let cfg: RunConfig = toml::from_str(text).map_err(|e| {
            Error::format(origin, e.message().replace('\n', " ").trim().to_string() + &span_hint(text, e.span()))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a TOML configuration file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_toml(&text, path)
    }

    /// Checks every value.
    pub fn validate(&self) -> Result<()> {
        self.data.validate()?;
        self.model.validate()?;
        let t = &self.train;
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return Err(Error::Config(format!("train.lr = {}; it must be a finite number > 0", t.lr)));
        }
        if t.steps == 0 {
            return Err(Error::Config("train.steps = 0; at least one step is needed".into()));
        }
        match (t.optimizer, t.batch_size) {
            (OptimizerKind::Sgd, None) => return Err(Error::Config("train.optimizer = \"sgd\" needs train.batch_size".into())),
            (_, Some(0)) => return Err(Error::Config("train.batch_size = 0; it must be >= 1".into())),
            (OptimizerKind::Gd, Some(_)) => {
                return Err(Error::Config(
                    "train.batch_size is only used by optimizer = \"sgd\", \"adam\" or \"adamw\" (gd uses the full batch)".into(),
                ))
            }
            _ => {}
        }
        let adam = matches!(t.optimizer, OptimizerKind::Adam | OptimizerKind::Adamw);
        if !(t.momentum.is_finite() && (0.0..1.0).contains(&t.momentum)) {
            return Err(Error::Config(format!("train.momentum = {}; it must be in [0, 1)", t.momentum)));
        }
        if adam && t.momentum != 0.0 {
            return Err(Error::Config("train.momentum is for gd and sgd; adam and adamw take train.betas = [beta1, beta2]".into()));
        }
        if !(t.weight_decay.is_finite() && t.weight_decay >= 0.0) {
            return Err(Error::Config(format!("train.weight_decay = {}; it must be a finite number >= 0", t.weight_decay)));
        }
        if t.optimizer == OptimizerKind::Adamw && t.weight_decay_mode == Some(WeightDecayMode::Coupled) {
            return Err(Error::Config("train.weight_decay_mode = \"coupled\" with adamw: that is adam; use optimizer = \"adam\"".into()));
        }
        if t.weight_decay_mode.is_some() && t.weight_decay == 0.0 {
            return Err(Error::Config("train.weight_decay_mode is set but train.weight_decay is 0".into()));
        }
        if !adam && (t.betas.is_some() || t.eps.is_some()) {
            return Err(Error::Config("train.betas and train.eps are for optimizer = \"adam\" or \"adamw\"".into()));
        }
        if let Some([b1, b2]) = t.betas {
            if !((0.0..1.0).contains(&b1) && (0.0..1.0).contains(&b2)) {
                return Err(Error::Config(format!("train.betas = [{b1}, {b2}]; both must be in [0, 1)")));
            }
        }
        if let Some(e) = t.eps {
            if !(e.is_finite() && e > 0.0) {
                return Err(Error::Config(format!("train.eps = {e}; it must be a finite number > 0")));
            }
        }
        match t.schedule {
            Schedule::Step { every, gamma } if every == 0 || !(gamma > 0.0 && gamma <= 1.0) => {
                return Err(Error::Config(format!("train.schedule: step needs every >= 1 and 0 < gamma <= 1 (got every = {every}, gamma = {gamma})")));
            }
            Schedule::Cosine { min_lr } if !(min_lr.is_finite() && min_lr >= 0.0 && min_lr <= t.lr) => {
                return Err(Error::Config(format!("train.schedule: cosine needs 0 <= min_lr <= lr (got {min_lr})")));
            }
            _ => {}
        }
        Ok(())
    }

    /// A stable identifier of this configuration (FNV-1a of its canonical JSON).
    pub fn run_id(&self) -> String {
        let json = serde_json::to_string(self).expect("config serialises");
        format!("{:016x}", fnv1a(json.as_bytes()))
    }
}

pub(crate) fn span_hint(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(r) => {
            let start = r.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            let src = text.lines().nth(line - 1).unwrap_or("").trim();
            format!(" (line {line}: `{src}`)")
        }
        None => String::new(),
    }
}

/// 64-bit FNV-1a hash.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Revision of the trainer's numerics: bumped whenever the same configuration would record a
/// different path (2: max-pool sends a tied window's gradient to its first maximum only).
/// Study caches compare it, so stale trajectories are never reused.
pub(crate) const TRAINER_REVISION: u32 = 2;

/// The manifest's `created_by`: crate version and trainer revision.
pub fn created_by() -> String {
    format!("pathkernel {} (trainer revision {TRAINER_REVISION})", env!("CARGO_PKG_VERSION"))
}

/// Whether `dir` holds a run of exactly `cfg` from this trainer revision: its manifest records
/// the same run id, the same whole configuration and the same `created_by`.
pub(crate) fn holds_run(dir: &Path, cfg: &RunConfig) -> bool {
    match (trajectory::read_manifest(dir), serde_json::to_value(cfg)) {
        (Ok(m), Ok(c)) => m.run_id == cfg.run_id() && m.config == c && m.created_by == created_by(),
        _ => false,
    }
}

/// Options of a training run that do not change its result.
#[derive(Clone, Debug, Default)]
pub struct TrainOptions {
    /// Show a progress bar (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Replace an existing run directory (only once the new run is complete).
    pub force: bool,
    /// Directory relative paths in the config (e.g. MNIST's) are resolved against.
    pub base_dir: PathBuf,
    /// Memory budget in bytes (`None`: unlimited); training is refused with an estimate above it.
    pub memory_budget: Option<u64>,
}

/// Estimated peak bytes of training: the dataset, one forward/backward pass over the training
/// set (activations and their gradients), and the parameters with their gradient and optimizer
/// buffers.
pub(crate) fn estimate_bytes(data: &Dataset, arch: &Architecture, w: usize) -> u64 {
    let rows = (data.n_train() + data.n_test()) as u64;
    let data_bytes = 2 * 8 * rows * data.dim as u64;
    let pass = 8 * data.n_train() as u64 * arch.floats_per_row();
    data_bytes + pass + 8 * 8 * w as u64
}

/// What a finished run reports.
#[derive(Clone, Debug, Serialize)]
pub struct TrainSummary {
    /// The run directory.
    pub dir: PathBuf,
    /// Updates N.
    pub steps: usize,
    /// Parameters W.
    pub num_params: usize,
    /// Loss at w_0.
    pub initial_loss: f64,
    /// Loss at w_N.
    pub final_loss: f64,
    /// Training accuracy at w_N (classification).
    pub train_accuracy: Option<f64>,
    /// Held-out accuracy at w_N (classification).
    pub test_accuracy: Option<f64>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

impl TrainSummary {
    /// Rich display in evcxr notebooks: an HTML table.
    pub fn evcxr_display(&self) {
        let pct = |v: Option<f64>| v.map_or("—".to_string(), |a| format!("{:.2} %", 100.0 * a));
        println!(
            "EVCXR_BEGIN_CONTENT text/html\n<table><tr><th>steps</th><th>parameters</th><th>loss</th><th>train accuracy</th><th>test accuracy</th><th>seconds</th><th>run</th></tr><tr><td>{}</td><td>{}</td><td>{:.6} → {:.6}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td></tr></table>\nEVCXR_END_CONTENT",
            self.steps,
            self.num_params,
            self.initial_loss,
            self.final_loss,
            pct(self.train_accuracy),
            pct(self.test_accuracy),
            self.seconds,
            self.dir.display()
        );
    }
}

impl std::fmt::Display for TrainSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trained {} steps, {} parameters: loss {:.6} -> {:.6}", self.steps, self.num_params, self.initial_loss, self.final_loss)?;
        if let Some(a) = self.train_accuracy {
            write!(f, ", train accuracy {:.2}%", 100.0 * a)?;
        }
        if let Some(a) = self.test_accuracy {
            write!(f, ", test accuracy {:.2}%", 100.0 * a)?;
        }
        write!(f, " ({:.1} s) -> {}", self.seconds, self.dir.display())
    }
}

/// Fraction of rows whose arg-max output equals the label.
///
/// # Shapes
/// `outputs` is `[n, K]`, `labels` `[n]`.
pub fn accuracy(outputs: &[f64], labels: &[usize], k: usize) -> f64 {
    let correct = outputs
        .chunks(k)
        .zip(labels)
        .filter(|(row, &y)| crate::data::argmax(row) == y)
        .count();
    correct as f64 / labels.len().max(1) as f64
}

/// Resolves loss and architecture for a dataset.
pub fn resolve(cfg: &RunConfig, data: &Dataset) -> Result<(LossKind, Architecture)> {
    let loss = match (cfg.train.loss, &data.y_train) {
        (Some(LossKind::CrossEntropy), Targets::Values(_)) => {
            return Err(Error::Config("train.loss = \"cross-entropy\" needs a classification dataset".into()))
        }
        (Some(LossKind::Mse), Targets::Labels(_)) => {
            return Err(Error::Config("train.loss = \"mse\" needs a regression dataset (targets, not labels)".into()))
        }
        (Some(l), _) => l,
        (None, Targets::Labels(_)) => LossKind::CrossEntropy,
        (None, Targets::Values(_)) => LossKind::Mse,
    };
    let output = match loss {
        LossKind::CrossEntropy => OutputKind::LogSoftmax,
        LossKind::Mse => OutputKind::Identity,
    };
    let mut arch = cfg.model.resolve_for(data, output)?;
    if cfg.init.is_some() {
        // w_0 is the file's, whatever its last layer holds.
        arch.zero_last = false;
    }
    Ok((loss, arch))
}

/// Trains as configured and records the trajectory into `out`.
///
/// The run is written into `OUT.partial` and renamed to `out` only when complete, so `out`
/// never holds a half-recorded run. An existing non-empty `out` is an error unless
/// `opts.force`, in which case it is replaced after the new run completed.
pub fn train_to_dir(cfg: &RunConfig, out: &Path, opts: &TrainOptions) -> Result<TrainSummary> {
    cfg.validate()?;
    if out.exists() && !opts.force {
        let empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !empty {
            return Err(Error::Config(format!("{} already exists; choose another --out or pass --force", out.display())));
        }
    }
    let data = cfg.data.load(&opts.base_dir)?;
    let (loss, arch) = resolve(cfg, &data)?;
    check_memory(&data, &arch, opts)?;
    let partial = partial_dir(out);
    if partial.exists() {
        if !opts.force {
            return Err(Error::Config(format!(
                "{} holds an interrupted run; continue it with `pathkernel train --resume {}` or pass --force to start over",
                partial.display(),
                out.display()
            )));
        }
        std::fs::remove_dir_all(&partial).map_err(|e| Error::io(&partial, e))?;
    }
    let result = match cfg.train.device {
        DeviceKind::Cpu => record_cpu(cfg, &data, loss, &arch, &partial, opts, false),
        DeviceKind::Cuda => cuda_record(cfg, &data, loss, &arch, &partial, opts, false),
    };
    finish(result, &partial, out)
}

/// Moves a completed staging directory into place; on failure keeps it only when the failure
/// was an I/O error (the recorded steps are intact and `--resume` can continue them).
fn finish(result: Result<TrainSummary>, partial: &Path, out: &Path) -> Result<TrainSummary> {
    let mut summary = match result {
        Ok(s) => s,
        Err(e) => {
            if !matches!(e, Error::Io { .. }) {
                let _ = std::fs::remove_dir_all(partial);
            }
            return Err(e);
        }
    };
    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| Error::io(out, e))?;
    }
    std::fs::rename(partial, out).map_err(|e| Error::io(out, e))?;
    summary.dir = out.to_path_buf();
    Ok(summary)
}

/// Resumes an interrupted `train` into `out`: reads the configuration from `OUT.partial`'s
/// manifest, checks the data and every recorded state (replaying the path and comparing bit
/// for bit), and continues from the last complete step. The finished trajectory is identical to
/// an uninterrupted run.
pub(crate) fn resume_to_dir(out: &Path, opts: &TrainOptions) -> Result<TrainSummary> {
    let partial = partial_dir(out);
    if !partial.join("manifest.json").exists() {
        return Err(Error::Config(format!(
            "nothing to resume: {} has no manifest (the run completed, or never started)",
            partial.display()
        )));
    }
    if out.exists() && !opts.force {
        return Err(Error::Config(format!("{} already exists; pass --force to replace it", out.display())));
    }
    let manifest = trajectory::read_manifest(&partial)?;
    let cfg: RunConfig = serde_json::from_value(manifest.config.clone())
        .map_err(|e| Error::trajectory(&partial, format!("manifest config is not a run configuration: {e}")))?;
    cfg.validate()?;
    if cfg.run_id() != manifest.run_id {
        return Err(Error::trajectory(&partial, "manifest run id does not match its configuration"));
    }
    let data = cfg.data.load(&opts.base_dir)?;
    let (loss, arch) = resolve(&cfg, &data)?;
    check_memory(&data, &arch, opts)?;
    let result = match cfg.train.device {
        DeviceKind::Cpu => record_cpu(&cfg, &data, loss, &arch, &partial, opts, true),
        DeviceKind::Cuda => cuda_record(&cfg, &data, loss, &arch, &partial, opts, true),
    };
    finish(result, &partial, out)
}

fn check_memory(data: &Dataset, arch: &Architecture, opts: &TrainOptions) -> Result<()> {
    let Some(budget) = opts.memory_budget else { return Ok(()) };
    let w = arch.param_specs().iter().map(|s| s.numel()).sum::<usize>();
    let need = estimate_bytes(data, arch, w);
    if need > budget {
        return Err(Error::OutOfMemoryBudget {
            what: format!("training on {} points ({} parameters, full-batch passes over the training set)", data.n_train(), w),
            needed_bytes: need,
            budget_bytes: budget,
            hint: "use fewer training points ([data] per_class / n_train) or raise --memory".into(),
        });
    }
    Ok(())
}

/// The staging directory of a run being recorded.
pub(crate) fn partial_dir(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

#[cfg(feature = "cuda")]
fn cuda_record(cfg: &RunConfig, data: &Dataset, loss: LossKind, arch: &Architecture, dir: &Path, opts: &TrainOptions, resume: bool) -> Result<TrainSummary> {
    let dev = dfdx::tensor::Cuda::try_build(0, cfg.train.seed).map_err(|e| Error::Backend(format!("CUDA device 0: {e:?}")))?;
    record_inner(dev, cfg, data, loss, arch, dir, opts, resume)
}

#[cfg(not(feature = "cuda"))]
fn cuda_record(_: &RunConfig, _: &Dataset, _: LossKind, _: &Architecture, _: &Path, _: &TrainOptions, _: bool) -> Result<TrainSummary> {
    Err(Error::Config("train.device = \"cuda\" but this build has no CUDA support (rebuild with --features cuda)".into()))
}

/// The logged loss and outputs of a mini-batch step on all training points: the network's own
/// forward pass (the kernel engine's, [`Architecture::forward`]) instead of an autodiff pass
/// that builds no gradient — 4× faster on LeNet-5, where it was most of a step — the loss as
/// [`Objective::values`] defines it (mean cross-entropy of the log-probabilities, or mean
/// squared error over points and outputs). Only the log reads it: the update takes the batch's
/// gradient.
fn logged_values(arch: &Architecture, params: &Params, init: &Params, data: &Dataset, loss: LossKind) -> Result<(f64, Vec<f64>)> {
    let f = arch.forward(params, Some(init), &data.x_train)?;
    let (n, k) = (data.n_train(), arch.outputs());
    let value = match (&data.y_train, loss) {
        (Targets::Labels(y), LossKind::CrossEntropy) => -y.iter().enumerate().map(|(i, &c)| f[i * k + c]).sum::<f64>() / n as f64,
        (Targets::Values(v), LossKind::Mse) => f.iter().zip(v).map(|(a, b)| (a - b) * (a - b)).sum::<f64>() / (n * k) as f64,
        _ => return Err(Error::Config("the loss does not match the targets (cross-entropy needs labels, mse values)".into())),
    };
    Ok((value, f))
}

/// Records on the CPU, inside a one-thread rayon pool: dfdx's CPU matmul splits work over the
/// global pool and its results then depend on the thread schedule in the last bits; one thread
/// makes every run of a configuration bit-identical (and `--resume` exact).
fn record_cpu(cfg: &RunConfig, data: &Dataset, loss: LossKind, arch: &Architecture, dir: &Path, opts: &TrainOptions, resume: bool) -> Result<TrainSummary> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| Error::Backend(format!("thread pool: {e}")))?;
    pool.install(|| record_inner(dfdx::tensor::Cpu::default(), cfg, data, loss, arch, dir, opts, resume))
}

/// Records the run of `cfg` into `dir` on `dev`: every state w_0 … w_N, the preconditioners of
/// adaptive optimizers, the batches of SGD and the training log. With `resume`, the states
/// already in `dir` are replayed and checked bit for bit against the recomputed path.
///
/// Errors: a non-finite loss, gradient or weight ([`Error::Diverged`]); a resumed run whose
/// dataset or states differ from the recomputed ones.
#[allow(clippy::too_many_arguments)]
fn record_inner<D: dfdx::tensor_ops::Device<f64>>(
    dev: D,
    cfg: &RunConfig,
    data: &Dataset,
    loss: LossKind,
    arch: &Architecture,
    dir: &Path,
    opts: &TrainOptions,
    resume: bool,
) -> Result<TrainSummary> {
    let start = Instant::now();
    let n = cfg.train.steps;
    let k = data.num_outputs;
    let (init, init_record) = initial_state(cfg, arch, opts)?;
    let manifest = run_manifest(cfg, data, loss, arch, &init, init_record);
    // Resuming: the states already on disk are replayed (and checked bit for bit against the
    // recomputed path); recording continues after the last complete one.
    let (writer, replay) = if resume { reopen_for_resume(dir, &manifest, data)? } else { (Writer::create(dir, manifest.clone(), data)?, None) };
    let batches = manifest.batches();
    if let Some(b) = &batches {
        trajectory::write_batches(dir, b, &manifest.run_id)?;
    }
    let (labels, values) = train_targets(data);
    let test_labels = match &data.y_test {
        Targets::Labels(y) => Some(y.as_slice()),
        Targets::Values(_) => None,
    };
    let objective = Objective::new(dev, arch, &data.x_train, labels, values, loss, Some(&init))?;
    let bar = crate::progress::Progress::new(opts.progress, n as u64 + 1, "train {bar:40} {pos}/{len} steps  loss {msg}  [{elapsed} < {eta}]");
    let mut log = TrainLog::default();
    let mut params: Params = init.clone();
    let mut optimizer = OptimizerState::new(UpdateRule::of(&manifest.optimizer), init.numel());
    let mut first_loss = f64::NAN;
    let mut last = (f64::NAN, None, None);
    for s in 0..=n {
        let replayed = replay.is_some_and(|last| s <= last);
        if replayed {
            let stored = trajectory::load_step(dir, &manifest, s)?;
            if s > 0 && stored != params {
                return Err(Error::trajectory(
                    trajectory::step_path(dir, s),
                    "the recorded state differs from the recomputed path (different build or platform?); cannot resume",
                ));
            }
            params = stored;
        }
        // Mini-batch steps before the last use their batch's gradient: the full batch only gives
        // the logged loss and outputs (a forward pass, no tape).
        let full_grad = batches.is_none() || s == n;
        let lg = if full_grad {
            objective.evaluate(&params)
        } else {
            let (loss, outputs) = logged_values(arch, &params, &init, data, loss)?;
            LossGrad { loss, grad: Params::zeros(Vec::new()), outputs }
        };
        if !lg.loss.is_finite() {
            return Err(Error::Diverged { step: s, loss: lg.loss, what: "non-finite loss".into() });
        }
        if let Some(name) = lg.grad.first_non_finite() {
            return Err(Error::Diverged { step: s, loss: lg.loss, what: format!("non-finite gradient in {name}") });
        }
        if !replayed {
            writer.write_step(s, &params)?;
        }
        let acc = labels.map(|y| accuracy(&lg.outputs, y, k));
        let test_acc = match test_labels {
            Some(y) if !y.is_empty() => Some(accuracy(&arch.forward(&params, Some(&init), &data.x_test)?, y, k)),
            _ => None,
        };
        // The update's gradient: the full batch (gd) or this step's mini-batch (sgd).
        let grad = match &batches {
            Some(b) if s < n => {
                let bg = batch_objective(objective.device().clone(), arch, data, &b[s], loss, Some(&init))?.evaluate(&params);
                if let Some(name) = bg.grad.first_non_finite() {
                    return Err(Error::Diverged { step: s, loss: bg.loss, what: format!("non-finite mini-batch gradient in {name}") });
                }
                bg.grad
            }
            _ => lg.grad,
        };
        log.push(s, lg.loss, acc, test_acc, grad.norm(), params.norm());
        if s == 0 {
            first_loss = lg.loss;
        }
        last = (lg.loss, acc, test_acc);
        bar.set_message(format!("{:.5}", lg.loss));
        bar.inc(1);
        if s == n {
            break;
        }
        let delta = optimizer.step(manifest.learning_rates[s], &params.flat(), &grad.flat());
        if let Some(scale) = optimizer.last_scale() {
            writer.write_preconditioner(s, scale)?;
        }
        add_flat(&mut params, &delta);
        if let Some(name) = params.first_non_finite() {
            return Err(Error::Diverged { step: s + 1, loss: lg.loss, what: format!("non-finite weight in {name}") });
        }
    }
    bar.finish_and_clear();
    log.table().write_parquet(&dir.join("train_log.parquet"))?;
    Ok(TrainSummary {
        dir: dir.to_path_buf(),
        steps: n,
        num_params: init.numel(),
        initial_loss: first_loss,
        final_loss: last.0,
        train_accuracy: last.1,
        test_accuracy: last.2,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The initial state w_0: `cfg.init`'s PyTorch `state_dict` (with its record for the manifest)
/// when it names one, else the architecture's seeded initialisation.
fn initial_state(cfg: &RunConfig, arch: &Architecture, opts: &TrainOptions) -> Result<(Params, Option<trajectory::InitRecord>)> {
    Ok(match &cfg.init {
        None => {
            let mut w = arch.init(cfg.train.seed);
            let scale = cfg.model.init_scale();
            if scale != 1.0 {
                w.data.iter_mut().flatten().for_each(|v| *v *= scale);
            }
            (w, None)
        }
        Some(_) if cfg.model.init_scale() != 1.0 => {
            return Err(Error::Config("model.init_scale scales the seeded initialisation; a run that starts from `init` (a state_dict) takes it as it is: leave init_scale out".into()));
        }
        Some(path) => {
            let sd = crate::model::torch::read_state_dict(&opts.base_dir.join(path), arch)?;
            let record = trajectory::InitRecord { path: path.display().to_string(), sha256: sd.sha256, format: crate::model::torch::FORMAT.into() };
            (sd.params, Some(record))
        }
    })
}

/// The manifest of the run of `cfg` on `data` from `init`.
fn run_manifest(cfg: &RunConfig, data: &Dataset, loss: LossKind, arch: &Architecture, init: &Params, init_record: Option<trajectory::InitRecord>) -> Manifest {
    let n = cfg.train.steps;
    Manifest {
        format: trajectory::FORMAT.into(),
        version: trajectory::VERSION,
        run_id: cfg.run_id(),
        architecture: arch.clone(),
        loss,
        optimizer: cfg.train.optimizer_record(data.n_train()),
        learning_rates: (0..n).map(|s| cfg.train.schedule.lr(cfg.train.lr, s, n)).collect(),
        seed: cfg.train.seed,
        steps: n,
        params: init.specs.clone(),
        num_params: init.numel(),
        dataset: DatasetInfo {
            name: data.name.clone(),
            description: data.description.clone(),
            dim: data.dim,
            image_shape: data.image_shape,
            vocab: data.vocab,
            num_outputs: data.num_outputs,
            n_train: data.n_train(),
            n_test: data.n_test(),
            task: if data.is_classification() { "classification".into() } else { "regression".into() },
        },
        config: serde_json::to_value(cfg).expect("config serialises"),
        created_by: created_by(),
        init: init_record,
    }
}

/// Reopens the partial run in `dir` for `--resume`: checks that its dataset is `data`, finds
/// the last complete state and removes the step files after it. Returns the writer and that
/// last state (`None` when there is none).
fn reopen_for_resume(dir: &Path, manifest: &Manifest, data: &Dataset) -> Result<(Writer, Option<usize>)> {
    let n = manifest.steps;
    let writer = Writer::reopen(dir, manifest.clone())?;
    let stored = trajectory::read_dataset(&dir.join("dataset.safetensors"), manifest)?;
    if stored.x_train != data.x_train || stored.y_train != data.y_train || stored.x_test != data.x_test || stored.y_test != data.y_test {
        return Err(Error::trajectory(dir, "the dataset on disk differs from the one the configuration produces now; cannot resume"));
    }
    let mut last = None;
    for s in 0..=n {
        match trajectory::load_step(dir, manifest, s) {
            Ok(_) => last = Some(s),
            Err(_) => break,
        }
    }
    let first_missing = last.map_or(0, |l| l + 1);
    for s in first_missing..=n + 1 {
        let p = trajectory::step_path(dir, s);
        if p.exists() {
            std::fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
        }
    }
    Ok((writer, last))
}

/// `params += delta`, `delta` flat in the parameters' order. # Shapes `delta`: `[W]`.
fn add_flat(params: &mut Params, delta: &[f64]) {
    let mut off = 0;
    for w in params.data.iter_mut() {
        for (wi, di) in w.iter_mut().zip(&delta[off..]) {
            *wi += di;
        }
        off += w.len();
    }
}

/// The training targets of `data` as [`Objective::new`] takes them: class labels or values.
///
/// # Shapes
/// Labels `[M]`, or values `[M, K]` row-major.
pub(crate) fn train_targets(data: &Dataset) -> (Option<&[usize]>, Option<&[f64]>) {
    match &data.y_train {
        Targets::Labels(y) => (Some(y.as_slice()), None),
        Targets::Values(v) => (None, Some(v.as_slice())),
    }
}

/// The objective on the training rows `rows` of `data` (one mini-batch), with `loss` and the
/// output offset `offset` (`zero_output`'s w_0) of the full-batch one.
///
/// # Shapes
/// `rows`: `[B]` indices into the `M` training rows.
pub(crate) fn batch_objective<D: dfdx::tensor_ops::Device<f64>>(
    dev: D,
    arch: &Architecture,
    data: &Dataset,
    rows: &[usize],
    loss: LossKind,
    offset: Option<&Params>,
) -> Result<Objective<D>> {
    let (labels, values) = train_targets(data);
    let (d, k) = (data.dim, data.num_outputs);
    let xb: Vec<f64> = rows.iter().flat_map(|&i| data.x_train[i * d..(i + 1) * d].iter().copied()).collect();
    let yb: Option<Vec<usize>> = labels.map(|y| rows.iter().map(|&i| y[i]).collect());
    let vb: Option<Vec<f64>> = values.map(|v| rows.iter().flat_map(|&i| v[i * k..(i + 1) * k].iter().copied()).collect());
    Objective::new(dev, arch, &xb, yb.as_deref(), vb.as_deref(), loss, offset)
}

/// The per-step training log, `DIR/train_log.parquet` of a run. # Shapes `[N + 1]` per field.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TrainLog {
    /// Step `s` (the state `w_s` the row describes).
    pub step: Vec<i64>,
    /// Mean training loss at `w_s`.
    pub loss: Vec<f64>,
    /// Training accuracy (NaN for regression).
    pub acc: Vec<f64>,
    /// Held-out test accuracy (NaN for regression).
    pub test_acc: Vec<f64>,
    /// `‖∇L(w_s)‖`.
    pub grad_norm: Vec<f64>,
    /// `‖w_s‖`.
    pub weight_norm: Vec<f64>,
}

impl TrainLog {
    /// Reads the log of the run in `dir`.
    ///
    /// Errors: a missing or unreadable file, a missing column.
    pub(crate) fn read(dir: &Path) -> Result<TrainLog> {
        let path = dir.join("train_log.parquet");
        let t = Table::read_parquet(&path)?;
        let f = |name: &str| t.f64(name).map(<[f64]>::to_vec).ok_or_else(|| Error::format(&path, format!("no f64 column `{name}`")));
        let step = t.i64("step").map(<[i64]>::to_vec).ok_or_else(|| Error::format(&path, "no i64 column `step`"))?;
        Ok(TrainLog { step, loss: f("loss")?, acc: f("accuracy")?, test_acc: f("test_accuracy")?, grad_norm: f("grad_norm")?, weight_norm: f("weight_norm")? })
    }

    /// Appends the row of step `s` (`None` accuracies are NaN).
    pub(crate) fn push(&mut self, s: usize, loss: f64, acc: Option<f64>, test_acc: Option<f64>, g: f64, w: f64) {
        self.step.push(s as i64);
        self.loss.push(loss);
        self.acc.push(acc.unwrap_or(f64::NAN));
        self.test_acc.push(test_acc.unwrap_or(f64::NAN));
        self.grad_norm.push(g);
        self.weight_norm.push(w);
    }
    /// The columns of `train_log.parquet`.
    pub(crate) fn table(self) -> Table {
        Table::new()
            .with("step", Column::I64(self.step))
            .with("loss", Column::F64(self.loss))
            .with("accuracy", Column::F64(self.acc))
            .with("test_accuracy", Column::F64(self.test_acc))
            .with("grad_norm", Column::F64(self.grad_norm))
            .with("weight_norm", Column::F64(self.weight_norm))
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::trajectory::Run;

    /// The logged loss and outputs of a mini-batch step (the network's own forward pass) equal
    /// the autodiff objective's (`Objective::values`): cross-entropy on a layer stack with a
    /// convolution and max-pooling, mean squared error on an MLP whose outputs are offset by
    /// the initial network (`zero_output`), at every recorded state.
    #[test]
    fn logged_values_equal_the_objective_s() {
        let dir = tempfile::tempdir().unwrap();
        let runs = [
            ("ce", "[data]\nkind = \"mnist\"\npath = \"MNIST\"\nn_train = 12\nn_test = 2\n\n[model]\nkind = \"layers\"\nzero_last = false\nlayers = [{ conv2d = { channels = 2, kernel = 5, stride = 2 } }, \"relu\", { max_pool2d = 2 }, \"flatten\", { dense = 10 }]\n\n[train]\noptimizer = \"sgd\"\nbatch_size = 4\nlr = 0.3\nsteps = 3\nseed = 4\n"),
            ("mse", "[data]\nkind = \"regression1d\"\nn_test = 5\n\n[model]\nkind = \"mlp\"\nhidden = [6]\nactivation = \"tanh\"\nzero_last = false\nalpha = 2.0\nzero_output = true\n\n[train]\noptimizer = \"sgd\"\nbatch_size = 5\nlr = 0.05\nsteps = 3\nloss = \"mse\"\n"),
        ];
        let mnist = dir.path().join("MNIST");
        std::fs::create_dir_all(&mnist).unwrap();
        crate::kernel::stack::tests::tiny_mnist(&mnist, 12, 2);
        for (name, toml) in runs {
            let toml = toml.replace("\"MNIST\"", &format!("{:?}", mnist.to_str().unwrap()));
            let cfg = RunConfig::from_toml(&toml, Path::new("test.toml")).unwrap();
            let out = dir.path().join(name);
            train_to_dir(&cfg, &out, &TrainOptions { progress: false, force: false, base_dir: PathBuf::from("."), memory_budget: None }).unwrap();
            let run = Run::open(&out).unwrap();
            let states = run.load_all().unwrap();
            let (arch, data, loss) = (&run.manifest.architecture, &run.dataset, run.manifest.loss);
            let (labels, values) = train_targets(data);
            let objective = Objective::new(dfdx::tensor::Cpu::default(), arch, &data.x_train, labels, values, loss, Some(&states[0])).unwrap();
            for (s, w) in states.iter().enumerate() {
                let (want_loss, want) = objective.values(w);
                let (got_loss, got) = logged_values(arch, w, &states[0], data, loss).unwrap();
                assert!((got_loss - want_loss).abs() <= 1e-13 * want_loss.abs().max(1.0), "{name} step {s}: loss {got_loss} vs {want_loss}");
                assert!(crate::kernel::max_abs_diff(&got, &want) <= 1e-12, "{name} step {s}: outputs");
            }
        }
    }
}
