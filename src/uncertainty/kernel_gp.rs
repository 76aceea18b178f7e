//! GP logit regression on the network's own kernels, as a method of the benchmark: one GP per
//! class on the class-diagonal block of a Gram computed from the recorded path (the EPK, or the
//! empirical NTK at `w_N`), the targets the network's outputs minus the bias (as
//! [`crate::report::gp_report`] does), hyper-parameters by marginal likelihood, and the
//! posterior at the points of every setting.
//!
//! - **Training Gram** ([`TrainGram`]). By default `kind` with `side = train` at the training
//!   points, class-diagonal layout: for the EPK the gradients are taken at `t = 0` on both
//!   sides (`K^{cc}_{ij} = Σ_s ⟨∇f^c_{w_s}(x_i), ∇f^c_{w_s}(x_j)⟩`, symmetric in exact
//!   arithmetic); for the NTK the empirical NTK at `w_N`. The alternative puts the training
//!   points on the test side (the EPK's integrated gradients, the rows the exact kernel machine
//!   uses) and symmetrises that non-symmetric Gram. Each class block is symmetrised,
//!   `(K + Kᵀ)/2`, and its relative asymmetry before that is reported.
//! - **Outputs.** The kernels are on the network's logits (`KernelGpSpec::outputs`, the
//!   benchmark's choice since the function-space Laplace methods share the Grams; the log-softmax
//!   outputs of the paper's §4.2 are the other choice).
//! - **Targets.** `y_i^c = f^c_{w_N}(x_i) − f^c_{w_0}(x_i)` (the outputs minus the bias
//!   `b = f_{w_0}`, the part the kernel machine carries).
//! - **Rows.** `kind` with `side = test` at a setting's points (the EPK's test-side gradients
//!   integrated over every step by the quadrature `rule`), class-diagonal layout, with the
//!   self-kernel `K^{cc}(x, x)` as the prior variance; the posterior mean gets the bias
//!   `f_{w_0}(x)` back.
//!
//! Every Gram is computed in memory ([`crate::kernel::compute`]) and checked: its kernel
//! machine against the network ([`GramCheck`]).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::gp::{FittedGp, GpParams, Posterior};
use crate::kernel::{self, KernelKind, KernelOutput, Layout, Outputs, Points, Request, Rule, Side};
use crate::model::Params;
use crate::trajectory::Run;

/// Which training Gram the GP is fitted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrainGram {
    /// `side = train` at the training points (the EPK's gradients at `t = 0` on both sides;
    /// the NTK at `w_N`): symmetric up to rounding.
    TrainSide,
    /// The training points as test-side rows (the EPK's integrated gradients), a Gram that is
    /// not symmetric, symmetrised `(K + Kᵀ)/2`.
    SymmetrisedTestSide,
}

/// Which kernel the GP uses and how it is fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelGpSpec {
    /// `epk` (summed over the path) or `ntk` (at the last state).
    pub kind: KernelKind,
    /// Quadrature of the EPK's test-side rows (ignored by the NTK).
    pub rule: Rule,
    /// GP estimator parameters (the benchmark fits σ² and s by marginal likelihood).
    pub params: GpParams,
    /// The training Gram.
    pub train_gram: TrainGram,
    /// The outputs the kernel is on (the benchmark: the logits).
    pub outputs: Outputs,
    /// Only the last L steps of the path (the path kernel's `window:L`); `None`: every step.
    pub window: Option<usize>,
}

impl KernelGpSpec {
    /// The EPK with the quadrature `rule`, the train-side training Gram and hyper-parameters by
    /// marginal likelihood.
    pub fn epk(rule: Rule) -> Self {
        KernelGpSpec { kind: KernelKind::Epk, rule, params: GpParams::new().fit_hyper(true), train_gram: TrainGram::TrainSide, outputs: Outputs::Logits, window: None }
    }
    /// The empirical NTK at the last state, hyper-parameters by marginal likelihood.
    pub fn ntk() -> Self {
        KernelGpSpec { kind: KernelKind::Ntk, rule: Rule::Auto(1e-12), params: GpParams::new().fit_hyper(true), train_gram: TrainGram::TrainSide, outputs: Outputs::Logits, window: None }
    }
    /// The path-averaged kernel (both sides integrated with `rule`), over every step or the
    /// last `window` steps, hyper-parameters by marginal likelihood.
    pub fn path(rule: Rule, window: Option<usize>) -> Self {
        KernelGpSpec { kind: KernelKind::Path, rule, params: GpParams::new().fit_hyper(true), train_gram: TrainGram::TrainSide, outputs: Outputs::Logits, window }
    }
    /// The same with another training Gram.
    pub fn train_gram(mut self, g: TrainGram) -> Self {
        self.train_gram = g;
        self
    }
    /// A text that identifies the specification (cache keys).
    pub fn key(&self) -> String {
        let window = self.window.map(|l| format!("|window:{l}")).unwrap_or_default();
        format!("{}|{}|{}|{:?}|{}{window}", self.kind, self.rule, serde_json::to_string(&self.params).unwrap_or_default(), self.train_gram, self.outputs)
    }
    fn check(&self) -> Result<()> {
        match (self.kind, self.train_gram) {
            (KernelKind::Ntk, TrainGram::SymmetrisedTestSide) => Err(Error::Config("the NTK has no test side to symmetrise (its rows are not integrated)".into())),
            (KernelKind::Path, TrainGram::SymmetrisedTestSide) => Err(Error::Config("the path kernel's training Gram is integrated on both sides already".into())),
            (KernelKind::Epk | KernelKind::Ntk | KernelKind::Path, _) if self.window.is_none() || self.kind == KernelKind::Path => Ok(()),
            (KernelKind::Epk | KernelKind::Ntk, _) => Err(Error::Config("a window of steps is for the path kernel".into())),
            (other, _) => Err(Error::Config(format!("a kernel GP of the benchmark takes the epk, the ntk or the path kernel, not {other}"))),
        }
    }
}

/// One Gram's kernel machine against the network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GramCheck {
    /// What the rows are (`train` or a setting name).
    pub rows: String,
    /// `train` (gradients at `t = 0`) or `test` (EPK: integrated over each step).
    pub side: Side,
    /// Row points P.
    pub points: usize,
    /// Steps summed (1 for the NTK).
    pub steps: usize,
    /// max |kernel machine − network| over the rows and classes.
    pub max_abs_error: f64,
    /// mean |kernel machine − network|.
    pub mean_abs_error: f64,
    /// Gradient evaluations per point and step, mean over steps (1 without quadrature).
    pub mean_evaluations: f64,
    /// The most evaluations one point needed in one step.
    pub max_evaluations: usize,
}

impl GramCheck {
    fn of(rows: &str, o: &KernelOutput) -> Self {
        GramCheck {
            rows: rows.into(),
            side: o.side,
            points: o.p,
            steps: o.steps.len(),
            max_abs_error: o.max_abs_error(),
            mean_abs_error: o.mean_abs_error(),
            mean_evaluations: o.mean_evaluations(),
            max_evaluations: o.max_evaluations(),
        }
    }
}

/// The fitted GP's numbers, for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelGpFit {
    /// `epk` or `ntk`.
    pub kind: String,
    /// The quadrature of the rows (`none` for the NTK).
    pub quadrature: String,
    /// The training Gram.
    pub train_gram: TrainGram,
    /// Noise variance σ² per class. # Shapes `[K]`.
    pub noise: Vec<f64>,
    /// Output scale s per class. # Shapes `[K]`.
    pub output_scale: Vec<f64>,
    /// Jitter added on top of σ² per class. # Shapes `[K]`.
    pub jitter: Vec<f64>,
    /// Log marginal likelihood per class. # Shapes `[K]`.
    pub log_marginal_likelihood: Vec<f64>,
    /// Mean diagonal of each class block of the training Gram. # Shapes `[K]`.
    pub mean_diag: Vec<f64>,
    /// Relative asymmetry `max|K_ij − K_ji| / max|K|` of each class block before
    /// symmetrisation. # Shapes `[K]`.
    pub asymmetry: Vec<f64>,
    /// The training Gram's kernel machine against the network.
    pub train_check: GramCheck,
}

/// A per-class GP fitted on a kernel of a recorded run, ready to predict at new points.
#[derive(Clone, Debug)]
pub struct KernelGp {
    spec: KernelGpSpec,
    fitted: FittedGp,
    /// The fit's numbers.
    pub fit: KernelGpFit,
    /// Seconds of the training Gram and of the GP fit.
    pub seconds: (f64, f64),
}

fn points(x: &[f64], dim: usize) -> Points {
    Points { x: x.to_vec(), dim }
}

fn rel_asymmetry(b: &[f64], m: usize) -> f64 {
    let scale = b.iter().map(|v| v.abs()).fold(0.0, kernel::nan_max);
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in i + 1..m {
            worst = kernel::nan_max(worst, (b[i * m + j] - b[j * m + i]).abs());
        }
    }
    if scale > 0.0 {
        worst / scale
    } else {
        worst
    }
}

impl KernelGp {
    /// Computes the training Gram of `spec.kind` on the run's training points and fits one GP
    /// per class (module docs). `progress(done, total)` follows the kernel's steps.
    ///
    /// Errors: a kind other than epk/ntk, a regression run, and every error of the kernel
    /// engine and of [`GpParams::fit`].
    ///
    /// # Shapes
    /// `states`: the run's `w_0 … w_N`.
    pub fn fit(run: &Run, states: &[Params], spec: &KernelGpSpec, progress: &dyn Fn(usize, usize)) -> Result<KernelGp> {
        let blocks = TrainBlocks::compute(run, states, spec, Layout::Diag, progress)?;
        Self::fit_blocks(&blocks, spec)
    }

    /// [`KernelGp::fit`] on a training Gram already computed (of `spec`'s kernel).
    pub(crate) fn fit_blocks(blocks: &TrainBlocks, spec: &KernelGpSpec) -> Result<KernelGp> {
        let (m, k) = (blocks.m, blocks.k);
        let targets: Vec<f64> = blocks.network.iter().zip(&blocks.bias).map(|(f, b)| f - b).collect();
        let t1 = Instant::now();
        let fitted = spec.params.fit(&blocks.k_train, &targets, m, k)?;
        let fit = KernelGpFit {
            kind: spec.kind.to_string(),
            quadrature: if matches!(spec.kind, KernelKind::Epk | KernelKind::Path) { spec.rule.to_string() } else { "none".into() },
            train_gram: spec.train_gram,
            noise: fitted.noise(),
            output_scale: fitted.output_scale(),
            jitter: fitted.jitter_used(),
            log_marginal_likelihood: fitted.log_marginal_likelihood(),
            mean_diag: blocks.mean_diag.clone(),
            asymmetry: blocks.asymmetry.clone(),
            train_check: blocks.check.clone(),
        };
        let seconds = (blocks.seconds, t1.elapsed().as_secs_f64());
        Ok(KernelGp { spec: spec.clone(), fitted, fit, seconds })
    }

    /// The GP's logit posterior at the rows of a [`RowGram`] of the same kernel kind (of the
    /// same run: not checked beyond shapes); the posterior mean includes the bias `f_{w_0}(x)`.
    ///
    /// # Shapes
    /// The posterior's `mean`, `var`: `[P, K]`.
    pub fn posterior(&self, rows: &RowGram) -> Result<Posterior> {
        if rows.kind != self.spec.kind {
            return Err(Error::Config(format!("a GP on the {} cannot predict from {} rows", self.spec.kind, rows.kind)));
        }
        let mut post = self.fitted.predict(&rows.k_cross, &rows.k_test_diag, rows.p)?;
        for (mv, b) in post.mean.iter_mut().zip(&rows.bias) {
            *mv += b;
        }
        Ok(post)
    }

    /// The fitted per-class GP.
    pub fn fitted(&self) -> &FittedGp {
        &self.fitted
    }
}

/// The class blocks of a training Gram on the run's training points, with the outputs there.
#[derive(Clone, Debug)]
pub(crate) struct TrainBlocks {
    /// Class blocks, each symmetrised `(K + Kᵀ)/2`. # Shapes `[K, M, M]`.
    pub k_train: Vec<f64>,
    /// `f_{w_N}(x_i)` on the kernel's outputs. # Shapes `[M, K]`.
    pub network: Vec<f64>,
    /// `f_{w_0}(x_i)`. # Shapes `[M, K]`.
    pub bias: Vec<f64>,
    /// Relative asymmetry of each class block before symmetrisation. # Shapes `[K]`.
    pub asymmetry: Vec<f64>,
    /// Mean diagonal of each class block. # Shapes `[K]`.
    pub mean_diag: Vec<f64>,
    /// The Gram's kernel machine against the network.
    pub check: GramCheck,
    /// Every class block, as computed (full layout only). # Shapes `[M, M, K, K]`.
    pub full: Option<Vec<f64>>,
    /// Training points M and classes K.
    pub m: usize,
    /// Classes K.
    pub k: usize,
    /// Seconds of the kernel computation.
    pub seconds: f64,
}

impl TrainBlocks {
    /// The training Gram of `spec` (kind, side by `spec.train_gram`, outputs) in `layout`
    /// (`diag`, or `full` for the cross-class fits: the class blocks are then taken from it and
    /// the whole Gram kept in `full`). Errors: a kind other than epk/ntk, a regression run, the
    /// `trace` layout, and every error of the kernel engine.
    pub(crate) fn compute(run: &Run, states: &[Params], spec: &KernelGpSpec, layout: Layout, progress: &dyn Fn(usize, usize)) -> Result<TrainBlocks> {
        spec.check()?;
        if !run.dataset.is_classification() {
            return Err(Error::Config("a kernel GP of the benchmark needs a classification run".into()));
        }
        let t0 = Instant::now();
        let side = match spec.train_gram {
            TrainGram::TrainSide => Side::Train,
            TrainGram::SymmetrisedTestSide => Side::Test,
        };
        if layout == Layout::Trace {
            return Err(Error::Config("a kernel GP needs the class blocks (diag or full layout)".into()));
        }
        let req = Request::new(spec.kind).rule(spec.rule).side(side).steps(window_steps(run, spec.window)?).layout(layout).outputs(spec.outputs);
        let pts = points(&run.dataset.x_train, run.dataset.dim);
        let mut o = kernel::compute(run, states, &pts, &req, progress)?;
        let (m, k) = (o.m, o.k);
        if o.p != m {
            return Err(Error::ShapeMismatch { what: "training Gram rows vs training points".into(), expected: vec![m], got: vec![o.p] });
        }
        let check = GramCheck::of("train", &o);
        let (network, bias) = (std::mem::take(&mut o.network), std::mem::take(&mut o.bias));
        Ok(TrainBlocks::from_gram(std::mem::take(&mut o.gram), layout, network, bias, check, m, k, t0.elapsed().as_secs_f64()))
    }

    /// The blocks of a computed training Gram `gram` (`[M, M, K]` in the diag layout, `[M, M, K,
    /// K]` in the full one, kept whole in `full`), with the network's outputs, the Gram's check
    /// and the computation's seconds: [`TrainBlocks::compute`]'s last step, and a study's
    /// resumption from a Gram it wrote to its cache.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_gram(gram: Vec<f64>, layout: Layout, network: Vec<f64>, bias: Vec<f64>, check: GramCheck, m: usize, k: usize, seconds: f64) -> TrainBlocks {
        let mut k_train = Vec::with_capacity(k * m * m);
        let (mut asymmetry, mut mean_diag) = (Vec::with_capacity(k), Vec::with_capacity(k));
        let at = |idx: usize, c: usize| if layout == Layout::Full { gram[(idx * k + c) * k + c] } else { gram[idx * k + c] };
        for c in 0..k {
            let mut b: Vec<f64> = (0..m * m).map(|idx| at(idx, c)).collect();
            asymmetry.push(rel_asymmetry(&b, m));
            mean_diag.push((0..m).map(|i| b[i * m + i]).sum::<f64>() / m as f64);
            for i in 0..m {
                for j in i + 1..m {
                    let v = 0.5 * (b[i * m + j] + b[j * m + i]);
                    b[i * m + j] = v;
                    b[j * m + i] = v;
                }
            }
            k_train.extend(b);
        }
        // The whole Gram is kept as computed (moved, not copied: it is the largest array here).
        let full = (layout == Layout::Full).then_some(gram);
        TrainBlocks { k_train, network, bias, asymmetry, mean_diag, check, full, m, k, seconds }
    }
}

/// The step range of the last `window` steps (`None`: every step). Errors: 0 or more steps than
/// the run has.
fn window_steps(run: &Run, window: Option<usize>) -> Result<Option<(usize, usize)>> {
    let n = run.manifest.steps;
    match window {
        None => Ok(None),
        Some(l) if l == 0 || l > n => Err(Error::Config(format!("window:{l}: need 1 <= L <= {n} (the run's steps)"))),
        Some(l) => Ok(Some((n - l, n))),
    }
}

/// A test-side Gram at some rows, in the GP's layout, with what the posterior needs.
#[derive(Clone, Debug)]
pub struct RowGram {
    /// The kernel.
    pub kind: KernelKind,
    /// `K^{cc}(x_p, x_i)`. # Shapes `[K, P, M]`.
    pub k_cross: Vec<f64>,
    /// `K^{cc}(x_p, x_p)` (the rows' self-kernel). # Shapes `[K, P]`.
    pub k_test_diag: Vec<f64>,
    /// `f_{w_0}(x_p)`. # Shapes `[P, K]`.
    pub bias: Vec<f64>,
    /// `f_{w_N}(x_p)` on the kernel's outputs (the logits in the benchmark). # Shapes `[P, K]`.
    pub network: Vec<f64>,
    /// Rows P.
    pub p: usize,
    /// The kernel machine against the network at these rows.
    pub check: GramCheck,
    /// Every class block `K^{cc'}(x_p, x_i)` (full layout only). # Shapes `[P, M, K, K]`.
    pub k_cross_full: Option<Vec<f64>>,
    /// `K^{cc'}(x_p, x_p)` (full layout only). # Shapes `[P, K, K]`.
    pub k_self: Option<Vec<f64>>,
}

/// [`row_gram`] of several row sets `sets` (`(x [P_j, d], name)`) from one kernel computation
/// over all their rows: the training side of every step is evaluated once instead of once per
/// set, but every set's rows are held at once (twice while they are split into sets). Each
/// set's check is its rows' machine against the network; its evaluation counts are those of the
/// whole computation. `layout`: `diag`, or `full` (the class blocks taken from it, every block
/// kept in [`RowGram::k_cross_full`]; with one set the computed Gram itself, not a copy).
/// `memory`: bytes the computation may take; the rows are then computed in row blocks
/// ([`crate::kernel::engine::blocked::plan`]) and concatenated (`None`: one block).
///
/// Rows are independent of the rows computed beside them, so one set computed alone gives its
/// rows of a joint computation (up to the rounding of the per-block accumulation; the
/// uncertainty study computes one setting at a time to bound its memory).
#[allow(clippy::too_many_arguments)]
pub fn row_grams(run: &Run, states: &[Params], kind: KernelKind, rule: Rule, outputs: Outputs, window: Option<usize>, layout: Layout, sets: &[(&[f64], &str)], memory: Option<u64>, progress: &dyn Fn(usize, usize)) -> Result<Vec<RowGram>> {
    if layout == Layout::Trace {
        return Err(Error::Config("a kernel GP needs the class blocks (diag or full layout)".into()));
    }
    let d = run.dataset.dim;
    let x: Vec<f64> = sets.iter().flat_map(|(x, _)| x.iter().copied()).collect();
    let mut req = Request::new(kind).rule(rule).steps(window_steps(run, window)?).layout(layout).outputs(outputs);
    if let Some(budget) = memory {
        let plan = kernel::engine::blocked::plan(&run.manifest, x.len() / d.max(1), run.dataset.n_train(), &req, budget)?;
        req = req.block_rows(Some(plan.block_rows));
    }
    let mut o = kernel::compute(run, states, &points(&x, d), &req, progress)?;
    drop(x);
    let (m, k) = (o.m, o.k);
    let full = layout == Layout::Full;
    // One set in the full layout keeps the computed Gram itself (moved, not copied).
    let mut whole = (sets.len() == 1 && full).then(|| std::mem::take(&mut o.gram));
    let diag = o.diag.as_ref().ok_or_else(|| Error::Data(format!("the {kind} kernel has no self-kernel at the rows")))?;
    let mut out = Vec::with_capacity(sets.len());
    let mut first = 0;
    for (xs, name) in sets {
        let p = xs.len() / d;
        let rows = first..first + p;
        let (machine, network) = (&o.machine[rows.start * k..rows.end * k], &o.network[rows.start * k..rows.end * k]);
        let errs: Vec<f64> = machine.iter().zip(network).map(|(a, b)| (a - b).abs()).collect();
        let check = GramCheck {
            rows: (*name).into(),
            side: Side::Test,
            points: p,
            steps: o.steps.len(),
            max_abs_error: errs.iter().copied().fold(0.0, kernel::nan_max),
            mean_abs_error: errs.iter().sum::<f64>() / errs.len().max(1) as f64,
            mean_evaluations: o.mean_evaluations(),
            max_evaluations: o.max_evaluations(),
        };
        let mut k_cross = Vec::with_capacity(k * p * m);
        let mut k_test_diag = Vec::with_capacity(k * p);
        let gram: &[f64] = whole.as_deref().unwrap_or(&o.gram);
        for c in 0..k {
            if full {
                k_cross.extend((rows.start * m..rows.end * m).map(|idx| gram[(idx * k + c) * k + c]));
            } else {
                k_cross.extend((rows.start * m..rows.end * m).map(|idx| gram[idx * k + c]));
            }
            k_test_diag.extend(rows.clone().map(|pi| diag[(pi * k + c) * k + c]));
        }
        let (k_cross_full, k_self) = if full {
            let g = whole.take().unwrap_or_else(|| o.gram[rows.start * m * k * k..rows.end * m * k * k].to_vec());
            (Some(g), Some(diag[rows.start * k * k..rows.end * k * k].to_vec()))
        } else {
            (None, None)
        };
        out.push(RowGram { kind, k_cross, k_test_diag, bias: o.bias[rows.start * k..rows.end * k].to_vec(), network: network.to_vec(), p, check, k_cross_full, k_self });
        first += p;
    }
    Ok(out)
}

/// The test-side Gram of `kind` (EPK rows integrated with `rule`) at the rows of `x`
/// (`rows` names them in the check), class-diagonal layout, in memory.
///
/// # Shapes
/// `x: [P, d]`.
pub fn row_gram(run: &Run, states: &[Params], kind: KernelKind, rule: Rule, outputs: Outputs, x: &[f64], rows: &str, progress: &dyn Fn(usize, usize)) -> Result<RowGram> {
    Ok(row_grams(run, states, kind, rule, outputs, None, Layout::Diag, &[(x, rows)], None, progress)?.pop().expect("one set, one Gram"))
}
