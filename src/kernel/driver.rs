//! The plain driver: one kernel computation of a run trained with plain gradient steps
//! (GD/SGD), from a [`Prepared`] computation to the kernel machine and its per-step validation
//! (nodes → contraction → accumulation → validation). Runs whose optimizer keeps state take
//! [`super::stateful`] instead; [`super::entry::compute`] chooses.

use super::gram::{self, GramAccumulator};
use super::layout::Layout;
use super::models::{CnnModel, GenericModel, MlpModel, StepInput, StepModel};
use super::prepare::Prepared;
use super::types::{max_abs_diff, nan_max, ColumnShare, KernelForm, KernelKind, KernelOutput, StepRecord};
use crate::error::Result;

/// The kernel of a plain-gradient run (see the module docs).
pub(super) fn compute(prep: &Prepared<'_>, progress: &dyn Fn(usize, usize)) -> Result<KernelOutput> {
    let req = prep.req;
    let (layout, start) = (req.layout, prep.start);
    let manifest = &*prep.manifest;
    let (train, states, rows) = (prep.train, prep.states, prep.rows);
    let arch = prep.arch();
    let n = manifest.steps;
    let (p, m_all, k, d) = (rows.len(), train.n_train(), arch.outputs(), rows.dim);
    let (c0, c1) = prep.cols;
    let share = (c0, c1) != (0, m_all);
    let m = c1 - c0;
    let (structured, conv_fast) = (prep.structured, prep.conv_fast);
    let init = &states[0];
    let values = |state, x, off| prep.values(state, x, off);
    let (off_rows, off_train) = (&prep.off_rows, &prep.off_train);
    let x_cols = &train.x_train[c0 * d..c1 * d];
    let off_cols = off_train.as_deref().map(|o| &o[c0 * k..c1 * k]);
    let (lo, hi) = (prep.lo, prep.hi);
    // Network values at the states used, and a_{i,s} (zero outside the steps summed).
    let mut f_rows: Vec<Vec<f64>> = vec![Vec::new(); n + 1];
    let mut a = vec![0.0; n * m * k];
    let mut lossgrads: Vec<Vec<f64>> = vec![Vec::new(); n];
    for s in lo..=hi {
        // The NTK's machine is checked once, against f at the ends; path kernels per step.
        if req.kind != KernelKind::Ntk || s == lo || s == hi {
            f_rows[s] = values(&states[s], &rows.x, off_rows.as_deref())?;
        }
        if s < hi {
            // Cross-entropy's ∂L/∂f depends on the labels only; MSE's on the outputs.
            let g = prep.loss_gradient(s, None)?;
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
    let steps: Vec<usize> = match prep.ntk_step {
        Some(s) => vec![s],
        None => (lo..hi).collect(),
    };
    let integrate = prep.integrate;
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
    let tol_step = prep.tol_step;
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
