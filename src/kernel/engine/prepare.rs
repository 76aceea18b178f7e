//! What every kernel computation checks and resolves before its driver runs, once for both the
//! plain driver ([`crate::kernel::engine::driver`]) and the optimizer-replaying one ([`crate::kernel::engine::stateful`]): the
//! inputs' shapes, the output map (logits or the network's own), the step range and columns,
//! the output offsets, whether rows are integrated and the quadrature's per-step tolerance,
//! the NTK's step, and the loss gradients `∂L/∂f` of a step.

use std::borrow::Cow;
use std::time::Instant;

use crate::kernel::stack::closed::dense_relu::step::MlpStep;
use crate::kernel::stack::closed::ClosedForm;
use crate::kernel::quadrature::Rule;
use crate::kernel::request::{GramPath, Request};
use crate::kernel::types::{output_bytes_in, KernelKind, Outputs, Points};
use crate::data::{Dataset, Targets};
use crate::error::{Error, Result};
use crate::model::net::LossKind;
use crate::model::{Architecture, Body, OutputKind, Params};
use crate::optim::UpdateRule;
use crate::trajectory::Manifest;

/// A checked kernel computation: the inputs and everything resolved from them.
pub(in crate::kernel) struct Prepared<'a> {
    /// The run's manifest; for a kernel on the logits, seen through the identity output map.
    pub manifest: Cow<'a, Manifest>,
    /// The training set.
    pub train: &'a Dataset,
    /// `w_0 … w_N`.
    pub states: &'a [Params],
    /// Adam's recorded `κ_s D_s` per step (required for Adam runs).
    pub precond: Option<&'a [Vec<f64>]>,
    /// The row points.
    pub rows: &'a Points,
    /// The request.
    pub req: &'a Request,
    /// The run's optimizer.
    pub rule: UpdateRule,
    /// Layer stacks take the structured stack path ([`crate::kernel::stack`]).
    pub stack_fast: bool,
    /// The stack's closed form, where it takes one for this request
    /// ([`crate::kernel::stack::closed`]).
    pub closed: Option<ClosedForm>,
    /// Cross-entropy on identity outputs (a classifier's logits): `∂L/∂z = softmax(z) − y`.
    pub ce_on_logits: bool,
    /// Whether rows are integrated over t (EPK test side, k′, the path kernel).
    pub integrate: bool,
    /// The auto rule's tolerance per step (`tol / N`; 0 for fixed rules).
    pub tol_step: f64,
    /// The auto rule's tolerance (0 for fixed rules), relative where the node search checks
    /// the rows' self-kernel ([`crate::kernel::quadrature::nodes::choose_auto_nodes`]).
    pub tol: f64,
    /// The steps summed `[lo, hi)`.
    pub lo: usize,
    /// See `lo`.
    pub hi: usize,
    /// The NTK's step S (`None` for the path kernels).
    pub ntk_step: Option<usize>,
    /// The training points `[c0, c1)` of the Gram's columns (`(0, M)`: all).
    pub cols: (usize, usize),
    /// `f_{w_0}` of the rows before zeroing (`zero_output` architectures) `[P, K]`.
    pub off_rows: Option<Vec<f64>>,
    /// The same for all M training points `[M, K]`.
    pub off_train: Option<Vec<f64>>,
    /// Each step's mini-batch (SGD; `None`: every step sees all M).
    pub batches: Option<Vec<Vec<usize>>>,
    /// When the computation started.
    pub start: Instant,
}

impl<'a> Prepared<'a> {
    /// Checks the inputs against the request and resolves what both drivers need.
    ///
    /// # Shapes
    /// `states` `N + 1`, `rows.x` `[P, d]` with d the network's input dimension.
    pub(crate) fn new(manifest: &'a Manifest, train: &'a Dataset, states: &'a [Params], precond: Option<&'a [Vec<f64>]>, rows: &'a Points, req: &'a Request) -> Result<Self> {
        let start = Instant::now();
        // The kernel on the logits of a classifier: the same path seen through the identity
        // output map, a_{i,s} from ∂L/∂z = softmax(z) − y (module docs of `Outputs`).
        let manifest: Cow<'a, Manifest> = match (req.outputs, manifest.architecture.output) {
            (Outputs::Logits, OutputKind::LogSoftmax) => {
                if manifest.loss != LossKind::CrossEntropy {
                    return Err(Error::Config("kernels on the logits need a classifier trained on the cross-entropy".into()));
                }
                if !UpdateRule::of(&manifest.optimizer).is_plain() {
                    return Err(Error::Config("kernels on the logits are implemented for plain gradient steps (GD/SGD); this run's optimizer keeps state (momentum, Adam or weight decay)".into()));
                }
                let mut m = manifest.clone();
                m.architecture.output = OutputKind::Identity;
                Cow::Owned(m)
            }
            _ => Cow::Borrowed(manifest),
        };
        let ce_on_logits = manifest.loss == LossKind::CrossEntropy && manifest.architecture.output == OutputKind::Identity;
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
        let (p, m_all, k) = (rows.len(), train.n_train(), arch.outputs());
        // The Gram's columns: the training points [c0, c1) (a share when a proper range).
        let cols = match req.columns {
            None => (0, m_all),
            Some((a0, b0)) => {
                if a0 >= b0 || b0 > m_all {
                    return Err(Error::Config(format!("columns {a0}..{b0}: need 0 <= lo < hi <= M = {m_all}")));
                }
                (a0, b0)
            }
        };
        let (layout, memory_budget) = (req.layout, req.memory_budget);
        let m = cols.1 - cols.0;
        // The per-step Grams are those of the steps kept ([`steps_kept`]), `a` is `[N, M, K]`.
        let g_bytes = (p * m * layout.per_pair(k)) as u64 * 8;
        let out_bytes = output_bytes_in(layout, p, m, k, n, false) + if req.per_step { g_bytes * steps_kept(&manifest, req) as u64 } else { 0 };
        if out_bytes > memory_budget {
            let shape = layout.shape(p, m, k).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
            let blocks = if layout == crate::kernel::layout::Layout::Full { String::new() } else { format!(" ({layout} blocks)") };
            return Err(Error::OutOfMemoryBudget {
                what: format!("the {} Gram [{shape}]{blocks}{}", req.kind, if req.per_step { " with per-step Grams" } else { "" }),
                needed_bytes: out_bytes,
                budget_bytes: memory_budget,
                hint: "use fewer points (--points), drop --per-step, or raise --memory".into(),
            });
        }
        // Layer stacks (an MLP or CNN preset as its stack, `engine::entry`) take the stack's
        // path, and its closed form where one applies; the generic path is the dfdx reference on
        // the network as written.
        let stack_fast = req.path != GramPath::Generic && matches!(arch.body, Body::Layers { .. });
        let rule = UpdateRule::of(&manifest.optimizer);
        let closed = if stack_fast { ClosedForm::of(arch, req, rule.is_plain()) } else { None };
        if !stack_fast && matches!(req.rule, Rule::Auto(_)) && matches!(req.kind, KernelKind::Epk | KernelKind::Kprime | KernelKind::Path) {
            return Err(Error::Config("the auto quadrature runs on the layer stack's path (--path fast or nodes); the generic reference takes a fixed rule such as gauss:16".into()));
        }
        let init = &states[0];
        let off_rows = if arch.zero_output { Some(arch.raw_forward(init, &rows.x)) } else { None };
        let off_train = if arch.zero_output { Some(arch.raw_forward(init, &train.x_train)) } else { None };
        // The steps summed: all by default, or [lo, hi) (then b = f_{w_lo}, network = f_{w_hi}).
        let (lo, hi) = match req.steps {
            None => (0, n),
            Some((a0, b0)) => {
                if a0 >= b0 || b0 > n {
                    return Err(Error::Config(format!("--steps {a0}:{b0}: need 0 <= A < B <= {n}")));
                }
                (a0, b0)
            }
        };
        if !rule.is_plain() && req.kind == KernelKind::Path {
            return Err(Error::Config("the path kernel is implemented for plain gradient steps (GD/SGD); this run's optimizer keeps state".into()));
        }
        let ntk_step = match req.kind {
            KernelKind::Ntk => {
                let s = req.ntk_step.unwrap_or(n);
                if s > n {
                    return Err(Error::Config(format!("--step {s} is beyond the last state {n}")));
                }
                Some(s)
            }
            _ => None,
        };
        let integrate = req.integrates_rows();
        let tol_step = match req.rule {
            Rule::Auto(tol) => tol / n.max(1) as f64,
            _ => 0.0,
        };
        let batches = manifest.batches();
        Ok(Prepared {
            batches,
            manifest,
            train,
            states,
            precond,
            rows,
            req,
            rule,
            stack_fast,
            closed,
            ce_on_logits,
            integrate,
            tol_step,
            tol: if let Rule::Auto(tol) = req.rule { tol } else { 0.0 },
            lo,
            hi,
            ntk_step,
            cols,
            off_rows,
            off_train,
            start,
        })
    }

    /// The network (with the output map the kernel is on).
    pub(crate) fn arch(&self) -> &Architecture {
        &self.manifest.architecture
    }

    /// The network's outputs at `state` on the points `x` (`[n, d]`), with their offsets `off`
    /// (`zero_output`); returns `[n, K]`.
    pub(crate) fn values(&self, state: &Params, x: &[f64], off: Option<&[f64]>) -> Result<Vec<f64>> {
        let arch = self.arch();
        if let Some(ClosedForm::DenseRelu(shape)) = &self.closed {
            // The closed form's own forward (the outputs its Gram's a_i were always formed from).
            let z = vec![0.0; x.len() / arch.input_dim()];
            Ok(MlpStep::new(shape, state, None)?.eval(x, &z, off, false).f)
        } else {
            arch.forward(state, Some(&self.states[0]), x)
        }
    }

    /// `∂L/∂f(x_i)` of step `s` for all M training points, `[M, K]`, for the loss as minimised
    /// at that step (its mini-batch with SGD). `f_train` (`[M, K]`, at `w_s`) is computed when
    /// the loss needs it and it is not given (cross-entropy on log-softmax needs the labels only).
    pub(crate) fn loss_gradient(&self, s: usize, f_train: Option<&[f64]>) -> Result<Vec<f64>> {
        let (m, k) = (self.train.n_train(), self.arch().outputs());
        let batch = self.batches.as_ref().map(|b| b[s].as_slice());
        let owned;
        let ft: &[f64] = match f_train {
            Some(f) => f,
            None if self.manifest.loss == LossKind::Mse || self.ce_on_logits => {
                owned = match batch {
                    // A mini-batch's loss reads its own rows only: the network on those.
                    Some(b) if b.len() < m => {
                        let d = self.train.dim;
                        let x: Vec<f64> = b.iter().flat_map(|&i| self.train.x_train[i * d..(i + 1) * d].iter().copied()).collect();
                        let off: Option<Vec<f64>> = self.off_train.as_deref().map(|o| b.iter().flat_map(|&i| o[i * k..(i + 1) * k].iter().copied()).collect());
                        let f = self.values(&self.states[s], &x, off.as_deref())?;
                        let mut all = vec![0.0; m * k];
                        b.iter().zip(f.chunks_exact(k)).for_each(|(&i, row)| all[i * k..(i + 1) * k].copy_from_slice(row));
                        all
                    }
                    _ => self.values(&self.states[s], &self.train.x_train, self.off_train.as_deref())?,
                };
                &owned
            }
            None => &[],
        };
        if self.ce_on_logits {
            logit_loss_gradient(ft, &self.train.y_train, m, k, batch)
        } else {
            loss_gradient(self.manifest.loss, ft, &self.train.y_train, m, k, batch)
        }
    }
}

/// How many per-step Grams a request keeps: its range's steps, and with momentum (without
/// [`super::super::Request::carry_in`]) every step from 0, whose gradients reach the range.
pub(crate) fn steps_kept(manifest: &Manifest, req: &Request) -> usize {
    let (lo, hi) = req.steps.unwrap_or((0, manifest.steps));
    let rule = UpdateRule::of(&manifest.optimizer);
    if !rule.is_plain() && rule.beta != 0.0 && !req.carry_in {
        hi
    } else {
        hi.saturating_sub(lo)
    }
}

/// The points a step's loss is averaged over: its mini-batch, or all M.
fn step_rows(m: usize, batch: Option<&[usize]>) -> std::borrow::Cow<'_, [usize]> {
    match batch {
        Some(b) => std::borrow::Cow::Borrowed(b),
        None => std::borrow::Cow::Owned((0..m).collect()),
    }
}

/// ∂L/∂f(x_i) at one state, `[M, K]`, for the loss as minimised at that step: the mean over
/// all M points (gradient descent) or over the step's mini-batch (SGD; zero outside it).
pub fn loss_gradient(loss: LossKind, f_train: &[f64], targets: &Targets, m: usize, k: usize, batch: Option<&[usize]>) -> Result<Vec<f64>> {
    let mut g = vec![0.0; m * k];
    let rows = step_rows(m, batch);
    let n = rows.len().max(1) as f64;
    match (loss, targets) {
        (LossKind::CrossEntropy, Targets::Labels(y)) => {
            for &i in rows.iter() {
                g[i * k + y[i]] = -1.0 / n;
            }
        }
        (LossKind::Mse, Targets::Values(v)) => {
            let scale = 2.0 / (n * k as f64);
            for &i in rows.iter() {
                for c in 0..k {
                    g[i * k + c] = scale * (f_train[i * k + c] - v[i * k + c]);
                }
            }
        }
        _ => return Err(Error::Data("loss and targets do not match (cross-entropy needs labels, mse values)".into())),
    }
    Ok(g)
}

/// ∂L/∂z(x_i) at one state for the mean cross-entropy on the logits `z` (`[M, K]`):
/// `(softmax(z_i) − e_{y_i}) / n` over the step's points (all M, or the mini-batch).
pub(crate) fn logit_loss_gradient(z: &[f64], targets: &Targets, m: usize, k: usize, batch: Option<&[usize]>) -> Result<Vec<f64>> {
    let Targets::Labels(y) = targets else {
        return Err(Error::Data("the cross-entropy on the logits needs class labels".into()));
    };
    if z.len() != m * k {
        return Err(Error::ShapeMismatch { what: "training logits".into(), expected: vec![m, k], got: vec![z.len()] });
    }
    let mut g = vec![0.0; m * k];
    let rows = step_rows(m, batch);
    let n = rows.len().max(1) as f64;
    for &i in rows.iter() {
        let row = &z[i * k..(i + 1) * k];
        let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for c in 0..k {
            g[i * k + c] = ((row[c] - mx).exp() / s - if c == y[i] { 1.0 } else { 0.0 }) / n;
        }
    }
    Ok(g)
}
