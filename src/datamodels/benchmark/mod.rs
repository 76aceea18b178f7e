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
//!   side), `τ = k(x, X)(K + λI)⁻¹ diag(1 − p_i)`; the ablation `ntk-rep` the same with the final
//!   NTK of `log p_y` (between `epk-rep`, which differs in the kernel, and `trak-1-full`, which
//!   differs in the output), and `window-rep` the same with the DPK of the last `L` steps only
//!   (`L` tuned with the ridge: how much of the path the regression should see);
//! - `if-ggn`: influence functions with the damped GGN ([`crate::attribution::influence`]).
//!
//! Every ridge and damping is relative (to the Gram's mean eigenvalue; to `tr(H)/n_z`) and is
//! chosen by mean LDS on the tuning subsets only; every reported LDS is on the evaluation subsets.
//!
//! [`run`] is a list of stages, one function each, data flowing down: the retrained outputs, the
//! path kernels' attributions, Grad-Dot, the representers, TRAK (`trak.rs`; the method itself,
//! and for one model at one setting, is [`crate::attribution::trak()`]), influence functions, noisy-label detection (`noisy.rs`); `score.rs`
//! turns attributions into sweeps and `tables.rs` writes the report ([`write_tables`]).

mod charts;
mod noisy;
mod score;
mod tables;
mod trak;

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::cache::Stages;
use super::retrain::{gather, gd};
use super::subsets::Subsets;
use crate::api::Trained;
use crate::attribution::grads::{directions, Direction, ScalarGrads};
use crate::attribution::influence::{ggn_factor, FunctionSpace, Ggn};
use crate::attribution::lds::Interval;
use crate::attribution::mlp::{outputs_at_labels, Mlp1};
use crate::attribution::path::{path_gram, path_rows, PathRows};
use crate::attribution::ridge::{one_minus_p, scale_columns, Ridge};
use crate::attribution::trak::check_dims;
use crate::error::{Error, Result};
use crate::kernel::KernelKind;
use crate::model::Architecture;
use score::{fmt_g, line, Retrained, Scorer, Sweep};

pub use charts::write_charts;
pub use tables::write_tables;

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
    /// The window representers' lengths `L` (the DPK of the last `L` steps on both sides; tuned
    /// jointly with the representer ridge). Lengths of `N` steps or more are the whole path
    /// (`dpk-rep`) and are skipped.
    pub representer_windows: Vec<usize>,
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
            trak_ridges: vec![0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3],
            representer_ridges: vec![1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3],
            representer_windows: vec![1, 10, 50, 100, 250],
            if_dampings: vec![1e2, 1e1, 1.0, 1e-1, 1e-2, 1e-3],
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
    /// `τ [P, M]` at the chosen setting (not serialised; [`write_tables`] writes it to its
    /// attributions file).
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
    /// Per method (at its chosen setting), the mean over the test points of the Spearman
    /// correlation of its `τ(x, ·)` with the EPK's over the training points: how alike the two
    /// rank the training points.
    #[serde(default)]
    pub epk_agreement: Vec<(String, f64)>,
    /// Wall-clock seconds of the whole run.
    pub total_seconds: f64,
}

/// What every stage reads: the run, the spec, the cache, the data and the progress log.
///
/// # Shapes
/// `x [M, d]`, `y [M]` (the training set), `xt [P, d]`, `yt [P]` (the first `P` test points).
struct Bench<'a, C: Stages> {
    net: &'a Trained,
    spec: &'a AttributionSpec,
    cache: &'a C,
    log: &'a dyn Fn(&str),
    arch: &'a Architecture,
    lr: f64,
    steps: usize,
    d: usize,
    m: usize,
    k: usize,
    x: &'a [f64],
    y: Vec<usize>,
    xt: &'a [f64],
    yt: &'a [usize],
    /// Every test label of the run (the retraining stage keeps outputs at all of them).
    yt_all: &'a [usize],
    /// The network at `w_N`.
    wn: Mlp1,
}

impl<'a, C: Stages> Bench<'a, C> {
    /// Checks the run (a one-hidden-layer ReLU MLP trained by constant-rate full-batch GD) and
    /// the spec's test points.
    fn new(net: &'a Trained, spec: &'a AttributionSpec, cache: &'a C, log: &'a dyn Fn(&str)) -> Result<Self> {
        let man = &net.run().manifest;
        let arch = &man.architecture;
        Mlp1::check_architecture(arch)?;
        let lr = man.learning_rates.first().copied().unwrap_or(0.0);
        let plain_gd = matches!(man.optimizer, crate::trajectory::OptimizerRecord::Gd { momentum, weight_decay, .. } if momentum == 0.0 && weight_decay == 0.0);
        if man.learning_rates.iter().any(|&e| e != lr) || !plain_gd {
            return Err(Error::Config("the attribution benchmark retrains with constant-rate full-batch GD: the run must be trained that way".into()));
        }
        let ds = &net.run().dataset;
        let (d, m, k) = (ds.dim, ds.n_train(), ds.num_outputs);
        let p = spec.test_points;
        let yt_all = ds.test_labels()?;
        if p == 0 || p > yt_all.len() {
            return Err(Error::Config(format!("test_points = {p}: the run has {} test points", yt_all.len())));
        }
        let wn = Mlp1::from_params(arch, net.states().last().expect("a run has states"))?;
        Ok(Bench { net, spec, cache, log, arch, lr, steps: man.steps, d, m, k, x: &ds.x_train, y: ds.train_labels()?.to_vec(), xt: &ds.x_test[..p * d], yt: &yt_all[..p], yt_all, wn })
    }

    /// The cache key of stage `what`: the run and only what determines the stage (changing a
    /// grid recomputes nothing else).
    fn key(&self, what: &str) -> String {
        let s = self.spec;
        let detail = match what {
            "retrain" => format!("subsets {} {} {} tuning {} all test points", s.subsets, s.fraction, s.subset_seed, s.tuning_subsets),
            "epk-rows" | "dpk-rows" | "if-tau" => format!("test {}", s.test_points),
            "ensemble" => format!("seeds {:?}", s.ensemble_seeds),
            "noisy" => format!("noise {} {}", s.noise_fraction, s.noise_seed),
            _ => String::new(),
        };
        format!("{}|{what}|{detail}", self.net.run().manifest.run_id)
    }

    fn log(&self, s: &str) {
        (self.log)(s)
    }

    /// Outputs of every subset's retraining (from `w_0`, same optimizer and steps) at the first
    /// `P` test points. Outputs at every test point of the run are cached (a forward pass), so a
    /// spec with fewer test points reuses the retraining.
    fn retrain(&self, subsets: &Subsets) -> Result<Retrained> {
        let ds = &self.net.run().dataset;
        let w0 = Mlp1::from_params(self.arch, &self.net.states()[0])?;
        let all: Retrained = self.cache.stage("retrain", &self.key("retrain"), || {
            let t = Instant::now();
            let (mut logp, mut margin) = (Vec::new(), Vec::new());
            for (s, idx) in subsets.members.iter().enumerate() {
                let (xs, ys) = gather(self.x, &self.y, self.d, idx);
                let w = gd(&w0, &xs, &ys, self.lr, self.steps)?;
                let (a, b) = outputs_at_labels(&w.forward(&ds.x_test), self.yt_all, self.k);
                logp.extend(a);
                margin.extend(b);
                self.log(&format!("retrained subset {}/{} ({:.0} s)", s + 1, subsets.members.len(), t.elapsed().as_secs_f64()));
            }
            Ok(Retrained { logp, margin, seconds: t.elapsed().as_secs_f64() })
        })?;
        let (n_all, p) = (self.yt_all.len(), self.yt.len());
        let first = |v: &[f64]| -> Vec<f64> { v.chunks_exact(n_all).flat_map(|r| r[..p].iter().copied()).collect() };
        Ok(Retrained { logp: first(&all.logp), margin: first(&all.margin), seconds: all.seconds })
    }

    /// The EPK's exact attributions (through the front door) and the DPK's (TracIn, on factored
    /// gradients), each one sweep point; the EPK's exactness and the DPK's residual go to `checks`.
    fn path_attributions(&self, sc: &Scorer, checks: &mut Checks) -> Result<(PathRows, PathRows, Vec<MethodResult>)> {
        let t = Instant::now();
        let progress = |a: usize, b: usize| self.log(&format!("epk-rows: {a}/{b} rows ({:.0} s)", t.elapsed().as_secs_f64()));
        let epk: PathRows = self.cache.stage("epk-rows", &self.key("epk-rows"), || path_rows(self.net.run(), self.net.states(), KernelKind::Epk, self.xt, self.yt, self.spec.chunk_rows, &progress))?;
        checks.epk_max_residual = epk.max_residual;
        checks.epk_max_output = epk.max_output;
        let dpk: PathRows = self.cache.stage("dpk-rows-fast", &self.key("dpk-rows"), || crate::attribution::path::dpk_rows_fast(self.net.run(), self.net.states(), self.xt, self.yt))?;
        checks.dpk_max_residual = dpk.max_residual;
        let mut methods = Vec::new();
        for (name, rows) in [("epk", &epk), ("tracin", &dpk)] {
            let mut sw = Sweep::new(name, 1);
            sw.add(sc, "-".into(), None, None, &rows.tau)?;
            methods.push(sw.finish(sc, rows.seconds));
        }
        methods.iter().for_each(|r| self.log(&line(r)));
        Ok((epk, dpk, methods))
    }

    /// Grad-Dot at `w_N`: `⟨∇ log p_{y_x}(x), ∇ log p_{y_i}(x_i)⟩` on the gradients `gx`, `gt`.
    fn grad_dot(&self, sc: &Scorer, gx: &ScalarGrads, gt: &ScalarGrads) -> Result<MethodResult> {
        let mut sw = Sweep::new("grad-dot", 1);
        sw.add(sc, "-".into(), None, None, &gx.gram(gt))?;
        let r = sw.finish(sc, 0.0);
        self.log(&line(&r));
        Ok(r)
    }

    /// The path-kernel representers (`epk-rep`, `dpk-rep`): kernel regression on the EPK's train
    /// side with the EPK's or the DPK's rows, reweighted by `q = 1 − p_i` at `w_N`, over the
    /// representer ridges. Returns the methods and the train-side Gram's seconds.
    ///
    /// The ablation `ntk-rep` runs the same regression on the final NTK of the same output
    /// (`gx`, `gt`: gradients of `log p_y` at `w_N`): it differs from `epk-rep` only in the
    /// kernel, and from `trak-1-full` only in the output (`log p_y` instead of the log-odds).
    fn representers(&self, sc: &Scorer, (epk, dpk): (&PathRows, &PathRows), (gx, gt): (&ScalarGrads, &ScalarGrads), q: &[f64]) -> Result<(Vec<MethodResult>, f64)> {
        let (kk, kk_s): (Vec<f64>, f64) = self.cache.stage("path-gram", &self.key("path-gram"), || {
            let t = Instant::now();
            let g = path_gram(self.arch, self.net.states(), self.x, &self.y, true)?.0.expect("full");
            Ok((g, t.elapsed().as_secs_f64()))
        })?;
        let mut methods = Vec::new();
        let t = Instant::now();
        let ntk = (gx.gram(gt), gt.gram(gt));
        let ntk_s = t.elapsed().as_secs_f64();
        for (name, (rows, gram), seconds) in [("epk-rep", (&epk.kernel, &kk), epk.seconds + kk_s), ("dpk-rep", (&dpk.kernel, &kk), dpk.seconds + kk_s), ("ntk-rep", (&ntk.0, &ntk.1), ntk_s)] {
            let mut sw = Sweep::new(name, 1);
            let ridge = Ridge::kernel(rows, gram, self.m)?;
            for &l in &self.spec.representer_ridges {
                let mut tau = ridge.apply(l);
                scale_columns(&mut tau, q);
                sw.add(sc, format!("λ={}", fmt_g(l)), None, Some(l), &tau)?;
            }
            methods.push(sw.finish(sc, seconds));
            self.log(&line(&methods[methods.len() - 1]));
        }
        if let Some(r) = self.window_representers(sc, q)? {
            methods.push(r);
        }
        Ok((methods, kk_s))
    }

    /// The ablation `window-rep`: the representer regression on the DPK of the last `L` steps
    /// (rows and train side), over `representer_windows × representer_ridges`. `L = N` is
    /// `dpk-rep`; `L = 1` is close to `ntk-rep` (the NTK at `w_{N−1}`). `None` when no window is
    /// shorter than the run.
    fn window_representers(&self, sc: &Scorer, q: &[f64]) -> Result<Option<MethodResult>> {
        let states = self.net.states();
        let n = states.len() - 1;
        let windows: Vec<usize> = self.spec.representer_windows.iter().copied().filter(|&l| l > 0 && l < n).collect();
        if windows.is_empty() {
            return Ok(None);
        }
        let mut sw = Sweep::new("window-rep", 1);
        for &l in &windows {
            let suffix = &states[n - l..];
            let rows = crate::attribution::path::dpk_kernel(self.arch, suffix, (self.xt, self.yt), (self.x, &self.y))?;
            let gram = path_gram(self.arch, suffix, self.x, &self.y, true)?.0.expect("full");
            let ridge = Ridge::kernel(&rows, &gram, self.m)?;
            for &lam in &self.spec.representer_ridges {
                let mut tau = ridge.apply(lam);
                scale_columns(&mut tau, q);
                sw.add(sc, format!("L={l} λ={}", fmt_g(lam)), None, Some(lam), &tau)?;
            }
            self.log(&format!("window-rep: L = {l} scored"));
        }
        let r = sw.finish(sc, 0.0);
        self.log(&line(&r));
        Ok(Some(r))
    }

    /// Influence functions with the damped GGN at `w_N` (function-space form, each damping's `τ`
    /// cached), over the dampings; at the chosen one, CG on `cg_check_points` test points
    /// against the direct solve (into `checks`). Returns the method and its chosen damping.
    fn influence(&self, sc: &Scorer, gx: &ScalarGrads, gt: &ScalarGrads, checks: &mut Checks) -> Result<(MethodResult, f64)> {
        let spec = self.spec;
        let t = Instant::now();
        let fs = FunctionSpace::new(ggn_factor(&self.wn, self.x), self.x, gx, gt);
        checks.ggn_rank = fs.rank();
        let mut sw = Sweep::new("if-ggn", 1);
        let mut best: Option<(f64, f64, Vec<f64>)> = None;
        let mut seconds = t.elapsed().as_secs_f64();
        for &dmp in &spec.if_dampings {
            let (tau, kept, secs): (Vec<f64>, usize, f64) = self.cache.stage("if-tau", &format!("{}|{dmp:e}|tol {:e}", self.key("if-tau"), spec.ggn_tol), || {
                let t = Instant::now();
                let (tau, kept) = fs.apply(dmp, spec.ggn_tol)?;
                Ok((tau, kept, t.elapsed().as_secs_f64()))
            })?;
            seconds += secs;
            sw.add(sc, format!("λ={} (n_z {kept} of {})", fmt_g(dmp), fs.rank()), None, Some(dmp), &tau)?;
            let tune = sw.points.last().expect("just added").tune;
            if best.as_ref().is_none_or(|b| tune > b.0) {
                best = Some((tune, dmp, tau));
            }
            self.log(&format!("if-ggn: damping {dmp:e}, n_z {kept} of {} ({:.0} s)", fs.rank(), t.elapsed().as_secs_f64()));
        }
        let mut r = sw.finish(sc, 0.0);
        r.seconds = seconds;
        let (_, dmp, tau) = best.expect("if_dampings is not empty");
        if spec.cg_check_points > 0 {
            let ggn = Ggn::new(&self.wn, self.x);
            let lambda = dmp * fs.mean_eigenvalue();
            let (mut it, mut res, mut diff) = (0usize, 0.0f64, 0.0f64);
            for q in 0..spec.cg_check_points.min(self.yt.len()) {
                let sol = ggn.cg(&gx.explicit(q), lambda, 1e-10, 2000)?;
                let jv = ggn.jvp(&sol.x);
                let row: Vec<f64> = (0..self.m).map(|i| (0..self.k).map(|c| jv[i * self.k + c] * gt.u[i * self.k + c]).sum()).collect();
                let want = &tau[q * self.m..(q + 1) * self.m];
                let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
                diff = diff.max(row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / scale);
                it = it.max(sol.iterations);
                res = res.max(sol.rel_residual);
            }
            checks.cg = Some((it, res, diff));
        }
        self.log(&line(&r));
        Ok((r, dmp))
    }
}

/// For each of `others`, the mean over test points of the Spearman correlation between its
/// `τ(x, ·)` and `reference`'s (points where either is constant are skipped).
fn agreement_with(reference: &MethodResult, others: &[MethodResult], m: usize) -> Vec<(String, f64)> {
    others
        .iter()
        .map(|o| {
            let rows = reference.tau.chunks_exact(m).zip(o.tau.chunks_exact(m));
            let r: Vec<f64> = rows.filter_map(|(a, b)| crate::attribution::lds::spearman(a, b)).collect();
            (o.method.clone(), r.iter().sum::<f64>() / r.len().max(1) as f64)
        })
        .collect()
}

/// Runs the benchmark on `net` (a one-hidden-layer ReLU MLP trained by full-batch GD on mean
/// cross-entropy): retrains on every subset, computes every method's attributions over its
/// sweep, scores them, and (when `noise_fraction > 0`) trains the noisy-label run in
/// `work_dir/noisy` and scores self-attributions. `log` receives progress lines.
///
/// Errors: a run of another architecture or optimizer, a spec that asks for more test points
/// than the run has, a spec with an empty grid, and the errors of every stage.
pub fn run<C: Stages>(net: &Trained, spec: &AttributionSpec, cache: &C, work_dir: &Path, log: &dyn Fn(&str)) -> Result<BenchmarkResult> {
    let t_all = Instant::now();
    if spec.representer_ridges.is_empty() || spec.trak_ridges.is_empty() || spec.if_dampings.is_empty() {
        return Err(Error::Config("attribution: representer_ridges, trak_ridges and if_dampings each need at least one value".into()));
    }
    check_dims(&spec.trak_dims)?;
    let b = Bench::new(net, spec, cache, log)?;
    let subsets = Subsets::draw(b.m, spec.subsets, spec.fraction, spec.tuning_subsets, spec.subset_seed)?;
    let retrained = b.retrain(&subsets)?;
    let mut timings = vec![("retrain subsets".to_string(), retrained.seconds)];
    let sc = Scorer { subsets: &subsets, retrained: &retrained, m: b.m, spec };
    let mut checks = Checks::default();

    let (epk, dpk, mut methods) = b.path_attributions(&sc, &mut checks)?;
    // Gradients of log p_y at w_N: Grad-Dot, the representers' reweighting, influence functions.
    let (fx, ft) = (b.wn.forward(b.xt), b.wn.forward(b.x));
    let gx = ScalarGrads::new(&b.wn, b.xt, &fx, directions(&fx.logp, b.yt, b.k, Direction::LogProb));
    let gt = ScalarGrads::new(&b.wn, b.x, &ft, directions(&ft.logp, &b.y, b.k, Direction::LogProb));
    methods.push(b.grad_dot(&sc, &gx, &gt)?);
    let (reps, kk_s) = b.representers(&sc, (&epk, &dpk), (&gx, &gt), &one_minus_p(&ft.logp, &b.y, b.k))?;
    methods.extend(reps);
    timings.push(("path gram (train side)".to_string(), kk_s));
    drop((epk, dpk));
    let (traks, ens_train_s) = b.trak(&sc, &mut checks)?;
    methods.extend(traks);
    timings.push(("train ensemble (fast GD, all seeds)".to_string(), ens_train_s));
    let (influence, damping) = b.influence(&sc, &gx, &gt, &mut checks)?;
    methods.push(influence);

    let noisy = if spec.noise_fraction > 0.0 { b.noisy(&methods, damping, &work_dir.join("noisy"), &mut timings)? } else { Vec::new() };

    let (m, p, k) = (b.m, b.yt.len(), b.k);
    let epk_agreement = agreement_with(&methods[0], &methods[1..], m);
    Ok(BenchmarkResult {
        epk_agreement,
        spec: spec.clone(),
        run_id: net.run().manifest.run_id.clone(),
        shape: (m, p, k),
        lr: b.lr,
        steps: b.steps,
        retrained: (retrained.logp.clone(), retrained.margin.clone()),
        subsets,
        methods,
        noisy,
        checks,
        timings,
        total_seconds: t_all.elapsed().as_secs_f64(),
    })
}
