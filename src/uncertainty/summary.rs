//! The uncertainty study's report: `summary.md` (deterministic given the study's results),
//! `timings.md`, and the charts, all from an [`UqStudyReport`].

use std::fmt::Write;
use std::path::Path;

use crate::error::Result;
use crate::io;
use crate::plot::{BarSeries, Chart, ImageTile, ReliabilityPanel, Series};

use super::method::{display_name, FslVariant, GpKernel, Method};
use super::metrics::{self, ECE_BINS};
use crate::gp::Curvature;
use crate::kernel::KernelKind;
use super::report::{Metric, SettingKind};
use super::record::UqStudyReport;
use super::Setting;

/// The function-space Laplace predictives drawn beside the protocol's methods in the reliability,
/// angle and OOD charts.
const ANGLE_FSL: [(Method, &str); 2] = [
    (Method::Fsl(GpKernel::Epk, Curvature::Full, FslVariant::Probit), "FSL on the EPK, full Λ (δ by evidence)"),
    (Method::Fsl(GpKernel::Epk, Curvature::ClassDiagonal, FslVariant::Temperature), "FSL on the EPK, diagonal, validation T"),
];

/// The legend entry of a method on the frontier chart: the protocol's methods by name, the
/// kernel GPs together, function-space Laplace per kernel, class-diagonal or cross-class (`K×K`)
/// kernel, with δ by the evidence or a validation fit (T, (T, s), the δ grid). Short enough that
/// the legend keeps its font with the full study's 18 families.
fn frontier_family(m: &str) -> String {
    match m.parse::<Method>() {
        Ok(Method::Fsl(kernel, _, v)) => format!("FSL {}: {}", kernel.label(), if v.calibrated() { "validation fit" } else { "evidence δ" }),
        Ok(Method::FslKxk(kernel, _, v)) => format!("FSL {} K×K: {}", kernel.label(), if v.calibrated() { "validation fit" } else { "evidence δ" }),
        Ok(x) if Method::PROTOCOL.contains(&x) && !matches!(x, Method::Gp(_)) => display_name(m),
        _ => KERNEL_GPS.to_string(),
    }
}

/// The frontier chart's legend entry of the kernel GPs.
const KERNEL_GPS: &str = "kernel GPs (regression)";

/// The frontier chart's series: `(method, clean NLL, rot-60 NLL)` grouped by [`frontier_family`]
/// as `(family, xs, ys)`: the kernel GPs, then the function-space Laplace families, then the
/// protocol's other methods, each group in the order of first appearance. Series are drawn in
/// order, so the baselines' few markers go on top of the many FSL fits around them, and the GPs'
/// (the `-netmean` GPs score about as the network does) under the MAP's.
fn frontier_families(points: &[(String, f64, f64)]) -> Vec<(String, Vec<f64>, Vec<f64>)> {
    let mut families: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for (m, a, b) in points {
        let family = frontier_family(m);
        match families.iter_mut().find(|f| f.0 == family) {
            Some(f) => {
                f.1.push(*a);
                f.2.push(*b);
            }
            None => families.push((family, vec![*a], vec![*b])),
        }
    }
    families.sort_by_key(|f| if f.0 == KERNEL_GPS { 0 } else if f.0.starts_with("FSL ") { 1 } else { 2 });
    families
}

/// The methods of `list` present in the results, with their display names, in order.
fn present_of(r: &UqStudyReport, list: &[Method]) -> Vec<(String, String)> {
    let present = r.results.methods();
    list.iter().map(|m| m.to_string()).filter(|m| present.iter().any(|p| p == m)).map(|m| (m.clone(), display_name(&m))).collect()
}

/// The protocol's methods present in the results, in table order.
fn methods(r: &UqStudyReport) -> Vec<(String, String)> {
    present_of(r, &Method::PROTOCOL)
}

/// The other methods present (ablations), in order.
fn ablations(r: &UqStudyReport) -> Vec<(String, String)> {
    let mut out = present_of(r, &Method::ABLATIONS);
    let named: Vec<String> = Method::PROTOCOL.iter().chain(&Method::ABLATIONS).map(|m| m.to_string()).collect();
    for m in r.results.methods() {
        if !named.iter().any(|x| x == m) {
            out.push((m.to_string(), m.to_string()));
        }
    }
    out
}

fn fmt(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.4}"),
        Some(x) => format!("{x}"),
        None => "—".into(),
    }
}

/// The rotation angle of a setting name `rot-{a}`.
fn angle(name: &str) -> Option<f64> {
    name.strip_prefix("rot-").and_then(|a| a.parse().ok())
}

fn setting_title(r: &UqStudyReport, name: &str) -> String {
    let s = r.results.settings.iter().find(|s| s.name == name);
    let n = s.map_or(0, |s| s.n);
    match (name, angle(name)) {
        ("clean", _) => format!("clean test set ({n} images)"),
        ("noise", _) => format!("uniform noise U[0,1]^784 ({n} images) vs the clean test set"),
        ("inverted", _) => format!("inverted test images 1 − x (the first {n}) vs the clean test set"),
        (_, Some(a)) => format!("rotated by {a}° (the first {n} test images)"),
        _ => format!("{name} ({n} points)"),
    }
}

/// `summary.md`, section by section.
pub(crate) fn summary_markdown(r: &UqStudyReport) -> String {
    let mut s = String::new();
    summary_data(&mut s, r);
    summary_selection(&mut s, r);
    summary_fits(&mut s, r);
    summary_exactness(&mut s, r);
    summary_results(&mut s, r);
    summary_comparison(&mut s, r);
    summary_files(&mut s, r);
    s
}

/// The title, the provenance and the data, network and settings.
fn summary_data(s: &mut String, r: &UqStudyReport) {
    let res = &r.results;
    let _ = writeln!(*s, "# Study `{}`\n", r.name);
    if !r.description.is_empty() {
        let _ = writeln!(*s, "{}\n", r.description.trim());
    }
    let _ = writeln!(
        s,
        "Produced by `pathkernel study run {}` (pathkernel {}). Every number here is a function of the study file and the \
         cached results (`runs/{}/`); the seconds each stage took are in [`timings.md`](timings.md), the only file of this \
         report that changes when the study is recomputed from an empty cache.\n",
        r.study_file,
        env!("CARGO_PKG_VERSION"),
        r.name
    );

    let _ = writeln!(*s, "## Data, network, settings\n");
    let _ = writeln!(*s, "- data: {}", r.data_description);
    let _ = writeln!(*s, "- {} training, {} validation, {} test images", r.sizes[0], r.sizes[1], r.sizes[2]);
    let _ = writeln!(
        s,
        "- network: {}, {} parameters, final layer zero-initialised, f64, mean cross-entropy, full-batch gradient descent, seed 0 (run id `{}`); \
         after training: train accuracy {:.2} %, loss {:.4}",
        r.network.0,
        r.network.1,
        r.network.2,
        100.0 * r.train_fit.0,
        r.train_fit.1
    );
    let _ = writeln!(*s, "- settings: {}", res.settings.iter().map(|x| format!("`{}` ({})", x.name, x.n)).collect::<Vec<_>>().join(", "));
    let _ = writeln!(
        s,
        "- Monte-Carlo predictives (Laplace, GPs): {} samples per point, seed {} (point p on ChaCha8 stream p)\n",
        r.mc.0, r.mc.1
    );

}

/// The selection of lr and steps, and the ensemble members.
fn summary_selection(s: &mut String, r: &UqStudyReport) {
    let _ = writeln!(*s, "## Selection of the learning rate and the number of steps\n");
    let _ = writeln!(*s, "One run per learning rate, trained to the largest step count; the validation accuracy of the state after each step count picks the pair (ties: the smaller rate, then fewer steps).\n");
    let _ = writeln!(*s, "| lr | steps | validation accuracy | validation NLL | training loss |");
    let _ = writeln!(*s, "|---|---|---|---|---|");
    for row in &r.selection.rows {
        let chosen = row.lr == r.selection.lr && row.steps == r.selection.steps;
        let b = if chosen { "**" } else { "" };
        let _ = writeln!(*s, "| {b}{}{b} | {b}{}{b} | {b}{:.4}{b} | {:.4} | {:.4} |", row.lr, row.steps, row.val_accuracy, row.val_nll, row.train_loss);
    }
    let _ = writeln!(*s, "\nChosen: **lr = {}, {} steps**.", r.selection.lr, r.selection.steps);
    if let Some(same) = r.selection.prefix_identical {
        let _ = writeln!(
            s,
            "The network under test is its own run of {} steps; its last state {} the selection run's state {} bit for bit.",
            r.selection.steps,
            if same { "equals" } else { "**differs from**" },
            r.selection.steps
        );
    }
    let _ = writeln!(*s, "\nDeep ensemble members (the same configuration, seeds {}): clean test accuracy {}.\n",
        r.ensemble.iter().map(|e| e.0.to_string()).collect::<Vec<_>>().join(", "),
        r.ensemble.iter().map(|e| format!("{:.4}", e.2)).collect::<Vec<_>>().join(", "));

}

/// The fitted hyper-parameters (temperature, Laplace, kernel GPs, function-space Laplace).
fn summary_fits(s: &mut String, r: &UqStudyReport) {
    let res = &r.results;
    let _ = writeln!(*s, "## Fitted hyper-parameters\n");
    if let Some(t) = &res.temperature {
        let _ = writeln!(*s, "- temperature scaling: **T = {:.4}** (validation NLL {:.4} → {:.4}, {} validation images)", t.temperature, t.nll_before, t.nll_after, t.n);
    }
    if let Some(l) = &res.laplace {
        let _ = writeln!(
            s,
            "- last-layer Laplace (exact GGN, {} parameters): **λ = {:.4e}** by the Laplace marginal likelihood (log evidence {:.3}, log likelihood {:.3}; {} GGN eigenvalues below 0 from rounding set to 0, most negative {:.1e})",
            l.num_params, l.prior_precision, l.log_marginal_likelihood, l.log_likelihood, l.clamped_eigenvalues.0, l.clamped_eigenvalues.1
        );
    }
    for (name, fit) in &r.kernel_gps {
        let gram = match fit.train_gram {
            super::kernel_gp::TrainGram::TrainSide if fit.kind == KernelKind::Epk.to_string() => "the EPK training Gram with the gradients at t = 0 on both sides",
            super::kernel_gp::TrainGram::TrainSide if fit.kind == KernelKind::Path.to_string() => "the path-averaged kernel with both sides integrated over each step (a window: its last steps only)",
            super::kernel_gp::TrainGram::TrainSide => "the NTK at w_N on the training points",
            super::kernel_gp::TrainGram::SymmetrisedTestSide => "the EPK training Gram with the training points on the test side (integrated), symmetrised",
        };
        let _ = writeln!(
            s,
            "- {} (`{name}`): one GP per class on the class block of {gram}, targets = network outputs minus the bias f(w_0), noise σ² and scale s per class by marginal likelihood:\n",
            display_name(name)
        );
        let _ = writeln!(*s, "  | class | σ² | s | σ² / (s·mean diag K) | jitter | log marginal likelihood | asymmetry before symmetrisation |");
        let _ = writeln!(*s, "  |---|---|---|---|---|---|---|");
        for c in 0..fit.noise.len() {
            let _ = writeln!(
                s,
                "  | {c} | {:.3e} | {:.3e} | {:.2e} | {:.1e} | {:.2} | {:.1e} |",
                fit.noise[c],
                fit.output_scale[c],
                fit.noise[c] / (fit.output_scale[c] * fit.mean_diag[c]),
                fit.jitter[c],
                fit.log_marginal_likelihood[c],
                fit.asymmetry[c]
            );
        }
        let _ = writeln!(*s);
    }
    if !r.fsl.is_empty() {
        let _ = writeln!(*s, "## Function-space Laplace fits\n");
        let _ = writeln!(
            s,
            "GP prior `k/δ` on the logits (the kernels on the logits), softmax-Hessian curvature at the network's outputs, the network as the mean \
             (`src/gp/functional.rs`). δ by the function-space evidence; `-grid`: δ by the validation NLL over logspace(−4, 4, 100); `-T`: a temperature \
             fitted on the validation split; `-Ts`: temperature T and variance scale s fitted there together (s = 0 is temperature scaling). \
             Blocks `class-diagonal`: one GP per class on `K^{{cc}}` (`diag` curvature λ = p(1 − p): laplace-torch's `independent_outputs=True`; \
             `full`: the full per-point Λ_i = diag(p_i) − p_i p_iᵀ with the class-diagonal kernel, a hybrid that is neither laplace-torch's nor the GGN's). \
             Blocks `kxk` (`fsl-…-kxk-…`, `src/gp/crossclass/`): the whole [M·K, M·K] kernel with its cross-class blocks \
             (`diag` λ: laplace-torch's `independent_outputs=False`; `full` Λ_i: the GGN-exact posterior); for these the kernel eigenvalues are of the \
             whole kernel and the `S K S` column holds those of `G = Fᵀ K F` (`—`: the Cholesky route, which computes no eigenvalue).\n"
        );
        let _ = writeln!(*s, "| kernel | blocks | curvature | δ (evidence) | log evidence | δ (grid) | T (`-T`) | val NLL (`-T`) | s, T (`-Ts`) | val NLL (`-Ts`) | min eig K_c / max | min eig S K S | smallest posterior variance (clamped) |");
        let _ = writeln!(*s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for f in &r.fsl {
            let (kmin, smin) = match &f.fit.kxk {
                // The Cholesky route computes no eigenvalue: those cells are `—`.
                Some(x) => (x.k_eig.map_or(f64::NAN, |e| e[0] / e[1]), x.g_min_eig.unwrap_or(f64::NAN)),
                None => (
                    f.fit.classes.iter().map(|c| c.k_eig[0] / c.k_eig[1]).fold(f64::INFINITY, f64::min),
                    f.fit.classes.iter().map(|c| c.sks_min_eig).fold(f64::INFINITY, f64::min),
                ),
            };
            let blocks = if f.fit.kxk.is_some() { "kxk" } else { "class-diagonal" };
            let (vmin, clamped) = f.min_variance.iter().fold((f64::INFINITY, 0usize), |a, v| (a.0.min(v.1), a.1 + v.2));
            let eig = |v: f64| if v.is_nan() { "—".to_string() } else { format!("{v:.2e}") };
            let (kmin, smin) = (eig(kmin), eig(smin));
            let _ = writeln!(
                s,
                "| {} | {blocks} | {} | {:.4e} | {:.2} | {} | {:.4} | {:.4} | {:.3e}, {:.4} | {:.4} | {} | {} | {:.3e} ({clamped}) |",
                f.kernel,
                f.fit.curvature,
                f.fit.delta,
                f.fit.log_evidence,
                f.grid.as_ref().map_or("—".into(), |g| format!("{:.4e}", g.0)),
                f.temperature.temperature,
                f.temperature.val_nll,
                f.calibration.scale,
                f.calibration.temperature,
                f.calibration.val_nll,
                kmin,
                smin,
                vmin
            );
        }
        let _ = writeln!(*s, "\nThe s-frontier of `-Ts` (validation NLL with T refitted at each s) is in `gp_fits.json`; `charts/frontier.png` plots every method's clean NLL against its rot-60 NLL, one marker per method and one legend entry per family (FSL per kernel, `K×K` for the cross-class kernel, \"evidence δ\" for δ by the evidence with probit or MC, \"validation fit\" for T, (T, s) and the δ grid).\n");
        summary_kxk(s, r);
    }

}

/// The cross-class fits' factorisations: sizes, wall times and the two routes' agreement.
fn summary_kxk(s: &mut String, r: &UqStudyReport) {
    let kxk: Vec<_> = r.fsl.iter().filter_map(|f| f.fit.kxk.as_ref().map(|x| (f, x))).collect();
    let eig: Vec<_> = kxk.iter().filter(|(_, x)| x.solver == crate::gp::KxkSolver::Eigen).collect();
    let chol: Vec<_> = kxk.iter().filter(|(_, x)| x.solver == crate::gp::KxkSolver::Cholesky).collect();
    if !eig.is_empty() {
        let _ = writeln!(
            s,
            "Cross-class fits: the [M·K, M·K] system. `G = Fᵀ K F` is eigendecomposed once (every δ: the evidence, the grid); the Cholesky of `I + G/δ` at the \
             evidence's δ is the one-δ alternative (laplace-torch factors `K/δ + diag(1/λ)`, the same size), timed on the same matrix, its log-determinant \
             against the eigenvalues'. Wall seconds on the study's machine (its load in `timings.md`).\n"
        );
        let _ =
            writeln!(*s, "| kernel | curvature | M·K | eig K (s) | form G (s) | eig G (s) | Cholesky I + G/δ (s) | log det: Cholesky vs eig (rel.) | λ exactly 0 | K eigenvalues left out of rᵀK⁺r |");
        let _ = writeln!(*s, "|---|---|---|---|---|---|---|---|---|---|");
        for (f, x) in eig {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1e} | {} | {} |",
                f.kernel,
                f.fit.curvature,
                x.n,
                x.seconds.eig_k,
                x.seconds.form_g,
                x.seconds.eig_g,
                x.seconds.cholesky,
                x.logdet_rel_diff.unwrap_or(f64::NAN),
                x.lambda_zero,
                x.pinv_dropped.map_or("—".into(), |d| d.to_string())
            );
        }
        let _ = writeln!(*s);
    }
    if !chol.is_empty() {
        let _ = writeln!(
            s,
            "Cross-class fits by the Cholesky route (`fsl_kxk_solver = \"cholesky\"`, `src/gp/crossclass/cholesky.rs`): no eigendecomposition; `rᵀK⁺r` by a \
             Cholesky of K (of K + τI where K does not factor), δ by Brent's search on the evidence with one Cholesky of `δI + G` per step, the validation \
             grid coarse to fine with one per value visited. Wall seconds on the study's machine (its load in `timings.md`).\n"
        );
        let _ = writeln!(*s, "| kernel | curvature | M·K | Cholesky K (s) | τ | form G (s) | δ search (s) | factorisations | per factorisation (s) | λ exactly 0 |");
        let _ = writeln!(*s, "|---|---|---|---|---|---|---|---|---|---|");
        for (f, x) in chol {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {:.1e} | {:.1} | {:.1} | {} | {:.1} | {} |",
                f.kernel,
                f.fit.curvature,
                x.n,
                x.seconds.eig_k,
                x.scatter_jitter.unwrap_or(0.0),
                x.seconds.form_g,
                x.seconds.eig_g,
                x.search_factorisations.unwrap_or(0),
                x.seconds.cholesky,
                x.lambda_zero
            );
        }
        let _ = writeln!(*s);
    }
}

/// The exactness of every Gram used.
fn summary_exactness(s: &mut String, r: &UqStudyReport) {
    let _ = writeln!(*s, "## Exactness of the Grams used\n");
    let _ = writeln!(
        s,
        "Each Gram's kernel machine `f(w_0) + Σ_s Σ_i a_is K_s(x, x_i)` against the network `f(w_N)` at its rows (on the kernels' outputs, the logits; all classes; a window of the last L steps starts from `f(w_{{N−L}})`). \
         The EPK's test-side rows are exact; its train-side training Gram takes the gradients at t = 0 on both sides (a symmetric kernel for the GP), so its \
         machine is the discrete path kernel's, not exact; the NTK at w_N is the linearisation; the path kernel integrates both sides, so its machine is not the network either.\n"
    );
    let _ = writeln!(*s, "| Gram | rows | side | points | steps | max \\|machine − network\\| | mean | gradient evaluations per point and step (mean / max) |");
    let _ = writeln!(*s, "|---|---|---|---|---|---|---|---|");
    let row = |s: &mut String, what: &str, c: &super::kernel_gp::GramCheck| {
        let _ = writeln!(
            s,
            "| {what} | {} | {} | {} | {} | {:.2e} | {:.2e} | {:.2} / {} |",
            c.rows, c.side, c.points, c.steps, c.max_abs_error, c.mean_abs_error, c.mean_evaluations, c.max_evaluations
        );
    };
    for (name, fit) in &r.kernel_gps {
        row(s, &format!("training Gram of `{name}`"), &fit.train_check);
    }
    for (kernel, checks) in &r.row_grams {
        for c in checks {
            row(s, &format!("{} rows", kernel.to_uppercase()), c);
        }
    }
    let _ = writeln!(*s);

}

/// The metrics per setting and against the rotation angle.
fn summary_results(s: &mut String, r: &UqStudyReport) {
    let res = &r.results;
    let ms = methods(r);
    let _ = writeln!(*s, "## Results per setting\n");
    let _ = writeln!(*s, "NLL = mean −ln p(label); Brier = mean over points of the sum over classes of (p − onehot)²; ECE with {ECE_BINS} equal-width bins of the top-label confidence. OOD: AUROC of the test set (positives) against the OOD images by the max softmax probability, and by the posterior logit variance (summed over classes) where the method has one (OOD images positive).\n");
    for st in &res.settings {
        let _ = writeln!(*s, "### `{}`: {}\n", st.name, setting_title(r, &st.name));
        match st.kind {
            SettingKind::Clean | SettingKind::Shifted => {
                let _ = writeln!(*s, "| method | accuracy | NLL | Brier | ECE |");
                let _ = writeln!(*s, "|---|---|---|---|---|");
                for (m, n) in &ms {
                    let g = |x| res.metric(m, &st.name, x);
                    let _ = writeln!(*s, "| {n} | {} | {} | {} | {} |", fmt(g(Metric::Accuracy)), fmt(g(Metric::Nll)), fmt(g(Metric::Brier)), fmt(g(Metric::Ece)));
                }
            }
            SettingKind::Ood => {
                let _ = writeln!(*s, "| method | AUROC, max probability | AUROC, logit variance |");
                let _ = writeln!(*s, "|---|---|---|");
                for (m, n) in &ms {
                    let g = |x| res.metric(m, &st.name, x);
                    let _ = writeln!(*s, "| {n} | {} | {} |", fmt(g(Metric::AurocMsp)), fmt(g(Metric::AurocVariance)));
                }
            }
        }
        let _ = writeln!(*s);
    }

    let labelled: Vec<&str> = res.settings.iter().filter(|x| x.kind != SettingKind::Ood).map(|x| x.name.as_str()).collect();
    for (metric, title) in [(Metric::Nll, "NLL"), (Metric::Ece, "ECE"), (Metric::Accuracy, "Accuracy")] {
        let _ = writeln!(*s, "### {title} against the rotation angle (0 = the clean set)\n");
        let _ = writeln!(*s, "| method | {} |", labelled.iter().map(|n| angle(n).map_or("0".to_string(), |a| format!("{a}°"))).collect::<Vec<_>>().join(" | "));
        let _ = writeln!(*s, "|---|{}", "---|".repeat(labelled.len()));
        for (m, n) in &ms {
            let _ = writeln!(*s, "| {n} | {} |", labelled.iter().map(|x| fmt(res.metric(m, x, metric))).collect::<Vec<_>>().join(" | "));
        }
        let _ = writeln!(*s);
    }

}

/// The EPK-GP against each method, and the ablations.
fn summary_comparison(s: &mut String, r: &UqStudyReport) {
    let res = &r.results;
    let labelled: Vec<&str> = res.settings.iter().filter(|x| x.kind != SettingKind::Ood).map(|x| x.name.as_str()).collect();
    let _ = writeln!(*s, "## Where the EPK-GP wins and where it loses\n");
    let _ = writeln!(*s, "{}", comparison(r));

    let abl = ablations(r);
    if !r.failed.is_empty() {
        let _ = writeln!(*s, "## Ablations left out\n");
        for (m, e) in &r.failed {
            let _ = writeln!(*s, "- `{m}` ({}): {e}", display_name(m));
        }
        let _ = writeln!(*s);
    }
    if !abl.is_empty() {
        let _ = writeln!(*s, "## Ablations of the kernel GPs (not part of the protocol)\n");
        let _ = writeln!(*s, "The same Grams, other choices: {}. Rows: the protocol's EPK-GP and NTK-GP and the MAP for reference.\n",
            abl.iter().map(|(m, n)| if m == n { format!("`{m}`") } else { format!("`{m}` = {n}") }).collect::<Vec<_>>().join("; "));
        let mut rows = present_of(r, &[Method::Map, Method::Gp(GpKernel::Epk), Method::Gp(GpKernel::Ntk)]);
        rows.extend(abl.iter().cloned());
        for (metric, title) in [(Metric::Nll, "NLL"), (Metric::Ece, "ECE"), (Metric::Accuracy, "Accuracy")] {
            let _ = writeln!(*s, "{title}:\n");
            let _ = writeln!(*s, "| method | {} |", labelled.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" | "));
            let _ = writeln!(*s, "|---|{}", "---|".repeat(labelled.len()));
            for (m, n) in &rows {
                let _ = writeln!(*s, "| {n} | {} |", labelled.iter().map(|x| fmt(res.metric(m, x, metric))).collect::<Vec<_>>().join(" | "));
            }
            let _ = writeln!(*s);
        }
        let ood: Vec<&str> = res.settings.iter().filter(|x| x.kind == SettingKind::Ood).map(|x| x.name.as_str()).collect();
        let _ = writeln!(*s, "OOD AUROC (max probability / logit variance):\n");
        let _ = writeln!(*s, "| method | {} |", ood.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" | "));
        let _ = writeln!(*s, "|---|{}", "---|".repeat(ood.len()));
        for (m, n) in &rows {
            let _ = writeln!(*s, "| {n} | {} |", ood.iter().map(|x| format!("{} / {}", fmt(res.metric(m, x, Metric::AurocMsp)), fmt(res.metric(m, x, Metric::AurocVariance)))).collect::<Vec<_>>().join(" | "));
        }
        let _ = writeln!(*s);
    }

}

/// Charts, the author's notes, the files.
fn summary_files(s: &mut String, r: &UqStudyReport) {
    let _ = writeln!(*s, "## Charts\n");
    let _ = writeln!(*s, "- `charts/reliability_clean.png`, `charts/reliability_{}.png`: reliability diagrams, one panel per method.", reliability_shift(r).unwrap_or_default());
    let _ = writeln!(*s, "- `charts/nll_vs_angle.png`, `charts/ece_vs_angle.png`, `charts/accuracy_vs_angle.png`: one line per method; angle 0 is the clean set (all test images), the rotations take the first images.");
    let _ = writeln!(*s, "- `charts/ood_auroc.png`: OOD AUROCs (noise, inverted) by max probability and by logit variance.");
    let _ = writeln!(*s, "- `charts/disagreement.png`: the clean test images on which the EPK-GP's and the MAP's top-label confidences differ most.\n");

    if !r.notes.trim().is_empty() {
        let _ = writeln!(*s, "## Discussion (the study author's notes, from the study file)\n");
        let _ = writeln!(*s, "{}\n", r.notes.trim());
    }

    let _ = writeln!(*s, "## Files\n");
    let _ = writeln!(*s, "- `predictions.parquet` (every method, the ablations included): one row per (method, setting, point): `method`, `setting`, `point`, `label` (−1 for OOD), `p0`…`p9`, `ood_score` (NaN for methods without a variance).");
    let _ = writeln!(*s, "- `metrics.parquet`: one row per (method, setting, metric): `method`, `setting`, `metric`, `value`, `n`.");
    let _ = writeln!(*s, "- `uq.json` (temperature, Laplace fit, settings, benchmark configuration), `selection.json`, `gp_fits.json` (GP hyper-parameters and Gram checks), `timings.md`/`timings.json`, `study.toml`.");
    let _ = writeln!(
        s,
        "- Check: the study re-read `predictions.parquet` and re-scored it: {} metric values, largest difference from `metrics.parquet` {}. \
         Independently, with numpy: `python3 scripts/check_uncertainty_metrics.py reports/{} --tol 1e-9`.\n",
        r.rescored.0,
        if r.rescored.1 == 0.0 { "0 (identical)".to_string() } else { format!("{:e}", r.rescored.1) },
        r.name
    );
}

/// The rotation setting shown in the second reliability chart: 45° if present, else the middle one.
fn reliability_shift(r: &UqStudyReport) -> Option<String> {
    let rots: Vec<&str> = r.results.settings.iter().filter(|x| x.kind == SettingKind::Shifted).map(|x| x.name.as_str()).collect();
    if rots.is_empty() {
        return None;
    }
    Some(rots.iter().find(|n| angle(n) == Some(45.0)).copied().unwrap_or(rots[rots.len() / 2]).to_string())
}

/// Plain-language comparison of the EPK-GP with each other method, from the metrics.
fn comparison(r: &UqStudyReport) -> String {
    let res = &r.results;
    let mut s = String::new();
    let ms = methods(r);
    let (epk, ntk, laplace) = (Method::Gp(GpKernel::Epk).to_string(), Method::Gp(GpKernel::Ntk).to_string(), Method::Laplace.to_string());
    if !ms.iter().any(|(m, _)| *m == epk) {
        return "The EPK-GP was not run.\n".into();
    }
    let labelled: Vec<&str> = res.settings.iter().filter(|x| x.kind != SettingKind::Ood).map(|x| x.name.as_str()).collect();
    let ood: Vec<&str> = res.settings.iter().filter(|x| x.kind == SettingKind::Ood).map(|x| x.name.as_str()).collect();
    let get = |m: &str, st: &str, x: Metric| res.metric(m, st, x).unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "Counted over the {} labelled settings (clean and {} rotations) for NLL and ECE (lower is better), and over the OOD settings for the AUROC by max probability (higher is better). Generated from the tables above.\n",
        labelled.len(),
        labelled.len().saturating_sub(1)
    );
    for (m, n) in ms.iter().filter(|(m, _)| *m != epk) {
        let mut line = format!("- **vs {n}**: ");
        let mut parts = Vec::new();
        for (x, xn) in [(Metric::Nll, "NLL"), (Metric::Ece, "ECE")] {
            let wins: Vec<&str> = labelled.iter().filter(|st| get(&epk, st, x) < get(m, st, x)).copied().collect();
            let losses: Vec<&str> = labelled.iter().filter(|st| get(&epk, st, x) > get(m, st, x)).copied().collect();
            let worst = labelled
                .iter()
                .map(|st| (st, get(&epk, st, x) - get(m, st, x)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .filter(|w| w.1 > 0.0)
                .map_or(String::new(), |(st, d)| format!("; largest loss at `{st}` (+{d:.4})"));
            let best = labelled
                .iter()
                .map(|st| (st, get(&epk, st, x) - get(m, st, x)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .filter(|w| w.1 < 0.0)
                .map_or(String::new(), |(st, d)| format!("; largest gain at `{st}` ({d:.4})"));
            parts.push(format!(
                "{xn} better in {} of {} ({}){}{}",
                wins.len(),
                labelled.len(),
                if losses.is_empty() { "loses nowhere".to_string() } else { format!("worse at {}", losses.iter().map(|x| format!("`{x}`")).collect::<Vec<_>>().join(", ")) },
                best,
                worst
            ));
        }
        let auroc: Vec<String> = ood
            .iter()
            .map(|st| format!("`{st}` {:.3} vs {:.3}", get(&epk, st, Metric::AurocMsp), get(m, st, Metric::AurocMsp)))
            .collect();
        parts.push(format!("AUROC by max probability {}", auroc.join(", ")));
        line += &parts.join("; ");
        let _ = writeln!(s, "{line}.");
    }
    let var: Vec<String> = ood
        .iter()
        .map(|st| {
            let v = |m: &str| res.metric(m, st, Metric::AurocVariance).map_or("—".into(), |x| format!("{x:.3}"));
            format!("`{st}`: EPK-GP {}, NTK-GP {}, Laplace {}", v(&epk), v(&ntk), v(&laplace))
        })
        .collect();
    let _ = writeln!(s, "- **AUROC by the posterior logit variance**: {}.", var.join("; "));
    s
}

/// `timings.md`.
pub(crate) fn timings_markdown(r: &UqStudyReport) -> String {
    let mut s = String::new();
    let total: f64 = r.stages.iter().map(|t| t.seconds).sum();
    let _ = writeln!(s, "# Timings of `{}`\n", r.name);
    let _ = writeln!(
        s,
        "Wall-clock seconds of each stage when it was computed (stages reused from the cache `runs/{}/` keep the seconds recorded then, so a rerun with the cache rewrites this file unchanged; a run from an empty cache measures everything again). \
         Load = the machine's 1-minute load average before and after the stage (2 cores shared with other work).\n",
        r.name
    );
    let _ = writeln!(s, "| stage | method | seconds | load before → after |");
    let _ = writeln!(s, "|---|---|---|---|");
    for t in &r.stages {
        let _ = writeln!(s, "| {} | {} | {:.1} | {:.1} → {:.1} |", t.stage, t.method, t.seconds, t.load[0], t.load[1]);
    }
    let _ = writeln!(s, "| **all stages** | | **{:.1}** ({:.1} min) | |\n", total, total / 60.0);
    let _ = writeln!(s, "Per method (fit + predict in every setting; `shared` = selecting and training the network every method uses):\n");
    let _ = writeln!(s, "| method | seconds |");
    let _ = writeln!(s, "|---|---|");
    let mut by: Vec<(String, f64)> = Vec::new();
    for t in &r.stages {
        match by.iter_mut().find(|(m, _)| *m == t.method) {
            Some(e) => e.1 += t.seconds,
            None => by.push((t.method.clone(), t.seconds)),
        }
    }
    for (m, secs) in by {
        let _ = writeln!(s, "| {m} | {secs:.1} |");
    }
    s
}

/// The report's charts into `dir`.
pub fn charts(r: &UqStudyReport, settings: &[Setting], grid_images: usize, dir: &Path) -> Result<()> {
    io::create_dir_all(dir)?;
    let res = &r.results;
    // The protocol's methods and the two EPK function-space Laplace predictives fixed in advance
    // (δ by the evidence with the full curvature; validation temperature, class-diagonal).
    let present = res.methods();
    let mut lines = methods(r);
    lines.extend(ANGLE_FSL.iter().map(|(m, n)| (m.to_string(), n.to_string())).filter(|(m, _)| present.iter().any(|p| p == m)));
    let k = res.k;
    let find = |m: &str, st: &str| res.predictions.iter().find(|p| p.method == m && p.setting == st);
    // Reliability diagrams.
    let mut rel_settings = vec!["clean".to_string()];
    rel_settings.extend(reliability_shift(r));
    for st in &rel_settings {
        let Some(info) = res.settings.iter().find(|x| &x.name == st) else { continue };
        let Some(y) = &info.labels else { continue };
        let mut panels = Vec::new();
        for (m, n) in &lines {
            let Some(p) = find(m, st) else { continue };
            let bins = metrics::reliability(&p.probs, y, k, ECE_BINS)?;
            let mut edges: Vec<f64> = bins.iter().map(|b| b.lo).collect();
            edges.push(1.0);
            panels.push(ReliabilityPanel {
                title: format!("{n}: ECE {:.4}", res.metric(m, st, Metric::Ece).unwrap_or(f64::NAN)),
                edges,
                accuracy: bins.iter().map(|b| b.accuracy).collect(),
                confidence: bins.iter().map(|b| b.confidence).collect(),
                count: bins.iter().map(|b| b.count).collect(),
            });
        }
        Chart::reliability(&format!("Reliability diagrams, {}", setting_title(r, st)), &panels)?.save(&dir.join(format!("reliability_{st}.png")))?;
    }
    // The frontier: clean NLL against rot-60 NLL for every method, one series per family so
    // that the legend stays readable (the values of every method are in the tables).
    if res.settings.iter().any(|x| x.name == "rot-60") {
        let points: Vec<(String, f64, f64)> = res
            .methods()
            .into_iter()
            .filter_map(|m| Some((m.to_string(), res.metric(m, "clean", Metric::Nll)?, res.metric(m, "rot-60", Metric::Nll)?)))
            .collect();
        let families = frontier_families(&points);
        let series: Vec<Series> = families.into_iter().map(|(n, x, y)| Series::new(n, x, y)).collect();
        if !series.is_empty() {
            Chart::scatter("Clean NLL against rot-60 NLL, every method (lower left is better)", "clean NLL", "NLL at 60°", &series).draw()?.save(&dir.join("frontier.png"))?;
        }
    }
    // Metrics against the angle.
    let labelled: Vec<(f64, &str)> = res.settings.iter().filter(|x| x.kind != SettingKind::Ood).map(|x| (angle(&x.name).unwrap_or(0.0), x.name.as_str())).collect();
    for (metric, file, label) in [(Metric::Nll, "nll_vs_angle.png", "mean NLL"), (Metric::Ece, "ece_vs_angle.png", "ECE (15 bins)"), (Metric::Accuracy, "accuracy_vs_angle.png", "accuracy (fraction)")] {
        let series: Vec<Series> = lines
            .iter()
            .map(|(m, n)| Series::new(n.clone(), labelled.iter().map(|a| a.0).collect(), labelled.iter().map(|a| res.metric(m, a.1, metric).unwrap_or(f64::NAN)).collect()))
            .collect();
        Chart::line(&format!("{} under rotation (0° = clean test set)", metric_title(metric)), "rotation angle (degrees)", label, &series).draw()?.save(&dir.join(file))?;
    }
    // OOD AUROCs.
    let ood: Vec<&str> = res.settings.iter().filter(|x| x.kind == SettingKind::Ood).map(|x| x.name.as_str()).collect();
    if !ood.is_empty() {
        let mut groups = Vec::new();
        let mut cols: Vec<(String, Metric)> = Vec::new();
        for st in &ood {
            for (x, xn) in [(Metric::AurocMsp, "max prob."), (Metric::AurocVariance, "variance")] {
                groups.push(format!("{st}: {xn}"));
                cols.push((st.to_string(), x));
            }
        }
        let series: Vec<BarSeries> = lines
            .iter()
            .map(|(m, n)| BarSeries { label: n.clone(), values: cols.iter().map(|(st, x)| res.metric(m, st, *x).unwrap_or(f64::NAN)).collect() })
            .collect();
        Chart::grouped_bars("OOD detection: AUROC against the clean test set", "AUROC", &groups, &series, (0.0, 1.0))?.save(&dir.join("ood_auroc.png"))?;
    }
    // Disagreement grid.
    if let (Some(e), Some(mp), Some(clean)) = (find(&Method::Gp(GpKernel::Epk).to_string(), "clean"), find(&Method::Map.to_string(), "clean"), settings.iter().find(|x| x.info.name == "clean")) {
        let (ce, cm) = (metrics::max_prob(&e.probs, k)?, metrics::max_prob(&mp.probs, k)?);
        let mut idx: Vec<usize> = (0..ce.len()).collect();
        idx.sort_by(|&a, &b| (ce[b] - cm[b]).abs().total_cmp(&(ce[a] - cm[a]).abs()).then(a.cmp(&b)));
        let labels = clean.info.labels.as_deref().unwrap_or(&[]);
        let tiles: Vec<ImageTile> = idx
            .iter()
            .take(grid_images.min(idx.len()))
            .map(|&i| {
                let top = |p: &[f64]| metrics::argmax(&p[i * k..(i + 1) * k]);
                let (te, tm) = (top(&e.probs), top(&mp.probs));
                ImageTile {
                    pixels: clean.x[i * 784..(i + 1) * 784].to_vec(),
                    width: 28,
                    height: 28,
                    caption: vec![
                        format!("test #{i}, label {}", labels.get(i).map_or("?".into(), |l| l.to_string())),
                        format!("MAP: {tm} ({:.3})", cm[i]),
                        format!("EPK-GP: {te} ({:.3})", ce[i]),
                    ],
                }
            })
            .collect();
        if !tiles.is_empty() {
            Chart::image_grid("Clean test images where the EPK-GP and MAP top-label confidences differ most", &tiles, 8)?.save(&dir.join("disagreement.png"))?;
        }
    }
    Ok(())
}

fn metric_title(m: Metric) -> &'static str {
    match m {
        Metric::Accuracy => "Accuracy",
        Metric::Nll => "NLL",
        Metric::Brier => "Brier score",
        Metric::Ece => "ECE",
        Metric::AurocMsp => "AUROC (max probability)",
        Metric::AurocVariance => "AUROC (logit variance)",
    }
}

#[cfg(test)]
mod frontier_tests {
    use super::{frontier_families, frontier_family};

    #[test]
    fn frontier_families_group_methods_by_kernel_and_fit() {
        assert_eq!(frontier_family("map"), "MAP softmax");
        assert_eq!(frontier_family("laplace"), "last-layer Laplace");
        assert_eq!(frontier_family("epk-gp"), "kernel GPs (regression)");
        assert_eq!(frontier_family("window50-gp-netmean"), "kernel GPs (regression)");
        assert_eq!(frontier_family("fsl-epk-full"), "FSL epk: evidence δ");
        assert_eq!(frontier_family("fsl-epk-diag-mc"), "FSL epk: evidence δ");
        assert_eq!(frontier_family("fsl-window50-diag-grid"), "FSL window50: validation fit");
        assert_eq!(frontier_family("fsl-ntk-full-Ts"), "FSL ntk: validation fit");
        assert_eq!(frontier_family("fsl-ntk-kxk-diag"), "FSL ntk K×K: evidence δ");
        assert_eq!(frontier_family("fsl-ntk-kxk-full-grid"), "FSL ntk K×K: validation fit");
    }

    #[test]
    fn frontier_draws_the_baselines_over_the_fits_and_the_map_over_the_kernel_gps() {
        let p = |m: &str, a: f64| (m.to_string(), a, 10.0 * a);
        let points = [p("map", 0.5), p("temperature", 0.4), p("epk-gp", 0.52), p("fsl-epk-full", 0.6), p("epk-gp-netmean", 0.5), p("fsl-epk-full-mc", 0.7)];
        let f = frontier_families(&points);
        let names: Vec<&str> = f.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(names, ["kernel GPs (regression)", "FSL epk: evidence δ", "MAP softmax", "temperature scaling"]);
        assert_eq!((f[0].1.as_slice(), f[0].2.as_slice()), ([0.52, 0.5].as_slice(), [5.2, 5.0].as_slice()));
        assert_eq!(f[1].1, [0.6, 0.7]);
    }
}
