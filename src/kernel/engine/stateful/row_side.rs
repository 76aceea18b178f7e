//! The row side of the backward recursion ([`super`]): a step's integrated row gradients `J̄_s`
//! and the features `H_r` built from them, with an MLP's layer 0 kept in factor form.

use crate::kernel::mlp::step::MlpStep;
use crate::kernel::mlp::nodes::{auto_nodes, fixed_nodes};
use crate::kernel::quadrature::nodes::choose_auto_nodes;
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::stack::step::{RowGrad, StackStep};
use crate::kernel::{cnn, generic};
use crate::error::Result;
use crate::linalg::gemm_abt;
use crate::model::{param_layers, Params};

/// Quadrature nodes of the rows whose stack factors are formed at once.
const ROW_NODES: usize = 64;

/// Where one parameter layer of a stack sits in the flat parameter vector.
#[derive(Clone)]
pub(super) struct StackLayer {
    pub(super) flat: std::ops::Range<usize>,
    /// A dense layer's input features (its weight is `[out, n_in]`, its bias after it).
    pub(super) n_in: usize,
}

pub(super) fn stack_layers(state: &Params) -> Vec<StackLayer> {
    param_layers(&state.specs).into_iter().map(|l| StackLayer { n_in: state.specs[l.tensors.start].shape.get(1).copied().unwrap_or(0), flat: l.flat }).collect()
}

/// Layer 0 of an MLP: its gradient block for row p is `δ̄[p,k] ⊗ [x_p, 1]`, and without a
/// preconditioner every combination of such blocks keeps that form, so it is carried as the
/// factor `δ̄` (`[P·K, out_0]`) instead of `P·K·out_0·(in_0+1)` numbers: momentum then costs what
/// plain gradient steps cost.
pub(super) struct Layer0<'a> {
    pub(super) x: &'a [f64],
    pub(super) p: usize,
    pub(super) k: usize,
    pub(super) ni: usize,
    pub(super) no: usize,
    pub(super) bias: bool,
}

impl Layer0<'_> {
    /// `y[p, o] = W0[o, :]·x_p + b0[o]` for a flat parameter vector `v` `[W]`; returns `[P, out_0]`.
    pub(super) fn apply(&self, v: &[f64]) -> Vec<f64> {
        let (p, ni, no) = (self.p, self.ni, self.no);
        let mut y = vec![0.0; p * no];
        gemm_abt(&mut y, self.x, &v[..no * ni], p, no, ni, 1.0, false);
        if self.bias {
            for row in y.chunks_exact_mut(no) {
                row.iter_mut().zip(&v[no * ni..no * ni + no]).for_each(|(a, b)| *a += b);
            }
        }
        y
    }
}

/// A row-side feature `[P·K, W]` (a step's `J̄_s`, or the recursion's `H_r`): dense, or with
/// layer 0 in factor form ([`Layer0`]; the dense layer-0 block is then zero).
#[derive(Clone)]
pub(super) struct Feature {
    pub(super) dense: Vec<f64>,
    pub(super) f0: Option<Vec<f64>>,
}

impl Feature {
    pub(super) fn zeros(pk: usize, w: usize, l0: Option<&Layer0<'_>>) -> Self {
        Feature { dense: vec![0.0; pk * w], f0: l0.map(|l| vec![0.0; pk * l.no]) }
    }

    pub(super) fn scale(&mut self, beta: f64) {
        self.dense.iter_mut().for_each(|v| *v *= beta);
        if let Some(f) = &mut self.f0 {
            f.iter_mut().for_each(|v| *v *= beta);
        }
    }

    /// `self += c·(d ⊙ other)` with a diagonal `d` (`[W]`, only without a layer-0 factor).
    pub(super) fn add(&mut self, c: f64, other: &Feature, d: Option<&[f64]>) {
        let w = d.map_or(0, <[f64]>::len);
        match d {
            Some(sc) => self.dense.chunks_exact_mut(w).zip(other.dense.chunks_exact(w)).for_each(|(hr, jr)| {
                for ((x, j), dd) in hr.iter_mut().zip(jr).zip(sc) {
                    *x += c * dd * j;
                }
            }),
            None => self.dense.iter_mut().zip(&other.dense).for_each(|(x, j)| *x += c * j),
        }
        if let (Some(a), Some(b)) = (&mut self.f0, &other.f0) {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += c * y);
        }
    }

    /// `out[(p,k)] = F[(p,k), range]·v[range]` (no layer-0 factor).
    pub(super) fn dot_cols(&self, v: &[f64], range: &std::ops::Range<usize>) -> Vec<f64> {
        let w = v.len();
        self.dense.chunks_exact(w).map(|row| row[range.clone()].iter().zip(&v[range.clone()]).map(|(x, y)| x * y).sum()).collect()
    }

    /// `out[(p,k)] = F[(p,k), :]·v` for a flat `v` `[W]`.
    pub(super) fn dot(&self, v: &[f64], l0: Option<&Layer0<'_>>) -> Vec<f64> {
        let mut out = matvec(&self.dense, v);
        if let (Some(f), Some(l)) = (&self.f0, l0) {
            let y = l.apply(v);
            for (row, o) in out.iter_mut().enumerate() {
                let pi = row / l.k;
                *o += f[row * l.no..(row + 1) * l.no].iter().zip(&y[pi * l.no..(pi + 1) * l.no]).map(|(a, b)| a * b).sum::<f64>();
            }
        }
        out
    }
}

/// The rows' integrated gradients of one step, `J̄_s` `[P·K, W]`, with quadrature statistics.
pub(super) struct RowGradients {
    pub(super) jbar: Feature,
    pub(super) evaluations: Vec<usize>,
    pub(super) jvp_evaluations: Vec<usize>,
    pub(super) pieces: Vec<usize>,
    pub(super) unconverged: usize,
}

pub(super) fn row_gradients(s: &Prepared<'_>, state: &Params, next: Option<&Params>, l0: Option<&Layer0<'_>>) -> Result<RowGradients> {
    let arch = s.arch();
    let (p, k, w) = (s.rows.len(), arch.outputs(), state.numel());
    let fixed = if next.is_some() { s.req.rule.fixed_nodes() } else { Some(vec![(0.0, 1.0)]) };
    if !s.structured {
        // Other architectures (the CNN): dense Jacobians at each node; the auto rule's nodes come
        // from the CNN's kinks and forward-mode derivative (cnn::step::CnnStep).
        let (point, times, weights, evaluations, jvp_evaluations, pieces, unconverged) = match &fixed {
            Some(nodes) => {
                let point: Vec<usize> = (0..p).flat_map(|pi| std::iter::repeat_n(pi, nodes.len())).collect();
                let times: Vec<f64> = (0..p).flat_map(|_| nodes.iter().map(|n| n.0)).collect();
                let weights: Vec<f64> = (0..p).flat_map(|_| nodes.iter().map(|n| n.1)).collect();
                (point, times, weights, vec![nodes.len(); p], vec![0; p], vec![1; p], 0)
            }
            None if matches!(arch.body, crate::model::Body::Layers { .. }) => {
                let st = StackStep::new(arch, state, next)?;
                let c = choose_auto_nodes(&crate::kernel::stack::StackAlong { step: &st }, &s.rows.x, p, s.off_rows.as_deref(), s.tol_step);
                (c.point, c.times, c.weight, c.evaluations, c.jvp_evaluations, c.pieces, c.unconverged)
            }
            None => {
                let st = cnn::step::CnnStep::new(arch, state, next)?;
                let c = choose_auto_nodes(&st, &s.rows.x, p, s.off_rows.as_deref(), s.tol_step);
                (c.point, c.times, c.weight, c.evaluations, c.jvp_evaluations, c.pieces, c.unconverged)
            }
        };
        let d = arch.input_dim();
        let mut jbar = vec![0.0; p * k * w];
        if s.stack_fast {
            // The stack's per-layer factors at the nodes, a chunk of nodes at a time.
            let st = StackStep::new(arch, state, next)?;
            let layers = stack_layers(state);
            for c0 in (0..point.len()).step_by(ROW_NODES) {
                let c1 = (c0 + ROW_NODES).min(point.len());
                let grads = st.grads(&s.rows.x, s.off_rows.as_deref(), &point[c0..c1], &times[c0..c1]);
                add_stack_rows(&mut jbar, &grads, &layers, &point[c0..c1], &weights[c0..c1], k, w);
            }
            return Ok(RowGradients { jbar: Feature { dense: jbar, f0: None }, evaluations, jvp_evaluations, pieces, unconverged });
        }
        for ((&pi, &t), &wq) in point.iter().zip(&times).zip(&weights) {
            let j = generic::jacobians(arch, &generic::interpolate(state, next, t), &s.states[0], &s.rows.x[pi * d..(pi + 1) * d])?;
            jbar[pi * k * w..(pi + 1) * k * w].iter_mut().zip(&j).for_each(|(a, b)| *a += wq * b);
        }
        return Ok(RowGradients { jbar: Feature { dense: jbar, f0: None }, evaluations, jvp_evaluations, pieces, unconverged });
    }
    let step = MlpStep::new(arch, state, next)?;
    let nodes = match &fixed {
        Some(nodes) => fixed_nodes(&step, &s.rows.x, p, s.off_rows.as_deref(), nodes, None),
        None => auto_nodes(&step, &s.rows.x, p, s.off_rows.as_deref(), s.tol_step, None),
    };
    let mut jbar = Feature::zeros(p * k, w, l0);
    let mut off = 0;
    for (l, layer) in step.layers.iter().enumerate() {
        let (ni, no) = (layer.n_in, layer.n_out);
        let (acts, deltas) = (&nodes.evals.acts[l], &nodes.evals.deltas[l]);
        if let (0, Some(f0)) = (l, jbar.f0.as_mut()) {
            // δ̄_0[p,k] = Σ_{r∈p} w_r δ_{r,0}[k]
            for (r, (&pi, &wr)) in nodes.point.iter().zip(&nodes.weight).enumerate() {
                let dst = &mut f0[pi * k * no..(pi + 1) * k * no];
                dst.iter_mut().zip(&deltas[r * k * no..(r + 1) * k * no]).for_each(|(a, b)| *a += wr * b);
            }
            off += no * ni + if step.bias { no } else { 0 };
            continue;
        }
        for (r, (&pi, &wr)) in nodes.point.iter().zip(&nodes.weight).enumerate() {
            let ar = &acts[r * ni..(r + 1) * ni];
            for kt in 0..k {
                let row = &mut jbar.dense[(pi * k + kt) * w..(pi * k + kt + 1) * w];
                let dr = &deltas[(r * k + kt) * no..(r * k + kt + 1) * no];
                for o in 0..no {
                    let c = wr * dr[o];
                    if c == 0.0 {
                        continue;
                    }
                    for (x, a) in row[off + o * ni..off + (o + 1) * ni].iter_mut().zip(ar) {
                        *x += c * a;
                    }
                    if step.bias {
                        row[off + no * ni + o] += c;
                    }
                }
            }
        }
        off += no * ni + if step.bias { no } else { 0 };
    }
    Ok(RowGradients { jbar, evaluations: nodes.evaluations, jvp_evaluations: nodes.jvp_evaluations, pieces: nodes.pieces, unconverged: nodes.unconverged })
}

/// `out[r] = A[r, :]·v`.
pub(super) fn matvec(a: &[f64], v: &[f64]) -> Vec<f64> {
    let w = v.len();
    a.chunks_exact(w).map(|row| row.iter().zip(v).map(|(x, y)| x * y).sum()).collect()
}

/// `J̄[p(r), k, :] += w_r ∇f^k(x_{p(r)}; w(t_r))` for node rows r of a stack's per-layer factors.
///
/// # Shapes
/// `jbar` `[P, K, W]`; each factor's rows are the nodes.
fn add_stack_rows(jbar: &mut [f64], grads: &[RowGrad], layers: &[StackLayer], point: &[usize], weight: &[f64], k: usize, w: usize) {
    for (rg, l) in grads.iter().zip(layers) {
        match rg {
            RowGrad::Factor { acts, deltas, ne, out } => {
                let (ne, no, ni) = (*ne, *out, l.n_in);
                for (r, (&pi, &wr)) in point.iter().zip(weight).enumerate() {
                    let ar = &acts[r * ne..(r + 1) * ne];
                    for kt in 0..k {
                        let row = &mut jbar[(pi * k + kt) * w..(pi * k + kt + 1) * w];
                        let dr = &deltas[(r * k + kt) * no..(r * k + kt + 1) * no];
                        for o in 0..no {
                            let c = wr * dr[o];
                            if c == 0.0 {
                                continue;
                            }
                            row[l.flat.start + o * ni..l.flat.start + (o + 1) * ni].iter_mut().zip(&ar[..ni]).for_each(|(x, a)| *x += c * a);
                            if ne > ni {
                                row[l.flat.start + no * ni + o] += c;
                            }
                        }
                    }
                }
            }
            RowGrad::Formed { g, width } => {
                for (r, (&pi, &wr)) in point.iter().zip(weight).enumerate() {
                    for kt in 0..k {
                        let src = &g[(r * k + kt) * width..(r * k + kt + 1) * width];
                        jbar[(pi * k + kt) * w + l.flat.start..(pi * k + kt) * w + l.flat.end].iter_mut().zip(src).for_each(|(x, v)| *x += wr * v);
                    }
                }
            }
        }
    }
}
