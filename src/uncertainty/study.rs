//! The MNIST uncertainty study: a study file with an `[uncertainty]` section run end to end
//! (`pathkernel study run data/studies/mnist-uncertainty.toml`).
//!
//! 1. **Selection.** One run per learning rate in `lrs`, trained for the largest of `steps`;
//!    the validation accuracy of the states at every entry of `steps` picks `(lr, steps)` (the
//!    first best in the order `lrs` × `steps`, so ties go to the smaller rate, then to fewer
//!    steps). The chosen configuration is the network under test (its own run when it stops
//!    before the selection run's end; the two are checked to agree bit for bit).
//! 2. **Methods** on that network, in every setting of [`super::settings`]: MAP softmax,
//!    temperature scaling, last-layer Laplace, a deep ensemble of the same configuration with
//!    the seeds `ensemble_seeds` (the network itself is the member with its seed), and the
//!    per-class GPs of [`super::kernel_gp`] on the EPK and on the NTK at `w_N`.
//! 3. **Report** into `reports/NAME/`: `summary.md` (deterministic given the cache),
//!    `timings.md`/`timings.json`, `predictions.parquet`, `metrics.parquet`, `uq.json`,
//!    `selection.json`, `gp_fits.json`, charts.
//!
//! Everything computed is cached under `runs/NAME/` by the hash of its inputs (trajectories,
//! the built-in methods' predictions, each GP's fit and its predictive in each setting), with
//! the seconds it took (`timings.json` there). A rerun reuses what is unchanged and reports the
//! seconds recorded when each stage was computed, so that rerunning with the cache reproduces
//! the report byte for byte; a run from an empty cache measures everything afresh.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::io::{self, NamedArray, SafeFile, StagedDir};
use crate::kernel::Rule;
use crate::model::Params;
use crate::train::{self, fnv1a, RunConfig, TrainOptions};
use crate::trajectory::Run;

use super::ensemble::{EnsembleMember, ENSEMBLE_SEEDS};
use super::kernel_gp::{self, GramCheck, KernelGp, KernelGpFit, KernelGpSpec, TrainGram};
use crate::gp::Posterior;
use crate::kernel::KernelKind;
pub use super::record::{FslStudyFit, Selection, SelectionRow, StageTiming, UqStudyReport};
use super::report::{LaplaceSummary, MethodPrediction, UqResults};
use super::temperature::TemperatureFit;
use super::{BenchmarkConfig, Ensemble, ExternalMethod, Network, Predictive, Setting};

/// Bumped whenever the cached stages' files or meaning change.
const CACHE_VERSION: u32 = 2;

fn default_lrs() -> Vec<f64> {
    vec![0.1, 0.2, 0.5]
}
fn default_steps() -> Vec<usize> {
    vec![200, 500]
}
fn default_seeds() -> Vec<u64> {
    ENSEMBLE_SEEDS.to_vec()
}
fn default_quadrature() -> String {
    "auto:1e-12".into()
}
fn default_kernel_gps() -> Vec<String> {
    vec!["epk".into(), "ntk".into()]
}
fn default_grid() -> usize {
    24
}

/// The `[uncertainty]` section of a study file.
///
/// ```toml
/// [uncertainty]
/// lrs = [0.1, 0.2, 0.5]          # learning rates tried
/// steps = [200, 500]             # step counts tried
/// ensemble_seeds = [0, 1, 2, 3, 4]
/// quadrature = "auto:1e-12"      # the EPK rows' quadrature
/// kernel_gps = ["epk", "ntk"]
/// [uncertainty.benchmark]        # settings and Monte-Carlo (BenchmarkConfig; defaults: the protocol)
/// angles = [15, 30, 45, 60, 90, 180]
/// ```
///
/// `[train]` gives the optimizer and the seed; its `lr` and `steps` must be one of the grid's
/// points and are replaced by the selection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UqStudySpec {
    /// Learning rates tried (default 0.1, 0.2, 0.5).
    #[serde(default = "default_lrs")]
    pub lrs: Vec<f64>,
    /// Step counts tried (default 200, 500).
    #[serde(default = "default_steps")]
    pub steps: Vec<usize>,
    /// Seeds of the deep ensemble's members (default 0–4).
    #[serde(default = "default_seeds")]
    pub ensemble_seeds: Vec<u64>,
    /// Quadrature of the EPK's test-side rows (default `auto:1e-12`).
    #[serde(default = "default_quadrature")]
    pub quadrature: String,
    /// Kernel GPs: any of `epk`, `ntk` (default both).
    #[serde(default = "default_kernel_gps")]
    pub kernel_gps: Vec<String>,
    /// Ablations of the kernel GPs on the same Grams (default none): `netmean` adds
    /// `{epk,ntk}-gp-netmean` (the network's outputs as the mean, the GP's variance; free),
    /// `sym` adds `epk-gp-sym` (the EPK-GP on the symmetrised training Gram with the training
    /// points on the test side; one more integrated EPK on the training points).
    #[serde(default)]
    pub ablations: Vec<String>,
    /// The study author's notes (markdown), reproduced in the summary as they are.
    #[serde(default)]
    pub notes: String,
    /// Test images in the chart of the largest EPK-GP/MAP confidence differences (default 24).
    #[serde(default = "default_grid")]
    pub disagreement_images: usize,
    /// Function-space Laplace on each kernel of `kernel_gps` (default none): the curvatures
    /// `diag` and/or `full` ([`crate::gp::functional`]). Each adds, on the same Grams (on the
    /// logits), `fsl-{kernel}-{curvature}` (δ by the evidence, probit), `…-mc` (the same, Monte
    /// Carlo from the `K × K` covariance), `…-T` (a temperature fitted on the validation
    /// split), `…-Ts` (temperature and variance scale fitted there) and, for `diag`, `…-grid`
    /// (δ by the validation NLL over `logspace(−4, 4, 100)`, probit).
    #[serde(default)]
    pub fsl: Vec<crate::gp::Curvature>,
    /// Settings and Monte-Carlo parameters (defaults: the protocol).
    #[serde(default)]
    pub benchmark: BenchmarkConfig,
}

impl Default for UqStudySpec {
    fn default() -> Self {
        UqStudySpec {
            lrs: default_lrs(),
            steps: default_steps(),
            ensemble_seeds: default_seeds(),
            quadrature: default_quadrature(),
            kernel_gps: default_kernel_gps(),
            ablations: Vec::new(),
            notes: String::new(),
            disagreement_images: default_grid(),
            fsl: Vec::new(),
            benchmark: BenchmarkConfig::default(),
        }
    }
}

impl UqStudySpec {
    /// Checks the section against the study's training configuration.
    pub fn validate(&self, rc: &RunConfig) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("[uncertainty] {m}")));
        if self.lrs.is_empty() || self.lrs.iter().any(|l| !(l.is_finite() && *l > 0.0)) {
            return bad(format!("lrs must be a non-empty list of positive rates, got {:?}", self.lrs));
        }
        if self.steps.is_empty() || self.steps.contains(&0) {
            return bad(format!("steps must be a non-empty list of positive step counts, got {:?}", self.steps));
        }
        if self.ensemble_seeds.is_empty() {
            return bad("ensemble_seeds is empty".into());
        }
        let mut seeds = self.ensemble_seeds.clone();
        seeds.sort_unstable();
        if seeds.windows(2).any(|w| w[0] == w[1]) {
            return bad(format!("ensemble_seeds has duplicates: {:?}", self.ensemble_seeds));
        }
        self.rule()?;
        let mut labels = Vec::with_capacity(self.kernel_gps.len());
        for k in &self.kernel_gps {
            match kernel_label(k) {
                Some((label, _)) => labels.push(label),
                None => return bad(format!("kernel_gps: `{k}` is not epk, ntk, path or window:L (L >= 1 steps)")),
            }
        }
        labels.sort();
        if labels.windows(2).any(|w| w[0] == w[1]) {
            return bad(format!("kernel_gps has duplicates: {:?}", self.kernel_gps));
        }
        for a in &self.ablations {
            if a != "sym" && a != "netmean" {
                return bad(format!("ablations: `{a}` is not sym or netmean"));
            }
        }
        if self.benchmark.mc_samples < 2 {
            return bad("benchmark.mc_samples must be >= 2".into());
        }
        if !self.lrs.contains(&rc.train.lr) || !self.steps.contains(&rc.train.steps) {
            return bad(format!(
                "[train] lr = {} and steps = {} must be points of the selection grid (lrs {:?}, steps {:?}); the selection replaces them",
                rc.train.lr, rc.train.steps, self.lrs, self.steps
            ));
        }
        if rc.train.optimizer != train::OptimizerKind::Gd || rc.train.batch_size.is_some() {
            return bad("the benchmark trains by full-batch gradient descent ([train] optimizer = \"gd\")".into());
        }
        Ok(())
    }

    fn rule(&self) -> Result<Rule> {
        self.quadrature.parse()
    }

    /// The kernel GPs to run, one family per kernel.
    fn kernel_families(&self) -> Result<Vec<KernelFamily>> {
        let rule = self.rule()?;
        let netmean = |kernel: &str| if self.ablations.iter().any(|a| a == "netmean") { vec![(format!("{kernel}-gp-netmean"), format!("{kernel}-gp"))] } else { Vec::new() };
        self.kernel_gps
            .iter()
            .map(|k| {
                let (kernel, window) = kernel_label(k).ok_or_else(|| Error::Config(format!("[uncertainty] kernel_gps: `{k}` is not epk, ntk, path or window:L")))?;
                Ok(match k.as_str() {
                    "epk" => {
                        let mut gps = vec![("epk-gp".to_string(), KernelGpSpec::epk(rule))];
                        if self.ablations.iter().any(|a| a == "sym") {
                            gps.push(("epk-gp-sym".to_string(), KernelGpSpec::epk(rule).train_gram(TrainGram::SymmetrisedTestSide)));
                        }
                        KernelFamily { netmean: netmean("epk"), kernel, kind: KernelKind::Epk, rule, window: None, gps, fsl: self.fsl.clone() }
                    }
                    "ntk" => KernelFamily { netmean: netmean("ntk"), kernel, kind: KernelKind::Ntk, rule, window: None, gps: vec![("ntk-gp".to_string(), KernelGpSpec::ntk())], fsl: self.fsl.clone() },
                    _ => KernelFamily {
                        netmean: netmean(&kernel),
                        gps: vec![(format!("{kernel}-gp"), KernelGpSpec::path(rule, window))],
                        kernel,
                        kind: KernelKind::Path,
                        rule,
                        window,
                        fsl: self.fsl.clone(),
                    },
                })
            })
            .collect()
    }
}

/// A `kernel_gps` entry's label in method names and its window: `epk`, `ntk`, `path` (every
/// step) or `window:L` (the path kernel over the last L steps, label `windowL`).
fn kernel_label(k: &str) -> Option<(String, Option<usize>)> {
    match k {
        "epk" | "ntk" | "path" => Some((k.to_string(), None)),
        _ => match k.strip_prefix("window:").and_then(|l| l.parse::<usize>().ok()) {
            Some(l) if l >= 1 => Some((format!("window{l}"), Some(l))),
            _ => None,
        },
    }
}

/// The GPs on one kernel: they share its row Grams.
struct KernelFamily {
    /// The label in method names and stages (`epk`, `ntk`, `path`, `windowL`).
    kernel: String,
    kind: KernelKind,
    rule: Rule,
    /// The path kernel over the last L steps only.
    window: Option<usize>,
    /// Fitted GPs: method name and specification.
    gps: Vec<(String, KernelGpSpec)>,
    /// Methods with the network's outputs as the mean and a fitted GP's variance: (method, GP).
    netmean: Vec<(String, String)>,
    /// Function-space Laplace curvatures on this kernel.
    fsl: Vec<crate::gp::Curvature>,
}

impl KernelFamily {
    /// The function-space Laplace methods of the family: (method, curvature, variant).
    fn fsl_methods(&self) -> Vec<(String, crate::gp::Curvature, FslVariant)> {
        let mut out = Vec::new();
        for &c in &self.fsl {
            let base = format!("fsl-{}-{c}", self.kernel);
            out.push((base.clone(), c, FslVariant::Probit));
            out.push((format!("{base}-mc"), c, FslVariant::Mc));
            out.push((format!("{base}-T"), c, FslVariant::Temperature));
            out.push((format!("{base}-Ts"), c, FslVariant::TemperatureScale));
            if c == crate::gp::Curvature::ClassDiagonal {
                out.push((format!("{base}-grid"), c, FslVariant::Grid));
            }
        }
        out
    }
}

/// How a function-space Laplace method turns its posterior into probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FslVariant {
    /// δ by the evidence, probit link.
    Probit,
    /// δ by the evidence, Monte Carlo from the `K × K` covariance.
    Mc,
    /// δ by the evidence, a temperature fitted on the validation split (probit).
    Temperature,
    /// δ by the evidence, temperature and variance scale fitted on the validation split.
    TemperatureScale,
    /// δ by the validation NLL over `logspace(−4, 4, 100)` (probit).
    Grid,
}

/// What the runner needs from the study file and the command line.
#[derive(Clone, Debug)]
pub struct UqStudyInput {
    /// Study name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// The study file as given on the command line (recorded in the summary).
    pub study_file: String,
    /// The study file's text (copied into the report).
    pub text: String,
    /// `[data]`, `[model]`, `[train]`.
    pub run_config: RunConfig,
    /// `[uncertainty]`.
    pub spec: UqStudySpec,
    /// Report directory.
    pub out: PathBuf,
    /// Cache directory.
    pub cache: PathBuf,
    /// Directory relative data paths are resolved against.
    pub base_dir: PathBuf,
    /// Progress bars and stage lines on stderr.
    pub progress: bool,
}

/// What a study run reports back.
#[derive(Clone, Debug)]
pub struct UqStudyOutcome {
    /// Report directory.
    pub out: PathBuf,
    /// Stages, with whether each was reused from the cache.
    pub stages: Vec<(StageTiming, bool)>,
    /// Wall-clock seconds of this run.
    pub seconds: f64,
}

// ---------------------------------------------------------------------------------------------
// The timing ledger
// ---------------------------------------------------------------------------------------------

#[derive(Default, Serialize, Deserialize)]
struct Ledger {
    stages: BTreeMap<String, StageTiming>,
}

struct Clock {
    path: PathBuf,
    ledger: Ledger,
    order: Vec<(StageTiming, bool)>,
    progress: bool,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())).unwrap_or(f64::NAN)
}

impl Clock {
    fn open(cache: &Path, progress: bool) -> Self {
        let path = cache.join("timings.json");
        let ledger = read_json(&path).unwrap_or_default();
        Clock { path, ledger, order: Vec::new(), progress }
    }

    fn say(&self, line: &str) {
        if self.progress {
            eprintln!("[uq] {line}");
        }
    }

    /// Whether the ledger holds the stage's time for these inputs.
    fn has(&self, stage: &str, key: &str) -> bool {
        self.ledger.stages.contains_key(&format!("{stage}#{key}"))
    }

    /// Notes a stage reused from the cache, with the time recorded when it was computed.
    ///
    /// # Panics
    /// If the ledger does not hold it (check with [`Clock::has`]).
    fn reuse(&mut self, stage: &str, key: &str) {
        let t = self.ledger.stages[&format!("{stage}#{key}")].clone();
        self.say(&format!("{stage}: reused ({:.1} s when computed)", t.seconds));
        self.order.push((t, true));
    }

    /// Runs `f` as the stage `stage` for the inputs `key`, recording its time.
    fn run<T>(&mut self, stage: &str, method: &str, key: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.say(&format!("{stage} ..."));
        let l0 = load_average();
        let t0 = Instant::now();
        let out = f()?;
        let t = StageTiming { stage: stage.into(), method: method.into(), seconds: t0.elapsed().as_secs_f64(), load: [l0, load_average()] };
        self.say(&format!("{stage}: {:.1} s (load {:.1} -> {:.1})", t.seconds, t.load[0], t.load[1]));
        self.record(&format!("{stage}#{key}"), t)?;
        Ok(out)
    }

    /// Records a stage timed by the caller.
    fn record(&mut self, id: &str, t: StageTiming) -> Result<()> {
        self.ledger.stages.insert(id.to_string(), t.clone());
        self.order.push((t, false));
        write_cache_json(&self.path, &self.ledger)
    }
}

fn hash(parts: &[&str]) -> String {
    format!("{:016x}", fnv1a(parts.join("\u{1f}").as_bytes()))
}

fn f64_bytes(x: &[f64]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

// ---------------------------------------------------------------------------------------------
// Training (cached)
// ---------------------------------------------------------------------------------------------

fn same_run(dir: &Path, rc: &RunConfig) -> bool {
    match (Run::open(dir), serde_json::to_value(rc)) {
        (Ok(r), Ok(c)) => r.manifest.run_id == rc.run_id() && r.manifest.config == c && r.manifest.created_by == train::created_by(),
        _ => false,
    }
}

fn cached_train(clock: &mut Clock, stage: &str, method: &str, rc: &RunConfig, dir: &Path, input: &UqStudyInput) -> Result<Run> {
    let key = hash(&[&rc.run_id(), &train::created_by()]);
    if same_run(dir, rc) && clock.has(stage, &key) {
        clock.reuse(stage, &key);
        return Run::open(dir);
    }
    clock.run(stage, method, &key, || {
        let opts = TrainOptions { progress: input.progress, force: true, base_dir: input.base_dir.clone(), memory_budget: None };
        train::train_to_dir(rc, dir, &opts)?;
        Run::open(dir)
    })
}

/// Trains the runs `jobs` (config, directory) that are not cached yet as one stage, as many at
/// once as the machine has cores: each records on its own one-thread pool
/// ([`train::train_to_dir`]), so every run is bit for bit the run trained alone. The stage's
/// seconds are the group's wall time.
fn cached_train_group(clock: &mut Clock, stage: &str, method: &str, jobs: &[(RunConfig, PathBuf)], input: &UqStudyInput) -> Result<Vec<Run>> {
    let keys: Vec<String> = jobs.iter().map(|(rc, _)| hash(&[&rc.run_id(), &train::created_by()])).collect();
    let key = hash(&keys.iter().map(String::as_str).collect::<Vec<_>>());
    if jobs.iter().all(|(rc, dir)| same_run(dir, rc)) && clock.has(stage, &key) {
        clock.reuse(stage, &key);
        return jobs.iter().map(|(_, dir)| Run::open(dir)).collect();
    }
    clock.run(stage, method, &key, || {
        let todo: Vec<&(RunConfig, PathBuf)> = jobs.iter().filter(|(rc, dir)| !same_run(dir, rc)).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<Result<()>> = std::thread::scope(|sc| {
            let workers: Vec<_> = (0..threads.min(todo.len()))
                .map(|_| {
                    sc.spawn(|| {
                        let mut out = Ok(());
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((rc, dir)) = todo.get(i) else { break };
                            // No progress bars: several runs share the terminal.
                            let opts = TrainOptions { progress: false, force: true, base_dir: input.base_dir.clone(), memory_budget: None };
                            if let Err(e) = train::train_to_dir(rc, dir, &opts) {
                                out = Err(e);
                                break;
                            }
                        }
                        out
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(Error::Backend("a training thread panicked".into())))).collect()
        });
        results.into_iter().collect::<Result<Vec<()>>>()?;
        jobs.iter().map(|(_, dir)| Run::open(dir)).collect()
    })
}

fn with(rc: &RunConfig, lr: f64, steps: usize, seed: u64) -> RunConfig {
    let mut c = rc.clone();
    c.train.lr = lr;
    c.train.steps = steps;
    c.train.seed = seed;
    c
}

fn labels(t: &Targets) -> Result<&[usize]> {
    match t {
        Targets::Labels(y) => Ok(y),
        Targets::Values(_) => Err(Error::Config("the uncertainty study needs a classification dataset".into())),
    }
}

fn select(clock: &mut Clock, input: &UqStudyInput, data: &Dataset) -> Result<(Selection, PathBuf)> {
    let spec = &input.spec;
    let rc = &input.run_config;
    let val = data.validation.as_ref().ok_or_else(|| Error::Config("the uncertainty study selects lr and steps on a validation split; set data.val_per_class".into()))?;
    let y_val = labels(&val.y)?;
    let k = data.num_outputs;
    let last = *spec.steps.iter().max().expect("validated non-empty");
    let mut rows = Vec::new();
    let mut dirs = Vec::new();
    let jobs: Vec<(RunConfig, PathBuf)> = spec.lrs.iter().map(|&lr| (with(rc, lr, last, rc.train.seed), input.cache.join("select").join(format!("lr-{lr}-steps-{last}")))).collect();
    let lrs: Vec<String> = spec.lrs.iter().map(|lr| lr.to_string()).collect();
    let runs = cached_train_group(clock, &format!("selection runs lr = {}, {last} steps (trained side by side)", lrs.join(", ")), "shared", &jobs, input)?;
    for ((&lr, run), (_, dir)) in spec.lrs.iter().zip(runs).zip(jobs) {
        let log = io::Table::read_parquet(&run.dir.join("train_log.parquet"))?;
        let steps_col = log.i64("step").ok_or_else(|| Error::Data("train_log.parquet has no step column".into()))?.to_vec();
        let loss_col = log.f64("loss").ok_or_else(|| Error::Data("train_log.parquet has no loss column".into()))?.to_vec();
        for &s in &spec.steps {
            let w = run.load_step(s)?;
            let z = super::network_logits(&run.manifest.architecture, &w, Some(&run.load_step(0)?), &val.x)?;
            let p = super::metrics::softmax_rows(&z, k)?;
            let train_loss = steps_col.iter().position(|&v| v == s as i64).map_or(f64::NAN, |i| loss_col[i]);
            rows.push(SelectionRow { lr, steps: s, val_accuracy: super::accuracy(&p, y_val, k)?, val_nll: super::nll(&p, y_val, k)?, train_loss });
        }
        dirs.push(dir);
    }
    let mut best = 0;
    for (i, r) in rows.iter().enumerate() {
        if r.val_accuracy > rows[best].val_accuracy {
            best = i;
        }
    }
    let (lr, steps) = (rows[best].lr, rows[best].steps);
    let li = spec.lrs.iter().position(|&l| l == lr).expect("from the grid");
    Ok((Selection { rows, lr, steps, prefix_identical: None }, dirs[li].clone()))
}

// ---------------------------------------------------------------------------------------------
// Cached predictions
// ---------------------------------------------------------------------------------------------

/// Predictions of several methods in several settings, written as one safetensors file with
/// `{method}/{setting}/probs` `[N, K]` and `{method}/{setting}/ood_score` `[N]` arrays.
fn write_predictions(path: &Path, preds: &[MethodPrediction], k: usize, key: &str) -> Result<()> {
    let mut arrays = Vec::new();
    for p in preds {
        let n = p.probs.len() / k;
        arrays.push(NamedArray::f64(format!("{}/{}/probs", p.method, p.setting), vec![n, k], p.probs.clone()));
        if let Some(s) = &p.ood_score {
            arrays.push(NamedArray::f64(format!("{}/{}/ood_score", p.method, p.setting), vec![n], s.clone()));
        }
    }
    let meta = std::collections::HashMap::from([("key".to_string(), key.to_string())]);
    io::write_safetensors(path, &arrays, Some(meta))
}

fn read_predictions(path: &Path, methods: &[&str], settings: &[Setting], k: usize, key: &str) -> Option<Vec<MethodPrediction>> {
    let f = SafeFile::open(path).ok()?;
    if f.metadata().get("key").map(String::as_str) != Some(key) {
        return None;
    }
    let names = f.names();
    let mut out = Vec::new();
    for m in methods {
        for s in settings {
            let base = format!("{m}/{}", s.info.name);
            let (_, probs) = f.f64(&format!("{base}/probs"), Some(&[s.info.n, k])).ok()?;
            let score_name = format!("{base}/ood_score");
            let ood_score = if names.contains(&score_name) { Some(f.f64(&score_name, Some(&[s.info.n])).ok()?.1) } else { None };
            out.push(MethodPrediction { method: m.to_string(), setting: s.info.name.clone(), probs, ood_score });
        }
    }
    Some(out)
}

#[derive(Serialize, Deserialize)]
struct BuiltinCache {
    key: String,
    temperature: TemperatureFit,
    laplace: LaplaceSummary,
    seconds: Vec<(String, f64)>,
}

#[derive(Serialize, Deserialize)]
struct GpSettingCache {
    key: String,
    classes: usize,
    check: GramCheck,
    /// Ablations without a predictive here, with the reason.
    failed: Vec<(String, String)>,
    /// Per function-space Laplace curvature: the smallest posterior variance here and how many
    /// were clamped (the fit's report lists every setting, cached or not).
    #[serde(default)]
    fsl_min_variance: Vec<(String, f64, usize)>,
}

#[derive(Serialize, Deserialize)]
struct GpFitCache {
    key: String,
    fit: Option<KernelGpFit>,
    error: Option<String>,
}

/// The cache's JSON files hold every float as its bit pattern (`"f64:<16 hex digits>"`):
/// serde_json's default parser can be one ulp off, and a rerun must reproduce the report bit
/// for bit.
fn exact(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => Value::String(format!("f64:{:016x}", n.as_f64().expect("an f64 number").to_bits())),
        Value::Array(a) => Value::Array(a.into_iter().map(exact).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, exact(v))).collect()),
        other => other,
    }
}

fn inexact(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) if s.starts_with("f64:") => {
            u64::from_str_radix(&s[4..], 16).map_or(Value::String(s), |b| serde_json::Number::from_f64(f64::from_bits(b)).map_or(Value::Null, Value::Number))
        }
        Value::Array(a) => Value::Array(a.into_iter().map(inexact).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, inexact(v))).collect()),
        other => other,
    }
}

fn write_cache_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let v = serde_json::to_value(value).map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
    io::write_json(path, &exact(v))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    serde_json::from_value(inexact(v)).ok()
}

/// One setting of a kernel family: each method's predictive, the row Gram's check, the
/// ablations without a predictive there (method, reason) and the function-space Laplace fits'
/// smallest posterior variance there (curvature, variance, clamped).
type SettingResult = (BTreeMap<String, Predictive>, GramCheck, Vec<(String, String)>, Vec<(String, f64, usize)>);

/// What a kernel family produced: its methods' predictives, the fits, the row Grams' checks,
/// and the ablations that failed (method, error).
struct FamilyOutput {
    methods: Vec<ExternalMethod>,
    fits: Vec<(String, KernelGpFit)>,
    checks: Vec<GramCheck>,
    failed: Vec<(String, String)>,
    fsl: Vec<FslStudyFit>,
}

#[derive(Serialize, Deserialize)]
struct FslCache {
    key: String,
    fits: Vec<FslStudyFit>,
}

/// The validation split's inputs and labels (the function-space Laplace calibration's data).
fn data_validation(data: &Dataset) -> Result<(&[f64], &[usize])> {
    let v = data.validation.as_ref().ok_or_else(|| Error::Config("the benchmark needs a validation split".into()))?;
    Ok((&v.x, labels(&v.y)?))
}

/// A function-space Laplace fit of a family with its validation calibrations.
struct FslFitted {
    curvature: crate::gp::Curvature,
    fsl: crate::gp::FunctionalLaplace,
    /// δ by the validation grid (class-diagonal): the refitted approximation and the sweep.
    grid: Option<(crate::gp::FunctionalLaplace, Vec<(f64, f64)>)>,
    cal: Option<FslCalibrated>,
    min_variance: Vec<(String, f64, usize)>,
}

struct FslCalibrated {
    temperature: crate::gp::Calibration,
    calibration: crate::gp::Calibration,
}

impl FslFitted {
    fn report(&self, kernel: &str) -> FslStudyFit {
        let cal = self.cal.as_ref().expect("calibrated before the report");
        FslStudyFit {
            kernel: kernel.into(),
            fit: self.fsl.fit.clone(),
            temperature: cal.temperature.clone(),
            calibration: cal.calibration.clone(),
            grid: self.grid.as_ref().map(|(g, sweep)| (g.delta(), sweep.clone())),
            min_variance: self.min_variance.clone(),
        }
    }

    /// This curvature's methods at one setting's rows, and (smallest variance, clamped count).
    fn predict_setting(&self, fam: &KernelFamily, rows: &kernel_gp::RowGram, bench: &BenchmarkConfig) -> Result<(BTreeMap<String, Predictive>, (f64, usize))> {
        let r = crate::gp::FslRows { k_cross: &rows.k_cross, k_diag: &rows.k_test_diag, mean: &rows.network, p: rows.p };
        let pred = self.fsl.predict(&r)?;
        let cal = self.cal.as_ref().expect("calibrated before predicting");
        let trace = |post: &crate::gp::LogitPosterior, scale: f64| -> Vec<f64> { (0..post.p).map(|q| scale * (0..post.k).map(|c| post.cov[(q * post.k + c) * post.k + c]).sum::<f64>()).collect() };
        let mut out = BTreeMap::new();
        for (name, c, v) in fam.fsl_methods() {
            if c != self.curvature {
                continue;
            }
            let p = match v {
                FslVariant::Probit => Predictive { probs: pred.post.probit(1.0, 1.0), ood_score: Some(trace(&pred.post, 1.0)) },
                FslVariant::Mc => Predictive { probs: pred.post.mc_softmax(bench.mc_samples, bench.mc_seed)?, ood_score: Some(trace(&pred.post, 1.0)) },
                FslVariant::Temperature => Predictive { probs: pred.post.probit(cal.temperature.temperature, 1.0), ood_score: Some(trace(&pred.post, 1.0)) },
                FslVariant::TemperatureScale => Predictive {
                    probs: pred.post.probit(cal.calibration.temperature, cal.calibration.scale),
                    ood_score: Some(trace(&pred.post, cal.calibration.scale.max(f64::MIN_POSITIVE))),
                },
                FslVariant::Grid => {
                    let (g, _) = self.grid.as_ref().expect("the class-diagonal fit has its grid");
                    let gp = g.predict(&r)?;
                    Predictive { probs: gp.post.probit(1.0, 1.0), ood_score: Some(trace(&gp.post, 1.0)) }
                }
            };
            out.insert(name, p);
        }
        Ok((out, (pred.min_variance, pred.clamped)))
    }
}

/// The validation calibrations of every function-space Laplace fit of a family: T alone, (T, s),
/// and for the class-diagonal curvature δ by the validation grid.
/// The timing stage of a function-space Laplace fit.
fn fsl_fit_stage(kernel: &str, c: crate::gp::Curvature) -> String {
    format!("fsl-{kernel}-{c}: fit (eigendecompositions, δ by the evidence)")
}

/// The timing stage of a function-space Laplace validation calibration.
fn fsl_calibration_stage(kernel: &str, c: crate::gp::Curvature) -> String {
    format!("fsl-{kernel}-{c}: validation calibration (T; T and s; δ grid)")
}

fn calibrate_fsl(clock: &mut Clock, fam: &KernelFamily, fitted: &mut [FslFitted], vrows: &kernel_gp::RowGram, vlabels: &[usize], key: &str) -> Result<()> {
    let r = crate::gp::FslRows { k_cross: &vrows.k_cross, k_diag: &vrows.k_test_diag, mean: &vrows.network, p: vrows.p };
    for f in fitted.iter_mut() {
        let name = format!("fsl-{}-{}", fam.kernel, f.curvature);
        let (cal, grid, mins) = clock.run(&fsl_calibration_stage(&fam.kernel, f.curvature), &name, key, || {
            let pred = f.fsl.predict(&r)?;
            let temperature = crate::gp::functional::calibrate(&pred.post, vlabels, &[1.0])?;
            let calibration = crate::gp::functional::calibrate(&pred.post, vlabels, &crate::gp::functional::calibration_scales())?;
            let grid = if f.curvature == crate::gp::Curvature::ClassDiagonal {
                let mut g = f.fsl.clone();
                let sweep = g.grid_search(&r, vlabels, -4.0, 4.0, 100)?;
                Some((g, sweep))
            } else {
                None
            };
            Ok((FslCalibrated { temperature, calibration }, grid, (pred.min_variance, pred.clamped)))
        })?;
        f.cal = Some(cal);
        f.grid = grid;
        f.min_variance.push(("val".into(), mins.0, mins.1));
    }
    Ok(())
}

/// The GPs of a kernel family in every setting: fitted (when some setting is not cached), and
/// in each setting the kernel's row Gram, every GP's posterior and the Monte-Carlo predictives,
/// each setting cached. The family's first GP is the protocol's method: its errors end the
/// study; an ablation that fails (a symmetrised Gram that is not positive definite, a negative
/// posterior variance) is left out and reported.
#[allow(clippy::too_many_arguments)]
fn kernel_family(
    clock: &mut Clock,
    input: &UqStudyInput,
    data: &Dataset,
    fam: &KernelFamily,
    run: &Run,
    states: &[Params],
    settings: &[Setting],
    bench: &BenchmarkConfig,
) -> Result<FamilyOutput> {
    let dir = input.cache.join(format!("{}-gp", fam.kernel));
    io::create_dir_all(&dir)?;
    let val = if fam.fsl.is_empty() { (&[][..], &[][..]) } else { data_validation(data)? };
    let n = run.dataset.n_train();
    let fit_keys: Vec<String> = fam.gps.iter().map(|(_, g)| hash(&[&CACHE_VERSION.to_string(), &run.manifest.run_id, &run.manifest.created_by, &g.key()])).collect();
    let fit_stage = |name: &str| format!("{name}: training Gram ({n} × {n}) and GP fit");
    let netmean = fam.netmean.iter().map(|(a, b)| format!("{a}={b}")).collect::<Vec<_>>().join(",");
    let fsl_names = fam.fsl.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",");
    let fam_key = hash(&[&fit_keys.join(","), &netmean, &bench.mc_samples.to_string(), &bench.mc_seed.to_string(), &fsl_names]);
    let setting_key = |s: &Setting| hash(&[&fam_key, &s.info.name, &format!("{:016x}", fnv1a(&f64_bytes(&s.x)))]);
    let stage_of = |s: &Setting| format!("{} posteriors and MC softmax at `{}` ({} points)", fam.kernel.to_uppercase(), s.info.name, s.info.n);
    // Every setting's rows in one Gram computation (the training side of each step once).
    let grams_stage = format!("{} Gram at every setting ({} points, one computation)", fam.kernel.to_uppercase(), settings.iter().map(|s| s.info.n).sum::<usize>());
    let grams_key = hash(&settings.iter().map(setting_key).chain((!fam.fsl.is_empty()).then(|| format!("val:{:016x}", fnv1a(&f64_bytes(val.0))))).collect::<Vec<_>>().iter().map(String::as_str).collect::<Vec<_>>());
    let fsl_methods = fam.fsl_methods();
    let methods: Vec<String> = fam.gps.iter().map(|g| g.0.clone()).chain(fam.netmean.iter().map(|m| m.0.clone())).chain(fsl_methods.iter().map(|m| m.0.clone())).collect();
    let fsl_path = dir.join("fsl.fit.json");
    let cached_fits: Vec<Option<GpFitCache>> = fam
        .gps
        .iter()
        .zip(&fit_keys)
        .map(|((name, _), key)| read_json::<GpFitCache>(&dir.join(format!("{name}.fit.json"))).filter(|c| &c.key == key && clock.has(&fit_stage(name), key)))
        .collect();
    let cached = |s: &Setting| -> Option<SettingResult> {
        let key = setting_key(s);
        let c: GpSettingCache = read_json(&dir.join(format!("{}.json", s.info.name))).filter(|c: &GpSettingCache| c.key == key)?;
        let f = SafeFile::open(&dir.join(format!("{}.safetensors", s.info.name))).ok()?;
        if f.metadata().get("key") != Some(&key) || !clock.has(&stage_of(s), &key) {
            return None;
        }
        let (n, k) = (s.info.n, c.classes);
        let mut out = BTreeMap::new();
        for m in methods.iter().filter(|m| !c.failed.iter().any(|f| &f.0 == *m)) {
            let probs = f.f64(&format!("{m}/probs"), Some(&[n, k])).ok()?.1;
            let score = f.f64(&format!("{m}/ood_score"), Some(&[n])).ok()?.1;
            out.insert(m.clone(), Predictive { probs, ood_score: Some(score) });
        }
        Some((out, c.check, c.failed, c.fsl_min_variance))
    };
    let hits: Vec<_> = settings.iter().map(cached).collect();
    let cached_fsl: Option<Vec<FslStudyFit>> = if fam.fsl.is_empty() { Some(Vec::new()) } else { read_json::<FslCache>(&fsl_path).filter(|c| c.key == fam_key).map(|c| c.fits) };
    let mut fsl_fits: Vec<FslStudyFit> = Vec::new();
    let mut fitted_fsl: Vec<FslFitted> = Vec::new();
    let mut fits = Vec::new();
    let mut failed: Vec<(String, String)> = Vec::new();
    // The fitted GPs (None: its fit failed), when anything is computed.
    let mut gps: Vec<Option<KernelGp>> = Vec::new();
    if hits.iter().all(Option::is_some) && cached_fits.iter().all(Option::is_some) && cached_fsl.is_some() {
        fsl_fits = cached_fsl.expect("checked");
        for (((name, _), key), c) in fam.gps.iter().zip(&fit_keys).zip(cached_fits) {
            clock.reuse(&fit_stage(name), key);
            match c.expect("checked") {
                GpFitCache { fit: Some(f), .. } => fits.push((name.clone(), f)),
                GpFitCache { error, .. } => failed.push((name.clone(), error.unwrap_or_default())),
            }
        }
        // The function-space Laplace stages, in the order they ran (their timings stay in the
        // report).
        for c in &fam.fsl {
            let stage = fsl_fit_stage(&fam.kernel, *c);
            if clock.has(&stage, &fam_key) {
                clock.reuse(&stage, &fam_key);
            }
        }
    } else {
        // The protocol GP's training Gram, shared with the function-space Laplace fits.
        let mut shared_blocks: Option<kernel_gp::TrainBlocks> = None;
        for (i, ((name, spec), key)) in fam.gps.iter().zip(&fit_keys).enumerate() {
            let bar = crate::progress::Progress::new(input.progress, 1, &format!("{name} fit {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]"));
            let g = clock.run(&fit_stage(name), name, key, || {
                let g = if i == 0 {
                    kernel_gp::TrainBlocks::compute(run, states, spec, &|d, t| {
                        bar.set_length(t as u64);
                        bar.set_position(d as u64);
                    })
                    .and_then(|b| {
                        let g = KernelGp::fit_blocks(&b, spec);
                        shared_blocks = Some(b);
                        g
                    })
                } else {
                    KernelGp::fit(run, states, spec, &|d, t| {
                        bar.set_length(t as u64);
                        bar.set_position(d as u64);
                    })
                };
                match g {
                    Err(e) if i > 0 => Ok(Err(e.to_string())),
                    other => other.map(Ok),
                }
            })?;
            bar.finish_and_clear();
            match g {
                Ok(g) => {
                    write_cache_json(&dir.join(format!("{name}.fit.json")), &GpFitCache { key: key.clone(), fit: Some(g.fit.clone()), error: None })?;
                    fits.push((name.clone(), g.fit.clone()));
                    gps.push(Some(g));
                }
                Err(e) => {
                    clock.say(&format!("{name}: the ablation's fit failed: {e}"));
                    write_cache_json(&dir.join(format!("{name}.fit.json")), &GpFitCache { key: key.clone(), fit: None, error: Some(e.clone()) })?;
                    failed.push((name.clone(), e));
                    gps.push(None);
                }
            }
        }
        if !fam.fsl.is_empty() {
            let blocks = shared_blocks.take().ok_or_else(|| Error::Data(format!("{}: the training Gram for the function-space Laplace fits was not computed", fam.kernel)))?;
            let labels = labels(&run.dataset.y_train)?.to_vec();
            for &c in &fam.fsl {
                let name = format!("fsl-{}-{c}", fam.kernel);
                let fsl = clock.run(&fsl_fit_stage(&fam.kernel, c), &name, &fam_key, || {
                    let train = crate::gp::FslTrain { k_train: &blocks.k_train, logits: &blocks.network, bias: &blocks.bias, labels: &labels, m: blocks.m, k: blocks.k };
                    crate::gp::FunctionalLaplace::fit(&train, c, crate::gp::Prior::Evidence)
                })?;
                fitted_fsl.push(FslFitted { curvature: c, fsl, grid: None, cal: None, min_variance: Vec::new() });
            }
        }
        drop(shared_blocks);
    }
    let todo: Vec<&Setting> = settings.iter().zip(&hits).filter(|(_, h)| h.is_none()).map(|(s, _)| s).collect();
    let mut grams: BTreeMap<String, kernel_gp::RowGram> = BTreeMap::new();
    if todo.is_empty() {
        if clock.has(&grams_stage, &grams_key) {
            clock.reuse(&grams_stage, &grams_key);
        }
        for c in &fam.fsl {
            let stage = fsl_calibration_stage(&fam.kernel, *c);
            if clock.has(&stage, &fam_key) {
                clock.reuse(&stage, &fam_key);
            }
        }
    } else {
        // Always over every setting, so that a setting recomputed alone (a lost cache file) gets
        // the rows of the same computation, bit for bit.
        let total: usize = settings.iter().map(|s| s.info.n).sum();
        let bar = crate::progress::Progress::new(input.progress, 1, &format!("{} {total} rows {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]", fam.kernel));
        let mut sets: Vec<(&[f64], &str)> = settings.iter().map(|s| (s.x.as_slice(), s.info.name.as_str())).collect();
        if !fam.fsl.is_empty() {
            // The validation split's rows, for the function-space Laplace calibration.
            sets.push((val.0, "val"));
        }
        let mut gs = clock.run(&grams_stage, &fam.gps[0].0, &grams_key, || {
            kernel_gp::row_grams(run, states, fam.kind, fam.rule, crate::kernel::Outputs::Logits, fam.window, &sets, &|d, t| {
                bar.set_length(t as u64);
                bar.set_position(d as u64);
            })
        })?;
        bar.finish_and_clear();
        if !fam.fsl.is_empty() {
            let vrows = gs.pop().expect("the validation rows were computed last");
            calibrate_fsl(clock, fam, &mut fitted_fsl, &vrows, val.1, &fam_key)?;
            fsl_fits = fitted_fsl.iter().map(|f| f.report(&fam.kernel)).collect();
        }
        grams.extend(settings.iter().map(|s| s.info.name.clone()).zip(gs).filter(|(name, _)| todo.iter().any(|t| &t.info.name == name)));
    }
    let mut out: Vec<ExternalMethod> = methods.iter().map(|m| ExternalMethod { name: m.clone(), settings: BTreeMap::new() }).collect();
    let mut checks = Vec::new();
    for (s, hit) in settings.iter().zip(hits) {
        let (stage, key) = (stage_of(s), setting_key(s));
        // A cached setting comes from the same (deterministic) fits: reused even when the fits
        // were recomputed for another setting.
        let (preds, check, errs) = match hit {
            Some((preds, check, errs, mins)) => {
                clock.reuse(&stage, &key);
                for f in &mut fitted_fsl {
                    if let Some((_, v, n)) = mins.iter().find(|m| m.0 == f.curvature.to_string()) {
                        f.min_variance.push((s.info.name.clone(), *v, *n));
                    }
                }
                (preds, check, errs)
            }
            None => {
                let rows = grams.remove(&s.info.name).expect("computed above for every setting not cached");
                let r = clock.run(&stage, &fam.gps[0].0, &key, || {
                    let mut errs: Vec<(String, String)> = Vec::new();
                    let mut posts: BTreeMap<String, Posterior> = BTreeMap::new();
                    for (i, ((name, _), g)) in fam.gps.iter().zip(&gps).enumerate() {
                        let Some(g) = g else {
                            errs.push((name.clone(), "the fit failed".into()));
                            continue;
                        };
                        match g.posterior(&rows) {
                            Ok(p) => {
                                posts.insert(name.clone(), p);
                            }
                            Err(e) if i > 0 => errs.push((name.clone(), e.to_string())),
                            Err(e) => return Err(e),
                        }
                    }
                    let mut preds = BTreeMap::new();
                    let mut arrays = Vec::new();
                    let k = posts[&fam.gps[0].0].k;
                    for (name, post) in &posts {
                        arrays.push(NamedArray::f64(format!("{name}/mean"), vec![post.p, post.k], post.mean.clone()));
                        arrays.push(NamedArray::f64(format!("{name}/var"), vec![post.p, post.k], post.var.clone()));
                        preds.insert(name.clone(), Predictive::from_gp(post, bench.mc_samples, bench.mc_seed)?);
                    }
                    for (m, from) in &fam.netmean {
                        match posts.get(from) {
                            Some(p) => {
                                let post = Posterior { mean: rows.network.clone(), ..p.clone() };
                                preds.insert(m.clone(), Predictive::from_gp(&post, bench.mc_samples, bench.mc_seed)?);
                            }
                            None => errs.push((m.clone(), format!("{from} failed"))),
                        }
                    }
                    for f in &mut fitted_fsl {
                        let (fam_fsl, mins) = f.predict_setting(fam, &rows, bench)?;
                        f.min_variance.push((s.info.name.clone(), mins.0, mins.1));
                        preds.extend(fam_fsl);
                    }
                    for (m, p) in &preds {
                        arrays.push(NamedArray::f64(format!("{m}/probs"), vec![rows.p, k], p.probs.clone()));
                        arrays.push(NamedArray::f64(format!("{m}/ood_score"), vec![rows.p], p.ood_score.clone().unwrap_or_default()));
                    }
                    let meta = std::collections::HashMap::from([("key".to_string(), key.clone())]);
                    io::write_safetensors(&dir.join(format!("{}.safetensors", s.info.name)), &arrays, Some(meta))?;
                    let fsl_min_variance = fitted_fsl.iter().filter_map(|f| f.min_variance.last().map(|m| (f.curvature.to_string(), m.1, m.2))).collect();
                    write_cache_json(&dir.join(format!("{}.json", s.info.name)), &GpSettingCache { key: key.clone(), classes: k, check: rows.check.clone(), failed: errs.clone(), fsl_min_variance })?;
                    Ok((preds, rows.check, errs))
                })?;
                r
            }
        };
        for (m, e) in errs {
            if !failed.iter().any(|f| f.0 == m) {
                clock.say(&format!("{m} at `{}`: left out: {e}", s.info.name));
                failed.push((m, format!("at `{}`: {e}", s.info.name)));
            }
        }
        for e in out.iter_mut() {
            if let Some(p) = preds.get(&e.name) {
                e.settings.insert(s.info.name.clone(), p.clone());
            }
        }
        checks.push(check);
    }
    if !fitted_fsl.is_empty() {
        fsl_fits = fitted_fsl.iter().map(|f| f.report(&fam.kernel)).collect();
        write_cache_json(&fsl_path, &FslCache { key: fam_key.clone(), fits: fsl_fits.clone() })?;
    }
    // A method that failed anywhere is left out everywhere (the metrics need every setting).
    out.retain(|e| !failed.iter().any(|f| f.0 == e.name));
    Ok(FamilyOutput { methods: out, fits, checks, failed, fsl: fsl_fits })
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------

/// Reads `predictions.parquet` back from `dir`, scores it again ([`super::report::score`]) and
/// compares with `results.metrics`: the number of values and the largest difference (infinite
/// values must match exactly; NaN nowhere).
fn rescore(dir: &Path, results: &UqResults) -> Result<(usize, f64)> {
    let t = io::Table::read_parquet(&dir.join("predictions.parquet"))?;
    let col = |name: &str| -> Result<Vec<String>> {
        match t.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c) {
            Some(io::Column::Str(v)) => Ok(v.clone()),
            _ => Err(Error::Data(format!("predictions.parquet has no string column {name}"))),
        }
    };
    let (method, setting) = (col("method")?, col("setting")?);
    let k = results.k;
    let probs: Vec<&[f64]> = (0..k).map(|c| t.f64(&format!("p{c}")).ok_or_else(|| Error::Data(format!("predictions.parquet has no p{c}")))).collect::<Result<_>>()?;
    let score = t.f64("ood_score").ok_or_else(|| Error::Data("predictions.parquet has no ood_score".into()))?;
    let mut preds: Vec<MethodPrediction> = Vec::new();
    for i in 0..t.rows() {
        if preds.last().is_none_or(|p| p.method != method[i] || p.setting != setting[i]) {
            preds.push(MethodPrediction { method: method[i].clone(), setting: setting[i].clone(), probs: Vec::new(), ood_score: Some(Vec::new()) });
        }
        let p = preds.last_mut().expect("pushed");
        p.probs.extend((0..k).map(|c| probs[c][i]));
        if let Some(s) = &mut p.ood_score {
            s.push(score[i]);
        }
    }
    for p in &mut preds {
        if p.ood_score.as_ref().is_some_and(|s| s.iter().all(|v| v.is_nan())) {
            p.ood_score = None;
        }
    }
    let again = super::report::score(k, &results.settings, &preds)?;
    if again.len() != results.metrics.len() {
        return Err(Error::Data(format!("re-scoring gave {} metric values, not {}", again.len(), results.metrics.len())));
    }
    let mut worst = 0.0f64;
    for (a, b) in again.iter().zip(&results.metrics) {
        if (a.method.as_str(), a.setting.as_str(), a.metric) != (b.method.as_str(), b.setting.as_str(), b.metric) {
            return Err(Error::Data(format!("re-scoring: {}/{} where {}/{} was expected", a.method, a.setting, b.method, b.setting)));
        }
        let d = if a.value == b.value { 0.0 } else { (a.value - b.value).abs() };
        worst = if d.is_nan() { f64::NAN } else { worst.max(d) };
    }
    Ok((again.len(), worst))
}

/// Runs the study (module docs) and writes its report.
pub fn run(input: &UqStudyInput) -> Result<UqStudyOutcome> {
    let start = Instant::now();
    let spec = &input.spec;
    spec.validate(&input.run_config)?;
    io::create_dir_all(&input.cache)?;
    let mut clock = Clock::open(&input.cache, input.progress);
    let data = input.run_config.data.load(&input.base_dir)?;
    let k = data.num_outputs;

    // 1. Selection and the network under test.
    let (mut selection, select_dir) = select(&mut clock, input, &data)?;
    let seed = input.run_config.train.seed;
    let chosen = with(&input.run_config, selection.lr, selection.steps, seed);
    let last = *spec.steps.iter().max().expect("validated");
    let run = if selection.steps == last {
        // The selection run itself.
        Run::open(&select_dir)?
    } else {
        let run = cached_train(&mut clock, &format!("network under test (lr = {}, {} steps)", selection.lr, selection.steps), "shared", &chosen, &input.cache.join("run"), input)?;
        let sel = Run::open(&select_dir)?;
        selection.prefix_identical = Some(sel.load_step(selection.steps)? == run.load_step(selection.steps)?);
        run
    };
    if run.manifest.run_id != chosen.run_id() {
        return Err(Error::Data(format!("the network under test has run id {}, not the chosen configuration's {}", run.manifest.run_id, chosen.run_id())));
    }
    if run.dataset.x_train != data.x_train || run.dataset.x_test != data.x_test {
        return Err(Error::Data("the trained run's data differ from the study's data".into()));
    }
    let states = run.load_all()?;
    let (init, last_w) = (states[0].clone(), states[states.len() - 1].clone());
    let arch = run.manifest.architecture.clone();

    // 2. The ensemble: the network itself for its seed, the others trained.
    let others: Vec<u64> = spec.ensemble_seeds.iter().copied().filter(|&s| s != seed).collect();
    let jobs: Vec<(RunConfig, PathBuf)> = others.iter().map(|&s| (with(&chosen, selection.lr, selection.steps, s), input.cache.join("ensemble").join(format!("seed-{s}")))).collect();
    let seeds: Vec<String> = others.iter().map(u64::to_string).collect();
    let trained = if jobs.is_empty() { Vec::new() } else { cached_train_group(&mut clock, &format!("ensemble members seeds {} (trained side by side)", seeds.join(", ")), "ensemble", &jobs, input)? };
    let mut trained = others.iter().copied().zip(trained).collect::<Vec<_>>().into_iter();
    let mut members = Vec::new();
    for &s in &spec.ensemble_seeds {
        if s == seed {
            members.push(EnsembleMember { seed: s, dir: run.dir.clone(), reused: true, arch: arch.clone(), init: init.clone(), last: last_w.clone() });
            continue;
        }
        let (ts, r) = trained.next().expect("one trained run per other seed");
        debug_assert_eq!(ts, s);
        let (i0, iw) = (r.load_step(0)?, r.load_step(r.manifest.steps)?);
        members.push(EnsembleMember { seed: s, dir: r.dir.clone(), reused: true, arch: r.manifest.architecture.clone(), init: i0, last: iw });
    }
    let ensemble = Ensemble { members };

    // 3. Settings and the built-in methods (cached with their seconds).
    let settings = super::settings(&data, &spec.benchmark)?;
    let bench_json = serde_json::to_string(&spec.benchmark).map_err(|e| Error::Data(format!("benchmark config: {e}")))?;
    let member_ids: Vec<String> = ensemble.members.iter().map(|m| format!("{}:{}", m.seed, crate::trajectory::read_manifest(&m.dir).map(|x| x.run_id).unwrap_or_default())).collect();
    let builtin_key = hash(&[&CACHE_VERSION.to_string(), &run.manifest.run_id, &run.manifest.created_by, &bench_json, &member_ids.join(",")]);
    let bdir = input.cache.join("builtin");
    io::create_dir_all(&bdir)?;
    let methods = ["map", "temperature", "laplace", "ensemble"];
    let cached_builtin = read_json::<BuiltinCache>(&bdir.join("builtin.json"))
        .filter(|c| c.key == builtin_key)
        .and_then(|c| read_predictions(&bdir.join("builtin.safetensors"), &methods, &settings, k, &builtin_key).map(|p| (c, p)));
    let net = Network { arch: &arch, params: &last_w, init: Some(&init) };
    let stage_of = |m: &str| format!("{m}: fit and predict");
    let (temperature, laplace, mut predictions) = match cached_builtin {
        Some((c, p)) if methods.iter().all(|m| clock.has(&stage_of(m), &builtin_key)) => {
            methods.iter().for_each(|m| clock.reuse(&stage_of(m), &builtin_key));
            (c.temperature, c.laplace, p)
        }
        _ => {
            clock.say("map, temperature, laplace, ensemble: fit and predict ...");
            let l0 = load_average();
            let b = super::builtin_methods(net, &data, Some(&ensemble), &settings, &spec.benchmark)?;
            let l1 = load_average();
            for (m, secs) in &b.seconds {
                let stage = stage_of(m);
                clock.say(&format!("{stage}: {secs:.1} s"));
                clock.record(&format!("{stage}#{builtin_key}"), StageTiming { stage, method: m.clone(), seconds: *secs, load: [l0, l1] })?;
            }
            write_predictions(&bdir.join("builtin.safetensors"), &b.predictions, k, &builtin_key)?;
            write_cache_json(&bdir.join("builtin.json"), &BuiltinCache { key: builtin_key.clone(), temperature: b.temperature, laplace: b.laplace.clone(), seconds: b.seconds.clone() })?;
            (b.temperature, b.laplace, b.predictions)
        }
    };

    // 4. The kernel GPs.
    let mut kernel_gps = Vec::new();
    let mut fsl_fits = Vec::new();
    let mut row_grams = Vec::new();
    let mut external = Vec::new();
    let mut failed = Vec::new();
    for fam in spec.kernel_families()? {
        let o = kernel_family(&mut clock, input, &data, &fam, &run, &states, &settings, &spec.benchmark)?;
        external.extend(o.methods);
        kernel_gps.extend(o.fits);
        fsl_fits.extend(o.fsl);
        row_grams.push((fam.kernel.to_string(), o.checks));
        failed.extend(o.failed);
    }
    let infos: Vec<_> = settings.iter().map(|s| s.info.clone()).collect();
    super::push_external(&mut predictions, &infos, &external)?;
    let results = super::results(k, infos, predictions, Some(temperature), Some(laplace), &spec.benchmark)?;

    // 5. The report.
    let y_test = labels(&data.y_test)?;
    let ens_acc = ensemble
        .members
        .iter()
        .map(|m| {
            let z = m.logits(&data.x_test)?;
            Ok((m.seed, crate::trajectory::read_manifest(&m.dir)?.run_id, super::accuracy(&super::metrics::softmax_rows(&z, k)?, y_test, k)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let log = io::Table::read_parquet(&run.dir.join("train_log.parquet"))?;
    let lastf = |n: &str| log.f64(n).and_then(|v| v.last().copied()).unwrap_or(f64::NAN);
    let report = UqStudyReport {
        name: input.name.clone(),
        description: input.description.clone(),
        study_file: input.study_file.clone(),
        text: input.text.clone(),
        data_description: data.description.clone(),
        sizes: [data.n_train(), data.n_val(), data.n_test()],
        network: (format!("{:?}", arch.body), run.manifest.num_params, run.manifest.run_id.clone()),
        train_fit: (lastf("accuracy"), lastf("loss")),
        selection,
        ensemble: ens_acc,
        results,
        kernel_gps,
        fsl: fsl_fits,
        row_grams,
        failed,
        stages: clock.order.iter().map(|(t, _)| t.clone()).collect(),
        mc: (spec.benchmark.mc_samples, spec.benchmark.mc_seed),
        notes: spec.notes.clone(),
        rescored: (0, f64::NAN),
    };
    let staged = StagedDir::new(&input.out, true)?;
    let mut report = report;
    report.results.write(staged.path())?;
    report.rescored = rescore(staged.path(), &report.results)?;
    io::write_json(&staged.path().join("selection.json"), &report.selection)?;
    io::write_json(
        &staged.path().join("gp_fits.json"),
        &serde_json::json!({
            "fits": report.kernel_gps.iter().map(|(n, f)| serde_json::json!({ "method": n, "fit": f })).collect::<Vec<_>>(),
            "functional_laplace": report.fsl,
            "row_grams": report.row_grams.iter().map(|(k, c)| serde_json::json!({ "kernel": k, "checks": c })).collect::<Vec<_>>(),
        }),
    )?;
    super::summary::charts(&report, &settings, spec.disagreement_images, &staged.path().join("charts"))?;
    io::write_atomic(&staged.path().join("summary.md"), super::summary::summary_markdown(&report).as_bytes())?;
    io::write_atomic(&staged.path().join("timings.md"), super::summary::timings_markdown(&report).as_bytes())?;
    io::write_json(&staged.path().join("timings.json"), &report.stages)?;
    io::write_atomic(&staged.path().join("study.toml"), input.text.as_bytes())?;
    let out = staged.commit()?;
    Ok(UqStudyOutcome { out, stages: clock.order, seconds: start.elapsed().as_secs_f64() })
}
