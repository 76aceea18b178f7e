//! Column blocks: a Gram against a range of the training points and the assembly of such blocks
//! into the whole.
//!
//! `G[p, i]` involves training point i alone, and the kernel machine
//! `f(x) = b + Σ_s Σ_i a_{i,s} K_s(x, x_i)` is a sum over the training points, so the columns
//! `[0, M)` split into blocks `[0, M_1), [M_1, M_2), …` computed apart
//! (`crate::kernel::Options::columns`: every path forms the training-side factors of its block only)
//! and assembled here: the Gram blocks side by side, `a` likewise, and the kernel machine either
//! re-summed as the one-process driver sums it, `b` plus each step's predicted change in step
//! order, that change being the blocks' per-step shares summed in block order, with the
//! per-step validation recomputed from it (plain gradient steps), or, for momentum and Adam,
//! block 0's, which every block computes whole ([`crate::kernel::ColumnShare`] says why).

use crate::kernel::engine::driver::contract;
use crate::kernel::layout::Layout;
use crate::kernel::types::{max_abs, max_abs_diff, nan_max, KernelForm, KernelKind, KernelOutput};
use crate::error::{Error, Result};

/// Assembles column blocks, in the order given (which fixes the order of every sum), into the
/// output over all training points. One output without a [`crate::kernel::ColumnShare`] is returned as it is.
///
/// Checks that the blocks cover `[0, M)` in order, agree in shape, request and row points (bias
/// and network), and carry what the assembly needs.
///
/// # Shapes
/// Block c: `gram` `[P, M_c, …]` (its layout), `a` `[N, M_c, K]`; returns `[P, M, …]` and
/// `[N, M, K]` with `M = Σ_c M_c`.
pub fn assemble(parts: Vec<KernelOutput>) -> Result<KernelOutput> {
    let Some(first) = parts.first() else {
        return Err(Error::Data("no column blocks to assemble".into()));
    };
    if parts.len() == 1 && first.columns.is_none() {
        return Ok(parts.into_iter().next().expect("one part"));
    }
    let bad = |msg: String| Err(Error::Data(format!("column blocks: {msg}")));
    let (p, k, layout, kind) = (first.p, first.k, first.layout, first.kind);
    let of = match &first.columns {
        Some(c) => c.of,
        None => return bad("a block without its column range".into()),
    };
    let mut next = 0;
    for (c, o) in parts.iter().enumerate() {
        let Some(share) = &o.columns else { return bad(format!("block {c} has no column range")) };
        if share.range.0 != next || share.range.1 <= share.range.0 || share.of != of || o.m != share.range.1 - share.range.0 {
            return bad(format!("block {c} holds columns {}..{} of {}, expected them to start at {next} of {of}", share.range.0, share.range.1, share.of));
        }
        next = share.range.1;
        if (o.p, o.k, o.layout, o.kind, o.form) != (p, k, layout, kind, first.form) || o.steps != first.steps || o.records.len() != first.records.len() {
            return bad(format!("block {c} was computed for another request or row points"));
        }
        let f = first.columns.as_ref().expect("checked above");
        if share.step_pred.is_none() != share.machine_whole || share.step_actual.is_some() != share.step_pred.is_some() || share.machine_whole != f.machine_whole {
            return bad(format!("block {c} does not carry its machine in the form the others do"));
        }
        if share.step_pred.as_ref().is_some_and(|v| v.len() != o.records.len() * p * k) {
            return bad(format!("block {c}'s per-step predictions have the wrong size"));
        }
        // The row side is the same in every block: the same f at the same states.
        for (what, x, y) in [("bias", &o.bias, &first.bias), ("network", &o.network, &first.network)] {
            let gap = max_abs_diff(x, y);
            if gap.is_nan() || gap > 1e-12 * max_abs(y).max(1.0) {
                return bad(format!("block {c}'s {what} differs from block 0's by {gap:e}: not the same row points or run"));
            }
        }
    }
    if next != of {
        return bad(format!("the blocks cover columns 0..{next} of {of}"));
    }
    let m = of;
    let pp = layout.per_pair(k);
    let n_a = first.a.len() / (first.m * k).max(1);
    let mut gram = vec![0.0; p * m * pp];
    let mut per_step = first.per_step.as_ref().map(|ps| vec![0.0; ps.len() / (first.m * pp).max(1) * m * pp]);
    let mut a = vec![0.0; n_a * m * k];
    let whole = first.columns.as_ref().is_some_and(|c| c.machine_whole);
    let mut pred: Option<Vec<f64>> = None;
    let mut contraction = crate::kernel::gram::Contraction::default();
    let mut seconds = 0.0;
    for o in &parts {
        let (lo, mc) = (o.columns.as_ref().expect("checked").range.0, o.m);
        // Rows of M_c·pp numbers (a Gram row point, or a step's row point, or a step of a)
        // go to columns lo·pp.. of rows of M·pp numbers.
        let place = |dst: &mut [f64], src: &[f64], w: usize| {
            for (r, chunk) in src.chunks_exact(mc * w).enumerate() {
                dst[(r * m + lo) * w..(r * m + lo + mc) * w].copy_from_slice(chunk);
            }
        };
        place(&mut gram, &o.gram, pp);
        if let (Some(dst), Some(src)) = (per_step.as_mut(), o.per_step.as_ref()) {
            place(dst, src, pp);
        }
        if o.a.len() != n_a * mc * k {
            return bad(format!("the block at column {lo} holds a for another number of steps"));
        }
        place(&mut a, &o.a, k);
        if let Some(sp) = o.columns.as_ref().and_then(|c| c.step_pred.as_ref()) {
            match pred.as_mut() {
                None => pred = Some(sp.clone()),
                Some(acc) => acc.iter_mut().zip(sp).for_each(|(x, y)| *x += y),
            }
        }
        contraction.add(&o.contraction);
        seconds += o.seconds;
    }
    let mut records = first.records.clone();
    let machine = match (whole, &pred, first.columns.as_ref().and_then(|c| c.step_actual.as_ref())) {
        (true, _, _) => first.machine.clone(),
        (false, Some(pred), Some(actual)) => {
            // The machine and its per-step validation as the one-process driver computes them:
            // b, then each step's predicted change in step order.
            let mut machine = first.bias.clone();
            for (rec, (ps, as_)) in records.iter_mut().zip(pred.chunks_exact(p * k).zip(actual.chunks_exact(p * k))) {
                machine.iter_mut().zip(ps).for_each(|(mv, pv)| *mv += pv);
                if kind != KernelKind::Ntk {
                    let (mut mx, mut sum) = (0.0f64, 0.0);
                    for (x, y) in ps.iter().zip(as_) {
                        let e = (x - y).abs();
                        mx = nan_max(mx, e);
                        sum += e;
                    }
                    rec.max_abs_error = mx;
                    rec.mean_abs_error = sum / (p * k) as f64;
                }
            }
            if kind == KernelKind::Ntk {
                records[0].max_abs_error = max_abs_diff(&machine, &first.network);
            }
            machine
        }
        _ => return bad("blocks without their per-step predictions".into()),
    };
    let first = parts.into_iter().next().expect("at least one part");
    let mut out = KernelOutput { m, gram, per_step, a, machine, records, contraction, seconds, columns: None, single_machine: None, ..first };
    out.single_machine = single_machine(&out);
    Ok(out)
}

/// Theorem 3.7's single machine `b + Σ_i a_i·G` of an assembled output, as the engine decides
/// it: plain gradient steps (with weight decay the machine also carries `R(x)`, and the engine
/// gives none), `a_{i,s}` constant over all N steps, a path kernel, the full layout.
///
/// # Shapes
/// `o.gram` `[P, M, K, K]`, `o.a` `[N, M, K]`; returns `[P, K]`.
pub fn single_machine(o: &KernelOutput) -> Option<Vec<f64>> {
    let mk = o.m * o.k;
    let n = o.a.len() / mk.max(1);
    let constant_a = n > 0 && (1..n).all(|s| o.a[s * mk..(s + 1) * mk] == o.a[..mk]);
    if o.form == KernelForm::Gradient && constant_a && o.kind != KernelKind::Ntk && o.layout == Layout::Full && o.columns.is_none() {
        let pred = contract(&o.gram, &o.a[..mk], o.p, o.m, o.k);
        Some(o.bias.iter().zip(&pred).map(|(b, v)| b + v).collect())
    } else {
        None
    }
}
