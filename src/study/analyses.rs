//! The `[analysis]` section of a study and its charts, from the study's [`Gram`](crate::api::Gram) values and the
//! reports of [`crate::report`] (no table is read back).

use std::path::Path;

use super::cache::{f64_bytes, reusable, stamp, unstamp, Key};
use super::{cached_kernel, KernelSpec, StudyConfig, StudyKernel};
use crate::analysis::Profile;
use crate::api::{Gram, Trained};
use crate::error::{Error, Result};
use crate::gp::GpParams;
use crate::io::{self, Column, Table};
use crate::kernel::{KernelKind, Outputs, Points, Rows, Rule, Side};
use crate::plot::{self, Scale, Series};
use crate::report::{self, GpTargets};
use crate::svm::SvmParams;
use crate::train::TrainLog;
use crate::trajectory::Run;

fn train_overlay(run: &Run) -> Option<crate::plot::Overlay> {
    if run.dataset.dim != 2 {
        return None;
    }
    let crate::data::Targets::Labels(y) = &run.dataset.y_train else { return None };
    let x = &run.dataset.x_train;
    Some(crate::plot::Overlay { x: x.chunks(2).map(|r| r[0]).collect(), y: x.chunks(2).map(|r| r[1]).collect(), class: y.clone(), value: None })
}

/// What every analysis reads.
struct Ctx<'a> {
    cfg: &'a StudyConfig,
    net: &'a Trained,
    kernels: &'a [StudyKernel],
    /// The report directory and its `charts/` (created when charts are on).
    out: &'a Path,
    charts: std::path::PathBuf,
    cache: &'a Path,
    /// Where relative data paths are resolved (the validation split is read again from `[data]`).
    base_dir: &'a Path,
    progress: bool,
}

/// The `[analysis]` section and the charts; returns markdown lines for the summary, analysis
/// by analysis in a fixed order.
pub(super) fn analyses(cfg: &StudyConfig, net: &Trained, log: &TrainLog, kernels: &[StudyKernel], cache: &Path, out: &Path, base_dir: &Path, progress: bool) -> Result<Vec<String>> {
    let a = &cfg.analysis;
    let cx = Ctx { cfg, net, kernels, out, charts: out.join("charts"), cache, base_dir, progress };
    let mut notes = Vec::new();
    if a.charts {
        io::create_dir_all(&cx.charts)?;
        notes.extend(training_charts(&cx, log)?);
        notes.extend(kernel_charts(&cx)?);
    }
    // A GP on a kernel of the network's outputs needs the train × train Gram on them; one on a
    // kernel of the logits uses the logits' train × train Gram (below, shared with `fsl`).
    let gp_on_network = a.gp && kernels.iter().any(|k| k.spec.points != Rows::Train && k.spec.kind == KernelKind::Epk && k.spec.outputs == Outputs::Network);
    let needs_train = gp_on_network || a.svm || a.stationarity || a.similarity > 0;
    // The study's own train × train EPK when it lists one (the same Gram: both sides at t = 0),
    // else one computed (and cached) here.
    let listed = kernels.iter().find(|k| k.spec.kind == KernelKind::Epk && k.spec.points == Rows::Train && k.spec.side == Side::Train).map(|k| &k.gram);
    let computed = if needs_train && listed.is_none() {
        let spec = KernelSpec { kind: KernelKind::Epk, quadrature: Rule::Auto(1e-12), points: Rows::Train, side: Side::Train, step: None, steps: None, test_points: Vec::new(), label: Some("train-train".into()), blocks: None, per_layer: false, outputs: Default::default(), carry_in: false };
        Some(cached_kernel(net, &spec, false, cache, progress)?.1)
    } else {
        None
    };
    let train_kernel = if needs_train { listed.or(computed.as_ref()) } else { None };
    if let Some(tk) = train_kernel {
        // GP and SVM use the exact kernel (EPK) rows; other kinds are compared through their
        // kernel machines above.
        for k in kernels.iter().filter(|k| k.spec.points != Rows::Train && k.spec.kind == KernelKind::Epk && k.spec.outputs == Outputs::Network) {
            if a.gp {
                notes.extend(gp(&cx, tk, k)?);
            }
            if a.svm && a.svm_c.is_empty() {
                notes.extend(svm(&cx, tk, k)?);
            }
        }
        if a.svm && !a.svm_c.is_empty() {
            notes.extend(svm_sweep(&cx, tk)?);
        }
        if a.stationarity {
            notes.extend(stationarity(&cx, tk)?);
            notes.extend(ntk_stationarity(&cx, tk)?);
            if a.far_field_points > 0 {
                notes.extend(settings_far_field(&cx, tk)?);
            }
        }
        if a.similarity > 0 {
            notes.extend(similarity(&cx, tk)?);
        }
    }
    // The logits' train × train Grams, each loaded once for the GP and function-space Laplace.
    let mut logits_trains: Vec<(KernelSpec, Gram)> = Vec::new();
    if a.gp {
        // The GP on each exact kernel of the logits, over the logits' train × train Gram.
        for k in kernels.iter().filter(|k| k.spec.outputs == Outputs::Logits && k.spec.points != Rows::Train && k.spec.kind == KernelKind::Epk) {
            let i = logits_train_gram(&cx, &k.spec, &mut logits_trains)?;
            notes.extend(gp(&cx, &logits_trains[i].1, k)?);
        }
    }
    if a.fsl {
        for k in kernels.iter().filter(|k| k.spec.outputs == Outputs::Logits && k.spec.points != Rows::Train && k.spec.side == Side::Test) {
            let i = logits_train_gram(&cx, &k.spec, &mut logits_trains)?;
            notes.extend(fsl(&cx, k, &logits_trains[i])?);
        }
    }
    if !a.attribution_points.is_empty() && a.windows.is_empty() {
        notes.extend(attribution(&cx)?);
    }
    if !a.windows.is_empty() {
        notes.extend(super::along::windows_analysis(net, &a.windows, kernels, out)?);
        if !a.attribution_points.is_empty() {
            notes.extend(super::along::window_attribution(net, &a.windows, kernels, &a.attribution_points, out)?);
        }
    }
    if a.layer_shares {
        if a.charts {
            notes.push(super::along::accuracy_chart(&cx.charts, log)?);
        }
        notes.extend(super::along::layer_shares_analysis(net, log, cache, out, a.charts.then_some(cx.charts.as_path()), progress)?);
    }
    notes.extend(fig6(&cx)?);
    if a.interpolation >= 2 {
        notes.extend(interpolation_analysis(&cx)?);
    }
    Ok(notes)
}

/// Training loss and accuracy against the step.
fn training_charts(cx: &Ctx<'_>, log: &TrainLog) -> Result<Vec<String>> {
    let (run, charts) = (cx.net.run(), &cx.charts);
    let steps: Vec<f64> = log.step.iter().map(|&v| v as f64).collect();
    let mut notes = Vec::new();
    plot::line_chart(&charts.join("training_loss.png"), "Training loss", "step", "mean loss", &[Series::new("training loss", steps.clone(), log.loss.clone())], Scale::Linear, Scale::Log)?;
    if run.dataset.is_classification() {
        plot::line_chart(
            &charts.join("training_accuracy.png"),
            "Accuracy during training",
            "step",
            "accuracy (fraction)",
            &[Series::new("train", steps.clone(), log.acc.clone()), Series::new("held-out test", steps.clone(), log.test_acc.clone())],
            Scale::Linear,
            Scale::Linear,
        )?;
    }
    notes.push(if run.dataset.is_classification() {
        "- Charts: `charts/training_loss.png`, `charts/training_accuracy.png`.".to_string()
    } else {
        "- Chart: `charts/training_loss.png`.".to_string()
    });
    Ok(notes)
}

/// The Fig. 4 note's account of the kernels left off the chart.
fn left_out(labels: &[String]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    format!("; left out, their machines more than 10× outside the network's range: {}", labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", "))
}

/// Per-step validation (every kernel but the NTK), the DPK/EPK test-gradient angle (Fig. 2) and
/// the kernel machine against the network (Fig. 4), from the kernels' step records.
fn kernel_charts(cx: &Ctx<'_>) -> Result<Vec<String>> {
    let charts = &cx.charts;
    let mut notes = Vec::new();
    // Per-step validation and Fig. 2 from the kernels' steps tables.
    let mut err_series = Vec::new();
    let mut cos_series = Vec::new();
    let mut cos_zero: Vec<String> = Vec::new();
    let mut scatter = Vec::new();
    let mut scatter_logits = Vec::new();
    let mut off_chart: Vec<String> = Vec::new();
    for StudyKernel { spec, label, gram, .. } in cx.kernels {
        let records = &gram.output().records;
        let st: Vec<f64> = records.iter().map(|r| r.step as f64).collect();
        if spec.kind != KernelKind::Ntk {
            err_series.push(Series::new(label.clone(), st.clone(), records.iter().map(|r| r.max_abs_error).collect()));
        }
        if spec.kind == KernelKind::Epk && spec.side == Side::Test {
            let c: Vec<f64> = records.iter().map(|r| r.dpk_cosine_error).collect();
            if c.iter().all(|v| !v.is_finite() || *v <= 0.0) && c.iter().any(|v| v.is_finite()) {
                // The DPK itself (one node at t = 0): nothing to draw on a log axis.
                cos_zero.push(label.clone());
            } else if c.iter().any(|v| v.is_finite()) {
                cos_series.push(Series::new(format!("{label}: 1 − cos(DPK, EPK test gradient)"), st.clone(), c));
            }
        }
        if spec.points == Rows::Test {
            // Class 0 of up to 100 rows; kernels of the logits are on another axis, charted
            // when no kernel of the network's outputs is.
            let (f, km) = (gram.network(), gram.machine());
            let n = f.nrows().min(100);
            let (xs, ys): (Vec<f64>, Vec<f64>) = (0..n).map(|q| (f[(q, 0)], km[(q, 0)])).unzip();
            // A machine 10× outside the network's range would squash every other series into
            // a point: left out of the chart (its error is in the table).
            let range = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            if range(&ys) > 10.0 * range(&xs).max(1e-300) {
                off_chart.push(label.clone());
                continue;
            }
            let series = Series::new(label.clone(), xs, ys);
            if spec.outputs == Outputs::Network { scatter.push(series) } else { scatter_logits.push(series) }
        }
    }
    if !err_series.is_empty() {
        plot::line_chart(&charts.join("per_step_error.png"), "Kernel machine vs network, change over each step", "step", "max |predicted − actual change|", &err_series, Scale::Linear, Scale::Log)?;
        notes.push("- `charts/per_step_error.png`: per step, the largest difference between the change of the output predicted by that step's kernel and the network's actual change (ExPLAIND-style validation).".into());
    }
    if !cos_series.is_empty() {
        plot::line_chart(&charts.join("fig2_dpk_gradient_error.png"), "DPK vs EPK test gradients (paper Fig. 2)", "step", "mean 1 − cosine", &cos_series, Scale::Linear, Scale::Log)?;
        let zero = if cos_zero.is_empty() { String::new() } else { format!(" Not drawn (1 − cosine exactly 0 at every step: the DPK itself): {}.", cos_zero.join(", ")) };
        notes.push(format!("- `charts/fig2_dpk_gradient_error.png`: per step, the mean angle error (1 − cosine) between the DPK's test gradient at t = 0 and the EPK's integrated test gradient (paper Fig. 2).{zero}"));
    }
    if scatter.is_empty() && !scatter_logits.is_empty() {
        plot::scatter_chart(&charts.join("fig4_machine_vs_network.png"), "Class 0 logit: kernel machine vs network (paper Fig. 4)", "network logit z⁰(x)", "kernel machine", &scatter_logits, true)?;
        notes.push(format!("- `charts/fig4_machine_vs_network.png`: class-0 logit of each kernel machine against the network's on up to 100 test points (paper Fig. 4, on the logits){}.", left_out(&off_chart)));
    } else if !scatter.is_empty() {
        plot::scatter_chart(&charts.join("fig4_machine_vs_network.png"), "Class 0 output: kernel machine vs network (paper Fig. 4)", "network log-probability f⁰(x)", "kernel machine", &scatter, true)?;
        notes.push(format!("- `charts/fig4_machine_vs_network.png`: class-0 output of the kernel machine against the network on up to 100 test points (paper Fig. 4){}.", left_out(&off_chart)));
    }
    Ok(notes)
}

/// The train × train Gram on the logits that a kernel `spec` of the logits is paired with (the
/// training side's: both sides at `w_s`; the NTK's for an NTK, else the EPK's, over the same
/// steps; class-diagonal), computed once and cached: the GP and function-space Laplace share it.
/// Returns its index in `held`, where it is added unless already there.
fn logits_train_gram(cx: &Ctx<'_>, spec: &KernelSpec, held: &mut Vec<(KernelSpec, Gram)>) -> Result<usize> {
    let train_kind = if spec.kind == KernelKind::Ntk { KernelKind::Ntk } else { KernelKind::Epk };
    let tspec = KernelSpec {
        kind: train_kind,
        quadrature: Rule::Auto(1e-12),
        points: Rows::Train,
        side: Side::Train,
        step: spec.step,
        steps: spec.steps,
        test_points: Vec::new(),
        label: Some(format!("train-train-logits-{train_kind}{}", spec.step.map(|s| format!("-{s}")).unwrap_or_default())),
        blocks: Some(crate::kernel::Layout::Diag),
        per_layer: false,
        outputs: Outputs::Logits,
        carry_in: false,
    };
    if let Some(i) = held.iter().position(|(t, _)| (t.kind, t.step, t.steps) == (tspec.kind, tspec.step, tspec.steps)) {
        return Ok(i);
    }
    let (_, train, _) = cached_kernel(cx.net, &tspec, false, cx.cache, cx.progress)?;
    held.push((tspec, train));
    Ok(held.len() - 1)
}

/// Function-space Laplace on one kernel of the logits: fitted on that kernel's train × train
/// Gram on the logits (the training side's, both sides at `w_s`; computed and cached here),
/// class-diagonal curvature, δ by the function-space evidence; the probit predictive at the
/// kernel's test rows against the network's softmax (`analysis/fsl-<label>/fsl.json`).
fn fsl(cx: &Ctx<'_>, k: &StudyKernel, (tspec, train): &(KernelSpec, Gram)) -> Result<Vec<String>> {
    use crate::api::FslModel;
    use crate::gp::{Curvature, Prior};
    use crate::uncertainty::metrics;
    let net = cx.net;
    let model = FslModel::fit(net, train, Curvature::ClassDiagonal, Prior::Evidence)?;
    let pred = model.predict(net, &k.gram)?;
    let probs = pred.probit();
    let labels = match &net.run().dataset.y_test {
        crate::data::Targets::Labels(y) => y.clone(),
        crate::data::Targets::Values(_) => return Err(Error::Config("analysis.fsl needs a classification run".into())),
    };
    let (p, _, kk) = k.gram.shape();
    if k.gram.points().x != net.run().dataset.x_test {
        return Err(Error::Config(format!("analysis.fsl: kernel `{}` is not on the test points", k.label)));
    }
    let net_probs = metrics::softmax_rows(&k.gram.output().network, kk)?;
    let m = |pr: &[f64]| -> Result<(f64, f64, f64)> { Ok((metrics::nll(pr, &labels, kk)?, metrics::accuracy(pr, &labels, kk)?, metrics::ece(pr, &labels, kk, 10)?)) };
    let ((nll, acc, ece), (nll_n, acc_n, ece_n)) = (m(&probs)?, m(&net_probs)?);
    let var = pred.variance();
    let mean_std = var.iter().map(|v| v.sqrt()).sum::<f64>() / var.len().max(1) as f64;
    let dir = cx.out.join("analysis").join(format!("fsl-{}", k.label));
    io::create_dir_all(&dir)?;
    let json = serde_json::json!({
        "kernel": k.label, "train_gram": tspec.label, "curvature": "class-diagonal", "prior": "evidence",
        "delta": model.delta(), "log_evidence": model.inner().log_evidence(model.delta()),
        "test_points": p, "nll": nll, "accuracy": acc, "ece": ece,
        "network": { "nll": nll_n, "accuracy": acc_n, "ece": ece_n },
        "mean_logit_std": mean_std, "probit": probs,
    });
    io::write_json(&dir.join("fsl.json"), &json)?;
    Ok(vec![format!(
        "- Function-space Laplace on `{}` (its train × train Gram on the logits `{}`, class-diagonal curvature, δ = {:.4e} by the function-space evidence; `analysis/fsl-{}/fsl.json`): test NLL {:.4} (network {:.4}), accuracy {:.1} % (network {:.1} %), ECE {:.4} (network {:.4}), mean posterior logit std {:.3e}.",
        k.label, tspec.label.as_deref().unwrap_or_default(), model.delta(), k.label, nll, nll_n, 100.0 * acc, 100.0 * acc_n, ece, ece_n, mean_std
    )])
}

/// GP regression on the EPK rows `rk` of one kernel, with the grid chart (Fig. 5).
fn gp(cx: &Ctx<'_>, tk: &Gram, k: &StudyKernel) -> Result<Vec<String>> {
    let (a, net, out, charts, cache) = (&cx.cfg.analysis, cx.net, cx.out, &cx.charts, cx.cache);
    let StudyKernel { spec, label, gram: rk, .. } = k;
    let on_grid = matches!(spec.points, Rows::Grid(_));
    let overlay = train_overlay(net.run());
    let mut notes = Vec::new();
        // gp.safetensors (the GP's exact inputs, M² per class) stays in the cache; the report
        // gets the tables.
        let cdir = cache.join("analysis").join(format!("gp-{label}"));
        io::create_dir_all(&cdir)?;
        let report = report::gp_report(net, tk, rk, &GpParams::new().fit_hyper(true), GpTargets::Network, 1000, 0, &cdir)?;
        let g = &report.summary;
        let dir = out.join("analysis").join(format!("gp-{label}"));
        io::create_dir_all(&dir)?;
        for f in ["gp.json", "gp.parquet", "gp_points.parquet"] {
            std::fs::copy(cdir.join(f), dir.join(f)).map_err(|e| Error::io(cdir.join(f), e))?;
        }
        notes.push(format!(
            "- GP on `{label}` (targets: {} minus bias, hyper-parameters by marginal likelihood; inputs and outputs in `{cd}/gp.safetensors`): mean posterior logit std {:.3e}, mean predictive entropy {:.3}, MC arg-max agrees with the network on {:.1} %{}.",
            if g.outputs == Outputs::Logits { "the logits" } else { "network outputs" },
            g.mean_std,
            g.mean_entropy,
            100.0 * g.agreement_with_network,
            g.accuracy.map_or(String::new(), |v| format!(", test accuracy {:.1} %", 100.0 * v))
                + &match (&g.calibration, &g.network_calibration) {
                    (Some(c), Some(nc)) => format!(
                        "; calibration (GP MC vs network softmax): Brier {:.4} vs {:.4}, NLL {:.4} vs {:.4}, ECE {:.4} vs {:.4}",
                        c.brier, nc.brier, c.nll, nc.nll, c.ece, nc.ece
                    ),
                    _ => String::new(),
                },
            cd = cdir.display()
        ));
        if a.charts && on_grid {
            let (p, _, k) = rk.shape();
            let pstd: Vec<f64> = report.mc.std_prob.chunks(k).map(|r| r.iter().sum::<f64>() / k as f64).collect();
            let self_values = (0..k).map(|c| rk.self_kernel(c)).collect::<Result<Vec<_>>>()?;
            let kv: Vec<f64> = (0..p).map(|q| (0..k).map(|c| self_values[c][q]).sum::<f64>() / k as f64).collect();
            let logkv: Vec<f64> = kv.iter().map(|v| v.log10()).collect();
            if let (Some(g1), Some(g2)) = (rk.on_grid(logkv).ok(), rk.on_grid(pstd).ok()) {
                plot::Chart::heatmaps(
                    "Kernel value and Monte-Carlo std of the softmax probabilities (paper Fig. 5)",
                    &[
                        plot::Heatmap::new("log10 K(x, x) (mean over classes)", g1, "log10 K(x, x)"),
                        plot::Heatmap::new("MC std of probabilities (mean over classes)", g2, "std of p(class)"),
                    ],
                    overlay.as_ref(),
                )?
                .save(&charts.join(format!("fig5_{label}.png")))?;
                notes.push(format!("- `charts/fig5_{label}.png`: the kernel's self-value and the MC standard deviation of the GP's softmax probabilities on the grid (paper Fig. 5)."));
            }
        }
    Ok(notes)
}

/// SVM refit of a_i on the EPK rows of one kernel, with the grid chart (Fig. 3).
fn svm(cx: &Ctx<'_>, tk: &Gram, k: &StudyKernel) -> Result<Vec<String>> {
    let (a, net, out, charts) = (&cx.cfg.analysis, cx.net, cx.out, &cx.charts);
    let StudyKernel { spec, label, gram: rk, .. } = k;
    let on_grid = matches!(spec.points, Rows::Grid(_));
    let overlay = train_overlay(net.run());
    let mut notes = Vec::new();
        let dir = out.join("analysis").join(format!("svm-{label}"));
        io::create_dir_all(&dir)?;
        let report = report::svm_report(net, tk, rk, &SvmParams::new(), &dir)?;
        let s = &report.summary;
        notes.push(format!(
            "- SVM refit of a_i (one-vs-rest, C = 1) on `{label}`: agrees with the network on {:.1} %{}; support vectors per class {:?}.",
            100.0 * s.agreement_with_network,
            s.accuracy.map_or(String::new(), |v| format!(", accuracy {:.1} %", 100.0 * v)),
            s.support
        ));
        if a.charts && on_grid {
            let decision = report.decision();
            let mut panels = Vec::new();
            for c in 0..decision.ncols() {
                if let Ok(g) = rk.on_grid((0..decision.nrows()).map(|q| decision[(q, c)]).collect()) {
                    panels.push((format!("class {c}"), g));
                }
            }
            if !panels.is_empty() {
                plot::heatmaps(&charts.join(format!("fig3_svm_{label}.png")), "SVM-refit kernel machine: decision value per class (paper Fig. 3)", &panels, "decision value", overlay.as_ref())?;
                notes.push(format!("- `charts/fig3_svm_{label}.png`: decision values of the SVM-refit kernel machine per class on the grid, with the training data (paper Fig. 3)."));
            }
        }
    Ok(notes)
}

/// Stationarity of the train×train EPK and the GP's far field.
fn stationarity(cx: &Ctx<'_>, tk: &Gram) -> Result<Vec<String>> {
    let (a, net, out, charts) = (&cx.cfg.analysis, cx.net, cx.out, &cx.charts);
    let mut notes = Vec::new();
    let dir = out.join("analysis").join("stationarity");
    io::create_dir_all(&dir)?;
    let report = report::stationarity_report(net, tk, &GpParams::new().fit_hyper(true), Rule::Auto(1e-8), 16, 10, 1.5, 0, &dir)?;
    let s = &report.summary;
    notes.push(format!(
        "- Stationarity (1 = stationary): train×train EPK {:.3} (per class {:?}), RBF on the same points {:.3}. Far field along {} ray points, Spearman correlation with the distance from the training data: kernel self-value {:+.2}, GP logit std {:+.2}, MC probability std {:+.2}.",
        s.score,
        s.class_scores.iter().map(|v| (v * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        s.rbf_score,
        s.ray_points,
        s.far_kernel_spearman,
        s.far_std_spearman,
        s.far_prob_std_spearman
    ));
    if a.charts {
        let mid: Vec<f64> = report.kernel.rows.iter().map(|r| (r.lo.max(1e-12) * r.hi).sqrt()).collect();
        let means = |pr: &Profile| pr.rows.iter().map(|r| r.mean).collect::<Vec<f64>>();
        plot::line_chart(
            &charts.join("far_field.png"),
            "Far from the data: GP uncertainty along rays",
            "distance to the nearest training point",
            "mean over ray points",
            &[
                Series::new("GP logit std", mid.clone(), means(&report.gp_std)),
                Series::new("MC std of probabilities", mid.clone(), means(&report.prob_std)),
            ],
            Scale::Log,
            Scale::Log,
        )?;
        notes.push("- `charts/far_field.png`: GP logit standard deviation and MC probability standard deviation against the distance from the training data, along rays.".into());
    }
    Ok(notes)
}

/// The gradient-similarity matrix of the first training points.
fn similarity(cx: &Ctx<'_>, tk: &Gram) -> Result<Vec<String>> {
    let (a, run, out, charts) = (&cx.cfg.analysis, cx.net.run(), cx.out, &cx.charts);
    let mut notes = Vec::new();
    let n = a.similarity.min(tk.shape().1);
    let trace = tk.trace();
    let mat: Vec<f64> = (0..n * n).map(|q| trace[(q / n, q % n)]).collect();
    let labels: Vec<String> = match &run.dataset.y_train {
        crate::data::Targets::Labels(y) => (0..n).map(|i| format!("x{i} (y={})", y[i])).collect(),
        _ => (0..n).map(|i| format!("x{i}")).collect(),
    };
    Table::new()
        .with("i", Column::I64((0..n * n).map(|q| (q / n) as i64).collect()))
        .with("j", Column::I64((0..n * n).map(|q| (q % n) as i64).collect()))
        .with("kernel", Column::F64(mat.clone()))
        .write_parquet(&out.join("similarity.parquet"))?;
    if a.charts {
        plot::matrix(&charts.join("similarity.png"), "Path-kernel similarity of training points (Σ_k K[k,k])", &labels, &mat, "kernel value")?;
    }
    notes.push(format!(
        "- Gradient-similarity matrix (the Domingos notebook, done with the train×train EPK summed over classes) of the first {n} training points: `similarity.parquet`{}.",
        if a.charts { ", `charts/similarity.png`" } else { "" }
    ));
    Ok(notes)
}

/// Attribution of chosen test points to the training points (the first EPK kernel on the test
/// points).
fn attribution(cx: &Ctx<'_>) -> Result<Vec<String>> {
    let (a, net, out) = (&cx.cfg.analysis, cx.net, cx.out);
    let mut notes = Vec::new();
    if let Some(StudyKernel { label, gram: rk, .. }) = cx.kernels.iter().find(|k| k.spec.kind == KernelKind::Epk && k.spec.points == Rows::Test && k.spec.side == Side::Test) {
        let dir = out.join("analysis").join("attribution");
        io::create_dir_all(&dir)?;
        let s = if rk.constant_a() {
            report::attribution_report(net, rk, &a.attribution_points, 10, &dir)?
        } else {
            // a_{i,s} varies by step (SGD, MSE): the ensemble needs per-step Grams; compute
            // them for the chosen points only.
            let p = rk.shape().0;
            if let Some(&bad) = a.attribution_points.iter().find(|&&q| q >= p) {
                return Err(Error::Config(format!("analysis.attribution_points: {bad} is out of range ({p} test points)")));
            }
            let Points { x, dim } = rk.points();
            let chosen: Vec<f64> = a.attribution_points.iter().flat_map(|&q| x[q * dim..(q + 1) * dim].iter().copied()).collect();
            let g = net.epk().inputs(&chosen).per_step().memory_budget(4 << 30).compute()?;
            let idx: Vec<usize> = (0..a.attribution_points.len()).collect();
            report::attribution_report(net, &g, &idx, 10, &dir)?
        };
        notes.push(format!(
            "- Attribution on `{label}` for test points {:?}: contributions of the training points sum to the network output minus the bias to {:.1e} ({}).",
            a.attribution_points, s.max_abs_residual, s.form
        ));
    }
    Ok(notes)
}

/// Per-training-point contributions at the class means (Fig. 6).
fn fig6(cx: &Ctx<'_>) -> Result<Vec<String>> {
    let (a, run, charts) = (&cx.cfg.analysis, cx.net.run(), &cx.charts);
    let mut notes = Vec::new();
    if let Some(StudyKernel { label, gram: rk, .. }) = cx.kernels.iter().find(|k| k.spec.points == Rows::ClassMeans && k.spec.kind == KernelKind::Epk) {
        if a.charts && run.dataset.dim == 2 && !rk.constant_a() {
            notes.push(format!("- No Fig. 6 chart for `{label}`: a_i,s varies by step, so no single machine splits the outputs."));
        } else if a.charts && run.dataset.dim == 2 {
            let (p, m, k) = rk.shape();
            let contrib = rk.contributions()?;
            let mut ov = train_overlay(run).expect("2-D classification");
            let mut panels = Vec::new();
            for q in 0..p {
                for c in 0..k {
                    ov.value = Some((0..m).map(|i| contrib[(q * m + i) * k + c]).collect());
                    panels.push((format!("mean of class {q}: output {c}"), ov.clone(), None));
                }
            }
            let marks: Vec<(f64, f64)> = rk.points().x.chunks(2).map(|r| (r[0], r[1])).collect();
            plot::point_value_panels(&charts.join(format!("fig6_{label}.png")), "Per-training-point contribution Σ_s a_i,s K_s(x, x_i) at the class means (paper Fig. 6)", &panels, &marks, "contribution")?;
            notes.push(format!("- `charts/fig6_{label}.png`: each training point's contribution to each output at the three class means (paper Fig. 6)."));
        }
    }
    Ok(notes)
}

/// The straight line from `w_0` to `w_N` (Fig. 8).
fn interpolation_analysis(cx: &Ctx<'_>) -> Result<Vec<String>> {
    let (a, out, charts) = (&cx.cfg.analysis, cx.out, &cx.charts);
    let (run, states) = (cx.net.run(), cx.net.states());
    let mut notes = Vec::new();
    let (t, loss, acc, proj, norm) = interpolation(run, states, a.interpolation)?;
    Table::new()
        .with("t", Column::F64(t.clone()))
        .with("loss", Column::F64(loss.clone()))
        .with("accuracy", Column::F64(acc.clone()))
        .with("gradient_projection", Column::F64(proj.clone()))
        .with("weight_norm", Column::F64(norm.clone()))
        .write_parquet(&out.join("interpolation.parquet"))?;
    notes.push(format!(
        "- Linear interpolation w(t) = w_0 + t(w_N − w_0) (paper Fig. 8, `interpolation.parquet`): loss {:.4} → {:.4}, weight norm {:.3} → {:.3} ({:+.1} %).",
        loss[0],
        loss[loss.len() - 1],
        norm[0],
        norm[norm.len() - 1],
        100.0 * (norm[norm.len() - 1] / norm[0] - 1.0)
    ));
    if a.charts {
        let scaled = |v: &[f64]| {
            let m = v.iter().fold(0.0f64, |a, b| a.max(b.abs())).max(1e-300);
            (v.iter().map(|x| x / m).collect::<Vec<f64>>(), m)
        };
        let (l, lm) = scaled(&loss);
        let (p, pm) = scaled(&proj);
        let (n, nm) = scaled(&norm);
        plot::line_chart(
            &charts.join("fig8_interpolation.png"),
            "Straight line from w_0 to w_N (paper Fig. 8)",
            "t",
            "value / its maximum",
            &[
                Series::new(format!("loss (max {lm:.3})"), t.clone(), l),
                Series::new("accuracy", t.clone(), acc),
                Series::new(format!("∇L along the path (max |·| {pm:.3})"), t.clone(), p),
                Series::new(format!("‖w(t)‖ (max {nm:.3})"), t, n),
            ],
            Scale::Linear,
            Scale::Linear,
        )?;
        notes.push("- `charts/fig8_interpolation.png`: loss, accuracy, the loss gradient projected on the straight path, and the weight norm along w(t) (paper Fig. 8).".into());
    }
    Ok(notes)
}

/// Loss, accuracy, `⟨∇L(w(t)), u⟩` (u the unit direction `w_N − w_0`) and `‖w(t)‖` along the
/// straight line `w(t) = w_0 + t(w_N − w_0)`, at `n` evenly spaced t.
#[allow(clippy::type_complexity)]
fn interpolation(run: &Run, states: &[crate::model::Params], n: usize) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    use crate::model::net::Objective;
    let arch = &run.manifest.architecture;
    let (w0, wn) = (&states[0], &states[states.len() - 1]);
    let (labels, values) = match &run.dataset.y_train {
        crate::data::Targets::Labels(y) => (Some(y.as_slice()), None),
        crate::data::Targets::Values(v) => (None, Some(v.as_slice())),
    };
    let obj = Objective::new(dfdx::tensor::Cpu::default(), arch, &run.dataset.x_train, labels, values, run.manifest.loss, Some(w0))?;
    let dir: Vec<f64> = wn.flat().iter().zip(w0.flat()).map(|(a, b)| a - b).collect();
    let dn = dir.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-300);
    let mut out = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for j in 0..n {
        let t = j as f64 / (n - 1) as f64;
        let w = crate::kernel::generic::interpolate(w0, Some(wn), t);
        let lg = obj.evaluate(&w);
        let acc = labels.map_or(f64::NAN, |y| crate::train::accuracy(&lg.outputs, y, arch.outputs()));
        let proj = lg.grad.flat().iter().zip(&dir).map(|(g, d)| g * d).sum::<f64>() / dn;
        out.0.push(t);
        out.1.push(lg.loss);
        out.2.push(acc);
        out.3.push(proj);
        out.4.push(w.norm());
    }
    Ok(out)
}

/// The SVM's C chosen on the validation split ([`report::svm_sweep_report`]): validation rows
/// of the EPK (class-diagonal), the study's EPK test rows, and the path's logit-space weights
/// `Σ_s a_{i,s}` from the kernel engine.
fn svm_sweep(cx: &Ctx<'_>, tk: &Gram) -> Result<Vec<String>> {
    let (cfg, net, kernels, out, base_dir, progress) = (cx.cfg, cx.net, cx.kernels, cx.out, cx.base_dir, cx.progress);
    let grid = &cfg.analysis.svm_c;
    let run = net.run();
    // A recorded run keeps its training and test sets; the validation split is read again from
    // the study's data section (and checked to belong to the same training set).
    let data = cfg.data.load(base_dir)?;
    if data.x_train != run.dataset.x_train {
        return Err(Error::Data("analysis.svm_c: the study's data section no longer gives the run's training set".into()));
    }
    let Some(val) = &data.validation else {
        return Err(Error::Config("analysis.svm_c chooses C on the validation split: the run has none (set data.val_per_class or val_fraction)".into()));
    };
    let crate::data::Targets::Labels(val_labels) = &val.y else {
        return Err(Error::Config("analysis.svm_c needs a classification run".into()));
    };
    let Some(test) = kernels.iter().find(|k| k.spec.kind == KernelKind::Epk && k.spec.points == Rows::Test && k.spec.side == Side::Test).map(|k| &k.gram) else {
        return Err(Error::Config("analysis.svm_c needs an epk kernel on the test points".into()));
    };
    let t0 = std::time::Instant::now();
    let bar = crate::progress::Progress::new(progress, 1, "EPK at the validation images {bar:40} {pos}/{len} steps [{elapsed} < {eta}]");
    let show = |a: usize, b: usize| {
        bar.set_length(b as u64);
        bar.set_position(a as u64);
    };
    let vrows = net.epk().inputs(&val.x).layout(crate::kernel::Layout::Diag).progress(&show).compute()?;
    bar.finish_and_clear();
    // The path's weights on the logits: a_{i,s} of a one-row DPK on the logits ([N, M, K]).
    let (m, _, k) = tk.shape();
    let d = run.dataset.dim;
    let one = net.dpk().inputs(&run.dataset.x_train[..d]).logits().layout(crate::kernel::Layout::Trace).compute()?;
    let a = &one.output().a;
    let mut path_a = vec![0.0; m * k];
    for chunk in a.chunks(m * k) {
        for (t, v) in path_a.iter_mut().zip(chunk) {
            *t += v;
        }
    }
    let rows_seconds = t0.elapsed().as_secs_f64();
    let dir = out.join("analysis").join("svm-sweep");
    io::create_dir_all(&dir)?;
    let sw = report::svm_sweep_report(net, tk, &vrows, val_labels, test, &path_a, grid, &dir)?;
    let chosen = sw.rows.iter().find(|r| r.c == sw.chosen_c).expect("chosen C is in the grid");
    let mut notes = vec![format!(
        "- SVM refit of a_i, C chosen on the {} validation images from {:?} (`analysis/svm-sweep/`): C = {} — validation {:.1} %, test {:.1} % (the network {:.1} %), agreement with the network {:.1} %, {} support vectors of {} × {} (fits and predictions {:.1} s; the validation rows and the path's weights {:.0} s).",
        val_labels.len(),
        grid,
        sw.chosen_c,
        100.0 * chosen.validation_accuracy,
        100.0 * chosen.test_accuracy,
        100.0 * sw.network_test_accuracy,
        100.0 * chosen.agreement_with_network,
        chosen.support_total,
        m,
        k,
        sw.rows.iter().map(|r| r.seconds).sum::<f64>(),
        rows_seconds
    )];
    notes.push(format!(
        "  Sweep (C: validation / test accuracy, support vectors): {}.",
        sw.rows.iter().map(|r| format!("{}: {:.1} / {:.1} %, {}", r.c, 100.0 * r.validation_accuracy, 100.0 * r.test_accuracy, r.support_total)).collect::<Vec<_>>().join("; ")
    ));
    let v = &sw.vs_path;
    let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    notes.push(format!(
        "  Against the path's weights A_i^c = Σ_s a_i,s^c on the logits (all {} points weighted; the SVM keeps {:?} per class, {:?} at the bound C): Spearman correlation of y_i α_i with A_i^c per class {:?} (mean {:.2}), Pearson mean {:.2}; share of the support vectors among the points the path weighted most (|A| top-|support|) {:?} (mean {:.2}).",
        v.m,
        v.support,
        v.at_bound,
        v.spearman.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>(),
        mean(&v.spearman),
        mean(&v.pearson),
        v.top_overlap.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>(),
        mean(&v.top_overlap)
    ));
    Ok(notes)
}

/// The stationarity score of the NTK at `w_N` on the same training points, next to the EPK's.
fn ntk_stationarity(cx: &Ctx<'_>, tk: &Gram) -> Result<Vec<String>> {
    let (net, dir) = (cx.net, cx.out.join("analysis").join("stationarity"));
    let epk_score = report::kernel_stationarity(net, tk, 0)?.0;
    let ntk = net.ntk().train_side().layout(tk.layout()).compute()?;
    let (score, class_scores) = report::kernel_stationarity(net, &ntk, 0)?;
    io::write_json(&dir.join("stationarity_ntk.json"), &serde_json::json!({ "score": score, "class_scores": class_scores, "epk_score": epk_score }))?;
    Ok(vec![format!(
        "  The NTK at w_N on the same points (`stationarity_ntk.json`): {score:.3} (per class {:?}), against the EPK's {epk_score:.3}.",
        class_scores.iter().map(|v| (v * 1000.0).round() / 1000.0).collect::<Vec<_>>()
    )])
}

/// The far field on the uncertainty benchmark's images ([`report::settings_far_field_report`])
/// and its chart.
fn settings_far_field(cx: &Ctx<'_>, tk: &Gram) -> Result<Vec<String>> {
    let (net, points, charts_on, progress) = (cx.net, cx.cfg.analysis.far_field_points, cx.cfg.analysis.charts, cx.progress);
    let (dir, charts) = (cx.out.join("analysis").join("stationarity"), &cx.charts);
    let bar = crate::progress::Progress::new(progress, 1, "EPK at the benchmark's images {bar:40} {pos}/{len} steps [{elapsed} < {eta}]");
    let show = |a: usize, b: usize| {
        bar.set_length(b as u64);
        bar.set_position(a as u64);
    };
    let t0 = std::time::Instant::now();
    // Each setting's rows are cached (the run, the kind, the rule and the images' bytes).
    let rule = Rule::Auto(1e-8);
    let rows_of = |name: &str, x: &[f64]| -> Result<Gram> {
        let kdir = cx.cache.join("analysis").join("far-settings").join(name);
        let key = Key::of(&[&net.run().manifest.run_id, &tk.kind().to_string(), &rule.to_string(), &crate::kernel::output::VERSION.to_string(), &Key::of_bytes(&f64_bytes(x)).to_string()]);
        if reusable(&kdir, &key) {
            return Gram::open(&kdir, net);
        }
        io::create_dir_all(&kdir)?;
        unstamp(&kdir)?;
        let g = net.kernel(tk.kind()).inputs(x).rule(rule).layout(crate::kernel::Layout::Diag).progress(&show).compute()?;
        g.save(&kdir)?;
        stamp(&kdir, &key)?;
        Ok(g)
    };
    let r = report::settings_far_field_report(net, tk, &GpParams::new().fit_hyper(true), points, 0, &dir, &rows_of)?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let mut notes = vec![format!(
        "- Far field on real images (`analysis/stationarity/far_settings.*`: {points} images of each benchmark setting, EPK rows auto:1e-8, {secs:.0} s). Median distance to the nearest training image / kernel self-value / GP logit std / MC probability std: {}. Spearman correlation with the distance over all {} points: kernel self-value {:+.2}, GP logit std {:+.2}, MC probability std {:+.2}.",
        r.settings.iter().map(|s| format!("{} {:.2} / {:.3e} / {:.3} / {:.4}", s.setting, s.median_distance, s.median_kernel, s.median_gp_std, s.median_prob_std)).collect::<Vec<_>>().join("; "),
        r.settings.iter().map(|s| s.points).sum::<usize>(),
        r.pooled_spearman[0],
        r.pooled_spearman[1],
        r.pooled_spearman[2]
    )];
    if charts_on {
        let names = ["kernel self-value K(x, x) (mean over classes)", "GP posterior logit std (mean over classes)", "MC std of the softmax probabilities (mean over classes)"];
        let files = ["far_settings_kernel.png", "far_settings_gp_std.png", "far_settings_prob_std.png"];
        for (j, (name, file)) in names.iter().zip(files).enumerate() {
            let series: Vec<Series> = r
                .settings
                .iter()
                .zip(&r.profiles)
                .map(|(s, pr)| {
                    let rows: Vec<_> = pr[j].rows.iter().filter(|row| row.count > 0).collect();
                    Series::new(s.setting.clone(), rows.iter().map(|row| 0.5 * (row.lo + row.hi)).collect(), rows.iter().map(|row| row.mean).collect())
                })
                .collect();
            plot::line_chart(&charts.join(file), &format!("Far from the data on real images: {name}"), "distance to the nearest training image", name, &series, Scale::Linear, if j == 0 { Scale::Log } else { Scale::Linear })?;
        }
        notes.push("- `charts/far_settings_kernel.png`, `charts/far_settings_gp_std.png`, `charts/far_settings_prob_std.png`: per setting, the mean of each quantity in distance bins (the far field on real images).".into());
    }
    Ok(notes)
}
