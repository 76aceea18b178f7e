//! The slow obvious path the MLP's closed form ([`super::pieces`]) is tested against: its step's
//! gradients at given nodes, and the paper's Fig. 2 cosine measure from those gradients.

use crate::kernel::stack::closed::dense_relu::step::{Evals, MlpStep};

/// Nodes of one step for the row points, with the gradients there.
pub(crate) struct RowNodes {
    /// The row point of each node `[R]`.
    pub(crate) point: Vec<usize>,
    /// Its quadrature weight `[R]`.
    pub(crate) weight: Vec<f64>,
    /// The step's activations and sensitivities at the nodes.
    pub(crate) evals: Evals,
}

/// `step.eval` with gradients at points `idx` (rows of `x`, `[P, d]`) and times `t` (`[R]`
/// each), with the points' offsets `off` (`[P, K]`).
pub(crate) fn eval_rows(step: &MlpStep, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64]) -> Evals {
    let (d, k) = (step.input_dim(), step.k);
    let rows: Vec<f64> = idx.iter().flat_map(|&p| x[p * d..(p + 1) * d].iter().copied()).collect();
    let offr: Option<Vec<f64>> = off.map(|o| idx.iter().flat_map(|&p| o[p * k..(p + 1) * k].iter().copied()).collect());
    step.eval(&rows, t, offr.as_deref(), true)
}

/// The paper's Fig. 2 measure for one step: its sum over points and classes (and their count) of
/// `1 − cos(∇f_{w_s}(x), ∫∇f_{w_s(t)}(x) dt)`, from the structured factors (layer 0 in its
/// rank-one form, deeper layers by forming the t-averaged layer gradient).
pub(crate) fn dpk_cosine_error(step: &MlpStep, nodes: &RowNodes, x: &[f64], off: Option<&[f64]>, p: usize) -> (f64, usize) {
    let k = step.k;
    let at0 = step.eval(x, &vec![0.0; p], off, true);
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
