//! Scripted studies: one TOML file run end to end (data → training → kernels) into `reports/NAME/`.
//!
//! ```toml
//! name = "paper-toy"
//! description = "…"
//! [data]   # as for `pathkernel train`
//! [model]
//! [train]
//! [[kernel]]            # any number of kernel computations on the trained run
//! kind = "epk"          # ntk | dpk | epk | chen | kprime | path
//! quadrature = "auto:1e-12"
//! points = "test"       # test | train | class-means | grid:N
//! side = "test"         # test | train
//! ```
//!
//! Large artifacts (the trajectory, the Grams) live in a cache directory (`runs/NAME/` by
//! default) and are reused when their inputs are unchanged (the run by its configuration hash,
//! each kernel by the hash of the run id and its own settings); the report directory receives
//! the small tables, the JSON summaries and `summary.md`, and is replaced only when complete.
//!
//! The kernels are computed once ([`crate::api`]) and passed along as [`Gram`] values; the
//! analyses ([`crate::report`]) return what they wrote, so charts and the summary never read a
//! table back. Files: `config.rs` (the study file), `selection.rs` (`[selection]`),
//! `analyses.rs` (`[analysis]` and the charts), `sweep.rs` (`[sweep]`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

mod analyses;
mod config;
mod selection;
mod sweep;

pub use config::{AnalysisSpec, KernelSpec, SelectionSpec, StudyConfig, SweepSpec};
pub use selection::Candidate;

use crate::api::{Gram, Trained};
use crate::error::{Error, Result};
use crate::io::{self, StagedDir};
use crate::kernel::{output::Exactness, KernelForm};
use crate::train::{fnv1a, train_to_dir, TrainLog, TrainOptions};
use crate::trajectory::Run;

/// Bumped whenever the kernel output files change, so cached kernels are recomputed.
const KERNEL_OUTPUT_VERSION: u32 = 2;

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

/// One `[[kernel]]` entry with its Gram (computed, or reused from the cache).
struct StudyKernel {
    spec: KernelSpec,
    label: String,
    reused: bool,
    gram: Gram,
    /// The Gram's exactness as the report records it (see [`recorded`]).
    exactness: Exactness,
}

/// `e` as the cache gives it back: written as JSON text and parsed again (serde_json's parser
/// can land one bit from the written value), so that a report is the same whether its kernel
/// was computed or reused.
fn recorded(e: &Exactness) -> Exactness {
    serde_json::from_str(&serde_json::to_string(e).expect("serialisable")).expect("parses its own output")
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
        let (cands, best, dir, reused) = selection::select(&cfg, sel, &cache, opts)?;
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
    let net = Trained::open(&run_dir)?;
    let run = net.run();
    let log = TrainLog::read(&run_dir)?;
    std::fs::copy(run_dir.join("train_log.parquet"), staged.path().join("train_log.parquet")).map_err(|e| Error::io(staged.path(), e))?;
    io::write_json(&staged.path().join("manifest.json"), &run.manifest)?;

    let mut kernels = Vec::new();
    for spec in &cfg.kernels {
        let (reused, gram, kdir) = cached_kernel(&net, spec, &cache, opts.progress)?;
        let label = spec.label();
        let dst = staged.path().join("kernels").join(&label);
        io::create_dir_all(&dst)?;
        for f in ["predictions.parquet", "steps.parquet"] {
            std::fs::copy(kdir.join(f), dst.join(f)).map_err(|e| Error::io(kdir.join(f), e))?;
        }
        // The report's copy keeps the seconds only when the study shows timings.
        let exactness = if reused { gram.exactness().clone() } else { recorded(gram.exactness()) };
        let mut exv = serde_json::to_value(&exactness).expect("serialisable");
        if !cfg.timings_in_summary {
            exv.as_object_mut().expect("an object").remove("seconds");
        }
        io::write_json(&dst.join("exactness.json"), &exv)?;
        kernels.push(StudyKernel { spec: spec.clone(), label, reused, gram, exactness });
    }
    let mut notes = selection_notes;
    notes.extend(analyses::analyses(&cfg, &net, &log, &kernels, &cache, staged.path(), &opts.base_dir, opts.progress)?);
    if let Some(sw) = &cfg.sweep {
        notes.extend(sweep::sweep(&cfg, sw, &cache, staged.path(), opts)?);
    }
    // Run-dependent figures: always in timings.json (git-ignored), in summary.md on request.
    let peak_mib = peak_rss_bytes().map(|b| b as f64 / (1 << 20) as f64);
    let wall = start.elapsed().as_secs_f64();
    let timings = serde_json::json!({
        "study_seconds_until_report": wall,
        "peak_rss_mib": peak_mib,
        "reused_run": reused_run,
        "kernels": kernels.iter().map(|k| serde_json::json!({"label": k.label, "seconds": k.exactness.seconds, "reused": k.reused})).collect::<Vec<_>>(),
    });
    io::write_json(&staged.path().join("timings.json"), &timings)?;
    if cfg.timings_in_summary {
        notes.push(format!(
            "- Cost of this run: {wall:.0} s wall for the whole study (training{} and kernels{}), peak resident memory {} on this machine ({} cores).",
            if reused_run { " reused from the cache" } else { "" },
            if kernels.iter().any(|k| k.reused) { ", some reused from the cache" } else { "" },
            peak_mib.map_or("unknown".to_string(), |m| format!("{m:.0} MiB")),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ));
    }
    let summary_md = summary_markdown(&cfg, &text, run, &log, &kernels, &notes, opts);
    io::write_atomic(&staged.path().join("summary.md"), summary_md.as_bytes())?;
    io::write_atomic(&staged.path().join("study.toml"), text.as_bytes())?;
    let out = staged.commit()?;
    let kernels = kernels.into_iter().map(|k| (k.label, k.reused, k.exactness)).collect();
    Ok(StudySummary { out, reused_run, kernels, seconds: start.elapsed().as_secs_f64() })
}

/// Peak resident set size of this process (`VmHWM` of `/proc/self/status`), when available.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The Gram of `spec` on `net`: read from the cache when its inputs are unchanged, else
/// computed and written there (the report copies its tables from that directory).
fn cached_kernel(net: &Trained, spec: &KernelSpec, cache: &Path, progress: bool) -> Result<(bool, Gram, PathBuf)> {
    let run = net.run();
    let label = spec.label();
    let key = format!(
        "{:016x}",
        fnv1a(format!("{}|{}|{}|{KERNEL_OUTPUT_VERSION}", run.manifest.run_id, serde_json::to_string(spec).expect("serialisable"), run.manifest.created_by).as_bytes())
    );
    let kdir = cache.join("kernels").join(&label);
    let reused = std::fs::read_to_string(kdir.join("inputs.key")).map(|s| s.trim() == key).unwrap_or(false) && kdir.join("exactness.json").exists();
    if reused {
        return Ok((true, Gram::open(&kdir, net)?, kdir));
    }
    let bar = crate::progress::Progress::new(progress, 1, &format!("kernel {label:<16} {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]"));
    let show = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let gram = spec.builder(net).progress(&show).compute()?;
    bar.finish_and_clear();
    gram.save(&kdir)?;
    io::write_atomic(&kdir.join("inputs.key"), key.as_bytes())?;
    Ok((false, gram, kdir))
}

fn summary_markdown(cfg: &StudyConfig, text: &str, run: &Run, log: &TrainLog, kernels: &[StudyKernel], notes: &[String], opts: &StudyOptions) -> String {
    use std::fmt::Write;
    let (loss, acc, tacc) = (&log.loss, &log.acc, &log.test_acc);
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
    let _ = writeln!(s, "- loss {:.6} → {:.6}", loss.first().copied().unwrap_or(f64::NAN), last(loss));
    if !acc.is_empty() && acc.iter().any(|v| v.is_finite()) {
        let _ = writeln!(s, "- final accuracy: train {:.2} %, held-out test {:.2} %", 100.0 * last(acc), 100.0 * last(tacc));
    }
    let _ = writeln!(s, "- run id `{}` (trajectory cached under `{}`)\n", m.run_id, run.dir.display());
    if !kernels.is_empty() {
        let _ = writeln!(s, "## Kernel machines\n");
        let _ = writeln!(s, "max/mean |err| = |kernel machine − network| over all points and classes; evaluations = gradient evaluations per point and step (mean, max).\n");
        let timed = cfg.timings_in_summary;
        let _ = writeln!(s, "| kernel | side | quadrature | P × M × K | steps | max abs err | mean abs err | single machine max err | evaluations |{}", if timed { " seconds |" } else { "" });
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|{}", if timed { "---|" } else { "" });
        for sk in kernels {
            let (label, e) = (&sk.label, &sk.exactness);
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
        for sk in kernels.iter().filter(|sk| relu_cnn && matches!(sk.gram.output().rule, crate::kernel::Rule::Auto(_)) && sk.gram.output().integrated && sk.gram.output().form == KernelForm::Gradient) {
            let _ = writeln!(
                s,
                "\n{}: on a ReLU CNN the auto rule integrates the rows exactly between the kinks (`kernel::convpieces`); its evaluations are the two backward passes per point and step that form the logits' affine gradient ∇z(t) = E₀ + tE₁ (updated at each kink by the units that switch), and its {:.2} smooth pieces per point and step (kinks + 1) cost forward work only (their ∫ softmax is a scalar quadrature).",
                sk.label,
                sk.exactness.evaluations_per_step.mean_forward_mode
            );
        }
        if kernels.iter().any(|sk| sk.gram.output().form != KernelForm::Gradient) {
            let _ = writeln!(s, "\nThis run's optimizer changes the kernel's form (see `pathkernel::optim`): `K_r(x, x') = <F_r(x), ∇f(x'; w_r)>`. Non-data terms are included in the machine and belong to no training point.\n");
            let _ = writeln!(s, "| kernel | form | symmetric kernel | optimizer replay residual (rel.) | max weight-decay term | max rounding term |");
            let _ = writeln!(s, "|---|---|---|---|---|---|");
            let opt = |v: Option<f64>| v.map_or("—".to_string(), |x| format!("{x:.2e}"));
            for sk in kernels {
                let (label, e) = (&sk.label, &sk.exactness);
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
    s
}
