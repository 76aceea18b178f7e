//! Kernels of runs trained with momentum, Adam(W) or weight decay: the backward recursion of
//! [`crate::optim`] in weight space.
//!
//! - **Phase 1** walks the path forward. At every step r it recomputes the data gradient `g_r`
//!   from the training points' structured factors, replays the optimizer
//!   ([`OptimizerState`]) to get `κ_r D_r` and the decomposed update `Σ_i u_{i,r} + r_r`, and
//!   measures how far that is from the recorded `w_{r+1} − w_r` (`decomposition_residual`).
//! - **Phase 2** walks backwards carrying `H_r` (`[P·K, W]`) for the row points:
//!   `H_r = ε_r κ_r D_r ⊙ J̄_r + β H_{r+1}`, `ε_r F_r = γ_r H_r`. Each step's kernel is `K_r = ε_r F_r·∇f(x_i; w_r)ᵀ / ε_r`,
//!   contracted per layer against the training points' factors of the network's layer stack
//!   (dense layers `H_l·[A, 1]ᵀ` then δ, as in [`crate::kernel::gram`]; formed layers one GEMM;
//!   the generic reference: dense Jacobians). An MLP or CNN preset runs as its stack
//!   (`engine::entry`). (Dampening scales the step's
//!   row feature by `γ_r`; Nesterov forms `ε_r J̄_r + β γ_r H_r`: `UpdateRule::row_coefficients`.)
//!   The machine's step-r term is
//!   `Σ_i a_{i,r}·K_r = −H_r·g_r`, the weight-decay term `R = −λ_c Σ_r H_r·w_r − λ_d Σ_s ε_s J̄_s·w_s`,
//!   and the rounding term `Σ_s J̄_s·(Δw_s − Σ_i u_{i,s} − r_s)`: the part of the recorded update
//!   the per-point split does not carry. It is at rounding level for momentum, but Adam
//!   multiplies gradients by up to `1/eps`: where per-point gradients cancel to `|g| ≲ eps`
//!   (e.g. the output bias of a balanced problem at a zero-initialised last layer) the update is
//!   amplified rounding noise that no per-point split can reproduce. It is reported, never hidden.
//!
//! With momentum the gradients of steps before a `--steps A:B` range still move the weights
//! inside it; those steps then appear in the Gram and in `a` with their own `K_r` (the row side
//! carries only the steps of the range). With [`crate::kernel::Request::carry_in`] they are one
//! term of their own instead, the **carried-in term** `C = −H_A·U_A` (`[P·K]`, in the machine,
//! reported as [`KernelOutput::carried`]): below A the recursion only scales,
//! `H_r = (Π_{j=r+1}^{A} β_j) H_A`, so the steps before A contribute
//! `−Σ_{r<A} b_r H_r·(c_r g_r + λ_c w_r) = −H_A·U_A` with
//! `U_{r+1} = β_{r+1}(U_r + b_r(c_r g_r + λ_c w_r))`, `U_0 = 0`, summed in the replay. Phase 2 then
//! walks the range only, and the Gram, `a` and the per-step Grams are the range's; the replay
//! walks from step 0, at the cost of one data gradient per step, or from the latest checkpoint
//! an earlier window of the same run left in this process ([`checkpoints`]).
//!
//! Cost per step: `P·K·W·M` multiply-adds for the contraction (every layer is formed), against
//! `P·K·M·Σ_l K·out_l` for plain gradient steps; that is the price of a row side which no longer
//! factors per layer. Memory: two `[P·K, W]` arrays besides the outputs.

pub(crate) mod checkpoints;
mod row_side;
mod train_side;

use crate::kernel::layout::{GramSink, Layout};
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::types::{max_abs_diff, nan_max, output_bytes_in, ColumnShare, KernelForm, KernelKind, KernelOutput, LayerShares, StepRecord};
use crate::error::{Error, Result};
use crate::model::param_layers;
use crate::optim::{OptimizerState, UpdateRule};
use crate::trajectory::Manifest;
use row_side::{row_gradients, Feature, Layer0, RowGradients};
use train_side::TrainSide;

/// Estimated working bytes of a momentum/Adam/weight-decay computation besides its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Work {
    /// Independent of the row points: per step of the range the replay's `Δw − Σ_i u_i` and,
    /// for Adam, its scales (`[W]` each); Adam's recorded preconditioners (`[N, W]`, loaded by
    /// [`crate::kernel::engine::entry::compute`]); the optimizer's buffers; what the machine keeps per step, the
    /// path's `∂L/∂f` (`[N, M, K]`) or, with a column share, the replay's data gradients
    /// (`[N, W]`); one state's training side over all M (the replay) and over the columns (the
    /// contraction): structured factors, or dense Jacobians `[M·K, W]` without a structured
    /// path. An upper bound in that the replay's training side is counted as if held with the
    /// contraction's.
    pub fixed: u64,
    /// Per row point: the recursion's `H` and one step's `J̄` (`[K, W]` each) and one step's
    /// Gram rows `K_r`.
    pub per_row: u64,
}

/// [`Work`] for a run of `manifest` with update rule `rule`: `range` steps in the request,
/// `mc` of `m` training points as columns.
pub(crate) fn work_bytes(manifest: &Manifest, rule: &UpdateRule, range: usize, mc: usize, m: usize, layout: Layout, ntk: bool) -> Work {
    let arch = &manifest.architecture;
    let (k, w, n) = (arch.outputs() as u64, manifest.num_params as u64, manifest.steps as u64);
    // The replay runs on the network's layer stack (a preset as its own).
    let per_train: u64 = arch.as_stack().and_then(|a| a.stack()).map_or(k * w, |st| st.gradient_floats(k as usize)) + k;
    let adam = u64::from(rule.adam.is_some());
    // Kept from the replay for the backward pass: a column share's whole data gradients
    // `[N, W]`; the NTK's loss gradients of all M points `[N, M, K]` (with a share, both).
    let kept = if mc < m { n * w } else { 0 } + if ntk { n * m as u64 * k } else { 0 };
    let fixed = 8 * (range as u64 * w * (1 + adam) + adam * n * w + 3 * w + kept + (m + mc) as u64 * per_train);
    // H and J̄ per row (Nesterov forms one more: its step feature).
    let per_row = 8 * ((2 + u64::from(rule.nesterov)) * k * w + mc as u64 * layout.per_pair(k as usize) as u64);
    Work { fixed, per_row }
}

/// The sizes of one stateful computation, fixed before either phase.
#[derive(Clone, Copy)]
struct Dims {
    /// Row points.
    p: usize,
    /// Columns: the training points of the share.
    m: usize,
    /// All training points (the replay's data gradient).
    m_all: usize,
    k: usize,
    /// Parameters.
    w: usize,
    /// Recorded steps.
    n: usize,
    /// Whether the columns are a share of the training points.
    share: bool,
    /// The first step whose gradients reach the range with their own kernel (`lo` without
    /// momentum or with the carried-in term, else 0).
    first: usize,
    /// Whether the steps before the range are one carried-in term (`first = lo > 0`).
    carry: bool,
    /// Progress units: the replay to `hi`, then the recursion back to `first`.
    total_work: usize,
}

/// Computes the kernel of a run whose optimizer is not plain gradient steps.
pub(in crate::kernel) fn compute(s: &Prepared<'_>, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    let req = s.req;
    let (m_all, cols) = (s.train.n_train(), s.cols);
    let (lo, hi) = (s.lo, s.hi);
    let reached = if s.rule.beta == 0.0 { lo } else { 0 };
    let carry = s.req.carry_in && reached < lo;
    let first = if carry { lo } else { reached };
    let d = Dims {
        p: s.rows.len(),
        m: cols.1 - cols.0,
        m_all,
        k: s.arch().outputs(),
        w: s.states[0].numel(),
        n: s.manifest.steps,
        share: cols != (0, m_all),
        first,
        carry,
        total_work: 2 * hi - first,
    };
    check_request(s, &d)?;
    let bias = s.values(&s.states[lo], &s.rows.x, s.off_rows.as_deref())?;
    let network = s.values(&s.states[hi], &s.rows.x, s.off_rows.as_deref())?;
    let mut replay = replay(s, &d, progress)?;
    let back = backward(s, &d, &mut replay, &bias, progress)?;
    let (gram, mut per_step, machine, reg, rounding, carried, mut records) = (back.gram, back.per_step, back.machine, back.reg, back.rounding, back.carried, back.records);
    let layers = back.layers.map(|(gram, change)| {
        let names: Vec<String> = param_layers(&s.states[0].specs).into_iter().map(|l| l.name).collect();
        // The NTK: one change over the whole range (its terms summed over the steps).
        let change = match s.ntk_step {
            Some(_) => {
                let per = names.len() * d.p * d.k;
                let mut one = vec![0.0; per];
                change.chunks_exact(per).for_each(|c| one.iter_mut().zip(c).for_each(|(a, b)| *a += b));
                one
            }
            None => change,
        };
        LayerShares { names, gram, change }
    });
    let steps: Vec<usize> = match s.ntk_step {
        Some(st) => vec![st],
        None => (first..hi).collect(),
    };
    if let Some(st) = s.ntk_step {
        // One record, as for plain runs: the linearised machine's error.
        let max_abs_error = max_abs_diff(&machine, &network);
        records = vec![StepRecord { step: st, max_abs_error, mean_evaluations: 1.0, max_evaluations: 1, mean_pieces: 1.0, dpk_cosine_error: f64::NAN, ..Default::default() }];
        if req.per_step {
            per_step = vec![gram.clone()];
        }
    }
    progress(d.total_work, d.total_work);
    let per_step = if req.per_step { Some(per_step.concat()) } else { None };
    let form = KernelForm::of(&s.rule);
    Ok(KernelOutput {
        kind: req.kind,
        rule: req.rule,
        side: req.side,
        integrated: s.integrate,
        p: d.p,
        m: d.m,
        k: d.k,
        steps,
        layout: s.req.layout,
        contraction: Default::default(),
        gram,
        per_step,
        diag: None,
        a: replay.a,
        bias,
        network,
        machine,
        single_machine: None,
        records,
        seconds: s.start.elapsed().as_secs_f64(),
        form,
        reg: if s.rule.wd_coupled != 0.0 || s.rule.wd_decoupled != 0.0 { Some(reg) } else { None },
        decomposition_residual: Some(replay.residual),
        rounding: Some(rounding),
        carried,
        // The machine and the per-step check J̄_s·Δw_s are the whole computation's.
        columns: d.share.then_some(ColumnShare { range: cols, of: m_all, machine_whole: true, step_pred: None, step_actual: None }),
        layers,
    })
}

/// Refuses what the stateful recursion cannot do before any work: Chen's kernel, Adam without
/// its recorded preconditioners, and a request over the memory budget.
fn check_request(s: &Prepared<'_>, d: &Dims) -> Result<()> {
    let req = s.req;
    if req.kind == KernelKind::Chen {
        return Err(Error::Config(format!(
            "chen's kernel (eq. 18) is defined for plain gradient steps; this run uses {}: use epk, dpk, kprime or ntk",
            s.manifest.optimizer
        )));
    }
    if s.rule.adam.is_some() && s.precond.map(<[Vec<f64>]>::len) != Some(d.n) {
        return Err(Error::Config(
            "this run was trained with Adam: its kernel needs the recorded preconditioners (compute it from the run directory: kernel::compute loads them)".into(),
        ));
    }
    if d.carry && (s.ntk_step.is_some() || req.per_layer) {
        return Err(Error::Config(format!(
            "the carried-in term of a window's earlier steps is one term of the machine, not split by layer or frozen at a step: {} without carry_in",
            if req.per_layer { "split a window by layer" } else { "compute the NTK" }
        )));
    }
    let (p, m, k) = (d.p, d.m, d.k);
    let kept = s.hi - d.first;
    let work = work_bytes(&s.manifest, &s.rule, s.hi - s.lo, m, d.m_all, s.req.layout, s.ntk_step.is_some());
    let need = output_bytes_in(s.req.layout, p, m, k, kept, req.per_step) + work.fixed + p as u64 * work.per_row;
    if need > s.req.memory_budget {
        let shape = s.req.layout.shape(p, m, k).iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ");
        return Err(Error::OutOfMemoryBudget {
            what: format!("the {} Gram [{shape}] of a {} run (with its [P·K, W] recursion)", req.kind, s.manifest.optimizer),
            needed_bytes: need,
            budget_bytes: s.req.memory_budget,
            hint: "use fewer points (--points), drop --per-step, or raise --memory".into(),
        });
    }
    Ok(())
}

/// What phase 1, the forward replay of the optimizer, leaves for phase 2.
struct Replay {
    /// `a_{r,i,k} = −ε_r ∂L/∂f` of the columns over the steps from `first` (`[N, M, K]`).
    a: Vec<f64>,
    /// Per step of the range, `Δw_r − (Σ_i u_{i,r} + r_r)`: what the per-point split does not
    /// carry (rounding).
    unsplit: Vec<Vec<f64>>,
    /// Per step of the range, Adam's scales of the step (`None` without Adam).
    scale: Vec<Option<Vec<f64>>>,
    /// The largest relative deviation of the replayed update from the recorded one.
    residual: f64,
    /// The NTK's kept loss gradients `∂L/∂f` of all M points, per step from `first`.
    path_lg: Vec<Vec<f64>>,
    /// With a column share (not the NTK), the replay's whole data gradients `g_r`.
    path_g: Vec<Vec<f64>>,
    /// With the carried-in term: `U_A = Σ_{r<A} (Π_{j=r+1}^{A} β_j) b_r (c_r g_r + λ_c w_r)`
    /// (`[W]`, module docs).
    carry: Option<Vec<f64>>,
}

/// Step r's `∂L/∂f` of all M training points (`[M, K]`) and the whole data gradient `g_r`
/// (`[W]`). With mini-batches only the batch's rows have a loss gradient, so only their
/// factors are formed (the other rows' would be multiplied by zero).
fn data_gradient(s: &Prepared<'_>, r: usize, d: &Dims) -> Result<(Vec<f64>, Vec<f64>)> {
    let (k, w) = (d.k, d.w);
    let Some(batch) = s.batches.as_ref().map(|b| &b[r]).filter(|b| b.len() < d.m_all) else {
        if s.stack_fast {
            // One backward pass per point with ∂L/∂f folded in (the loss gradient needs the
            // outputs only for MSE or logits, and then computes them itself).
            let lg = s.loss_gradient(r, None)?;
            let g = train_side::stack_data_gradient(s, &s.states[r], &s.train.x_train, s.off_train.as_deref(), &lg, w)?;
            return Ok((lg, g));
        }
        let ts = TrainSide::at(s, &s.states[r], (0, d.m_all))?;
        let lg = s.loss_gradient(r, Some(ts.f()))?;
        let g = ts.gradient(&lg, w);
        return Ok((lg, g));
    };
    // The batch's rows as a contiguous set of points: (its inputs, offsets and ∂L/∂f).
    let lg = s.loss_gradient(r, None)?;
    let dim = s.arch().input_dim();
    let x: Vec<f64> = batch.iter().flat_map(|&i| s.train.x_train[i * dim..(i + 1) * dim].iter().copied()).collect();
    let off: Option<Vec<f64>> = s.off_train.as_deref().map(|o| batch.iter().flat_map(|&i| o[i * k..(i + 1) * k].iter().copied()).collect());
    let c: Vec<f64> = batch.iter().flat_map(|&i| lg[i * k..(i + 1) * k].iter().copied()).collect();
    if s.stack_fast {
        let g = train_side::stack_data_gradient(s, &s.states[r], &x, off.as_deref(), &c, w)?;
        return Ok((lg, g));
    }
    let ts = TrainSide::of(s, &s.states[r], &x, off.as_deref())?;
    Ok((lg, ts.gradient(&c, w)))
}

/// The scale of step r's coefficients `a_{i,r} = −α_r c_r ∂L_r/∂f(x_i)` and kernel
/// `K_r = ε_r F_r·∇f(x_i; w_r)ᵀ / α_r`: `α_r = ε_r`, or 1 at a step of learning rate 0 (whose
/// gradient still enters the buffer and moves later steps).
fn a_scale(lr: f64) -> f64 {
    if lr == 0.0 {
        1.0
    } else {
        lr
    }
}

/// Phase 1: replays the optimizer forward over steps `[0, hi)` from the whole data gradient.
fn replay(s: &Prepared<'_>, d: &Dims, progress: &dyn Fn(usize, usize)) -> Result<Replay> {
    let (m, k, w, n, first) = (d.m, d.k, d.w, d.n, d.first);
    let (cols, lo, hi) = (s.cols, s.lo, s.hi);
    let lrs = &s.manifest.learning_rates;
    // Below a carried-in window only the optimizer's state, `U` and the residual move: start
    // from the latest checkpoint a window of this run left at or before `lo`.
    let key = d.carry.then(|| checkpoints::key(s));
    let resumed = key.as_deref().and_then(|key| checkpoints::latest(key, lo));
    let start = resumed.as_ref().map_or(0, |c| c.step);
    let mut opt = resumed.as_ref().map_or_else(|| OptimizerState::new(s.rule.clone(), w), |c| c.opt.clone());
    let mut a = vec![0.0; n * m * k];
    // Δw_r − (Σ_i u_{i,r} + r_r): what the per-point split does not carry (rounding).
    let mut unsplit: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut scale: Vec<Option<Vec<f64>>> = vec![None; n];
    let mut residual: f64 = resumed.as_ref().map_or(0.0, |c| c.residual);
    // For phase 2's machine −Σ_r H_r·g_r, which always takes the whole data gradient g_r: the
    // path's ∂L/∂f (all M), or with a column share the replay's g_r itself (the training side
    // of phase 2 then covers the columns only).
    let mut path_lg: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut path_g: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut carry = d.carry.then(|| resumed.map_or_else(|| vec![0.0; w], |c| c.carry));
    for r in start..hi {
        if let (Some(key), Some(u), true) = (key.as_deref(), carry.as_ref(), r == lo) {
            checkpoints::keep(key, checkpoints::Checkpoint { step: lo, opt: opt.clone(), carry: u.clone(), residual });
        }
        progress(r, d.total_work);
        // The replay needs the whole data gradient: all M training points.
        let (lg, g) = data_gradient(s, r, d)?;
        if r >= first && d.share && s.ntk_step.is_none() {
            path_g[r] = g.clone();
        }
        let wr = s.states[r].flat();
        if let (Some(u), true) = (carry.as_mut(), r < lo) {
            // U_{r+1} = β_{r+1}(U_r + b_r(c_r g_r + λ_c w_r)): the coefficients phase 2 gives
            // step r below the range.
            let (b, cg, lc) = (s.rule.row_coefficients(r).1, s.rule.grad_scale_at(r), s.rule.wd_coupled);
            let beta = s.rule.beta_at(r + 1);
            u.iter_mut().zip(&g).zip(&wr).for_each(|((u, g), w)| *u = beta * (*u + b * (cg * g + lc * w)));
        }
        let dw = opt.step_with(lrs[r], &wr, &g, s.precond.map(|pc| pc[r].as_slice()));
        let actual: Vec<f64> = s.states[r + 1].flat().iter().zip(&wr).map(|(a, b)| a - b).collect();
        let scale_dw = actual.iter().fold(0.0f64, |acc, v| acc.max(v.abs())).max(f64::MIN_POSITIVE);
        let dev = dw.iter().zip(&actual).fold(0.0f64, |acc, (x, y)| acc.max((x - y).abs()));
        residual = residual.max(dev / scale_dw);
        if r >= first {
            let lg_cols = &lg[cols.0 * k..cols.1 * k];
            for idx in 0..m * k {
                a[r * m * k + idx] = -a_scale(lrs[r]) * s.rule.grad_scale_at(r) * lg_cols[idx];
            }
            // Only the NTK keeps the loss gradients (its training side is frozen at w_S); the
            // other kernels recompute them in the backward pass from the outputs it forms anyway.
            if s.ntk_step.is_some() {
                path_lg[r] = lg;
            }
        }
        if r >= lo {
            unsplit[r] = actual.iter().zip(&dw).map(|(a, d)| a - d).collect();
            scale[r] = opt.last_scale().map(<[f64]>::to_vec);
        }
    }
    Ok(Replay { a, unsplit, scale, residual, path_lg, path_g, carry })
}

/// What phase 2, the backward recursion, produces.
struct Backward {
    /// The summed Gram (the NTK's: the frozen one).
    gram: Vec<f64>,
    /// Each step's Gram `K_r`, in step order (kept with `per_step` only).
    per_step: Vec<Vec<f64>>,
    /// The row points' machine: bias `− Σ_r H_r·g_r + reg + rounding` (`[P·K]`).
    machine: Vec<f64>,
    /// The weight-decay term `R` (`[P·K]`).
    reg: Vec<f64>,
    /// The rounding term `Σ_s J̄_s·(Δw_s − Σ_i u_{i,s} − r_s)` (`[P·K]`).
    rounding: Vec<f64>,
    /// The carried-in term `−H_A·U_A` (`[P·K]`), with [`Dims::carry`].
    carried: Option<Vec<f64>>,
    /// One record per step of the range, in step order.
    records: Vec<StepRecord>,
    /// With the per-layer decomposition: each layer's Gram and `[S, L, P·K]` terms.
    layers: Option<(Vec<Vec<f64>>, Vec<f64>)>,
}

/// Tests: the stack's first dense layer carried densely, as the reference for its factor form.
pub(crate) static LAYER0_OFF_TEST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The per-layer decomposition of the backward recursion: each parameter layer's Gram and its
/// part of every step's terms of the machine (data, weight decay, rounding), so that the bias
/// plus every layer's every term is the machine.
struct Split {
    ranges: Vec<std::ops::Range<usize>>,
    grams: Vec<GramSink>,
    /// `[S, L, P·K]` over the steps `first..hi`.
    change: Vec<f64>,
    first: usize,
    pk: usize,
}

impl Split {
    /// `change[r, l] += coef·F[:, l]·v[l]` for every layer l.
    fn add(&mut self, r: usize, coef: f64, f: &Feature, v: &[f64], l0: Option<&Layer0>) {
        let (nl, pk) = (self.ranges.len(), self.pk);
        for (l, range) in self.ranges.iter().enumerate() {
            let part = f.dot_cols(v, range, l0);
            let at = ((r - self.first) * nl + l) * pk;
            self.change[at..at + pk].iter_mut().zip(&part).for_each(|(a, b)| *a += coef * b);
        }
    }
}

/// Phase 2: walks steps `hi − 1` down to `first` carrying `H_r = ε_r F_r`, contracting each
/// step's kernel and the machine's terms.
fn backward(s: &Prepared<'_>, d: &Dims, replay: &mut Replay, bias: &[f64], progress: &dyn Fn(usize, usize)) -> Result<Backward> {
    let (p, m, k, w) = (d.p, d.m, d.k, d.w);
    let (lo, hi, first) = (s.lo, s.hi, d.first);
    let (cols, ntk_step) = (s.cols, s.ntk_step);
    let lrs = &s.manifest.learning_rates;
    let pk = p * k;
    // Layer 0 in factor form when it is dense and no preconditioner mixes its entries.
    let l0_ctx = if s.stack_fast && s.rule.adam.is_none() && !LAYER0_OFF_TEST.load(std::sync::atomic::Ordering::Relaxed) { Layer0::of_stack(s, &s.states[0])? } else { None };
    let l0 = l0_ctx.as_ref();
    let frozen = match ntk_step {
        Some(st) => Some((TrainSide::at(s, &s.states[st], cols)?, row_gradients(s, &s.states[st], None, l0)?)),
        None => None,
    };
    // The NTK's machine with a column share: the frozen Jacobians of all M training points.
    let frozen_all = match ntk_step {
        Some(st) if d.share => Some(TrainSide::at(s, &s.states[st], (0, d.m_all))?),
        _ => None,
    };
    let layout = s.req.layout;
    let mut h = Feature::zeros(pk, w, l0);
    let mut gram = GramSink::new(layout, p, m, k);
    let mut per_step: Vec<Vec<f64>> = Vec::new();
    let mut machine = bias.to_vec();
    let mut reg = vec![0.0; pk];
    let mut rounding = vec![0.0; pk];
    let mut records: Vec<StepRecord> = Vec::new();
    let mut scratch = Vec::new();
    let mut split = s.req.per_layer.then(|| {
        let ranges: Vec<std::ops::Range<usize>> = param_layers(&s.states[0].specs).into_iter().map(|l| l.flat).collect();
        let grams = ranges.iter().map(|_| GramSink::new(layout, p, m, k)).collect();
        let change = vec![0.0; (hi - first) * ranges.len() * pk];
        Split { ranges, grams, change, first, pk }
    });
    for (count, r) in (first..hi).rev().enumerate() {
        progress(hi + count, d.total_work);
        h.scale(s.rule.beta_at(r + 1));
        let wr = s.states[r].flat();
        // H_r = ε_r κ_r D_r ⊙ J̄_r + β H_{r+1}; step r's row feature is ε_r F_r = a ε_r J̄_r + b H_r.
        let (a_coef, b_coef) = s.rule.row_coefficients(r);
        let mut nesterov_feature = None;
        if r >= lo {
            let next = if s.integrate { Some(&s.states[r + 1]) } else { None };
            // NTK: the row gradients at w_S, computed once.
            let rg_owned;
            let rg = match &frozen {
                Some((_, rg0)) => rg0,
                None => {
                    rg_owned = row_gradients(s, &s.states[r], next, l0)?;
                    &rg_owned
                }
            };
            h.add(lrs[r], &rg.jbar, replay.scale[r].as_deref());
            if a_coef != 0.0 {
                let mut e = h.clone();
                e.scale(b_coef);
                e.add(a_coef * lrs[r], &rg.jbar, None);
                nesterov_feature = Some(e);
            }
            if s.rule.wd_decoupled != 0.0 {
                let jw = rg.jbar.dot(&wr, l0);
                reg.iter_mut().zip(&jw).for_each(|(a, b)| *a -= s.rule.wd_decoupled * lrs[r] * b);
                if let Some(sp) = split.as_mut() {
                    sp.add(r, -s.rule.wd_decoupled * lrs[r], &rg.jbar, &wr, l0);
                }
            }
            // The ExPLAIND-style check of this step: J̄_r·Δw_r (the split plus what it does not
            // carry) vs the actual change of the outputs.
            let ju = rg.jbar.dot(&replay.unsplit[r], l0);
            rounding.iter_mut().zip(&ju).for_each(|(a, b)| *a += b);
            if let Some(sp) = split.as_mut() {
                sp.add(r, 1.0, &rg.jbar, &replay.unsplit[r], l0);
            }
            records.push(step_record(s, r, rg, &wr, l0)?);
        }
        // Step r's kernel K_r = H_r·∇f(x_i; w_r)ᵀ / ε_r (NTK: training gradients frozen at w_S).
        let ts_owned;
        let ts = match &frozen {
            Some((ts0, _)) => ts0,
            None => {
                ts_owned = TrainSide::at(s, &s.states[r], cols)?;
                &ts_owned
            }
        };
        // The whole data gradient g_r (a column share too: split by training points, Adam's
        // machine would sum per-point terms amplified by 1/eps that cancel to O(1)).
        let g = if let Some(ta) = &frozen_all {
            ta.gradient(&std::mem::take(&mut replay.path_lg[r]), w)
        } else if d.share {
            std::mem::take(&mut replay.path_g[r])
        } else if frozen.is_some() {
            ts.gradient(&std::mem::take(&mut replay.path_lg[r]), w)
        } else if s.stack_fast {
            // The replay's own computation, bit for bit: Adam divides by up to 1/eps, so a data
            // gradient summed in another order than phase 1's is off its split by more than the
            // quadrature's tolerance (6.5e-12 against 2.7e-15 on an MNIST MLP under Adam).
            data_gradient(s, r, d)?.1
        } else {
            let lg = s.loss_gradient(r, Some(ts.f()))?;
            ts.gradient(&lg, w)
        };
        // ε_r F_r = c·e: H_r scaled by b (or Nesterov's formed feature; before the range
        // only the carried part).
        let (e, c) = match &nesterov_feature {
            Some(f) => (f, 1.0),
            None => (&h, b_coef),
        };
        // Clipping by norm scales step r's data gradient by c_r (not the weight decay).
        let cg = c * s.rule.grad_scale_at(r);
        let hg = e.dot(&g, l0);
        machine.iter_mut().zip(&hg).for_each(|(x, y)| *x -= cg * y);
        if let Some(sp) = split.as_mut() {
            sp.add(r, -cg, e, &g, l0);
        }
        if s.rule.wd_coupled != 0.0 {
            let hw = e.dot(&wr, l0);
            reg.iter_mut().zip(&hw).for_each(|(x, y)| *x -= s.rule.wd_coupled * c * y);
            if let Some(sp) = split.as_mut() {
                sp.add(r, -s.rule.wd_coupled * c, e, &wr, l0);
            }
        }
        if frozen.is_none() {
            let kr = step_gram(ts, e, c / a_scale(lrs[r]), w, (layout, p, m, k), split.as_mut(), &mut scratch, l0);
            gram.add(&kr);
            if s.req.per_step {
                per_step.push(kr.finish());
            }
        }
    }
    // The steps before the range as one term: H is now H_lo.
    let carried = replay.carry.as_ref().map(|u| h.dot(u, l0).into_iter().map(|v| -v).collect::<Vec<f64>>());
    if let Some(c) = &carried {
        machine.iter_mut().zip(c).for_each(|(x, y)| *x += y);
    }
    machine.iter_mut().zip(&reg).zip(&rounding).for_each(|((x, y), z)| *x += y + z);
    records.reverse();
    per_step.reverse();
    let gram = match &frozen {
        // The NTK: its one Gram, of the frozen features (into the layers' Grams, which are empty).
        Some((ts0, rg0)) => step_gram(ts0, &rg0.jbar, 1.0, w, (layout, p, m, k), split.as_mut(), &mut scratch, l0).finish(),
        None => gram.finish(),
    };
    let layers = split.map(|sp| (sp.grams.into_iter().map(GramSink::finish).collect(), sp.change));
    Ok(Backward { gram, per_step, machine, reg, rounding, carried, records, layers })
}

/// One step's Gram `c·⟨F, ∇f(x_i)⟩` (`F` the row feature `[P·K, W]`) against the training side
/// `ts`; with the per-layer decomposition each layer's part is contracted alone and added to its
/// Gram in `split`, and the step's Gram is their sum.
#[allow(clippy::too_many_arguments)]
fn step_gram(ts: &TrainSide, f: &Feature, c: f64, w: usize, (layout, p, m, k): (Layout, usize, usize, usize), split: Option<&mut Split>, scratch: &mut Vec<f64>, l0: Option<&Layer0>) -> GramSink {
    let mut kr = GramSink::new(layout, p, m, k);
    match split {
        Some(sp) => {
            for (l, range) in sp.ranges.iter().enumerate() {
                let mut kl = GramSink::new(layout, p, m, k);
                ts.contract_layer(f, w, l, range, &mut kl, scratch, l0);
                kl.scale(c);
                kr.add(&kl);
                sp.grams[l].add(&kl);
            }
        }
        None => {
            ts.contract(f, w, &mut kr, scratch, l0);
            kr.scale(c);
        }
    }
    kr
}

/// Step r's record: the linearisation `J̄_r·Δw_r` against the actual change of the row points'
/// outputs, and the quadrature's work on the row gradients `rg`.
fn step_record(s: &Prepared<'_>, r: usize, rg: &RowGradients, wr: &[f64], l0: Option<&Layer0>) -> Result<StepRecord> {
    let (p, k) = (s.rows.len(), s.arch().outputs());
    let pk = p * k;
    let actual_dw: Vec<f64> = s.states[r + 1].flat().iter().zip(wr).map(|(a, b)| a - b).collect();
    let pred = rg.jbar.dot(&actual_dw, l0);
    let f0 = s.values(&s.states[r], &s.rows.x, s.off_rows.as_deref())?;
    let f1 = s.values(&s.states[r + 1], &s.rows.x, s.off_rows.as_deref())?;
    let mut rec = StepRecord { step: r, dpk_cosine_error: f64::NAN, ..Default::default() };
    let (mut mx, mut sum, mut ch) = (0.0f64, 0.0, 0.0f64);
    for idx in 0..pk {
        let actual = f1[idx] - f0[idx];
        let e = (pred[idx] - actual).abs();
        mx = nan_max(mx, e);
        sum += e;
        ch = nan_max(ch, actual.abs());
    }
    rec.max_abs_error = mx;
    rec.mean_abs_error = sum / pk as f64;
    rec.max_abs_change = ch;
    rec.mean_evaluations = rg.evaluations.iter().sum::<usize>() as f64 / p as f64;
    rec.max_evaluations = rg.evaluations.iter().copied().max().unwrap_or(0);
    rec.mean_jvp_evaluations = rg.jvp_evaluations.iter().sum::<usize>() as f64 / p as f64;
    rec.mean_pieces = rg.pieces.iter().sum::<usize>() as f64 / p as f64;
    rec.unconverged_pieces = rg.unconverged;
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use crate::kernel::layout::Layout;
    use crate::kernel::quadrature::Rule;
    use crate::kernel::types::{max_abs, max_abs_diff, KernelKind};
    use crate::kernel::{self, Request};
    use std::sync::atomic::Ordering::Relaxed;

    /// The stack's first dense layer carried as its factor `δ̄` ([`super::row_side::Layer0`])
    /// gives what the same layer carried densely gives — the Gram, the machine and its terms,
    /// the per-step Grams and the per-layer shares — in every layout, under momentum with
    /// coupled weight decay and under mini-batch momentum with decoupled decay, with a
    /// parameter-free layer ahead of it (its input is then not the data) and without a bias;
    /// and the NTK of a momentum run.
    #[test]
    fn first_dense_layer_as_its_factor_equals_it_dense() {
        // Flips the process-wide test switches: no other test's kernel runs meanwhile.
        let _switches = crate::kernel::test_switches::exclusive();
        let dir = tempfile::tempdir().unwrap();
        let nets = [
            ("momentum", r#"[{ dense = 9 }, "relu", { dense = 7 }, "tanh", { dense = 3 }]"#, "momentum = 0.9\nweight_decay = 0.01"),
            ("sgd-decoupled", r#"["tanh", { dense = { features = 8, bias = false } }, "relu", "layer_norm", { dense = 3 }]"#, "optimizer = \"sgd\"\nbatch_size = 5\nmomentum = 0.8\nweight_decay = 0.05\nweight_decay_mode = \"decoupled\""),
        ];
        for (name, layers, optim) in nets {
            let toml = format!("[data]\nkind = \"gaussian-mixture\"\ndim = 3\nper_class = 4\nn_test = 5\nseed = 2\n\n[model]\nkind = \"layers\"\nlayers = {layers}\n\n[train]\nlr = 0.3\nsteps = 4\nseed = 5\n{optim}\n");
            let (run, states, pts) = crate::kernel::stack::tests::trained(dir.path(), name, &toml);
            let mut reqs = Vec::new();
            for layout in [Layout::Full, Layout::Diag, Layout::Trace] {
                for rule in [Rule::Auto(1e-12), Rule::Gauss(3)] {
                    reqs.push(Request::new(KernelKind::Epk).rule(rule).layout(layout).per_step(true).per_layer(layout == Layout::Full));
                }
            }
            reqs.push(Request::new(KernelKind::Ntk).rule(Rule::Gauss(1)).layout(Layout::Full));
            for req in reqs {
                super::LAYER0_OFF_TEST.store(true, Relaxed);
                let dense = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                super::LAYER0_OFF_TEST.store(false, Relaxed);
                let factor = kernel::compute(&run, &states, &pts, &req, &|_, _| {});
                let (dense, factor) = (dense.unwrap(), factor.unwrap());
                let what = format!("{name} {:?} {:?} {}", req.kind, req.layout, req.rule);
                let rel = |a: &[f64], b: &[f64]| max_abs_diff(a, b) / max_abs(b).max(1e-300);
                assert!(rel(&factor.gram, &dense.gram) <= 1e-12, "{what}: Gram {:e}", rel(&factor.gram, &dense.gram));
                assert!(rel(&factor.machine, &dense.machine) <= 1e-12, "{what}: machine");
                if matches!(req.rule, Rule::Auto(_)) {
                    assert!(factor.max_abs_error() <= 1e-10, "{what}: machine vs network {:e}", factor.max_abs_error());
                }
                for (a, b) in [(&factor.reg, &dense.reg), (&factor.rounding, &dense.rounding)] {
                    if let (Some(a), Some(b)) = (a, b) {
                        assert!(max_abs_diff(a, b) <= 1e-12 * max_abs(&factor.machine), "{what}: a term of the machine");
                    }
                }
                if let (Some(a), Some(b)) = (&factor.per_step, &dense.per_step) {
                    assert!(rel(a, b) <= 1e-12, "{what}: per-step Grams");
                }
                if let (Some(a), Some(b)) = (&factor.layers, &dense.layers) {
                    for (ga, gb) in a.gram.iter().zip(&b.gram) {
                        assert!(rel(ga, gb) <= 1e-12, "{what}: a layer's Gram");
                    }
                    assert!(rel(&a.change, &b.change) <= 1e-12, "{what}: the layers' shares of the machine");
                }
            }
        }
    }
}
