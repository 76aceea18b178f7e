//! An uncertainty benchmark for a trained classifier: calibration under rotation shift and
//! out-of-distribution detection, for the network's softmax (MAP), temperature scaling,
//! last-layer Laplace, a deep ensemble and any method that hands in `[N, K]` probabilities (the
//! GPs on the EPK and NTK Grams of [`crate::gp`]).
//!
//! The pieces, one per module:
//! - [`metrics`]: accuracy, NLL, Brier, 15-bin ECE, Mann–Whitney AUROC (NaN-loud, conventions
//!   documented there);
//! - [`temperature`]: one temperature fitted on the validation set by NLL;
//! - [`laplace`]: last-layer Laplace with the exact GGN, λ by marginal likelihood, MC predictive;
//! - [`ensemble`]: members trained with the existing trainer from several seeds;
//! - [`shift`]: rotations, uniform noise and inverted images;
//! - [`report`]: scoring and the parquet/JSON results.
//!
//! The front door is [`run_benchmark`]: a trained network, its dataset (with a validation
//! split), an optional ensemble and optional external methods in, [`UqResults`] out.
//! [`settings`] gives the inputs of every setting, so that external methods (a GP on a kernel)
//! can be evaluated at exactly the same points first.
//!
//! ```no_run
//! use std::path::Path;
//! use pathkernel::trajectory::Run;
//! use pathkernel::train::RunConfig;
//! use pathkernel::uncertainty::{self, BenchmarkConfig, Network};
//! # fn main() -> pathkernel::Result<()> {
//! let cfg = RunConfig::load(Path::new("mnist-uq.toml"))?;     // data: per_class 200, val_per_class 50
//! let data = cfg.data.load(Path::new("."))?;                  // regenerated: carries the validation split
//! let run = Run::open(Path::new("runs/mnist-uq/run"))?;
//! let (init, last) = (run.load_step(0)?, run.load_step(run.manifest.steps)?);
//! let ens = uncertainty::ensemble::train_ensemble(&cfg, &uncertainty::ensemble::ENSEMBLE_SEEDS,
//!                                                 Path::new("runs/mnist-uq/ensemble"), &Default::default())?;
//! let net = Network { arch: &run.manifest.architecture, params: &last, init: Some(&init) };
//! let results = uncertainty::run_benchmark(net, &data, Some(&ens), &[], &BenchmarkConfig::default())?;
//! results.write(Path::new("reports/mnist-uncertainty"))?;
//! println!("{results}");
//! # Ok(()) }
//! ```

pub mod ensemble;
pub mod kernel_gp;

pub mod method;
pub mod metrics;
pub mod record;
pub mod report;
pub mod shift;
pub mod summary;
pub mod temperature;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::gp::{self, Posterior};
use crate::model::{Architecture, Params};

pub use ensemble::{network_logits, train_ensemble, Ensemble};
pub(crate) use method::Method;
pub use kernel_gp::{GramCheck, KernelGp, KernelGpFit, KernelGpSpec};
pub use crate::gp::lastlayer::{self as laplace, LaplaceParams, LastLayerLaplace, LogitPosterior};
pub use metrics::{accuracy, auroc, brier, ece, nll, ood_auroc, reliability, ReliabilityBin, ScoreDirection};
pub use report::{LaplaceSummary, MethodPrediction, Metric, MetricValue, SettingInfo, SettingKind, UqResults};
pub use temperature::TemperatureFit;
pub(crate) use temperature::fit_temperature;

/// Settings and Monte-Carlo parameters of the benchmark. The defaults are the protocol of the
/// MNIST benchmark (`data/studies/mnist-uncertainty.toml`): rotations by 15, 30, 45, 60, 90
/// and 180 degrees of the first 1 000 test images, 1 000 uniform-noise images (seed 0), the
/// first 1 000 test images inverted, 1 000 Monte-Carlo samples (seed 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BenchmarkConfig {
    /// Rotation angles in degrees (counter-clockwise), one shifted setting `rot-{angle}` each
    /// (default 15, 30, 45, 60, 90, 180).
    pub angles: Vec<f64>,
    /// The rotated and the inverted settings take the first `shift_points` test images
    /// (default `Some(1000)`; `None`: every test image). More than the test set is an error.
    pub shift_points: Option<usize>,
    /// Uniform-noise OOD images (default `Some(1000)`; `None`: as many as test points).
    pub noise_points: Option<usize>,
    /// Seed of the noise images (default 0).
    pub noise_seed: u64,
    /// Include the inverted test images `1 − x` as an OOD setting (default true).
    pub inverted: bool,
    /// Prior precision search of the last-layer Laplace.
    pub laplace: LaplaceParams,
    /// Monte-Carlo samples per point of the Laplace predictive (default 1000).
    pub mc_samples: usize,
    /// Monte-Carlo seed (default 0; the same seed in every setting, point `p` on stream `p`).
    pub mc_seed: u64,
}

impl Default for BenchmarkConfig {
    fn default() -> Self {
        BenchmarkConfig {
            angles: vec![15.0, 30.0, 45.0, 60.0, 90.0, 180.0],
            shift_points: Some(1000),
            noise_points: Some(1000),
            noise_seed: 0,
            inverted: true,
            laplace: LaplaceParams::default(),
            mc_samples: 1000,
            mc_seed: 0,
        }
    }
}

/// One setting's inputs and labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    /// What it is (name, kind, size, labels).
    pub info: SettingInfo,
    /// Inputs. # Shapes `[N, 784]`.
    pub x: Vec<f64>,
}

/// The name of the rotation setting for `degrees` (`rot-45`, `rot-22.5`).
pub(crate) fn rotation_name(degrees: f64) -> String {
    format!("rot-{degrees}")
}

/// The settings of the benchmark on `data`'s test set, in order: `clean` (the whole test set),
/// `rot-{a}` for every angle (the first `shift_points` test images rotated, labelled), `noise`
/// (uniform images, seeded) and `inverted` (`1 − x` of the first `shift_points` test images)
/// when enabled. Needs 28×28 images with pixels in `[0, 1]`.
///
/// # Shapes
/// Each setting's `x` is `[N, 784]`.
pub fn settings(data: &Dataset, cfg: &BenchmarkConfig) -> Result<Vec<Setting>> {
    if data.dim != shift::PIXELS {
        return Err(Error::Config(format!("the uncertainty benchmark needs 28x28 images (dim 784), got dim {}", data.dim)));
    }
    let Targets::Labels(y) = &data.y_test else {
        return Err(Error::Config("the uncertainty benchmark needs a classification dataset".into()));
    };
    if y.is_empty() {
        return Err(Error::Config("the uncertainty benchmark needs test points".into()));
    }
    let n = y.len();
    let ns = cfg.shift_points.unwrap_or(n);
    if ns == 0 || ns > n {
        return Err(Error::Config(format!("shift_points = {ns}: the shifted settings take the first 1..={n} test images")));
    }
    let (x_shift, y_shift) = (&data.x_test[..ns * shift::PIXELS], &y[..ns]);
    let mk = |name: String, kind: SettingKind, x: Vec<f64>, labels: Option<Vec<usize>>| Setting {
        info: SettingInfo { name, kind, n: x.len() / shift::PIXELS, labels },
        x,
    };
    let mut out = vec![mk("clean".into(), SettingKind::Clean, data.x_test.clone(), Some(y.clone()))];
    for &a in &cfg.angles {
        out.push(mk(rotation_name(a), SettingKind::Shifted, shift::rotate_images(x_shift, a)?, Some(y_shift.to_vec())));
    }
    let m = cfg.noise_points.unwrap_or(n);
    if m > 0 {
        out.push(mk("noise".into(), SettingKind::Ood, shift::uniform_noise_images(m, cfg.noise_seed), None));
    }
    if cfg.inverted {
        out.push(mk("inverted".into(), SettingKind::Ood, shift::invert_images(x_shift)?, None));
    }
    let mut names: Vec<&str> = out.iter().map(|s| s.info.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::Config(format!("benchmark settings have duplicate names (angles {:?})", cfg.angles)));
    }
    Ok(out)
}

/// A method's predictive in one setting: probabilities and an optional variance OOD score.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictive {
    /// Class probabilities. # Shapes `[N, K]`.
    pub probs: Vec<f64>,
    /// A variance score, larger = more OOD. # Shapes `[N]`.
    pub ood_score: Option<Vec<f64>>,
}

impl Predictive {
    /// Probabilities without a variance score.
    pub(crate) fn from_probs(probs: Vec<f64>) -> Self {
        Predictive { probs, ood_score: None }
    }

    /// A GP logit posterior ([`crate::gp::FittedGp::predict`]) pushed through the Monte-Carlo
    /// softmax ([`crate::gp::mc_softmax`], `samples` draws, `seed`); the OOD score is the summed
    /// posterior logit variance `Σ_k var_k`.
    ///
    /// # Shapes
    /// `post.mean`, `post.var`: `[N, K]`.
    pub fn from_gp(post: &Posterior, samples: usize, seed: u64) -> Result<Self> {
        let mc = gp::mc_softmax(post, samples, seed)?;
        let k = post.k;
        let score = post.var.chunks_exact(k.max(1)).map(|r| r.iter().sum()).collect();
        Ok(Predictive { probs: mc.mean_prob, ood_score: Some(score) })
    }
}

/// A method computed elsewhere (e.g. a GP on the EPK Gram), given by its predictive in every
/// setting of [`settings`] (keyed by setting name).
#[derive(Clone, Debug, PartialEq)]
pub struct ExternalMethod {
    /// Method name (must differ from `map`, `temperature`, `laplace`, `ensemble`).
    pub name: String,
    /// Predictive per setting name.
    pub settings: BTreeMap<String, Predictive>,
}

impl ExternalMethod {
    /// A GP method from its logit posterior in every setting (keyed by setting name), each
    /// pushed through [`Predictive::from_gp`] with the same `samples` and `seed`.
    ///
    /// # Shapes
    /// Each posterior's `mean`, `var`: `[N_s, K]`.
    pub fn from_gp_posteriors(name: impl Into<String>, posteriors: &BTreeMap<String, Posterior>, samples: usize, seed: u64) -> Result<Self> {
        let settings = posteriors.iter().map(|(s, p)| Ok((s.clone(), Predictive::from_gp(p, samples, seed)?))).collect::<Result<_>>()?;
        Ok(ExternalMethod { name: name.into(), settings })
    }
}

/// The trained network under test.
#[derive(Clone, Copy, Debug)]
pub struct Network<'a> {
    /// Its architecture (a classifier).
    pub arch: &'a Architecture,
    /// The trained parameters `w_N`.
    pub params: &'a Params,
    /// The initial parameters `w_0` (needed with `zero_output`).
    pub init: Option<&'a Params>,
}

/// The built-in methods in every setting: their predictions (method by method, settings in
/// order), their fits, and the seconds each took (fit + predict in every setting).
#[derive(Clone, Debug)]
pub struct BuiltinMethods {
    /// `map`, `temperature`, `laplace` and (when given) `ensemble`, each in every setting.
    pub predictions: Vec<MethodPrediction>,
    /// The temperature fitted on the validation split.
    pub temperature: TemperatureFit,
    /// The last-layer Laplace fit.
    pub laplace: LaplaceSummary,
    /// Wall-clock seconds per method: fit (temperature, Laplace) plus prediction in every
    /// setting; the ensemble's members are trained elsewhere, so its entry is prediction only.
    pub seconds: Vec<(String, f64)>,
}

/// Fits the temperature on `data`'s validation split and the last-layer Laplace on its training
/// set, and evaluates `map`, `temperature`, `laplace` and `ensemble` (when given) at the
/// `settings` ([`settings`]). Methods as in [`run_benchmark`].
///
/// # Shapes
/// `data.x_train: [M, 784]`, validation `[V, 784]`; each setting's `x`: `[N_s, 784]`.
pub fn builtin_methods(net: Network<'_>, data: &Dataset, ensemble: Option<&Ensemble>, settings: &[Setting], cfg: &BenchmarkConfig) -> Result<BuiltinMethods> {
    let k = net.arch.outputs();
    if k != data.num_outputs {
        return Err(Error::ShapeMismatch { what: "network outputs vs dataset classes".into(), expected: vec![data.num_outputs], got: vec![k] });
    }
    let Targets::Labels(y_train) = &data.y_train else {
        return Err(Error::Config("the uncertainty benchmark needs a classification dataset".into()));
    };
    let val = data.validation.as_ref().ok_or_else(|| {
        Error::Config("the uncertainty benchmark fits the temperature on a validation split; the dataset has none (data.val_per_class)".into())
    })?;
    let Targets::Labels(y_val) = &val.y else {
        return Err(Error::Config("validation targets must be labels".into()));
    };
    if let Some(ens) = ensemble {
        if let Some(m) = ens.members.iter().find(|m| m.arch.outputs() != k || m.arch.input_dim() != data.dim) {
            return Err(Error::Config(format!("ensemble member {} does not fit the dataset", m.dir.display())));
        }
    }
    let mut predictions = Vec::new();
    let mut seconds = Vec::new();
    let push = |preds: &mut Vec<MethodPrediction>, method: Method, setting: &str, p: Predictive| {
        preds.push(MethodPrediction { method: method.to_string(), setting: setting.into(), probs: p.probs, ood_score: p.ood_score });
    };
    let logits = |x: &[f64]| network_logits(net.arch, net.params, net.init, x);

    let t = std::time::Instant::now();
    for s in settings {
        push(&mut predictions, Method::Map, &s.info.name, Predictive::from_probs(metrics::softmax_rows(&logits(&s.x)?, k)?));
    }
    seconds.push((Method::Map.to_string(), t.elapsed().as_secs_f64()));

    let t = std::time::Instant::now();
    let temperature = fit_temperature(&logits(&val.x)?, y_val, k)?;
    for s in settings {
        let probs = temperature::tempered_softmax(&logits(&s.x)?, k, temperature.temperature)?;
        push(&mut predictions, Method::Temperature, &s.info.name, Predictive::from_probs(probs));
    }
    seconds.push((Method::Temperature.to_string(), t.elapsed().as_secs_f64()));

    let t = std::time::Instant::now();
    let lap = LastLayerLaplace::fit(net.arch, net.params, net.init, &data.x_train, y_train, &cfg.laplace)?;
    for s in settings {
        let post = lap.predict(&s.x)?;
        let p = Predictive { probs: post.mc_softmax(cfg.mc_samples, cfg.mc_seed)?, ood_score: Some(post.total_variance()) };
        push(&mut predictions, Method::Laplace, &s.info.name, p);
    }
    seconds.push((Method::Laplace.to_string(), t.elapsed().as_secs_f64()));

    if let Some(ens) = ensemble {
        let t = std::time::Instant::now();
        for s in settings {
            push(&mut predictions, Method::Ensemble, &s.info.name, Predictive::from_probs(ens.predict(&s.x)?));
        }
        seconds.push((Method::Ensemble.to_string(), t.elapsed().as_secs_f64()));
    }
    let p = lap.posterior();
    let laplace = LaplaceSummary {
        prior_precision: p.prior_precision(),
        log_marginal_likelihood: p.evidence(),
        log_likelihood: p.log_likelihood(),
        num_params: p.num_params(),
        clamped_eigenvalues: p.clamped_eigenvalues(),
        mc_samples: cfg.mc_samples,
        mc_seed: cfg.mc_seed,
        grid: p.grid().to_vec(),
    };
    Ok(BuiltinMethods { predictions, temperature, laplace, seconds })
}

/// Appends the external methods' predictives in every setting (method by method) to
/// `predictions`. Errors: a name taken by a built-in method or by an earlier external one, or a
/// missing setting.
pub(crate) fn push_external(predictions: &mut Vec<MethodPrediction>, settings: &[SettingInfo], external: &[ExternalMethod]) -> Result<()> {
    for (i, e) in external.iter().enumerate() {
        if Method::BUILTIN.iter().any(|m| m.to_string() == e.name) || external[..i].iter().any(|o| o.name == e.name) {
            return Err(Error::Config(format!("external method name {:?} is taken", e.name)));
        }
    }
    for e in external {
        for s in settings {
            let p = e.settings.get(&s.name).ok_or_else(|| Error::Data(format!("external method {} has no predictive for setting {}", e.name, s.name)))?;
            predictions.push(MethodPrediction { method: e.name.clone(), setting: s.name.clone(), probs: p.probs.clone(), ood_score: p.ood_score.clone() });
        }
    }
    Ok(())
}

/// Runs the benchmark: fits the temperature on `data`'s validation split, the last-layer
/// Laplace on its training set, evaluates every method in every setting of [`settings`] and
/// scores them ([`report::score`]).
///
/// Methods: `map` (the network's softmax), `temperature` (`softmax(z / T)`), `laplace` (MC
/// predictive with `cfg.mc_samples` draws; OOD score the trace of the logit covariance),
/// `ensemble` (when given: the members' mean softmax), then each external method.
///
/// Errors: no validation split, not 28×28 images, an external method missing a setting or
/// named like a built-in one, and every error of the pieces.
///
/// # Shapes
/// `data.x_train: [M, 784]`, validation `[V, 784]`, `x_test: [P, 784]`; external predictives
/// `[N_s, K]` per setting.
pub fn run_benchmark(net: Network<'_>, data: &Dataset, ensemble: Option<&Ensemble>, external: &[ExternalMethod], cfg: &BenchmarkConfig) -> Result<UqResults> {
    if data.validation.is_none() {
        return Err(Error::Config("the uncertainty benchmark fits the temperature on a validation split; the dataset has none (data.val_per_class)".into()));
    }
    let settings = settings(data, cfg)?;
    let infos: Vec<SettingInfo> = settings.iter().map(|s| s.info.clone()).collect();
    // Names first, so that a bad external method fails before any fit.
    push_external(&mut Vec::new(), &infos, external)?;
    let b = builtin_methods(net, data, ensemble, &settings, cfg)?;
    let mut predictions = b.predictions;
    push_external(&mut predictions, &infos, external)?;
    results(net.arch.outputs(), infos, predictions, Some(b.temperature), Some(b.laplace), cfg)
}

/// Scores `predictions` ([`report::score`]) into the benchmark's results.
pub fn results(k: usize, settings: Vec<SettingInfo>, predictions: Vec<MethodPrediction>, temperature: Option<TemperatureFit>, laplace: Option<LaplaceSummary>, cfg: &BenchmarkConfig) -> Result<UqResults> {
    let metrics = report::score(k, &settings, &predictions)?;
    Ok(UqResults {
        k,
        settings,
        predictions,
        metrics,
        temperature,
        laplace,
        config: serde_json::to_value(cfg).map_err(|e| Error::Data(format!("benchmark config: {e}")))?,
    })
}
