//! The benchmark's results: per-point probabilities of every method in every setting, and the
//! metrics computed from them, as values and as parquet tables.
//!
//! Files written by [`UqResults::write`] (all atomically):
//! - `predictions.parquet`, one row per (method, setting, point): `method` (str), `setting`
//!   (str), `point` (i64, the row in that setting), `label` (i64; −1 in OOD settings), `p0` …
//!   `p{K−1}` (f64, the predicted probabilities), `ood_score` (f64, the method's variance score,
//!   larger = more OOD; NaN when the method has none);
//! - `metrics.parquet`, one row per (method, setting, metric): `method`, `setting`, `metric`
//!   (str: `accuracy`, `nll`, `brier`, `ece`, `auroc_msp`, `auroc_variance`), `value` (f64), `n`
//!   (i64, points in the setting). Labelled settings get the first four; OOD settings the AUROCs
//!   of that setting against the method's `clean` points (`auroc_variance` only for methods with
//!   a variance score);
//! - `uq.json`: the fitted temperature, the Laplace prior precision and evidence, the settings
//!   and the benchmark configuration.
//!
//! `scripts/check_uncertainty_metrics.py` recomputes `metrics.parquet` from
//! `predictions.parquet` with numpy.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::io::{self, Column, Table};

use super::metrics::{self, ScoreDirection};
use super::temperature::TemperatureFit;

/// What a setting is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SettingKind {
    /// The unchanged test set (the in-distribution reference for the OOD AUROCs).
    Clean,
    /// The test set under a labelled shift (a rotation).
    Shifted,
    /// Out-of-distribution inputs without labels (noise, inverted images).
    Ood,
}

/// A setting's name, kind, size and labels (its inputs are not kept).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SettingInfo {
    /// e.g. `clean`, `rot-45`, `noise`, `inverted`.
    pub name: String,
    /// Clean, shifted or OOD.
    pub kind: SettingKind,
    /// Points N.
    pub n: usize,
    /// Labels `[N]` (`None` for OOD settings).
    pub labels: Option<Vec<usize>>,
}

/// One method's predictions in one setting.
#[derive(Clone, Debug, PartialEq)]
pub struct MethodPrediction {
    /// Method name, e.g. `map`, `temperature`, `laplace`, `ensemble`, `epk-gp`.
    pub method: String,
    /// Setting name.
    pub setting: String,
    /// Predicted probabilities. # Shapes `[N, K]`.
    pub probs: Vec<f64>,
    /// A variance OOD score, larger = more OOD (`None` when the method has none). # Shapes `[N]`.
    pub ood_score: Option<Vec<f64>>,
}

/// A metric of the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// [`metrics::accuracy`].
    Accuracy,
    /// [`metrics::nll`].
    Nll,
    /// [`metrics::brier`].
    Brier,
    /// [`metrics::ece`], 15 bins.
    Ece,
    /// OOD AUROC of the maximum softmax probability (higher = in-distribution) against `clean`.
    AurocMsp,
    /// OOD AUROC of the variance score (higher = OOD) against `clean`.
    AurocVariance,
}

impl Metric {
    /// The name used in tables.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::Nll => "nll",
            Metric::Brier => "brier",
            Metric::Ece => "ece",
            Metric::AurocMsp => "auroc_msp",
            Metric::AurocVariance => "auroc_variance",
        }
    }
    /// All metrics, in table order.
    pub const ALL: [Metric; 6] = [Metric::Accuracy, Metric::Nll, Metric::Brier, Metric::Ece, Metric::AurocMsp, Metric::AurocVariance];
}

/// One metric of one method in one setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricValue {
    /// Method name.
    pub method: String,
    /// Setting name.
    pub setting: String,
    /// Which metric.
    pub metric: Metric,
    /// Its value.
    pub value: f64,
    /// Points in the setting.
    pub n: usize,
}

/// The Laplace fit's numbers, for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaplaceSummary {
    /// The prior precision λ.
    pub prior_precision: f64,
    /// The Laplace evidence at λ.
    pub log_marginal_likelihood: f64,
    /// `log p(D | θ*)`.
    pub log_likelihood: f64,
    /// Last-layer parameters D.
    pub num_params: usize,
    /// GGN eigenvalues that were negative from rounding and set to 0, and the most negative.
    pub clamped_eigenvalues: (usize, f64),
    /// Monte-Carlo samples per point and their seed.
    pub mc_samples: usize,
    /// The Monte-Carlo seed.
    pub mc_seed: u64,
    /// The search grid `[log₁₀ λ, evidence]`.
    pub grid: Vec<[f64; 2]>,
}

/// Everything the benchmark produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UqResults {
    /// Classes K.
    pub k: usize,
    /// The settings, in order (first `clean`).
    pub settings: Vec<SettingInfo>,
    /// Every method's predictions in every setting.
    #[serde(skip)]
    pub predictions: Vec<MethodPrediction>,
    /// The metrics computed from `predictions`.
    pub metrics: Vec<MetricValue>,
    /// The temperature fit (`None` when the benchmark was scored without one).
    pub temperature: Option<TemperatureFit>,
    /// The Laplace fit (`None` when the benchmark was scored without one).
    pub laplace: Option<LaplaceSummary>,
    /// The benchmark configuration, as JSON.
    pub config: serde_json::Value,
}

/// Scores predictions: labelled metrics in `Clean`/`Shifted` settings, OOD AUROCs against the
/// same method's `Clean` setting in `Ood` settings (the variance AUROC only where both have a
/// score). Checks that every prediction names a known setting, has its shape, and that each
/// method has exactly one prediction per setting.
///
/// # Shapes
/// Each prediction's `probs` is `[N_s, K]` and `ood_score` `[N_s]` for its setting's `N_s`.
pub fn score(k: usize, settings: &[SettingInfo], predictions: &[MethodPrediction]) -> Result<Vec<MetricValue>> {
    let clean: Vec<&SettingInfo> = settings.iter().filter(|s| s.kind == SettingKind::Clean).collect();
    if clean.len() != 1 {
        return Err(Error::Config(format!("the benchmark needs exactly one clean setting, got {}", clean.len())));
    }
    let clean = clean[0];
    let mut methods: Vec<&str> = Vec::new();
    for p in predictions {
        if !methods.contains(&p.method.as_str()) {
            methods.push(&p.method);
        }
    }
    let find = |m: &str, s: &str| -> Result<&MethodPrediction> {
        let mut it = predictions.iter().filter(|p| p.method == m && p.setting == s);
        let first = it.next().ok_or_else(|| Error::Data(format!("method {m} has no predictions for setting {s}")))?;
        if it.next().is_some() {
            return Err(Error::Data(format!("method {m} has two predictions for setting {s}")));
        }
        Ok(first)
    };
    for p in predictions {
        let s = settings
            .iter()
            .find(|s| s.name == p.setting)
            .ok_or_else(|| Error::Data(format!("method {}: unknown setting {}", p.method, p.setting)))?;
        if p.probs.len() != s.n * k {
            return Err(Error::ShapeMismatch { what: format!("{} / {} probabilities [N, K]", p.method, p.setting), expected: vec![s.n, k], got: vec![p.probs.len()] });
        }
        if let Some(sc) = &p.ood_score {
            if sc.len() != s.n {
                return Err(Error::ShapeMismatch { what: format!("{} / {} OOD score [N]", p.method, p.setting), expected: vec![s.n], got: vec![sc.len()] });
            }
        }
    }
    let mut out = Vec::new();
    for m in &methods {
        let reference = find(m, &clean.name)?;
        for s in settings {
            let p = find(m, &s.name)?;
            let ctx = |e: Error| Error::Data(format!("{m} / {}: {e}", s.name));
            let mut push = |metric: Metric, value: f64| out.push(MetricValue { method: m.to_string(), setting: s.name.clone(), metric, value, n: s.n });
            match (&s.kind, &s.labels) {
                (SettingKind::Clean | SettingKind::Shifted, Some(y)) => {
                    let c = metrics::classification_metrics(&p.probs, y, k).map_err(ctx)?;
                    push(Metric::Accuracy, c.accuracy);
                    push(Metric::Nll, c.nll);
                    push(Metric::Brier, c.brier);
                    push(Metric::Ece, c.ece);
                }
                (SettingKind::Ood, _) => {
                    let msp_in = metrics::max_prob(&reference.probs, k).map_err(ctx)?;
                    let msp_out = metrics::max_prob(&p.probs, k).map_err(ctx)?;
                    push(Metric::AurocMsp, metrics::ood_auroc(&msp_in, &msp_out, ScoreDirection::HigherIsInDistribution).map_err(ctx)?);
                    if let (Some(a), Some(b)) = (&reference.ood_score, &p.ood_score) {
                        push(Metric::AurocVariance, metrics::ood_auroc(a, b, ScoreDirection::HigherIsOod).map_err(ctx)?);
                    }
                }
                (_, None) => return Err(Error::Data(format!("setting {} is labelled ({:?}) but has no labels", s.name, s.kind))),
            }
        }
    }
    Ok(out)
}

impl UqResults {
    /// The value of `metric` for `method` in `setting`, if computed.
    pub fn metric(&self, method: &str, setting: &str, metric: Metric) -> Option<f64> {
        self.metrics.iter().find(|v| v.method == method && v.setting == setting && v.metric == metric).map(|v| v.value)
    }

    /// The method names, in order of first appearance.
    pub fn methods(&self) -> Vec<&str> {
        let mut m: Vec<&str> = Vec::new();
        for p in &self.predictions {
            if !m.contains(&p.method.as_str()) {
                m.push(&p.method);
            }
        }
        m
    }

    /// The per-point predictions as a long table (columns in the module docs).
    pub(crate) fn predictions_table(&self) -> Table {
        let k = self.k;
        let rows: usize = self.predictions.iter().map(|p| p.probs.len() / k.max(1)).sum();
        let (mut method, mut setting, mut point, mut label, mut score) =
            (Vec::with_capacity(rows), Vec::with_capacity(rows), Vec::with_capacity(rows), Vec::with_capacity(rows), Vec::with_capacity(rows));
        let mut probs: Vec<Vec<f64>> = vec![Vec::with_capacity(rows); k];
        for p in &self.predictions {
            let info = self.settings.iter().find(|s| s.name == p.setting);
            let n = p.probs.len() / k.max(1);
            for i in 0..n {
                method.push(p.method.clone());
                setting.push(p.setting.clone());
                point.push(i as i64);
                label.push(info.and_then(|s| s.labels.as_ref()).map_or(-1, |y| y[i] as i64));
                score.push(p.ood_score.as_ref().map_or(f64::NAN, |s| s[i]));
                for c in 0..k {
                    probs[c].push(p.probs[i * k + c]);
                }
            }
        }
        let mut t = Table::new()
            .with("method", Column::Str(method))
            .with("setting", Column::Str(setting))
            .with("point", Column::I64(point))
            .with("label", Column::I64(label));
        for (c, col) in probs.into_iter().enumerate() {
            t = t.with(&format!("p{c}"), Column::F64(col));
        }
        t.with("ood_score", Column::F64(score))
    }

    /// The metrics as a long table (columns in the module docs).
    pub(crate) fn metrics_table(&self) -> Table {
        Table::new()
            .with("method", Column::Str(self.metrics.iter().map(|v| v.method.clone()).collect()))
            .with("setting", Column::Str(self.metrics.iter().map(|v| v.setting.clone()).collect()))
            .with("metric", Column::Str(self.metrics.iter().map(|v| v.metric.name().to_string()).collect()))
            .with("value", Column::F64(self.metrics.iter().map(|v| v.value).collect()))
            .with("n", Column::I64(self.metrics.iter().map(|v| v.n as i64).collect()))
    }

    /// Writes `predictions.parquet`, `metrics.parquet` and `uq.json` into `dir` (created if
    /// needed; each file atomically).
    pub fn write(&self, dir: &Path) -> Result<()> {
        io::create_dir_all(dir)?;
        self.predictions_table().write_parquet(&dir.join("predictions.parquet"))?;
        self.metrics_table().write_parquet(&dir.join("metrics.parquet"))?;
        io::write_json(&dir.join("uq.json"), self)
    }

    /// One row per (method, setting) with every metric, as an HTML table for evcxr notebooks.
    pub fn evcxr_display(&self) {
        let mut s = String::from("EVCXR_BEGIN_CONTENT text/html\n<table><tr><th>method</th><th>setting</th>");
        for m in Metric::ALL {
            s += &format!("<th>{}</th>", m.name());
        }
        s += "</tr>";
        for (method, setting) in self.rows() {
            s += &format!("<tr><td>{method}</td><td>{setting}</td>");
            for m in Metric::ALL {
                s += &format!("<td>{}</td>", self.metric(method, setting, m).map_or("—".into(), |v| format!("{v:.4}")));
            }
            s += "</tr>";
        }
        s += "</table>\nEVCXR_END_CONTENT";
        println!("{s}");
    }

    fn rows(&self) -> Vec<(&str, &str)> {
        let mut rows = Vec::new();
        for m in self.methods() {
            for s in &self.settings {
                rows.push((m, s.name.as_str()));
            }
        }
        rows
    }
}

impl fmt::Display for UqResults {
    /// A markdown table: one row per (method, setting), one column per metric.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(t) = &self.temperature {
            writeln!(f, "temperature T = {:.4} (validation NLL {:.4} -> {:.4})", t.temperature, t.nll_before, t.nll_after)?;
        }
        if let Some(l) = &self.laplace {
            writeln!(f, "last-layer Laplace: prior precision {:.4e}, log evidence {:.4}, {} parameters", l.prior_precision, l.log_marginal_likelihood, l.num_params)?;
        }
        write!(f, "| method | setting |")?;
        for m in Metric::ALL {
            write!(f, " {} |", m.name())?;
        }
        writeln!(f)?;
        writeln!(f, "|---|---|{}", "---|".repeat(Metric::ALL.len()))?;
        for (method, setting) in self.rows() {
            write!(f, "| {method} | {setting} |")?;
            for m in Metric::ALL {
                match self.metric(method, setting, m) {
                    Some(v) => write!(f, " {v:.4} |")?,
                    None => write!(f, " — |")?,
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> (Vec<SettingInfo>, Vec<MethodPrediction>) {
        let settings = vec![
            SettingInfo { name: "clean".into(), kind: SettingKind::Clean, n: 2, labels: Some(vec![0, 1]) },
            SettingInfo { name: "rot".into(), kind: SettingKind::Shifted, n: 2, labels: Some(vec![1, 1]) },
            SettingInfo { name: "noise".into(), kind: SettingKind::Ood, n: 3, labels: None },
        ];
        let pred = |m: &str, s: &str, probs: Vec<f64>, score: Option<Vec<f64>>| MethodPrediction { method: m.into(), setting: s.into(), probs, ood_score: score };
        let preds = vec![
            pred("a", "clean", vec![0.9, 0.1, 0.2, 0.8], Some(vec![0.1, 0.2])),
            pred("a", "rot", vec![0.6, 0.4, 0.3, 0.7], Some(vec![0.3, 0.3])),
            pred("a", "noise", vec![0.5, 0.5, 0.85, 0.15, 0.6, 0.4], Some(vec![0.15, 1.0, 2.0])),
            pred("b", "clean", vec![1.0, 0.0, 0.5, 0.5], None),
            pred("b", "rot", vec![0.5, 0.5, 0.5, 0.5], None),
            pred("b", "noise", vec![0.5, 0.5, 0.5, 0.5, 0.5, 0.5], None),
        ];
        (settings, preds)
    }

    #[test]
    fn scores_by_hand() {
        let (settings, preds) = toy();
        let m = score(2, &settings, &preds).unwrap();
        let get = |me: &str, s: &str, x: Metric| m.iter().find(|v| v.method == me && v.setting == s && v.metric == x).map(|v| v.value);
        assert_eq!(get("a", "clean", Metric::Accuracy), Some(1.0));
        assert_eq!(get("a", "rot", Metric::Accuracy), Some(0.5));
        assert!((get("a", "clean", Metric::Nll).unwrap() - -(0.9f64.ln() + 0.8f64.ln()) / 2.0).abs() < 1e-15);
        // MSP in = [0.9, 0.8], out = [0.5, 0.85, 0.6]: in > out in 5 of 6 pairs.
        assert_eq!(get("a", "noise", Metric::AurocMsp), Some(5.0 / 6.0));
        // Variance in = [0.1, 0.2], out = [0.15, 1, 2]: out > in in 5 of 6 pairs.
        assert_eq!(get("a", "noise", Metric::AurocVariance), Some(5.0 / 6.0));
        assert_eq!(get("a", "noise", Metric::Accuracy), None);
        assert_eq!(get("a", "clean", Metric::AurocMsp), None);
        // Method b: no variance score; a tie on the clean point counts for class 0, so point 1
        // (label 1) is wrong. MSP in = [1, 0.5], out = [0.5; 3]: 3 wins + 3 ties of 6 → 0.75.
        assert_eq!(get("b", "clean", Metric::Accuracy), Some(0.5));
        assert_eq!(get("b", "noise", Metric::AurocVariance), None);
        assert_eq!(get("b", "noise", Metric::AurocMsp), Some(0.75));
        assert_eq!(get("b", "clean", Metric::Nll), Some(-(0.5f64.ln()) / 2.0));
        assert_eq!(m.len(), 2 * (4 + 4 + 2) - 1);
    }

    #[test]
    fn score_rejects_inconsistent_inputs() {
        let (settings, preds) = toy();
        let mut p = preds.clone();
        p.pop();
        assert!(score(2, &settings, &p).unwrap_err().to_string().contains("no predictions for setting noise"));
        let mut p = preds.clone();
        p.push(p[0].clone());
        assert!(score(2, &settings, &p).unwrap_err().to_string().contains("two predictions"));
        let mut p = preds.clone();
        p[1].probs.pop();
        assert!(score(2, &settings, &p).is_err());
        let mut p = preds.clone();
        p[2].ood_score = Some(vec![1.0]);
        assert!(score(2, &settings, &p).is_err());
        let mut p = preds.clone();
        p[1].probs[0] = f64::NAN;
        assert!(score(2, &settings, &p).unwrap_err().to_string().contains("a / rot"));
        let mut p = preds.clone();
        p[2].ood_score = Some(vec![f64::NAN, 1.0, 1.0]);
        assert!(score(2, &settings, &p).unwrap_err().to_string().contains("NaN"));
        let mut p = preds;
        p[0].setting = "other".into();
        assert!(score(2, &settings, &p).is_err());
        let mut s = settings.clone();
        s[0].kind = SettingKind::Shifted;
        assert!(score(2, &s, &toy().1).is_err());
    }

    #[test]
    fn tables_and_files_round_trip() {
        let (settings, preds) = toy();
        let metrics = score(2, &settings, &preds).unwrap();
        let r = UqResults { k: 2, settings, predictions: preds, metrics, temperature: None, laplace: None, config: serde_json::json!({}) };
        let dir = tempfile::tempdir().unwrap();
        r.write(dir.path()).unwrap();
        let t = Table::read_parquet(&dir.path().join("predictions.parquet")).unwrap();
        assert_eq!(t.rows(), 2 * (2 + 2 + 3));
        assert_eq!(t.f64("p1").unwrap()[..2], [0.1, 0.8]);
        assert_eq!(t.i64("label").unwrap()[..7], [0, 1, 1, 1, -1, -1, -1]);
        assert!(t.f64("ood_score").unwrap()[7].is_nan());
        let m = Table::read_parquet(&dir.path().join("metrics.parquet")).unwrap();
        assert_eq!(m.rows(), r.metrics.len());
        assert_eq!(m.f64("value").unwrap(), r.metrics.iter().map(|v| v.value).collect::<Vec<_>>());
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("uq.json")).unwrap()).unwrap();
        assert_eq!(json["metrics"].as_array().unwrap().len(), r.metrics.len());
        assert_eq!(json["metrics"][0]["metric"], "accuracy");
        let text = r.to_string();
        assert!(text.contains("| a | noise | — | — | — | — | 0.8333 | 0.8333 |"), "{text}");
        assert_eq!(r.methods(), vec!["a", "b"]);
    }
}
