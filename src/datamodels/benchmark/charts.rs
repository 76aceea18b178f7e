//! The benchmark's charts ([`write_charts`]): LDS per method, each regression's ridge sweep, the
//! window ablation and the noisy-label AUCs, drawn from a [`BenchmarkResult`] alone.

use std::path::Path;

use super::{BenchmarkResult, MethodResult, SweepPoint};
use crate::error::Result;
use crate::plot::{BarSeries, Chart, Series};

/// Writes the benchmark's charts into `dir` (created if missing):
/// - `lds.png`: each method's mean LDS on the evaluation subsets, against the retrained
///   log-probability and the retrained logit margin;
/// - `lds_ridge.png`: each method that has a ridge or damping (but `window-rep`), its
///   evaluation LDS against it at its chosen projection d, the setting chosen on the tuning
///   subsets marked;
/// - `lds_window.png` (when `window-rep` ran): the evaluation LDS of the regression on the DPK of
///   the last L steps (λ chosen per L on the tuning subsets; L = all steps is `dpk-rep`), with
///   the final NTK's regression and the best method as levels;
/// - `noisy_auc.png` (when noisy-label detection ran): each method's AUC.
///
/// Returns each chart written: its file name and what it shows.
///
/// # Errors
/// [`crate::Error::Data`] when `r` has no method; [`crate::Error::Io`] when a file cannot be
/// written.
pub fn write_charts(r: &BenchmarkResult, dir: &Path) -> Result<Vec<(&'static str, String)>> {
    crate::io::create_dir_all(dir)?;
    let mut written = Vec::new();
    let (_, p, _) = r.shape;
    let eval = r.subsets.members.len() - r.subsets.tuning;
    let names: Vec<String> = r.methods.iter().map(|m| m.method.clone()).collect();
    let bars = [
        BarSeries { label: "log p".into(), values: r.methods.iter().map(|m| m.lds.mean).collect() },
        BarSeries { label: "logit margin".into(), values: r.methods.iter().map(|m| m.lds_margin.mean).collect() },
    ];
    let title = format!("LDS on {eval} evaluation subsets, mean over {p} test points");
    Chart::grouped_bars(&title, "LDS (Spearman)", &names, &bars, (0.0, 1.0))?.save(&dir.join("lds.png"))?;
    written.push(("lds.png", "each method's mean LDS on the evaluation subsets, against the retrained log p and logit margin (the intervals are in the table)".to_string()));

    let ridge = ridge_curves(&r.methods);
    if !ridge.is_empty() {
        Chart::line("LDS against the relative ridge or damping (evaluation subsets)", "relative ridge λ", "LDS (Spearman)", &ridge).log_x().draw()?.save(&dir.join("lds_ridge.png"))?;
        written.push(("lds_ridge.png", "the evaluation LDS against the relative ridge or damping, each method at its chosen d (the window ablation has its own chart), the settings chosen on the tuning subsets marked".to_string()));
    }

    if let Some(w) = r.methods.iter().find(|m| m.method == "window-rep") {
        let mut windows: Vec<f64> = w.sweep.iter().filter_map(|s| token(&s.setting, "L=")).collect();
        windows.sort_by(f64::total_cmp);
        windows.dedup();
        // Per L, the evaluation LDS at the ridge with the best tuning LDS.
        let mut x = Vec::new();
        let mut y = Vec::new();
        for &l in &windows {
            if let Some(s) = w.sweep.iter().filter(|s| token(&s.setting, "L=") == Some(l)).max_by(|a, b| a.tune.total_cmp(&b.tune)) {
                x.push(l);
                y.push(s.eval);
            }
        }
        if let Some(d) = method(r, "dpk-rep") {
            x.push(r.steps as f64);
            y.push(d.lds.mean);
        }
        let span = [1.0, r.steps as f64];
        let mut series = vec![Series::new("DPK of the last L steps (λ per L)", x, y)];
        if let Some(e) = method(r, "epk-rep") {
            series.push(Series::new("EPK, all steps (epk-rep)", vec![r.steps as f64], vec![e.lds.mean]));
        }
        if let Some(n) = method(r, "ntk-rep") {
            series.push(Series::new("final NTK (ntk-rep)", span.to_vec(), vec![n.lds.mean; 2]));
        }
        if let Some(b) = r.methods.iter().max_by(|a, b| a.lds.mean.total_cmp(&b.lds.mean)) {
            series.push(Series::new(format!("best method ({})", b.method), span.to_vec(), vec![b.lds.mean; 2]));
        }
        Chart::line("Kernel regression on the path kernel of the last L training steps", "L (steps, ending at the last)", "LDS (Spearman)", &series)
            .log_x()
            .draw()?
            .save(&dir.join("lds_window.png"))?;
        written.push(("lds_window.png", "the window ablation, the regression on the DPK of the last L steps against L, with the final NTK's regression and the best method as levels".to_string()));
    }

    if !r.noisy.is_empty() {
        let names: Vec<String> = r.noisy.iter().map(|n| n.method.clone()).collect();
        let bars = [BarSeries { label: "AUC".into(), values: r.noisy.iter().map(|n| n.auc).collect() }];
        let title = format!("Noisy-label detection by self-attribution ({} % flipped)", fmt_pct(r.spec.noise_fraction));
        Chart::grouped_bars(&title, "AUC", &names, &bars, (0.5, 1.0))?.save(&dir.join("noisy_auc.png"))?;
        written.push(("noisy_auc.png", "each method's noisy-label detection AUC".to_string()));
    }
    Ok(written)
}

/// The ridge sweeps: per method with a ridge or damping (but `window-rep`), its evaluation LDS
/// against the ridge at its chosen other settings (e.g. `d=2048`), sorted by ridge; then one
/// series of the chosen settings' points, separated by NaN so that they are drawn as markers.
/// Empty when no method has a ridge.
fn ridge_curves(methods: &[MethodResult]) -> Vec<Series> {
    let mut ridge: Vec<Series> = Vec::new();
    let mut chosen = Series::new("chosen on the tuning subsets", Vec::new(), Vec::new());
    // `window-rep` has its own chart (at L = 1 it all but covers `ntk-rep` here).
    for m in methods.iter().filter(|m| m.method != "window-rep") {
        let key = fixed_settings(&m.chosen);
        let mut pts: Vec<&SweepPoint> = m.sweep.iter().filter(|s| s.ridge.is_some() && fixed_settings(&s.setting) == key).collect();
        if pts.is_empty() {
            continue;
        }
        pts.sort_by(|a, b| a.ridge.partial_cmp(&b.ridge).unwrap_or(std::cmp::Ordering::Equal));
        let label = if key.is_empty() { m.method.clone() } else { format!("{} ({key})", m.method) };
        ridge.push(Series::new(label, pts.iter().map(|s| s.ridge.unwrap_or(f64::NAN)).collect(), pts.iter().map(|s| s.eval).collect()));
        if let Some(c) = pts.iter().find(|s| s.setting == m.chosen) {
            // Isolated points (a NaN between them) are drawn as markers, not joined.
            chosen.x.extend([c.ridge.unwrap_or(f64::NAN), f64::NAN]);
            chosen.y.extend([c.eval, f64::NAN]);
        }
    }
    if !ridge.is_empty() && !chosen.x.is_empty() {
        ridge.push(chosen);
    }
    ridge
}

/// A fraction as a percentage without trailing zeros: 0.1 → `10`, 0.125 → `12.5`.
fn fmt_pct(fraction: f64) -> String {
    let s = format!("{:.2}", fraction * 100.0);
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The method named `name`, if it ran.
fn method<'a>(r: &'a BenchmarkResult, name: &str) -> Option<&'a MethodResult> {
    r.methods.iter().find(|m| m.method == name)
}

/// A setting's `key=value` tokens other than the ridge (`λ=`), e.g. `d=512 λ=1e-3` → `d=512`;
/// notes in parentheses are left out.
fn fixed_settings(setting: &str) -> String {
    setting.split(" (").next().unwrap_or("").split_whitespace().filter(|t| t.contains('=') && !t.starts_with("λ=")).collect::<Vec<_>>().join(" ")
}

/// The number after `prefix` in a setting, e.g. `L=50 λ=1e-1` with `L=` → 50.
fn token(setting: &str, prefix: &str) -> Option<f64> {
    setting.split_whitespace().find_map(|t| t.strip_prefix(prefix)).and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_split_into_fixed_part_and_tokens() {
        assert_eq!(fixed_settings("d=512 λ=1e-3"), "d=512");
        assert_eq!(fixed_settings("λ=1e1 (n_z 13026 of 17767)"), "");
        assert_eq!(fixed_settings("L=1 λ=1e-1"), "L=1");
        assert_eq!(fixed_settings("-"), "");
        assert_eq!(token("L=50 λ=1e-1", "L="), Some(50.0));
        assert_eq!(token("λ=1e-1", "L="), None);
        assert_eq!((fmt_pct(0.1).as_str(), fmt_pct(0.125).as_str(), fmt_pct(0.25).as_str()), ("10", "12.5", "25"));
    }

    fn point(method: &str, setting: &str, dim: Option<usize>, ridge: Option<f64>, eval: f64) -> SweepPoint {
        SweepPoint { method: method.into(), setting: setting.into(), dim, ridge, tune: eval, eval, eval_margin: eval }
    }

    fn result(method: &str, chosen: &str, sweep: Vec<SweepPoint>) -> MethodResult {
        let i = crate::attribution::lds::Interval { mean: 0.5, lo: 0.4, hi: 0.6 };
        MethodResult { method: method.into(), models: 1, chosen: chosen.into(), tune: 0.5, lds: i, lds_margin: i, seconds: 0.0, sweep, tau: Vec::new() }
    }

    #[test]
    fn ridge_curves_follow_the_chosen_projection_and_mark_the_choice() {
        let methods = vec![
            result("epk", "-", vec![point("epk", "-", None, None, 0.2)]),
            result(
                "trak-1",
                "d=512 λ=1e0",
                vec![
                    point("trak-1", "d=256 λ=1e0", Some(256), Some(1.0), 0.9),
                    point("trak-1", "d=512 λ=1e1", Some(512), Some(10.0), 0.3),
                    point("trak-1", "d=512 λ=1e0", Some(512), Some(1.0), 0.6),
                ],
            ),
            result("if-ggn", "λ=1e1 (n_z 5 of 9)", vec![point("if-ggn", "λ=1e0 (n_z 7 of 9)", None, Some(1.0), 0.4), point("if-ggn", "λ=1e1 (n_z 5 of 9)", None, Some(10.0), 0.7)]),
            result("window-rep", "L=1 λ=1e0", vec![point("window-rep", "L=1 λ=1e0", None, Some(1.0), 0.6)]),
        ];
        let s = ridge_curves(&methods);
        let labels: Vec<&str> = s.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["trak-1 (d=512)", "if-ggn", "chosen on the tuning subsets"]);
        assert_eq!((s[0].x.clone(), s[0].y.clone()), (vec![1.0, 10.0], vec![0.6, 0.3]), "d=256 is left out, sorted by ridge");
        assert_eq!(s[1].y, [0.4, 0.7]);
        let marks: Vec<(f64, f64)> = s[2].x.iter().zip(&s[2].y).filter(|(x, _)| x.is_finite()).map(|(x, y)| (*x, *y)).collect();
        assert_eq!(marks, [(1.0, 0.6), (10.0, 0.7)]);
        assert!(s[2].x.iter().skip(1).step_by(2).all(|x| x.is_nan()), "the marks are separated");
        assert!(ridge_curves(&methods[..1]).is_empty());
    }
}
