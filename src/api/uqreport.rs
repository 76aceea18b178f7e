//! [`UqReport`]: an uncertainty benchmark report on disk (`predictions.parquet` and
//! `metrics.parquet` of [`UqResults::write`], e.g. `reports/mnist-uncertainty/`) opened for a
//! notebook: its metrics as tables ([`MetricTable`]), the best method of a family by a metric,
//! and its charts drawn from the per-point predictions (reliability diagrams, a metric against
//! the rotation angle) as inline [`Chart`]s.
//!
//! [`UqReport`] has an example.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::{Column, Table};
use crate::plot::{Chart, ReliabilityPanel, Series};
use crate::uncertainty::metrics::{self, ECE_BINS};
use crate::uncertainty::report::{self, MethodPrediction, Metric, MetricValue, SettingInfo, SettingKind, UqResults};

/// An uncertainty benchmark report read back from its directory.
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let uq = UqReport::open("reports/mnist-uncertainty")?;  // the committed MNIST benchmark
/// println!("{uq}");                                        // settings, methods, the rescoring
/// assert_eq!(uq.rescore_max_diff(), 0.0);                  // metrics.parquet = the predictions' scores
/// let best = uq.best("fsl-", "rot-60", Metric::Nll)?;      // lowest rot-60 NLL of the fsl-* methods
/// let methods = ["map".to_string(), "temperature".into(), "laplace".into(), best];
/// let nll = uq.table(&methods, Metric::Nll)?;              // a MetricTable: methods × settings
/// println!("{nll}");
/// assert_eq!(nll.get("map", "clean"), uq.metric("map", "clean", Metric::Nll));
/// let rel = uq.reliability("clean", &methods)?;           // one panel per method
/// let curve = uq.vs_angle(Metric::Nll, &methods)?;        // one line per method
/// assert!(rel.png().starts_with(b"\x89PNG") && curve.width() > 0);
/// # Ok(()) }
/// ```
///
/// The settings come from `predictions.parquet`: their order is that of the file (the first
/// method's rows), `clean` is the clean setting, a setting whose labels are all −1 is
/// out-of-distribution, every other one is shifted (`rot-{angle}` for a rotation). The
/// metrics are those of `metrics.parquet`; [`UqReport::open`] also recomputes them from the
/// predictions with the benchmark's scoring ([`report::score`]) and keeps the largest
/// difference ([`UqReport::rescore_max_diff`]).
#[derive(Clone, Debug)]
pub struct UqReport {
    dir: PathBuf,
    results: UqResults,
    rescore_max_diff: f64,
}

impl UqReport {
    /// Reads `dir/predictions.parquet` and `dir/metrics.parquet` (columns in
    /// [`crate::uncertainty::report`]) and rescores the predictions.
    ///
    /// # Shapes
    /// `predictions.parquet`: one row per (method, setting, point) with `p0 … p{K−1}`;
    /// `metrics.parquet`: one row per (method, setting, metric).
    ///
    /// Errors: a missing or unreadable file or column, points of a (method, setting) that are
    /// not numbered 0, 1, …, a method whose points or labels differ from the first method's in a
    /// setting, a metric name the benchmark does not know, and every error of
    /// [`report::score`] (probabilities that are not distributions, a method missing a setting).
    pub fn open(dir: impl AsRef<Path>) -> Result<UqReport> {
        let dir = dir.as_ref().to_path_buf();
        let (k, settings, predictions) = read_predictions(&dir.join("predictions.parquet"))?;
        let metrics = read_metrics(&dir.join("metrics.parquet"))?;
        let rescored = report::score(k, &settings, &predictions)?;
        let rescore_max_diff = if rescored.len() != metrics.len() {
            f64::INFINITY
        } else {
            rescored.iter().fold(0.0, |worst: f64, r| {
                let stored = metrics.iter().find(|m| m.method == r.method && m.setting == r.setting && m.metric == r.metric);
                let d = stored.map_or(f64::INFINITY, |m| if m.value == r.value { 0.0 } else { (m.value - r.value).abs() });
                crate::kernel::nan_max(worst, if d.is_nan() { f64::INFINITY } else { d })
            })
        };
        let results = UqResults { k, settings, predictions, metrics, temperature: None, laplace: None, config: serde_json::Value::Null };
        Ok(UqReport { dir, results, rescore_max_diff })
    }

    /// The report directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Classes K.
    pub fn classes(&self) -> usize {
        self.results.k
    }
    /// The settings in report order (names, kinds, sizes, labels).
    pub fn settings(&self) -> &[SettingInfo] {
        &self.results.settings
    }
    /// The method names in report order.
    pub fn methods(&self) -> Vec<String> {
        self.results.methods().into_iter().map(String::from).collect()
    }
    /// The stored value of `metric` for `method` in `setting` (from `metrics.parquet`).
    pub fn metric(&self, method: &str, setting: &str, metric: Metric) -> Option<f64> {
        self.results.metric(method, setting, metric)
    }
    /// `method`'s predicted probabilities in `setting`. # Shapes `[N, K]`.
    pub fn probs(&self, method: &str, setting: &str) -> Option<&[f64]> {
        self.prediction(method, setting).map(|p| p.probs.as_slice())
    }
    /// The largest |stored − recomputed| over every metric (0 when `metrics.parquet` is exactly
    /// what the predictions score; ∞ when a metric is missing on one side).
    pub fn rescore_max_diff(&self) -> f64 {
        self.rescore_max_diff
    }
    /// The results as the benchmark holds them (every prediction and metric).
    pub fn results(&self) -> &UqResults {
        &self.results
    }

    /// The method whose name starts with `prefix` with the best value of `metric` in `setting`
    /// (lowest NLL, Brier, ECE; highest accuracy, AUROC); the first in report order on a tie;
    /// methods without a finite value are passed over.
    ///
    /// Errors: no method of that prefix with a finite value there.
    pub fn best(&self, prefix: &str, setting: &str, metric: Metric) -> Result<String> {
        let sign = if higher_is_better(metric) { -1.0 } else { 1.0 };
        let mut best: Option<(String, f64)> = None;
        for m in self.methods().into_iter().filter(|m| m.starts_with(prefix)) {
            let Some(v) = self.metric(&m, setting, metric).filter(|v| v.is_finite()) else { continue };
            if best.as_ref().is_none_or(|(_, b)| sign * v < sign * b) {
                best = Some((m, v));
            }
        }
        best.map(|(m, _)| m).ok_or_else(|| Error::Data(format!("{}: no method `{prefix}…` has a {} in setting {setting}", self.dir.display(), metric.name())))
    }

    /// One metric of `methods` (names: `&str` or `String`) in every setting that has it: rows
    /// in the order given, columns in report order.
    ///
    /// # Shapes
    /// The table's `values` is `[methods, settings]`.
    ///
    /// Errors: an unknown method.
    pub fn table<S: AsRef<str>>(&self, methods: &[S], metric: Metric) -> Result<MetricTable> {
        self.check_methods(methods)?;
        let settings: Vec<String> = self
            .settings()
            .iter()
            .filter(|s| methods.iter().any(|m| self.metric(m.as_ref(), &s.name, metric).is_some()))
            .map(|s| s.name.clone())
            .collect();
        let values = methods.iter().map(|m| settings.iter().map(|s| self.metric(m.as_ref(), s, metric).unwrap_or(f64::NAN)).collect()).collect();
        Ok(MetricTable { metric, methods: methods.iter().map(|m| m.as_ref().to_string()).collect(), settings, values })
    }

    /// Reliability diagrams of `methods` in the labelled `setting` (15 bins of the top-label
    /// confidence, as the benchmark's ECE), one panel per method titled with its name and
    /// stored ECE: [`Chart::reliability`].
    ///
    /// Errors: an unknown method or setting, an OOD setting (no labels).
    pub fn reliability<S: AsRef<str>>(&self, setting: &str, methods: &[S]) -> Result<Chart> {
        self.check_methods(methods)?;
        let info = self.setting(setting)?;
        let y = info.labels.as_ref().ok_or_else(|| Error::Config(format!("setting {setting} has no labels (out-of-distribution): no reliability diagram")))?;
        let mut panels = Vec::with_capacity(methods.len());
        for m in methods.iter().map(AsRef::as_ref) {
            let p = self.prediction(m, setting).ok_or_else(|| Error::Data(format!("method {m} has no predictions in setting {setting}")))?;
            let bins = metrics::reliability(&p.probs, y, self.results.k, ECE_BINS)?;
            let mut edges: Vec<f64> = bins.iter().map(|b| b.lo).collect();
            edges.push(1.0);
            panels.push(ReliabilityPanel {
                title: format!("{}: ECE {:.4}", display_name(m), self.metric(m, setting, Metric::Ece).unwrap_or(f64::NAN)),
                edges,
                accuracy: bins.iter().map(|b| b.accuracy).collect(),
                confidence: bins.iter().map(|b| b.confidence).collect(),
                count: bins.iter().map(|b| b.count).collect(),
            });
        }
        Chart::reliability(&format!("Reliability diagrams, {setting} ({} points)", info.n), &panels)
    }

    /// A labelled metric (accuracy, NLL, Brier, ECE) of `methods` against the rotation angle:
    /// one line per method over `clean` (0°) and every `rot-{angle}` setting, by angle.
    ///
    /// Errors: an unknown method; a metric that is not labelled (the AUROCs); a report without
    /// rotated settings.
    pub fn vs_angle<S: AsRef<str>>(&self, metric: Metric, methods: &[S]) -> Result<Chart> {
        self.check_methods(methods)?;
        if matches!(metric, Metric::AurocMsp | Metric::AurocVariance) {
            return Err(Error::Config(format!("{} is an OOD metric, not one of the labelled settings: no curve against the angle", metric.name())));
        }
        let mut at: Vec<(f64, &str)> = self
            .settings()
            .iter()
            .filter_map(|s| match s.kind {
                SettingKind::Clean => Some((0.0, s.name.as_str())),
                SettingKind::Shifted => angle(&s.name).map(|a| (a, s.name.as_str())),
                SettingKind::Ood => None,
            })
            .collect();
        if at.len() < 2 {
            return Err(Error::Data(format!("{}: no rotated settings (`rot-{{angle}}`) to draw against the angle", self.dir.display())));
        }
        at.sort_by(|a, b| a.0.total_cmp(&b.0));
        let series: Vec<Series> = methods
            .iter()
            .map(|m| Series::new(display_name(m.as_ref()), at.iter().map(|a| a.0).collect(), at.iter().map(|a| self.metric(m.as_ref(), a.1, metric).unwrap_or(f64::NAN)).collect()))
            .collect();
        Chart::line(&format!("{} under rotation (0° = clean test set)", metric_label(metric)), "rotation angle (degrees)", metric_label(metric), &series).draw()
    }

    fn prediction(&self, method: &str, setting: &str) -> Option<&MethodPrediction> {
        self.results.predictions.iter().find(|p| p.method == method && p.setting == setting)
    }

    fn setting(&self, name: &str) -> Result<&SettingInfo> {
        self.settings().iter().find(|s| s.name == name).ok_or_else(|| {
            Error::Config(format!("no setting {name} in {}; settings: {}", self.dir.display(), self.settings().iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")))
        })
    }

    fn check_methods<S: AsRef<str>>(&self, methods: &[S]) -> Result<()> {
        let known = self.methods();
        match methods.iter().map(AsRef::as_ref).find(|m| !known.iter().any(|k| k == m)) {
            Some(m) => Err(Error::Config(format!("no method {m} in {}; methods: {}", self.dir.display(), known.join(", ")))),
            None => Ok(()),
        }
    }

    /// evcxr's inline display: the `Display` summary as `text/plain`.
    pub fn evcxr_display(&self) {
        println!("EVCXR_BEGIN_CONTENT text/plain\n{self}\nEVCXR_END_CONTENT");
    }
}

impl fmt::Display for UqReport {
    /// What the report holds: classes, settings (name, kind, points), methods, and whether the
    /// stored metrics are what the predictions score.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.methods();
        writeln!(f, "uncertainty report {}: {} classes, {} methods, {} settings", self.dir.display(), self.results.k, ms.len(), self.settings().len())?;
        let kind = |k: SettingKind| match k {
            SettingKind::Clean => "clean",
            SettingKind::Shifted => "shifted",
            SettingKind::Ood => "OOD",
        };
        writeln!(f, "  settings  {}", self.settings().iter().map(|s| format!("{} ({}, {})", s.name, kind(s.kind), s.n)).collect::<Vec<_>>().join(", "))?;
        writeln!(f, "  methods   {}", ms.join(", "))?;
        let d = self.rescore_max_diff;
        if d == 0.0 {
            write!(f, "  metrics   {} values in metrics.parquet, each equal to the one recomputed from predictions.parquet", self.results.metrics.len())
        } else {
            write!(f, "  metrics   {} values in metrics.parquet; recomputed from predictions.parquet they differ by up to {d:.3e}", self.results.metrics.len())
        }
    }
}

/// One metric of some methods in some settings ([`UqReport::table`]); `Display` is a
/// fixed-width table and evcxr shows an HTML one, the best value of each column marked.
///
/// # Example
///
/// ```
/// # use pathkernel::api::*;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let uq = UqReport::open("reports/mnist-uncertainty")?;
/// let ece = uq.table(&["map", "temperature"], Metric::Ece)?;
/// assert_eq!(ece.settings[0], "clean");                     // the labelled settings, in order
/// assert_eq!(ece.values.len(), 2);                          // [methods][settings]
/// println!("{ece}");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct MetricTable {
    /// The metric.
    pub metric: Metric,
    /// Row names. # Shapes `[R]`.
    pub methods: Vec<String>,
    /// Column names. # Shapes `[C]`.
    pub settings: Vec<String>,
    /// Values, NaN where a method has none. # Shapes `[R][C]`.
    pub values: Vec<Vec<f64>>,
}

impl MetricTable {
    /// The value of `method` in `setting`, if the table has both.
    pub fn get(&self, method: &str, setting: &str) -> Option<f64> {
        let r = self.methods.iter().position(|m| m == method)?;
        let c = self.settings.iter().position(|s| s == setting)?;
        Some(self.values[r][c])
    }

    /// evcxr's inline display: an HTML table, the best value of each column in bold.
    pub fn evcxr_display(&self) {
        let mut s = format!("EVCXR_BEGIN_CONTENT text/html\n<table><caption>{}</caption><tr><th>method</th>", self.metric.name());
        for c in &self.settings {
            s += &format!("<th>{c}</th>");
        }
        s += "</tr>";
        let best = self.best_rows();
        for (r, m) in self.methods.iter().enumerate() {
            s += &format!("<tr><td>{m}</td>");
            for c in 0..self.settings.len() {
                let v = cell(self.values[r][c]);
                s += &if best[c] == Some(r) { format!("<td><b>{v}</b></td>") } else { format!("<td>{v}</td>") };
            }
            s += "</tr>";
        }
        s += "</table>\nEVCXR_END_CONTENT";
        println!("{s}");
    }

    /// The row with the best finite value of each column (`None` when none is finite).
    fn best_rows(&self) -> Vec<Option<usize>> {
        let sign = if higher_is_better(self.metric) { -1.0 } else { 1.0 };
        (0..self.settings.len())
            .map(|c| {
                (0..self.methods.len()).filter(|&r| self.values[r][c].is_finite()).fold(None, |b: Option<usize>, r| match b {
                    Some(b) if sign * self.values[b][c] <= sign * self.values[r][c] => Some(b),
                    _ => Some(r),
                })
            })
            .collect()
    }
}

impl fmt::Display for MetricTable {
    /// Fixed-width columns, the best value of each column marked `*`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.methods.iter().map(String::len).max().unwrap_or(6).max(6);
        write!(f, "{:w$}", self.metric.name())?;
        for c in &self.settings {
            write!(f, " {c:>9}")?;
        }
        let best = self.best_rows();
        for (r, m) in self.methods.iter().enumerate() {
            write!(f, "\n{m:w$}")?;
            for c in 0..self.settings.len() {
                let v = cell(self.values[r][c]);
                write!(f, " {:>9}", if best[c] == Some(r) { format!("{v}*") } else { format!("{v} ") })?;
            }
        }
        Ok(())
    }
}

fn cell(v: f64) -> String {
    if v.is_nan() {
        "—".into()
    } else {
        format!("{v:.4}")
    }
}

fn higher_is_better(m: Metric) -> bool {
    matches!(m, Metric::Accuracy | Metric::AurocMsp | Metric::AurocVariance)
}

/// The rotation angle of a setting name `rot-{a}`.
fn angle(name: &str) -> Option<f64> {
    name.strip_prefix("rot-").and_then(|a| a.parse().ok())
}

/// The protocol's display name of a method (`temperature` → `temperature scaling`), else its name.
fn display_name(m: &str) -> String {
    crate::uncertainty::method::display_name(m)
}

fn metric_label(m: Metric) -> &'static str {
    match m {
        Metric::Accuracy => "accuracy",
        Metric::Nll => "mean NLL",
        Metric::Brier => "Brier score",
        Metric::Ece => "ECE (15 bins)",
        Metric::AurocMsp => "AUROC (max probability)",
        Metric::AurocVariance => "AUROC (logit variance)",
    }
}

fn str_col<'t>(t: &'t Table, path: &Path, name: &str) -> Result<&'t [String]> {
    t.columns
        .iter()
        .find_map(|(n, c)| match c {
            Column::Str(v) if n == name => Some(v.as_slice()),
            _ => None,
        })
        .ok_or_else(|| Error::format(path, format!("no string column `{name}`")))
}

/// The classes, settings and predictions of a `predictions.parquet`.
fn read_predictions(path: &Path) -> Result<(usize, Vec<SettingInfo>, Vec<MethodPrediction>)> {
    let t = Table::read_parquet(path)?;
    let (method, setting) = (str_col(&t, path, "method")?, str_col(&t, path, "setting")?);
    let missing = |name: &str| Error::format(path, format!("no column `{name}`"));
    let point = t.i64("point").ok_or_else(|| missing("point"))?;
    let label = t.i64("label").ok_or_else(|| missing("label"))?;
    let score = t.f64("ood_score").ok_or_else(|| missing("ood_score"))?;
    let k = (0..).take_while(|c| t.f64(&format!("p{c}")).is_some()).count();
    if k == 0 {
        return Err(missing("p0"));
    }
    let probs: Vec<&[f64]> = (0..k).map(|c| t.f64(&format!("p{c}")).unwrap_or(&[])).collect();
    // Consecutive rows of one (method, setting) form its prediction.
    let mut preds: Vec<MethodPrediction> = Vec::new();
    let mut labels: Vec<Vec<i64>> = Vec::new();
    for r in 0..t.rows() {
        let fresh = preds.last().is_none_or(|p| p.method != method[r] || p.setting != setting[r]);
        if fresh {
            if preds.iter().any(|p| p.method == method[r] && p.setting == setting[r]) {
                return Err(Error::format(path, format!("the rows of {} / {} are not together", method[r], setting[r])));
            }
            preds.push(MethodPrediction { method: method[r].clone(), setting: setting[r].clone(), probs: Vec::new(), ood_score: Some(Vec::new()) });
            labels.push(Vec::new());
        }
        let i = preds.len() - 1; // a prediction was pushed for the first row
        let (p, y) = (&mut preds[i], &mut labels[i]);
        if point[r] != y.len() as i64 {
            return Err(Error::format(path, format!("row {r}: point {} of {} / {}, expected {}", point[r], p.method, p.setting, y.len())));
        }
        p.probs.extend(probs.iter().map(|col| col[r]));
        if let Some(s) = &mut p.ood_score {
            s.push(score[r]);
        }
        y.push(label[r]);
    }
    // A method without a variance score has NaN in every row.
    for p in &mut preds {
        if p.ood_score.as_ref().is_some_and(|s| s.iter().all(|v| v.is_nan())) {
            p.ood_score = None;
        }
    }
    // The settings, from the first method's rows; every method must have the same labels.
    let first = preds.first().map(|p| p.method.clone()).ok_or_else(|| Error::format(path, "no rows"))?;
    let mut settings: Vec<SettingInfo> = Vec::new();
    for (p, y) in preds.iter().zip(&labels).filter(|(p, _)| p.method == first) {
        let kind = if p.setting == "clean" {
            SettingKind::Clean
        } else if y.iter().all(|&l| l == -1) {
            SettingKind::Ood
        } else {
            SettingKind::Shifted
        };
        let labels = match kind {
            SettingKind::Ood => None,
            _ => Some(
                y.iter()
                    .map(|&l| usize::try_from(l).ok().filter(|&l| l < k).ok_or_else(|| Error::format(path, format!("{} / {}: label {l} is not one of {k} classes", p.method, p.setting))))
                    .collect::<Result<Vec<usize>>>()?,
            ),
        };
        settings.push(SettingInfo { name: p.setting.clone(), kind, n: y.len(), labels });
    }
    for (p, y) in preds.iter().zip(&labels) {
        let s = settings.iter().find(|s| s.name == p.setting).ok_or_else(|| Error::format(path, format!("{} / {}: a setting {first} does not have", p.method, p.setting)))?;
        let same = y.len() == s.n && s.labels.as_ref().map_or(y.iter().all(|&l| l == -1), |l| l.iter().zip(y).all(|(&a, &b)| a as i64 == b));
        if !same {
            return Err(Error::format(path, format!("{} / {}: points or labels differ from {first}'s", p.method, p.setting)));
        }
    }
    Ok((k, settings, preds))
}

/// The metrics of a `metrics.parquet`.
fn read_metrics(path: &Path) -> Result<Vec<MetricValue>> {
    let t = Table::read_parquet(path)?;
    let (method, setting, metric) = (str_col(&t, path, "method")?, str_col(&t, path, "setting")?, str_col(&t, path, "metric")?);
    let value = t.f64("value").ok_or_else(|| Error::format(path, "no column `value`"))?;
    let n = t.i64("n").ok_or_else(|| Error::format(path, "no column `n`"))?;
    (0..t.rows())
        .map(|r| {
            let m = Metric::ALL.into_iter().find(|m| m.name() == metric[r]).ok_or_else(|| Error::format(path, format!("row {r}: unknown metric `{}`", metric[r])))?;
            Ok(MetricValue { method: method[r].clone(), setting: setting[r].clone(), metric: m, value: value[r], n: n[r].max(0) as usize })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two methods on a clean, two rotated and an OOD setting, written as the benchmark writes
    /// them. K = 2.
    fn write_report(dir: &Path) -> UqResults {
        let settings = vec![
            SettingInfo { name: "clean".into(), kind: SettingKind::Clean, n: 4, labels: Some(vec![0, 1, 1, 0]) },
            SettingInfo { name: "rot-90".into(), kind: SettingKind::Shifted, n: 2, labels: Some(vec![1, 1]) },
            SettingInfo { name: "rot-30".into(), kind: SettingKind::Shifted, n: 2, labels: Some(vec![0, 1]) },
            SettingInfo { name: "noise".into(), kind: SettingKind::Ood, n: 3, labels: None },
        ];
        let pred = |m: &str, s: &str, probs: Vec<f64>, score: Option<Vec<f64>>| MethodPrediction { method: m.into(), setting: s.into(), probs, ood_score: score };
        let predictions = vec![
            pred("map", "clean", vec![0.9, 0.1, 0.2, 0.8, 0.6, 0.4, 0.7, 0.3], None),
            pred("map", "rot-90", vec![0.6, 0.4, 0.3, 0.7], None),
            pred("map", "rot-30", vec![0.8, 0.2, 0.4, 0.6], None),
            pred("map", "noise", vec![0.5, 0.5, 0.85, 0.15, 0.6, 0.4], None),
            pred("fsl-a", "clean", vec![0.8, 0.2, 0.3, 0.7, 0.5, 0.5, 0.6, 0.4], Some(vec![0.1, 0.2, 0.1, 0.3])),
            pred("fsl-a", "rot-90", vec![0.5, 0.5, 0.4, 0.6], Some(vec![0.5, 0.6])),
            pred("fsl-a", "rot-30", vec![0.7, 0.3, 0.45, 0.55], Some(vec![0.2, 0.2])),
            pred("fsl-a", "noise", vec![0.5, 0.5, 0.5, 0.5, 0.5, 0.5], Some(vec![1.0, 2.0, 3.0])),
            pred("fsl-b", "clean", vec![0.99, 0.01, 0.01, 0.99, 0.1, 0.9, 0.9, 0.1], None),
            pred("fsl-b", "rot-90", vec![0.99, 0.01, 0.2, 0.8], None),
            pred("fsl-b", "rot-30", vec![0.9, 0.1, 0.3, 0.7], None),
            pred("fsl-b", "noise", vec![0.9, 0.1, 0.9, 0.1, 0.9, 0.1], None),
        ];
        let metrics = report::score(2, &settings, &predictions).unwrap();
        let r = UqResults { k: 2, settings, predictions, metrics, temperature: None, laplace: None, config: serde_json::json!({}) };
        r.write(dir).unwrap();
        r
    }

    #[test]
    fn opens_a_written_report_and_reproduces_its_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_report(dir.path());
        let uq = UqReport::open(dir.path()).unwrap();
        assert_eq!(uq.classes(), 2);
        assert_eq!(uq.methods(), ["map", "fsl-a", "fsl-b"]);
        assert_eq!(uq.settings(), written.settings.as_slice());
        assert_eq!(uq.results().predictions, written.predictions);
        assert_eq!(uq.results().metrics, written.metrics);
        assert_eq!(uq.rescore_max_diff(), 0.0);
        assert_eq!(uq.probs("fsl-a", "rot-30"), Some(&[0.7, 0.3, 0.45, 0.55][..]));
        let nll = -(0.5f64.ln() + 0.6f64.ln()) / 2.0;
        assert!((uq.metric("fsl-a", "rot-90", Metric::Nll).unwrap() - nll).abs() < 1e-15);
        let text = uq.to_string();
        assert!(text.contains("2 classes, 3 methods, 4 settings"), "{text}");
        assert!(text.contains("noise (OOD, 3)") && text.contains("rot-90 (shifted, 2)"), "{text}");
        assert!(text.contains("each equal to the one recomputed"), "{text}");
    }

    #[test]
    fn best_picks_by_the_metric_direction_within_a_prefix() {
        let dir = tempfile::tempdir().unwrap();
        write_report(dir.path());
        let uq = UqReport::open(dir.path()).unwrap();
        // rot-90 NLL: fsl-a −(ln .5 + ln .6)/2 = 0.602, fsl-b −(ln .01 + ln .8)/2 = 2.41.
        assert_eq!(uq.best("fsl-", "rot-90", Metric::Nll).unwrap(), "fsl-a");
        // Clean accuracy (labels 0, 1, 1, 0): map 3/4, fsl-a 3/4 (its tie 0.5/0.5 goes to class 0),
        // fsl-b 4/4.
        assert_eq!(uq.best("", "clean", Metric::Accuracy).unwrap(), "fsl-b");
        assert_eq!(uq.best("map", "clean", Metric::Nll).unwrap(), "map");
        let e = uq.best("laplace", "clean", Metric::Nll).unwrap_err().to_string();
        assert!(e.contains("no method `laplace…`"), "{e}");
        // No method has an NLL in an OOD setting.
        assert!(uq.best("", "noise", Metric::Nll).is_err());
    }

    #[test]
    fn tables_hold_the_stored_values_and_mark_the_best() {
        let dir = tempfile::tempdir().unwrap();
        write_report(dir.path());
        let uq = UqReport::open(dir.path()).unwrap();
        let t = uq.table(&["fsl-b", "map"], Metric::Nll).unwrap();
        assert_eq!(t.settings, ["clean", "rot-90", "rot-30"]);
        assert_eq!(t.values.len(), 2);
        assert_eq!(t.get("map", "rot-30"), uq.metric("map", "rot-30", Metric::Nll));
        assert_eq!(t.get("map", "noise"), None);
        let text = t.to_string();
        assert_eq!(text.lines().count(), 3, "{text}");
        // map's rot-90 NLL −(ln .4 + ln .7)/2 = 0.637 beats fsl-b's 2.41: marked on map's row.
        let map_row = text.lines().nth(2).unwrap();
        assert!(map_row.contains(&format!("{:.4}*", uq.metric("map", "rot-90", Metric::Nll).unwrap())), "{text}");
        // The OOD metrics take the OOD settings only, NaN where a method has no value.
        let v = uq.table(&["map", "fsl-a"], Metric::AurocVariance).unwrap();
        assert_eq!(v.settings, ["noise"]);
        assert!(v.get("map", "noise").unwrap().is_nan());
        assert_eq!(v.get("fsl-a", "noise"), Some(1.0));
        assert!(v.to_string().contains('—'));
        let e = uq.table(&["map", "nope"], Metric::Nll).unwrap_err().to_string();
        assert!(e.contains("no method nope") && e.contains("map, fsl-a, fsl-b"), "{e}");
    }

    #[test]
    fn charts_draw_from_the_predictions_and_refuse_what_they_cannot_draw() {
        let dir = tempfile::tempdir().unwrap();
        write_report(dir.path());
        let uq = UqReport::open(dir.path()).unwrap();
        let rel = uq.reliability("clean", &["map", "fsl-a", "fsl-b", "map"]).unwrap();
        // Four panels, three per row: two rows of 400 pixels wide panels.
        assert_eq!(rel.width(), 1200);
        assert!(rel.png().starts_with(b"\x89PNG"));
        let one = uq.reliability("rot-90", &["map"]).unwrap();
        assert_eq!(one.width(), 400);
        assert!(rel.height() > one.height());
        let line = uq.vs_angle(Metric::Nll, &["map", "fsl-a"]).unwrap();
        assert!(line.png().starts_with(b"\x89PNG") && line.width() > 0);
        assert!(uq.vs_angle(Metric::Ece, &["fsl-b"]).is_ok());
        assert!(uq.reliability("noise", &["map"]).unwrap_err().to_string().contains("no labels"));
        assert!(uq.reliability("rot-45", &["map"]).unwrap_err().to_string().contains("no setting rot-45"));
        assert!(uq.reliability("clean", &["x"]).is_err());
        assert!(uq.vs_angle(Metric::AurocMsp, &["map"]).unwrap_err().to_string().contains("OOD metric"));
    }

    #[test]
    fn a_tampered_metric_shows_in_the_rescore_and_bad_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = write_report(dir.path());
        r.metrics[3].value += 0.25;
        r.metrics_table().write_parquet(&dir.path().join("metrics.parquet")).unwrap();
        let uq = UqReport::open(dir.path()).unwrap();
        assert!((uq.rescore_max_diff() - 0.25).abs() < 1e-12, "{}", uq.rescore_max_diff());
        assert!(uq.to_string().contains("differ by up to 2.500e-1"), "{uq}");
        // A metric row missing: the sets differ.
        r.metrics.pop();
        r.metrics_table().write_parquet(&dir.path().join("metrics.parquet")).unwrap();
        assert_eq!(UqReport::open(dir.path()).unwrap().rescore_max_diff(), f64::INFINITY);
        // Missing files and columns name the file.
        let e = UqReport::open(dir.path().join("nowhere")).unwrap_err().to_string();
        assert!(e.contains("predictions.parquet"), "{e}");
        Table::new().with("method", Column::Str(vec!["a".into()])).write_parquet(&dir.path().join("predictions.parquet")).unwrap();
        let e = UqReport::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("predictions.parquet") && e.contains("setting"), "{e}");
        // Points out of order.
        let mut r = write_report(dir.path());
        r.predictions.swap(0, 1);
        let mut t = r.predictions_table();
        if let Some((_, Column::I64(p))) = t.columns.iter_mut().find(|(n, _)| n == "point") {
            p[0] = 1;
        }
        t.write_parquet(&dir.path().join("predictions.parquet")).unwrap();
        let e = UqReport::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("row 0: point 1"), "{e}");
    }
}
