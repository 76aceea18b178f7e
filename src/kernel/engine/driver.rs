//! The plain driver: one kernel computation of a run trained with plain gradient steps
//! (GD/SGD), from a [`Prepared`] computation to the kernel machine and its per-step validation
//! (nodes → contraction → accumulation → validation). Runs whose optimizer keeps state take
//! [`crate::kernel::engine::stateful`] instead; [`crate::kernel::engine::entry::compute`] chooses.

use crate::kernel::gram::{self, GramAccumulator};
use crate::kernel::layout::Layout;
use crate::kernel::generic::GenericModel;
use crate::kernel::step_model::{StepInput, StepModel, StepOutput};
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::types::{
    max_abs_diff, nan_max, ColumnShare, KernelForm, KernelKind, KernelOutput, LayerShares,
    StepRecord,
};
use crate::error::{Error, Result};
use crate::model::param_layers;

/// The sizes of one plain computation.
#[derive(Clone, Copy)]
struct Dims {
    /// Row points.
    p: usize,
    /// Columns: the training points `[c0, c1)` of the share.
    m: usize,
    c0: usize,
    c1: usize,
    k: usize,
    /// Recorded steps.
    n: usize,
    /// Whether the columns are a share of the training points.
    share: bool,
}

/// The kernel of a plain-gradient run (see the module docs).
pub(in crate::kernel) fn compute(prep: &Prepared<'_>, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    let req = prep.req;
    let layout = req.layout;
    let (m_all, (c0, c1)) = (prep.train.n_train(), prep.cols);
    let d = Dims { p: prep.rows.len(), m: c1 - c0, c0, c1, k: prep.arch().outputs(), n: prep.manifest.steps, share: (c0, c1) != (0, m_all) };
    let (p, m, k, n, share) = (d.p, d.m, d.k, d.n, d.share);
    let (lo, hi) = (prep.lo, prep.hi);
    let path = path_values(prep, &d)?;
    let bias = path.f_rows[lo].clone();
    let network = path.f_rows[hi].clone();
    let steps: Vec<usize> = match prep.ntk_step {
        Some(s) => vec![s],
        None => (lo..hi).collect(),
    };
    let want_diag = matches!(req.kind, KernelKind::Ntk | KernelKind::Dpk | KernelKind::Epk | KernelKind::Path);
    let mut acc = accumulate_steps(prep, &d, &steps, &path, &bias, &network, want_diag, progress)?;
    let a = path.a;
    let gram = acc.gram;
    let layers = acc.layers;
    let track = acc.track;
    if req.kind == KernelKind::Ntk {
        acc.records[0].max_abs_error = if share { f64::NAN } else { max_abs_diff(&track.machine, &network) };
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
    let keep_steps = track.keep_steps;
    Ok(KernelOutput {
        kind: req.kind,
        rule: req.rule,
        side: req.side,
        integrated: prep.integrate,
        p,
        m,
        k,
        steps,
        layout,
        contraction: acc.contraction,
        gram,
        per_step: acc.per_step,
        diag: if want_diag { Some(acc.diag) } else { None },
        a,
        bias,
        network,
        machine: track.machine,
        single_machine,
        records: acc.records,
        seconds: prep.start.elapsed().as_secs_f64(),
        form: KernelForm::Gradient,
        reg: None,
        decomposition_residual: None,
        rounding: None,
        carried: None,
        columns: share.then(|| ColumnShare {
            range: (c0, c1),
            of: m_all,
            machine_whole: false,
            step_pred: keep_steps.then_some(track.step_pred),
            step_actual: keep_steps.then_some(track.step_actual),
        }),
        layers,
    })
}

/// What the path gives before any contraction.
struct PathValues {
    /// The row points' network values at the states used (`[P·K]` each, empty elsewhere).
    f_rows: Vec<Vec<f64>>,
    /// `a_{i,s}` of the columns (`[N, M, K]`, zero outside the steps summed).
    a: Vec<f64>,
    /// Chen's kernel only: the columns' `∂L/∂f` per step (`[M·K]` each).
    lossgrads: Vec<Vec<f64>>,
}

/// The network values of the row points along `[lo, hi]` and the training weights `a_{i,s}`.
fn path_values(prep: &Prepared<'_>, d: &Dims) -> Result<PathValues> {
    let req = prep.req;
    let (m, k, n, c0, c1) = (d.m, d.k, d.n, d.c0, d.c1);
    let (states, rows) = (prep.states, prep.rows);
    let (lo, hi) = (prep.lo, prep.hi);
    // Network values at the states used, and a_{i,s} (zero outside the steps summed).
    let mut f_rows: Vec<Vec<f64>> = vec![Vec::new(); n + 1];
    let mut a = vec![0.0; n * m * k];
    let mut lossgrads: Vec<Vec<f64>> = vec![Vec::new(); n];
    for s in lo..=hi {
        // The NTK's machine is checked once, against f at the ends; path kernels per step.
        if req.kind != KernelKind::Ntk || s == lo || s == hi {
            f_rows[s] = prep.values(&states[s], &rows.x, prep.off_rows.as_deref())?;
        }
        if s < hi {
            // Cross-entropy's ∂L/∂f depends on the labels only; MSE's on the outputs.
            let g = prep.loss_gradient(s, None)?;
            // Only the columns' rows of a and ∂L/∂f are kept.
            let g = g[c0 * k..c1 * k].to_vec();
            let eps = prep.manifest.learning_rates[s];
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
    Ok(PathValues { f_rows, a, lossgrads })
}

/// The machine as the steps add to it and, with a column share, each step's predicted and
/// actual change kept for the assembly (the NTK: its one change over the range).
struct MachineTrack {
    machine: Vec<f64>,
    keep_steps: bool,
    step_pred: Vec<f64>,
    step_actual: Vec<f64>,
}

/// What the steps' contractions add up to.
struct Accumulated {
    gram: Vec<f64>,
    per_step: Option<Vec<f64>>,
    contraction: gram::Contraction,
    /// The rows' self-kernel `[P, K, K]` (zero unless wanted).
    diag: Vec<f64>,
    records: Vec<StepRecord>,
    track: MachineTrack,
    /// The per-layer decomposition, when asked for.
    layers: Option<LayerShares>,
}

/// Every step of `steps`: its nodes, its contraction into the Gram (one accumulator, or one
/// per step with `per_step`), and its validation against the network's change.
#[allow(clippy::too_many_arguments)]
fn accumulate_steps(
    prep: &Prepared<'_>,
    d: &Dims,
    steps: &[usize],
    path: &PathValues,
    bias: &[f64],
    network: &[f64],
    want_diag: bool,
    progress: &dyn Fn(usize, usize),
) -> Result<Accumulated> {
    let req = prep.req;
    let layout = req.layout;
    let (states, rows, arch) = (prep.states, prep.rows, prep.arch());
    let (p, m, k, n, c0, c1) = (d.p, d.m, d.k, d.n, d.c0, d.c1);
    let dim = rows.dim;
    let x_cols = &prep.train.x_train[c0 * dim..c1 * dim];
    let off_cols = prep.off_train.as_deref().map(|o| &o[c0 * k..c1 * k]);
    let integrate = prep.integrate;
    let gsize = p * m * layout.per_pair(k);
    // Structured steps accumulate in factor form; the generic path and per-step Grams add here.
    let mut extra: Option<Vec<f64>> = None;
    // One step model for the architecture; one accumulator (or one per step with per_step).
    // The per-layer decomposition's parameter layers (the stack path and the generic one; the
    // entry hands MLPs and CNNs to the stack path for it).
    let split = req.per_layer.then(|| param_layers(&states[0].specs));
    let n_layers = split.as_ref().map(Vec::len);
    let dense_closed = matches!(prep.closed, Some(crate::kernel::stack::closed::ClosedForm::DenseRelu(_)));
    let model: Box<dyn StepModel + '_> = if let Some(closed) = &prep.closed {
        closed.model(closed_rows(req.device, dense_closed)?)
    } else if prep.stack_fast {
        Box::new(crate::kernel::stack::StackModel { arch, per_layer: req.per_layer, pool: Default::default(), device: node_backend(req.device)?, reduce: crate::kernel::stack::reduce_nodes() })
    } else {
        Box::new(GenericModel { arch, init: &states[0], layers: split.as_ref().map(|ls| ls.iter().map(|l| l.flat.clone()).collect()) })
    };
    let what = if prep.stack_fast { "the layer stack's path" } else { "the generic autodiff path" };
    crate::kernel::backend::check_path(req.device, prep.stack_fast, what)?;
    let backend = crate::kernel::backend::Backend::open(req.device)?;
    // The accumulator's bias column: a closed form's layers say (a stack's `arch.bias` is not
    // its layers').
    let acc_bias = prep.closed.as_ref().map_or(arch.bias, |c| c.bias());
    let new_acc = || -> Result<GramAccumulator> {
        let acc = GramAccumulator::with_layout(layout, p, m, k, acc_bias).with_output_alpha(arch.alpha).with_layers(n_layers).with_backend(backend.clone());
        Ok(match resident_gram(req.device, dense_closed, layout, p, m, k, backend.block_bytes(gram::BLOCK_BYTES))? {
            Some(r) => acc.with_resident(r),
            None => acc,
        })
    };
    let mut layer_grams: Option<Vec<Vec<f64>>> = None;
    let mut change: Vec<f64> = Vec::new();
    let mut acc = if req.per_step { None } else { Some(new_acc()?) };
    let mut per_step = if req.per_step { Some(Vec::with_capacity(gsize * steps.len())) } else { None };
    let mut contraction = gram::Contraction::default();
    let mut records = Vec::with_capacity(steps.len());
    let keep_steps = d.share;
    let step_pred = Vec::with_capacity(if keep_steps { steps.len() * p * k } else { 0 });
    let step_actual = Vec::with_capacity(step_pred.capacity());
    let mut track = MachineTrack { machine: bias.to_vec(), keep_steps, step_pred, step_actual };
    let mut diag = vec![0.0; p * k * k];
    // Rows that are the columns at t = 0 (not integrated, the same points and offsets, an
    // unscaled training side): a symmetric Gram whose rows' gradients are the training side's.
    let rows_are_columns = !integrate && req.kind != KernelKind::Chen && !d.share && rows.x[..] == x_cols[..] && prep.off_rows.as_deref() == off_cols;
    for (count, &s) in steps.iter().enumerate() {
        progress(count, steps.len());
        let next = if s < n && integrate { Some(&states[s + 1]) } else { None };
        let fixed = if integrate { req.rule.fixed_nodes() } else { Some(vec![(0.0, 1.0)]) };
        let (a_eff, colw) = step_weights(prep, d, path, s);
        let input = StepInput {
            state: &states[s],
            next,
            rows,
            off_rows: prep.off_rows.as_deref(),
            x_train: x_cols,
            off_train: off_cols,
            fixed: fixed.as_deref(),
            tol_step: prep.tol_step,
            tol: prep.tol,
            a: &a_eff,
            colw: colw.as_deref(),
            cosine: integrate && prep.stack_fast && req.kind != KernelKind::Path,
            self_kernel: want_diag,
            train_integrated: req.kind == KernelKind::Path,
            rows_are_columns,
        };
        let mut one = if acc.is_none() { Some(new_acc()?) } else { None };
        let target = match acc.as_mut() {
            Some(a) => a,
            None => one.as_mut().expect("created above"),
        };
        let mut out = model.add_step(&input, target, &mut diag)?;
        target.check()?;
        if let Some(n) = n_layers {
            if out.layer_pred.len() != n {
                return Err(Error::Config("the per-layer decomposition is not implemented on this path".into()));
            }
            std::mem::take(&mut out.layer_pred).iter().for_each(|l| change.extend_from_slice(l));
        }
        if let Some(mut one) = one {
            one.flush();
            one.check()?;
            contraction.add(&one.contraction());
            let (gs, ls) = one.finish_layers();
            add_layers(&mut layer_grams, ls);
            add_into(&mut extra, &gs);
            if let Some(ps) = per_step.as_mut() {
                ps.extend_from_slice(&gs);
            }
        }
        records.push(validate_step(req.kind, d, s, out, &path.f_rows, bias, network, &mut track));
    }
    if let Some(a) = acc.as_mut() {
        a.flush();
        a.check()?;
        contraction.add(&a.contraction());
    }
    let gram = match (acc, extra) {
        (Some(acc), None) => {
            let (g, ls) = acc.finish_layers();
            add_layers(&mut layer_grams, ls);
            g
        }
        (Some(acc), Some(e)) => {
            let (mut g, ls) = acc.finish_layers();
            add_layers(&mut layer_grams, ls);
            g.iter_mut().zip(&e).for_each(|(a, b)| *a += b);
            g
        }
        (None, Some(e)) => e,
        (None, None) => vec![0.0; gsize],
    };
    backend.release();
    let layers = split.map(|ls| LayerShares { names: ls.into_iter().map(|l| l.name).collect(), gram: layer_grams.unwrap_or_default(), change });
    Ok(Accumulated { gram, per_step, contraction, diag, records, track, layers })
}

/// Adds one accumulator's per-layer Grams into the running sums.
fn add_layers(sum: &mut Option<Vec<Vec<f64>>>, layers: Option<Vec<Vec<f64>>>) {
    match (sum.as_mut(), layers) {
        (Some(s), Some(ls)) => s.iter_mut().zip(&ls).for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(x, y)| *x += y)),
        (None, Some(ls)) => *sum = Some(ls),
        (_, None) => {}
    }
}

/// Step `s`'s effective training weights and, for Chen's kernel, its column weights `|∂L/∂f|`.
///
/// The weights are `a_{i,s}` (Chen: `a·|∂L/∂f| = −ε ∂L/∂f`); for the NTK the path's
/// `Σ_s a_{i,s}`, so that the step's prediction is the linearised machine's whole change.
fn step_weights(prep: &Prepared<'_>, d: &Dims, path: &PathValues, s: usize) -> (Vec<f64>, Option<Vec<f64>>) {
    let kind = prep.req.kind;
    let (mk, a, lossgrads) = (d.m * d.k, &path.a, &path.lossgrads);
    let a_eff: Vec<f64> = if kind == KernelKind::Ntk {
        let mut asum = vec![0.0; mk];
        for s in prep.lo..prep.hi {
            asum.iter_mut().zip(&a[s * mk..(s + 1) * mk]).for_each(|(x, y)| *x += y);
        }
        asum
    } else {
        match kind {
            KernelKind::Chen => lossgrads[s].iter().map(|g| -prep.manifest.learning_rates[s] * g).collect(),
            _ => a[s * mk..(s + 1) * mk].to_vec(),
        }
    };
    let colw: Option<Vec<f64>> = if kind == KernelKind::Chen { Some(lossgrads[s].iter().map(|v| v.abs()).collect()) } else { None };
    (a_eff, colw)
}

/// Adds step `s`'s prediction to the machine and records it against the network's actual
/// change over the step (the NTK: against nothing yet; its one record is checked at the end).
#[allow(clippy::too_many_arguments)]
fn validate_step(kind: KernelKind, d: &Dims, s: usize, out: StepOutput, f_rows: &[Vec<f64>], bias: &[f64], network: &[f64], track: &mut MachineTrack) -> StepRecord {
    let (p, k) = (d.p, d.k);
    let keep_steps = track.keep_steps;
    let machine = &mut track.machine;
    let cosine = out.cosine;
    let (pred, evaluations, jvp_evaluations, pieces, unconverged) = (out.pred, out.stats.evaluations, out.stats.jvp_evaluations, out.stats.pieces, out.stats.unconverged);
    // Predicted change over this step vs the network's actual change.
    let mut rec = StepRecord { step: s, ..Default::default() };
    if kind == KernelKind::Ntk {
        // Linearised model around w_S: f ≈ b + Σ_s Σ_i a_{i,s} K_NTK(x, x_i).
        machine.iter_mut().zip(&pred).for_each(|(mv, pv)| *mv += pv);
        if keep_steps {
            track.step_pred.extend_from_slice(&pred);
            track.step_actual.extend(network.iter().zip(bias).map(|(f1, f0)| f1 - f0));
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
                    track.step_actual.push(actual);
                }
            }
        }
        if keep_steps {
            // One block's share of the prediction: its error is not the machine's.
            track.step_pred.extend_from_slice(&pred);
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
    rec
}

/// `out[p, kt] = Σ_{i,ks} a[i, ks] G[p, i, kt, ks]`.
///
/// # Shapes
/// `g` `[P, M, K, K]`, `a` `[M, K]`; returns `[P, K]`.
pub(crate) fn contract(g: &[f64], a: &[f64], p: usize, m: usize, k: usize) -> Vec<f64> {
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

/// Where a layer stack's gradient evaluations run: on the GPU with `--device cuda` (the device
/// program, `crate::device`), else here. The tests route them through the same program on the
/// host backend ([`NODES_ON_HOST`]).
fn node_backend(device: crate::kernel::backend::Device) -> Result<Option<std::sync::Arc<dyn crate::device::NodeBackend>>> {
    #[cfg(test)]
    if NODES_ON_HOST.with(|c| c.get()) {
        return Ok(Some(std::sync::Arc::new(crate::device::OnBackend::new(std::sync::Arc::new(crate::device::host::Host), 13))));
    }
    Ok(match device {
        crate::kernel::backend::Device::Cpu => None,
        crate::kernel::backend::Device::Cuda => {
            Some(std::sync::Arc::new(crate::device::OnBackend::new(crate::device::cuda::Cuda::shared()?, DEVICE_ROWS)))
        }
    })
}

/// Where the `dense → relu → dense` closed form integrates its rows: on the GPU with `--device
/// cuda` (`kernel::stack::closed::dense_relu::device`), else here. The tests route them through
/// the same kernel on the host backend ([`CLOSED_ON_HOST`]).
fn closed_rows(device: crate::kernel::backend::Device, dense_closed: bool) -> Result<Option<std::sync::Arc<dyn crate::kernel::stack::closed::dense_relu::device::RowsOnDevice>>> {
    use crate::kernel::stack::closed::dense_relu::device::OnDevice;
    if !dense_closed {
        return Ok(None);
    }
    #[cfg(test)]
    if CLOSED_ON_HOST.with(|c| c.get()) {
        return Ok(Some(std::sync::Arc::new(OnDevice::new(std::sync::Arc::new(crate::device::host::Host)))));
    }
    Ok(match device {
        crate::kernel::backend::Device::Cpu => None,
        crate::kernel::backend::Device::Cuda => Some(std::sync::Arc::new(OnDevice::new(crate::device::cuda::Cuda::shared()?))),
    })
}

/// Where the `dense → relu → dense` closed form's Gram accumulates: resident on the GPU with
/// `--device cuda` (`kernel::backend::resident`), else on the host. The tests route it through
/// the same code on the host backend ([`CLOSED_ON_HOST`]).
fn resident_gram(device: crate::kernel::backend::Device, dense_closed: bool, layout: Layout, p: usize, m: usize, k: usize, block_bytes: usize) -> Result<Option<Box<dyn crate::kernel::backend::resident::Resident>>> {
    use crate::kernel::backend::resident::ResidentGram;
    if !dense_closed {
        return Ok(None);
    }
    #[cfg(test)]
    if CLOSED_ON_HOST.with(|c| c.get()) {
        RESIDENT_USED.with(|c| c.set(c.get() + 1));
        // Small blocks, so that the tests' few points still run several of them.
        return Ok(Some(Box::new(ResidentGram::new(std::sync::Arc::new(crate::device::host::Host), layout, p, m, k, 8 * m * layout.per_pair(k) * 3)?)));
    }
    Ok(match device {
        crate::kernel::backend::Device::Cpu => None,
        crate::kernel::backend::Device::Cuda => Some(Box::new(ResidentGram::new(crate::device::cuda::Cuda::shared()?, layout, p, m, k, block_bytes)?)),
    })
}

/// Node rows per device call: enough to fill a GPU with GEMMs (LeNet-5's K = 10 cotangents of
/// the first convolution's patches are 196 000 numbers a row, twice with the `ΔW` product:
/// ~1.6 GB a call).
const DEVICE_ROWS: usize = 512;

#[cfg(test)]
thread_local! {
    /// Set by a test: this thread's layer-stack kernels evaluate their nodes through the device
    /// program on the host backend.
    pub(crate) static NODES_ON_HOST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set by a test: this thread's `dense → relu → dense` closed forms take their device route
    /// on the host backend (the rows' kernel, the Gram's resident contraction).
    pub(crate) static CLOSED_ON_HOST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// How many accumulators [`CLOSED_ON_HOST`] made resident on this thread.
    pub(crate) static RESIDENT_USED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
