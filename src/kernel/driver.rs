//! The driver: one kernel computation from validated inputs to the kernel machine and its
//! per-step validation (nodes → contraction → accumulation → validation).

use std::time::Instant;

use super::eval::MlpStep;
use super::gram::{self, GramAccumulator};
use super::models::{CnnModel, GenericModel, MlpModel, StepInput, StepModel};
use super::stateful;
use super::types::*;
use crate::data::Targets;
use crate::error::{Error, Result};
use crate::model::net::LossKind;
use crate::model::{Body, Params};
use crate::trajectory::Manifest;

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
pub fn logit_loss_gradient(z: &[f64], targets: &Targets, m: usize, k: usize, batch: Option<&[usize]>) -> Result<Vec<f64>> {
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
    compute_inner(manifest, train, states, None, rows, req, &Options { memory_budget, ..Default::default() }, progress)
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
    compute_in(run, states, rows, req, &Options { memory_budget, ..Default::default() }, progress)
}

/// How a kernel computation runs: which blocks of the Gram it computes, against which training
/// points, which path a CNN takes, and the memory it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Which blocks of the Gram are computed and held (`full`, `diag`, `trace`).
    pub layout: Layout,
    /// The CNN's Gram path (MLPs always take the structured one).
    pub path: GramPath,
    /// Bytes the outputs may take; refused with an estimate above it.
    pub memory_budget: u64,
    /// The training points `[lo, hi)` the Gram's columns are (`None`: all M). Only those
    /// columns are computed: every path forms the training-side factors of those points alone,
    /// so work and memory scale with `hi − lo` (the loss gradients `∂L/∂f` of a step, `[M, K]`,
    /// and for momentum/Adam the optimizer replay, which needs the full data gradient, still see
    /// all M). A proper range gives one column block's share ([`ColumnShare`]), assembled with
    /// the others by [`super::columns::assemble`]; `(0, M)` is the same as `None`.
    pub columns: Option<(usize, usize)>,
    /// Which outputs the kernel is on: the network's own (log-softmax for a classifier) or its
    /// logits ([`Outputs`]).
    pub outputs: Outputs,
}

impl Default for Options {
    fn default() -> Self {
        Options { layout: Layout::Full, path: GramPath::Fast, memory_budget: u64::MAX, columns: None, outputs: Outputs::Network }
    }
}

impl Options {
    /// The default options with the Gram in `layout`.
    pub fn layout(layout: Layout) -> Self {
        Options { layout, ..Default::default() }
    }
}

/// The kernel of a run on disk: the engine's front door. Only the entries of `opts.layout` are
/// computed and held; the kernel machine and its per-step validation are computed for every
/// layout (contracted with `a_{i,s}` on the fly, from the factors); the single machine of
/// Theorem 3.7 contracts the off-diagonal blocks and comes with `full` only. Loads what the run
/// recorded besides its states (Adam's preconditioners), so it works for every optimizer.
pub fn compute_in(run: &crate::trajectory::Run, states: &[Params], rows: &Points, req: &KernelRequest, opts: &Options, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    let precond = run.load_preconditioners()?;
    compute_inner(&run.manifest, &run.dataset, states, precond.as_deref(), rows, req, opts, progress)
}

/// Which Gram path a CNN takes (MLPs always take the structured one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GramPath {
    /// The structured path ([`super::convgram`] for CNNs); any quadrature rule.
    Fast,
    /// The generic autodiff path ([`super::generic`], the reference); fixed rules only.
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
    compute_inner(manifest, train, states, None, rows, req, &Options { memory_budget, path, ..Default::default() }, progress)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn compute_inner(
    manifest: &Manifest,
    train: &crate::data::Dataset,
    states: &[Params],
    precond: Option<&[Vec<f64>]>,
    rows: &Points,
    req: &KernelRequest,
    opts: &Options,
    progress: &dyn Fn(usize, usize),
) -> Result<KernelOutput> {
    let (layout, memory_budget, path) = (opts.layout, opts.memory_budget, opts.path);
    let start = Instant::now();
    // The kernel on the logits of a classifier: the same path seen through the identity output
    // map, a_{i,s} from ∂L/∂z = softmax(z) − y (module docs of `Outputs`).
    let logit_manifest;
    let manifest = match (opts.outputs, manifest.architecture.output) {
        (Outputs::Logits, crate::model::OutputKind::LogSoftmax) => {
            if manifest.loss != LossKind::CrossEntropy {
                return Err(Error::Config("kernels on the logits need a classifier trained on the cross-entropy".into()));
            }
            if !crate::optim::UpdateRule::of(&manifest.optimizer).is_plain() {
                return Err(Error::Config("kernels on the logits are implemented for plain gradient steps (GD/SGD); this run's optimizer keeps state (momentum, Adam or weight decay)".into()));
            }
            let mut m = manifest.clone();
            m.architecture.output = crate::model::OutputKind::Identity;
            logit_manifest = m;
            &logit_manifest
        }
        _ => manifest,
    };
    let ce_on_logits = manifest.loss == LossKind::CrossEntropy && manifest.architecture.output == crate::model::OutputKind::Identity;
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
    let (p, m_all, k, d) = (rows.len(), train.n_train(), arch.outputs(), rows.dim);
    // The Gram's columns: the training points [c0, c1) (a share when a proper range).
    let (c0, c1) = match opts.columns {
        None => (0, m_all),
        Some((a0, b0)) => {
            if a0 >= b0 || b0 > m_all {
                return Err(Error::Config(format!("columns {a0}..{b0}: need 0 <= lo < hi <= M = {m_all}")));
            }
            (a0, b0)
        }
    };
    let share = (c0, c1) != (0, m_all);
    let m = c1 - c0;
    let out_bytes = output_bytes_in(layout, p, m, k, n, req.per_step);
    if out_bytes > memory_budget {
        let shape = layout.shape(p, m, k).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
        let blocks = if layout == Layout::Full { String::new() } else { format!(" ({layout} blocks)") };
        return Err(Error::OutOfMemoryBudget {
            what: format!("the {} Gram [{shape}]{blocks}{}", req.kind, if req.per_step { " with per-step Grams" } else { "" }),
            needed_bytes: out_bytes,
            budget_bytes: memory_budget,
            hint: "use fewer points (--points), drop --per-step, or raise --memory".into(),
        });
    }
    let structured = matches!(arch.body, Body::Mlp { .. });
    let conv_fast = path == GramPath::Fast && matches!(arch.body, Body::Cnn { .. });
    if req.kind == KernelKind::Path && (!structured || !matches!(req.rule, Rule::Auto(_)) || arch.output != crate::model::OutputKind::Identity) {
        return Err(Error::Config(
            "the path kernel is implemented for one-hidden-layer ReLU MLPs on identity outputs (the logits of a classifier: outputs = logits; or regression) with the auto quadrature".into(),
        ));
    }
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
    let x_cols = &train.x_train[c0 * d..c1 * d];
    let off_cols = off_train.as_deref().map(|o| &o[c0 * k..c1 * k]);
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
    if !rule.is_plain() && req.kind == KernelKind::Path {
        return Err(Error::Config("the path kernel is implemented for plain gradient steps (GD/SGD); this run's optimizer keeps state".into()));
    }
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
            layout,
            cols: (c0, c1),
        };
        return stateful::compute(&setup, progress);
    }
    // Network values at the states used, and a_{i,s} (zero outside the steps summed).
    let mut f_rows: Vec<Vec<f64>> = vec![Vec::new(); n + 1];
    let mut a = vec![0.0; n * m * k];
    let mut lossgrads: Vec<Vec<f64>> = vec![Vec::new(); n];
    let batches = manifest.batches();
    for s in lo..=hi {
        // The NTK's machine is checked once, against f at the ends; path kernels per step.
        if req.kind != KernelKind::Ntk || s == lo || s == hi {
            f_rows[s] = values(&states[s], &rows.x, off_rows.as_deref())?;
        }
        if s < hi {
            // Cross-entropy's ∂L/∂f depends on the labels only; MSE's on the outputs.
            let ft = if manifest.loss == LossKind::Mse || ce_on_logits { values(&states[s], &train.x_train, off_train.as_deref())? } else { Vec::new() };
            let batch = batches.as_ref().map(|b| b[s].as_slice());
            let g = if ce_on_logits { logit_loss_gradient(&ft, &train.y_train, m_all, k, batch)? } else { loss_gradient(manifest.loss, &ft, &train.y_train, m_all, k, batch)? };
            // Only the columns' rows of a and ∂L/∂f are kept.
            let g = g[c0 * k..c1 * k].to_vec();
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
        KernelKind::Kprime | KernelKind::Path => true,
        _ => false,
    };
    let gsize = p * m * layout.per_pair(k);
    // Structured steps accumulate in factor form; the generic path and per-step Grams add here.
    let mut extra: Option<Vec<f64>> = None;
    // One step model for the architecture; one accumulator (or one per step with per_step).
    let model: Box<dyn StepModel + '_> = if structured {
        Box::new(MlpModel { arch })
    } else if conv_fast {
        Box::new(CnnModel { arch })
    } else {
        Box::new(GenericModel { arch, init })
    };
    let new_acc = || GramAccumulator::with_layout(layout, p, m, k, arch.bias).with_output_alpha(arch.alpha);
    let mut acc = if req.per_step { None } else { Some(new_acc()) };
    let mut per_step = if req.per_step { Some(Vec::with_capacity(gsize * steps.len())) } else { None };
    let mut machine = bias.clone();
    let mut contraction = gram::Contraction::default();
    let mut records = Vec::with_capacity(steps.len());
    // A column share keeps each step's predicted and actual change for the assembly (the NTK:
    // its one change over the range).
    let keep_steps = share;
    let mut step_pred = Vec::with_capacity(if keep_steps { steps.len() * p * k } else { 0 });
    let mut step_actual = Vec::with_capacity(step_pred.capacity());
    let want_diag = matches!(req.kind, KernelKind::Ntk | KernelKind::Dpk | KernelKind::Epk | KernelKind::Path);
    let mut diag = vec![0.0; p * k * k];
    let tol_step = match req.rule {
        Rule::Auto(tol) => tol / n.max(1) as f64,
        _ => 0.0,
    };
    for (count, &s) in steps.iter().enumerate() {
        progress(count, steps.len());
        let next = if s < n && integrate { Some(&states[s + 1]) } else { None };
        let fixed = if integrate { req.rule.fixed_nodes() } else { Some(vec![(0.0, 1.0)]) };
        // The effective training weights of this step: a_{i,s} (Chen: a·|∂L/∂f| = −ε ∂L/∂f);
        // for the NTK the path's Σ_s a_{i,s}, so that the step's prediction is the linearised
        // machine's whole change.
        let a_eff: Vec<f64> = if req.kind == KernelKind::Ntk {
            let mut asum = vec![0.0; m * k];
            for s in lo..hi {
                asum.iter_mut().zip(&a[s * m * k..(s + 1) * m * k]).for_each(|(x, y)| *x += y);
            }
            asum
        } else {
            match req.kind {
                KernelKind::Chen => lossgrads[s].iter().map(|g| -manifest.learning_rates[s] * g).collect(),
                _ => a[s * m * k..(s + 1) * m * k].to_vec(),
            }
        };
        let colw: Option<Vec<f64>> = if req.kind == KernelKind::Chen { Some(lossgrads[s].iter().map(|v| v.abs()).collect()) } else { None };
        let input = StepInput {
            state: &states[s],
            next,
            rows,
            off_rows: off_rows.as_deref(),
            x_train: x_cols,
            off_train: off_cols,
            fixed: fixed.as_deref(),
            tol_step,
            a: &a_eff,
            colw: colw.as_deref(),
            cosine: integrate && structured && req.kind != KernelKind::Path,
            self_kernel: want_diag,
            train_integrated: req.kind == KernelKind::Path,
        };
        let mut one = if acc.is_none() { Some(new_acc()) } else { None };
        let target = match acc.as_mut() {
            Some(a) => a,
            None => one.as_mut().expect("created above"),
        };
        let out = model.add_step(&input, target, &mut diag)?;
        if let Some(mut one) = one {
            one.flush();
            contraction.seconds += one.contraction().seconds;
            contraction.flops += one.contraction().flops;
            let gs = one.finish();
            add_into(&mut extra, &gs);
            if let Some(ps) = per_step.as_mut() {
                ps.extend_from_slice(&gs);
            }
        }
        let cosine = out.cosine;
        let (pred, evaluations, jvp_evaluations, pieces, unconverged) = (out.pred, out.stats.evaluations, out.stats.jvp_evaluations, out.stats.pieces, out.stats.unconverged);
        // Predicted change over this step vs the network's actual change.
        let mut rec = StepRecord { step: s, ..Default::default() };
        if req.kind == KernelKind::Ntk {
            // Linearised model around w_S: f ≈ b + Σ_s Σ_i a_{i,s} K_NTK(x, x_i).
            machine.iter_mut().zip(&pred).for_each(|(mv, pv)| *mv += pv);
            if keep_steps {
                step_pred.extend_from_slice(&pred);
                step_actual.extend(network.iter().zip(&bias).map(|(f1, f0)| f1 - f0));
            }
        } else {
            let (mut mx, mut sum, mut ch) = (0.0f64, 0.0, 0.0f64);
            for pi in 0..p {
                for kt in 0..k {
                    let actual = f_rows[s + 1][pi * k + kt] - f_rows[s][pi * k + kt];
                    let e = (pred[pi * k + kt] - actual).abs();
                    mx = nan_max(mx, e);
                    sum += e;
                    ch = nan_max(ch, actual.abs());
                    machine[pi * k + kt] += pred[pi * k + kt];
                    if keep_steps {
                        step_actual.push(actual);
                    }
                }
            }
            if keep_steps {
                // One block's share of the prediction: its error is not the machine's.
                step_pred.extend_from_slice(&pred);
                (mx, sum) = (f64::NAN, f64::NAN);
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
    if let Some(a) = acc.as_mut() {
        a.flush();
        contraction.seconds += a.contraction().seconds;
        contraction.flops += a.contraction().flops;
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
        records[0].max_abs_error = if share { f64::NAN } else { max_abs_diff(&machine, &network) };
    }
    // Theorem 3.7: one machine when a_{i,s} does not depend on s (it contracts the off-diagonal
    // blocks too, so it needs the full layout; a column share leaves it to the assembly).
    let constant_a = n > 0 && (1..n).all(|s| a[s * m * k..(s + 1) * m * k] == a[..m * k]);
    let single_machine = if constant_a && req.kind != KernelKind::Ntk && layout == Layout::Full && !share {
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
        layout,
        contraction,
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
        columns: share.then(|| ColumnShare {
            range: (c0, c1),
            of: m_all,
            machine_whole: false,
            step_pred: keep_steps.then_some(step_pred),
            step_actual: keep_steps.then_some(step_actual),
        }),
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
