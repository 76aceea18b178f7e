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
//! # The engine
//!
//! One engine runs every study; a study file's optional section picks its kind:
//! - no kind section: the plain study (training, `[[kernel]]`, `[analysis]`, `[sweep]`), here
//!   and in `analyses.rs` (one function per analysis) and `sweep.rs`;
//! - `[uncertainty]`: the uncertainty benchmark, [`uncertainty`] (the protocol itself is
//!   [`crate::uncertainty`]);
//! - `[attribution]`: the attribution benchmark (LDS against retraining), `attribution.rs`
//!   (the benchmark is [`crate::datamodels`], the methods and the scores [`crate::attribution`]).
//!
//! Every kind shares:
//! - `StudyContext`: the study file (name, text, `[data]`/`[model]`/`[train]`) and where it
//!   reads and writes;
//! - [`cache`]: the cache directory (`runs/NAME/` by default), where every stage is stored with
//!   the `cache::Key` of everything that determines it and reused only when
//!   `cache::reusable` says so (one predicate), with a ledger of the seconds each stage took
//!   (`cache::Clock`);
//! - [`selection`]: the one model selection (`lr × steps` on the validation split, one tie
//!   order);
//! - the report directory (`reports/NAME/`), staged (`crate::io::StagedDir`) and replaced
//!   only when complete, with `timings.json` (run-dependent, not tracked by git) apart from the
//!   deterministic files.
//!
//! A new kind (the attribution benchmark: retrain on subsets, attribute, write tables) is one
//! optional section in [`StudyConfig`] with its typed spec, one file `study/<kind>.rs` with a
//! `run(&StudyContext, &Spec) -> Result<StudySummary>` that trains through `cache::Clock`
//! (stages keyed by their full inputs) and writes a staged report, and one line in [`run`].
//!
//! The kernels are computed once ([`crate::api`]) and passed along as [`Gram`] values; the
//! analyses ([`crate::report`]) return what they wrote, so charts and the summary never read a
//! table back. Files: `config.rs` (the study file), `cache.rs` (keys, the reuse predicate, the
//! ledger), `selection.rs` (`[selection]`), `analyses.rs` (`[analysis]` and the charts),
//! `sweep.rs` (`[sweep]`), `uncertainty/` (`[uncertainty]`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

mod along;
mod analyses;
mod attribution;
pub mod cache;
mod config;
pub mod selection;
pub mod shares;
mod sweep;
mod text;
pub mod uncertainty;
pub mod windows;

pub use config::{AnalysisSpec, KernelSpec, SelectionSpec, StudyConfig, SweepSpec};
pub(crate) use selection::Candidate;
pub use uncertainty::UqStudySpec;

use crate::api::{Gram, Trained};
use crate::error::{Error, Result};
use crate::io::{self, StagedDir};
use crate::kernel::{output::Exactness, KernelForm};
use crate::train::{RunConfig, TrainLog};
use crate::trajectory::Run;
use cache::{Clock, Key};

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

/// What every kind of study reads: the study file and where to read and write.
#[derive(Clone, Debug)]
pub(crate) struct StudyContext {
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
    /// Report directory.
    pub out: PathBuf,
    /// Cache directory.
    pub cache: PathBuf,
    /// Directory relative data paths are resolved against.
    pub base_dir: PathBuf,
    /// Progress bars and stage lines on stderr.
    pub progress: bool,
}

/// Runs a study file end to end.
pub fn run(path: &Path, opts: &StudyOptions) -> Result<StudySummary> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let cfg = StudyConfig::from_toml(&text, path)?;
    let ctx = StudyContext {
        name: cfg.name.clone(),
        description: cfg.description.clone(),
        study_file: path.display().to_string(),
        text,
        run_config: cfg.run_config(),
        out: opts.out.clone().unwrap_or_else(|| PathBuf::from("reports").join(&cfg.name)),
        cache: opts.cache.clone().unwrap_or_else(|| PathBuf::from("runs").join(&cfg.name)),
        base_dir: opts.base_dir.clone(),
        progress: opts.progress,
    };
    match (&cfg.uncertainty, &cfg.attribution) {
        (Some(spec), _) => uncertainty::run(&ctx, spec),
        (None, Some(spec)) => attribution::run(&ctx, spec),
        (None, None) => run_plain(&ctx, &cfg, opts),
    }
}

/// The trained network of a plain study: the `[selection]` choice, or the study's own run;
/// with the selection's summary line.
fn plain_training(ctx: &StudyContext, cfg: &StudyConfig, clock: &mut Clock, staged: &Path) -> Result<(PathBuf, Vec<String>)> {
    let Some(sel) = &cfg.selection else {
        let run = clock.train("training", "shared", &ctx.run_config, &ctx.cache.join("run"), &ctx.base_dir, ctx.progress)?;
        return Ok((run.dir, Vec::new()));
    };
    let data = cfg.data.load(&ctx.base_dir)?;
    let chosen = selection::select(clock, &ctx.run_config, &sel.lr, &sel.steps, &data, &ctx.cache, &ctx.base_dir, ctx.progress)?;
    // `selection.json` lists the candidates steps outer, rates inner.
    let mut order: Vec<usize> = (0..chosen.grid.len()).collect();
    order.sort_by_key(|&i| (sel.steps.iter().position(|&s| s == chosen.grid[i].steps), sel.lr.iter().position(|&l| l == chosen.grid[i].lr)));
    let cands: Vec<Candidate> = order.iter().map(|&i| &chosen.grid[i]).map(|g| Candidate { lr: g.lr, steps: g.steps, validation_accuracy: g.val_accuracy, test_accuracy: g.test_accuracy }).collect();
    io::write_json(&staged.join("selection.json"), &cands)?;
    let best = &chosen.grid[chosen.best];
    let note = format!(
        "- Learning rate and steps chosen on the validation split (`[selection]`, `selection.json`): {}; chosen lr {} with {} steps.",
        cands.iter().map(|c| format!("lr {} × {} steps: validation {:.2} %", c.lr, c.steps, 100.0 * c.validation_accuracy)).collect::<Vec<_>>().join(", "),
        best.lr,
        best.steps
    );
    Ok((chosen.run.dir.clone(), vec![note]))
}

/// The plain study: training (or the selection), the `[[kernel]]` Grams, `[analysis]`, `[sweep]`.
fn run_plain(ctx: &StudyContext, cfg: &StudyConfig, opts: &StudyOptions) -> Result<StudySummary> {
    let start = Instant::now();
    io::create_dir_all(&ctx.cache)?;
    let mut clock = Clock::open(&ctx.cache, false);
    let staged = StagedDir::new(&ctx.out, true)?;
    let (run_dir, mut notes) = plain_training(ctx, cfg, &mut clock, staged.path())?;
    let reused_run = clock.order.iter().all(|(_, reused)| *reused);
    let net = Trained::open(&run_dir)?;
    let run = net.run();
    let log = TrainLog::read(&run_dir)?;
    std::fs::copy(run_dir.join("train_log.parquet"), staged.path().join("train_log.parquet")).map_err(|e| Error::io(staged.path(), e))?;
    io::write_json(&staged.path().join("manifest.json"), &run.manifest)?;

    let mut kernels = Vec::new();
    for spec in &cfg.kernels {
        // A window the analysis attributes at all its row points keeps its per-step Grams (the
        // attribution's a_{i,s} vary by step), so that it is computed once.
        let rows = match (spec.test_points.len(), spec.points) {
            (0, crate::kernel::Rows::Test) => net.run().dataset.n_test(),
            (n, _) => n,
        };
        let attributed = &cfg.analysis.attribution_points;
        let per_step = !attributed.is_empty() && attributed.iter().copied().eq(0..rows) && cfg.analysis.windows.contains(&spec.label()) && spec.layout() == crate::kernel::Layout::Full;
        let (reused, gram, kdir) = cached_kernel(&net, spec, per_step, &ctx.cache, ctx.progress)?;
        let label = spec.label();
        let dst = staged.path().join("kernels").join(&label);
        io::create_dir_all(&dst)?;
        for f in ["predictions.parquet", "steps.parquet"] {
            std::fs::copy(kdir.join(f), dst.join(f)).map_err(|e| Error::io(kdir.join(f), e))?;
        }
        // The per-layer shares, which the summary's table points to.
        if spec.per_layer {
            let f = "layers.parquet";
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
    notes.extend(analyses::analyses(cfg, &net, &log, &kernels, &ctx.cache, staged.path(), &ctx.base_dir, ctx.progress)?);
    if let Some(sw) = &cfg.sweep {
        notes.extend(sweep::sweep(cfg, sw, &mut clock, &ctx.cache, staged.path(), opts)?);
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
        notes.extend(contraction_notes(&kernels));
    }
    if cfg.timings_in_summary {
        notes.push(format!(
            "- Cost of this run: {wall:.0} s wall for the whole study (training{} and kernels{}), peak resident memory {} on this machine ({} cores).",
            if reused_run { " reused from the cache" } else { "" },
            if kernels.iter().any(|k| k.reused) { ", some reused from the cache" } else { "" },
            peak_mib.map_or("unknown".to_string(), |m| format!("{m:.0} MiB")),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ));
    }
    let summary_md = summary_markdown(cfg, &ctx.text, run, &log, &kernels, &notes, opts);
    io::write_atomic(&staged.path().join("summary.md"), summary_md.as_bytes())?;
    io::write_atomic(&staged.path().join("study.toml"), ctx.text.as_bytes())?;
    let out = staged.commit()?;
    let misses = inexact_kernels(&kernels);
    for miss in &misses {
        eprintln!("warning: study {}: {miss}", cfg.name);
    }
    if cfg.strict && !misses.is_empty() {
        return Err(Error::Numerical(format!(
            "study {}: {} kernel(s) missed their tolerance ({}); the report is in {} (strict = false in the study file accepts it)",
            cfg.name,
            misses.len(),
            misses.join("; "),
            out.display()
        )));
    }
    let kernels = kernels.into_iter().map(|k| (k.label, k.reused, k.exactness)).collect();
    Ok(StudySummary { out, reused_run, kernels, seconds: start.elapsed().as_secs_f64() })
}

/// One line per kernel whose adaptive rule missed its tolerance, `label: what was missed`.
fn inexact_kernels(kernels: &[StudyKernel]) -> Vec<String> {
    kernels.iter().filter_map(|k| k.gram.output().inexactness().map(|m| format!("{}: {m}", k.label))).collect()
}

/// Peak resident set size of this process (`VmHWM` of `/proc/self/status`), when available.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The Gram of `spec` on `net` (with its per-step Grams when `per_step`): read from the cache
/// when its inputs are unchanged, else computed and written there (the report copies its tables
/// from that directory).
fn cached_kernel(net: &Trained, spec: &KernelSpec, per_step: bool, cache: &Path, progress: bool) -> Result<(bool, Gram, PathBuf)> {
    let run = net.run();
    let label = spec.label();
    // The run (its id hashes its whole configuration), every kernel setting and the Gram file's version.
    let steps = if per_step { "|per-step" } else { "" };
    let key = Key::of_bytes(format!("{}|{}|{}|{}{steps}", run.manifest.run_id, serde_json::to_string(spec).expect("serialisable"), run.manifest.created_by, crate::kernel::output::VERSION).as_bytes());
    let kdir = cache.join("kernels").join(&label);
    if cache::reusable(&kdir, &key) {
        return Ok((true, Gram::open(&kdir, net)?, kdir));
    }
    cache::unstamp(&kdir)?;
    let bar = crate::progress::Progress::new(progress, 1, &format!("kernel {label:<16} {{bar:40}} {{pos}}/{{len}} steps [{{elapsed}} < {{eta}}]"));
    let show = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let builder = spec.builder(net)?.progress(&show);
    let gram = if per_step { builder.per_step() } else { builder }.compute()?;
    bar.finish_and_clear();
    gram.save(&kdir)?;
    cache::stamp(&kdir, &key)?;
    Ok((false, gram, kdir))
}

/// For the kernels computed in this run whose path times its Gram contraction: its rate
/// against faer's GEMM rate on a square product of similar size (`n` = the larger of P and M,
/// rounded up to a multiple of 64), measured now, in the same process.
fn contraction_notes(kernels: &[StudyKernel]) -> Vec<String> {
    let timed: Vec<&StudyKernel> = kernels.iter().filter(|k| !k.reused && k.gram.output().contraction.flops > 0.0).collect();
    let Some(n) = timed.iter().map(|k| k.gram.output().p.max(k.gram.output().m).div_ceil(64) * 64).max() else {
        return Vec::new();
    };
    let gemm = crate::linalg::gemm_rate(n, 3);
    timed
        .iter()
        .map(|k| {
            let (c, total) = (k.gram.output().contraction, k.exactness.seconds);
            format!(
                "- {}: the Gram contraction ran at {:.1} GFLOP/s ({:.2e} flops in {:.0} s of the kernel's {:.0} s; the rest is the gradients at the quadrature nodes and the training side's factors), {:.2} of faer's GEMM rate on this machine ({:.1} GFLOP/s on a {n}² product, measured after the kernels in the same run).",
                k.label,
                c.gflops(),
                c.flops,
                c.seconds,
                total,
                c.gflops() / gemm,
                gemm
            )
        })
        .collect()
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
    let _ = writeln!(s, "- network: {}, {} parameters, activation {:?}, output {:?}", network_label(&m.architecture.body), m.num_params, m.architecture.activation, m.architecture.output);
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
                e.quadrature_name(),
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
                "\n{}: on a ReLU CNN the auto rule integrates the rows exactly between the kinks (`kernel::stack::closed::conv_relu_pool::pieces`); its evaluations are the two backward passes per point and step that form the logits' affine gradient ∇z(t) = E₀ + tE₁ (updated at each kink by the units that switch), and its {:.2} smooth pieces per point and step (kinks + 1) cost forward work only (their ∫ softmax is a scalar quadrature).",
                sk.label,
                sk.exactness.evaluations_per_step.mean_forward_mode
            );
        }
        for sk in kernels {
            let nodes = sk.gram.output().rule.fixed_nodes().map_or(0, |n| n.len());
            let evals = sk.exactness.evaluations_per_step.mean;
            if sk.gram.output().integrated && nodes > 0 && evals < nodes as f64 {
                let _ = writeln!(
                    s,
                    "\n{}: the rule's {nodes} nodes per step are evaluated on each point's pieces between the kinks (`kernel::quadrature::reduce`: where the network is a polynomial in t, a piece's nodes are replaced by as many interpolatory nodes as the polynomial's degree, the softmax and the self-kernel carried in their weights), {evals:.2} gradient evaluations per point and step for the same sum (the rule's error is the rule's).",
                    sk.label
                );
            }
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
        for sk in kernels {
            let o = sk.gram.output();
            let Some(l) = &o.layers else { continue };
            let _ = writeln!(s, "\n{}: each parameter layer's share (`kernels/{}/layers.parquet`; the shares sum to the whole): ‖G_l‖/‖G‖ (Frobenius), and its part of the machine's change over all steps, mean |·| over points and classes against the whole change's.\n", sk.label, sk.label);
            let _ = writeln!(s, "| layer | ‖G_l‖/‖G‖ | mean abs change | share of mean abs change |");
            let _ = writeln!(s, "|---|---|---|---|");
            let norm = |g: &[f64]| g.iter().map(|v| v * v).sum::<f64>().sqrt();
            let whole = norm(&o.gram).max(f64::MIN_POSITIVE);
            let (nl, pk) = (l.names.len(), o.p * o.k);
            let whole_change: f64 = o.machine.iter().zip(&o.bias).map(|(m, b)| (m - b).abs()).sum::<f64>() / pk as f64;
            for (li, (name, g)) in l.names.iter().zip(&l.gram).enumerate() {
                let mut total = vec![0.0; pk];
                for chunk in l.change.chunks_exact(nl * pk) {
                    total.iter_mut().zip(&chunk[li * pk..(li + 1) * pk]).for_each(|(a, b)| *a += b);
                }
                let mean = total.iter().map(|v| v.abs()).sum::<f64>() / pk as f64;
                let _ = writeln!(s, "| {name} | {:.3} | {mean:.3e} | {:.3} |", norm(g) / whole, mean / whole_change.max(f64::MIN_POSITIVE));
            }
        }
        for miss in inexact_kernels(kernels) {
            let _ = writeln!(s, "\n**INEXACT** — {miss}.");
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

/// The network as a summary names it: a layer stack by its layers' labels
/// (`layers [conv2d(6, k5, s1, p2), relu, …] on Map(1, 28, 28), 10 outputs`), the presets by
/// their fields.
fn network_label(body: &crate::model::Body) -> String {
    match body {
        crate::model::Body::Layers { input, layers, outputs } => {
            let labels: Vec<String> = layers.iter().map(crate::model::layers::LayerSpec::label).collect();
            format!("layers [{}] on {input:?}, {outputs} outputs", labels.join(", "))
        }
        other => format!("{other:?}"),
    }
}
