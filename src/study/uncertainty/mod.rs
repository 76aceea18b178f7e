//! The uncertainty benchmark as a study: a study file with an `[uncertainty]` section run end to
//! end (`pathkernel study run data/studies/mnist-uncertainty.toml`). The protocol (settings,
//! metrics, temperature, ensemble, the methods' predictives) is [`crate::uncertainty`]; this
//! module runs it stage by stage through the study cache ([`super::cache`]).
//!
//! 1. **Selection** ([`super::selection`]): the `lrs × steps` grid on the validation split; the
//!    chosen configuration is the network under test.
//! 2. **Methods** on that network, in every setting of [`crate::uncertainty::settings`]: MAP
//!    softmax, temperature scaling, last-layer Laplace, a deep ensemble of the same configuration
//!    with the seeds `ensemble_seeds` (the network itself is the member with its seed), and the
//!    per-class GPs of [`crate::uncertainty::kernel_gp`] on each kernel of `kernel_gps`
//!    (`family`), with their ablations and function-space Laplace.
//! 3. **Report** into `reports/NAME/`: `summary.md` (deterministic given the cache),
//!    `timings.md`/`timings.json`, `predictions.parquet`, `metrics.parquet`, `uq.json`,
//!    `selection.json`, `gp_fits.json`, charts.
//!
//! Everything computed is cached under `runs/NAME/` by the key of its inputs (trajectories, the
//! built-in methods' predictions, each GP's fit and its predictive in each setting), with the
//! seconds it took (the ledger `timings.json` there). A rerun reuses what is unchanged and
//! reports the seconds recorded when each stage was computed, so that rerunning with the cache
//! reproduces the report byte for byte; a run from an empty cache measures everything afresh.

mod family;
mod spec;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use spec::UqStudySpec;

use super::cache::{self, load_average, Clock, Key, Keyed};
use super::selection::{self, Selected};
use super::{StudyContext, StudySummary};
use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::io::{self, NamedArray, SafeFile, StagedDir};
use crate::trajectory::Run;
use crate::uncertainty::ensemble::EnsembleMember;
use crate::uncertainty::method::Method;
use crate::uncertainty::record::{Selection, SelectionRow, StageTiming, UqStudyReport};
use crate::uncertainty::report::{self, LaplaceSummary, MethodPrediction, UqResults};
use crate::uncertainty::temperature::TemperatureFit;
use crate::uncertainty::{self as uq, metrics, Ensemble, Network, Setting};

/// Bumped whenever the cached stages' files or meaning change.
const CACHE_VERSION: u32 = 2;

fn labels(t: &Targets) -> Result<&[usize]> {
    match t {
        Targets::Labels(y) => Ok(y),
        Targets::Values(_) => Err(Error::Config("the uncertainty study needs a classification dataset".into())),
    }
}

// ---------------------------------------------------------------------------------------------
// The built-in methods (cached predictions)
// ---------------------------------------------------------------------------------------------

/// Predictions of several methods in several settings, written as one safetensors file with
/// `{method}/{setting}/probs` `[N, K]` and `{method}/{setting}/ood_score` `[N]` arrays.
fn write_predictions(path: &Path, preds: &[MethodPrediction], k: usize, key: &Key) -> Result<()> {
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

fn read_predictions(path: &Path, methods: &[Method], settings: &[Setting], k: usize, key: &Key) -> Option<Vec<MethodPrediction>> {
    let f = SafeFile::open(path).ok()?;
    if f.metadata().get("key").map(String::as_str) != Some(key.as_str()) {
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
    key: Key,
    temperature: TemperatureFit,
    laplace: LaplaceSummary,
    seconds: Vec<(String, f64)>,
}

impl Keyed for BuiltinCache {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// MAP, temperature, last-layer Laplace and the ensemble in every setting: reused when the
/// cache holds them for these inputs (the run, the benchmark settings, the members), else
/// computed, each method's seconds recorded.
fn builtin_stage(clock: &mut Clock, cache_dir: &Path, net: Network<'_>, run: &Run, data: &Dataset, ensemble: &Ensemble, settings: &[Setting], spec: &UqStudySpec) -> Result<(TemperatureFit, LaplaceSummary, Vec<MethodPrediction>)> {
    let k = data.num_outputs;
    let bench_json = serde_json::to_string(&spec.benchmark).map_err(|e| Error::Data(format!("benchmark config: {e}")))?;
    let member_ids: Vec<String> = ensemble.members.iter().map(|m| format!("{}:{}", m.seed, crate::trajectory::read_manifest(&m.dir).map(|x| x.run_id).unwrap_or_default())).collect();
    let key = Key::of(&[&CACHE_VERSION.to_string(), &run.manifest.run_id, &run.manifest.created_by, &bench_json, &member_ids.join(",")]);
    let dir = cache_dir.join("builtin");
    io::create_dir_all(&dir)?;
    let stage_of = |m: &Method| format!("{m}: fit and predict");
    let cached = cache::read_keyed::<BuiltinCache>(&dir.join("builtin.json"), &key).and_then(|c| read_predictions(&dir.join("builtin.safetensors"), &Method::BUILTIN, settings, k, &key).map(|p| (c, p)));
    if let Some((c, p)) = cached.filter(|_| Method::BUILTIN.iter().all(|m| clock.has(&stage_of(m), &key))) {
        Method::BUILTIN.iter().for_each(|m| clock.reuse(&stage_of(m), &key));
        return Ok((c.temperature, c.laplace, p));
    }
    clock.say("map, temperature, laplace, ensemble: fit and predict ...");
    let l0 = load_average();
    let b = uq::builtin_methods(net, data, Some(ensemble), settings, &spec.benchmark)?;
    let l1 = load_average();
    for (m, secs) in &b.seconds {
        let stage = format!("{m}: fit and predict");
        clock.say(&format!("{stage}: {secs:.1} s"));
        clock.record(&stage, &key, StageTiming { stage: stage.clone(), method: m.clone(), seconds: *secs, load: [l0, l1] })?;
    }
    write_predictions(&dir.join("builtin.safetensors"), &b.predictions, k, &key)?;
    cache::write_json(&dir.join("builtin.json"), &BuiltinCache { key: key.clone(), temperature: b.temperature, laplace: b.laplace.clone(), seconds: b.seconds.clone() })?;
    Ok((b.temperature, b.laplace, b.predictions))
}

/// The deep ensemble: the network under test for its own seed, the other seeds trained side by
/// side (one stage).
fn ensemble_stage(clock: &mut Clock, ctx: &StudyContext, spec: &UqStudySpec, sel: &Selected, run: &Run, init: &crate::model::Params, last: &crate::model::Params) -> Result<Ensemble> {
    let seed = ctx.run_config.train.seed;
    let (lr, steps) = (sel.grid[sel.best].lr, sel.grid[sel.best].steps);
    let others: Vec<u64> = spec.ensemble_seeds.iter().copied().filter(|&s| s != seed).collect();
    let jobs: Vec<_> = others.iter().map(|&s| (selection::configured(&ctx.run_config, lr, steps, s), ctx.cache.join("ensemble").join(format!("seed-{s}")))).collect();
    let seeds: Vec<String> = others.iter().map(u64::to_string).collect();
    let trained = if jobs.is_empty() { Vec::new() } else { clock.train_group(&format!("ensemble members seeds {} (trained side by side)", seeds.join(", ")), &Method::Ensemble.to_string(), &jobs, &ctx.base_dir)? };
    let mut trained = others.iter().copied().zip(trained);
    let mut members = Vec::new();
    for &s in &spec.ensemble_seeds {
        if s == seed {
            members.push(EnsembleMember { seed: s, dir: run.dir.clone(), reused: true, arch: run.manifest.architecture.clone(), init: init.clone(), last: last.clone() });
            continue;
        }
        let (ts, r) = trained.next().expect("one trained run per other seed");
        debug_assert_eq!(ts, s);
        let (i0, iw) = (r.load_step(0)?, r.load_step(r.manifest.steps)?);
        members.push(EnsembleMember { seed: s, dir: r.dir.clone(), reused: true, arch: r.manifest.architecture.clone(), init: i0, last: iw });
    }
    Ok(Ensemble { members })
}

/// The selection as the report records it.
fn selection_record(sel: &Selected) -> Selection {
    let rows = sel.grid.iter().map(|g| SelectionRow { lr: g.lr, steps: g.steps, val_accuracy: g.val_accuracy, val_nll: g.val_nll, train_loss: g.train_loss }).collect();
    Selection { rows, lr: sel.grid[sel.best].lr, steps: sel.grid[sel.best].steps, prefix_identical: sel.prefix_identical }
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------

/// Reads `predictions.parquet` back from `dir`, scores it again ([`report::score`]) and
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
    let again = report::score(k, &results.settings, &preds)?;
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
pub(super) fn run(ctx: &StudyContext, spec: &UqStudySpec) -> Result<StudySummary> {
    let start = Instant::now();
    spec.validate(&ctx.run_config)?;
    io::create_dir_all(&ctx.cache)?;
    let mut clock = Clock::open(&ctx.cache, ctx.progress);
    let data = ctx.run_config.data.load(&ctx.base_dir)?;
    let k = data.num_outputs;

    // 1. Selection and the network under test.
    let sel = selection::select(&mut clock, &ctx.run_config, &spec.lrs, &spec.steps, &data, &ctx.cache, &ctx.base_dir, ctx.progress)?;
    let chosen = selection::configured(&ctx.run_config, sel.grid[sel.best].lr, sel.grid[sel.best].steps, ctx.run_config.train.seed);
    let run = &sel.run;
    if run.manifest.run_id != chosen.run_id() {
        return Err(Error::Data(format!("the network under test has run id {}, not the chosen configuration's {}", run.manifest.run_id, chosen.run_id())));
    }
    if run.dataset.x_train != data.x_train || run.dataset.x_test != data.x_test {
        return Err(Error::Data("the trained run's data differ from the study's data".into()));
    }
    let states = run.load_all()?;
    let (init, last_w) = (states[0].clone(), states[states.len() - 1].clone());
    let arch = run.manifest.architecture.clone();

    // 2. The ensemble, the settings and the built-in methods.
    let ensemble = ensemble_stage(&mut clock, ctx, spec, &sel, run, &init, &last_w)?;
    let settings = uq::settings(&data, &spec.benchmark)?;
    let net = Network { arch: &arch, params: &last_w, init: Some(&init) };
    let (temperature, laplace, mut predictions) = builtin_stage(&mut clock, &ctx.cache, net, run, &data, &ensemble, &settings, spec)?;

    // 3. The kernel GPs.
    let (mut kernel_gps, mut fsl_fits, mut row_grams, mut external, mut failed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for fam in spec.kernel_families() {
        let o = family::kernel_family(&mut clock, &ctx.cache, ctx.progress, &data, &fam, run, &states, &settings, &spec.benchmark)?;
        external.extend(o.methods);
        kernel_gps.extend(o.fits);
        fsl_fits.extend(o.fsl);
        row_grams.push((fam.label(), o.checks));
        failed.extend(o.failed);
    }
    let infos: Vec<_> = settings.iter().map(|s| s.info.clone()).collect();
    uq::push_external(&mut predictions, &infos, &external)?;
    let results = uq::results(k, infos, predictions, Some(temperature), Some(laplace), &spec.benchmark)?;

    // 4. The report.
    let y_test = labels(&data.y_test)?;
    let ens_acc = ensemble
        .members
        .iter()
        .map(|m| {
            let z = m.logits(&data.x_test)?;
            Ok((m.seed, crate::trajectory::read_manifest(&m.dir)?.run_id, uq::accuracy(&metrics::softmax_rows(&z, k)?, y_test, k)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let log = io::Table::read_parquet(&run.dir.join("train_log.parquet"))?;
    let lastf = |n: &str| log.f64(n).and_then(|v| v.last().copied()).unwrap_or(f64::NAN);
    let mut report = UqStudyReport {
        name: ctx.name.clone(),
        description: ctx.description.clone(),
        study_file: ctx.study_file.clone(),
        text: ctx.text.clone(),
        data_description: data.description.clone(),
        sizes: [data.n_train(), data.n_val(), data.n_test()],
        network: (format!("{:?}", arch.body), run.manifest.num_params, run.manifest.run_id.clone()),
        train_fit: (lastf("accuracy"), lastf("loss")),
        selection: selection_record(&sel),
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
    let out = write_report(&mut report, ctx, spec, &settings)?;
    Ok(StudySummary { out, reused_run: clock.order.iter().all(|(_, reused)| *reused), kernels: Vec::new(), seconds: start.elapsed().as_secs_f64() })
}

/// Writes the report directory (replaced only when complete) and returns it.
fn write_report(report: &mut UqStudyReport, ctx: &StudyContext, spec: &UqStudySpec, settings: &[Setting]) -> Result<PathBuf> {
    let staged = StagedDir::new(&ctx.out, true)?;
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
    uq::summary::charts(report, settings, spec.disagreement_images, &staged.path().join("charts"))?;
    io::write_atomic(&staged.path().join("summary.md"), uq::summary::summary_markdown(report).as_bytes())?;
    io::write_atomic(&staged.path().join("timings.md"), uq::summary::timings_markdown(report).as_bytes())?;
    io::write_json(&staged.path().join("timings.json"), &report.stages)?;
    io::write_atomic(&staged.path().join("study.toml"), ctx.text.as_bytes())?;
    staged.commit()
}
