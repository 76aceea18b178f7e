//! The benchmark itself: a typed [`AttributionSpec`], [`run`] (every method on one recorded run,
//! scored by LDS on the same subsets, plus noisy-label detection), the [`BenchmarkResult`] and its
//! tables ([`write_tables`]).
//!
//! Methods (each returns `τ [P, M]` for the output `log p_{y_x}(x)` at the `P` test points):
//! - `epk`: the EPK kernel machine's term of each training point (exact: `b + Σ_i τ = f`);
//! - `tracin`: the DPK's (every checkpoint at the step's start, TracIn with all checkpoints);
//! - `grad-dot`: `⟨∇ log p_{y_x}(x), ∇ log p_{y_i}(x_i)⟩` at `w_N`;
//! - `trak-1`, `trak-10` (TRAK's Algorithm 1 with 1 model and an ensemble): projected features
//!   of the log-odds `log(p/(1 − p))`, `τ = φ(x)(ΦᵀΦ + λI)⁻¹Φᵀ diag(1 − p_i)`, the ensemble
//!   averaging `φ(ΦᵀΦ + λI)⁻¹Φᵀ` over models and `1 − p_i` separately; `trak-1-full`,
//!   `trak-10-full` the unprojected form `g(x)ᵀGᵀ(GGᵀ + λI)⁻¹ diag(1 − p_i)`. Kept: the model
//!   output, the projection, the kernel-regression formula, the `1 − p` reweighting, ensemble
//!   averaging; dropped: the soft-thresholding (sparsification) step, and the ensemble is trained
//!   on the full set (as the issue asks), not on random subsets.
//! - `epk-rep`, `dpk-rep`: the same kernel regression with the EPK (rows integrated on the test
//!   side) or the DPK in place of TRAK's NTK: `k(x, x_i) = G(x, x_i)[y_x, y_i]`,
//!   `K(x_i, x_j) = Σ_s ⟨∇ log p_{y_i}(x_i; w_s), ∇ log p_{y_j}(x_j; w_s)⟩` (the EPK's train
//!   side), `τ = k(x, X)(K + λI)⁻¹ diag(1 − p_i)`;
//! - `if-ggn`: influence functions with the damped GGN ([`super::influence`]).
//!
//! Every ridge and damping is relative (to the Gram's mean eigenvalue; to `tr(H)/n_z`) and is
//! chosen by mean LDS on the tuning subsets only; every reported LDS is on the evaluation subsets.

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::cache::Stages;
use super::grads::{directions, Direction, Projection, ScalarGrads};
use super::influence::{ggn_factor, FunctionSpace, Ggn};
use super::lds::{auc, bootstrap_mean, lds_per_point, Interval};
use super::mlp::{outputs_at_labels, Mlp1};
use super::pathattr::{path_gram, path_rows, PathRows};
use super::retrain::{gather, gd};
use super::ridge::Ridge;
use super::subsets::{flip_labels, Subsets};
use crate::api::Trained;
use crate::error::{Error, Result};
use crate::io::{Column, Table};
use crate::kernel::KernelKind;

/// What the benchmark runs (the `[attribution]` section of a study).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttributionSpec {
    /// Number of random training subsets (50).
    pub subsets: usize,
    /// Fraction of the training set in each (0.5).
    pub fraction: f64,
    /// How many of the subsets (the first) tune hyper-parameters (10).
    pub tuning_subsets: usize,
    /// Seed of the subsets (0).
    pub subset_seed: u64,
    /// The first this many test points of the run (500).
    pub test_points: usize,
    /// TRAK's projection dimensions ([256, 512, 1024, 2048]).
    pub trak_dims: Vec<usize>,
    /// TRAK's relative ridges `λ / (tr K / M)` (0 = none: the pseudo-inverse).
    pub trak_ridges: Vec<f64>,
    /// The path-kernel representers' relative ridges.
    pub representer_ridges: Vec<f64>,
    /// Influence functions' relative dampings `λ / (tr H / n_z)`.
    pub if_dampings: Vec<f64>,
    /// Seeds of TRAK's ensemble (0..10), each trained on the full training set.
    pub ensemble_seeds: Vec<u64>,
    /// Seed of TRAK's Gaussian projection.
    pub projection_seed: u64,
    /// Fraction of training labels flipped for noisy-label detection (0.1; 0 skips it).
    pub noise_fraction: f64,
    /// Seed of the flips.
    pub noise_seed: u64,
    /// Bootstrap resamples of the test points (1000).
    pub bootstrap: usize,
    /// Bootstrap seed.
    pub bootstrap_seed: u64,
    /// Kernel rows computed at once (memory: `chunk·M·K²` numbers).
    pub chunk_rows: usize,
    /// Test points on which CG (at the chosen damping) is compared with the direct solve.
    pub cg_check_points: usize,
    /// Relative tolerance of the GGN factor's row truncation ([`FunctionSpace::apply`]; 0 = exact).
    pub ggn_tol: f64,
}

impl Default for AttributionSpec {
    fn default() -> Self {
        AttributionSpec {
            subsets: 50,
            fraction: 0.5,
            tuning_subsets: 10,
            subset_seed: 0,
            test_points: 500,
            trak_dims: vec![256, 512, 1024, 2048],
            trak_ridges: vec![0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0],
            representer_ridges: vec![1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0],
            if_dampings: vec![1.0, 1e-1, 1e-2, 1e-3],
            ensemble_seeds: (0..10).collect(),
            projection_seed: 0,
            noise_fraction: 0.1,
            noise_seed: 0,
            bootstrap: 1000,
            bootstrap_seed: 0,
            chunk_rows: 100,
            cg_check_points: 3,
            ggn_tol: 1e-3,
        }
    }
}

/// One point of a method's sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Method name.
    pub method: String,
    /// The setting, e.g. `d=512 λ=1e-3`.
    pub setting: String,
    /// Projection dimension, when the method has one.
    pub dim: Option<usize>,
    /// Relative ridge or damping, when the method has one.
    pub ridge: Option<f64>,
    /// Mean LDS on the tuning subsets (log-probability).
    pub tune: f64,
    /// Mean LDS on the evaluation subsets (log-probability).
    pub eval: f64,
    /// Mean LDS on the evaluation subsets against the retrained logit margin.
    pub eval_margin: f64,
}

/// One method's result at its chosen setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MethodResult {
    /// Method name.
    pub method: String,
    /// Trained models it uses.
    pub models: usize,
    /// The setting chosen on the tuning subsets.
    pub chosen: String,
    /// Mean LDS on the tuning subsets at that setting.
    pub tune: f64,
    /// LDS on the evaluation subsets (log-probability): mean and bootstrap 95 % interval.
    pub lds: Interval,
    /// The same against the retrained logit margin.
    pub lds_margin: Interval,
    /// Seconds to compute its attributions over the whole sweep (shared retraining excluded;
    /// the ensemble's training is in [`BenchmarkResult::timings`]).
    pub seconds: f64,
    /// Every setting tried.
    pub sweep: Vec<SweepPoint>,
    /// `τ [P, M]` at the chosen setting (not serialised; [`write_tables`] writes it to
    /// `tau.safetensors`).
    #[serde(skip)]
    pub tau: Vec<f64>,
}

/// Noisy-label detection by self-attribution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoisyResult {
    /// Method name (`loss` is the network's own loss, for context).
    pub method: String,
    /// The setting used (each method's LDS choice).
    pub setting: String,
    /// AUC of the self-attribution at flagging the flipped labels.
    pub auc: f64,
}

/// Exactness and agreement checks made during the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checks {
    /// `max |b + Σ_i τ_EPK − log p_y|` over the test points, and the largest `|log p_y|`.
    pub epk_max_residual: f64,
    /// The scale of that residual.
    pub epk_max_output: f64,
    /// The same for the DPK (not an exact machine: its residual is the DPK's error).
    pub dpk_max_residual: f64,
    /// Largest relative difference between the fast retrainer's seed-0 network on the full set
    /// and the recorded run's `w_N` (dfdx), when seed 0 is in the ensemble.
    pub retrain_vs_run: Option<f64>,
    /// Factor rows `n_z` of the GGN.
    pub ggn_rank: usize,
    /// CG at the chosen damping on `cg_check_points` test points: the largest iteration count,
    /// the largest final relative residual and the largest `|τ_CG − τ_direct| / max|τ_direct|`.
    pub cg: Option<(usize, f64, f64)>,
    /// Unused (kept for the result format): the noisy run's EPK self-kernel comes from the
    /// class-diagonal layout, which has no machine to check.
    pub noisy_epk_max_residual: Option<f64>,
}

/// Everything [`run`] measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchmarkResult {
    /// The spec it ran.
    pub spec: AttributionSpec,
    /// The run's id.
    pub run_id: String,
    /// `(M, P, K)`, learning rate and steps.
    pub shape: (usize, usize, usize),
    /// Learning rate ε.
    pub lr: f64,
    /// Steps N.
    pub steps: usize,
    /// The subsets (recorded).
    pub subsets: Subsets,
    /// Per method, at its chosen setting, with its sweep.
    pub methods: Vec<MethodResult>,
    /// Noisy-label detection AUCs.
    pub noisy: Vec<NoisyResult>,
    /// Retrained `log p_y` and logit margins at the test points, `[S, P]` each (not serialised;
    /// written to `retrained.safetensors`).
    #[serde(skip)]
    pub retrained: (Vec<f64>, Vec<f64>),
    /// Checks.
    pub checks: Checks,
    /// `(stage, seconds)` of the shared stages.
    pub timings: Vec<(String, f64)>,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
}

/// Retrained outputs at the test points. # Shapes `[S, P]` each.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Retrained {
    logp: Vec<f64>,
    margin: Vec<f64>,
    seconds: f64,
}

/// The shared evaluation: subsets, retrained outputs, bootstrap settings.
struct Scorer<'a> {
    subsets: &'a Subsets,
    retrained: &'a Retrained,
    m: usize,
    spec: &'a AttributionSpec,
}

impl Scorer<'_> {
    fn point(&self, method: &str, setting: String, dim: Option<usize>, ridge: Option<f64>, tau: &[f64]) -> Result<(SweepPoint, Vec<f64>, Vec<f64>)> {
        let t = lds_per_point(tau, self.m, &self.subsets.members, &self.retrained.logp, &self.subsets.tuning_ids())?;
        let e = lds_per_point(tau, self.m, &self.subsets.members, &self.retrained.logp, &self.subsets.evaluation_ids())?;
        let em = lds_per_point(tau, self.m, &self.subsets.members, &self.retrained.margin, &self.subsets.evaluation_ids())?;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        Ok((SweepPoint { method: method.into(), setting, dim, ridge, tune: mean(&t), eval: mean(&e), eval_margin: mean(&em) }, e, em))
    }
}

/// Accumulates a method's sweep and keeps the per-point LDS of its best tuning setting.
struct Sweep {
    method: String,
    models: usize,
    points: Vec<SweepPoint>,
    best: Option<(f64, String, Vec<f64>, Vec<f64>, Vec<f64>)>,
    start: Instant,
}

impl Sweep {
    fn new(method: &str, models: usize) -> Sweep {
        Sweep { method: method.into(), models, points: vec![], best: None, start: Instant::now() }
    }
    fn add(&mut self, sc: &Scorer, setting: String, dim: Option<usize>, ridge: Option<f64>, tau: &[f64]) -> Result<()> {
        let (pt, e, em) = sc.point(&self.method, setting.clone(), dim, ridge, tau)?;
        if self.best.as_ref().is_none_or(|b| pt.tune > b.0) {
            self.best = Some((pt.tune, setting, e, em, tau.to_vec()));
        }
        self.points.push(pt);
        Ok(())
    }
    fn finish(self, sc: &Scorer, extra_seconds: f64) -> MethodResult {
        let (tune, chosen, e, em, tau) = self.best.expect("a sweep has at least one point");
        MethodResult {
            method: self.method,
            models: self.models,
            chosen,
            tune,
            lds: bootstrap_mean(&e, sc.spec.bootstrap, sc.spec.bootstrap_seed),
            lds_margin: bootstrap_mean(&em, sc.spec.bootstrap, sc.spec.bootstrap_seed),
            seconds: self.start.elapsed().as_secs_f64() + extra_seconds,
            sweep: self.points,
            tau,
        }
    }
}

/// One line of a method's result, for progress logs.
fn line(r: &MethodResult) -> String {
    format!("{}: LDS {} (margin {}) at {} [tune {:.3}], {:.1} s", r.method, r.lds, r.lds_margin, r.chosen, r.tune, r.seconds)
}

fn fmt_g(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{v:e}")
    }
}

/// `τ[:, i] *= q[i]`. # Shapes `τ [P, M]`, `q [M]`.
fn scale_columns(tau: &mut [f64], q: &[f64]) {
    let m = q.len();
    tau.iter_mut().enumerate().for_each(|(j, v)| *v *= q[j % m]);
}

/// `1 − p_{y_i}(x_i)`, as `Σ_{c≠y} p_c`. # Shapes `[M]`.
fn one_minus_p(logp: &[f64], labels: &[usize], k: usize) -> Vec<f64> {
    labels.iter().enumerate().map(|(i, &y)| (0..k).filter(|&c| c != y).map(|c| logp[i * k + c].exp()).sum()).collect()
}

/// Removes JSON nulls (TOML has none) from a configuration value.
fn strip_nulls(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(o) => serde_json::Value::Object(o.iter().filter(|(_, x)| !x.is_null()).map(|(k, x)| (k.clone(), strip_nulls(x))).collect()),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(strip_nulls).collect()),
        x => x.clone(),
    }
}

/// The run retrained (with the crate's dfdx trainer, recording every state) on its own
/// training set with `labels` in place of its labels, into `dir`.
fn train_relabelled(net: &Trained, labels: &[usize], dir: &Path) -> Result<Trained> {
    let ds = &net.run().dataset;
    let d = ds.dim;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let data = dir.join("noisy-data.safetensors");
    let test_labels = ds.test_labels()?;
    crate::io::write_safetensors(
        &data,
        &[
            crate::io::NamedArray::f64("x_train", vec![ds.n_train(), d], ds.x_train.clone()),
            crate::io::NamedArray::i64("y_train", vec![labels.len()], labels.iter().map(|&y| y as i64).collect()),
            crate::io::NamedArray::f64("x_test", vec![test_labels.len(), d], ds.x_test.clone()),
            crate::io::NamedArray::i64("y_test", vec![test_labels.len()], test_labels.iter().map(|&y| y as i64).collect()),
        ],
        None,
    )?;
    let mut cfg = strip_nulls(&net.run().manifest.config);
    let abs = std::fs::canonicalize(&data).map_err(|e| Error::io(&data, e))?;
    cfg["data"] = serde_json::json!({ "kind": "arrays", "path": abs.to_string_lossy() });
    let toml_value = toml::Value::try_from(&cfg).map_err(|e| Error::Config(format!("noisy run configuration: {e}")))?;
    let text = toml::to_string(&toml_value).map_err(|e| Error::Config(format!("noisy run configuration: {e}")))?;
    let run_dir = dir.join("run");
    if let Ok(t) = Trained::open(&run_dir) {
        if t.run().dataset.train_labels().ok() == Some(labels) && t.states().len() == net.states().len() && t.states()[0] == net.states()[0] {
            return Ok(t);
        }
    }
    Trained::train_toml(&text, &run_dir)
}

/// Runs the benchmark on `net` (a one-hidden-layer ReLU MLP trained by full-batch GD on mean
/// cross-entropy): retrains on every subset, computes every method's attributions over its
/// sweep, scores them, and (when `noise_fraction > 0`) trains the noisy-label run in
/// `work_dir/noisy` and scores self-attributions. `log` receives progress lines.
///
/// Errors: a run of another architecture or optimizer, a spec that asks for more test points
/// than the run has, and the errors of every stage.
pub fn run<C: Stages>(net: &Trained, spec: &AttributionSpec, cache: &C, work_dir: &Path, log: &dyn Fn(&str)) -> Result<BenchmarkResult> {
    let t_all = Instant::now();
    let man = &net.run().manifest;
    let arch = &man.architecture;
    Mlp1::check_architecture(arch)?;
    let lr = man.learning_rates.first().copied().unwrap_or(0.0);
    let plain_gd = matches!(man.optimizer, crate::trajectory::OptimizerRecord::Gd { momentum, weight_decay, .. } if momentum == 0.0 && weight_decay == 0.0);
    if man.learning_rates.iter().any(|&e| e != lr) || !plain_gd {
        return Err(Error::Config("the attribution benchmark retrains with constant-rate full-batch GD: the run must be trained that way".into()));
    }
    let steps = man.steps;
    let ds = &net.run().dataset;
    let (d, m, k) = (ds.dim, ds.n_train(), ds.num_outputs);
    let y = ds.train_labels()?.to_vec();
    let p = spec.test_points;
    let yt_all = ds.test_labels()?;
    if p == 0 || p > yt_all.len() {
        return Err(Error::Config(format!("test_points = {p}: the run has {} test points", yt_all.len())));
    }
    let xt = &ds.x_test[..p * d];
    let yt = &yt_all[..p];
    let x = &ds.x_train;
    let run_id = man.run_id.clone();
    // Each stage's key names only what determines it (changing a grid recomputes nothing else).
    let sub_key = format!("subsets {} {} {} tuning {}", spec.subsets, spec.fraction, spec.subset_seed, spec.tuning_subsets);
    let noise_key = format!("noise {} {}", spec.noise_fraction, spec.noise_seed);
    let key = |what: &str| -> String {
        let detail = match what {
            "retrain" => format!("{sub_key} all test points"),
            "epk-rows" | "dpk-rows" | "if-tau" => format!("test {p}"),
            "ensemble" => format!("seeds {:?}", spec.ensemble_seeds),
            "noisy" => noise_key.clone(),
            _ => String::new(),
        };
        format!("{run_id}|{what}|{detail}")
    };
    let mut timings = Vec::new();

    // Subsets and retraining.
    let subsets = Subsets::draw(m, spec.subsets, spec.fraction, spec.tuning_subsets, spec.subset_seed)?;
    let w0 = Mlp1::from_params(arch, &net.states()[0])?;
    let wn = Mlp1::from_params(arch, net.states().last().expect("a run has states"))?;
    // Outputs at every test point of the run are kept (a forward pass), so a spec with fewer
    // test points reuses the retraining.
    let all: Retrained = cache.stage("retrain", &key("retrain"), || {
        let t = Instant::now();
        let (mut logp, mut margin) = (Vec::new(), Vec::new());
        for (s, idx) in subsets.members.iter().enumerate() {
            let (xs, ys) = gather(x, &y, d, idx);
            let w = gd(&w0, &xs, &ys, lr, steps)?;
            let (a, b) = outputs_at_labels(&w.forward(&ds.x_test), yt_all, k);
            logp.extend(a);
            margin.extend(b);
            log(&format!("retrained subset {}/{} ({:.0} s)", s + 1, subsets.members.len(), t.elapsed().as_secs_f64()));
        }
        Ok(Retrained { logp, margin, seconds: t.elapsed().as_secs_f64() })
    })?;
    let n_all = yt_all.len();
    let first = |v: &[f64]| -> Vec<f64> { v.chunks_exact(n_all).flat_map(|r| r[..p].iter().copied()).collect() };
    let retrained = Retrained { logp: first(&all.logp), margin: first(&all.margin), seconds: all.seconds };
    timings.push(("retrain subsets".to_string(), retrained.seconds));
    let sc = Scorer { subsets: &subsets, retrained: &retrained, m, spec };
    let mut methods = Vec::new();
    let mut checks = Checks::default();

    // EPK and DPK rows.
    let rows_of = |kind: KernelKind, name: &str| -> Result<(PathRows, f64)> {
        let t = Instant::now();
        let r: PathRows = cache.stage(name, &key(name), || path_rows(net, kind, xt, yt, spec.chunk_rows, &|a, b| log(&format!("{name}: {a}/{b} rows ({:.0} s)", t.elapsed().as_secs_f64()))))?;
        let secs = r.seconds;
        Ok((r, secs))
    };
    let (epk, epk_s) = rows_of(KernelKind::Epk, "epk-rows")?;
    checks.epk_max_residual = epk.max_residual;
    checks.epk_max_output = epk.max_output;
    let mut sw = Sweep::new("epk", 1);
    sw.add(&sc, "-".into(), None, None, &epk.tau)?;
    methods.push(sw.finish(&sc, epk_s));
    let dpk: PathRows = cache.stage("dpk-rows-fast", &key("dpk-rows"), || super::pathattr::dpk_rows_fast(net, xt, yt))?;
    let dpk_s = dpk.seconds;
    checks.dpk_max_residual = dpk.max_residual;
    let mut sw = Sweep::new("tracin", 1);
    sw.add(&sc, "-".into(), None, None, &dpk.tau)?;
    methods.push(sw.finish(&sc, dpk_s));
    methods.iter().for_each(|r| log(&line(r)));

    // Gradients at w_N.
    let fx = wn.forward(xt);
    let ft = wn.forward(x);
    let gx = ScalarGrads::new(&wn, xt, &fx, directions(&fx.logp, yt, k, Direction::LogProb));
    let gt = ScalarGrads::new(&wn, x, &ft, directions(&ft.logp, &y, k, Direction::LogProb));
    let mut sw = Sweep::new("grad-dot", 1);
    sw.add(&sc, "-".into(), None, None, &gx.gram(&gt))?;
    methods.push(sw.finish(&sc, 0.0));
    log(&line(&methods[methods.len() - 1]));
    let q1 = one_minus_p(&ft.logp, &y, k);

    // Path-kernel representers.
    let (kk, kk_s): (Vec<f64>, f64) = cache.stage("path-gram", &key("path-gram"), || {
        let t = Instant::now();
        let g = path_gram(arch, net.states(), x, &y, true)?.0.expect("full");
        Ok((g, t.elapsed().as_secs_f64()))
    })?;
    timings.push(("path gram (train side)".to_string(), kk_s));
    for (name, rows, extra) in [("epk-rep", &epk, epk_s), ("dpk-rep", &dpk, dpk_s)] {
        let mut sw = Sweep::new(name, 1);
        let ridge = Ridge::kernel(&rows.kernel, &kk, m)?;
        for &l in &spec.representer_ridges {
            let mut tau = ridge.apply(l);
            scale_columns(&mut tau, &q1);
            sw.add(&sc, format!("λ={}", fmt_g(l)), None, Some(l), &tau)?;
        }
        methods.push(sw.finish(&sc, extra + kk_s));
        log(&line(&methods[methods.len() - 1]));
    }

    // TRAK: one model (the run) and the ensemble.
    let dmax = spec.trak_dims.iter().copied().max().unwrap_or(0);
    let t_ens = Instant::now();
    let (ensemble, ens_train_s): (Vec<Vec<f64>>, f64) = cache.stage("ensemble", &key("ensemble"), || {
        let e = spec.ensemble_seeds
            .iter()
            .map(|&s| {
                let w = gd(&Mlp1::from_params(arch, &arch.init(s))?, x, &y, lr, steps)?;
                log(&format!("ensemble seed {s} trained ({:.0} s)", t_ens.elapsed().as_secs_f64()));
                Ok(w.flat())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((e, t_ens.elapsed().as_secs_f64()))
    })?;
    timings.push(("train ensemble (fast GD, all seeds)".to_string(), ens_train_s));
    if let Some(pos) = spec.ensemble_seeds.iter().position(|&s| s == man.seed) {
        if net.states()[0] == arch.init(man.seed) {
            let a = &ensemble[pos];
            let b = wn.flat();
            let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
            checks.retrain_vs_run = Some(a.iter().zip(&b).map(|(u, v)| (u - v).abs()).fold(0.0, f64::max) / scale);
        }
    }
    let models: Vec<Mlp1> = std::iter::once(Ok(wn.clone()))
        .chain(ensemble.iter().zip(&spec.ensemble_seeds).filter(|(_, &s)| !(s == man.seed && checks.retrain_vs_run.is_some())).map(|(f, _)| {
            let params = crate::model::Params::from_flat(arch.param_specs(), f)?;
            Mlp1::from_params(arch, &params)
        }))
        .take(spec.ensemble_seeds.len().max(1))
        .collect::<Result<_>>()?;
    // Sums over models of the unweighted regressions, per (d or full, λ), and of 1 − p.
    let nd = spec.trak_dims.len() + 1; // the last slot is the unprojected form
    let nl = spec.trak_ridges.len();
    let mut sums: Vec<Vec<f64>> = vec![vec![0.0; p * m]; nd * nl];
    let mut qsum = vec![0.0; m];
    let (mut t1_proj, mut t1_full, mut ens_s) = (0.0, 0.0, 0.0);
    let mut one: Option<Vec<Vec<f64>>> = None;
    for (mi, w) in models.iter().enumerate() {
        let fx = w.forward(xt);
        let ft = w.forward(x);
        let q = one_minus_p(&ft.logp, &y, k);
        qsum.iter_mut().zip(&q).for_each(|(a, b)| *a += b);
        let gx = ScalarGrads::new(w, xt, &fx, directions(&fx.logp, yt, k, Direction::LogOdds));
        let gt = ScalarGrads::new(w, x, &ft, directions(&ft.logp, &y, k, Direction::LogOdds));
        let t = Instant::now();
        let rf = Ridge::kernel(&gx.gram(&gt), &gt.gram(&gt), m)?;
        for (li, &l) in spec.trak_ridges.iter().enumerate() {
            sums[(nd - 1) * nl + li].iter_mut().zip(rf.apply(l)).for_each(|(a, b)| *a += b);
        }
        let tf = t.elapsed().as_secs_f64();
        let t = Instant::now();
        if dmax > 0 {
            let px = gx.project(Projection::Gaussian { seed: spec.projection_seed, dim: dmax });
            let pt = gt.project(Projection::Gaussian { seed: spec.projection_seed, dim: dmax });
            for (di, &dim) in spec.trak_dims.iter().enumerate() {
                let cut = |v: &[f64], n: usize| -> Vec<f64> { (0..n).flat_map(|i| v[i * dmax..i * dmax + dim].iter().copied()).collect() };
                let r = Ridge::features(&cut(&px, p), &cut(&pt, m), dim)?;
                for (li, &l) in spec.trak_ridges.iter().enumerate() {
                    sums[di * nl + li].iter_mut().zip(r.apply(l)).for_each(|(a, b)| *a += b);
                }
            }
        }
        let tp = t.elapsed().as_secs_f64();
        if mi == 0 {
            (t1_full, t1_proj) = (tf, tp);
            one = Some(sums.iter().map(|s| s.iter().zip(q.iter().cycle()).map(|(a, b)| a * b).collect()).collect());
        }
        ens_s += tf + tp;
        log(&format!("trak: model {}/{} ({:.0} s)", mi + 1, models.len(), ens_s));
    }
    let one = one.expect("at least one model");
    let nm = models.len() as f64;
    let qbar: Vec<f64> = qsum.iter().map(|v| v / nm).collect();
    for (name, models_used, table, full) in [("trak-1", 1, &one, false), ("trak-1-full", 1, &one, true)] {
        let mut sw = Sweep::new(name, models_used);
        for di in 0..nd {
            if (di == nd - 1) != full {
                continue;
            }
            for (li, &l) in spec.trak_ridges.iter().enumerate() {
                let (setting, dim) = if full { (format!("λ={}", fmt_g(l)), None) } else { (format!("d={} λ={}", spec.trak_dims[di], fmt_g(l)), Some(spec.trak_dims[di])) };
                sw.add(&sc, setting, dim, Some(l), &table[di * nl + li])?;
            }
        }
        methods.push(sw.finish(&sc, if full { t1_full } else { t1_proj }));
    }
    if models.len() > 1 {
        let ens_name = format!("trak-{}", models.len());
        for full in [false, true] {
            let name = if full { format!("{ens_name}-full") } else { ens_name.clone() };
            let mut sw = Sweep::new(&name, models.len());
            for di in 0..nd {
                if (di == nd - 1) != full {
                    continue;
                }
                for (li, &l) in spec.trak_ridges.iter().enumerate() {
                    let mut tau: Vec<f64> = sums[di * nl + li].iter().map(|v| v / nm).collect();
                    scale_columns(&mut tau, &qbar);
                    let (setting, dim) = if full { (format!("λ={}", fmt_g(l)), None) } else { (format!("d={} λ={}", spec.trak_dims[di], fmt_g(l)), Some(spec.trak_dims[di])) };
                    sw.add(&sc, setting, dim, Some(l), &tau)?;
                }
            }
            methods.push(sw.finish(&sc, 0.0));
        }
        let n_ens = methods.len();
        // The ensemble's cost: all models' regressions (its sweep's own time is in `seconds`).
        methods[n_ens - 2].seconds += ens_s;
    }
    drop(sums);
    methods.iter().filter(|r| r.method.starts_with("trak")).for_each(|r| log(&line(r)));

    // Influence functions.
    let t = Instant::now();
    let fs = FunctionSpace::new(ggn_factor(&wn, x), x, &gx, &gt);
    checks.ggn_rank = fs.rank();
    let mut sw = Sweep::new("if-ggn", 1);
    let mut best_tau: Option<(f64, f64, Vec<f64>)> = None;
    let mut if_s = t.elapsed().as_secs_f64();
    for &dmp in &spec.if_dampings {
        let (tau, kept, secs): (Vec<f64>, usize, f64) = cache.stage("if-tau", &format!("{}|{dmp:e}|tol {:e}", key("if-tau"), spec.ggn_tol), || {
            let t = Instant::now();
            let (tau, kept) = fs.apply(dmp, spec.ggn_tol)?;
            Ok((tau, kept, t.elapsed().as_secs_f64()))
        })?;
        if_s += secs;
        sw.add(&sc, format!("λ={} (n_z {kept} of {})", fmt_g(dmp), fs.rank()), None, Some(dmp), &tau)?;
        let tune = sw.points.last().expect("just added").tune;
        if best_tau.as_ref().is_none_or(|b| tune > b.0) {
            best_tau = Some((tune, dmp, tau));
        }
        log(&format!("if-ggn: damping {dmp:e}, n_z {kept} of {} ({:.0} s)", fs.rank(), t.elapsed().as_secs_f64()));
    }
    let mut r = sw.finish(&sc, 0.0);
    r.seconds = if_s;
    methods.push(r);
    if let (Some((_, dmp, tau)), true) = (&best_tau, spec.cg_check_points > 0) {
        let ggn = Ggn::new(&wn, x);
        let lambda = dmp * fs.mean_eigenvalue();
        let (mut it, mut res, mut diff) = (0usize, 0.0f64, 0.0f64);
        for q in 0..spec.cg_check_points.min(p) {
            let sol = ggn.cg(&gx.explicit(q), lambda, 1e-10, 2000)?;
            let jv = ggn.jvp(&sol.x);
            let row: Vec<f64> = (0..m).map(|i| (0..k).map(|c| jv[i * k + c] * gt.u[i * k + c]).sum()).collect();
            let want = &tau[q * m..(q + 1) * m];
            let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
            diff = diff.max(row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale);
            it = it.max(sol.iterations);
            res = res.max(sol.rel_residual);
        }
        checks.cg = Some((it, res, diff));
    }
    drop(fs);
    log(&line(&methods[methods.len() - 1]));

    // Noisy-label detection.
    let mut noisy = Vec::new();
    if spec.noise_fraction > 0.0 {
        let t = Instant::now();
        let (ny, flipped) = flip_labels(&y, k, spec.noise_fraction, spec.noise_seed);
        let nnet = train_relabelled(net, &ny, &work_dir.join("noisy"))?;
        timings.push(("train noisy run (dfdx, recorded)".to_string(), t.elapsed().as_secs_f64()));
        let chosen = |name: &str| methods.iter().find(|r| r.method == name).map(|r| r.clone());
        let nwn = Mlp1::from_params(arch, nnet.states().last().expect("states"))?;
        let nf = nwn.forward(x);
        let ng = ScalarGrads::new(&nwn, x, &nf, directions(&nf.logp, &ny, k, Direction::LogProb));
        let nq = one_minus_p(&nf.logp, &ny, k);
        let diag = |v: &[f64]| -> Vec<f64> { (0..m).map(|i| v[i * m + i]).collect() };
        let mut push = |method: &str, setting: String, score: Vec<f64>| {
            if let Some(a) = auc(&score, &flipped) {
                log(&format!("noisy-label detection, {method} ({setting}): AUC {a:.3}"));
                noisy.push(NoisyResult { method: method.into(), setting, auc: a });
            }
        };
        push("loss", "-".into(), ny.iter().enumerate().map(|(i, &c)| -nf.logp[i * k + c]).collect());
        push("grad-dot", "-".into(), ng.sq_norms());
        let t = Instant::now();
        let nk = key("noisy");
        let (nkk, ndiag) = cache.stage("noisy-path-gram", &nk, || {
            let (g, dg) = path_gram(arch, nnet.states(), x, &ny, true)?;
            Ok((g.expect("full"), dg))
        })?;
        timings.push(("noisy path gram".to_string(), t.elapsed().as_secs_f64()));
        push("tracin", "-".into(), ndiag);
        // The EPK representer's self-attribution needs full EPK rows at every training point
        // (2 000 × 2 000 × K²): not computed; the DPK representer's needs only the path Gram.
        for (name, kx) in [("dpk-rep", &nkk)] {
            if let Some(r) = chosen(name) {
                let l = r.sweep.iter().find(|s| s.setting == r.chosen).and_then(|s| s.ridge).unwrap_or(0.0);
                let mut tau = Ridge::kernel(kx, &nkk, m)?.apply(l);
                scale_columns(&mut tau, &nq);
                push(name, r.chosen.clone(), diag(&tau));
            }
        }
        let ngo = ScalarGrads::new(&nwn, x, &nf, directions(&nf.logp, &ny, k, Direction::LogOdds));
        if let Some(r) = chosen("trak-1-full") {
            let l = r.sweep.iter().find(|s| s.setting == r.chosen).and_then(|s| s.ridge).unwrap_or(0.0);
            let g = ngo.gram(&ngo);
            let mut tau = Ridge::kernel(&g, &g, m)?.apply(l);
            scale_columns(&mut tau, &nq);
            push("trak-1-full", r.chosen.clone(), diag(&tau));
        }
        if let Some(r) = chosen("trak-1") {
            let pt = r.sweep.iter().find(|s| s.setting == r.chosen).expect("chosen is a sweep point");
            if let (Some(dim), Some(l)) = (pt.dim, pt.ridge) {
                let f = ngo.project(Projection::Gaussian { seed: spec.projection_seed, dim });
                let mut tau = Ridge::features(&f, &f, dim)?.apply(l);
                scale_columns(&mut tau, &nq);
                push("trak-1", r.chosen.clone(), diag(&tau));
            }
        }
        if let Some((_, dmp, _)) = &best_tau {
            let fs = FunctionSpace::new(ggn_factor(&nwn, x), x, &ng, &ng);
            push("if-ggn", format!("λ={}", fmt_g(*dmp)), diag(&fs.apply(*dmp, spec.ggn_tol)?.0));
        }
        // The EPK's self-kernel last: the slowest piece (2 000 integrated rows).
        let t = Instant::now();
        let (eself, es_s): (Vec<f64>, f64) = cache.stage("noisy-epk-self", &nk, || {
            let self_k = super::pathattr::epk_self(&nnet, &ny, spec.chunk_rows, &|a, b| log(&format!("noisy epk self-kernel: {a}/{b} rows ({:.0} s)", t.elapsed().as_secs_f64())))?;
            Ok((self_k, t.elapsed().as_secs_f64()))
        })?;
        timings.push(("noisy epk self-kernel (train points, diag layout)".to_string(), es_s));
        push("epk", "-".into(), eself);
        log("noisy-label detection scored");
    }

    let retrained = (retrained.logp.clone(), retrained.margin.clone());
    Ok(BenchmarkResult { spec: spec.clone(), run_id, shape: (m, p, k), lr, steps, subsets, methods, noisy, retrained, checks, timings, total_seconds: t_all.elapsed().as_secs_f64() })
}

impl std::fmt::Display for BenchmarkResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (m, p, k) = self.shape;
        writeln!(f, "LDS on {} evaluation subsets ({} tuning), {p} test points, M = {m}, K = {k}, lr {} x {} steps; mean [bootstrap 95 %]", self.subsets.members.len() - self.subsets.tuning, self.subsets.tuning, self.lr, self.steps)?;
        writeln!(f)?;
        writeln!(f, "| method | models | chosen (tuning subsets) | tune LDS | LDS log p | LDS margin | seconds |")?;
        writeln!(f, "|---|---:|---|---:|---|---|---:|")?;
        for r in &self.methods {
            writeln!(f, "| {} | {} | {} | {:.3} | {} | {} | {:.1} |", r.method, r.models, r.chosen, r.tune, r.lds, r.lds_margin, r.seconds)?;
        }
        if !self.noisy.is_empty() {
            writeln!(f)?;
            writeln!(f, "| noisy-label detection | setting | AUC |")?;
            writeln!(f, "|---|---|---:|")?;
            for n in &self.noisy {
                writeln!(f, "| {} | {} | {:.3} |", n.method, n.setting, n.auc)?;
            }
        }
        writeln!(f)?;
        let c = &self.checks;
        writeln!(f, "EPK exactness: max |b + Σ τ − log p_y| = {:.2e} (outputs up to {:.2}); DPK's residual {:.2e}", c.epk_max_residual, c.epk_max_output, c.dpk_max_residual)?;
        if let Some(r) = c.retrain_vs_run {
            writeln!(f, "fast retrainer vs the recorded dfdx run (seed {}, full set): max relative difference {r:.2e}", self.spec.ensemble_seeds.first().copied().unwrap_or(0))?;
        }
        if let Some((it, res, diff)) = c.cg {
            writeln!(f, "CG vs direct (Woodbury) at the chosen damping: up to {it} iterations, residual {res:.1e}, max relative τ difference {diff:.2e}; GGN rank n_z = {}", c.ggn_rank)?;
        }
        if let Some(r) = c.noisy_epk_max_residual {
            writeln!(f, "noisy run's EPK exactness at the training points: {r:.2e}")?;
        }
        for (s, t) in &self.timings {
            writeln!(f, "- {s}: {t:.1} s")?;
        }
        write!(f, "total: {:.1} s", self.total_seconds)
    }
}

/// Writes `lds.parquet` (one row per method), `sweep.parquet` (every setting), `noisy.parquet`,
/// `result.json` (everything, with the subsets), `summary.md`, and for an independent recheck
/// (`scripts/check_datamodels_lds.py`) `tau.safetensors` (each method's chosen `τ [P, M]`) and
/// `retrained.safetensors` (`logp`, `margin` `[S, P]`) into `dir`.
pub fn write_tables(r: &BenchmarkResult, dir: &Path) -> Result<()> {
    crate::io::create_dir_all(dir)?;
    let (m, p, _) = r.shape;
    let taus: Vec<crate::io::NamedArray> = r.methods.iter().filter(|x| x.tau.len() == p * m).map(|x| crate::io::NamedArray::f64(x.method.clone(), vec![p, m], x.tau.clone())).collect();
    crate::io::write_safetensors(&dir.join("tau.safetensors"), &taus, None)?;
    let s_all = r.subsets.members.len();
    if r.retrained.0.len() == s_all * p {
        crate::io::write_safetensors(
            &dir.join("retrained.safetensors"),
            &[crate::io::NamedArray::f64("logp", vec![s_all, p], r.retrained.0.clone()), crate::io::NamedArray::f64("margin", vec![s_all, p], r.retrained.1.clone())],
            None,
        )?;
    }
    let s = |f: &dyn Fn(&MethodResult) -> String| Column::Str(r.methods.iter().map(f).collect());
    let v = |f: &dyn Fn(&MethodResult) -> f64| Column::F64(r.methods.iter().map(f).collect());
    Table::new()
        .with("method", s(&|m| m.method.clone()))
        .with("models", Column::I64(r.methods.iter().map(|m| m.models as i64).collect()))
        .with("chosen", s(&|m| m.chosen.clone()))
        .with("tune", v(&|m| m.tune))
        .with("lds", v(&|m| m.lds.mean))
        .with("lds_lo", v(&|m| m.lds.lo))
        .with("lds_hi", v(&|m| m.lds.hi))
        .with("lds_margin", v(&|m| m.lds_margin.mean))
        .with("lds_margin_lo", v(&|m| m.lds_margin.lo))
        .with("lds_margin_hi", v(&|m| m.lds_margin.hi))
        .with("seconds", v(&|m| m.seconds))
        .write_parquet(&dir.join("lds.parquet"))?;
    let pts: Vec<&SweepPoint> = r.methods.iter().flat_map(|m| &m.sweep).collect();
    Table::new()
        .with("method", Column::Str(pts.iter().map(|p| p.method.clone()).collect()))
        .with("setting", Column::Str(pts.iter().map(|p| p.setting.clone()).collect()))
        .with("dim", Column::I64(pts.iter().map(|p| p.dim.map_or(-1, |d| d as i64)).collect()))
        .with("ridge", Column::F64(pts.iter().map(|p| p.ridge.unwrap_or(f64::NAN)).collect()))
        .with("tune", Column::F64(pts.iter().map(|p| p.tune).collect()))
        .with("eval", Column::F64(pts.iter().map(|p| p.eval).collect()))
        .with("eval_margin", Column::F64(pts.iter().map(|p| p.eval_margin).collect()))
        .write_parquet(&dir.join("sweep.parquet"))?;
    Table::new()
        .with("method", Column::Str(r.noisy.iter().map(|n| n.method.clone()).collect()))
        .with("setting", Column::Str(r.noisy.iter().map(|n| n.setting.clone()).collect()))
        .with("auc", Column::F64(r.noisy.iter().map(|n| n.auc).collect()))
        .write_parquet(&dir.join("noisy.parquet"))?;
    crate::io::write_json(&dir.join("result.json"), r)?;
    let mut md = format!("{r}\n\n## Sweep (every setting; tuning on subsets 0..{}, evaluation on the rest)\n\n| method | setting | tune LDS | eval LDS log p | eval LDS margin |\n|---|---|---:|---:|---:|\n", r.subsets.tuning);
    for p in pts {
        md.push_str(&format!("| {} | {} | {:.4} | {:.4} | {:.4} |\n", p.method, p.setting, p.tune, p.eval, p.eval_margin));
    }
    crate::io::write_atomic(&dir.join("summary.md"), md.as_bytes())
}
