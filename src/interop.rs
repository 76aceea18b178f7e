//! PyTorch interoperability at the level of runs: a recorded state exported as a PyTorch
//! `state_dict`, and a trajectory recorded by a PyTorch training loop imported as a run.
//!
//! The parameter names and the export's conventions (α folded into the last layer, the
//! `init.` tensors of `zero_output`) are in [`crate::model::torch`]; `scripts/torch_model.py`
//! rebuilds the module from an exported file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::io::{self, SafeFile, StagedDir};
use crate::model::net::{LossKind, Objective};
use crate::model::torch::{self, ExportSource};
use crate::model::{Activation, Architecture, Body, OutputKind};
use crate::trajectory::{self, DatasetInfo, InitRecord, Manifest, OptimizerRecord, Run, Writer};

/// A network exported from a run.
#[derive(Clone, Debug)]
pub struct Exported {
    /// The safetensors bytes ([`torch::export_bytes`]).
    pub bytes: Vec<u8>,
    /// The state exported.
    pub step: usize,
    /// The last state N of the run.
    pub steps: usize,
    /// The module, as PyTorch prints it.
    pub module: String,
    /// Whether the file carries the `init.` network (`zero_output`).
    pub zero_output: bool,
    /// The α folded into the last layer.
    pub alpha: f64,
}

impl std::fmt::Display for Exported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exported state {} of {}: {}", self.step, self.steps, self.module)?;
        if self.alpha != 1.0 {
            write!(f, ", alpha {} folded into the last layer", self.alpha)?;
        }
        if self.zero_output {
            f.write_str(", zero_output: output = net(x) - init(x) (init.* tensors)")?;
        }
        Ok(())
    }
}

/// The network at state `step` (default: the last, N) of `run` as a PyTorch `state_dict` whose
/// module output is the network's logits.
///
/// Errors: `step` beyond N.
pub fn export_torch(run: &Run, step: Option<usize>) -> Result<Exported> {
    let n = run.manifest.steps;
    let s = step.unwrap_or(n);
    if s > n {
        return Err(Error::Config(format!("--step {s} is beyond the last state {n} of {}", run.dir.display())));
    }
    let arch = &run.manifest.architecture;
    let params = run.load_step(s)?;
    let init = if arch.zero_output { Some(run.load_step(0)?) } else { None };
    let source = ExportSource { run: run.dir.display().to_string(), run_id: run.manifest.run_id.clone(), step: s };
    let bytes = torch::export_bytes(arch, &params, init.as_ref(), &source)?;
    Ok(Exported { bytes, step: s, steps: n, module: torch::module_description(arch), zero_output: arch.zero_output, alpha: arch.alpha })
}

/// Writes [`export_torch`]'s file to `out` atomically (temporary name, then rename).
pub fn export_torch_to(run_dir: &Path, step: Option<usize>, out: &Path) -> Result<Exported> {
    let run = Run::open(run_dir)?;
    let e = export_torch(&run, step)?;
    crate::io::write_atomic(out, &e.bytes)?;
    Ok(e)
}

// ---------------------------------------------------------------------------------------------
// Import of a trajectory recorded by a PyTorch training loop
// ---------------------------------------------------------------------------------------------

/// `format` of a recording's `trajectory.json`.
pub const RECORDING_FORMAT: &str = "pathkernel-torch-trajectory";

/// The model entry of `trajectory.json`: what the `state_dict` names and shapes do not say.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RecordedModel {
    /// `Sequential(Linear, σ, …, Linear)`; widths and bias from the tensors.
    Mlp {
        /// `relu` or `tanh`.
        activation: Activation,
    },
    /// `Sequential(Conv2d, σ, MaxPool2d, Flatten, Linear)`; channels, kernel, outputs and bias
    /// from the tensors.
    Cnn {
        /// `relu` or `tanh`.
        activation: Activation,
        /// Input images `[C, H, W]`.
        image: [usize; 3],
        /// Convolution stride.
        stride: usize,
        /// Zero padding.
        padding: usize,
        /// Max-pool window.
        pool: usize,
    },
}

/// `DIR/trajectory.json` of a recording (written by `scripts/record_torch_trajectory.py`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Recording {
    /// Always [`RECORDING_FORMAT`].
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// The module's structure.
    pub model: RecordedModel,
    /// `gd` (full batch) or `sgd` (recorded batches); anything else is refused.
    pub optimizer: String,
    /// `cross_entropy` (on logits, mean) or `mse` (mean over rows and outputs).
    pub loss: String,
    /// ε_s of every update s = 0 … N−1.
    pub learning_rates: Vec<f64>,
    /// The training rows of each update (SGD only).
    #[serde(default)]
    pub batches: Option<Vec<Vec<usize>>>,
    /// Free text (what trained it).
    #[serde(default)]
    pub description: String,
}

/// Options of [`import_torch`].
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Largest accepted relative difference between a recorded update and `−ε_s ∇L_{B_s}(w_s)`
    /// recomputed here (max-norm of the difference over the max-norm of the update).
    pub tolerance: f64,
    /// Replace an existing output directory.
    pub force: bool,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { tolerance: 1e-9, force: false }
    }
}

/// What an import found and wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ImportSummary {
    /// The run directory written.
    pub dir: PathBuf,
    /// Updates N.
    pub steps: usize,
    /// Parameters W.
    pub num_params: usize,
    /// The module, as PyTorch prints it.
    pub module: String,
    /// `gd` or `sgd`.
    pub optimizer: String,
    /// Largest relative difference between a recorded update and `−ε_s ∇L_{B_s}(w_s)`.
    pub max_update_rel_diff: f64,
    /// The step where it occurs.
    pub worst_step: usize,
    /// Loss at w_0 and at w_N.
    pub loss: (f64, f64),
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "imported {} {} steps of {} ({} parameters): loss {:.6} -> {:.6}; recorded updates vs -lr * gradient recomputed here: max relative difference {:.3e} (step {}) -> {}",
            self.steps,
            self.optimizer,
            self.module,
            self.num_params,
            self.loss.0,
            self.loss.1,
            self.max_update_rel_diff,
            self.worst_step,
            self.dir.display()
        )
    }
}

/// The step number of a file name `step_NNNNN.safetensors`.
fn step_number(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("step_")?.strip_suffix(".safetensors")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Path of step `s` of a recording (`step_00000.safetensors`, at least five digits).
pub fn recording_step_path(dir: &Path, s: usize) -> PathBuf {
    dir.join(format!("step_{s:05}.safetensors"))
}

/// The architecture a recording describes: its model entry plus the shapes of step 0.
fn recorded_architecture(dir: &Path, model: &RecordedModel, output: OutputKind) -> Result<Architecture> {
    let path = recording_step_path(dir, 0);
    let f = SafeFile::open(&path)?;
    let names = f.names();
    let bad = |msg: String| Error::trajectory(&path, msg);
    let (body, activation, bias) = match model {
        RecordedModel::Mlp { activation } => {
            let mut layers: Vec<(usize, Vec<usize>)> = Vec::new();
            for n in &names {
                if let Some(i) = n.strip_suffix(".weight").and_then(|i| i.parse::<usize>().ok()) {
                    layers.push((i, f.shape(n)?));
                }
            }
            layers.sort();
            if layers.is_empty() {
                return Err(bad(format!("no Linear weights `0.weight`, `2.weight`, … among {names:?}")));
            }
            let mut widths = vec![layers[0].1.get(1).copied().unwrap_or(0)];
            for (l, (i, shape)) in layers.iter().enumerate() {
                if *i != 2 * l || shape.len() != 2 {
                    return Err(bad(format!(
                        "`{i}.weight` {shape:?}: expected nn.Sequential(Linear, ReLU|Tanh, …, Linear), weights `0.weight`, `2.weight`, … of rank 2"
                    )));
                }
                widths.push(shape[0]);
            }
            (Body::Mlp { widths }, *activation, names.iter().any(|n| n == "0.bias"))
        }
        RecordedModel::Cnn { activation, image, stride, padding, pool } => {
            let cw = f.shape("0.weight")?;
            let dw = f.shape("4.weight")?;
            if cw.len() != 4 || cw[2] != cw[3] || dw.len() != 2 {
                return Err(bad(format!("`0.weight` {cw:?} / `4.weight` {dw:?}: expected Conv2d [Co, C, k, k] and Linear [K, F]")));
            }
            let body = Body::Cnn { image: *image, channels: cw[0], kernel: cw[2], stride: *stride, padding: *padding, pool: *pool, outputs: dw[0] };
            (body, *activation, names.iter().any(|n| n == "0.bias"))
        }
    };
    let arch = Architecture { body, activation, bias, zero_last: false, alpha: 1.0, zero_output: false, output };
    arch.validate().map_err(|e| bad(format!("the recorded model is not one pathkernel has: {e}")))?;
    Ok(arch)
}

/// Reads `data.safetensors` of a recording: `x_train [M, d]` and `x_test [P, d]` f64 (images
/// flattened or `[M, C, H, W]`), `y_train`/`y_test` i64 labels `[M]` (cross-entropy) or f64
/// targets `[M, K]` (MSE).
fn read_recorded_data(path: &Path, arch: &Architecture, loss: LossKind) -> Result<Dataset> {
    let f = SafeFile::open(path)?;
    let d = arch.input_dim();
    let k = arch.outputs();
    let rows = |name: &str| -> Result<Vec<f64>> {
        let shape = f.shape(name)?;
        let feat: usize = shape.iter().skip(1).product();
        if shape.len() < 2 || feat != d {
            return Err(Error::format(path, format!("`{name}` has shape {shape:?}; the model takes rows of {d} features")));
        }
        Ok(f.f64(name, None).map_err(|e| Error::format(path, format!("{e} (record the data in float64)")))?.1)
    };
    let (x_train, x_test) = (rows("x_train")?, rows("x_test")?);
    let (m, p) = (x_train.len() / d, x_test.len() / d);
    let targets = |name: &str, n: usize| -> Result<Targets> {
        match loss {
            LossKind::CrossEntropy => {
                let (_, y) = f.i64(name, Some(&[n]))?;
                y.iter()
                    .enumerate()
                    .map(|(i, &c)| if c >= 0 && (c as usize) < k { Ok(c as usize) } else { Err(Error::format(path, format!("{name}[{i}] = {c} is not a class of the {k} outputs"))) })
                    .collect::<Result<Vec<_>>>()
                    .map(Targets::Labels)
            }
            LossKind::Mse => Ok(Targets::Values(f.f64(name, Some(&[n, k]))?.1)),
        }
    };
    let (y_train, y_test) = (targets("y_train", m)?, targets("y_test", p)?);
    if m == 0 {
        return Err(Error::format(path, "x_train has no rows"));
    }
    let mut ds = Dataset::from_arrays("torch-import", format!("imported from {}", path.display()), d, k, x_train, y_train, x_test, y_test)
        .map_err(|e| Error::format(path, e.to_string()))?;
    if let Body::Cnn { image, .. } = arch.body {
        ds.image_shape = Some(image);
    }
    Ok(ds)
}

/// Imports a trajectory recorded by a PyTorch training loop (`DIR/trajectory.json`,
/// `DIR/step_00000.safetensors` … one `state_dict` per state, `DIR/data.safetensors`) as a run
/// directory `out` that `kernel`, `gp`, `svm` and `attribute` read like one written by `train`.
///
/// Everything is checked before anything is written: the optimizer is `gd` or `sgd` (momentum,
/// Adam and the like are refused: their kernel needs optimizer state the recording does not
/// have), the step files are contiguous 0 … N with N the number of learning rates, every state
/// has the names, shapes and dtype (f64) of step 0, and every recorded update
/// `w_{s+1} − w_s` equals `−ε_s ∇L_{B_s}(w_s)` recomputed here to `opts.tolerance` (relative,
/// max-norm); the first step beyond it is named.
pub fn import_torch(dir: &Path, out: &Path, opts: &ImportOptions) -> Result<ImportSummary> {
    if !dir.is_dir() {
        return Err(Error::trajectory(dir, "not a directory (expected a recording with trajectory.json and step_NNNNN.safetensors files)"));
    }
    if out.exists() && !opts.force {
        let empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !empty {
            return Err(Error::Config(format!("{} already exists; choose another --out or pass --force", out.display())));
        }
    }
    if !(opts.tolerance.is_finite() && opts.tolerance > 0.0) {
        return Err(Error::Config(format!("--tolerance {}: it must be a finite number > 0", opts.tolerance)));
    }
    let jpath = dir.join("trajectory.json");
    let jbytes = io::read_file(&jpath)?;
    let rec: Recording = serde_json::from_slice(&jbytes).map_err(|e| Error::format(&jpath, format!("invalid recording: {e}")))?;
    if rec.format != RECORDING_FORMAT || rec.version != 1 {
        return Err(Error::format(&jpath, format!("format {} version {}; expected {RECORDING_FORMAT} version 1", rec.format, rec.version)));
    }
    let sgd = match rec.optimizer.as_str() {
        "gd" => false,
        "sgd" => true,
        other => {
            return Err(Error::format(
                &jpath,
                format!(
                    "optimizer `{other}` is not supported: only plain gd or sgd updates w_(s+1) = w_s - lr_s * grad are a path kernel of the recorded states; \
                     momentum, Adam and the like need optimizer state (buffers, moments) the recording does not have"
                ),
            ))
        }
    };
    let loss = match rec.loss.as_str() {
        "cross_entropy" => LossKind::CrossEntropy,
        "mse" => LossKind::Mse,
        other => return Err(Error::format(&jpath, format!("loss `{other}`: expected cross_entropy (on logits) or mse"))),
    };
    let n = rec.learning_rates.len();
    if n == 0 {
        return Err(Error::format(&jpath, "no learning rates: at least one recorded update is needed"));
    }
    if let Some(s) = rec.learning_rates.iter().position(|e| !(e.is_finite() && *e > 0.0)) {
        return Err(Error::format(&jpath, format!("learning_rates[{s}] = {}; it must be a finite number > 0", rec.learning_rates[s])));
    }
    // Step files: exactly 0 … N.
    let mut found: Vec<usize> = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        if let Some(s) = step_number(&e.file_name().to_string_lossy()) {
            found.push(s);
        }
    }
    found.sort_unstable();
    for (i, &s) in found.iter().enumerate() {
        if s != i {
            let what = if i > 0 && s == found[i - 1] { format!("step {s} is recorded twice") } else { format!("the step files are not contiguous: step {i} is missing (next is {s})") };
            return Err(Error::trajectory(dir, what));
        }
    }
    if found.len() != n + 1 {
        return Err(Error::trajectory(dir, format!("{} learning rates (N = {n} updates) need step files 0..={n}, found {} (0..={})", n, found.len(), found.len() as isize - 1)));
    }
    let output = if loss == LossKind::CrossEntropy { OutputKind::LogSoftmax } else { OutputKind::Identity };
    let arch = recorded_architecture(dir, &rec.model, output)?;
    let data = read_recorded_data(&dir.join("data.safetensors"), &arch, loss)?;
    let m = data.n_train();
    let batches = match (sgd, &rec.batches) {
        (false, None) => None,
        (false, Some(_)) => return Err(Error::format(&jpath, "optimizer gd uses the full batch; `batches` is only for sgd")),
        (true, None) => return Err(Error::format(&jpath, "optimizer sgd needs `batches`: the training rows of every update")),
        (true, Some(b)) => {
            if b.len() != n {
                return Err(Error::format(&jpath, format!("{} batches for {n} updates", b.len())));
            }
            let mut sorted = Vec::with_capacity(n);
            for (s, batch) in b.iter().enumerate() {
                let mut v = batch.clone();
                v.sort_unstable();
                if v.is_empty() || v.windows(2).any(|w| w[0] == w[1]) || v.last().is_some_and(|&i| i >= m) {
                    return Err(Error::format(&jpath, format!("batch of step {s} must be distinct training rows in 0..{m}, non-empty")));
                }
                sorted.push(v);
            }
            Some(sorted)
        }
    };
    // Every state, checked against the architecture (names, shapes, dtypes, finite).
    let mut states = Vec::with_capacity(n + 1);
    let mut hashes = vec![torch::sha256_hex(&jbytes)];
    for s in 0..=n {
        let path = recording_step_path(dir, s);
        let sd = torch::read_state_dict(&path, &arch).map_err(|e| match e {
            Error::Format { path, msg } => Error::trajectory(path, format!("step {s}: {msg}")),
            other => other,
        })?;
        hashes.push(sd.sha256);
        states.push(sd.params);
    }
    hashes.push(torch::sha256_hex(&io::read_file(&dir.join("data.safetensors"))?));
    // The recorded updates against −ε_s ∇L_{B_s}(w_s).
    let (labels, values) = match &data.y_train {
        Targets::Labels(y) => (Some(y.as_slice()), None),
        Targets::Values(v) => (None, Some(v.as_slice())),
    };
    let dev = dfdx::tensor::Cpu::default();
    let full = Objective::new(dev.clone(), &arch, &data.x_train, labels, values, loss, None)?;
    let k = arch.outputs();
    let mut log = crate::train::TrainLog::default();
    let (mut worst, mut worst_step) = (0.0f64, 0);
    for s in 0..=n {
        let lg = full.evaluate(&states[s]);
        let test_acc = match &data.y_test {
            Targets::Labels(y) if !y.is_empty() => Some(crate::train::accuracy(&arch.forward(&states[s], None, &data.x_test)?, y, k)),
            _ => None,
        };
        log.push(s, lg.loss, labels.map(|y| crate::train::accuracy(&lg.outputs, y, k)), test_acc, lg.grad.norm(), states[s].norm());
        if s == n {
            break;
        }
        let grad = match &batches {
            None => lg.grad,
            Some(b) => {
                let d = data.dim;
                let rows = &b[s];
                let xb: Vec<f64> = rows.iter().flat_map(|&i| data.x_train[i * d..(i + 1) * d].iter().copied()).collect();
                let yb: Option<Vec<usize>> = labels.map(|y| rows.iter().map(|&i| y[i]).collect());
                let vb: Option<Vec<f64>> = values.map(|v| rows.iter().flat_map(|&i| v[i * k..(i + 1) * k].iter().copied()).collect());
                Objective::new(dev.clone(), &arch, &xb, yb.as_deref(), vb.as_deref(), loss, None)?.evaluate(&states[s]).grad
            }
        };
        let eps = rec.learning_rates[s];
        let (w0, w1) = (states[s].flat(), states[s + 1].flat());
        let (mut diff, mut scale) = (0.0f64, 0.0f64);
        for ((a, b), g) in w0.iter().zip(&w1).zip(grad.flat()) {
            let (dw, want) = (b - a, -eps * g);
            diff = diff.max((dw - want).abs());
            scale = scale.max(dw.abs()).max(want.abs());
        }
        let rel = if scale == 0.0 { 0.0 } else { diff / scale };
        if !(rel <= opts.tolerance) {
            return Err(Error::trajectory(
                recording_step_path(dir, s + 1),
                format!(
                    "the update of step {s} (w_{} - w_{s}) differs from -lr_{s} * gradient recomputed at w_{s} on its batch by {rel:.3e} relative (tolerance {:e}); \
                     not a plain {} step of this model, loss and data",
                    s + 1,
                    opts.tolerance,
                    rec.optimizer
                ),
            ));
        }
        if rel > worst {
            (worst, worst_step) = (rel, s);
        }
    }
    // Write the run exactly as `train` does, staged and renamed.
    let num_params = states[0].numel();
    let optimizer = match &batches {
        None => OptimizerRecord::Gd { lr: rec.learning_rates[0], momentum: 0.0, weight_decay: 0.0, decoupled_weight_decay: false },
        Some(b) => OptimizerRecord::Sgd {
            lr: rec.learning_rates[0],
            batch_size: b.iter().map(Vec::len).max().unwrap_or(0),
            shuffle_seed: 0,
            momentum: 0.0,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
            recorded_batches: Some(b.clone()),
        },
    };
    let run_id = format!("{:016x}", crate::train::fnv1a(hashes.join(" ").as_bytes()));
    let manifest = Manifest {
        format: trajectory::FORMAT.into(),
        version: trajectory::VERSION,
        run_id: run_id.clone(),
        architecture: arch.clone(),
        loss,
        optimizer,
        learning_rates: rec.learning_rates.clone(),
        seed: 0,
        steps: n,
        params: arch.param_specs(),
        num_params,
        dataset: DatasetInfo {
            name: data.name.clone(),
            description: data.description.clone(),
            dim: data.dim,
            image_shape: data.image_shape,
            num_outputs: k,
            n_train: m,
            n_test: data.n_test(),
            task: if data.is_classification() { "classification".into() } else { "regression".into() },
        },
        config: serde_json::json!({ "import": { "from": "torch", "dir": dir.display().to_string(), "description": rec.description, "sha256": hashes } }),
        created_by: crate::train::created_by(),
        init: Some(InitRecord { path: recording_step_path(dir, 0).display().to_string(), sha256: hashes[1].clone(), format: torch::FORMAT.into() }),
    };
    let staged = StagedDir::new(out, opts.force)?;
    let writer = Writer::create(staged.path(), manifest, &data)?;
    for (s, p) in states.iter().enumerate() {
        writer.write_step(s, p)?;
    }
    if let Some(b) = &batches {
        trajectory::write_batches(staged.path(), b, &run_id)?;
    }
    let losses = (log.loss[0], log.loss[n]);
    log.table().write_parquet(&staged.path().join("train_log.parquet"))?;
    Run::open(staged.path())?;
    let dir_out = staged.commit()?;
    Ok(ImportSummary {
        dir: dir_out,
        steps: n,
        num_params,
        module: torch::module_description(&arch),
        optimizer: rec.optimizer.clone(),
        max_update_rel_diff: worst,
        worst_step,
        loss: losses,
    })
}
