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
use crate::model::layers::Shape;
use crate::model::{Activation, Architecture, Body, OutputKind, Params};
use crate::optim::{OptimizerState, StepFactors, UpdateRule};
use crate::trajectory::{self, DatasetInfo, InitRecord, Manifest, OptimizerRecord, Run, Writer};

mod modules;
mod optimizer;
mod states;
mod step_check;

use optimizer::RecordedOptimizer;
use states::Precision;
use step_check::StepDiff;
pub use step_check::TOLERANCE_ULPS;

/// A network exported from a run.
#[derive(Clone, Debug)]
pub(crate) struct Exported {
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
pub(crate) fn export_torch(run: &Run, step: Option<usize>) -> Result<Exported> {
    let n = run.manifest.steps;
    let s = step.unwrap_or(n);
    if s > n {
        return Err(Error::Config(format!("--step {s} is beyond the last state {n} of {}", run.dir.display())));
    }
    let arch = &run.manifest.architecture;
    check_alpha_folds(arch)?;
    let params = run.load_step(s)?;
    let init = if arch.zero_output { Some(run.load_step(0)?) } else { None };
    let source = ExportSource { run: run.dir.display().to_string(), run_id: run.manifest.run_id.clone(), step: s };
    let bytes = torch::export_bytes(arch, &params, init.as_ref(), &source)?;
    Ok(Exported { bytes, step: s, steps: n, module: torch::module_description(arch), zero_output: arch.zero_output, alpha: arch.alpha })
}

/// Refuses a layer stack with α ≠ 1 whose last layer is not linear in its parameters (an
/// activation, a residual block): α cannot be folded into it, and the file would not be the
/// network.
fn check_alpha_folds(arch: &Architecture) -> Result<()> {
    if arch.alpha == 1.0 || !matches!(arch.body, Body::Layers { .. }) {
        return Ok(());
    }
    let stack = arch.stack()?;
    if stack.ends_linear_in_params() {
        return Ok(());
    }
    Err(Error::Config(format!(
        "alpha = {} cannot be folded into the last layer of {}: its output is not linear in that layer's parameters; export needs alpha = 1 or a stack ending in a dense, conv2d or layer_norm layer",
        arch.alpha,
        stack.torch_description()
    )))
}

/// Writes [`export_torch`]'s file to `out` atomically (temporary name, then rename).
pub(crate) fn export_torch_to(run_dir: &Path, step: Option<usize>, out: &Path) -> Result<Exported> {
    let run = Run::open(run_dir)?;
    let e = export_torch(&run, step)?;
    crate::io::write_atomic(out, &e.bytes)?;
    Ok(e)
}

// ---------------------------------------------------------------------------------------------
// Import of a trajectory recorded by a PyTorch training loop
// ---------------------------------------------------------------------------------------------

/// `format` of a recording's `trajectory.json`.
pub(crate) const RECORDING_FORMAT: &str = "pathkernel-torch-trajectory";

/// The model entry of `trajectory.json`: what the `state_dict` names and shapes do not say.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum RecordedModel {
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
    /// Any `nn.Sequential` of the layers a stack has: the children as the recording script
    /// describes them (`modules`: class, `repr` and attributes; see `interop::modules`).
    Layers {
        /// One sample's shape: `[F]`, `[C, H, W]`, or `[T]` token ids with `vocab`.
        input: Vec<usize>,
        /// The children of the `nn.Sequential`, in order.
        modules: Vec<serde_json::Value>,
        /// When rows are token ids: the vocabulary (the first module's, an embedding).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<usize>,
    },
    /// A module that is not an `nn.Sequential` of layers but computes a layer stack (ExPLAIND's
    /// transformer: one module with its own tensor names): the stack in pathkernel's own syntax
    /// (the `layers` of a `[model] kind = "layers"` configuration, as JSON) and the recording's
    /// name of every one of its parameters.
    Stack {
        /// One sample's shape: `[F]`, `[C, H, W]`, or `[T]` token ids with `vocab`.
        input: Vec<usize>,
        /// When rows are token ids: the vocabulary.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<usize>,
        /// The layers, e.g. `[{"embedding": {"vocab": 33, "dim": 64, "scale": "sqrt_dim"}}, …]`.
        layers: Vec<serde_json::Value>,
        /// Our parameter name (`0.weight`, `1.head1_encoder.weight`, …) → the recording's
        /// `state_dict` name (`input_emb.weight`, …): every parameter of the stack exactly once,
        /// each recorded name once.
        names: std::collections::BTreeMap<String, String>,
    },
}

/// `DIR/trajectory.json` of a recording (written by `scripts/record_torch_trajectory.py`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Recording {
    /// Always [`RECORDING_FORMAT`].
    pub format: String,
    /// Format version: 1 (plain `gd`/`sgd` steps) or 2 (the optimizer's class and
    /// hyper-parameters, [`optimizer`]).
    pub version: u32,
    /// The module's structure.
    pub model: RecordedModel,
    /// Version 1: `gd` (full batch) or `sgd` (recorded batches). Version 2: an object with the
    /// class (`SGD`, `Adam`, `AdamW`) and its hyper-parameters.
    pub optimizer: serde_json::Value,
    /// Version 2: the precision the model trained in (`float64`, `float32`; the tensors say it
    /// too, and must agree).
    #[serde(default)]
    pub dtype: Option<String>,
    /// `cross_entropy` (on logits, mean) or `mse` (mean over rows and outputs).
    pub loss: String,
    /// ε_s of every update s = 0 … N−1 (as the optimizer used it: any scheduler), each ≥ 0.
    pub learning_rates: Vec<f64>,
    /// SGD's momentum / Adam's β1 of every update, when a scheduler changed it
    /// (`cycle_momentum`); absent: the optimizer's.
    #[serde(default)]
    pub momenta: Option<Vec<f64>>,
    /// Gradient clipping applied before every update.
    #[serde(default)]
    pub clip: Option<RecordedClip>,
    /// The training rows of each update (version 1: sgd only; version 2: absent for full batch).
    #[serde(default)]
    pub batches: Option<Vec<Vec<usize>>>,
    /// Free text (what trained it).
    #[serde(default)]
    pub description: String,
}

/// Gradient clipping as the recorder wrote it (`trajectory.json`'s `clip`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) enum RecordedClip {
    /// `torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)`: every step's gradient
    /// multiplied by `factors[s] = min(1, max_norm / (‖g_s‖ + 1e-6))` as PyTorch computed it.
    Norm {
        /// `max_norm`.
        max_norm: f64,
        /// `norm_type` (a number ≥ 1, or `"inf"`).
        norm_type: serde_json::Value,
        /// The factor of every step. # Shapes `[N]`.
        factors: Vec<f64>,
    },
    /// `torch.nn.utils.clip_grad_value_(params, clip_value)`: refused (see `parse_recording`).
    Value {
        /// `clip_value`.
        clip_value: f64,
    },
}

/// Options of [`import_torch`].
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Largest accepted difference between a recorded update and the optimizer's update replayed
    /// here, in units of the run's rounding `u·(|w_s,j| + |w_{s+1},j| + 64‖Δ̂_s‖_∞)` per
    /// coordinate (`u` the unit roundoff of the recording's precision; see
    /// `interop::step_check`); `None`: [`TOLERANCE_ULPS`].
    pub tolerance: Option<f64>,
    /// Replace an existing output directory.
    pub force: bool,
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
    /// `gd` or `sgd` (torch.optim.SGD, full batch or recorded batches, any momentum), `adam`
    /// or `adamw`.
    pub optimizer: String,
    /// The optimizer as the manifest records it (e.g. `adamw (lr 0.01, betas 0.9/0.999, …)`).
    pub optimizer_record: String,
    /// `float64` or `float32`.
    pub precision: String,
    /// Largest relative difference `‖Δw_s(recorded) − Δw_s(replayed)‖_∞ / ‖Δw_s(replayed)‖_∞`
    /// (large at steps of a vanishing learning rate, whose difference is the weights' rounding).
    pub max_update_rel_diff: f64,
    /// The step where it occurs.
    pub worst_step: usize,
    /// Largest absolute difference `max_s ‖Δw_s(recorded) − Δw_s(replayed)‖_∞`: the residual's
    /// size in weight space (float32 rounding; rounding of f64 otherwise).
    pub max_update_abs_diff: f64,
    /// Largest difference in units of the run's rounding (`interop::step_check`).
    pub max_update_ulps: f64,
    /// The step where it occurs.
    pub ulps_step: usize,
    /// The tolerance applied, in the same units.
    pub tolerance_ulps: f64,
    /// Loss at w_0 and at w_N.
    pub loss: (f64, f64),
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "imported {} {} steps of {} ({} parameters, {}; {}): loss {:.6} -> {:.6}; recorded updates vs the optimizer replayed here from gradients recomputed in f64: \
             max relative difference {:.3e} (step {}), max absolute {:.3e}, max {:.2} ulps of the weights and update (step {}; tolerance {}) -> {}",
            self.steps,
            self.optimizer,
            self.module,
            self.num_params,
            self.precision,
            self.optimizer_record,
            self.loss.0,
            self.loss.1,
            self.max_update_rel_diff,
            self.worst_step,
            self.max_update_abs_diff,
            self.max_update_ulps,
            self.ulps_step,
            self.tolerance_ulps,
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
pub(crate) fn recording_step_path(dir: &Path, s: usize) -> PathBuf {
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
        RecordedModel::Layers { input, modules: ms, vocab } => return stack_architecture(dir, input, *vocab, ms, output),
        RecordedModel::Stack { input, vocab, layers, .. } => return named_stack_architecture(dir, input, *vocab, layers, output),
    };
    let arch = Architecture { body, activation, bias, zero_last: false, alpha: 1.0, zero_output: false, output };
    arch.validate().map_err(|e| bad(format!("the recorded model is not one pathkernel has: {e}")))?;
    Ok(arch)
}

/// The architecture of a recorded layer stack (`RecordedModel::Layers`): every module read as
/// a layer or refused (named, with the reason), the shapes chained from `input`, and each
/// residual's shortcut the one the stack resolves. Errors name `DIR/trajectory.json`.
fn stack_architecture(dir: &Path, input: &[usize], vocab: Option<usize>, ms: &[serde_json::Value], output: OutputKind) -> Result<Architecture> {
    let bad = |msg: String| Error::format(dir.join("trajectory.json"), msg);
    let input = modules::input_shape(input, vocab).map_err(bad)?;
    let layers = modules::list(ms, "model.modules").map_err(|e| {
        if ms.len() == 1 {
            // One module that is not a layer: it may still compute a stack.
            bad(format!("{e}; a module that computes a layer stack under its own tensor names is recorded as model kind `stack` (the layers and a `names` mapping; python/pathkernel_recorder reads them from the module's `pathkernel_stack()`)"))
        } else {
            bad(e)
        }
    })?;
    let outputs = modules::outputs(input, &layers).map_err(bad)?;
    let arch = Architecture { body: Body::Layers { input, layers, outputs }, activation: Activation::Relu, bias: true, zero_last: false, alpha: 1.0, zero_output: false, output };
    arch.validate().map_err(|e| bad(format!("the recorded model is not one pathkernel has: {e}")))?;
    modules::check_resolved(ms, &arch.stack()?).map_err(bad)?;
    Ok(arch)
}

/// The architecture of a stack written in pathkernel's syntax (`RecordedModel::Stack`): the
/// layers parsed as a configuration's, the shapes chained from `input`. Errors name
/// `DIR/trajectory.json`.
fn named_stack_architecture(dir: &Path, input: &[usize], vocab: Option<usize>, layers: &[serde_json::Value], output: OutputKind) -> Result<Architecture> {
    let bad = |msg: String| Error::format(dir.join("trajectory.json"), msg);
    let input = modules::input_shape(input, vocab).map_err(bad)?;
    if layers.is_empty() {
        return Err(bad("model.layers is empty".into()));
    }
    let layers = layers.iter().enumerate().map(|(i, l)| crate::model::layers::LayerSpec::parse(l, &format!("model.layers[{i}]"))).collect::<std::result::Result<Vec<_>, _>>().map_err(bad)?;
    let outputs = modules::outputs(input, &layers).map_err(|e| bad(e.replace("model.modules", "model.layers")))?;
    let arch = Architecture { body: Body::Layers { input, layers, outputs }, activation: Activation::Relu, bias: true, zero_last: false, alpha: 1.0, zero_output: false, output };
    arch.validate().map_err(|e| bad(format!("the recorded model is not one pathkernel has: {e}")))?;
    Ok(arch)
}

/// The names and shapes under which a recording holds `arch`'s parameters, in our order: PyTorch's
/// names of the module ([`torch::torch_specs`]), or for a `Stack` its `names` mapping, checked to
/// name every parameter of the stack exactly once (no unknown name, no recorded name twice).
fn recorded_specs(jpath: &Path, model: &RecordedModel, arch: &Architecture) -> Result<Vec<crate::model::ParamSpec>> {
    let RecordedModel::Stack { names, .. } = model else { return Ok(torch::torch_specs(arch)) };
    let ours = arch.param_specs();
    let missing: Vec<&str> = ours.iter().filter(|s| !names.contains_key(&s.name)).map(|s| s.name.as_str()).collect();
    let unknown: Vec<&str> = names.keys().filter(|k| !ours.iter().any(|s| &s.name == *k)).map(String::as_str).collect();
    let mut seen = std::collections::BTreeMap::new();
    let twice: Vec<String> = names.iter().filter_map(|(k, v)| seen.insert(v.as_str(), k.as_str()).map(|other| format!("`{v}` (for `{other}` and `{k}`)"))).collect();
    if !(missing.is_empty() && unknown.is_empty() && twice.is_empty()) {
        let mut what = Vec::new();
        if !missing.is_empty() {
            what.push(format!("no recorded name for {}", missing.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
        }
        if !unknown.is_empty() {
            what.push(format!("{} not a parameter of the stack", unknown.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
        }
        if !twice.is_empty() {
            what.push(format!("recorded name used twice: {}", twice.join(", ")));
        }
        return Err(Error::format(
            jpath,
            format!("model.names must map each parameter of the stack ({}) to one recorded tensor: {}", ours.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "), what.join("; ")),
        ));
    }
    Ok(ours.into_iter().map(|s| crate::model::ParamSpec { name: names[&s.name].clone(), shape: s.shape }).collect())
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
    match arch.body {
        Body::Cnn { image, .. } => ds.image_shape = Some(image),
        Body::Layers { input: Shape::Map(c, h, w), .. } => ds.image_shape = Some([c, h, w]),
        Body::Layers { input: Shape::Tokens(_, v), .. } => {
            ds.vocab = Some(v);
            ds.validate().map_err(|e| Error::format(path, e.to_string()))?;
        }
        _ => {}
    }
    Ok(ds)
}

/// Imports a trajectory recorded by a PyTorch training loop (`DIR/trajectory.json`,
/// `DIR/step_00000.safetensors` … one `state_dict` per state, `DIR/data.safetensors`) as a run
/// directory `out` that `kernel`, `gp`, `svm` and `attribute` read like one written by `train`.
///
/// The model is the recording's `model` entry: an MLP, the one-conv CNN, an `nn.Sequential` of
/// layers described module by module, or a layer stack in pathkernel's syntax with the recorded
/// name of each of its parameters (`stack`: a module with its own tensor names, such as
/// ExPLAIND's transformer), the mapping checked to name every parameter once.
///
/// Everything is checked before anything is written: the optimizer (plain `gd`/`sgd` in a
/// version-1 recording; `SGD` with momentum, dampening, Nesterov and weight decay, `Adam` or
/// `AdamW` with every hyper-parameter in version 2; amsgrad, maximize and half precision
/// refused with the reason), the step files contiguous 0 … N with N the number of learning
/// rates and each holding its own step, every state with the names and shapes of the module in
/// one precision (float64, or float32 read as f64), and every recorded update `w_{s+1} − w_s`
/// equal to the optimizer's update replayed here (`OptimizerState`, PyTorch's formulas) from
/// the gradients recomputed in f64 at each recorded state on its batch, to the tolerance
/// (relative, max-norm); the first step beyond it is named.
///
/// The run's manifest records the optimizer as a native run of it would
/// (`RecordedOptimizer::record`), Adam's preconditioners `κ_s D_s` of the replay beside the
/// states, so its kernels are the native ones (exact machines; for a float32 recording the
/// difference between each recorded and replayed update is the kernel's residual term, which
/// belongs to no training point).
///
/// # Shapes
/// Step files: the module's tensors (PyTorch names and shapes); `data.safetensors`: see
/// `read_recorded_data`.
pub fn import_torch(dir: &Path, out: &Path, opts: &ImportOptions) -> Result<ImportSummary> {
    check_import_options(dir, out, opts)?;
    let rec = load_recording(dir)?;
    let tolerance = opts.tolerance.unwrap_or(TOLERANCE_ULPS);
    let replay = replay_updates(dir, &rec, tolerance)?;
    let n = rec.states.len() - 1;
    let loss = (replay.log.loss[0], replay.log.loss[n]);
    let (worst, worst_step, abs, ulps, ulps_step) = (replay.worst, replay.worst_step, replay.worst_abs, replay.worst_ulps, replay.ulps_step);
    let dir_out = write_imported_run(dir, out, opts.force, &rec, replay)?;
    Ok(ImportSummary {
        dir: dir_out,
        steps: n,
        num_params: rec.states[0].numel(),
        module: torch::module_description(&rec.arch),
        optimizer: match rec.optimizer {
            OptimizerRecord::Gd { .. } => "gd",
            OptimizerRecord::Sgd { .. } => "sgd",
            OptimizerRecord::Adam { decoupled_weight_decay: true, .. } => "adamw",
            OptimizerRecord::Adam { .. } => "adam",
            OptimizerRecord::Rmsprop { .. } => "rmsprop",
            OptimizerRecord::Adagrad { .. } => "adagrad",
        }
        .into(),
        optimizer_record: rec.optimizer.to_string(),
        precision: rec.precision.to_string(),
        max_update_rel_diff: worst,
        worst_step,
        max_update_abs_diff: abs,
        max_update_ulps: ulps,
        ulps_step,
        tolerance_ulps: tolerance,
        loss,
    })
}

/// The checks of [`import_torch`]'s arguments: `dir` a directory, `out` free (or empty, or
/// `force`), the tolerance a finite number > 0.
fn check_import_options(dir: &Path, out: &Path, opts: &ImportOptions) -> Result<()> {
    if !dir.is_dir() {
        return Err(Error::trajectory(dir, "not a directory (expected a recording with trajectory.json and step_NNNNN.safetensors files)"));
    }
    if out.exists() && !opts.force {
        let empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !empty {
            return Err(Error::Config(format!("{} already exists; choose another --out or pass --force", out.display())));
        }
    }
    if let Some(t) = opts.tolerance.filter(|t| !(t.is_finite() && *t > 0.0)) {
        return Err(Error::Config(format!("--tolerance {t}: it must be a finite number > 0")));
    }
    Ok(())
}

/// A recording read and checked on its own terms (everything but its updates).
struct LoadedRecording {
    /// `trajectory.json`.
    json: Recording,
    /// The loss `json.loss` names.
    loss: LossKind,
    /// The module, from `json.model` and the shapes of step 0.
    arch: Architecture,
    /// The recorded names (and our shapes) of `arch`'s parameters, in our order.
    specs: Vec<crate::model::ParamSpec>,
    /// `data.safetensors`.
    data: Dataset,
    /// The training rows of every update, sorted; `None` for full batch. # Shapes `N × [B_s]`.
    batches: Option<Vec<Vec<usize>>>,
    /// The optimizer as the manifest records it.
    optimizer: OptimizerRecord,
    /// The precision the states were saved in.
    precision: Precision,
    /// The states w_0 … w_N. # Shapes `[N + 1]`.
    states: Vec<Params>,
    /// SHA-256 of `trajectory.json`, of every step file (0 … N), of `data.safetensors`.
    hashes: Vec<String>,
}

/// Reads every file of the recording in `dir` and checks each against the others (see
/// [`import_torch`]); the updates are checked by [`replay_updates`].
fn load_recording(dir: &Path) -> Result<LoadedRecording> {
    let jpath = dir.join("trajectory.json");
    let jbytes = io::read_file(&jpath)?;
    let (json, loss, recorded) = parse_recording(&jpath, &jbytes)?;
    let n = json.learning_rates.len();
    check_step_files(dir, n)?;
    let output = if loss == LossKind::CrossEntropy { OutputKind::LogSoftmax } else { OutputKind::Identity };
    let arch = recorded_architecture(dir, &json.model, output)?;
    let specs = recorded_specs(&jpath, &json.model, &arch)?;
    let data = read_recorded_data(&dir.join("data.safetensors"), &arch, loss)?;
    let batches = recorded_batches(&jpath, &json, data.n_train())?;
    // Every state, checked against the architecture (names, shapes, dtypes, finite, order).
    let mut states = Vec::with_capacity(n + 1);
    let mut hashes = vec![torch::sha256_hex(&jbytes)];
    let mut precision = None;
    for s in 0..=n {
        let path = recording_step_path(dir, s);
        let st = states::read_state(&path, &arch, &specs, s).map_err(|e| match e {
            Error::Format { path, msg } => Error::trajectory(path, format!("step {s}: {msg}")),
            other => other,
        })?;
        if *precision.get_or_insert(st.precision) != st.precision {
            return Err(Error::trajectory(&path, format!("step {s} is {} while step 0 is {}: one precision per recording", st.precision, precision.unwrap_or(st.precision))));
        }
        hashes.push(st.sha256);
        states.push(st.params);
    }
    let precision = precision.unwrap_or(Precision::Float64);
    if let Some(d) = json.dtype.as_deref().filter(|d| *d != precision.to_string()) {
        let msg = if d.contains("16") { states::HALF_REFUSED.to_string() } else { format!("dtype `{d}` but the step files are {precision}") };
        return Err(Error::format(&jpath, msg));
    }
    hashes.push(torch::sha256_hex(&io::read_file(&dir.join("data.safetensors"))?));
    let per_step = StepFactors {
        momenta: json.momenta.clone(),
        grad_scales: match &json.clip {
            Some(RecordedClip::Norm { factors, .. }) => Some(factors.clone()),
            _ => None,
        },
    };
    let optimizer = recorded.record(json.learning_rates[0], batches.as_deref(), precision == Precision::Float32, per_step);
    Ok(LoadedRecording { json, loss, arch, specs, data, batches, optimizer, precision, states, hashes })
}

/// Parses `trajectory.json` (`bytes`, read from `jpath`) and checks its format, optimizer
/// ([`RecordedOptimizer::parse`]), loss and learning rates (at least one, each finite and > 0).
fn parse_recording(jpath: &Path, bytes: &[u8]) -> Result<(Recording, LossKind, RecordedOptimizer)> {
    let rec: Recording = serde_json::from_slice(bytes).map_err(|e| Error::format(jpath, format!("invalid recording: {e}")))?;
    if rec.format != RECORDING_FORMAT || !matches!(rec.version, 1 | 2) {
        return Err(Error::format(jpath, format!("format {} version {}; expected {RECORDING_FORMAT} version 1 or 2", rec.format, rec.version)));
    }
    let optimizer = RecordedOptimizer::parse(jpath, rec.version, &rec.optimizer)?;
    if let Some(d) = rec.dtype.as_deref() {
        if d.contains("16") {
            return Err(Error::format(jpath, states::HALF_REFUSED));
        }
        if !matches!(d, "float64" | "float32") {
            return Err(Error::format(jpath, format!("dtype `{d}`: expected float64 or float32")));
        }
    }
    let loss = match rec.loss.as_str() {
        "cross_entropy" => LossKind::CrossEntropy,
        "mse" => LossKind::Mse,
        other => return Err(Error::format(jpath, format!("loss `{other}`: expected cross_entropy (on logits) or mse"))),
    };
    if rec.learning_rates.is_empty() {
        return Err(Error::format(jpath, "no learning rates: at least one recorded update is needed"));
    }
    if let Some(s) = rec.learning_rates.iter().position(|e| !(e.is_finite() && *e >= 0.0)) {
        return Err(Error::format(jpath, format!("learning_rates[{s}] = {}; it must be a finite number >= 0", rec.learning_rates[s])));
    }
    let n = rec.learning_rates.len();
    if let Some(m) = &rec.momenta {
        optimizer.check_momenta(jpath, m, n)?;
    }
    match &rec.clip {
        None => {}
        Some(RecordedClip::Value { clip_value }) => {
            return Err(Error::format(
                jpath,
                format!(
                    "gradient clipping by value (clip_grad_value_, clip_value {clip_value}) is not supported: it multiplies each gradient coordinate by its own factor min(1, v/|g_j|) before the optimizer's buffer, \
                     a per-step diagonal the kernel's recursion does not carry (it carries one diagonal, the preconditioner after the buffer), so the machine would not equal the network; clip by norm (clip_grad_norm_) instead"
                ),
            ))
        }
        Some(RecordedClip::Norm { max_norm, norm_type, factors }) => {
            if !(max_norm.is_finite() && *max_norm > 0.0) {
                return Err(Error::format(jpath, format!("clip: max_norm = {max_norm}; it must be a finite number > 0")));
            }
            clip_norm_order(norm_type).map_err(|e| Error::format(jpath, e))?;
            if factors.len() != n {
                return Err(Error::format(jpath, format!("clip: {} factors for {n} updates", factors.len())));
            }
            if let Some(s) = factors.iter().position(|c| !(c.is_finite() && *c > 0.0 && *c <= 1.0)) {
                return Err(Error::format(jpath, format!("clip: factors[{s}] = {}; a clip factor is in (0, 1]", factors[s])));
            }
        }
    }
    Ok((rec, loss, optimizer))
}

/// The order p of `clip.norm_type`: a number ≥ 1 or `"inf"` (∞).
fn clip_norm_order(v: &serde_json::Value) -> std::result::Result<f64, String> {
    match v {
        serde_json::Value::String(t) if t == "inf" => Ok(f64::INFINITY),
        serde_json::Value::Number(x) => x.as_f64().filter(|p| p.is_finite() && *p >= 1.0).ok_or_else(|| format!("clip: norm_type {x}: expected a number >= 1 or \"inf\"")),
        other => Err(format!("clip: norm_type {other}: expected a number >= 1 or \"inf\"")),
    }
}

/// `min(1, max_norm / (‖g‖_p + 1e-6))`: PyTorch's `clip_grad_norm_` factor of a gradient.
fn clip_factor(g: &[f64], max_norm: f64, p: f64) -> f64 {
    let norm = if p.is_infinite() {
        g.iter().fold(0.0f64, |m, x| m.max(x.abs()))
    } else {
        g.iter().map(|x| x.abs().powf(p)).sum::<f64>().powf(1.0 / p)
    };
    (max_norm / (norm + 1e-6)).min(1.0)
}

/// Checks that the step files in `dir` are exactly `step_00000` … step N.
fn check_step_files(dir: &Path, n: usize) -> Result<()> {
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
    Ok(())
}

/// The batches of a recording, each sorted: `None` for full batch, one batch of distinct rows
/// in `0..m` per update otherwise. Version 1 ties them to the optimizer's name (`gd` none,
/// `sgd` required); version 2 reads their absence as full batch.
fn recorded_batches(jpath: &Path, rec: &Recording, m: usize) -> Result<Option<Vec<Vec<usize>>>> {
    let n = rec.learning_rates.len();
    if rec.version == 1 {
        match (rec.optimizer.as_str() == Some("sgd"), &rec.batches) {
            (false, Some(_)) => return Err(Error::format(jpath, "optimizer gd uses the full batch; `batches` is only for sgd")),
            (true, None) => return Err(Error::format(jpath, "optimizer sgd needs `batches`: the training rows of every update")),
            _ => {}
        }
    }
    let Some(b) = &rec.batches else { return Ok(None) };
    if b.len() != n {
        return Err(Error::format(jpath, format!("{} batches for {n} updates", b.len())));
    }
    let mut sorted = Vec::with_capacity(n);
    for (s, batch) in b.iter().enumerate() {
        let mut v = batch.clone();
        v.sort_unstable();
        if v.is_empty() || v.windows(2).any(|w| w[0] == w[1]) || v.last().is_some_and(|&i| i >= m) {
            return Err(Error::format(jpath, format!("batch of step {s} must be distinct training rows in 0..{m}, non-empty")));
        }
        sorted.push(v);
    }
    Ok(Some(sorted))
}

/// What [`replay_updates`] found.
struct Replay {
    /// The training log of w_0 … w_N, as `train` writes it.
    log: crate::train::TrainLog,
    /// Adam's `κ_s D_s` of every step (`[W]` each), as the replay computed them; empty otherwise.
    precond: Vec<Vec<f64>>,
    /// Largest relative difference between a recorded update and the replayed one.
    worst: f64,
    /// The step where it occurs.
    worst_step: usize,
    /// Largest absolute difference between a recorded update and the replayed one.
    worst_abs: f64,
    /// Largest difference in units of the run's rounding.
    worst_ulps: f64,
    /// The step where it occurs.
    ulps_step: usize,
}

/// Replays the recording's optimizer from the gradients recomputed (f64, the model's own
/// gradient code: any architecture) at every recorded state on its batch (clipped by the
/// recorded factor, which must be PyTorch's factor of that gradient) and checks each replayed
/// update against the recorded `w_{s+1} − w_s` ([`StepDiff`], in units of the run's rounding);
/// logs loss, accuracies and norms of every state.
///
/// Errors: the first update beyond `tolerance` ulps, named by its step, with its absolute,
/// relative and ulps figures and the coordinate; a clip factor that is not the gradient's.
fn replay_updates(dir: &Path, rec: &LoadedRecording, tolerance: f64) -> Result<Replay> {
    let LoadedRecording { json, loss, arch, data, batches, states, .. } = rec;
    let n = states.len() - 1;
    let (labels, values) = crate::train::train_targets(data);
    let dev = dfdx::tensor::Cpu::default();
    let full = Objective::new(dev.clone(), arch, &data.x_train, labels, values, *loss, None)?;
    let k = arch.outputs();
    let rule = UpdateRule::of(&rec.optimizer);
    let mut opt = OptimizerState::new(rule, states[0].numel());
    let mut log = crate::train::TrainLog::default();
    let mut precond = Vec::new();
    let u = rec.precision.unit_roundoff();
    let (mut worst, mut worst_step, mut worst_abs, mut worst_ulps, mut ulps_step) = (0.0f64, 0, 0.0f64, 0.0f64, 0);
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
        let grad = match batches {
            None => lg.grad,
            Some(b) => crate::train::batch_objective(dev.clone(), arch, data, &b[s], *loss, None)?.evaluate(&states[s]).grad,
        };
        let (w, g) = (states[s].flat(), grad.flat());
        if let Some(RecordedClip::Norm { max_norm, norm_type, factors }) = &json.clip {
            check_clip_factor(dir, s, &g, *max_norm, clip_norm_order(norm_type).unwrap_or(2.0), factors[s], u)?;
        }
        let before = opt.clone();
        let replayed = opt.step(json.learning_rates[s], &w, &g);
        let slack = opt.last_scale().is_some().then(|| step_check::gradient_rounding_slack(&before, json.learning_rates[s], &w, &g, &replayed, u));
        if let Some(scale) = opt.last_scale() {
            precond.push(scale.to_vec());
        }
        let d = StepDiff::of(&w, &states[s + 1].flat(), &replayed, u, slack.as_deref());
        if !d.accepted(tolerance) {
            return Err(Error::trajectory(
                recording_step_path(dir, s + 1),
                format!(
                    "the update of step {s} (w_{} - w_{s}) differs from the {} update replayed from the gradient recomputed at w_{s} on its batch by {:.3e} absolute at {} \
                     ({:.3e} relative to the update's max-norm {:.3e}; {:.1} ulps of the weights and update in {}, tolerance {tolerance}): not a step of this optimizer, model, loss and data",
                    s + 1,
                    rec.optimizer,
                    d.abs,
                    step_check::coordinate(&rec.specs, d.at),
                    d.rel,
                    d.update,
                    d.ulps,
                    rec.precision
                ),
            ));
        }
        if d.rel > worst {
            (worst, worst_step) = (d.rel, s);
        }
        if d.ulps > worst_ulps {
            (worst_ulps, ulps_step) = (d.ulps, s);
        }
        worst_abs = worst_abs.max(d.abs);
    }
    Ok(Replay { log, precond, worst, worst_step, worst_abs, worst_ulps, ulps_step })
}

/// Checks a recorded clip factor against [`clip_factor`] of the gradient recomputed here: equal to
/// `√u` relative (half the digits of the precision: PyTorch computed the norm from its own,
/// rounded, gradient).
fn check_clip_factor(dir: &Path, s: usize, g: &[f64], max_norm: f64, p: f64, recorded: f64, u: f64) -> Result<()> {
    let ours = clip_factor(g, max_norm, p);
    let rel = (recorded - ours).abs() / ours;
    if rel <= u.sqrt() {
        return Ok(());
    }
    Err(Error::format(
        dir.join("trajectory.json"),
        format!(
            "clip: factors[{s}] = {recorded:e} is not clip_grad_norm_'s factor min(1, {max_norm} / (|g|_{p} + 1e-6)) = {ours:e} of the gradient recomputed at w_{s} ({rel:.3e} relative, tolerance {:.3e})",
            u.sqrt()
        ),
    ))
}

/// Writes the run exactly as `train` does (Adam's preconditioners included), staged in a
/// sibling of `out` and renamed; returns the directory written.
fn write_imported_run(dir: &Path, out: &Path, force: bool, rec: &LoadedRecording, replay: Replay) -> Result<PathBuf> {
    let run_id = format!("{:016x}", crate::train::fnv1a(rec.hashes.join(" ").as_bytes()));
    let staged = StagedDir::new(out, force)?;
    let writer = Writer::create(staged.path(), imported_manifest(dir, rec, run_id.clone()), &rec.data)?;
    for (s, p) in rec.states.iter().enumerate() {
        writer.write_step(s, p)?;
    }
    for (s, scale) in replay.precond.iter().enumerate() {
        writer.write_preconditioner(s, scale)?;
    }
    if let Some(b) = &rec.batches {
        trajectory::write_batches(staged.path(), b, &run_id)?;
    }
    replay.log.table().write_parquet(&staged.path().join("train_log.parquet"))?;
    Run::open(staged.path())?.load_preconditioners()?;
    staged.commit()
}

/// The manifest of an imported run: the recording's optimizer, learning rates and data, its
/// files' hashes, precision and optimizer entry under `config.import`, step 0 as the init.
fn imported_manifest(dir: &Path, rec: &LoadedRecording, run_id: String) -> Manifest {
    let LoadedRecording { json, loss, arch, data, states, hashes, .. } = rec;
    let import = serde_json::json!({
        "from": "torch",
        "dir": dir.display().to_string(),
        "description": json.description,
        "optimizer": json.optimizer,
        "precision": rec.precision,
        "sha256": hashes,
    });
    let mut import = import;
    if let RecordedModel::Stack { names, .. } = &json.model {
        import["names"] = serde_json::json!(names);
    }
    Manifest {
        format: trajectory::FORMAT.into(),
        version: trajectory::VERSION,
        run_id,
        architecture: arch.clone(),
        loss: *loss,
        optimizer: rec.optimizer.clone(),
        learning_rates: json.learning_rates.clone(),
        seed: 0,
        steps: states.len() - 1,
        params: arch.param_specs(),
        num_params: states[0].numel(),
        dataset: DatasetInfo {
            name: data.name.clone(),
            description: data.description.clone(),
            dim: data.dim,
            image_shape: data.image_shape,
            vocab: data.vocab,
            num_outputs: arch.outputs(),
            n_train: data.n_train(),
            n_test: data.n_test(),
            task: if data.is_classification() { "classification".into() } else { "regression".into() },
        },
        config: serde_json::json!({ "import": import }),
        created_by: crate::train::created_by(),
        init: Some(InitRecord { path: recording_step_path(dir, 0).display().to_string(), sha256: hashes[1].clone(), format: torch::FORMAT.into() }),
    }
}
