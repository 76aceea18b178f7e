//! The vocabulary of the kernel engine: kinds, sides, forms, layouts, requests, outputs and
//! row points.

use serde::{Deserialize, Serialize};

use super::gram::Contraction;
use super::layout::Layout;
use super::quadrature::Rule;
use crate::error::{Error, Result};

/// Which kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelKind {
    /// Empirical NTK at one step.
    Ntk,
    /// Discrete path kernel (t = 0 on both sides).
    Dpk,
    /// Exact path kernel (Definition 3.4).
    Epk,
    /// Chen et al.'s kernel (eq. 18).
    Chen,
    /// The continuous, asymmetric k′ (eq. 13).
    Kprime,
    /// The path-averaged kernel `Σ_s ⟨J̄_s(x), J̄_s(x′)⟩`, `J̄_s = ∫₀¹ ∇f_{w_s(t)} dt`, with both
    /// sides integrated: the exact Bayesian linear model in the step increments (symmetric
    /// PSD for train and test points alike; not a kernel machine of the network). Over a window
    /// of steps (`steps = (n − L, n)`) it interpolates towards the final NTK.
    Path,
}

impl std::str::FromStr for KernelKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ntk" => Ok(KernelKind::Ntk),
            "dpk" => Ok(KernelKind::Dpk),
            "epk" => Ok(KernelKind::Epk),
            "chen" => Ok(KernelKind::Chen),
            "kprime" => Ok(KernelKind::Kprime),
            "path" => Ok(KernelKind::Path),
            _ => Err(Error::Config(format!("kernel kind `{s}`: expected ntk, dpk, epk, chen, kprime or path"))),
        }
    }
}

impl std::fmt::Display for KernelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            KernelKind::Ntk => "ntk",
            KernelKind::Dpk => "dpk",
            KernelKind::Epk => "epk",
            KernelKind::Chen => "chen",
            KernelKind::Kprime => "kprime",
            KernelKind::Path => "path",
        };
        f.write_str(s)
    }
}

/// Which kernel form the optimizer of a run admits ([`crate::optim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelForm {
    /// Plain gradient steps (GD/SGD): `K_s(x, x') = ⟨J̄_s(x), ∇f(x'; w_s)⟩`, the path kernel of
    /// Definition 3.4 (symmetric in form; exactly symmetric on the train side).
    Gradient,
    /// Gradient steps with weight decay: the same kernel, plus the non-data term `R(x)`.
    GradientWithDecay,
    /// Heavy-ball momentum: `K_r(x, x') = ⟨F_r(x), ∇f(x'; w_r)⟩` where `F_r` sums the integrated
    /// gradients of steps s ≥ r weighted by `(ε_s/ε_r) β^{s−r}`: not a symmetric kernel.
    Momentum,
    /// Adam(W): `F_r` also carries the diagonal preconditioner `κ_s D_s` of each step: not a
    /// symmetric kernel.
    Preconditioned,
}

impl KernelForm {
    /// The form of an optimizer's kernel.
    pub fn of(rule: &crate::optim::UpdateRule) -> Self {
        match (rule.adam.is_some(), rule.beta != 0.0, rule.wd_coupled != 0.0 || rule.wd_decoupled != 0.0) {
            (true, _, _) => KernelForm::Preconditioned,
            (false, true, _) => KernelForm::Momentum,
            (false, false, true) => KernelForm::GradientWithDecay,
            (false, false, false) => KernelForm::Gradient,
        }
    }

    /// Whether `K(x, x')` is an inner product of one feature map evaluated on both sides (up to
    /// the EPK's train/test asymmetry).
    pub fn symmetric(&self) -> bool {
        matches!(self, KernelForm::Gradient | KernelForm::GradientWithDecay)
    }

    /// The formula, for output manifests.
    pub fn formula(&self) -> &'static str {
        match self {
            KernelForm::Gradient => "K_s(x,x') = <Jbar_s(x), grad f(x'; w_s)>, Jbar_s = int_0^1 grad f(x; w_s(t)) dt; f = b + sum_s sum_i a_is K_s",
            KernelForm::GradientWithDecay => "K_s as for gradient steps; f = b + sum_s sum_i a_is K_s + R(x), R = weight-decay term (no training point)",
            KernelForm::Momentum => "K_r(x,x') = <F_r(x), grad f(x'; w_r)>, F_r = sum_{s>=r} (eps_s/eps_r) beta^(s-r) Jbar_s(x); not symmetric; f = b + sum_r sum_i a_ir K_r + R(x)",
            KernelForm::Preconditioned => "K_r(x,x') = <F_r(x), grad f(x'; w_r)>, F_r = sum_{s>=r} (eps_s/eps_r) (1-beta1) beta1^(s-r) kappa_s D_s * Jbar_s(x), D_s = Adam's diagonal preconditioner; not symmetric; f = b + sum_r sum_i a_ir K_r + R(x)",
        }
    }
}

impl KernelKind {
    /// The kernel's formula for output manifests: the EPK and k′ in the form the run's optimizer
    /// admits ([`KernelForm::formula`]), the others their own definition.
    pub fn formula(&self, form: KernelForm) -> &'static str {
        match self {
            KernelKind::Epk | KernelKind::Kprime => form.formula(),
            KernelKind::Ntk => "K(x,x') = <grad f(x; w_S), grad f(x'; w_S)> (the empirical NTK at one state S); the machine b + sum_s sum_i a_is K is not the network",
            KernelKind::Dpk => "K_s(x,x') = <grad f(x; w_s), grad f(x'; w_s)> (both gradients at t = 0, Domingos' discrete path kernel); f ~ b + sum_s sum_i a_is K_s, not exact",
            KernelKind::Chen => "K_s(x,x') = |dL/df(x'; w_s)| <grad f(x; w_s), grad f(x'; w_s)> (Chen et al., eq. 18); summed over steps",
            KernelKind::Path => "K(x,x') = sum_s <Jbar_s(x), Jbar_s(x')>, Jbar_s = int_0^1 grad f(x; w_s(t)) dt on both sides (the path-averaged kernel; symmetric PSD, not a kernel machine of the network)",
        }
    }
}

impl std::fmt::Display for KernelForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KernelForm::Gradient => "gradient",
            KernelForm::GradientWithDecay => "gradient-with-decay",
            KernelForm::Momentum => "momentum",
            KernelForm::Preconditioned => "preconditioned",
        })
    }
}

/// Which outputs of the network a kernel is on.
///
/// A classifier's outputs are the log-softmax of its logits `z`; the EPK identity holds for the
/// logits too: along step s, `z_{w_{s+1}}(x) − z_{w_s}(x) = Σ_i a_{i,s} · K_s(x, x_i)` with the
/// gradients of `z` in the kernel and `a_{i,s} = −ε_s ∂L/∂z(x_i) = −ε_s (softmax(z_i) − e_{y_i})/n`
/// (depends on s, so Theorem 3.7's single machine does not apply). Logits are what
/// laplace-torch's `FunctionalLaplace` puts its GP on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outputs {
    /// The network's outputs as trained (log-softmax for a classifier, identity for regression).
    #[default]
    Network,
    /// The logits of a classifier (plain gradient steps; the same as `Network` for regression).
    Logits,
}

impl std::str::FromStr for Outputs {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "network" => Ok(Outputs::Network),
            "logits" => Ok(Outputs::Logits),
            _ => Err(Error::Config(format!("outputs `{s}`: expected network or logits"))),
        }
    }
}

impl std::fmt::Display for Outputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outputs::Network => "network",
            Outputs::Logits => "logits",
        })
    }
}

/// Which copy of the input space a point lives in (EPK Definition 3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// Training copy: gradients taken at `w_s(0)`.
    Train,
    /// Test copy: gradients integrated over `w_s(t)`, t ∈ [0, 1].
    Test,
}

/// `train` or `test` (the serde names).
impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Train => "train",
            Side::Test => "test",
        })
    }
}

/// Per-step record (the ExPLAIND-style validation: predicted vs actual change of the output).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepRecord {
    /// Step s (update from w_s to w_{s+1}).
    pub step: usize,
    /// max over points and classes of |predicted − actual change|.
    pub max_abs_error: f64,
    /// mean over points and classes of |predicted − actual change|.
    pub mean_abs_error: f64,
    /// max |actual change| `|f_{w_{s+1}}(x) − f_{w_s}(x)|`.
    pub max_abs_change: f64,
    /// Mean gradient evaluations per row point.
    pub mean_evaluations: f64,
    /// Max gradient evaluations for one row point.
    pub max_evaluations: usize,
    /// Mean forward-mode (f and df/dt, no gradient) evaluations per point spent choosing the
    /// nodes of the auto rule.
    pub mean_jvp_evaluations: f64,
    /// Mean number of smooth pieces per point (1 + kinks).
    pub mean_pieces: f64,
    /// Pieces that did not reach the tolerance (auto rule).
    pub unconverged_pieces: usize,
    /// Mean |cos| error angle proxy: 1 − cos(test gradient at t=0, integrated test gradient),
    /// averaged over points and classes (the paper's Fig. 2 measure), NaN when not computed.
    pub dpk_cosine_error: f64,
}

/// Everything a kernel computation returns.
#[derive(Clone, Debug)]
pub struct KernelOutput {
    /// Kind computed.
    pub kind: KernelKind,
    /// Quadrature rule used.
    pub rule: Rule,
    /// Side of the rows.
    pub side: Side,
    /// Whether rows were integrated over t (EPK test side, k′); otherwise taken at t = 0.
    pub integrated: bool,
    /// Rows P.
    pub p: usize,
    /// Training points M.
    pub m: usize,
    /// Outputs K.
    pub k: usize,
    /// Number of steps summed.
    pub steps: Vec<usize>,
    /// Which blocks `gram` holds.
    pub layout: Layout,
    /// Time and GEMM flops of the Gram contraction (node evaluations excluded; the MLP path
    /// measures it, other paths report zeros).
    pub contraction: Contraction,
    /// `Σ_s K_s` (NTK: at step S) in `layout`: `[P, M, K, K]`, `[P, M, K]` or `[P, M]`.
    pub gram: Vec<f64>,
    /// Per-step Grams `[S, …]` (each in `layout`) when requested.
    pub per_step: Option<Vec<f64>>,
    /// Each row point's self-kernel on its own side, `K(x_p, x_p)` summed like the Gram,
    /// `[P, K, K]` (ntk, dpk, epk; `None` for chen and k′, whose self-kernel is not defined by
    /// the same formula).
    pub diag: Option<Vec<f64>>,
    /// `a_{i,s}` `[N, M, K]` (Chen: `−ε_s sign(∂L/∂f)`).
    pub a: Vec<f64>,
    /// Bias `b = f_{w_0}(x)` `[P, K]`.
    pub bias: Vec<f64>,
    /// Network output `f_{w_N}(x)` `[P, K]`.
    pub network: Vec<f64>,
    /// Kernel machine (ensemble form, Theorem 3.6) `[P, K]`.
    pub machine: Vec<f64>,
    /// Single kernel machine `b + Σ_i a_i·G` (Theorem 3.7) when `a` is constant over steps.
    pub single_machine: Option<Vec<f64>>,
    /// Per-step validation records.
    pub records: Vec<StepRecord>,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// The kernel form the run's optimizer admits.
    pub form: KernelForm,
    /// The weight-decay term `R(x)` `[P, K]` (included in `machine`), when the run used weight
    /// decay: the part of the output that belongs to no training point.
    pub reg: Option<Vec<f64>>,
    /// Max over steps of `‖Σ_i u_{i,s} + r_s − (w_{s+1} − w_s)‖_∞ / ‖w_{s+1} − w_s‖_∞`: how well
    /// the replayed optimizer reproduces the recorded path (momentum/Adam/weight-decay runs).
    pub decomposition_residual: Option<f64>,
    /// The rounding term `Σ_s J̄_s·(Δw_s − Σ_i u_{i,s} − r_s)` `[P, K]` (included in `machine`):
    /// what the per-point split does not carry (momentum/Adam/weight-decay runs).
    pub rounding: Option<Vec<f64>>,
    /// The carried-in term `[P, K]` (included in `machine`) of a window `[A, B)` computed with
    /// [`super::Request::carry_in`] on a run with momentum or Adam: what the gradients of the
    /// steps before A, carried by the optimizer's momentum, change of the outputs inside the
    /// window. It belongs to no training point of the window.
    pub carried: Option<Vec<f64>>,
    /// Set when the Gram's columns are a proper range of the training points
    /// ([`super::Request::columns`]): the output is then one column block's share, assembled
    /// with the others by [`super::engine::columns::assemble`].
    pub columns: Option<ColumnShare>,
    /// Each parameter layer's share ([`super::Request::per_layer`]).
    pub layers: Option<LayerShares>,
}

/// The per-layer decomposition of a kernel computation. Every kernel is a sum over parameter
/// tensors, `⟨∇f(x), ∇f(x′)⟩ = Σ_l ⟨∇_l f(x), ∇_l f(x′)⟩`, with the quadrature's nodes those of
/// the whole network; so each parameter layer ([`crate::model::param_layers`]) has its share of
/// the Gram and of the machine's predicted change at every step, and the shares sum to the
/// whole (to rounding).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerShares {
    /// The parameter layers' names, in storage order (`0`, `3`, `2.body.0`, `layers.1`).
    pub names: Vec<String>,
    /// Each layer's Gram, in the output's layout: `L` arrays shaped like [`KernelOutput::gram`].
    pub gram: Vec<Vec<f64>>,
    /// Each layer's share of the machine's predicted change at every step summed,
    /// `[S, L, P, K]` (the NTK: one step, its linearised change).
    pub change: Vec<f64>,
}

/// One column block's share of a kernel computation: the Gram against the training points
/// `[lo, hi)` of M.
///
/// In such an output `m` is `hi − lo`, the Gram is `[P, hi − lo, …]` and `a` is
/// `[N, hi − lo, K]`. `single_machine` is `None` (the assembly recomputes it). The kernel
/// machine comes in one of two forms:
///
/// - plain gradient steps (`machine_whole` false): `machine` is this block's share,
///   `b + Σ_s Σ_{i ∈ [lo, hi)} a_{i,s} K_s(x, x_i)`, and the per-step validation is not additive:
///   the records' `max_abs_error` and `mean_abs_error` are NaN (the NTK's one record,
///   `max |machine − network|`, too). `step_pred` and `step_actual` carry what the assembly needs:
///   it sums the blocks' `step_pred` per step and re-sums the machine as the one-process driver
///   does (`b`, then step by step: the same order; each step's prediction is a sum of the
///   blocks' parts, so it equals the one-process one to rounding, not bit for bit), and
///   recomputes the records from it.
/// - momentum, Adam, weight decay (`machine_whole` true): `machine` and the records are the whole
///   computation's, the same in every block. The machine `b − Σ_r H_r·g_r + R + rounding` takes
///   the replay's whole data gradient `g_r`, which every block computes anyway: split by
///   training points, Adam's per-point terms are amplified by `1/eps` and cancel to O(1), so the
///   blocks' shares would sum to the machine only to about `1e-10` relative.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnShare {
    /// The training points `[lo, hi)`.
    pub range: (usize, usize),
    /// All training points M.
    pub of: usize,
    /// Whether `machine` and the records are the whole computation's (momentum, Adam, weight
    /// decay) rather than this block's share (plain gradient steps).
    pub machine_whole: bool,
    /// Per step (one per record), the predicted change from these training points,
    /// `Σ_{i ∈ [lo, hi)} a_{i,s} K_s(x, x_i)` `[S, P, K]` (plain gradient steps; the NTK: the
    /// linearised machine's whole change, `[1, P, K]`).
    pub step_pred: Option<Vec<f64>>,
    /// Per step, the actual change `f_{w_{s+1}}(x) − f_{w_s}(x)` `[S, P, K]` (the NTK: over the
    /// whole range), with `step_pred`.
    pub step_actual: Option<Vec<f64>>,
}

impl KernelOutput {
    /// max |kernel machine − network|; NaN when any entry of either is NaN (a machine that
    /// produced NaN is never reported exact).
    pub fn max_abs_error(&self) -> f64 {
        max_abs_diff(&self.machine, &self.network)
    }
    /// mean |kernel machine − network|.
    pub fn mean_abs_error(&self) -> f64 {
        let n = self.machine.len().max(1) as f64;
        self.machine.iter().zip(&self.network).map(|(a, b)| (a - b).abs()).sum::<f64>() / n
    }
    /// Mean over steps of the mean evaluations per point.
    pub fn mean_evaluations(&self) -> f64 {
        let n = self.records.len().max(1) as f64;
        self.records.iter().map(|r| r.mean_evaluations).sum::<f64>() / n
    }
    /// Max evaluations for one point in one step.
    pub fn max_evaluations(&self) -> usize {
        self.records.iter().map(|r| r.max_evaluations).max().unwrap_or(0)
    }

    /// One line saying how an adaptive rule missed its tolerance — the machine's error above
    /// it, or pieces that did not converge, with the steps where they are and their per-step
    /// errors — or `None` when it met it (and for fixed rules, which promise nothing).
    pub fn inexactness(&self) -> Option<String> {
        let Rule::Auto(tol) = self.rule else { return None };
        if !self.integrated {
            return None;
        }
        let err = self.max_abs_error();
        let unconverged: usize = self.records.iter().map(|r| r.unconverged_pieces).sum();
        if err <= tol && unconverged == 0 {
            return None;
        }
        let mut bad: Vec<&StepRecord> = self.records.iter().filter(|r| r.unconverged_pieces > 0 || !(r.max_abs_error <= tol)).collect();
        bad.sort_by(|a, b| b.max_abs_error.total_cmp(&a.max_abs_error));
        let shown: Vec<String> = bad.iter().take(5).map(|r| format!("step {} ({} unconverged, {:.1e})", r.step, r.unconverged_pieces, r.max_abs_error)).collect();
        Some(format!(
            "the {} kernel's rule {} missed its tolerance: max |machine - network| {err:.3e} (tolerance {tol:e}), {unconverged} unconverged pieces; {} of {} steps off{}{}",
            self.kind,
            self.rule,
            bad.len(),
            self.records.len(),
            if shown.is_empty() { String::new() } else { format!(", worst: {}", shown.join(", ")) },
            if bad.len() > shown.len() { ", …" } else { "" }
        ))
    }
}

impl KernelOutput {
    /// Rich display in evcxr notebooks: an HTML table of the headline numbers.
    pub fn evcxr_display(&self) {
        println!(
            "EVCXR_BEGIN_CONTENT text/html\n<table><tr><th>kernel</th><th>side</th><th>quadrature</th><th>P × M × K</th><th>steps</th><th>max |machine − network|</th><th>mean</th><th>gradient evaluations / point / step</th><th>seconds</th></tr><tr><td>{}</td><td>{:?}</td><td>{}</td><td>{} × {} × {}</td><td>{}</td><td>{:.3e}</td><td>{:.3e}</td><td>{:.2} (max {})</td><td>{:.2}</td></tr></table>\nEVCXR_END_CONTENT",
            self.kind,
            self.side,
            if self.integrated { self.rule.to_string() } else { "none (t = 0)".into() },
            self.p,
            self.m,
            self.k,
            self.steps.len(),
            self.max_abs_error(),
            self.mean_abs_error(),
            self.mean_evaluations(),
            self.max_evaluations(),
            self.seconds
        );
    }
}

impl std::fmt::Display for KernelOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} rows, quadrature {}) over {} step(s): gram [{}]{}, kernel machine vs network max |err| {:.3e}, mean {:.3e}; {:.2} gradient evaluations per point and step (max {}); {:.2} s",
            self.kind,
            match self.side {
                Side::Test => "test side",
                Side::Train => "train side",
            },
            self.p,
            if self.integrated { self.rule.to_string() } else { "none, t = 0".to_string() },
            self.steps.len(),
            self.layout.shape(self.p, self.m, self.k).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
            if self.layout == Layout::Full { String::new() } else { format!(" ({} blocks)", self.layout) },
            self.max_abs_error(),
            self.mean_abs_error(),
            self.mean_evaluations(),
            self.max_evaluations(),
            self.seconds
        )?;
        if self.form != KernelForm::Gradient {
            write!(f, "; form {}{}", self.form, if self.form.symmetric() { "" } else { " (not a symmetric kernel)" })?;
        }
        if let Some(r) = &self.reg {
            write!(f, "; weight-decay term max |R| {:.3e}", max_abs(r))?;
        }
        if let Some(c) = &self.carried {
            write!(f, "; carried-in term max |C| {:.3e}", max_abs(c))?;
        }
        if let (Some(res), Some(r)) = (self.decomposition_residual, &self.rounding) {
            write!(f, "; optimizer replay residual {res:.1e}, rounding term max {:.1e}", max_abs(r))?;
        }
        if let Some(l) = &self.layers {
            // Each layer's ‖G_l‖_F / ‖G‖_F and its largest share of the machine's change.
            let norm = |g: &[f64]| g.iter().map(|v| v * v).sum::<f64>().sqrt();
            let whole = norm(&self.gram).max(f64::MIN_POSITIVE);
            let (nl, pk) = (l.names.len(), self.p * self.k);
            for (li, (name, g)) in l.names.iter().zip(&l.gram).enumerate() {
                let mut total = vec![0.0; pk];
                for chunk in l.change.chunks_exact(nl * pk) {
                    total
                        .iter_mut()
                        .zip(&chunk[li * pk..(li + 1) * pk])
                        .for_each(|(a, b)| *a += b);
                }
                write!(
                    f,
                    "\n  layer {name}: ‖G_l‖/‖G‖ {:.3}, max |change| {:.3e}",
                    norm(g) / whole,
                    max_abs(&total)
                )?;
            }
        }
        Ok(())
    }
}

/// `max(a, b)` that propagates NaN (`f64::max` drops it): for every reduction that decides
/// "exact" or "converged".
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `max_i |a_i − b_i|`, NaN when any difference is NaN, 0 for empty slices.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, nan_max)
}

/// `max_i |a_i|`, NaN when any entry is NaN.
pub fn max_abs(a: &[f64]) -> f64 {
    a.iter().map(|x| x.abs()).fold(0.0, nan_max)
}

/// Row points of a kernel computation.
#[derive(Clone, Debug)]
pub struct Points {
    /// Inputs `[P, d]`.
    pub x: Vec<f64>,
    /// d.
    pub dim: usize,
}

impl Points {
    /// Number of points P.
    pub fn len(&self) -> usize {
        self.x.len().checked_div(self.dim).unwrap_or(0)
    }
    /// Whether there are no points.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bytes of the arrays a request outputs: the Gram `[P, M, K, K]`, every per-step Gram with
/// `per_step` (`steps` of them), the self-kernels `[P, K, K]`, `a` `[N, M, K]` (`N = steps`)
/// and the four `[P, K]` vectors (bias, network, machine, single machine).
pub fn output_bytes(p: usize, m: usize, k: usize, steps: usize, per_step: bool) -> u64 {
    output_bytes_in(Layout::Full, p, m, k, steps, per_step)
}

/// [`output_bytes`] for a Gram stored in `layout`.
pub(crate) fn output_bytes_in(layout: Layout, p: usize, m: usize, k: usize, steps: usize, per_step: bool) -> u64 {
    let g = (p * m * layout.per_pair(k)) as u64 * 8;
    let (p, m, k, n) = (p as u64, m as u64, k as u64, steps as u64);
    g + if per_step { g * n } else { 0 } + p * k * k * 8 + n * m * k * 8 + 4 * p * k * 8
}

/// Parses a step range `A:B` (steps A ≤ s < B).
pub(crate) fn parse_step_range(s: &str) -> Result<(usize, usize)> {
    let bad = || Error::Config(format!("--steps `{s}`: expected A:B with integers 0 <= A < B"));
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let a: usize = a.trim().parse().map_err(|_| bad())?;
    let b: usize = b.trim().parse().map_err(|_| bad())?;
    if a >= b {
        return Err(bad());
    }
    Ok((a, b))
}

/// Gradient evaluations spent on one step, per row point.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeStats {
    /// Gradient evaluations (quadrature nodes) per point `[P]`; for ReLU CNN rows integrated
    /// between kinks (the auto rule), the two backward passes forming `∇z(t)`.
    pub evaluations: Vec<usize>,
    /// Forward-mode evaluations spent choosing the nodes (auto rule) `[P]`; for ReLU CNN rows
    /// integrated between kinks, one forward pass (pattern and logits) per piece.
    pub jvp_evaluations: Vec<usize>,
    /// Smooth pieces per point `[P]`.
    pub pieces: Vec<usize>,
    /// Pieces that did not reach the tolerance.
    pub unconverged: usize,
}
