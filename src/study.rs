//! Scripted studies: one TOML file run end to end (data → training → kernels) into `reports/NAME/`.
//!
//! ```toml
//! name = "paper-toy"
//! description = "…"
//! [data]   # as for `pathkernel train`
//! [model]
//! [train]
//! [[kernel]]            # any number of kernel computations on the trained run
//! kind = "epk"          # ntk | dpk | epk | chen | kprime
//! quadrature = "auto:1e-12"
//! points = "test"       # test | train | grid:N
//! side = "test"         # test | train
//! ```
//!
//! Large artifacts (the trajectory, the Grams) live in a cache directory (`runs/NAME/` by
//! default) and are reused when their inputs are unchanged (the run by its configuration hash,
//! each kernel by the hash of the run id and its own settings); the report directory receives
//! the small tables, the JSON summaries and `summary.md`, and is replaced only when complete.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::data::DataConfig;
use crate::error::{Error, Result};
use crate::io::{self, StagedDir, Table};
use crate::kernel::{self, output::Exactness, KernelKind, KernelRequest, PointsSpec, Rule, Side};
use crate::io::Column;
use crate::model::ModelConfig;
use crate::train::{fnv1a, train_to_dir, RunConfig, TrainConfig, TrainOptions};
use crate::trajectory::Run;

/// Bumped whenever the kernel output files change, so cached kernels are recomputed.
const KERNEL_OUTPUT_VERSION: u32 = 2;

fn default_quadrature() -> String {
    "auto:1e-12".into()
}
fn default_test() -> String {
    "test".into()
}

/// One `[[kernel]]` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// ntk, dpk, epk, chen or kprime.
    pub kind: String,
    /// Quadrature rule (default auto:1e-12).
    #[serde(default = "default_quadrature")]
    pub quadrature: String,
    /// Row points: test, train or grid:N (default test).
    #[serde(default = "default_test")]
    pub points: String,
    /// Side of the row points (default test).
    #[serde(default = "default_test")]
    pub side: String,
    /// NTK: the state S.
    #[serde(default)]
    pub step: Option<usize>,
    /// Label used for the output folder (default `kind-points`).
    #[serde(default)]
    pub label: Option<String>,
    /// Which blocks of the Gram to compute and keep: full (default), diag or trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<String>,
}

impl KernelSpec {
    /// Parses and checks the entry.
    pub fn request(&self) -> Result<(KernelRequest, PointsSpec)> {
        let kind: KernelKind = self.kind.parse()?;
        let rule: Rule = self.quadrature.parse()?;
        let points: PointsSpec = self.points.parse()?;
        let side = match self.side.as_str() {
            "test" => Side::Test,
            "train" => Side::Train,
            other => return Err(Error::Config(format!("kernel.side = `{other}`: expected test or train"))),
        };
        if self.step.is_some() && kind != KernelKind::Ntk {
            return Err(Error::Config("kernel.step only applies to kind = \"ntk\"".into()));
        }
        Ok((KernelRequest { kind, rule, side, ntk_step: self.step, per_step: false, steps: None }, points))
    }
    /// The layout of the Gram (`blocks`, default full).
    pub fn layout(&self) -> Result<kernel::Layout> {
        self.blocks.as_deref().map_or(Ok(kernel::Layout::Full), str::parse)
    }
    /// Output folder name.
    pub fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| format!("{}-{}", self.kind, self.points.replace(':', "")))
    }
}

fn default_true() -> bool {
    true
}

/// The optional `[analysis]` section: what to do with the kernels beyond the kernel machines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalysisSpec {
    /// GP logit regression + Monte-Carlo softmax at every non-training kernel's points
    /// (hyper-parameters fitted by marginal likelihood).
    #[serde(default)]
    pub gp: bool,
    /// One-vs-rest SVM refit of a_i, evaluated at every non-training kernel's points.
    #[serde(default)]
    pub svm: bool,
    /// Stationarity score and far field of the train×train EPK.
    #[serde(default)]
    pub stationarity: bool,
    /// Test points to attribute (indices into the first `epk` kernel on test points).
    #[serde(default)]
    pub attribution_points: Vec<usize>,
    /// Points of the linear interpolation `w_0 → w_N` (the paper's Fig. 8); 0 = off.
    #[serde(default)]
    pub interpolation: usize,
    /// Gradient-similarity matrix (the Domingos notebook): the train×train EPK, summed over
    /// classes, between the first N training points; 0 = off.
    #[serde(default)]
    pub similarity: usize,
    /// Write PNG charts.
    #[serde(default = "default_true")]
    pub charts: bool,
}

impl Default for AnalysisSpec {
    fn default() -> Self {
        AnalysisSpec { gp: false, svm: false, stationarity: false, attribution_points: Vec::new(), interpolation: 0, similarity: 0, charts: true }
    }
}

/// A study file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyConfig {
    /// Study name (the default report folder).
    pub name: String,
    /// What the study shows.
    #[serde(default)]
    pub description: String,
    /// `[data]`
    #[serde(default)]
    pub data: DataConfig,
    /// `[model]`
    #[serde(default)]
    pub model: ModelConfig,
    /// `[train]`
    pub train: TrainConfig,
    /// `[[kernel]]` entries.
    #[serde(default, rename = "kernel")]
    pub kernels: Vec<KernelSpec>,
    /// `[analysis]`
    #[serde(default)]
    pub analysis: AnalysisSpec,
    /// `[sweep]`: the same training for several MLP widths (the NTK notebook's lazy-training study).
    #[serde(default)]
    pub sweep: Option<SweepSpec>,
    /// Learning rate and step count chosen on the validation split (`[selection]`).
    #[serde(default)]
    pub selection: Option<SelectionSpec>,
    /// Put run-dependent figures (kernel seconds, the study's wall time and peak memory) into
    /// `summary.md`. Off by default: they go to `timings.json` only (not tracked by git), so
    /// that rerunning a study leaves a committed report unchanged.
    #[serde(default)]
    pub timings_in_summary: bool,
    /// `[uncertainty]`: the uncertainty benchmark ([`crate::uncertainty::study`]); a study with
    /// this section is run by that runner (no `[[kernel]]`, `[analysis]` or `[sweep]`).
    #[serde(default)]
    pub uncertainty: Option<crate::uncertainty::study::UqStudySpec>,
}

/// The optional `[sweep]` section: one extra run per entry of `hidden` (replacing
/// `model.hidden`), reported as relative weight change, loss and NTK change against the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// Hidden widths of each run, e.g. `[[10], [100], [1000]]`.
    pub hidden: Vec<Vec<usize>>,
}

impl StudyConfig {
    /// Parses and validates a study file's text.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let cfg: StudyConfig = toml::from_str(text)
            .map_err(|e| Error::format(origin, e.message().replace('\n', " ").trim().to_string() + &crate::train::span_hint(text, e.span())))?;
        if cfg.name.is_empty() || cfg.name.contains(['/', '\\']) || cfg.name.starts_with('.') {
            return Err(Error::Config(format!("study name `{}` must be a plain, non-empty folder name", cfg.name)));
        }
        cfg.run_config().validate()?;
        if let Some(sw) = &cfg.sweep {
            if sw.hidden.is_empty() {
                return Err(Error::Config("sweep.hidden is empty".into()));
            }
            if !matches!(cfg.model, ModelConfig::Mlp { .. }) {
                return Err(Error::Config("[sweep] varies the widths of an MLP; model.kind must be \"mlp\"".into()));
            }
            for h in &sw.hidden {
                cfg.sweep_config(h).validate()?;
            }
        }
        if let Some(u) = &cfg.uncertainty {
            if !cfg.kernels.is_empty() || cfg.sweep.is_some() || cfg.selection.is_some() || cfg.analysis != AnalysisSpec::default() {
                return Err(Error::Config("a study with [uncertainty] runs the uncertainty benchmark only (with its own lr/steps selection); leave out [[kernel]], [analysis], [sweep] and [selection]".into()));
            }
            u.validate(&cfg.run_config())?;
        }
        let mut labels = std::collections::HashSet::new();
        for k in &cfg.kernels {
            k.request()?;
            k.layout()?;
            if !labels.insert(k.label()) {
                return Err(Error::Config(format!("two [[kernel]] entries share the label `{}`; set `label`", k.label())));
            }
        }
        Ok(cfg)
    }
    /// The training part with the MLP's hidden widths replaced (for `[sweep]`).
    pub fn sweep_config(&self, hidden: &[usize]) -> RunConfig {
        let mut rc = self.run_config();
        if let ModelConfig::Mlp { hidden: h, .. } = &mut rc.model {
            *h = hidden.to_vec();
        }
        rc
    }

    /// The training part.
    pub fn run_config(&self) -> RunConfig {
        RunConfig { data: self.data.clone(), model: self.model.clone(), train: self.train.clone() }
    }
}

/// `[selection]`: train every `lr × steps` candidate and keep the one with the best accuracy on
/// the dataset's validation split (ties: fewer steps, then the smaller rate); the study's
/// `[train]` lr and steps are replaced by the choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionSpec {
    /// Candidate learning rates.
    pub lr: Vec<f64>,
    /// Candidate step counts.
    pub steps: Vec<usize>,
}

/// One candidate of a `[selection]`, with its validation accuracy.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Learning rate.
    pub lr: f64,
    /// Steps.
    pub steps: usize,
    /// Accuracy on the validation split.
    pub validation_accuracy: f64,
    /// Accuracy on the test set (reported, not used).
    pub test_accuracy: f64,
}

/// Trains the candidates of `sel` (each cached under `cache/select/`) and returns them with the
/// index of the chosen one.
fn select(cfg: &StudyConfig, sel: &SelectionSpec, cache: &Path, opts: &StudyOptions) -> Result<(Vec<Candidate>, usize, PathBuf, bool)> {
    if sel.lr.is_empty() || sel.steps.is_empty() || sel.lr.iter().any(|v| !(v.is_finite() && *v > 0.0)) || sel.steps.contains(&0) {
        return Err(Error::Config("[selection] needs non-empty lists of positive lr and steps".into()));
    }
    let data = cfg.data.load(&opts.base_dir)?;
    let val = data.validation.as_ref().ok_or_else(|| Error::Config("[selection] chooses on the validation split: set data.val_per_class".into()))?;
    let crate::data::Targets::Labels(yv) = &val.y else {
        return Err(Error::Config("[selection] needs a classification dataset".into()));
    };
    let accuracy = |run: &Run, x: &[f64], y: &[usize]| -> Result<f64> {
        let states = run.load_all()?;
        let arch = &run.manifest.architecture;
        let f = arch.forward(&states[run.manifest.steps], Some(&states[0]), x)?;
        let k = arch.outputs();
        let hits = f.chunks_exact(k).zip(y).filter(|(row, &c)| crate::uncertainty::metrics::argmax(row) == c).count();
        Ok(hits as f64 / y.len().max(1) as f64)
    };
    let crate::data::Targets::Labels(yt) = &data.y_test else {
        return Err(Error::Config("[selection] needs a classification dataset".into()));
    };
    let mut out = Vec::new();
    let mut dirs = Vec::new();
    let mut all_reused = true;
    for &steps in &sel.steps {
        for &lr in &sel.lr {
            let mut rc = cfg.run_config();
            rc.train.lr = lr;
            rc.train.steps = steps;
            let dir = cache.join("select").join(format!("lr{lr}-steps{steps}")).join("run");
            let reuse = matches!(Run::open(&dir), Ok(r) if r.manifest.run_id == rc.run_id() && r.manifest.config == serde_json::to_value(&rc).expect("serialisable") && r.manifest.created_by == crate::train::created_by());
            if !reuse {
                all_reused = false;
                train_to_dir(&rc, &dir, &TrainOptions { progress: opts.progress, force: true, base_dir: opts.base_dir.clone(), memory_budget: None })?;
            }
            let run = Run::open(&dir)?;
            out.push(Candidate { lr, steps, validation_accuracy: accuracy(&run, &val.x, yv)?, test_accuracy: accuracy(&run, &data.x_test, yt)? });
            dirs.push(dir);
        }
    }
    // Best validation accuracy; ties to fewer steps, then the smaller rate (the order above).
    let best = (0..out.len()).fold(0, |b, i| if out[i].validation_accuracy > out[b].validation_accuracy { i } else { b });
    Ok((out, best, dirs[best].clone(), all_reused))
}

/// Where a study reads and writes.
#[derive(Clone, Debug)]
pub struct StudyOptions {
    /// Report directory (default `reports/NAME`).
    pub out: Option<PathBuf>,
    /// Cache directory for trajectories and Grams (default `runs/NAME`).
    pub cache: Option<PathBuf>,
    /// Directory relative data paths are resolved against.
    pub base_dir: PathBuf,
    /// Progress bars on a terminal.
    pub progress: bool,
    /// The command line to record in the summary.
    pub command: String,
}

/// What a study run reports back.
#[derive(Clone, Debug, Serialize)]
pub struct StudySummary {
    /// Report directory.
    pub out: PathBuf,
    /// Whether the trajectory was reused from the cache.
    pub reused_run: bool,
    /// Per kernel: label, whether reused, exactness.
    pub kernels: Vec<(String, bool, Exactness)>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Runs a study file end to end.
pub fn run(path: &Path, opts: &StudyOptions) -> Result<StudySummary> {
    let start = Instant::now();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let cfg = StudyConfig::from_toml(&text, path)?;
    let out = opts.out.clone().unwrap_or_else(|| PathBuf::from("reports").join(&cfg.name));
    let cache = opts.cache.clone().unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name));
    if let Some(spec) = &cfg.uncertainty {
        let input = crate::uncertainty::study::UqStudyInput {
            name: cfg.name.clone(),
            description: cfg.description.clone(),
            study_file: path.display().to_string(),
            text: text.clone(),
            run_config: cfg.run_config(),
            spec: spec.clone(),
            out,
            cache,
            base_dir: opts.base_dir.clone(),
            progress: opts.progress,
        };
        let o = crate::uncertainty::study::run(&input)?;
        return Ok(StudySummary { out: o.out, reused_run: o.stages.iter().all(|(_, reused)| *reused), kernels: Vec::new(), seconds: o.seconds });
    }
    io::create_dir_all(&cache)?;
    let staged = StagedDir::new(&out, true)?;

    // Training (or the validation-chosen candidate), reused when the configuration is unchanged.
    let mut selection_notes = Vec::new();
    let (run_dir, reused_run) = if let Some(sel) = &cfg.selection {
        let (cands, best, dir, reused) = select(&cfg, sel, &cache, opts)?;
        io::write_json(&staged.path().join("selection.json"), &cands)?;
        selection_notes.push(format!(
            "- Learning rate and steps chosen on the validation split (`[selection]`, `selection.json`): {}; chosen lr {} with {} steps.",
            cands.iter().map(|c| format!("lr {} × {} steps: validation {:.2} %", c.lr, c.steps, 100.0 * c.validation_accuracy)).collect::<Vec<_>>().join(", "),
            cands[best].lr,
            cands[best].steps
        ));
        (dir, reused)
    } else {
        let rc = cfg.run_config();
        let run_dir = cache.join("run");
        let reused_run = matches!(Run::open(&run_dir), Ok(r) if r.manifest.run_id == rc.run_id() && r.manifest.config == serde_json::to_value(&rc).expect("serialisable") && r.manifest.created_by == crate::train::created_by());
        if !reused_run {
            train_to_dir(&rc, &run_dir, &TrainOptions { progress: opts.progress, force: true, base_dir: opts.base_dir.clone(), memory_budget: None })?;
        }
        (run_dir, reused_run)
    };
    let run = Run::open(&run_dir)?;
    std::fs::copy(run_dir.join("train_log.parquet"), staged.path().join("train_log.parquet")).map_err(|e| Error::io(staged.path(), e))?;
    io::write_json(&staged.path().join("manifest.json"), &run.manifest)?;
    let states = run.load_all()?;

    let mut kernels = Vec::new();
    let mut kernel_dirs = Vec::new();
    for spec in &cfg.kernels {
        let (reused, ex, kdir) = cached_kernel(&run, &states, spec, &cache, opts.progress)?;
        let label = spec.label();
        let dst = staged.path().join("kernels").join(&label);
        io::create_dir_all(&dst)?;
        for f in ["predictions.parquet", "steps.parquet"] {
            std::fs::copy(kdir.join(f), dst.join(f)).map_err(|e| Error::io(kdir.join(f), e))?;
        }
        // The report's copy keeps the seconds only when the study shows timings.
        let mut exv = serde_json::to_value(&ex).expect("serialisable");
        if !cfg.timings_in_summary {
            exv.as_object_mut().expect("an object").remove("seconds");
        }
        io::write_json(&dst.join("exactness.json"), &exv)?;
        kernels.push((label.clone(), reused, ex));
        kernel_dirs.push((spec.clone(), label, kdir));
    }
    let mut notes = selection_notes;
    notes.extend(analyses(&cfg, &run, &states, &kernel_dirs, &cache, staged.path(), opts.progress)?);
    if let Some(sw) = &cfg.sweep {
        notes.extend(sweep(&cfg, sw, &cache, staged.path(), opts)?);
    }
    // Run-dependent figures: always in timings.json (git-ignored), in summary.md on request.
    let peak_mib = peak_rss_bytes().map(|b| b as f64 / (1 << 20) as f64);
    let wall = start.elapsed().as_secs_f64();
    let timings = serde_json::json!({
        "study_seconds_until_report": wall,
        "peak_rss_mib": peak_mib,
        "reused_run": reused_run,
        "kernels": kernels.iter().map(|(l, reused, e)| serde_json::json!({"label": l, "seconds": e.seconds, "reused": reused})).collect::<Vec<_>>(),
    });
    io::write_json(&staged.path().join("timings.json"), &timings)?;
    if cfg.timings_in_summary {
        notes.push(format!(
            "- Cost of this run: {wall:.0} s wall for the whole study (training{} and kernels{}), peak resident memory {} on this machine ({} cores).",
            if reused_run { " reused from the cache" } else { "" },
            if kernels.iter().any(|k| k.1) { ", some reused from the cache" } else { "" },
            peak_mib.map_or("unknown".to_string(), |m| format!("{m:.0} MiB")),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ));
    }
    let summary_md = summary_markdown(&cfg, &text, &run, &kernels, &notes, opts)?;
    io::write_atomic(&staged.path().join("summary.md"), summary_md.as_bytes())?;
    io::write_atomic(&staged.path().join("study.toml"), text.as_bytes())?;
    let out = staged.commit()?;
    Ok(StudySummary { out, reused_run, kernels, seconds: start.elapsed().as_secs_f64() })
}

/// Peak resident set size of this process (`VmHWM` of `/proc/self/status`), when available.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Computes a kernel into the cache (or reuses it when its inputs are unchanged).
fn cached_kernel(run: &Run, states: &[crate::model::Params], spec: &KernelSpec, cache: &Path, progress: bool) -> Result<(bool, Exactness, PathBuf)> {
    let (req, points) = spec.request()?;
    let layout = spec.layout()?;
    let label = spec.label();
    let key = format!(
        "{:016x}",
        fnv1a(format!("{}|{}|{}|{KERNEL_OUTPUT_VERSION}", run.manifest.run_id, serde_json::to_string(spec).expect("serialisable"), run.manifest.created_by).as_bytes())
    );
    let kdir = cache.join("kernels").join(&label);
    let reused = std::fs::read_to_string(kdir.join("inputs.key")).map(|s| s.trim() == key).unwrap_or(false) && kdir.join("exactness.json").exists();
    if !reused {
        let pts = points.resolve(&run.dataset)?;
        let kstage = StagedDir::new(&kdir, true)?;
        let bar = crate::progress::Progress::new(progress, 1, &format!("kernel {label:<16} {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]"));
        let o = kernel::compute_in(run, states, &pts, &req, &kernel::Options::layout(layout), &|done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })?;
        bar.finish_and_clear();
        kernel::output::write(kstage.path(), &o, &pts, &run.manifest.run_id)?;
        io::write_atomic(&kstage.path().join("inputs.key"), key.as_bytes())?;
        kstage.commit()?;
    }
    Ok((reused, read_exactness(&kdir.join("exactness.json"))?, kdir))
}

fn read_exactness(path: &Path) -> Result<Exactness> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(path, format!("invalid exactness.json: {e}")))
}

fn summary_markdown(cfg: &StudyConfig, text: &str, run: &Run, kernels: &[(String, bool, Exactness)], notes: &[String], opts: &StudyOptions) -> Result<String> {
    use std::fmt::Write;
    let log = Table::read_parquet(&run.dir.join("train_log.parquet"))?;
    let col = |name: &str| log.f64(name).map(|v| v.to_vec()).unwrap_or_default();
    let (loss, acc, tacc) = (col("loss"), col("accuracy"), col("test_accuracy"));
    let last = |v: &[f64]| v.last().copied().unwrap_or(f64::NAN);
    let mut s = String::new();
    let _ = writeln!(s, "# Study `{}`\n", cfg.name);
    if !cfg.description.is_empty() {
        let _ = writeln!(s, "{}\n", cfg.description.trim());
    }
    let _ = writeln!(s, "Produced by `{}` (pathkernel {}).\n", opts.command, env!("CARGO_PKG_VERSION"));
    let m = &run.manifest;
    let _ = writeln!(s, "## Training\n");
    let _ = writeln!(s, "- data: {}", m.dataset.description);
    let _ = writeln!(s, "- network: {:?}, {} parameters, activation {:?}, output {:?}", m.architecture.body, m.num_params, m.architecture.activation, m.architecture.output);
    let _ = writeln!(s, "- optimizer: {}, {} steps, loss {:?}", m.optimizer, m.steps, m.loss);
    let _ = writeln!(s, "- loss {:.6} → {:.6}", loss.first().copied().unwrap_or(f64::NAN), last(&loss));
    if !acc.is_empty() && acc.iter().any(|v| v.is_finite()) {
        let _ = writeln!(s, "- final accuracy: train {:.2} %, held-out test {:.2} %", 100.0 * last(&acc), 100.0 * last(&tacc));
    }
    let _ = writeln!(s, "- run id `{}` (trajectory cached under `{}`)\n", m.run_id, run.dir.display());
    if !kernels.is_empty() {
        let _ = writeln!(s, "## Kernel machines\n");
        let _ = writeln!(s, "max/mean |err| = |kernel machine − network| over all points and classes; evaluations = gradient evaluations per point and step (mean, max).\n");
        let timed = cfg.timings_in_summary;
        let _ = writeln!(s, "| kernel | side | quadrature | P × M × K | steps | max abs err | mean abs err | single machine max err | evaluations |{}", if timed { " seconds |" } else { "" });
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|{}", if timed { "---|" } else { "" });
        for (label, _, e) in kernels {
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} × {} × {} | {} | {:.3e} | {:.3e} | {} | {:.2} / {} |{}",
                e.side,
                e.quadrature,
                e.shape[0],
                e.shape[1],
                e.shape[2],
                e.steps,
                e.max_abs_error,
                e.mean_abs_error,
                e.single_machine_max_abs_error.map_or("—".to_string(), |v| format!("{v:.3e}")),
                e.evaluations_per_step.mean,
                e.evaluations_per_step.max,
                if timed { format!(" {:.2} |", e.seconds) } else { String::new() }
            );
        }
        let relu_cnn = matches!(m.architecture.body, crate::model::Body::Cnn { .. }) && m.architecture.activation == crate::model::Activation::Relu;
        for (label, _, e) in kernels.iter().filter(|(_, _, e)| relu_cnn && e.quadrature.starts_with("auto") && e.form == "gradient") {
            let _ = writeln!(
                s,
                "\n{label}: on a ReLU CNN the auto rule integrates the rows exactly between the kinks (`kernel::convpieces`); its evaluations are the two backward passes per point and step that form the logits' affine gradient ∇z(t) = E₀ + tE₁ (updated at each kink by the units that switch), and its {:.2} smooth pieces per point and step (kinks + 1) cost forward work only (their ∫ softmax is a scalar quadrature).",
                e.evaluations_per_step.mean_forward_mode
            );
        }
        if kernels.iter().any(|(_, _, e)| e.form != "gradient") {
            let _ = writeln!(s, "\nThis run's optimizer changes the kernel's form (see `pathkernel::optim`): `K_r(x, x') = <F_r(x), ∇f(x'; w_r)>`. Non-data terms are included in the machine and belong to no training point.\n");
            let _ = writeln!(s, "| kernel | form | symmetric kernel | optimizer replay residual (rel.) | max weight-decay term | max rounding term |");
            let _ = writeln!(s, "|---|---|---|---|---|---|");
            let opt = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.2e}"));
            for (label, _, e) in kernels {
                let _ = writeln!(
                    s,
                    "| {label} | {} | {} | {} | {} | {} |",
                    e.form,
                    if e.symmetric_kernel { "yes" } else { "no" },
                    opt(e.decomposition_residual),
                    opt(e.reg_term_max_abs),
                    opt(e.rounding_term_max_abs)
                );
            }
        }
        let _ = writeln!(s, "\nPer-step validation (predicted vs actual change of the output over each step): `kernels/*/steps.parquet`; predictions: `kernels/*/predictions.parquet`.\n");
    }
    if !notes.is_empty() {
        let _ = writeln!(s, "## Analyses\n");
        for n in notes {
            let _ = writeln!(s, "{n}");
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Configuration\n\n```toml\n{}\n```", text.trim());
    Ok(s)
}

/// Grid geometry of 2-D row points laid out by [`crate::data::grid_2d`] (x fastest).
fn grid_of(points: &[f64], values: Vec<f64>) -> Option<crate::plot::Grid2d> {
    let p = points.len() / 2;
    let n = (p as f64).sqrt().round() as usize;
    if n < 2 || n * n != p || values.len() != p {
        return None;
    }
    let xs: Vec<f64> = points.chunks(2).map(|r| r[0]).collect();
    let ys: Vec<f64> = points.chunks(2).map(|r| r[1]).collect();
    let (x0, x1) = (xs.iter().cloned().fold(f64::INFINITY, f64::min), xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
    let (y0, y1) = (ys.iter().cloned().fold(f64::INFINITY, f64::min), ys.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
    Some(crate::plot::Grid2d { nx: n, ny: n, x0, x1, y0, y1, values })
}

fn train_overlay(run: &Run) -> Option<crate::plot::Overlay> {
    if run.dataset.dim != 2 {
        return None;
    }
    let crate::data::Targets::Labels(y) = &run.dataset.y_train else { return None };
    let x = &run.dataset.x_train;
    Some(crate::plot::Overlay { x: x.chunks(2).map(|r| r[0]).collect(), y: x.chunks(2).map(|r| r[1]).collect(), class: y.clone(), value: None })
}

/// The `[analysis]` section and the charts; returns markdown lines for the summary.
fn analyses(cfg: &StudyConfig, run: &Run, states: &[crate::model::Params], kernels: &[(KernelSpec, String, PathBuf)], cache: &Path, out: &Path, progress: bool) -> Result<Vec<String>> {
    use crate::plot::{self, Scale, Series};
    use crate::workflow::{self, GpTargets, KernelFiles};
    let a = &cfg.analysis;
    let mut notes = Vec::new();
    let charts = out.join("charts");
    if a.charts {
        io::create_dir_all(&charts)?;
    }
    let log = Table::read_parquet(&run.dir.join("train_log.parquet"))?;
    let steps: Vec<f64> = log.i64("step").unwrap_or(&[]).iter().map(|&v| v as f64).collect();
    if a.charts {
        let col = |n: &str| log.f64(n).map(|v| v.to_vec()).unwrap_or_default();
        plot::line_chart(&charts.join("training_loss.png"), "Training loss", "step", "mean loss", &[Series::new("training loss", steps.clone(), col("loss"))], Scale::Linear, Scale::Log)?;
        if run.dataset.is_classification() {
            plot::line_chart(
                &charts.join("training_accuracy.png"),
                "Accuracy during training",
                "step",
                "accuracy (fraction)",
                &[Series::new("train", steps.clone(), col("accuracy")), Series::new("held-out test", steps.clone(), col("test_accuracy"))],
                Scale::Linear,
                Scale::Linear,
            )?;
        }
        notes.push(if run.dataset.is_classification() {
            "- Charts: `charts/training_loss.png`, `charts/training_accuracy.png`.".to_string()
        } else {
            "- Chart: `charts/training_loss.png`.".to_string()
        });
        // Per-step validation and Fig. 2 from the kernels' steps tables.
        let mut err_series = Vec::new();
        let mut cos_series = Vec::new();
        let mut scatter = Vec::new();
        for (spec, label, kdir) in kernels {
            let t = Table::read_parquet(&kdir.join("steps.parquet"))?;
            let st: Vec<f64> = t.i64("step").unwrap_or(&[]).iter().map(|&v| v as f64).collect();
            if spec.kind != "ntk" {
                err_series.push(Series::new(label.clone(), st.clone(), t.f64("max_abs_error").unwrap_or(&[]).to_vec()));
            }
            if spec.kind == "epk" && spec.side == "test" {
                let c = t.f64("dpk_cosine_error").unwrap_or(&[]).to_vec();
                if c.iter().any(|v| v.is_finite()) {
                    cos_series.push(Series::new(format!("{label}: 1 − cos(DPK, EPK test gradient)"), st.clone(), c));
                }
            }
            if spec.points == "test" {
                let pr = Table::read_parquet(&kdir.join("predictions.parquet"))?;
                let cls = pr.i64("class").unwrap_or(&[]);
                let sel: Vec<usize> = (0..cls.len()).filter(|&i| cls[i] == 0).take(100).collect();
                let net = pr.f64("network").unwrap_or(&[]);
                let km = pr.f64("kernel_machine").unwrap_or(&[]);
                scatter.push(Series::new(label.clone(), sel.iter().map(|&i| net[i]).collect(), sel.iter().map(|&i| km[i]).collect()));
            }
        }
        if !err_series.is_empty() {
            plot::line_chart(&charts.join("per_step_error.png"), "Kernel machine vs network, change over each step", "step", "max |predicted − actual change|", &err_series, Scale::Linear, Scale::Log)?;
            notes.push("- `charts/per_step_error.png`: per step, the largest difference between the change of the output predicted by that step's kernel and the network's actual change (ExPLAIND-style validation).".into());
        }
        if !cos_series.is_empty() {
            plot::line_chart(&charts.join("fig2_dpk_gradient_error.png"), "DPK vs EPK test gradients (paper Fig. 2)", "step", "mean 1 − cosine", &cos_series, Scale::Linear, Scale::Log)?;
            notes.push("- `charts/fig2_dpk_gradient_error.png`: per step, the mean angle error (1 − cosine) between the DPK's test gradient at t = 0 and the EPK's integrated test gradient (paper Fig. 2).".into());
        }
        if !scatter.is_empty() {
            plot::scatter_chart(&charts.join("fig4_machine_vs_network.png"), "Class 0 output: kernel machine vs network (paper Fig. 4)", "network log-probability f⁰(x)", "kernel machine", &scatter, true)?;
            notes.push("- `charts/fig4_machine_vs_network.png`: class-0 output of the kernel machine against the network on up to 100 test points (paper Fig. 4).".into());
        }
    }
    let needs_train = a.gp || a.svm || a.stationarity || a.similarity > 0;
    let train_kernel = if needs_train {
        let spec = KernelSpec { kind: "epk".into(), quadrature: default_quadrature(), points: "train".into(), side: "train".into(), step: None, label: Some("train-train".into()), blocks: None };
        let (_, _, kdir) = cached_kernel(run, states, &spec, cache, progress)?;
        Some(KernelFiles::open(&kdir, run)?)
    } else {
        None
    };
    let overlay = train_overlay(run);
    for (spec, label, kdir) in kernels {
        // GP and SVM use the exact kernel (EPK) rows; other kinds are compared through their
        // kernel machines above.
        if spec.points == "train" || spec.kind != "epk" {
            continue;
        }
        let Some(tk) = &train_kernel else { break };
        let rk = KernelFiles::open(kdir, run)?;
        if a.gp && spec.kind != "ntk" {
            // gp.safetensors (the GP's exact inputs, M² per class) stays in the cache; the report
            // gets the tables.
            let cdir = cache.join("analysis").join(format!("gp-{label}"));
            io::create_dir_all(&cdir)?;
            let g = workflow::gp_report(run, tk, &rk, &crate::gp::GpParams::new().fit_hyper(true), GpTargets::Network, 1000, 0, &cdir)?;
            let dir = out.join("analysis").join(format!("gp-{label}"));
            io::create_dir_all(&dir)?;
            for f in ["gp.json", "gp.parquet", "gp_points.parquet"] {
                std::fs::copy(cdir.join(f), dir.join(f)).map_err(|e| Error::io(cdir.join(f), e))?;
            }
            notes.push(format!(
                "- GP on `{label}` (targets: network outputs minus bias, hyper-parameters by marginal likelihood; inputs and outputs in `{cd}/gp.safetensors`): mean posterior logit std {:.3e}, mean predictive entropy {:.3}, MC arg-max agrees with the network on {:.1} %{}.",
                g.mean_std,
                g.mean_entropy,
                100.0 * g.agreement_with_network,
                g.accuracy.map_or(String::new(), |v| format!(", test accuracy {:.1} %", 100.0 * v))
                    + &match (&g.calibration, &g.network_calibration) {
                        (Some(c), Some(nc)) => format!(
                            "; calibration (GP MC vs network softmax): Brier {:.4} vs {:.4}, NLL {:.4} vs {:.4}, ECE {:.4} vs {:.4}",
                            c.brier, nc.brier, c.nll, nc.nll, c.ece, nc.ece
                        ),
                        _ => String::new(),
                    },
                cd = cdir.display()
            ));
            if a.charts && spec.points.starts_with("grid:") {
                let t = Table::read_parquet(&dir.join("gp.parquet"))?;
                let k = rk.k;
                let ps = t.f64("mc_std_prob").unwrap_or(&[]);
                let pstd: Vec<f64> = ps.chunks(k).map(|r| r.iter().sum::<f64>() / k as f64).collect();
                let diag = rk.diag.clone().unwrap_or_default();
                let kv: Vec<f64> = (0..rk.p).map(|q| (0..k).map(|c| diag.get((q * k + c) * k + c).copied().unwrap_or(f64::NAN)).sum::<f64>() / k as f64).collect();
                let logkv: Vec<f64> = kv.iter().map(|v| v.log10()).collect();
                if let (Some(g1), Some(g2)) = (grid_of(&rk.points, logkv), grid_of(&rk.points, pstd)) {
                    plot::Chart::heatmaps(
                        "Kernel value and Monte-Carlo std of the softmax probabilities (paper Fig. 5)",
                        &[
                            plot::Heatmap::new("log10 K(x, x) (mean over classes)", g1, "log10 K(x, x)"),
                            plot::Heatmap::new("MC std of probabilities (mean over classes)", g2, "std of p(class)"),
                        ],
                        overlay.as_ref(),
                    )?
                    .save(&charts.join(format!("fig5_{label}.png")))?;
                    notes.push(format!("- `charts/fig5_{label}.png`: the kernel's self-value and the MC standard deviation of the GP's softmax probabilities on the grid (paper Fig. 5)."));
                }
            }
        }
        if a.svm {
            let dir = out.join("analysis").join(format!("svm-{label}"));
            io::create_dir_all(&dir)?;
            let s = workflow::svm_report(run, tk, &rk, &crate::svm::SvmParams::new(), &dir)?;
            notes.push(format!(
                "- SVM refit of a_i (one-vs-rest, C = 1) on `{label}`: agrees with the network on {:.1} %{}; support vectors per class {:?}.",
                100.0 * s.agreement_with_network,
                s.accuracy.map_or(String::new(), |v| format!(", accuracy {:.1} %", 100.0 * v)),
                s.support
            ));
            if a.charts && spec.points.starts_with("grid:") {
                let t = Table::read_parquet(&dir.join("svm.parquet"))?;
                let mut panels = Vec::new();
                for c in 0..rk.k {
                    if let Some(g) = grid_of(&rk.points, t.f64(&format!("decision_{c}")).unwrap_or(&[]).to_vec()) {
                        panels.push((format!("class {c}"), g));
                    }
                }
                if !panels.is_empty() {
                    plot::heatmaps(&charts.join(format!("fig3_svm_{label}.png")), "SVM-refit kernel machine: decision value per class (paper Fig. 3)", &panels, "decision value", overlay.as_ref())?;
                    notes.push(format!("- `charts/fig3_svm_{label}.png`: decision values of the SVM-refit kernel machine per class on the grid, with the training data (paper Fig. 3)."));
                }
            }
        }
    }
    if a.stationarity {
        if let Some(tk) = &train_kernel {
            let dir = out.join("analysis").join("stationarity");
            io::create_dir_all(&dir)?;
            let s = workflow::stationarity_report(run, tk, &crate::gp::GpParams::new().fit_hyper(true), Rule::Auto(1e-8), 16, 10, 1.5, 0, &dir)?;
            notes.push(format!(
                "- Stationarity (1 = stationary): train×train EPK {:.3} (per class {:?}), RBF on the same points {:.3}. Far field along {} ray points, Spearman correlation with the distance from the training data: kernel self-value {:+.2}, GP logit std {:+.2}, MC probability std {:+.2}.",
                s.score,
                s.class_scores.iter().map(|v| (v * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
                s.rbf_score,
                s.ray_points,
                s.far_kernel_spearman,
                s.far_std_spearman,
                s.far_prob_std_spearman
            ));
            if a.charts {
                let t = Table::read_parquet(&dir.join("far_profile.parquet"))?;
                let lo = t.f64("distance_lo").unwrap_or(&[]);
                let hi = t.f64("distance_hi").unwrap_or(&[]);
                let mid: Vec<f64> = lo.iter().zip(hi).map(|(a, b)| (a.max(1e-12) * b).sqrt()).collect();
                plot::line_chart(
                    &charts.join("far_field.png"),
                    "Far from the data: GP uncertainty along rays",
                    "distance to the nearest training point",
                    "mean over ray points",
                    &[
                        Series::new("GP logit std", mid.clone(), t.f64("gp_std_mean").unwrap_or(&[]).to_vec()),
                        Series::new("MC std of probabilities", mid.clone(), t.f64("mc_prob_std_mean").unwrap_or(&[]).to_vec()),
                    ],
                    Scale::Log,
                    Scale::Log,
                )?;
                notes.push("- `charts/far_field.png`: GP logit standard deviation and MC probability standard deviation against the distance from the training data, along rays.".into());
            }
        }
    }
    if a.similarity > 0 {
        if let Some(tk) = &train_kernel {
            let n = a.similarity.min(tk.m);
            let m = tk.m;
            let trace = tk.trace();
            let mut mat = vec![0.0; n * n];
            for i in 0..n {
                for j in 0..n {
                    mat[i * n + j] = trace[i * m + j];
                }
            }
            let labels: Vec<String> = match &run.dataset.y_train {
                crate::data::Targets::Labels(y) => (0..n).map(|i| format!("x{i} (y={})", y[i])).collect(),
                _ => (0..n).map(|i| format!("x{i}")).collect(),
            };
            Table::new()
                .with("i", Column::I64((0..n * n).map(|q| (q / n) as i64).collect()))
                .with("j", Column::I64((0..n * n).map(|q| (q % n) as i64).collect()))
                .with("kernel", Column::F64(mat.clone()))
                .write_parquet(&out.join("similarity.parquet"))?;
            if a.charts {
                plot::matrix(&charts.join("similarity.png"), "Path-kernel similarity of training points (Σ_k K[k,k])", &labels, &mat, "kernel value")?;
            }
            notes.push(format!(
                "- Gradient-similarity matrix (the Domingos notebook, done with the train×train EPK summed over classes) of the first {n} training points: `similarity.parquet`{}.",
                if a.charts { ", `charts/similarity.png`" } else { "" }
            ));
        }
    }
    if !a.attribution_points.is_empty() {
        if let Some((_, label, kdir)) = kernels.iter().find(|(sp, _, _)| sp.kind == "epk" && sp.points == "test" && sp.side == "test") {
            let rk = KernelFiles::open(kdir, run)?;
            let dir = out.join("analysis").join("attribution");
            io::create_dir_all(&dir)?;
            let s = if rk.constant_a() {
                workflow::attribution_report(run, &rk, &a.attribution_points, 10, &dir)?
            } else {
                // a_{i,s} varies by step (SGD, MSE): the ensemble needs per-step Grams; compute
                // them for the chosen points only.
                let d = rk.d;
                if let Some(&bad) = a.attribution_points.iter().find(|&&q| q >= rk.p) {
                    return Err(Error::Config(format!("analysis.attribution_points: {bad} is out of range ({} test points)", rk.p)));
                }
                let x = o_points(&rk, &a.attribution_points);
                let req = KernelRequest { kind: KernelKind::Epk, rule: Rule::Auto(1e-12), side: Side::Test, ntk_step: None, per_step: true, steps: None };
                let pts = kernel::Points { x, dim: d };
                let o = kernel::compute_run(run, states, &pts, &req, 4 << 30, &|_, _| {})?;
                let kdir = cache.join("analysis").join("attribution-kernel");
                let kst = StagedDir::new(&kdir, true)?;
                kernel::output::write(kst.path(), &o, &pts, &run.manifest.run_id)?;
                kst.commit()?;
                let kf = KernelFiles::open(&kdir, run)?;
                let idx: Vec<usize> = (0..a.attribution_points.len()).collect();
                workflow::attribution_report(run, &kf, &idx, 10, &dir)?
            };
            notes.push(format!(
                "- Attribution on `{label}` for test points {:?}: contributions of the training points sum to the network output minus the bias to {:.1e} ({}).",
                a.attribution_points, s.max_abs_residual, s.form
            ));
        }
    }
    if let Some((_, label, kdir)) = kernels.iter().find(|(sp, _, _)| sp.points == "class-means" && sp.kind == "epk") {
        if a.charts && run.dataset.dim == 2 {
            let rk = KernelFiles::open(kdir, run)?;
            rk.require_layout(crate::kernel::Layout::Full, "the class-means attribution chart")?;
            let (m, k) = (rk.m, rk.k);
            let contrib = crate::analysis::contributions(&rk.gram, &rk.a[..m * k], rk.p, m, k)?;
            let mut ov = train_overlay(run).expect("2-D classification");
            let mut panels = Vec::new();
            for p in 0..rk.p {
                for c in 0..k {
                    ov.value = Some((0..m).map(|i| contrib[(p * m + i) * k + c]).collect());
                    panels.push((format!("mean of class {p}: output {c}"), ov.clone(), None));
                }
            }
            let marks: Vec<(f64, f64)> = rk.points.chunks(2).map(|r| (r[0], r[1])).collect();
            plot::point_value_panels(&charts.join(format!("fig6_{label}.png")), "Per-training-point contribution Σ_s a_i,s K_s(x, x_i) at the class means (paper Fig. 6)", &panels, &marks, "contribution", )?;
            notes.push(format!("- `charts/fig6_{label}.png`: each training point's contribution to each output at the three class means (paper Fig. 6)."));
        }
    }
    if a.interpolation >= 2 {
        let (t, loss, acc, proj, norm) = interpolation(run, states, a.interpolation)?;
        Table::new()
            .with("t", Column::F64(t.clone()))
            .with("loss", Column::F64(loss.clone()))
            .with("accuracy", Column::F64(acc.clone()))
            .with("gradient_projection", Column::F64(proj.clone()))
            .with("weight_norm", Column::F64(norm.clone()))
            .write_parquet(&out.join("interpolation.parquet"))?;
        notes.push(format!(
            "- Linear interpolation w(t) = w_0 + t(w_N − w_0) (paper Fig. 8, `interpolation.parquet`): loss {:.4} → {:.4}, weight norm {:.3} → {:.3} ({:+.1} %).",
            loss[0],
            loss[loss.len() - 1],
            norm[0],
            norm[norm.len() - 1],
            100.0 * (norm[norm.len() - 1] / norm[0] - 1.0)
        ));
        if a.charts {
            let scaled = |v: &[f64]| {
                let m = v.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(1e-300);
                (v.iter().map(|x| x / m).collect::<Vec<f64>>(), m)
            };
            let (l, lm) = scaled(&loss);
            let (p, pm) = scaled(&proj);
            let (n, nm) = scaled(&norm);
            plot::line_chart(
                &charts.join("fig8_interpolation.png"),
                "Straight line from w_0 to w_N (paper Fig. 8)",
                "t",
                "value / its maximum",
                &[
                    Series::new(format!("loss (max {lm:.3})"), t.clone(), l),
                    Series::new("accuracy", t.clone(), acc),
                    Series::new(format!("∇L along the path (max |·| {pm:.3})"), t.clone(), p),
                    Series::new(format!("‖w(t)‖ (max {nm:.3})"), t, n),
                ],
                Scale::Linear,
                Scale::Linear,
            )?;
            notes.push("- `charts/fig8_interpolation.png`: loss, accuracy, the loss gradient projected on the straight path, and the weight norm along w(t) (paper Fig. 8).".into());
        }
    }
    Ok(notes)
}

/// Loss, accuracy, `⟨∇L(w(t)), u⟩` (u the unit direction `w_N − w_0`) and `‖w(t)‖` along the
/// straight line `w(t) = w_0 + t(w_N − w_0)`, at `n` evenly spaced t.
#[allow(clippy::type_complexity)]
fn interpolation(run: &Run, states: &[crate::model::Params], n: usize) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    use crate::model::net::Objective;
    let arch = &run.manifest.architecture;
    let (w0, wn) = (&states[0], &states[states.len() - 1]);
    let (labels, values) = match &run.dataset.y_train {
        crate::data::Targets::Labels(y) => (Some(y.as_slice()), None),
        crate::data::Targets::Values(v) => (None, Some(v.as_slice())),
    };
    let obj = Objective::new(dfdx::tensor::Cpu::default(), arch, &run.dataset.x_train, labels, values, run.manifest.loss, Some(w0))?;
    let dir: Vec<f64> = wn.flat().iter().zip(w0.flat()).map(|(a, b)| a - b).collect();
    let dn = dir.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-300);
    let mut out = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for j in 0..n {
        let t = j as f64 / (n - 1) as f64;
        let w = crate::kernel::generic::interpolate(w0, Some(wn), t);
        let lg = obj.evaluate(&w);
        let acc = labels.map_or(f64::NAN, |y| crate::train::accuracy(&lg.outputs, y, arch.outputs()));
        let proj = lg.grad.flat().iter().zip(&dir).map(|(g, d)| g * d).sum::<f64>() / dn;
        out.0.push(t);
        out.1.push(lg.loss);
        out.2.push(acc);
        out.3.push(proj);
        out.4.push(w.norm());
    }
    Ok(out)
}

/// The `[sweep]` section: train one run per width and report the lazy-training measures.
fn sweep(cfg: &StudyConfig, sw: &SweepSpec, cache: &Path, out: &Path, opts: &StudyOptions) -> Result<Vec<String>> {
    use crate::plot::{self, Scale, Series};
    let mut notes = vec!["- Width sweep (lazy training, the NTK notebook): relative weight change ‖w_s − w_0‖/‖w_0‖, loss, and the NTK's relative change ‖K_N − K_0‖/‖K_0‖ on the training points.".to_string()];
    let mut t_name = Vec::new();
    let mut t_step = Vec::new();
    let mut t_loss = Vec::new();
    let mut t_change = Vec::new();
    let mut change_series = Vec::new();
    let mut loss_series = Vec::new();
    for h in &sw.hidden {
        let name = format!("hidden {h:?}");
        let rc = cfg.sweep_config(h);
        let dir = cache.join("sweep").join(h.iter().map(|w| w.to_string()).collect::<Vec<_>>().join("x")).join("run");
        let reused = matches!(Run::open(&dir), Ok(r) if r.manifest.run_id == rc.run_id() && r.manifest.created_by == crate::train::created_by());
        if !reused {
            train_to_dir(&rc, &dir, &TrainOptions { progress: opts.progress, force: true, base_dir: opts.base_dir.clone(), memory_budget: None })?;
        }
        let run = Run::open(&dir)?;
        let states = run.load_all()?;
        let w0 = states[0].flat();
        let n0 = w0.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-300);
        let change: Vec<f64> = states.iter().map(|w| w.flat().iter().zip(&w0).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt() / n0).collect();
        let log = Table::read_parquet(&run.dir.join("train_log.parquet"))?;
        let loss = log.f64("loss").unwrap_or(&[]).to_vec();
        let steps: Vec<f64> = (0..states.len()).map(|s| s as f64).collect();
        // NTK on the training points at w_0 and at w_N.
        let pts = PointsSpec::Train.resolve(&run.dataset)?;
        let ntk = |s: usize| -> Result<Vec<f64>> {
            let req = KernelRequest { kind: KernelKind::Ntk, rule: Rule::Gauss(1), side: Side::Train, ntk_step: Some(s), per_step: false, steps: None };
            Ok(kernel::compute_run(&run, &states, &pts, &req, u64::MAX, &|_, _| {})?.gram)
        };
        let (k0, kn) = (ntk(0)?, ntk(run.manifest.steps)?);
        let fro = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let ntk_change = fro(&k0.iter().zip(&kn).map(|(a, b)| b - a).collect::<Vec<_>>()) / fro(&k0).max(1e-300);
        notes.push(format!(
            "  - {name}: {} parameters, loss {:.3e} → {:.3e}, ‖w_N − w_0‖/‖w_0‖ = {:.3e}, NTK change {:.3e}",
            run.manifest.num_params,
            loss.first().copied().unwrap_or(f64::NAN),
            loss.last().copied().unwrap_or(f64::NAN),
            change.last().copied().unwrap_or(f64::NAN),
            ntk_change
        ));
        for s in 0..states.len() {
            t_name.push(name.clone());
            t_step.push(s as i64);
            t_loss.push(loss.get(s).copied().unwrap_or(f64::NAN));
            t_change.push(change[s]);
        }
        change_series.push(Series::new(name.clone(), steps.clone(), change));
        loss_series.push(Series::new(name, steps, loss));
    }
    Table::new()
        .with("run", Column::Str(t_name))
        .with("step", Column::I64(t_step))
        .with("loss", Column::F64(t_loss))
        .with("relative_weight_change", Column::F64(t_change))
        .write_parquet(&out.join("sweep.parquet"))?;
    if cfg.analysis.charts {
        let charts = out.join("charts");
        io::create_dir_all(&charts)?;
        plot::line_chart(&charts.join("lazy_weight_change.png"), "Relative change of the weights from initialisation", "step", "‖w_s − w_0‖ / ‖w_0‖", &change_series, Scale::Linear, Scale::Log)?;
        plot::line_chart(&charts.join("lazy_loss.png"), "Training loss", "step", "loss", &loss_series, Scale::Linear, Scale::Log)?;
        notes.push("- `charts/lazy_weight_change.png`, `charts/lazy_loss.png`, table `sweep.parquet`.".into());
    }
    Ok(notes)
}

/// The rows `points` of a kernel directory's row points.
fn o_points(rk: &crate::workflow::KernelFiles, points: &[usize]) -> Vec<f64> {
    let d = rk.d;
    points.iter().flat_map(|&q| rk.points[q * d..(q + 1) * d].iter().copied()).collect()
}
