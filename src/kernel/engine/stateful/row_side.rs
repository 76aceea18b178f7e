//! The row side of the backward recursion ([`super`]): a step's integrated row gradients `J̄_s`
//! and the features `H_r` built from them, with a dense first layer kept in factor form.

use crate::kernel::quadrature::nodes::choose_auto_nodes;
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::stack::step::{RowGrad, StackStep};
use crate::kernel::generic;
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

/// The stack's first parameter layer when it is dense (nothing with parameters runs ahead of it,
/// so its input `x_p` does not depend on the weights):
/// its gradient block for row p is `δ̄[p,k] ⊗ [x_p, 1]`, and without a preconditioner every
/// combination of such blocks keeps that form, so it is carried as the factor `δ̄`
/// (`[P·K, out_0]`) instead of `P·K·out_0·(in_0+1)` numbers: momentum then costs what plain
/// gradient steps cost. Its parameters are the first of the flat `[W]` (weight `[out_0, in_0]`,
/// then the bias).
pub(super) struct Layer0 {
    /// The layer's input `[P, in_0]`.
    pub(super) x: Vec<f64>,
    pub(super) p: usize,
    pub(super) k: usize,
    pub(super) ni: usize,
    pub(super) no: usize,
    pub(super) bias: bool,
}

impl Layer0 {
    /// `y[p, o] = W0[o, :]·x_p + b0[o]` for a flat parameter vector `v` `[W]`; returns `[P, out_0]`.
    pub(super) fn apply(&self, v: &[f64]) -> Vec<f64> {
        let (p, ni, no) = (self.p, self.ni, self.no);
        let mut y = vec![0.0; p * no];
        gemm_abt(&mut y, &self.x, &v[..no * ni], p, no, ni, 1.0, false);
        if self.bias {
            for row in y.chunks_exact_mut(no) {
                row.iter_mut().zip(&v[no * ni..no * ni + no]).for_each(|(a, b)| *a += b);
            }
        }
        y
    }

    /// `[x_p, 1]` (`[P, in_0 + 1]`; `[P, in_0]` without a bias): the layer's input with the bias
    /// column, as the training side's factors hold it.
    pub(super) fn x_ext(&self) -> Vec<f64> {
        if !self.bias {
            return self.x.to_vec();
        }
        self.x.chunks_exact(self.ni).flat_map(|r| r.iter().copied().chain(std::iter::once(1.0))).collect()
    }

    /// A layer stack's first parameter layer in factor form, when it is dense on one row per
    /// sample and first in the flat `[W]` (`None` otherwise): its input for the rows, from one
    /// evaluation at `state`.
    pub(super) fn of_stack(s: &Prepared<'_>, state: &Params) -> Result<Option<Layer0>> {
        let p = s.rows.len();
        let layers = stack_layers(state);
        let Some(first) = layers.first().filter(|l| l.flat.start == 0) else { return Ok(None) };
        let st = StackStep::new(s.arch(), state, None)?;
        let idx: Vec<usize> = (0..p).collect();
        let grads = st.grads(&s.rows.x, s.off_rows.as_deref(), &idx, &vec![0.0; p]);
        let Some(RowGrad::Factor { acts, ne, out, .. }) = grads.into_iter().next() else { return Ok(None) };
        let ni = first.n_in;
        let bias = ne > ni;
        if acts.len() != p * ne || out * ni + if bias { out } else { 0 } != first.flat.len() {
            return Ok(None);
        }
        let x: Vec<f64> = acts.chunks_exact(ne).flat_map(|r| r[..ni].iter().copied()).collect();
        Ok(Some(Layer0 { x, p, k: s.arch().outputs(), ni, no: out, bias }))
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
    pub(super) fn zeros(pk: usize, w: usize, l0: Option<&Layer0>) -> Self {
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

    /// `out[(p,k)] = F[(p,k), range]·v[range]` for the entries `range` of one parameter layer
    /// (layer 0's factor when the range is layer 0's).
    pub(super) fn dot_cols(&self, v: &[f64], range: &std::ops::Range<usize>, l0: Option<&Layer0>) -> Vec<f64> {
        let w = v.len();
        let mut out: Vec<f64> = self.dense.chunks_exact(w).map(|row| row[range.clone()].iter().zip(&v[range.clone()]).map(|(x, y)| x * y).sum()).collect();
        if let (Some(f), Some(l), 0) = (&self.f0, l0, range.start) {
            Self::add_factor(&mut out, f, l, v);
        }
        out
    }

    /// `out[(p,k)] += δ̄[(p,k)]·(W0·x_p + b0)` with layer 0's entries of `v`.
    fn add_factor(out: &mut [f64], f: &[f64], l: &Layer0, v: &[f64]) {
        let y = l.apply(v);
        for (row, o) in out.iter_mut().enumerate() {
            let pi = row / l.k;
            *o += f[row * l.no..(row + 1) * l.no].iter().zip(&y[pi * l.no..(pi + 1) * l.no]).map(|(a, b)| a * b).sum::<f64>();
        }
    }

    /// `out[(p,k)] = F[(p,k), :]·v` for a flat `v` `[W]`.
    pub(super) fn dot(&self, v: &[f64], l0: Option<&Layer0>) -> Vec<f64> {
        let mut out = matvec(&self.dense, v);
        if let (Some(f), Some(l)) = (&self.f0, l0) {
            Self::add_factor(&mut out, f, l, v);
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

/// A step's integrated row gradients `J̄_s` on the network's layer stack: the quadrature's nodes
/// (fixed, or the auto rule's from the stack's kink sweep and node search), then the stack's
/// per-layer factors at the nodes ([`crate::kernel::request::GramPath::Fast`]; the first layer
/// as its factor with `l0`) or dense autodiff Jacobians (the generic reference).
pub(super) fn row_gradients(s: &Prepared<'_>, state: &Params, next: Option<&Params>, l0: Option<&Layer0>) -> Result<RowGradients> {
    let arch = s.arch();
    let (p, k, w) = (s.rows.len(), arch.outputs(), state.numel());
    let fixed = if next.is_some() { s.req.rule.fixed_nodes() } else { Some(vec![(0.0, 1.0)]) };
    let st = StackStep::new(arch, state, next)?;
    // On the stack's own factors the auto rule's pieces may be product-integrated (their nodes'
    // stand-ins for the softmax, `q`); the rows' self-kernel is not asked here.
    let (point, times, weights, q, evaluations, jvp_evaluations, pieces, unconverged) = match &fixed {
        Some(nodes) => {
            let point: Vec<usize> = (0..p).flat_map(|pi| std::iter::repeat_n(pi, nodes.len())).collect();
            let times: Vec<f64> = (0..p).flat_map(|_| nodes.iter().map(|n| n.0)).collect();
            let weights: Vec<f64> = (0..p).flat_map(|_| nodes.iter().map(|n| n.1)).collect();
            (point, times, weights, None, vec![nodes.len(); p], vec![0; p], vec![1; p], 0)
        }
        None => {
            let product = s.stack_fast && st.nodes.is_none() && crate::kernel::stack::reduce_nodes();
            // (No self-kernel on this side: nothing for the search to check it to.)
            let c = choose_auto_nodes(&crate::kernel::stack::StackAlong { step: &st }, &s.rows.x, p, s.off_rows.as_deref(), s.tol_step, product.then_some(f64::INFINITY));
            (c.point, c.times, c.weight, c.q, c.evaluations, c.jvp_evaluations, c.pieces, c.unconverged)
        }
    };
    if s.stack_fast {
        // The stack's per-layer factors at the nodes, a chunk of nodes at a time.
        let layers = stack_layers(state);
        let mut jbar = Feature::zeros(p * k, w, l0);
        for c0 in (0..point.len()).step_by(ROW_NODES) {
            let c1 = (c0 + ROW_NODES).min(point.len());
            let grads = st.grads_q(&s.rows.x, s.off_rows.as_deref(), &point[c0..c1], &times[c0..c1], q.as_ref().map(|q| &q[c0 * k..c1 * k]));
            add_stack_rows(&mut jbar.dense, jbar.f0.as_deref_mut(), &grads, &layers, &point[c0..c1], &weights[c0..c1], k, w);
        }
        return Ok(RowGradients { jbar, evaluations, jvp_evaluations, pieces, unconverged });
    }
    let d = arch.input_dim();
    let mut jbar = vec![0.0; p * k * w];
    for ((&pi, &t), &wq) in point.iter().zip(&times).zip(&weights) {
        let j = generic::jacobians(arch, &generic::interpolate(state, next, t), &s.states[0], &s.rows.x[pi * d..(pi + 1) * d])?;
        jbar[pi * k * w..(pi + 1) * k * w].iter_mut().zip(&j).for_each(|(a, b)| *a += wq * b);
    }
    Ok(RowGradients { jbar: Feature { dense: jbar, f0: None }, evaluations, jvp_evaluations, pieces, unconverged })
}

/// `out[r] = A[r, :]·v`.
pub(super) fn matvec(a: &[f64], v: &[f64]) -> Vec<f64> {
    let w = v.len();
    a.chunks_exact(w).map(|row| row.iter().zip(v).map(|(x, y)| x * y).sum()).collect()
}

/// `J̄[p(r), k, :] += w_r ∇f^k(x_{p(r)}; w(t_r))` for node rows r of a stack's per-layer factors;
/// with `f0` the first layer's part as its factor, `δ̄[p(r), k] += w_r δ_r[k]` ([`Layer0`]).
///
/// # Shapes
/// `jbar` `[P, K, W]`; `f0` `[P, K, out_0]`; each factor's rows are the nodes.
#[allow(clippy::too_many_arguments)]
fn add_stack_rows(jbar: &mut [f64], mut f0: Option<&mut [f64]>, grads: &[RowGrad], layers: &[StackLayer], point: &[usize], weight: &[f64], k: usize, w: usize) {
    for (li, (rg, l)) in grads.iter().zip(layers).enumerate() {
        match rg {
            RowGrad::Factor { deltas, out, .. } if li == 0 && f0.is_some() => {
                let (f, kno) = (f0.as_deref_mut().expect("checked"), k * out);
                for (r, (&pi, &wr)) in point.iter().zip(weight).enumerate() {
                    f[pi * kno..(pi + 1) * kno].iter_mut().zip(&deltas[r * kno..(r + 1) * kno]).for_each(|(a, b)| *a += wr * b);
                }
            }
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
