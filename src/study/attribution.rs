//! `[attribution]`: the attribution benchmark ([`crate::datamodels`]: 50 retrainings on half
//! subsets, every attribution method on one run, LDS and noisy-label AUCs) as a study of the one
//! engine. The protocol's network is trained (or reused) through [`Clock::train`]; every
//! expensive stage of the benchmark (retrained outputs, Grams, attributions) goes through
//! [`EngineStages`], the engine's keyed cache (one JSON file per stage, its [`Key`] the run's key,
//! the stage's name and the benchmark's own key of its inputs, reused only when the stored key
//! equals it) and timing ledger; the tables go into the staged report directory.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Instant;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::cache::{self, run_key, Clock, Key};
use super::{StudyContext, StudySummary};
use crate::api::Trained;
use crate::datamodels::{self, AttributionSpec, Stages};
use crate::error::Result;
use crate::io::{self, StagedDir};

/// A stage's value with the key of its inputs.
#[derive(Serialize, Deserialize)]
struct Stored<T> {
    key: Key,
    value: T,
}

/// [`Stages`] on the engine's cache: `DIR/<name>-<key>.json` (floats bit-exact, the key stored
/// beside the value), each computation timed in the study's ledger.
pub(crate) struct EngineStages<'a> {
    dir: PathBuf,
    run: Key,
    clock: RefCell<&'a mut Clock>,
}

impl Stages for EngineStages<'_> {
    fn stage<T: Serialize + DeserializeOwned>(&self, name: &str, key: &str, compute: impl FnOnce() -> Result<T>) -> Result<T> {
        let k = Key::of(&[self.run.as_str(), name, key]);
        let path = self.dir.join(format!("{name}-{k}.json"));
        if let Some(s) = cache::read_json::<Stored<T>>(&path).filter(|s| s.key == k) {
            let mut clock = self.clock.borrow_mut();
            if clock.has(name, &k) {
                clock.reuse(name, &k);
            }
            return Ok(s.value);
        }
        let value = self.clock.borrow_mut().run(name, "attribution", &k, compute)?;
        io::create_dir_all(&self.dir)?;
        let stored = Stored { key: k, value };
        cache::write_json(&path, &stored)?;
        Ok(stored.value)
    }
}

/// Runs the `[attribution]` study: the network of `[data]`/`[model]`/`[train]`, then
/// [`datamodels::run`] with `spec`; writes the benchmark's tables ([`datamodels::benchmark::write_tables`]),
/// the study file and `timings.json` into `ctx.out`.
///
/// Errors: those of the training and of the benchmark (a run that is not a one-hidden-layer
/// ReLU MLP on a classification set, a spec out of range).
pub(super) fn run(ctx: &StudyContext, spec: &AttributionSpec) -> Result<StudySummary> {
    let start = Instant::now();
    io::create_dir_all(&ctx.cache)?;
    let staged = StagedDir::new(&ctx.out, true)?;
    let mut clock = Clock::open(&ctx.cache, ctx.progress);
    let run = clock.train("training", "shared", &ctx.run_config, &ctx.cache.join("run"), &ctx.base_dir, ctx.progress)?;
    let reused_run = clock.order.last().is_some_and(|(_, reused)| *reused);
    let net = Trained::open(&run.dir)?;
    let progress = ctx.progress;
    let log = move |s: &str| {
        if progress {
            eprintln!("[attribution] {s}");
        }
    };
    let result = {
        let stages = EngineStages { dir: ctx.cache.join("stages"), run: run_key(&ctx.run_config), clock: RefCell::new(&mut clock) };
        datamodels::run(&net, spec, &stages, &ctx.cache.join("work"), &log)?
    };
    // The attributions (`P·M` numbers per method) stay in the cache; the report names the file.
    datamodels::benchmark::write_tables(&result, staged.path(), &ctx.cache.join("tau.safetensors"))?;
    let charts = datamodels::benchmark::write_charts(&result, &staged.path().join("charts"))?;
    // The report's front page: what ran, the benchmark's tables, the study file.
    let tables = std::fs::read_to_string(staged.path().join("summary.md")).map_err(|e| crate::error::Error::io(staged.path().join("summary.md"), e))?;
    // Cost: this run's wall time, and from an empty cache (each reused stage at its seconds when
    // computed: the work between stages is redone by every run).
    let wall = start.elapsed().as_secs_f64();
    let reused: f64 = clock.order.iter().filter(|(_, r)| *r).fold(0.0, |a, (t, _)| a + t.seconds);
    let how = if reused > 0.0 {
        format!("{:.0} s from an empty cache on this machine ({wall:.0} s for this run; {reused:.0} s of stages reused from the cache, counted at their seconds when computed)", wall + reused)
    } else {
        format!("{wall:.0} s from an empty cache on this machine (this run computed every stage)")
    };
    let mut charts_md = String::from("## Charts\n\n");
    for (file, what) in &charts {
        charts_md.push_str(&format!("- `charts/{file}`: {what}.\n"));
    }
    charts_md.push('\n');
    let mut cost = format!("## Cost\n\n{how}.\n\n| stage | seconds | load (start → end) | reused |\n|---|---:|---|---|\n");
    for (t, r) in &clock.order {
        cost.push_str(&format!("| {} | {:.1} | {:.1} → {:.1} | {} |\n", t.stage, t.seconds, t.load[0], t.load[1], if *r { "yes" } else { "no" }));
    }
    let front = format!(
        "# Study `{}`\n\n{}\n\nProduced by `pathkernel study run {}` (pathkernel {}). Every LDS is recomputed independently (scipy) by `python3 scripts/check_datamodels_lds.py {} --tau {}`.\n\n{}\n\n{charts_md}{}\n## Configuration\n\n```toml\n{}\n```\n",
        ctx.name,
        ctx.description,
        ctx.study_file,
        env!("CARGO_PKG_VERSION"),
        ctx.out.display(),
        ctx.cache.join("tau.safetensors").display(),
        tables.trim_end(),
        cost,
        ctx.text.trim_end()
    );
    io::write_atomic(&staged.path().join("summary.md"), front.as_bytes())?;
    io::write_atomic(&staged.path().join("study.toml"), ctx.text.as_bytes())?;
    let timings: Vec<_> = clock.order.iter().map(|(t, reused)| serde_json::json!({ "stage": t.stage, "seconds": t.seconds, "load": t.load, "reused": reused })).collect();
    io::write_json(&staged.path().join("timings.json"), &serde_json::json!({ "stages": timings, "benchmark_seconds": result.total_seconds, "wall_seconds": start.elapsed().as_secs_f64() }))?;
    let out = staged.commit()?;
    Ok(StudySummary { out, reused_run, kernels: Vec::new(), seconds: start.elapsed().as_secs_f64() })
}
