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
use crate::model::ModelConfig;
use crate::train::{fnv1a, train_to_dir, RunConfig, TrainConfig, TrainOptions};
use crate::trajectory::Run;

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
    /// Output folder name.
    pub fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| format!("{}-{}", self.kind, self.points.replace(':', "")))
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
}

impl StudyConfig {
    /// Parses and validates a study file's text.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let cfg: StudyConfig = toml::from_str(text).map_err(|e| Error::format(origin, e.message().replace('\n', " ").trim().to_string()))?;
        if cfg.name.is_empty() || cfg.name.contains(['/', '\\']) || cfg.name.starts_with('.') {
            return Err(Error::Config(format!("study name `{}` must be a plain, non-empty folder name", cfg.name)));
        }
        cfg.run_config().validate()?;
        let mut labels = std::collections::HashSet::new();
        for k in &cfg.kernels {
            k.request()?;
            if !labels.insert(k.label()) {
                return Err(Error::Config(format!("two [[kernel]] entries share the label `{}`; set `label`", k.label())));
            }
        }
        Ok(cfg)
    }
    /// The training part.
    pub fn run_config(&self) -> RunConfig {
        RunConfig { data: self.data.clone(), model: self.model.clone(), train: self.train.clone() }
    }
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
    io::create_dir_all(&cache)?;
    let staged = StagedDir::new(&out, true)?;

    // Training, reused when the configuration is unchanged.
    let rc = cfg.run_config();
    let run_dir = cache.join("run");
    let reused_run = matches!(Run::open(&run_dir), Ok(r) if r.manifest.run_id == rc.run_id() && r.manifest.config == serde_json::to_value(&rc).expect("serialisable"));
    if !reused_run {
        train_to_dir(&rc, &run_dir, &TrainOptions { progress: opts.progress, force: true, base_dir: opts.base_dir.clone() })?;
    }
    let run = Run::open(&run_dir)?;
    std::fs::copy(run_dir.join("train_log.parquet"), staged.path().join("train_log.parquet")).map_err(|e| Error::io(staged.path(), e))?;
    io::write_json(&staged.path().join("manifest.json"), &run.manifest)?;
    let states = run.load_all()?;

    let mut kernels = Vec::new();
    for spec in &cfg.kernels {
        let (req, points) = spec.request()?;
        let label = spec.label();
        let key = format!(
            "{:016x}",
            fnv1a(format!("{}|{}|{}", run.manifest.run_id, serde_json::to_string(spec).expect("serialisable"), env!("CARGO_PKG_VERSION")).as_bytes())
        );
        let kdir = cache.join("kernels").join(&label);
        let reused = std::fs::read_to_string(kdir.join("inputs.key")).map(|s| s.trim() == key).unwrap_or(false) && kdir.join("exactness.json").exists();
        if !reused {
            let pts = points.resolve(&run.dataset)?;
            let kstage = StagedDir::new(&kdir, true)?;
            let o = kernel::compute(&run.manifest, &run.dataset, &states, &pts, &req, u64::MAX, &|_, _| {})?;
            kernel::output::write(kstage.path(), &o, &pts, &run.manifest.run_id)?;
            io::write_atomic(&kstage.path().join("inputs.key"), key.as_bytes())?;
            kstage.commit()?;
        }
        let ex: Exactness = read_exactness(&kdir.join("exactness.json"))?;
        let dst = staged.path().join("kernels").join(&label);
        io::create_dir_all(&dst)?;
        for f in ["exactness.json", "predictions.parquet", "steps.parquet"] {
            std::fs::copy(kdir.join(f), dst.join(f)).map_err(|e| Error::io(kdir.join(f), e))?;
        }
        kernels.push((label, reused, ex));
    }
    let summary_md = summary_markdown(&cfg, &text, &run, &kernels, opts)?;
    io::write_atomic(&staged.path().join("summary.md"), summary_md.as_bytes())?;
    io::write_atomic(&staged.path().join("study.toml"), text.as_bytes())?;
    let out = staged.commit()?;
    Ok(StudySummary { out, reused_run, kernels, seconds: start.elapsed().as_secs_f64() })
}

fn read_exactness(path: &Path) -> Result<Exactness> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(path, format!("invalid exactness.json: {e}")))
}

fn summary_markdown(cfg: &StudyConfig, text: &str, run: &Run, kernels: &[(String, bool, Exactness)], opts: &StudyOptions) -> Result<String> {
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
    let _ = writeln!(s, "- optimizer: {:?}, {} steps, loss {:?}", m.optimizer, m.steps, m.loss);
    let _ = writeln!(s, "- loss {:.6} → {:.6}", loss.first().copied().unwrap_or(f64::NAN), last(&loss));
    if !acc.is_empty() && acc.iter().any(|v| v.is_finite()) {
        let _ = writeln!(s, "- final accuracy: train {:.2} %, held-out test {:.2} %", 100.0 * last(&acc), 100.0 * last(&tacc));
    }
    let _ = writeln!(s, "- run id `{}` (trajectory cached under `{}`)\n", m.run_id, run.dir.display());
    if !kernels.is_empty() {
        let _ = writeln!(s, "## Kernel machines\n");
        let _ = writeln!(s, "max/mean |err| = |kernel machine − network| over all points and classes; evaluations = gradient evaluations per point and step (mean, max).\n");
        let _ = writeln!(s, "| kernel | side | quadrature | P × M × K | steps | max abs err | mean abs err | single machine max err | evaluations | seconds |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
        for (label, _, e) in kernels {
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} × {} × {} | {} | {:.3e} | {:.3e} | {} | {:.2} / {} | {:.2} |",
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
                e.seconds
            );
        }
        let _ = writeln!(s, "\nPer-step validation (predicted vs actual change of the output over each step): `kernels/*/steps.parquet`; predictions: `kernels/*/predictions.parquet`.\n");
    }
    let _ = writeln!(s, "## Configuration\n\n```toml\n{}\n```", text.trim());
    Ok(s)
}
