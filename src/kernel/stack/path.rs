//! The path kernel ([`crate::kernel::KernelKind::Path`]) on a layer stack: both sides integrated
//! over the step, `K_s(x, x′) = ⟨J̄_s(x), J̄_s(x′)⟩` with `J̄_s = Σ_r w_r ∇f(w_s(t_r))` over the
//! rule's nodes (fixed, or the adaptive rule's kink-aware nodes of each point).
//!
//! `J̄` has no per-layer factor form (a sum of rank-one `δ ⊗ a` over the nodes), so every layer,
//! dense ones included, is held formed: `[n, K, width]` per parameter layer, the dense layer's
//! `width = out·(in + 1)` in the order of [`RowGrad::Factor`]'s `δ[k] ⊗ [a, 1]`. The training
//! side is `M·K·W` numbers per step ([`MAX_TRAIN_BYTES`]).

use std::borrow::Cow;

use super::step::{RowGrad, StackStep};
use super::{contract_formed, node_bytes, split_predictions, StackAlong, CHUNK_POINTS};
use crate::error::{Error, Result};
use crate::kernel::types::NodeStats;
use crate::kernel::step_model::{StepInput, StepOutput};
use crate::kernel::gram::GramAccumulator;
use crate::kernel::quadrature::nodes::choose_auto_nodes;
use crate::linalg::gemm;

/// Largest integrated training side held for one step.
pub(crate) const MAX_TRAIN_BYTES: u64 = 8 << 30;

/// A dense layer's factors as formed gradients.
///
/// # Shapes
/// `acts` `[R, ne]`, `deltas` `[R, K, out]`; returns `[R, K, out·ne]`.
pub(crate) fn form(acts: &[f64], deltas: &[f64], ne: usize, out: usize, k: usize) -> Vec<f64> {
    let r = acts.len() / ne.max(1);
    let mut g = vec![0.0; r * k * out * ne];
    for j in 0..r {
        let a = &acts[j * ne..(j + 1) * ne];
        for c in 0..k {
            let d = &deltas[(j * k + c) * out..(j * k + c + 1) * out];
            let dst = &mut g[(j * k + c) * out * ne..(j * k + c + 1) * out * ne];
            for (o, &dv) in d.iter().enumerate() {
                dst[o * ne..(o + 1) * ne].iter_mut().zip(a).for_each(|(x, &av)| *x = dv * av);
            }
        }
    }
    g
}

/// The formed width of one parameter layer's gradient.
pub(crate) fn width(g: &RowGrad) -> usize {
    match g {
        RowGrad::Factor { ne, out, .. } => ne * out,
        RowGrad::Formed { width, .. } => *width,
    }
}

/// Adds `Σ_r w_r G_r` of the node rows `(point, weight)` into `jbar` (`[n, K, width]` per layer).
pub(crate) fn accumulate(jbar: &mut [Vec<f64>], grads: Vec<RowGrad>, point: &[usize], weight: &[f64], k: usize) {
    for (jb, g) in jbar.iter_mut().zip(grads) {
        let (g, wd) = match g {
            RowGrad::Factor { acts, deltas, ne, out } => (form(&acts, &deltas, ne, out, k), ne * out),
            RowGrad::Formed { g, width } => (g, width),
        };
        for (r, (&q, &w)) in point.iter().zip(weight).enumerate() {
            jb[q * k * wd..(q + 1) * k * wd].iter_mut().zip(&g[r * k * wd..(r + 1) * k * wd]).for_each(|(a, b)| *a += w * b);
        }
    }
}

/// `J̄` of every point of `x` (`[n, d]`) over the step, one `[n, K, width]` per parameter layer,
/// with the nodes' statistics: the fixed rule's `(t, weight)` nodes, or the adaptive rule.
pub(crate) fn integrated(step: &StackStep<'_>, x: &[f64], off: Option<&[f64]>, fixed: Option<&[(f64, f64)]>, tol_step: f64, widths: &[usize]) -> Result<(Vec<Vec<f64>>, NodeStats)> {
    let (d, k) = (step.d, step.k);
    let n = x.len() / d;
    let bytes = (n * k * widths.iter().sum::<usize>()) as u64 * 8;
    if bytes > MAX_TRAIN_BYTES {
        return Err(Error::OutOfMemoryBudget {
            what: format!("the path kernel's integrated gradients of {n} points [{n}, {k}, {}]", widths.iter().sum::<usize>()),
            needed_bytes: bytes,
            budget_bytes: MAX_TRAIN_BYTES,
            hint: "use fewer training points, or the EPK (its training side is held in factors)".into(),
        });
    }
    let (point, weight, times, stats) = match fixed {
        Some(nodes) => {
            // Point-major, as the EPK's rows (a point's first-layer products formed once).
            let point: Vec<usize> = (0..n).flat_map(|q| std::iter::repeat_n(q, nodes.len())).collect();
            let weight = (0..n).flat_map(|_| nodes.iter().map(|nd| nd.1)).collect();
            let times = (0..n).flat_map(|_| nodes.iter().map(|nd| nd.0)).collect();
            (point, weight, times, NodeStats { evaluations: vec![nodes.len(); n], jvp_evaluations: vec![0; n], pieces: vec![1; n], unconverged: 0 })
        }
        None => {
            let an = choose_auto_nodes(&StackAlong { step }, x, n, off, tol_step, None);
            let stats = NodeStats { evaluations: an.evaluations, jvp_evaluations: an.jvp_evaluations, pieces: an.pieces, unconverged: an.unconverged };
            (an.point, an.weight, an.times, stats)
        }
    };
    let mut jbar: Vec<Vec<f64>> = widths.iter().map(|w| vec![0.0; n * k * w]).collect();
    let block = (node_bytes() / (8 * k * widths.iter().sum::<usize>()).max(1)).max(1);
    for b0 in (0..point.len()).step_by(block) {
        let b1 = (b0 + block).min(point.len());
        let grads = step.grads(x, off, &point[b0..b1], &times[b0..b1]);
        accumulate(&mut jbar, grads, &point[b0..b1], &weight[b0..b1], k);
    }
    Ok((jbar, stats))
}

/// Adds `⟨J̄[p, c], J̄[p, c′]⟩` summed over the layers to `diag` (`[n, K, K]`).
pub(crate) fn add_self_kernel(diag: &mut [f64], jbar: &[&[f64]], n: usize, k: usize) {
    for jb in jbar {
        let wd = jb.len() / (n * k).max(1);
        for p in 0..n {
            for c in 0..k {
                let a = &jb[(p * k + c) * wd..(p * k + c + 1) * wd];
                for c2 in 0..k {
                    let b = &jb[(p * k + c2) * wd..(p * k + c2 + 1) * wd];
                    diag[(p * k + c) * k + c2] += a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
                }
            }
        }
    }
}

/// One step of the path kernel on a stack: the training points' `J̄` (reused as the rows' when
/// the rows are the training points), the rows' `J̄` a chunk at a time, each layer contracted
/// into its sink ([`GramAccumulator::target`]); returns the prediction `⟨J̄_p, Σ_i a_i J̄_i⟩`
/// (per layer when `per_layer`) and the rows' node statistics.
pub(crate) fn add_step(input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64], step: &StackStep<'_>, per_layer: bool) -> Result<StepOutput> {
    let rows = input.rows;
    let (p, d, k) = (rows.len(), rows.dim, step.k);
    let m = input.x_train.len() / d;
    if m == 0 {
        return Err(Error::Config("the path kernel needs training points".into()));
    }
    let widths: Vec<usize> = step.grads(input.x_train, input.off_train, &[0], &[0.0]).iter().map(width).collect();
    let (tj, tstats) = integrated(step, input.x_train, input.off_train, input.fixed, input.tol_step, &widths)?;
    // The prediction weights v_l = Σ_i Σ_k' a[i, k'] J̄_i[k'] (`[width]` per layer).
    let vs: Vec<Vec<f64>> = tj
        .iter()
        .zip(&widths)
        .map(|(g, &w)| {
            let mut v = vec![0.0; w];
            gemm(&mut v, input.a, false, g, false, (1, w, m * k), 1.0, false);
            v
        })
        .collect();
    let scaled: Vec<Cow<'_, [f64]>> = tj
        .iter()
        .zip(&widths)
        .map(|(g, &w)| match input.colw {
            None => Cow::Borrowed(g.as_slice()),
            Some(cw) => Cow::Owned(g.chunks_exact(w).zip(cw).flat_map(|(row, &c)| row.iter().map(move |x| c * x)).collect()),
        })
        .collect();
    let same = rows.x == input.x_train && input.off_rows == input.off_train;
    let layout = acc.sink_mut().layout();
    let mut preds = vec![vec![0.0; p * k]; if per_layer { widths.len() } else { 1 }];
    let mut stats = NodeStats { evaluations: Vec::with_capacity(p), jvp_evaluations: Vec::with_capacity(p), pieces: Vec::with_capacity(p), unconverged: 0 };
    let (mut seconds, mut flops) = (0.0, 0.0);
    for c0 in (0..p).step_by(CHUNK_POINTS) {
        let pc = CHUNK_POINTS.min(p - c0);
        let own;
        let jb: Vec<&[f64]> = if same {
            stats.evaluations.extend_from_slice(&tstats.evaluations[c0..c0 + pc]);
            stats.jvp_evaluations.extend_from_slice(&tstats.jvp_evaluations[c0..c0 + pc]);
            stats.pieces.extend_from_slice(&tstats.pieces[c0..c0 + pc]);
            tj.iter().zip(&widths).map(|(g, &w)| &g[c0 * k * w..(c0 + pc) * k * w]).collect()
        } else {
            let xc = &rows.x[c0 * d..(c0 + pc) * d];
            let offc = input.off_rows.map(|o| &o[c0 * k..(c0 + pc) * k]);
            own = integrated(step, xc, offc, input.fixed, input.tol_step, &widths)?;
            stats.evaluations.extend_from_slice(&own.1.evaluations);
            stats.jvp_evaluations.extend_from_slice(&own.1.jvp_evaluations);
            stats.pieces.extend_from_slice(&own.1.pieces);
            stats.unconverged += own.1.unconverged;
            own.0.iter().map(Vec::as_slice).collect()
        };
        let started = std::time::Instant::now();
        for (li, ((j, tg), v)) in jb.iter().zip(&scaled).zip(&vs).enumerate() {
            let pred = &mut preds[if per_layer { li } else { 0 }];
            flops += contract_formed(layout, acc.target(li).rows_mut(c0..c0 + pc), pred, j, tg, v, c0, m, k);
        }
        seconds += started.elapsed().as_secs_f64();
        if input.self_kernel {
            add_self_kernel(&mut diag[c0 * k * k..(c0 + pc) * k * k], &jb, pc, k);
        }
    }
    if same {
        stats.unconverged += tstats.unconverged;
    }
    acc.add_contraction(seconds, flops);
    let (pred, layer_pred) = split_predictions(preds, per_layer);
    Ok(StepOutput { pred, stats, cosine: f64::NAN, layer_pred })
}
