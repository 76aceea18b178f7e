//! A study file: its sections as typed values (`[[kernel]]` kind, side, points and blocks are
//! enums; TOML spells them as before).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::api::{KernelBuilder, Trained};
use crate::data::DataConfig;
use crate::error::{Error, Result};
use crate::kernel::{KernelKind, Layout, Outputs, Rows, Rule, Side};
use crate::model::ModelConfig;
use crate::train::{RunConfig, TrainConfig};
use super::text;

fn default_quadrature() -> Rule {
    Rule::Auto(1e-12)
}
fn default_points() -> Rows {
    Rows::Test
}
fn default_side() -> Side {
    Side::Test
}

/// One `[[kernel]]` entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// ntk, dpk, epk, chen, kprime or path.
    pub kind: KernelKind,
    /// Quadrature rule (default auto:1e-12).
    #[serde(default = "default_quadrature", with = "text::rule")]
    pub quadrature: Rule,
    /// Row points: test, train, class-means or grid:N (default test).
    #[serde(default = "default_points")]
    pub points: Rows,
    /// Side of the row points (default test).
    #[serde(default = "default_side")]
    pub side: Side,
    /// NTK: the state S.
    #[serde(default)]
    pub step: Option<usize>,
    /// The steps `[A, B)` summed (default: all): the machine predicts `f_{w_B}` from the bias
    /// `f_{w_A}` (a window of a long run; `[analysis] windows` puts windows together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<[usize; 2]>,
    /// With `points = "test"`: only these held-out points (indices into the test set), in
    /// this order (default: all). The cost of a kernel grows with its row points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub test_points: Vec<usize>,
    /// Label used for the output folder (default `kind-points`).
    #[serde(default)]
    pub label: Option<String>,
    /// Which blocks of the Gram to compute and keep: full (default), diag or trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Layout>,
    /// Also split the kernel by parameter layer (`layers.parquet` in its folder, a table in the
    /// summary).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_layer: bool,
    /// The outputs the kernel is on: `network` (default: as trained, a classifier's
    /// log-softmax) or `logits` (plain gradient steps; what `[analysis] fsl` fits on).
    #[serde(default, skip_serializing_if = "is_network")]
    pub outputs: Outputs,
    /// With `steps = [A, B]` on a run with momentum or Adam: the earlier steps' gradients that
    /// the momentum carries into the window are one carried-in term of the machine, not steps
    /// of the Gram ([`crate::kernel::Request::carry_in`]); the window then costs its own steps
    /// and one data gradient per earlier step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carry_in: bool,
}

fn is_network(o: &Outputs) -> bool {
    *o == Outputs::Network
}

impl KernelSpec {
    /// Checks what the types do not: `step` only for the NTK.
    pub fn validate(&self) -> Result<()> {
        if self.step.is_some() && self.kind != KernelKind::Ntk {
            return Err(Error::Config("kernel.step only applies to kind = \"ntk\"".into()));
        }
        if !self.test_points.is_empty() && self.points != Rows::Test {
            return Err(Error::Config("kernel.test_points chooses held-out points: it needs points = \"test\"".into()));
        }
        if let Some([a, b]) = self.steps {
            if self.kind == KernelKind::Ntk {
                return Err(Error::Config("kernel.steps does not apply to kind = \"ntk\" (it is taken at one state: kernel.step)".into()));
            }
            if a >= b {
                return Err(Error::Config(format!("kernel.steps = [{a}, {b}]: the window [A, B) needs A < B")));
            }
        }
        Ok(())
    }
    /// The layout of the Gram (`blocks`, default full).
    pub fn layout(&self) -> Layout {
        self.blocks.unwrap_or(Layout::Full)
    }
    /// Output folder name.
    pub fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| format!("{}-{}", self.kind, self.points.to_string().replace(':', "")))
    }
    /// The kernel request of this entry on `net`.
    pub fn builder<'a>(&self, net: &'a Trained) -> Result<KernelBuilder<'a>> {
        let b = net.kernel(self.kind).rule(self.quadrature).layout(self.layout());
        let b = if self.test_points.is_empty() {
            b.rows(self.points)
        } else {
            let ds = &net.run().dataset;
            let d = ds.dim;
            if let Some(&bad) = self.test_points.iter().find(|&&q| q >= ds.n_test()) {
                return Err(Error::Config(format!("kernel.test_points: {bad} is out of range ({} test points)", ds.n_test())));
            }
            let x: Vec<f64> = self.test_points.iter().flat_map(|&q| ds.x_test[q * d..(q + 1) * d].iter().copied()).collect();
            b.inputs(&x)
        };
        let b = b.side(self.side);
        let b = if self.per_layer { b.per_layer() } else { b };
        let b = if self.carry_in { b.carry_in() } else { b };
        let b = if self.outputs == Outputs::Logits { b.logits() } else { b };
        let b = match self.steps {
            Some([lo, hi]) => b.steps(lo, hi),
            None => b,
        };
        Ok(match self.step {
            Some(s) => b.at_step(s),
            None => b,
        })
    }
}

fn default_true() -> bool {
    true
}

/// The optional `[analysis]` section: what to do with the kernels beyond the kernel machines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalysisSpec {
    /// GP logit regression + Monte-Carlo softmax at every non-training kernel's points
    /// (hyper-parameters fitted by marginal likelihood).
    #[serde(default)]
    pub gp: bool,
    /// One-vs-rest SVM refit of a_i, evaluated at every non-training kernel's points.
    #[serde(default)]
    pub svm: bool,
    /// The SVM's C, chosen from these values by the accuracy on the validation split (the
    /// run's `val_per_class` images); empty: C = 1 and no sweep.
    #[serde(default)]
    pub svm_c: Vec<f64>,
    /// Stationarity score of the train×train EPK (and of the NTK at w_N and an RBF on the
    /// same points), and its far field along rays.
    #[serde(default)]
    pub stationarity: bool,
    /// The far field on real images: this many images of each setting of the uncertainty
    /// benchmark (clean, rotated, noise, inverted; 28×28 runs only); 0 = off.
    #[serde(default)]
    pub far_field_points: usize,
    /// Test points to attribute (indices into the first `epk` kernel on test points).
    #[serde(default)]
    pub attribution_points: Vec<usize>,
    /// Points of the linear interpolation `w_0 → w_N` (the paper's Fig. 8); 0 = off.
    #[serde(default)]
    pub interpolation: usize,
    /// Gradient-similarity matrix (the Domingos notebook): the train×train EPK, summed over
    /// classes, between the first N training points; 0 = off.
    #[serde(default)]
    pub similarity: usize,
    /// Function-space Laplace (class-diagonal curvature, δ by the function-space evidence) on
    /// every `[[kernel]]` with `outputs = "logits"` on test points, its training Gram that
    /// kernel's train × train Gram on the logits (computed and cached here): test NLL,
    /// accuracy and ECE of the probit predictive beside the network's softmax.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fsl: bool,
    /// Labels of `[[kernel]]` entries, each an EPK on the same test points with its `steps`
    /// window, in step order and not overlapping: the machine of the whole run put together
    /// from these windows' kernel sums and the network's own change over the gaps between them
    /// ([`super::windows`]), checked against the network at the last state; each window's
    /// attribution when `attribution_points` is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<String>,
    /// Every step's change of the held-out outputs split by the stack's top-level layers
    /// ([`super::shares`]): a table of the training phases and charts across training.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layer_shares: bool,
    /// Write PNG charts.
    #[serde(default = "default_true")]
    pub charts: bool,
}

impl Default for AnalysisSpec {
    fn default() -> Self {
        AnalysisSpec { gp: false, svm: false, svm_c: Vec::new(), stationarity: false, far_field_points: 0, attribution_points: Vec::new(), interpolation: 0, similarity: 0, fsl: false, windows: Vec::new(), layer_shares: false, charts: true }
    }
}

/// A study file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyConfig {
    /// Study name (the default report folder).
    pub name: String,
    /// What the study shows.
    #[serde(default)]
    pub description: String,
    /// `[data]`
    #[serde(default)]
    pub data: DataConfig,
    /// `[model]`
    #[serde(default)]
    pub model: ModelConfig,
    /// `[train]`
    pub train: TrainConfig,
    /// `[[kernel]]` entries.
    #[serde(default, rename = "kernel")]
    pub kernels: Vec<KernelSpec>,
    /// `[analysis]`
    #[serde(default)]
    pub analysis: AnalysisSpec,
    /// `[sweep]`: the same training for several MLP widths (the NTK notebook's lazy-training study).
    #[serde(default)]
    pub sweep: Option<SweepSpec>,
    /// Learning rate and step count chosen on the validation split (`[selection]`).
    #[serde(default)]
    pub selection: Option<SelectionSpec>,
    /// Put run-dependent figures (kernel seconds, the study's wall time and peak memory) into
    /// `summary.md`. Off by default: they go to `timings.json` only (not tracked by git), so
    /// that rerunning a study leaves a committed report unchanged.
    #[serde(default)]
    pub timings_in_summary: bool,
    /// Fail the study (exit 2, after the report is written) when a kernel's adaptive rule
    /// misses its tolerance ([`crate::kernel::KernelOutput::inexactness`]); with
    /// `strict = false` the miss is only stated, loudly, in the summary and on stderr.
    #[serde(default = "default_true")]
    pub strict: bool,
    /// `[uncertainty]`: the uncertainty benchmark ([`super::uncertainty`]); a study with this
    /// section is run by that runner (no `[[kernel]]`, `[analysis]` or `[sweep]`).
    #[serde(default)]
    pub uncertainty: Option<super::uncertainty::UqStudySpec>,
    /// `[attribution]`: the attribution benchmark ([`crate::datamodels`], run by
    /// `study/attribution.rs`); like `[uncertainty]`, a study kind of its own.
    #[serde(default)]
    pub attribution: Option<crate::datamodels::AttributionSpec>,
}

/// The optional `[sweep]` section: one extra run per entry of `hidden` (replacing
/// `model.hidden`), reported as relative weight change, loss and NTK change against the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// Hidden widths of each run, e.g. `[[10], [100], [1000]]`.
    pub hidden: Vec<Vec<usize>>,
}

impl StudyConfig {
    /// Parses and validates a study file's text.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let cfg: StudyConfig = toml::from_str(text)
            .map_err(|e| Error::format(origin, e.message().replace('\n', " ").trim().to_string() + &crate::train::span_hint(text, e.span())))?;
        if cfg.name.is_empty() || cfg.name.contains(['/', '\\']) || cfg.name.starts_with('.') {
            return Err(Error::Config(format!("study name `{}` must be a plain, non-empty folder name", cfg.name)));
        }
        cfg.run_config().validate()?;
        if let Some(sw) = &cfg.sweep {
            if sw.hidden.is_empty() {
                return Err(Error::Config("sweep.hidden is empty".into()));
            }
            if !matches!(cfg.model, ModelConfig::Mlp { .. }) {
                return Err(Error::Config("[sweep] varies the widths of an MLP; model.kind must be \"mlp\"".into()));
            }
            for h in &sw.hidden {
                cfg.sweep_config(h).validate()?;
            }
        }
        if let Some(u) = &cfg.uncertainty {
            if !cfg.kernels.is_empty() || cfg.sweep.is_some() || cfg.selection.is_some() || cfg.analysis != AnalysisSpec::default() {
                return Err(Error::Config("a study with [uncertainty] runs the uncertainty benchmark only (with its own lr/steps selection); leave out [[kernel]], [analysis], [sweep] and [selection]".into()));
            }
            u.validate(&cfg.run_config())?;
        }
        if cfg.attribution.is_some() && (cfg.uncertainty.is_some() || !cfg.kernels.is_empty() || cfg.sweep.is_some() || cfg.selection.is_some() || cfg.analysis != AnalysisSpec::default()) {
            return Err(Error::Config("a study with [attribution] runs the attribution benchmark only; leave out [uncertainty], [[kernel]], [analysis], [sweep] and [selection]".into()));
        }
        let mut labels = std::collections::HashSet::new();
        for k in &cfg.kernels {
            k.validate()?;
            if !labels.insert(k.label()) {
                return Err(Error::Config(format!("two [[kernel]] entries share the label `{}`; set `label`", k.label())));
            }
        }
        for w in &cfg.analysis.windows {
            match cfg.kernels.iter().find(|k| &k.label() == w) {
                None => return Err(Error::Config(format!("analysis.windows: no [[kernel]] is labelled `{w}`"))),
                Some(k) if k.kind != KernelKind::Epk || k.steps.is_none() || k.points != Rows::Test || k.side != Side::Test => {
                    return Err(Error::Config(format!("analysis.windows: `{w}` must be an epk kernel on the test points (side test) with steps = [A, B]")));
                }
                Some(_) => {}
            }
        }
        if cfg.analysis.fsl && !cfg.kernels.iter().any(|k| k.outputs == Outputs::Logits && k.points != Rows::Train && k.side == Side::Test) {
            return Err(Error::Config("analysis.fsl fits on kernels of the logits: add a [[kernel]] with outputs = \"logits\" on test points".into()));
        }
        Ok(cfg)
    }
    /// The training part with the MLP's hidden widths replaced (for `[sweep]`).
    pub fn sweep_config(&self, hidden: &[usize]) -> RunConfig {
        let mut rc = self.run_config();
        if let ModelConfig::Mlp { hidden: h, .. } = &mut rc.model {
            *h = hidden.to_vec();
        }
        rc
    }

    /// The training part.
    pub fn run_config(&self) -> RunConfig {
        RunConfig { data: self.data.clone(), model: self.model.clone(), init: None, train: self.train.clone() }
    }
}

/// `[selection]`: the `lr × steps` grid of [`super::selection`] (the best accuracy on the
/// dataset's validation split; ties: the smaller rate, then fewer steps); the study's `[train]`
/// lr and steps are replaced by the choice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectionSpec {
    /// Candidate learning rates.
    pub lr: Vec<f64>,
    /// Candidate step counts.
    pub steps: Vec<usize>,
}
