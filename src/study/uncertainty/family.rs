//! The kernel GPs of one kernel (a [`KernelFamily`]) in every setting, stage by stage: the fits
//! (each GP's training Gram and hyper-parameters; the function-space Laplace fits on the
//! protocol GP's training Gram), the validation split's row Gram and the calibrations on it,
//! and setting by setting its row Gram (one kernel computation per setting) and its posteriors
//! and predictives, every stage cached under `{kernel}-gp/` by its key
//! ([`crate::study::cache`]).
//!
//! Memory: a setting's rows are computed, consumed and dropped before the next setting's are
//! computed, so the rows held at once are one setting's (the validation split's before them),
//! besides the training Gram; each computation evaluates the training side of every step again
//! (the cost of holding less).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::spec::KernelFamily;
use super::{labels, CACHE_VERSION};
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::gp::{Curvature, Posterior};
use crate::io::{self, NamedArray, SafeFile};
use crate::model::Params;
use crate::study::cache::{self, f64_bytes, Clock, Key, Keyed};
use crate::train::fnv1a;
use crate::trajectory::Run;
use crate::uncertainty::kernel_gp::{self, GramCheck, KernelGp, KernelGpFit};
use crate::uncertainty::method::{FslVariant, GpKernel, Method};
use crate::uncertainty::record::FslStudyFit;
use crate::uncertainty::{BenchmarkConfig, ExternalMethod, Predictive, Setting};

#[derive(Serialize, Deserialize)]
struct GpSettingCache {
    key: Key,
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
    key: Key,
    fit: Option<KernelGpFit>,
    error: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct FslCache {
    key: Key,
    fits: Vec<FslStudyFit>,
}

/// A cross-class fit's searches on the Cholesky route, recorded as each finishes so that a study
/// stopped after them resumes with one factorisation per δ instead of the searches (which are
/// deterministic: the same δ). At the benchmark's size the evidence's search is about 14
/// factorisations of `[20 000, 20 000]` and the validation grid about 20 with their solves.
#[derive(Serialize, Deserialize)]
struct KxkSearchMemo {
    key: Key,
    /// The fit as searched: δ by the evidence, its numbers and seconds (cache JSON is
    /// bit-exact).
    fit: crate::gp::FslFit,
    /// The validation grid's visited `(δ, NLL)` (absent: not yet).
    grid: Option<Vec<(f64, f64)>>,
}

impl KxkSearchMemo {
    /// Whether a fit's searches are recorded: the cross-class fits on the Cholesky route (the
    /// eigen route's one eigendecomposition serves every δ, so there is nothing to skip).
    fn kept(fam: &KernelFamily, kxk: bool) -> bool {
        kxk && fam.fsl_kxk_solver == crate::gp::KxkSolver::Cholesky
    }
    fn path(st: &Stages, c: Curvature) -> PathBuf {
        st.dir.join(format!("fsl-kxk-{c}.search.json"))
    }
    fn key(st: &Stages, c: Curvature) -> Key {
        Key::of(&[st.fam_key.as_str(), &format!("kxk-{c}"), "searches"])
    }
    fn read(st: &Stages, c: Curvature) -> Option<KxkSearchMemo> {
        cache::read_keyed(&Self::path(st, c), &Self::key(st, c))
    }
}

impl Keyed for KxkSearchMemo {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// A family's training Gram in the full layout (`[M, M, K, K]`, 3.2 GB at the benchmark's size,
/// about 20 minutes of the EPK's), written beside this record as raw f64 (`train-gram.f64`) so
/// that a study stopped after it reads it back instead of computing it again.
#[derive(Serialize, Deserialize)]
struct TrainGramMemo {
    key: Key,
    m: usize,
    k: usize,
    /// The computation's seconds, outputs and check, as computed.
    seconds: f64,
    network: Vec<f64>,
    bias: Vec<f64>,
    check: GramCheck,
}

impl TrainGramMemo {
    fn paths(st: &Stages) -> (PathBuf, PathBuf) {
        (st.dir.join("train-gram.json"), st.dir.join("train-gram.f64"))
    }
    fn key(fit_key: &Key) -> Key {
        Key::of(&[fit_key.as_str(), "train-gram"])
    }
    /// The record, when it carries `fit_key`'s key and its values file has the record's size.
    fn read(st: &Stages, fit_key: &Key) -> Option<TrainGramMemo> {
        let (json, values) = Self::paths(st);
        let memo: TrainGramMemo = cache::read_keyed(&json, &Self::key(fit_key))?;
        let n = memo.m * memo.m * memo.k * memo.k;
        (std::fs::metadata(values).ok()?.len() == 8 * n as u64).then_some(memo)
    }
    fn write(st: &Stages, fit_key: &Key, b: &kernel_gp::TrainBlocks) -> Result<()> {
        let (json, values) = Self::paths(st);
        let full = b.full.as_ref().ok_or_else(|| Error::Data("a training Gram is written to the cache in the full layout only".into()))?;
        io::write_f64_atomic(&values, full)?;
        cache::write_json(&json, &TrainGramMemo { key: Self::key(fit_key), m: b.m, k: b.k, seconds: b.seconds, network: b.network.clone(), bias: b.bias.clone(), check: b.check.clone() })
    }
    fn load(self, st: &Stages) -> Result<kernel_gp::TrainBlocks> {
        let (m, k) = (self.m, self.k);
        let gram = io::read_f64(&Self::paths(st).1, m * m * k * k)?;
        Ok(kernel_gp::TrainBlocks::from_gram(gram, crate::kernel::Layout::Full, self.network, self.bias, self.check, m, k, self.seconds))
    }
}

impl Keyed for TrainGramMemo {
    fn key(&self) -> &Key {
        &self.key
    }
}

impl Keyed for GpSettingCache {
    fn key(&self) -> &Key {
        &self.key
    }
}
impl Keyed for GpFitCache {
    fn key(&self) -> &Key {
        &self.key
    }
}
impl Keyed for FslCache {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// How the row Grams are computed, part of every setting's key: one kernel computation per
/// setting (and one for the validation split). Caches of the earlier layout (every setting's rows
/// from one computation, whose checks count the whole computation's evaluations) carry keys
/// without it and are recomputed, never read as this layout's.
const ROWS: &str = "rows:per-setting";

/// One setting of a family from the cache: each method's predictive, the row Gram's check, the
/// ablations without a predictive there (method, reason) and the function-space Laplace fits'
/// smallest posterior variance there (curvature, variance, clamped).
type SettingResult = (BTreeMap<Method, Predictive>, GramCheck, Vec<(String, String)>, Vec<(String, f64, usize)>);

/// What a kernel family produced: its methods' predictives, the fits, the row Grams' checks,
/// and the ablations that failed (method, error).
pub(super) struct FamilyOutput {
    pub methods: Vec<ExternalMethod>,
    pub fits: Vec<(String, KernelGpFit)>,
    pub checks: Vec<GramCheck>,
    pub failed: Vec<(String, String)>,
    pub fsl: Vec<FslStudyFit>,
}

/// The validation split's inputs and labels (the function-space Laplace calibration's data).
fn data_validation(data: &Dataset) -> Result<(&[f64], &[usize])> {
    let v = data.validation.as_ref().ok_or_else(|| Error::Config("the benchmark needs a validation split".into()))?;
    Ok((&v.x, labels(&v.y)?))
}

/// A function-space Laplace approximation: on the class-diagonal blocks or the cross-class
/// kernel.
#[derive(Clone)]
enum FslModel {
    Diag(crate::gp::FunctionalLaplace),
    Kxk(crate::gp::CrossClassLaplace),
}

impl FslModel {
    fn predict(&self, rows: &kernel_gp::RowGram) -> Result<crate::gp::FslPredictive> {
        match self {
            FslModel::Diag(f) => f.predict(&crate::gp::FslRows { k_cross: &rows.k_cross, k_diag: &rows.k_test_diag, mean: &rows.network, p: rows.p }),
            FslModel::Kxk(f) => f.predict(&kxk_rows(rows)?),
        }
    }
    fn fit(&self) -> &crate::gp::FslFit {
        match self {
            FslModel::Diag(f) => &f.fit,
            FslModel::Kxk(f) => &f.fit,
        }
    }
    fn delta(&self) -> f64 {
        self.fit().delta
    }
    /// Frees what only the δ searches need ([`crate::gp::CrossClassLaplace::release_search`]).
    fn release_search(&mut self) {
        if let FslModel::Kxk(f) = self {
            f.release_search();
        }
    }
    /// δ by the validation grid, where the model has one (every cross-class fit; the
    /// class-diagonal curvature on the class-diagonal kernel).
    fn grid_search(&mut self, rows: &kernel_gp::RowGram, labels: &[usize]) -> Option<Result<Vec<(f64, f64)>>> {
        match self {
            FslModel::Diag(f) if f.curvature() == Curvature::ClassDiagonal => {
                Some(f.grid_search(&crate::gp::FslRows { k_cross: &rows.k_cross, k_diag: &rows.k_test_diag, mean: &rows.network, p: rows.p }, labels, -4.0, 4.0, 100))
            }
            FslModel::Diag(_) => None,
            FslModel::Kxk(f) => Some(kxk_rows(rows).and_then(|r| f.grid_search(&r, labels, -4.0, 4.0, 100))),
        }
    }
}

/// A row Gram's every-block view (computed in the full layout).
fn kxk_rows(rows: &kernel_gp::RowGram) -> Result<crate::gp::KxkRows<'_>> {
    match (&rows.k_cross_full, &rows.k_self) {
        (Some(k_cross), Some(k_self)) => Ok(crate::gp::KxkRows { k_cross, k_self, mean: &rows.network, p: rows.p }),
        _ => Err(Error::Data("a cross-class function-space Laplace fit needs its rows in the full layout".into())),
    }
}

/// A function-space Laplace fit of a family with its validation calibrations.
struct FslFitted {
    curvature: Curvature,
    /// On the cross-class kernel.
    kxk: bool,
    fsl: FslModel,
    /// δ by the validation grid: the refitted approximation and the sweep.
    grid: Option<(FslModel, Vec<(f64, f64)>)>,
    cal: Option<FslCalibrated>,
    min_variance: Vec<(String, f64, usize)>,
}

struct FslCalibrated {
    temperature: crate::gp::Calibration,
    calibration: crate::gp::Calibration,
}

impl FslFitted {
    /// The name of this fit's `variant` method on `kernel`.
    fn method(&self, kernel: GpKernel, variant: FslVariant) -> Method {
        if self.kxk {
            Method::FslKxk(kernel, self.curvature, variant)
        } else {
            Method::Fsl(kernel, self.curvature, variant)
        }
    }
    /// The label of its smallest-variance records: the curvature, `kxk-` before it on the
    /// cross-class kernel.
    fn label(&self) -> String {
        if self.kxk {
            format!("kxk-{}", self.curvature)
        } else {
            self.curvature.to_string()
        }
    }

    fn report(&self, kernel: &str) -> FslStudyFit {
        let cal = self.cal.as_ref().expect("calibrated before the report");
        FslStudyFit {
            kernel: kernel.into(),
            fit: self.fsl.fit().clone(),
            temperature: cal.temperature.clone(),
            calibration: cal.calibration.clone(),
            grid: self.grid.as_ref().map(|(g, sweep)| (g.delta(), sweep.clone())),
            min_variance: self.min_variance.clone(),
        }
    }

    /// This fit's methods at one setting's rows, (smallest variance, clamped count), and the
    /// cross-class probit method's `K × K` covariances `[P, K, K]` (for the laplace-torch check).
    #[allow(clippy::type_complexity)]
    fn predict_setting(&self, fam: &KernelFamily, rows: &kernel_gp::RowGram, bench: &BenchmarkConfig) -> Result<(BTreeMap<Method, Predictive>, (f64, usize), Option<(Method, Vec<f64>)>)> {
        let pred = self.fsl.predict(rows)?;
        let cal = self.cal.as_ref().expect("calibrated before predicting");
        let trace = |post: &crate::gp::LogitPosterior, scale: f64| -> Vec<f64> { (0..post.p).map(|q| scale * (0..post.k).map(|c| post.cov[(q * post.k + c) * post.k + c]).sum::<f64>()).collect() };
        let mut out = BTreeMap::new();
        for m in fam.fsl_methods() {
            let (Method::Fsl(_, _, v) | Method::FslKxk(_, _, v)) = m else { unreachable!("fsl_methods gives function-space Laplace methods") };
            if m != self.method(fam.kernel, v) {
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
                    let (g, _) = self.grid.as_ref().expect("a fit with a grid variant has its grid");
                    let gp = g.predict(rows)?;
                    Predictive { probs: gp.post.probit(1.0, 1.0), ood_score: Some(trace(&gp.post, 1.0)) }
                }
            };
            out.insert(m, p);
        }
        let cov = self.kxk.then(|| (self.method(fam.kernel, FslVariant::Probit), pred.post.cov.clone()));
        Ok((out, (pred.min_variance, pred.clamped), cov))
    }
}

/// The timing stage of a function-space Laplace fit (`kxk`: on the cross-class kernel).
fn fsl_fit_stage(kernel: &str, c: Curvature, kxk: bool, solver: crate::gp::KxkSolver) -> String {
    if kxk && solver == crate::gp::KxkSolver::Cholesky {
        format!("fsl-{kernel}-kxk-{c}: fit (Cholesky of K, G = FᵀKF, δ by Brent's search on the evidence: one Cholesky of δI + G per step)")
    } else if kxk {
        format!("fsl-{kernel}-kxk-{c}: fit (eigendecompositions of K and G = FᵀKF, δ by the evidence, Cholesky of I + G/δ)")
    } else {
        format!("fsl-{kernel}-{c}: fit (eigendecompositions, δ by the evidence)")
    }
}

/// The timing stage of a function-space Laplace validation calibration.
fn fsl_calibration_stage(kernel: &str, c: Curvature, kxk: bool) -> String {
    if kxk {
        format!("fsl-{kernel}-kxk-{c}: validation calibration (T; T and s; δ grid)")
    } else {
        format!("fsl-{kernel}-{c}: validation calibration (T; T and s; δ grid)")
    }
}

/// Every function-space Laplace fit of a family: (curvature, on the cross-class kernel).
fn fsl_fits_of(fam: &KernelFamily) -> Vec<(Curvature, bool)> {
    fam.fsl.iter().map(|&c| (c, false)).chain(fam.fsl_kxk.iter().map(|&c| (c, true))).collect()
}

/// The validation calibrations of every function-space Laplace fit of a family: T alone, (T, s),
/// and for the class-diagonal curvature δ by the validation grid.
///
/// On the Cholesky route a cross-class fit's grid sweep is recorded in its [`KxkSearchMemo`]; a
/// resumed study takes the recorded sweep's δ (one factorisation; the stage's time is the
/// ledger's, the resumption timed apart). Afterwards the cross-class fits release what only
/// the searches need (the packed `G`, 1.6 GB each at the benchmark's size): the settings'
/// predictions need the factors alone.
fn calibrate_fsl(clock: &mut Clock, fam: &KernelFamily, st: &Stages, fitted: &mut [FslFitted], vrows: &kernel_gp::RowGram, vlabels: &[usize]) -> Result<()> {
    let key = &st.fam_key;
    for f in fitted.iter_mut() {
        let name = f.method(fam.kernel, FslVariant::Probit).to_string();
        let stage = fsl_calibration_stage(&fam.label(), f.curvature, f.kxk);
        let memo = KxkSearchMemo::kept(fam, f.kxk).then(|| KxkSearchMemo::read(st, f.curvature)).flatten();
        let recorded = memo.as_ref().and_then(|m| m.grid.clone()).filter(|_| clock.has(&stage, key));
        let run_stage = if recorded.is_some() {
            clock.reuse(&stage, key);
            format!("{name}: validation calibration at the grid's recorded δ (resumed)")
        } else {
            stage
        };
        let (cal, grid, mins) = clock.run(&run_stage, &name, key, || {
            let pred = f.fsl.predict(vrows)?;
            let temperature = crate::gp::functional::calibrate(&pred.post, vlabels, &[1.0])?;
            let calibration = crate::gp::functional::calibrate(&pred.post, vlabels, &crate::gp::functional::calibration_scales())?;
            let mut g = f.fsl.clone();
            let grid = match (&mut g, recorded) {
                (FslModel::Kxk(m), Some(sweep)) => {
                    m.adopt_grid(&sweep)?;
                    Some((g, sweep))
                }
                _ => match g.grid_search(vrows, vlabels) {
                    Some(sweep) => Some((g, sweep?)),
                    None => None,
                },
            };
            Ok((FslCalibrated { temperature, calibration }, grid, (pred.min_variance, pred.clamped)))
        })?;
        if let (Some(mut memo), Some((_, sweep))) = (memo, &grid) {
            if memo.grid.is_none() {
                memo.grid = Some(sweep.clone());
                cache::write_json(&KxkSearchMemo::path(st, f.curvature), &memo)?;
            }
        }
        f.fsl.release_search();
        f.grid = grid.map(|(mut g, sweep)| {
            g.release_search();
            (g, sweep)
        });
        f.cal = Some(cal);
        f.min_variance.push(("val".into(), mins.0, mins.1));
    }
    Ok(())
}

/// The keys and stage names of a family's stages.
struct Stages {
    dir: PathBuf,
    /// Each GP's fit: its run and specification.
    fit_keys: Vec<Key>,
    /// The whole family: the fits, the netmean ablations, the Monte Carlo, the curvatures.
    fam_key: Key,
    /// The validation split's row Gram (the function-space Laplace calibrations' rows).
    val_key: Key,
    /// How the rows are computed: [`ROWS`], with the memory budget when there is one.
    rows: String,
    n: usize,
}

impl Stages {
    fn new(fam: &KernelFamily, run: &Run, bench: &BenchmarkConfig, val_x: &[f64], cache_dir: &Path) -> Stages {
        // A family with cross-class fits computes its Grams in the full layout.
        let layout = if fam.fsl_kxk.is_empty() { String::new() } else { "|layout:full".into() };
        let fit_keys: Vec<Key> = fam.gps.iter().map(|(_, g)| Key::of(&[&CACHE_VERSION.to_string(), &run.manifest.run_id, &run.manifest.created_by, &format!("{}{layout}", g.key())])).collect();
        let netmean = fam.netmean.iter().map(|(a, b)| format!("{a}={b}")).collect::<Vec<_>>().join(",");
        let route = if fam.fsl_kxk_solver == crate::gp::KxkSolver::Cholesky { "-cholesky" } else { "" };
        let fsl_names = fam.fsl.iter().map(|c| c.to_string()).chain(fam.fsl_kxk.iter().map(|c| format!("kxk-{c}{route}"))).collect::<Vec<_>>().join(",");
        let fits = fit_keys.iter().map(Key::as_str).collect::<Vec<_>>().join(",");
        let fam_key = Key::of(&[&fits, &netmean, &bench.mc_samples.to_string(), &bench.mc_seed.to_string(), &fsl_names]);
        // Row blocks under a memory budget give the same rows up to rounding: a budget is part
        // of the keys, so that a cached setting is always the computation its key names.
        let rows = match fam.row_memory {
            None => ROWS.to_string(),
            Some(b) => format!("{ROWS}|memory:{b}"),
        };
        let val_key = Key::of(&[fam_key.as_str(), &rows, "val", &format!("{:016x}", fnv1a(&f64_bytes(val_x)))]);
        Stages { dir: cache_dir.join(format!("{}-gp", fam.label())), fit_keys, fam_key, val_key, rows, n: run.dataset.n_train() }
    }
    /// A setting's key: the family's, its name and inputs, and how its rows are computed
    /// ([`ROWS`]: a setting cached when the rows came from one computation over every setting
    /// has another key, and is recomputed).
    fn setting_key(&self, s: &Setting) -> Key {
        Key::of(&[self.fam_key.as_str(), &self.rows, &s.info.name, &format!("{:016x}", fnv1a(&f64_bytes(&s.x)))])
    }
    /// The timing stage of the row Gram at `name` (`n` points).
    fn rows_stage(fam: &KernelFamily, name: &str, n: usize) -> String {
        format!("{} Gram at `{name}` ({n} points)", fam.label().to_uppercase())
    }
    fn setting_stage(fam: &KernelFamily, s: &Setting) -> String {
        format!("{} posteriors and MC softmax at `{}` ({} points)", fam.label().to_uppercase(), s.info.name, s.info.n)
    }
    fn fit_stage(&self, m: &Method) -> String {
        format!("{m}: training Gram ({} × {}) and GP fit", self.n, self.n)
    }

    /// A setting from the cache, when its files carry its key and the ledger its time.
    fn cached_setting(&self, clock: &Clock, fam: &KernelFamily, s: &Setting) -> Option<SettingResult> {
        let key = self.setting_key(s);
        let c: GpSettingCache = cache::read_keyed(&self.dir.join(format!("{}.json", s.info.name)), &key)?;
        let f = SafeFile::open(&self.dir.join(format!("{}.safetensors", s.info.name))).ok()?;
        if f.metadata().get("key").map(String::as_str) != Some(key.as_str()) || !clock.has(&Self::setting_stage(fam, s), &key) {
            return None;
        }
        let (n, k) = (s.info.n, c.classes);
        let mut out = BTreeMap::new();
        for m in fam.methods().into_iter().filter(|m| !c.failed.iter().any(|f| f.0 == m.to_string())) {
            let probs = f.f64(&format!("{m}/probs"), Some(&[n, k])).ok()?.1;
            let score = f.f64(&format!("{m}/ood_score"), Some(&[n])).ok()?.1;
            out.insert(m, Predictive { probs, ood_score: Some(score) });
        }
        Some((out, c.check, c.failed, c.fsl_min_variance))
    }
}

/// The fits of a family: reported fits, failed ablations, the fitted GPs (None where the fit
/// failed; empty when reused) and the function-space Laplace fits (empty when reused).
struct Fits {
    fits: Vec<(String, KernelGpFit)>,
    failed: Vec<(String, String)>,
    gps: Vec<Option<KernelGp>>,
    fsl: Vec<FslFitted>,
}

/// The family's fits from the cache (with their recorded times), when every one is there.
fn reuse_fits(clock: &mut Clock, fam: &KernelFamily, st: &Stages) -> Option<Fits> {
    let cached: Vec<GpFitCache> =
        fam.gps.iter().zip(&st.fit_keys).map(|((m, _), key)| cache::read_keyed::<GpFitCache>(&st.dir.join(format!("{m}.fit.json")), key).filter(|_| clock.has(&st.fit_stage(m), key))).collect::<Option<_>>()?;
    let mut out = Fits { fits: Vec::new(), failed: Vec::new(), gps: Vec::new(), fsl: Vec::new() };
    for (((m, _), key), c) in fam.gps.iter().zip(&st.fit_keys).zip(cached) {
        clock.reuse(&st.fit_stage(m), key);
        match c {
            GpFitCache { fit: Some(f), .. } => out.fits.push((m.to_string(), f)),
            GpFitCache { error, .. } => out.failed.push((m.to_string(), error.unwrap_or_default())),
        }
    }
    // The function-space Laplace stages, in the order they ran (their timings stay in the report).
    for (c, kxk) in fsl_fits_of(fam) {
        let stage = fsl_fit_stage(&fam.label(), c, kxk, fam.fsl_kxk_solver);
        if clock.has(&stage, &st.fam_key) {
            clock.reuse(&stage, &st.fam_key);
        }
    }
    Some(out)
}

/// Fits every GP of the family (the first on training blocks shared with the function-space
/// Laplace fits) and the function-space Laplace curvatures. The protocol GP's failure is an
/// error; an ablation's is recorded.
fn fit_family(clock: &mut Clock, fam: &KernelFamily, st: &Stages, run: &Run, states: &[Params], progress: bool) -> Result<Fits> {
    let mut out = Fits { fits: Vec::new(), failed: Vec::new(), gps: Vec::new(), fsl: Vec::new() };
    let mut shared_blocks: Option<kernel_gp::TrainBlocks> = None;
    for (i, ((m, spec), key)) in fam.gps.iter().zip(&st.fit_keys).enumerate() {
        let name = m.to_string();
        let bar = crate::progress::Progress::new(progress, 1, &format!("{name} fit {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]"));
        let show = |d: usize, t: usize| {
            bar.set_length(t as u64);
            bar.set_position(d as u64);
        };
        // A full-layout training Gram written by a stopped study: read back, the GP refitted on
        // it (the stage's time is the ledger's, the resumption timed apart).
        let memo = (i == 0 && fam.layout() == crate::kernel::Layout::Full && clock.has(&st.fit_stage(m), key)).then(|| TrainGramMemo::read(st, key)).flatten();
        let stage = if memo.is_some() {
            clock.reuse(&st.fit_stage(m), key);
            format!("{name}: training Gram read from the cache, GP refitted (resumed)")
        } else {
            st.fit_stage(m)
        };
        let g = clock.run(&stage, &name, key, || {
            let g = if i == 0 {
                let blocks = match memo {
                    Some(memo) => memo.load(st),
                    None => kernel_gp::TrainBlocks::compute(run, states, spec, fam.layout(), &show).and_then(|b| {
                        if fam.layout() == crate::kernel::Layout::Full {
                            TrainGramMemo::write(st, key, &b)?;
                        }
                        Ok(b)
                    }),
                };
                blocks.and_then(|b| {
                    let g = KernelGp::fit_blocks(&b, spec);
                    shared_blocks = Some(b);
                    g
                })
            } else {
                KernelGp::fit(run, states, spec, &show)
            };
            match g {
                Err(e) if i > 0 => Ok(Err(e.to_string())),
                other => other.map(Ok),
            }
        })?;
        bar.finish_and_clear();
        let path = st.dir.join(format!("{name}.fit.json"));
        match g {
            Ok(g) => {
                cache::write_json(&path, &GpFitCache { key: key.clone(), fit: Some(g.fit.clone()), error: None })?;
                out.fits.push((name, g.fit.clone()));
                out.gps.push(Some(g));
            }
            Err(e) => {
                clock.say(&format!("{name}: the ablation's fit failed: {e}"));
                cache::write_json(&path, &GpFitCache { key: key.clone(), fit: None, error: Some(e.clone()) })?;
                out.failed.push((name, e));
                out.gps.push(None);
            }
        }
    }
    if !fam.fsl.is_empty() || !fam.fsl_kxk.is_empty() {
        let blocks = shared_blocks.ok_or_else(|| Error::Data(format!("{}: the training Gram for the function-space Laplace fits was not computed", fam.label())))?;
        let labels = labels(&run.dataset.y_train)?.to_vec();
        let kxk_train = || -> Result<crate::gp::KxkTrain<'_>> {
            let full = blocks.full.as_ref().ok_or_else(|| Error::Data(format!("{}: the training Gram was not computed in the full layout", fam.label())))?;
            Ok(crate::gp::KxkTrain { k_train: full, logits: &blocks.network, bias: &blocks.bias, labels: &labels, m: blocks.m, k: blocks.k })
        };
        for (c, kxk) in fsl_fits_of(fam) {
            let name = if kxk { Method::FslKxk(fam.kernel, c, FslVariant::Probit) } else { Method::Fsl(fam.kernel, c, FslVariant::Probit) }.to_string();
            let stage = fsl_fit_stage(&fam.label(), c, kxk, fam.fsl_kxk_solver);
            let memo = KxkSearchMemo::kept(fam, kxk).then(|| KxkSearchMemo::read(st, c)).flatten();
            if let Some(memo) = memo.filter(|_| clock.has(&stage, &st.fam_key)) {
                // The evidence's search ran before (its time is the ledger's): one factorisation
                // at the δ it found, the fit's numbers as recorded.
                clock.reuse(&stage, &st.fam_key);
                let (delta, fit) = (memo.fit.delta, memo.fit);
                let fsl = clock.run(&format!("{name}: refactored at the evidence's recorded δ (resumed)"), &name, &st.fam_key, || {
                    let mut f = crate::gp::CrossClassLaplace::fit_with(&kxk_train()?, c, crate::gp::Prior::Fixed(delta), fam.fsl_kxk_solver)?;
                    f.fit = fit;
                    Ok(FslModel::Kxk(f))
                })?;
                out.fsl.push(FslFitted { curvature: c, kxk, fsl, grid: None, cal: None, min_variance: Vec::new() });
                continue;
            }
            let fsl = clock.run(&stage, &name, &st.fam_key, || {
                if kxk {
                    crate::gp::CrossClassLaplace::fit_with(&kxk_train()?, c, crate::gp::Prior::Evidence, fam.fsl_kxk_solver).map(FslModel::Kxk)
                } else {
                    let train = crate::gp::FslTrain { k_train: &blocks.k_train, logits: &blocks.network, bias: &blocks.bias, labels: &labels, m: blocks.m, k: blocks.k };
                    crate::gp::FunctionalLaplace::fit(&train, c, crate::gp::Prior::Evidence).map(FslModel::Diag)
                }
            })?;
            if let (FslModel::Kxk(f), true) = (&fsl, KxkSearchMemo::kept(fam, kxk)) {
                let memo = KxkSearchMemo { key: KxkSearchMemo::key(st, c), fit: f.fit.clone(), grid: None };
                cache::write_json(&KxkSearchMemo::path(st, c), &memo)?;
            }
            out.fsl.push(FslFitted { curvature: c, kxk, fsl, grid: None, cal: None, min_variance: Vec::new() });
        }
    }
    Ok(out)
}

/// The row Gram of one set of rows (a setting, or the validation split: `x [P, 784]`, named
/// `name`) in the family's layout, from its own kernel computation, timed as `stage`.
#[allow(clippy::too_many_arguments)]
fn rows_at(clock: &mut Clock, fam: &KernelFamily, stage: &str, key: &Key, x: &[f64], name: &str, run: &Run, states: &[Params], progress: bool) -> Result<kernel_gp::RowGram> {
    let p = x.len() / run.dataset.dim.max(1);
    let bar = crate::progress::Progress::new(progress, 1, &format!("{} rows at `{name}` ({p}) {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]", fam.label()));
    let rows = clock.run(stage, &fam.gps[0].0.to_string(), key, || {
        let mut g = kernel_gp::row_grams(run, states, fam.kind(), fam.rule, crate::kernel::Outputs::Logits, fam.kernel.window(), fam.layout(), &[(x, name)], fam.row_memory, &|d, t| {
            bar.set_length(t as u64);
            bar.set_position(d as u64);
        })
        .map_err(|e| match e {
            Error::OutOfMemoryBudget { what, needed_bytes, budget_bytes, .. } => Error::OutOfMemoryBudget {
                what: format!("{what} at `{name}`"),
                needed_bytes,
                budget_bytes,
                hint: "raise [uncertainty] row_memory (a setting's whole row Gram is held; only the work is blocked)".into(),
            },
            e => e,
        })?;
        Ok(g.pop().expect("one set, one row Gram"))
    })?;
    bar.finish_and_clear();
    Ok(rows)
}

/// The validation calibrations of the function-space Laplace fits, on the validation split's row
/// Gram (computed, used and dropped here) when some setting is computed (`compute`); else their
/// stages are reused.
#[allow(clippy::too_many_arguments)]
fn validation(clock: &mut Clock, fam: &KernelFamily, st: &Stages, fits: &mut Fits, compute: bool, val: (&[f64], &[usize]), run: &Run, states: &[Params], progress: bool) -> Result<()> {
    if fsl_fits_of(fam).is_empty() {
        return Ok(());
    }
    let stage = Stages::rows_stage(fam, "val", val.1.len());
    if !compute {
        if clock.has(&stage, &st.val_key) {
            clock.reuse(&stage, &st.val_key);
        }
        for (c, kxk) in fsl_fits_of(fam) {
            let stage = fsl_calibration_stage(&fam.label(), c, kxk);
            if clock.has(&stage, &st.fam_key) {
                clock.reuse(&stage, &st.fam_key);
            }
        }
        return Ok(());
    }
    let vrows = rows_at(clock, fam, &stage, &st.val_key, val.0, "val", run, states, progress)?;
    calibrate_fsl(clock, fam, st, &mut fits.fsl, &vrows, val.1)
}

/// One setting's posteriors and predictives from its row Gram, written to the cache: the
/// methods' predictives, the rows' check and the ablations without a predictive (method, reason).
fn predict_setting(fam: &KernelFamily, st: &Stages, fits: &mut Fits, s: &Setting, rows: kernel_gp::RowGram, bench: &BenchmarkConfig) -> Result<(BTreeMap<Method, Predictive>, GramCheck, Vec<(String, String)>)> {
    let key = st.setting_key(s);
    let mut errs: Vec<(String, String)> = Vec::new();
    let mut posts: BTreeMap<Method, Posterior> = BTreeMap::new();
    for (i, ((m, _), g)) in fam.gps.iter().zip(&fits.gps).enumerate() {
        let Some(g) = g else {
            errs.push((m.to_string(), "the fit failed".into()));
            continue;
        };
        match g.posterior(&rows) {
            Ok(p) => {
                posts.insert(*m, p);
            }
            Err(e) if i > 0 => errs.push((m.to_string(), e.to_string())),
            Err(e) => return Err(e),
        }
    }
    let mut preds = BTreeMap::new();
    let mut arrays = Vec::new();
    let k = posts[&fam.gps[0].0].k;
    // Array names in the order the files always had: by method name.
    let mut named: Vec<(String, &Posterior)> = posts.iter().map(|(m, p)| (m.to_string(), p)).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, post) in &named {
        arrays.push(NamedArray::f64(format!("{name}/mean"), vec![post.p, post.k], post.mean.clone()));
        arrays.push(NamedArray::f64(format!("{name}/var"), vec![post.p, post.k], post.var.clone()));
    }
    for (m, post) in &posts {
        preds.insert(*m, Predictive::from_gp(post, bench.mc_samples, bench.mc_seed)?);
    }
    for (m, from) in &fam.netmean {
        match posts.get(from) {
            Some(p) => {
                let post = Posterior { mean: rows.network.clone(), ..p.clone() };
                preds.insert(*m, Predictive::from_gp(&post, bench.mc_samples, bench.mc_seed)?);
            }
            None => errs.push((m.to_string(), format!("{from} failed"))),
        }
    }
    for f in &mut fits.fsl {
        let (fam_fsl, mins, cov) = f.predict_setting(fam, &rows, bench)?;
        f.min_variance.push((s.info.name.clone(), mins.0, mins.1));
        preds.extend(fam_fsl);
        if let Some((m, cov)) = cov {
            arrays.push(NamedArray::f64(format!("{m}/cov"), vec![rows.p, k, k], cov));
        }
    }
    let mut named: Vec<(String, &Predictive)> = preds.iter().map(|(m, p)| (m.to_string(), p)).collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    for (m, p) in &named {
        arrays.push(NamedArray::f64(format!("{m}/probs"), vec![rows.p, k], p.probs.clone()));
        arrays.push(NamedArray::f64(format!("{m}/ood_score"), vec![rows.p], p.ood_score.clone().unwrap_or_default()));
    }
    let meta = std::collections::HashMap::from([("key".to_string(), key.to_string())]);
    io::write_safetensors(&st.dir.join(format!("{}.safetensors", s.info.name)), &arrays, Some(meta))?;
    let fsl_min_variance = fits.fsl.iter().filter_map(|f| f.min_variance.last().map(|m| (f.label(), m.1, m.2))).collect();
    cache::write_json(&st.dir.join(format!("{}.json", s.info.name)), &GpSettingCache { key, classes: k, check: rows.check.clone(), failed: errs.clone(), fsl_min_variance })?;
    Ok((preds, rows.check, errs))
}

/// The GPs of a kernel family in every setting: fitted (when some setting is not cached), and
/// setting by setting the kernel's row Gram (its own computation, dropped once consumed), every
/// GP's posterior and the Monte-Carlo predictives, each setting cached. The family's first GP is the protocol's method: its errors end the
/// study; an ablation that fails (a symmetrised Gram that is not positive definite, a negative
/// posterior variance) is left out and reported.
#[allow(clippy::too_many_arguments)]
pub(super) fn kernel_family(clock: &mut Clock, cache_dir: &Path, progress: bool, data: &Dataset, fam: &KernelFamily, run: &Run, states: &[Params], settings: &[Setting], bench: &BenchmarkConfig) -> Result<FamilyOutput> {
    let has_fsl = !fam.fsl.is_empty() || !fam.fsl_kxk.is_empty();
    let val = if !has_fsl { (&[][..], &[][..]) } else { data_validation(data)? };
    let st = Stages::new(fam, run, bench, val.0, cache_dir);
    io::create_dir_all(&st.dir)?;
    let fsl_path = st.dir.join("fsl.fit.json");
    let mut hits: Vec<Option<SettingResult>> = settings.iter().map(|s| st.cached_setting(clock, fam, s)).collect();
    let cached_fsl: Option<Vec<FslStudyFit>> = if !has_fsl { Some(Vec::new()) } else { cache::read_keyed::<FslCache>(&fsl_path, &st.fam_key).map(|c| c.fits) };
    let fits_cached = fam.gps.iter().zip(&st.fit_keys).all(|((m, _), key)| cache::read_keyed::<GpFitCache>(&st.dir.join(format!("{m}.fit.json")), key).is_some() && clock.has(&st.fit_stage(m), key));
    let all_cached = hits.iter().all(Option::is_some) && fits_cached && cached_fsl.is_some();
    let (mut fits, reused) = match all_cached.then(|| reuse_fits(clock, fam, &st)).flatten() {
        Some(f) => (f, true),
        None => (fit_family(clock, fam, &st, run, states, progress)?, false),
    };
    if !reused && has_fsl && hits.iter().all(Option::is_some) {
        // Refitted function-space Laplace fits need their validation calibration, which is
        // computed with the settings: recompute every setting (deterministic, so the same
        // results).
        hits.iter_mut().for_each(|h| *h = None);
    }
    let todo = hits.iter().any(Option::is_none);
    validation(clock, fam, &st, &mut fits, todo, val, run, states, progress)?;
    let mut fsl_fits = if !todo { cached_fsl.unwrap_or_default() } else { fits.fsl.iter().map(|f| f.report(&fam.label())).collect() };
    let mut out: Vec<ExternalMethod> = fam.methods().iter().map(|m| ExternalMethod { name: m.to_string(), settings: BTreeMap::new() }).collect();
    let mut checks = Vec::new();
    let mut failed = fits.failed.clone();
    for (s, hit) in settings.iter().zip(hits) {
        let (stage, key) = (Stages::setting_stage(fam, s), st.setting_key(s));
        let rows_stage = Stages::rows_stage(fam, &s.info.name, s.info.n);
        // A cached setting comes from the same (deterministic) fits: reused even when the fits
        // were recomputed for another setting.
        let (preds, check, errs) = match hit {
            Some((preds, check, errs, mins)) => {
                if clock.has(&rows_stage, &key) {
                    clock.reuse(&rows_stage, &key);
                }
                clock.reuse(&stage, &key);
                for f in &mut fits.fsl {
                    if let Some((_, v, n)) = mins.iter().find(|m| m.0 == f.label()) {
                        f.min_variance.push((s.info.name.clone(), *v, *n));
                    }
                }
                (preds, check, errs)
            }
            None => {
                // This setting's rows alone: computed, consumed and dropped here.
                let rows = rows_at(clock, fam, &rows_stage, &key, &s.x, &s.info.name, run, states, progress)?;
                clock.run(&stage, &fam.gps[0].0.to_string(), &key, || predict_setting(fam, &st, &mut fits, s, rows, bench))?
            }
        };
        for (m, e) in errs {
            if !failed.iter().any(|f| f.0 == m) {
                clock.say(&format!("{m} at `{}`: left out: {e}", s.info.name));
                failed.push((m, format!("at `{}`: {e}", s.info.name)));
            }
        }
        for e in out.iter_mut() {
            if let Some(p) = preds.iter().find(|(m, _)| m.to_string() == e.name).map(|(_, p)| p) {
                e.settings.insert(s.info.name.clone(), p.clone());
            }
        }
        checks.push(check);
    }
    if !fits.fsl.is_empty() {
        fsl_fits = fits.fsl.iter().map(|f| f.report(&fam.label())).collect();
        cache::write_json(&fsl_path, &FslCache { key: st.fam_key.clone(), fits: fsl_fits.clone() })?;
    }
    // A method that failed anywhere is left out everywhere (the metrics need every setting).
    out.retain(|e| !failed.iter().any(|f| f.0 == e.name));
    Ok(FamilyOutput { methods: out, fits: fits.fits, checks, failed, fsl: fsl_fits })
}
