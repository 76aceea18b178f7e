//! The MLP preset's quadrature nodes of one step: fixed rules, the adaptive kink-aware rule's
//! search ([`crate::kernel::quadrature::nodes::choose_auto_nodes`]) with gradients once at the
//! accepted nodes, and the paper's Fig. 2 cosine measure of the DPK's test gradient.

use crate::kernel::mlp::step::{Evals, FirstLayer, MlpStep};
use crate::kernel::quadrature::nodes::{choose_auto_nodes, gather_offsets, gather_rows, AlongPath, JVP_CHUNK};

/// Test-side nodes of one step for all row points.
pub(crate) struct RowNodes {
    pub(crate) point: Vec<usize>,
    pub(crate) weight: Vec<f64>,
    pub(crate) evals: Evals,
    pub(crate) evaluations: Vec<usize>,
    pub(crate) jvp_evaluations: Vec<usize>,
    pub(crate) pieces: Vec<usize>,
    pub(crate) unconverged: usize,
}

/// Nodes of a fixed rule (the same for every point). With `first` (layer 0 of the step at the
/// points `x`) the evaluations skip the input GEMM and leave `acts[0]` empty.
pub(crate) fn fixed_nodes(step: &MlpStep, x: &[f64], p: usize, off: Option<&[f64]>, nodes: &[(f64, f64)], first: Option<&FirstLayer>) -> RowNodes {
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
    let evals = eval_rows(step, x, off, &point, &t, first);
    RowNodes { point, weight, evals, evaluations: vec![nodes.len(); p], jvp_evaluations: vec![0; p], pieces: vec![1; p], unconverged: 0 }
}

/// `step.eval` with gradients at points `idx` (rows of `x`) and times `t`, in chunks of
/// [`JVP_CHUNK`] rows (bounds the evaluation's intermediates; the result is the same). With
/// `first`, layer 0 comes from the cache and `acts[0]` stays empty.
pub(crate) fn eval_rows(step: &MlpStep, x: &[f64], off: Option<&[f64]>, idx: &[usize], t: &[f64], first: Option<&FirstLayer>) -> Evals {
    let (d, k) = (step.input_dim(), step.k);
    let one = |ic: &[usize], tc: &[f64]| -> Evals {
        let offr = gather_offsets(off, k, ic);
        match first {
            Some(fl) => step.eval_at(fl, ic, tc, offr.as_deref(), true),
            None => step.eval(&gather_rows(x, d, ic), tc, offr.as_deref(), true),
        }
    };
    if idx.len() <= JVP_CHUNK {
        return one(idx, t);
    }
    let mut out = Evals::default();
    for (ic, tc) in idx.chunks(JVP_CHUNK).zip(t.chunks(JVP_CHUNK)) {
        let e = one(ic, tc);
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

/// The adaptive, kink-aware rule. Each step is split at the kinks of every row point; each
/// smooth piece `[a, b]` gets the smallest Gauss–Legendre order (from [`AUTO_ORDERS`]) whose
/// quadrature of `d/dt f` matches the exact change `f(b) − f(a)` to `tol_step·(b − a)` (or to
/// the rounding floor of that difference); pieces that fail every order are bisected. The
/// search uses forward-mode evaluations only (`f` and `df/dt`, no backward pass); gradients are
/// then computed once, at the accepted nodes.
pub(crate) fn auto_nodes(step: &MlpStep, x: &[f64], p: usize, off: Option<&[f64]>, tol_step: f64, first: Option<&FirstLayer>) -> RowNodes {
    let c = match first {
        Some(fl) => choose_auto_nodes(&MlpAt { step, first: fl }, x, p, off, tol_step),
        None => choose_auto_nodes(step, x, p, off, tol_step),
    };
    // Gradients once, at the accepted nodes.
    let evals = eval_rows(step, x, off, &c.point, &c.times, first);
    RowNodes { point: c.point, weight: c.weight, evals, evaluations: c.evaluations, jvp_evaluations: c.jvp_evaluations, pieces: c.pieces, unconverged: c.unconverged }
}

impl AlongPath for MlpStep {
    fn outputs(&self) -> usize {
        self.k
    }
    fn kinks(&self, x: &[f64], p: usize, a: f64, b: f64) -> Vec<f64> {
        let d = self.input_dim();
        MlpStep::kinks(self, &x[p * d..(p + 1) * d], a, b)
    }
    fn jvp_points(&self, x: &[f64], idx: &[usize], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        MlpStep::jvp(self, &gather_rows(x, self.input_dim(), idx), t, gather_offsets(off, self.k, idx).as_deref())
    }
}

/// An MLP step with its layer 0 precomputed at the row points ([`MlpStep::first_layer`]): the
/// node search then never touches the inputs again.
pub(crate) struct MlpAt<'a> {
    pub(crate) step: &'a MlpStep,
    pub(crate) first: &'a FirstLayer,
}

impl AlongPath for MlpAt<'_> {
    fn outputs(&self) -> usize {
        self.step.k
    }
    fn kinks(&self, x: &[f64], p: usize, a: f64, b: f64) -> Vec<f64> {
        let d = self.step.input_dim();
        self.step.kinks_at(self.first, p, &x[p * d..(p + 1) * d], a, b)
    }
    fn jvp_points(&self, _x: &[f64], idx: &[usize], t: &[f64], off: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
        self.step.jvp_at(self.first, idx, t, gather_offsets(off, self.step.k, idx).as_deref())
    }
}

/// The paper's Fig. 2 measure for one step: its sum over points and classes (and their count) of
/// `1 − cos(∇f_{w_s}(x), ∫∇f_{w_s(t)}(x) dt)`, from the structured factors (layer 0 in its
/// rank-one form, deeper layers by forming the t-averaged layer gradient).
pub(crate) fn dpk_cosine_error(step: &MlpStep, nodes: &RowNodes, x: &[f64], off: Option<&[f64]>, p: usize, first: Option<&FirstLayer>) -> (f64, usize) {
    let k = step.k;
    let zeros = vec![0.0; p];
    let mut at0 = match first {
        Some(fl) => step.eval_at(fl, &(0..p).collect::<Vec<_>>(), &zeros, off, true),
        None => step.eval(x, &zeros, off, true),
    };
    if at0.acts[0].is_empty() {
        at0.acts[0] = x.to_vec();
    }
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
