//! Kernels of a recorded training path: NTK, DPK, EPK, Chen's kernel, the asymmetric k′,
//! and the kernel machine that reproduces the network.
//!
//! Notation (EPK paper §3): `f` is the network including its output map (log-softmax for
//! classification), `w_s(t) = w_s + t(w_{s+1} − w_s)`, `a_{i,s} = −ε_s ∂L/∂f(x_i)` at `w_s`
//! with L the mean training loss, `b = f_{w_0}(x)`. For one step s and output classes
//! `k` (row point) and `k'` (training point):
//!
//! - **NTK** at step S: `⟨∇f^k_{w_S}(x), ∇f^{k'}_{w_S}(x_i)⟩`.
//! - **DPK** (Domingos, discrete): `Σ_s ⟨∇f^k_{w_s}(x), ∇f^{k'}_{w_s}(x_i)⟩` (one evaluation at t = 0).
//! - **EPK** (Definition 3.4): `Σ_s ∫_0^1 ⟨∇f^k_{w_s(t)}(x), ∇f^{k'}_{w_s}(x_i)⟩ dt` for a test-side
//!   row; a train-side row is evaluated at t = 0 (the asymmetry of Definition 3.4).
//! - **Chen** (eq. 18): `Σ_s |∂L/∂f^{k'}(x_i)| ⟨∇f^k_{w_s}(x), ∇f^{k'}_{w_s}(x_i)⟩`.
//! - **k′** (eq. 13): like the EPK but rows are always integrated, whatever their side.
//!
//! The kernel machine (Theorem 3.6, ensemble form) is
//! `f(x) = b + Σ_s Σ_i Σ_{k'} a_{i,s}^{k'} K_s(x, x_i)[k, k']`; with cross-entropy on log-softmax
//! outputs and a constant learning rate `a_{i,s}` does not depend on s and the single machine
//! `b + Σ_i a_i·G` with `G = Σ_s K_s` (Theorem 3.7) is exact as well.

pub mod blocked;
pub mod convgram;
pub mod eval;
pub mod generic;
pub mod gram;
pub mod linalg;
pub mod output;
pub mod quadrature;
mod stateful;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::data::Targets;
use crate::error::{Error, Result};
use crate::model::net::LossKind;
use crate::model::{Body, Params};
use crate::trajectory::Manifest;
use eval::{Evals, MlpStep};
use gram::{GramAccumulator, LayerFactors};
pub use quadrature::Rule;

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
            _ => Err(Error::Config(format!("kernel kind `{s}`: expected ntk, dpk, epk, chen or kprime"))),
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

/// Which copy of the input space a point lives in (EPK Definition 3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// Training copy: gradients taken at `w_s(0)`.
    Train,
    /// Test copy: gradients integrated over `w_s(t)`, t ∈ [0, 1].
    Test,
}

/// What to compute.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelRequest {
    /// Kernel kind.
    pub kind: KernelKind,
    /// Quadrature for integrated rows.
    pub rule: Rule,
    /// Side of the row points.
    pub side: Side,
    /// For the NTK: the step S (default: the last state N).
    pub ntk_step: Option<usize>,
    /// Keep every per-step Gram `K_s`.
    pub per_step: bool,
    /// Sum only the steps `[A, B)` (default: all); the machine then predicts `f_{w_B}` from
    /// the bias `f_{w_A}`.
    pub steps: Option<(usize, usize)>,
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
    /// `Σ_s K_s` (NTK: at step S) `[P, M, K, K]`.
    pub gram: Vec<f64>,
    /// Per-step Grams `[S, P, M, K, K]` when requested.
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
}

impl KernelOutput {
    /// max |kernel machine − network|.
    pub fn max_abs_error(&self) -> f64 {
        self.machine.iter().zip(&self.network).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
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
            "{} ({}, {} rows, quadrature {}) over {} step(s): gram [{}, {}, {}, {}], kernel machine vs network max |err| {:.3e}, mean {:.3e}; {:.2} gradient evaluations per point and step (max {}); {:.2} s",
            self.kind,
            match self.side {
                Side::Test => "test side",
                Side::Train => "train side",
            },
            self.p,
            if self.integrated { self.rule.to_string() } else { "none, t = 0".to_string() },
            self.steps.len(),
            self.p,
            self.m,
            self.k,
            self.k,
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
            write!(f, "; weight-decay term max |R| {:.3e}", r.iter().fold(0.0f64, |a, v| a.max(v.abs())))?;
        }
        if let (Some(res), Some(r)) = (self.decomposition_residual, &self.rounding) {
            write!(f, "; optimizer replay residual {res:.1e}, rounding term max {:.1e}", r.iter().fold(0.0f64, |a, v| a.max(v.abs())))?;
        }
        Ok(())
    }
}

/// ∂L/∂f(x_i) at one state, `[M, K]`, for the loss as minimised at that step: the mean over
/// all M points (gradient descent) or over the step's mini-batch (SGD; zero outside it).
pub fn loss_gradient(loss: LossKind, f_train: &[f64], targets: &Targets, m: usize, k: usize, batch: Option<&[usize]>) -> Result<Vec<f64>> {
    let mut g = vec![0.0; m * k];
    let all: Vec<usize>;
    let rows: &[usize] = match batch {
        Some(b) => b,
        None => {
            all = (0..m).collect();
            &all
        }
    };
    let n = rows.len().max(1) as f64;
    match (loss, targets) {
        (LossKind::CrossEntropy, Targets::Labels(y)) => {
            for &i in rows {
                g[i * k + y[i]] = -1.0 / n;
            }
        }
        (LossKind::Mse, Targets::Values(v)) => {
            let scale = 2.0 / (n * k as f64);
            for &i in rows {
                for c in 0..k {
                    g[i * k + c] = scale * (f_train[i * k + c] - v[i * k + c]);
                }
            }
        }
        _ => return Err(Error::Data("loss and targets do not match (cross-entropy needs labels, mse values)".into())),
    }
    Ok(g)
}

/// Row points whose quadrature nodes are evaluated and folded into the Gram together: bounds the
/// node data held at once (a kink-rich step can need 100+ gradient evaluations per point).
const NODE_CHUNK_POINTS: usize = 32;

/// Test-side nodes of one step for all row points.
struct RowNodes {
    point: Vec<usize>,
    weight: Vec<f64>,
    evals: Evals,
    evaluations: Vec<usize>,
    jvp_evaluations: Vec<usize>,
    pieces: Vec<usize>,
    unconverged: usize,
}

fn gather_rows(x: &[f64], d: usize, idx: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(idx.len() * d);
    for &p in idx {
        out.extend_from_slice(&x[p * d..(p + 1) * d]);
    }
    out
}

fn gather_offsets(off: Option<&[f64]>, k: usize, idx: &[usize]) -> Option<Vec<f64>> {
    off.map(|o| {
        let mut v = Vec::with_capacity(idx.len() * k);
        for &p in idx {
            v.extend_from_slice(&o[p * k..(p + 1) * k]);
        }
        v
    })
}

/// Nodes of a fixed rule (the same for every point).
fn fixed_nodes(step: &MlpStep, x: &[f64], p: usize, off: Option<&[f64]>, nodes: &[(f64, f64)]) -> RowNodes {
    let d = step.input_dim();
    let k = step.k;
    let mut point = Vec::with_capacity(p * nodes.len());
    let mut weight = Vec::with_capacity(p * nodes.len());
    let mut t = Vec::with_capacity(p * nodes.len());
    for pi in 0..p {
        for &(tq, wq) in nodes {
            point.push(pi);
            weight.push(wq);
            t.push(tq);
        }
    }
    let xr = gather_rows(x, d, &point);
    let offr = gather_offsets(off, k, &point);
    let evals = step.eval(&xr, &t, offr.as_deref(), true);
    RowNodes { point, weight, evals, evaluations: vec![nodes.len(); p], jvp_evaluations: vec![0; p], pieces: vec![1; p], unconverged: 0 }
}

/// Rows per forward-mode evaluation in the node search (bounds its scratch to a few MB).
const JVP_CHUNK: usize = 2048;

/// `step.jvp` at points `idx` (rows of `x`) and times `t`, in chunks of [`JVP_CHUNK`] rows.
fn jvp_rows<S: AlongPath>(step: &S, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (d, k) = (step.input_dim(), step.outputs());
    let mut f = Vec::with_capacity(idx.len() * k);
    let mut fdot = Vec::with_capacity(idx.len() * k);
    for (ic, tc) in idx.chunks(JVP_CHUNK).zip(t.chunks(JVP_CHUNK)) {
        let (a, b) = step.jvp(&gather_rows(x, d, ic), tc, gather_offsets(off, k, ic).as_deref());
        f.extend_from_slice(&a);
        fdot.extend_from_slice(&b);
    }
    (f, fdot)
}

/// `step.eval` with gradients at points `idx` (rows of `x`) and times `t`, in chunks of
/// [`JVP_CHUNK`] rows (bounds the evaluation's intermediates; the result is the same).
fn eval_rows(step: &MlpStep, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> Evals {
    let (d, k) = (step.input_dim(), step.k);
    if idx.len() <= JVP_CHUNK {
        return step.eval(&gather_rows(x, d, idx), t, gather_offsets(off, k, idx).as_deref(), true);
    }
    let mut out = Evals::default();
    for (ic, tc) in idx.chunks(JVP_CHUNK).zip(t.chunks(JVP_CHUNK)) {
        let e = step.eval(&gather_rows(x, d, ic), tc, gather_offsets(off, k, ic).as_deref(), true);
        if out.acts.is_empty() {
            out.acts = vec![Vec::new(); e.acts.len()];
            out.deltas = vec![Vec::new(); e.deltas.len()];
        }
        out.rows += e.rows;
        out.acts.iter_mut().zip(&e.acts).for_each(|(a, b)| a.extend_from_slice(b));
        out.deltas.iter_mut().zip(&e.deltas).for_each(|(a, b)| a.extend_from_slice(b));
        out.f.extend_from_slice(&e.f);
        out.jvp.extend_from_slice(&e.jvp);
    }
    out
}

/// Gauss orders tried in turn on a piece before it is bisected, and the bisection limit.
const AUTO_ORDERS: [usize; 8] = [2, 3, 4, 5, 6, 8, 10, 12];
const AUTO_MAX_DEPTH: u32 = 40;

struct Piece {
    p: usize,
    a: f64,
    b: f64,
    fa: Vec<f64>,
    fb: Vec<f64>,
    order: usize,
    depth: u32,
}

/// The adaptive, kink-aware rule. Each step is split at the kinks of every row point; each
/// smooth piece `[a, b]` gets the smallest Gauss–Legendre order (from [`AUTO_ORDERS`]) whose
/// quadrature of `d/dt f` matches the exact change `f(b) − f(a)` to `tol_step·(b − a)` (or to
/// the rounding floor of that difference); pieces that fail every order are bisected. The
/// search uses forward-mode evaluations only (`f` and `df/dt`, no backward pass); gradients are
/// then computed once, at the accepted nodes.
fn auto_nodes(step: &MlpStep, x: &[f64], p: usize, off: Option<&[f64]>, tol_step: f64) -> RowNodes {
    let c = choose_auto_nodes(step, x, p, off, tol_step);
    // Gradients once, at the accepted nodes.
    let evals = eval_rows(step, x, off, &c.point, &c.times);
    RowNodes { point: c.point, weight: c.weight, evals, evaluations: c.evaluations, jvp_evaluations: c.jvp_evaluations, pieces: c.pieces, unconverged: c.unconverged }
}

/// What the adaptive rule needs of a network along one step: its kinks in t and forward-mode
/// `(f, df/dt)` (`x` `[R, d]`, `t` `[R]`, `off` `[R, K]`).
trait AlongPath {
    fn input_dim(&self) -> usize;
    fn outputs(&self) -> usize;
    fn kinks(&self, x: &[f64], a: f64, b: f64) -> Vec<f64>;
    fn jvp(&self, x: &[f64], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>);
}

impl AlongPath for MlpStep {
    fn input_dim(&self) -> usize {
        MlpStep::input_dim(self)
    }
    fn outputs(&self) -> usize {
        self.k
    }
    fn kinks(&self, x: &[f64], a: f64, b: f64) -> Vec<f64> {
        MlpStep::kinks(self, x, a, b)
    }
    fn jvp(&self, x: &[f64], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        MlpStep::jvp(self, x, t, off)
    }
}

/// Nodes chosen by the auto rule: node j of point `point[j]` at `times[j]` with `weight[j]`.
struct AutoNodes {
    point: Vec<usize>,
    weight: Vec<f64>,
    times: Vec<f64>,
    evaluations: Vec<usize>,
    jvp_evaluations: Vec<usize>,
    pieces: Vec<usize>,
    unconverged: usize,
}

/// The node search of [`auto_nodes`], for any network with [`AlongPath`].
fn choose_auto_nodes<S: AlongPath>(step: &S, x: &[f64], p: usize, off: Option<&[f64]>, tol_step: f64) -> AutoNodes {
    let d = step.input_dim();
    let k = step.outputs();
    let mut bps: Vec<Vec<f64>> = Vec::with_capacity(p);
    for pi in 0..p {
        let mut v = vec![0.0];
        v.extend(step.kinks(&x[pi * d..(pi + 1) * d], 0.0, 1.0));
        v.push(1.0);
        bps.push(v);
    }
    let mut idx = Vec::new();
    let mut tt = Vec::new();
    for (pi, v) in bps.iter().enumerate() {
        for &t in v {
            idx.push(pi);
            tt.push(t);
        }
    }
    let fv = jvp_rows(step, x, off, &idx, &tt).0;
    let mut pending: Vec<Piece> = Vec::new();
    let mut pos = 0;
    for (pi, v) in bps.iter().enumerate() {
        for j in 0..v.len() - 1 {
            pending.push(Piece {
                p: pi,
                a: v[j],
                b: v[j + 1],
                fa: fv[(pos + j) * k..(pos + j + 1) * k].to_vec(),
                fb: fv[(pos + j + 1) * k..(pos + j + 2) * k].to_vec(),
                order: 0,
                depth: 0,
            });
        }
        pos += v.len();
    }
    let mut point = Vec::new();
    let mut weight = Vec::new();
    let mut times = Vec::new();
    let mut pieces = vec![0usize; p];
    let mut jvp_evals = vec![0usize; p];
    let mut unconverged = 0;
    while !pending.is_empty() {
        let mut rp = Vec::new();
        let mut rt = Vec::new();
        let mut rw = Vec::new();
        let mut start = Vec::with_capacity(pending.len());
        for pc in &pending {
            start.push(rt.len());
            let n = AUTO_ORDERS[pc.order];
            for (tq, wq) in quadrature::gauss_legendre_01(n, pc.a, pc.b) {
                rp.push(pc.p);
                rt.push(tq);
                rw.push(wq);
            }
            jvp_evals[pc.p] += n;
        }
        let (_, fdot) = jvp_rows(step, x, off, &rp, &rt);
        let mut next: Vec<Piece> = Vec::new();
        let mut to_split: Vec<Piece> = Vec::new();
        for (j, pc) in pending.into_iter().enumerate() {
            let n = AUTO_ORDERS[pc.order];
            let rows = start[j]..start[j] + n;
            let mut err: f64 = 0.0;
            let mut scale: f64 = 1.0;
            for c in 0..k {
                let q: f64 = rows.clone().map(|r| rw[r] * fdot[r * k + c]).sum();
                err = err.max((q - (pc.fb[c] - pc.fa[c])).abs());
                scale = scale.max(pc.fa[c].abs()).max(pc.fb[c].abs());
            }
            let thr = (tol_step * (pc.b - pc.a)).max(8.0 * f64::EPSILON * scale);
            let accept = |point: &mut Vec<usize>, weight: &mut Vec<f64>, times: &mut Vec<f64>| {
                for r in rows.clone() {
                    point.push(rp[r]);
                    weight.push(rw[r]);
                    times.push(rt[r]);
                }
            };
            if err <= thr {
                accept(&mut point, &mut weight, &mut times);
                pieces[pc.p] += 1;
            } else if pc.order + 1 < AUTO_ORDERS.len() {
                next.push(Piece { order: pc.order + 1, ..pc });
            } else if pc.depth < AUTO_MAX_DEPTH && pc.b - pc.a > 1e-12 {
                to_split.push(pc);
            } else {
                accept(&mut point, &mut weight, &mut times);
                pieces[pc.p] += 1;
                unconverged += 1;
            }
        }
        if !to_split.is_empty() {
            let mids: Vec<f64> = to_split.iter().map(|pc| 0.5 * (pc.a + pc.b)).collect();
            let pidx: Vec<usize> = to_split.iter().map(|pc| pc.p).collect();
            let fm = jvp_rows(step, x, off, &pidx, &mids).0;
            for (j, pc) in to_split.into_iter().enumerate() {
                let fmj = fm[j * k..(j + 1) * k].to_vec();
                next.push(Piece { p: pc.p, a: pc.a, b: mids[j], fa: pc.fa.clone(), fb: fmj.clone(), order: 0, depth: pc.depth + 1 });
                next.push(Piece { p: pc.p, a: mids[j], b: pc.b, fa: fmj, fb: pc.fb, order: 0, depth: pc.depth + 1 });
            }
        }
        pending = next;
    }
    let mut evaluations = vec![0usize; p];
    for &pi in &point {
        evaluations[pi] += 1;
    }
    AutoNodes { point, weight, times, evaluations, jvp_evaluations: jvp_evals, pieces, unconverged }
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
        if self.dim == 0 {
            0
        } else {
            self.x.len() / self.dim
        }
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
    let (p, m, k, n) = (p as u64, m as u64, k as u64, steps as u64);
    let g = p * m * k * k * 8;
    g + if per_step { g * n } else { 0 } + p * k * k * 8 + n * m * k * 8 + 4 * p * k * 8
}

/// Computes a kernel over the recorded path between row points and the training set, with the
/// kernel machine and its per-step validation.
///
/// `states` are `w_0 … w_N`. MLPs use the structured fast path; other architectures the
/// generic autodiff path (fixed quadrature rules only). Runs trained with Adam(W) need their
/// recorded preconditioners: use [`compute_run`] for them.
pub fn compute(
    manifest: &Manifest,
    train: &crate::data::Dataset,
    states: &[Params],
    rows: &Points,
    req: &KernelRequest,
    memory_budget: u64,
    progress: &dyn Fn(usize, usize),
) -> Result<KernelOutput> {
    compute_inner(manifest, train, states, None, rows, req, memory_budget, progress, GramPath::Fast)
}

/// [`compute`] for a run on disk: also loads what the run recorded besides its states (Adam's
/// preconditioners), so it works for every optimizer.
pub fn compute_run(
    run: &crate::trajectory::Run,
    states: &[Params],
    rows: &Points,
    req: &KernelRequest,
    memory_budget: u64,
    progress: &dyn Fn(usize, usize),
) -> Result<KernelOutput> {
    let precond = run.load_preconditioners()?;
    compute_inner(&run.manifest, &run.dataset, states, precond.as_deref(), rows, req, memory_budget, progress, GramPath::Fast)
}

/// Which Gram path a CNN takes (MLPs always take the structured one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GramPath {
    /// The structured path ([`convgram`] for CNNs); any quadrature rule.
    Fast,
    /// The generic autodiff path ([`generic`], the reference); fixed rules only.
    Generic,
}

/// [`compute`] with the CNN's Gram path chosen: [`GramPath::Generic`] forces the autodiff
/// reference (benchmarks, differential tests).
#[allow(clippy::too_many_arguments)]
pub fn compute_with_path(
    manifest: &Manifest,
    train: &crate::data::Dataset,
    states: &[Params],
    rows: &Points,
    req: &KernelRequest,
    memory_budget: u64,
    progress: &dyn Fn(usize, usize),
    path: GramPath,
) -> Result<KernelOutput> {
    compute_inner(manifest, train, states, None, rows, req, memory_budget, progress, path)
}

#[allow(clippy::too_many_arguments)]
fn compute_inner(
    manifest: &Manifest,
    train: &crate::data::Dataset,
    states: &[Params],
    precond: Option<&[Vec<f64>]>,
    rows: &Points,
    req: &KernelRequest,
    memory_budget: u64,
    progress: &dyn Fn(usize, usize),
    path: GramPath,
) -> Result<KernelOutput> {
    let start = Instant::now();
    let arch = &manifest.architecture;
    let n = manifest.steps;
    if states.len() != n + 1 {
        return Err(Error::Data(format!("{} states for {} steps", states.len(), n)));
    }
    if rows.dim != arch.input_dim() {
        return Err(Error::ShapeMismatch { what: "row points".into(), expected: vec![arch.input_dim()], got: vec![rows.dim] });
    }
    if rows.is_empty() {
        return Err(Error::Data("no row points".into()));
    }
    if let Some(i) = rows.x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!("row point value {i} is not finite")));
    }
    let (p, m, k, d) = (rows.len(), train.n_train(), arch.outputs(), rows.dim);
    let out_bytes = output_bytes(p, m, k, n, req.per_step);
    if out_bytes > memory_budget {
        return Err(Error::OutOfMemoryBudget {
            what: format!("the {} Gram [{p}, {m}, {k}, {k}]{}", req.kind, if req.per_step { " with per-step Grams" } else { "" }),
            needed_bytes: out_bytes,
            budget_bytes: memory_budget,
            hint: "use fewer points (--points), drop --per-step, or raise --memory".into(),
        });
    }
    let structured = matches!(arch.body, Body::Mlp { .. });
    let conv_fast = path == GramPath::Fast && matches!(arch.body, Body::Cnn { .. });
    if !structured && !conv_fast && matches!(req.rule, Rule::Auto(_)) && matches!(req.kind, KernelKind::Epk | KernelKind::Kprime) {
        return Err(Error::Config(
            "the auto quadrature needs the structured (MLP) path; use a fixed rule such as gauss:16 for this architecture".into(),
        ));
    }
    let init = &states[0];
    let values = |state: &Params, x: &[f64], off: Option<&[f64]>| -> Result<Vec<f64>> {
        if structured {
            let z = vec![0.0; x.len() / d];
            Ok(MlpStep::new(arch, state, None)?.eval(x, &z, off, false).f)
        } else {
            arch.forward(state, Some(init), x)
        }
    };
    let off_rows = if arch.zero_output { Some(arch.raw_forward(init, &rows.x)) } else { None };
    let off_train = if arch.zero_output { Some(arch.raw_forward(init, &train.x_train)) } else { None };
    let zeros_m = vec![0.0; m];
    // The steps summed: all by default, or [s0, s1) (then b = f_{w_{s0}}, network = f_{w_{s1}}).
    let (s0, s1) = match req.steps {
        None => (0, n),
        Some((a0, b0)) => {
            if a0 >= b0 || b0 > n {
                return Err(Error::Config(format!("--steps {a0}:{b0}: need 0 <= A < B <= {n}")));
            }
            (a0, b0)
        }
    };
    let (lo, hi) = (s0, s1);
    let rule = crate::optim::UpdateRule::of(&manifest.optimizer);
    if !rule.is_plain() {
        let setup = stateful::Setup {
            manifest,
            train,
            states,
            rows,
            req,
            rule,
            structured,
            integrate: match req.kind {
                KernelKind::Epk => req.side == Side::Test,
                KernelKind::Kprime => true,
                _ => false,
            },
            tol_step: match req.rule {
                Rule::Auto(tol) => tol / n.max(1) as f64,
                _ => 0.0,
            },
            lo,
            hi,
            off_rows,
            off_train,
            budget: memory_budget,
            start,
            precond,
        };
        return stateful::compute(&setup, progress);
    }
    // Network values at the states used, and a_{i,s} (zero outside the steps summed).
    let mut f_rows: Vec<Vec<f64>> = vec![Vec::new(); n + 1];
    let mut a = vec![0.0; n * m * k];
    let mut lossgrads: Vec<Vec<f64>> = vec![Vec::new(); n];
    let batches = manifest.batches();
    for s in lo..=hi {
        f_rows[s] = values(&states[s], &rows.x, off_rows.as_deref())?;
        if s < hi {
            let ft = values(&states[s], &train.x_train, off_train.as_deref())?;
            let g = loss_gradient(manifest.loss, &ft, &train.y_train, m, k, batches.as_ref().map(|b| b[s].as_slice()))?;
            let eps = manifest.learning_rates[s];
            for idx in 0..m * k {
                a[s * m * k + idx] = match req.kind {
                    KernelKind::Chen => -eps * g[idx].signum() * if g[idx] == 0.0 { 0.0 } else { 1.0 },
                    _ => -eps * g[idx],
                };
            }
            if req.kind == KernelKind::Chen {
                // Only Chen's kernel needs ∂L/∂f beside a (its a is −ε·sign(∂L/∂f)).
                lossgrads[s] = g;
            }
        }
    }
    let bias = f_rows[lo].clone();
    let network = f_rows[hi].clone();
    let steps: Vec<usize> = match req.kind {
        KernelKind::Ntk => {
            let s = req.ntk_step.unwrap_or(n);
            if s > n {
                return Err(Error::Config(format!("--step {s} is beyond the last state {n}")));
            }
            vec![s]
        }
        _ => (s0..s1).collect(),
    };
    let integrate = match req.kind {
        KernelKind::Epk => req.side == Side::Test,
        KernelKind::Kprime => true,
        _ => false,
    };
    let gsize = p * m * k * k;
    // Structured steps accumulate in factor form; the generic path and per-step Grams add here.
    let mut extra: Option<Vec<f64>> = None;
    let mut acc = if structured && !req.per_step { Some(GramAccumulator::new(p, m, k, arch.bias)) } else { None };
    let mut per_step = if req.per_step { Some(Vec::with_capacity(gsize * steps.len())) } else { None };
    let mut machine = bias.clone();
    let mut records = Vec::with_capacity(steps.len());
    let want_diag = matches!(req.kind, KernelKind::Ntk | KernelKind::Dpk | KernelKind::Epk);
    let mut diag = vec![0.0; p * k * k];
    let tol_step = match req.rule {
        Rule::Auto(tol) => tol / n.max(1) as f64,
        _ => 0.0,
    };
    for (count, &s) in steps.iter().enumerate() {
        progress(count, steps.len());
        let next = if s < n && integrate { Some(&states[s + 1]) } else { None };
        let fixed = if integrate { req.rule.fixed_nodes() } else { Some(vec![(0.0, 1.0)]) };
        let mut cosine = f64::NAN;
        // The effective training weights of this step: a_{i,s} (Chen: a·|∂L/∂f| = −ε ∂L/∂f).
        let a_eff: Vec<f64> = if req.kind == KernelKind::Ntk {
            vec![0.0; m * k]
        } else {
            match req.kind {
                KernelKind::Chen => lossgrads[s].iter().map(|g| -manifest.learning_rates[s] * g).collect(),
                _ => a[s * m * k..(s + 1) * m * k].to_vec(),
            }
        };
        let colw: Option<Vec<f64>> = if req.kind == KernelKind::Chen { Some(lossgrads[s].iter().map(|v| v.abs()).collect()) } else { None };
        let (pred, evaluations, jvp_evaluations, pieces, unconverged) = if structured {
            let step = MlpStep::new(arch, &states[s], next)?;
            let tr = step.eval(&train.x_train, &zeros_m, off_train.as_deref(), true);
            let train_layers: Vec<LayerFactors<'_>> = step
                .layers
                .iter()
                .enumerate()
                .map(|(l, layer)| LayerFactors { acts: &tr.acts[l], deltas: &tr.deltas[l], n_in: layer.n_in, n_out: layer.n_out })
                .collect();
            let v = gram::prediction_weights(&train_layers, &a_eff, m, k, arch.bias);
            let mut one = if acc.is_none() { Some(GramAccumulator::new(p, m, k, arch.bias)) } else { None };
            let target = match acc.as_mut() {
                Some(a) => a,
                None => one.as_mut().expect("created above"),
            };
            let mut pred = vec![0.0; p * k];
            let (mut evaluations, mut jvp_evaluations, mut pieces, mut unconverged) = (Vec::with_capacity(p), Vec::with_capacity(p), Vec::with_capacity(p), 0);
            let (mut cos_sum, mut cos_count) = (0.0, 0usize);
            // Row points in chunks: the node data of one chunk is all that is held at once.
            for c0 in (0..p).step_by(NODE_CHUNK_POINTS) {
                let pc = NODE_CHUNK_POINTS.min(p - c0);
                let xc = &rows.x[c0 * d..(c0 + pc) * d];
                let offc = off_rows.as_deref().map(|o| &o[c0 * k..(c0 + pc) * k]);
                let mut nodes = match &fixed {
                    Some(nodes) => fixed_nodes(&step, xc, pc, offc, nodes),
                    None => auto_nodes(&step, xc, pc, offc, tol_step),
                };
                if integrate {
                    let (sum, count) = dpk_cosine_error(&step, &nodes, xc, offc, pc);
                    cos_sum += sum;
                    cos_count += count;
                }
                nodes.point.iter_mut().for_each(|q| *q += c0);
                let layers: Vec<(LayerFactors<'_>, LayerFactors<'_>)> = step
                    .layers
                    .iter()
                    .enumerate()
                    .map(|(l, layer)| {
                        (
                            LayerFactors { acts: &nodes.evals.acts[l], deltas: &nodes.evals.deltas[l], n_in: layer.n_in, n_out: layer.n_out },
                            LayerFactors { acts: &tr.acts[l], deltas: &tr.deltas[l], n_in: layer.n_in, n_out: layer.n_out },
                        )
                    })
                    .collect();
                target.add_step(&layers, &rows.x, &nodes.point, &nodes.weight, colw.as_deref(), c0..c0 + pc);
                let row_layers: Vec<LayerFactors<'_>> =
                    layers.iter().map(|(r, _)| LayerFactors { acts: r.acts, deltas: r.deltas, n_in: r.n_in, n_out: r.n_out }).collect();
                gram::add_prediction(&mut pred, &row_layers, &v, &nodes.point, &nodes.weight, k, arch.bias);
                if want_diag {
                    gram::add_self_kernel(&mut diag, &row_layers, &nodes.point, &nodes.weight, k, arch.bias);
                }
                evaluations.extend_from_slice(&nodes.evaluations);
                jvp_evaluations.extend_from_slice(&nodes.jvp_evaluations);
                pieces.extend_from_slice(&nodes.pieces);
                unconverged += nodes.unconverged;
            }
            if let Some(one) = one {
                let gs = one.finish();
                add_into(&mut extra, &gs);
                if let Some(ps) = per_step.as_mut() {
                    ps.extend_from_slice(&gs);
                }
            }
            if integrate {
                cosine = if cos_count == 0 { f64::NAN } else { cos_sum / cos_count as f64 };
            }
            (pred, evaluations, jvp_evaluations, pieces, unconverged)
        } else {
            let mut gs = vec![0.0; gsize];
            let stats = if conv_fast {
                convgram::step(arch, &states[s], next, &rows.x, off_rows.as_deref(), fixed.as_deref(), tol_step, &train.x_train, off_train.as_deref(), &mut gs, &mut diag)?
            } else {
                let nodes = fixed.expect("auto rejected above for the generic path");
                generic::step_gram(arch, &states[s], next, init, &rows.x, &nodes, &train.x_train, &mut gs, &mut diag)?;
                convgram::NodeStats { evaluations: vec![nodes.len(); p], jvp_evaluations: vec![0; p], pieces: vec![1; p], unconverged: 0 }
            };
            let pred = contract(&gs, &a_eff, p, m, k);
            if let Some(cw) = &colw {
                for (c, v) in gs.iter_mut().enumerate() {
                    let (i, ks) = ((c / (k * k)) % m, c % k);
                    *v *= cw[i * k + ks];
                }
            }
            add_into(&mut extra, &gs);
            if let Some(ps) = per_step.as_mut() {
                ps.extend_from_slice(&gs);
            }
            (pred, stats.evaluations, stats.jvp_evaluations, stats.pieces, stats.unconverged)
        };
        // Predicted change over this step vs the network's actual change.
        let mut rec = StepRecord { step: s, ..Default::default() };
        if req.kind != KernelKind::Ntk {
            let (mut mx, mut sum, mut ch) = (0.0f64, 0.0, 0.0f64);
            for pi in 0..p {
                for kt in 0..k {
                    let actual = f_rows[s + 1][pi * k + kt] - f_rows[s][pi * k + kt];
                    let e = (pred[pi * k + kt] - actual).abs();
                    mx = mx.max(e);
                    sum += e;
                    ch = ch.max(actual.abs());
                    machine[pi * k + kt] += pred[pi * k + kt];
                }
            }
            rec.max_abs_error = mx;
            rec.mean_abs_error = sum / (p * k) as f64;
            rec.max_abs_change = ch;
        }
        rec.mean_evaluations = evaluations.iter().sum::<usize>() as f64 / p as f64;
        rec.max_evaluations = evaluations.iter().copied().max().unwrap_or(0);
        rec.mean_jvp_evaluations = jvp_evaluations.iter().sum::<usize>() as f64 / p as f64;
        rec.mean_pieces = pieces.iter().sum::<usize>() as f64 / p as f64;
        rec.unconverged_pieces = unconverged;
        rec.dpk_cosine_error = cosine;
        records.push(rec);
    }
    let gram = match (acc, extra) {
        (Some(acc), None) => acc.finish(),
        (Some(acc), Some(e)) => {
            let mut g = acc.finish();
            g.iter_mut().zip(&e).for_each(|(a, b)| *a += b);
            g
        }
        (None, Some(e)) => e,
        (None, None) => vec![0.0; gsize],
    };
    if req.kind == KernelKind::Ntk {
        // Linearised model around w_S: f ≈ b + Σ_s Σ_i a_{i,s} K_NTK(x, x_i).
        let mut asum = vec![0.0; m * k];
        for s in lo..hi {
            for idx in 0..m * k {
                asum[idx] += a[s * m * k + idx];
            }
        }
        let pred = contract(&gram, &asum, p, m, k);
        for (mv, pv) in machine.iter_mut().zip(&pred) {
            *mv += pv;
        }
        let r = &mut records[0];
        r.max_abs_error = machine.iter().zip(&network).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    }
    // Theorem 3.7: one machine when a_{i,s} does not depend on s.
    let constant_a = n > 0 && (1..n).all(|s| a[s * m * k..(s + 1) * m * k] == a[..m * k]);
    let single_machine = if constant_a && req.kind != KernelKind::Ntk {
        let pred = contract(&gram, &a[..m * k], p, m, k);
        Some(bias.iter().zip(&pred).map(|(b, v)| b + v).collect())
    } else {
        None
    };
    progress(steps.len(), steps.len());
    Ok(KernelOutput {
        kind: req.kind,
        rule: req.rule,
        side: req.side,
        integrated: integrate,
        p,
        m,
        k,
        steps,
        gram,
        per_step,
        diag: if want_diag { Some(diag) } else { None },
        a,
        bias,
        network,
        machine,
        single_machine,
        records,
        seconds: start.elapsed().as_secs_f64(),
        form: KernelForm::Gradient,
        reg: None,
        decomposition_residual: None,
        rounding: None,
    })
}

/// `out[p, kt] = Σ_{i,ks} a[i, ks] G[p, i, kt, ks]`.
///
/// # Shapes
/// `g` `[P, M, K, K]`, `a` `[M, K]`; returns `[P, K]`.
pub fn contract(g: &[f64], a: &[f64], p: usize, m: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0; p * k];
    for pi in 0..p {
        for i in 0..m {
            for kt in 0..k {
                let base = ((pi * m + i) * k + kt) * k;
                let mut s = 0.0;
                for ks in 0..k {
                    s += a[i * k + ks] * g[base + ks];
                }
                out[pi * k + kt] += s;
            }
        }
    }
    out
}

fn add_into(dst: &mut Option<Vec<f64>>, src: &[f64]) {
    match dst {
        Some(d) => d.iter_mut().zip(src).for_each(|(a, b)| *a += b),
        None => *dst = Some(src.to_vec()),
    }
}

/// The paper's Fig. 2 measure for one step: its sum over points and classes (and their count) of
/// `1 − cos(∇f_{w_s}(x), ∫∇f_{w_s(t)}(x) dt)`, from the structured factors (layer 0 in its
/// rank-one form, deeper layers by forming the t-averaged layer gradient).
fn dpk_cosine_error(step: &MlpStep, nodes: &RowNodes, x: &[f64], off: Option<&[f64]>, p: usize) -> (f64, usize) {
    let k = step.k;
    let zeros = vec![0.0; p];
    let at0 = step.eval(x, &zeros, off, true);
    let bias = if step.bias { 1.0 } else { 0.0 };
    let mut dot = vec![0.0; p * k];
    let mut n0 = vec![0.0; p * k];
    let mut nbar = vec![0.0; p * k];
    let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); p];
    for (r, &pi) in nodes.point.iter().enumerate() {
        rows_of[pi].push(r);
    }
    for (l, layer) in step.layers.iter().enumerate() {
        let (ni, no) = (layer.n_in, layer.n_out);
        let mut jbar = vec![0.0; no * (ni + 1)];
        let mut dbar = vec![0.0; no];
        for pi in 0..p {
            let a0 = &at0.acts[l][pi * ni..(pi + 1) * ni];
            let aa00: f64 = a0.iter().map(|v| v * v).sum::<f64>() + bias;
            for kt in 0..k {
                let idx = pi * k + kt;
                let d0 = &at0.deltas[l][(pi * k + kt) * no..(pi * k + kt + 1) * no];
                n0[idx] += d0.iter().map(|v| v * v).sum::<f64>() * aa00;
                if l == 0 {
                    dbar.iter_mut().for_each(|v| *v = 0.0);
                    for &r in &rows_of[pi] {
                        let dr = &nodes.evals.deltas[0][(r * k + kt) * no..(r * k + kt + 1) * no];
                        for (a, b) in dbar.iter_mut().zip(dr) {
                            *a += nodes.weight[r] * b;
                        }
                    }
                    dot[idx] += dbar.iter().zip(d0).map(|(a, b)| a * b).sum::<f64>() * aa00;
                    nbar[idx] += dbar.iter().map(|v| v * v).sum::<f64>() * aa00;
                } else {
                    jbar.iter_mut().for_each(|v| *v = 0.0);
                    for &r in &rows_of[pi] {
                        let ar = &nodes.evals.acts[l][r * ni..(r + 1) * ni];
                        let dr = &nodes.evals.deltas[l][(r * k + kt) * no..(r * k + kt + 1) * no];
                        let wr = nodes.weight[r];
                        for o in 0..no {
                            let c = wr * dr[o];
                            let row = &mut jbar[o * (ni + 1)..(o + 1) * (ni + 1)];
                            for i in 0..ni {
                                row[i] += c * ar[i];
                            }
                            row[ni] += c * bias;
                        }
                    }
                    for o in 0..no {
                        let row = &jbar[o * (ni + 1)..(o + 1) * (ni + 1)];
                        let mut s = row[ni] * bias;
                        for i in 0..ni {
                            s += row[i] * a0[i];
                        }
                        dot[idx] += d0[o] * s;
                        nbar[idx] += row.iter().map(|v| v * v).sum::<f64>();
                    }
                }
            }
        }
    }
    let mut total = 0.0;
    let mut count = 0usize;
    for idx in 0..p * k {
        let den = (n0[idx] * nbar[idx]).sqrt();
        if den > 0.0 {
            total += 1.0 - (dot[idx] / den).clamp(-1.0, 1.0);
            count += 1;
        }
    }
    (total, count)
}

/// Which row points a kernel is computed at (`--points`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointsSpec {
    /// The held-out test set.
    Test,
    /// The training set.
    Train,
    /// An N×N grid over the 2-D training data (10 % margin).
    Grid(usize),
    /// The mean of the training points of each class (the EPK paper's Fig. 6 test points).
    ClassMeans,
}

impl std::str::FromStr for PointsSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "test" => Ok(PointsSpec::Test),
            "train" => Ok(PointsSpec::Train),
            "class-means" => Ok(PointsSpec::ClassMeans),
            _ => match s.strip_prefix("grid:").map(str::parse::<usize>) {
                Some(Ok(n)) if (2..=2000).contains(&n) => Ok(PointsSpec::Grid(n)),
                _ => Err(Error::Config(format!("--points `{s}`: expected test, train, class-means or grid:N with 2 <= N <= 2000"))),
            },
        }
    }
}

impl PointsSpec {
    /// The points for a dataset.
    pub fn resolve(&self, data: &crate::data::Dataset) -> Result<Points> {
        let x = match self {
            PointsSpec::Test => data.x_test.clone(),
            PointsSpec::Train => data.x_train.clone(),
            PointsSpec::Grid(n) => {
                if data.dim != 2 {
                    return Err(Error::Config(format!("--points grid:{n} needs 2-D data; this dataset has d = {}", data.dim)));
                }
                crate::data::grid_2d(&data.x_train, *n, 0.1)?
            }
            PointsSpec::ClassMeans => {
                let crate::data::Targets::Labels(y) = &data.y_train else {
                    return Err(Error::Config("--points class-means needs a classification dataset".into()));
                };
                let d = data.dim;
                let mut sums = vec![0.0; data.num_outputs * d];
                let mut counts = vec![0usize; data.num_outputs];
                for (i, &c) in y.iter().enumerate() {
                    counts[c] += 1;
                    for j in 0..d {
                        sums[c * d + j] += data.x_train[i * d + j];
                    }
                }
                let mut x = Vec::new();
                for c in 0..data.num_outputs {
                    if counts[c] > 0 {
                        x.extend(sums[c * d..(c + 1) * d].iter().map(|v| v / counts[c] as f64));
                    }
                }
                x
            }
        };
        if x.is_empty() {
            return Err(Error::Data(format!("the {self:?} point set is empty")));
        }
        Ok(Points { x, dim: data.dim })
    }
}

/// Parses a step range `A:B` (steps A ≤ s < B).
pub fn parse_step_range(s: &str) -> Result<(usize, usize)> {
    let bad = || Error::Config(format!("--steps `{s}`: expected A:B with integers 0 <= A < B"));
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let a: usize = a.trim().parse().map_err(|_| bad())?;
    let b: usize = b.trim().parse().map_err(|_| bad())?;
    if a >= b {
        return Err(bad());
    }
    Ok((a, b))
}
