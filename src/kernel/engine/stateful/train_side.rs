//! The training side of the backward recursion ([`super`]): the training points at one state,
//! their outputs, their data gradient and the contraction of a row feature against them.

use crate::kernel::layout::{add_dense, add_dense_scaled, add_formed, GramSink, TrainDeltas};
use crate::kernel::engine::prepare::Prepared;
use crate::kernel::stack::step::{RowGrad, StackStep};
use crate::kernel::generic;
use crate::error::Result;
use crate::linalg::{gemm, gemm_ab, gemm_abt};
use crate::model::Params;
use super::row_side::{stack_layers, Feature, Layer0, StackLayer};

/// Scratch bytes allowed for one block of a dense layer's contraction.
const BLOCK_BYTES: usize = 64 << 20;

/// The training points at one state: outputs and what the contraction needs.
pub(super) enum TrainSide {
    /// Dense Jacobians `[M·K, W]` (architectures without a structured path).
    Dense { jt: Vec<f64>, f: Vec<f64> },
    /// A layer stack's per-layer factors ([`StackStep::grads`]) with where each parameter layer
    /// sits in the flat `[W]`; outputs `f` `[M, K]`.
    Stack { grads: Vec<RowGrad>, layers: Vec<StackLayer>, f: Vec<f64> },
}

impl TrainSide {
    /// The training points `[c0, c1)` at `state`.
    pub(super) fn at(s: &Prepared<'_>, state: &Params, (c0, c1): (usize, usize)) -> Result<Self> {
        let (d, k) = (s.arch().input_dim(), s.arch().outputs());
        let x = &s.train.x_train[c0 * d..c1 * d];
        let off = s.off_train.as_deref().map(|o| &o[c0 * k..c1 * k]);
        Self::of(s, state, x, off)
    }

    /// The points `x` (`[M', d]`, with their `zero_output` offsets `off` `[M', K]`) at `state`.
    pub(super) fn of(s: &Prepared<'_>, state: &Params, x: &[f64], off: Option<&[f64]>) -> Result<Self> {
        let d = s.arch().input_dim();
        if s.stack_fast {
            let m = x.len() / d;
            let st = StackStep::new(s.arch(), state, None)?;
            let idx: Vec<usize> = (0..m).collect();
            let grads = st.grads(x, off, &idx, &vec![0.0; m]);
            let f = s.arch().forward(state, Some(&s.states[0]), x)?;
            Ok(TrainSide::Stack { grads, layers: stack_layers(state), f })
        } else {
            let jt = generic::jacobians(s.arch(), state, &s.states[0], x)?;
            let f = s.arch().forward(state, Some(&s.states[0]), x)?;
            Ok(TrainSide::Dense { jt, f })
        }
    }

    /// Network outputs `[M, K]`.
    pub(super) fn f(&self) -> &[f64] {
        match self {
            TrainSide::Dense { f, .. } | TrainSide::Stack { f, .. } => f,
        }
    }

    /// `Σ_i Σ_k' c[i, k'] ∇f^{k'}(x_i)`, flat in parameter order `[W]`.
    pub(super) fn gradient(&self, c: &[f64], w: usize) -> Vec<f64> {
        let mut g = vec![0.0; w];
        match self {
            TrainSide::Dense { jt, .. } => {
                // gᵀ = cᵀ·J  ([1, M·K] × [M·K, W])
                gemm_ab(&mut g, c, jt, 1, w, c.len(), 1.0, false);
            }
            TrainSide::Stack { grads, layers, .. } => stack_gradient(grads, layers, c, &mut g),
        }
        g
    }

    /// [`TrainSide::contract`] for parameter layer `l` alone (its entries `range` of `[W]`): the
    /// per-layer decomposition. Stacks and dense Jacobians (an MLP or CNN is split as its stack).
    pub(super) fn contract_layer(&self, feature: &Feature, w: usize, l: usize, range: &std::ops::Range<usize>, out: &mut GramSink, scratch: &mut Vec<f64>, l0: Option<&Layer0>) {
        let h = &feature.dense;
        match self {
            TrainSide::Stack { grads, layers, .. } => contract_stack(grads, layers, feature, l0, w, out, scratch, Some(l)),
            TrainSide::Dense { jt, .. } => {
                let (p, m, k) = out.dims();
                let cols = |a: &[f64]| -> Vec<f64> { a.chunks_exact(w).flat_map(|row| row[range.clone()].iter().copied()).collect() };
                add_dense(out.layout(), out.rows_mut(0..p), &cols(h), &cols(jt), p, m, k, range.len(), 1.0);
            }
        }
    }

    /// `out += H[(p,k), :]·∇f^{k'}(x_i)` for the entries of `out`'s layout.
    ///
    /// # Shapes
    /// `feature.dense` `[P·K, W]`; `out` the accumulation rows of all P row points.
    pub(super) fn contract(&self, feature: &Feature, w: usize, out: &mut GramSink, scratch: &mut Vec<f64>, l0: Option<&Layer0>) {
        let h = &feature.dense;
        let layout = out.layout();
        match self {
            TrainSide::Dense { jt, .. } => {
                let (p, m, k) = out.dims();
                add_dense(layout, out.rows_mut(0..p), h, jt, p, m, k, w, 1.0);
            }
            TrainSide::Stack { grads, layers, .. } => contract_stack(grads, layers, feature, l0, w, out, scratch, None),
        }
    }
}

/// `out += H[(p,k), :]·∇f^{k'}(x_i)` for a stack's training factors: a dense layer as the MLP's
/// deeper layers (`H_l·[A, 1]ᵀ`, then the sensitivities, [`add_formed`]); formed layers as one
/// GEMM with `H`'s columns of the layer; the first layer in factor form (`feature.f0` with
/// `l0`) as `(x_p·x_i + 1)(δ̄[p,k]·δ_i[k'])`, one product scaled per pair.
///
/// # Shapes
/// `feature.dense` `[P·K, W]`.
#[allow(clippy::too_many_arguments)]
fn contract_stack(grads: &[RowGrad], layers: &[StackLayer], feature: &Feature, l0: Option<&Layer0>, w: usize, out: &mut GramSink, scratch: &mut Vec<f64>, only: Option<usize>) {
    let layout = out.layout();
    let (p, m, k) = out.dims();
    let h = &feature.dense;
    for (li, (rg, l)) in grads.iter().zip(layers).enumerate() {
        if only.is_some_and(|o| o != li) {
            continue;
        }
        match rg {
            RowGrad::Factor { acts, deltas, ne, out: no } if li == 0 && feature.f0.is_some() => {
                let (f0, l0) = (feature.f0.as_deref().expect("checked"), l0.expect("layer 0's factor comes with its layer"));
                let mut xx = vec![0.0; p * m];
                gemm_abt(&mut xx, &l0.x_ext(), acts, p, m, *ne, 1.0, false);
                add_dense_scaled(layout, out.rows_mut(0..p), f0, deltas, &xx, p, m, k, *no, scratch);
            }
            RowGrad::Factor { acts, deltas, ne, out: no } => {
                let (ne, no, ni) = (*ne, *no, l.n_in);
                let dt = TrainDeltas::new(layout, deltas, m, k, no, None);
                add_dense_layer(out, h, w, l.flat.start, (ni, no, ne), acts, &dt, scratch);
            }
            RowGrad::Formed { g, width } => {
                let hc: Vec<f64> = h.chunks_exact(w).flat_map(|row| row[l.flat.clone()].iter().copied()).collect();
                add_dense(layout, out.rows_mut(0..p), &hc, g, p, m, k, *width, 1.0);
            }
        }
    }
}

/// `out += H[(p,k), layer]·∇f^{k'}(x_i)` for one dense layer whose weight `[out, n_in]` (then its
/// bias when `ne = n_in + 1`) starts at `start` of the flat `[W]`: `H`'s columns of the layer
/// gathered as `[points·K·out, ne]` and formed against the training side's `[A, 1]` and
/// sensitivities ([`add_formed`]), in point blocks that bound the GEMM's `[points·K·out, M]`
/// product to [`BLOCK_BYTES`].
///
/// # Shapes
/// `h` `[P·K, W]`; `acts` `[M, ne]`.
#[allow(clippy::too_many_arguments)]
fn add_dense_layer(out: &mut GramSink, h: &[f64], w: usize, start: usize, (ni, no, ne): (usize, usize, usize), acts: &[f64], dt: &TrainDeltas, scratch: &mut Vec<f64>) {
    let (p, m, k) = out.dims();
    let pb = (BLOCK_BYTES / 8 / (k * no * m).max(1)).clamp(1, p.max(1));
    let mut hext = vec![0.0; pb * k * no * ne];
    for p0 in (0..p).step_by(pb) {
        let nb = pb.min(p - p0);
        for row in 0..nb * k {
            let hr = &h[(p0 * k + row) * w..(p0 * k + row + 1) * w];
            for o in 0..no {
                let dst = &mut hext[(row * no + o) * ne..(row * no + o + 1) * ne];
                dst[..ni].copy_from_slice(&hr[start + o * ni..start + (o + 1) * ni]);
                if ne > ni {
                    dst[ni] = hr[start + no * ni + o];
                }
            }
        }
        add_formed(out.rows_mut(p0..p0 + nb), &hext[..nb * k * no * ne], acts, dt, nb, ne, scratch);
    }
}

/// A layer stack's data gradient `Σ_i Σ_k' c[i, k'] ∇f^{k'}(x_i; w)` at `state`, flat `[W]`,
/// with one backward pass per point ([`StackStep::contracted_grads`]: the cotangent `c` folded
/// in before the backward pass) instead of the K of [`TrainSide::gradient`]; blocks of
/// [`crate::kernel::stack::step::EVAL_CHUNK`] points on every core, summed.
///
/// # Shapes
/// `x` `[M', d]`, `off` and `c` `[M', K]`; returns `[W]`.
pub(super) fn stack_data_gradient(s: &Prepared<'_>, state: &Params, x: &[f64], off: Option<&[f64]>, c: &[f64], w: usize) -> Result<Vec<f64>> {
    use rayon::prelude::*;
    let st = StackStep::new(s.arch(), state, None)?;
    let (k, d) = (st.k, st.d);
    let idx: Vec<usize> = (0..x.len() / d.max(1)).collect();
    let layers = stack_layers(state);
    let chunk = crate::kernel::stack::step::EVAL_CHUNK;
    // The chunks' sums added in chunk order, a group of chunks on the cores at a time: the same
    // gradient bit for bit on every call and thread count (the backward recursion recomputes it
    // and must match the replay's), with `[W]` per chunk of a group held.
    let group = chunk * 2 * rayon::current_num_threads();
    let mut g = vec![0.0; w];
    for ig in idx.chunks(group) {
        let parts: Vec<Vec<f64>> = ig
            .par_chunks(chunk)
            .map(|ib| {
                let cb = &c[ib[0] * k..(ib[0] + ib.len()) * k];
                let grads = st.contracted_grads(x, off, ib, cb);
                let mut part = vec![0.0; w];
                stack_gradient(&grads, &layers, &vec![1.0; ib.len()], &mut part);
                part
            })
            .collect();
        for part in &parts {
            g.iter_mut().zip(part).for_each(|(x, y)| *x += y);
        }
    }
    Ok(g)
}

/// `g += Σ_i Σ_k' c[i, k'] ∇f^{k'}(x_i)` from a stack's per-layer factors, flat `[W]`.
///
/// # Shapes
/// `c` `[M·K]`; each factor's rows are the M points.
fn stack_gradient(grads: &[RowGrad], layers: &[StackLayer], c: &[f64], g: &mut [f64]) {
    // The layer contract: `backward` pushes one gradient per name-grouped parameter layer, in
    // storage order; a kind that breaks it would otherwise fail deep inside a GEMM.
    assert_eq!(grads.len(), layers.len(), "the stack's backward pass gave {} parameter-layer gradients for {} parameter layers", grads.len(), layers.len());
    for (rg, l) in grads.iter().zip(layers) {
        let width = match rg {
            RowGrad::Factor { ne, out, .. } => out * l.n_in + if *ne > l.n_in { *out } else { 0 },
            RowGrad::Formed { width, .. } => *width,
        };
        assert_eq!(width, l.flat.len(), "a parameter layer's gradient has {width} entries for its {} parameters", l.flat.len());
        match rg {
            RowGrad::Factor { acts, deltas, ne, out } => {
                let (ne, no, ni) = (*ne, *out, l.n_in);
                let m = acts.len() / ne;
                let k = c.len() / m.max(1);
                // u_i = Σ_k' c[i,k'] δ_i[k'] `[M, out]`, then uᵀ·[A, 1] `[out, ne]`.
                let mut u = vec![0.0; m * no];
                for i in 0..m {
                    for kk in 0..k {
                        let ci = c[i * k + kk];
                        if ci != 0.0 {
                            u[i * no..(i + 1) * no].iter_mut().zip(&deltas[(i * k + kk) * no..(i * k + kk + 1) * no]).for_each(|(a, b)| *a += ci * b);
                        }
                    }
                }
                let mut v = vec![0.0; no * ne];
                gemm(&mut v, &u, true, acts, false, (no, ne, m), 1.0, false);
                for o in 0..no {
                    g[l.flat.start + o * ni..l.flat.start + (o + 1) * ni].iter_mut().zip(&v[o * ne..o * ne + ni]).for_each(|(a, b)| *a += b);
                    if ne > ni {
                        g[l.flat.start + no * ni + o] += v[o * ne + ni];
                    }
                }
            }
            RowGrad::Formed { g: gf, width } => {
                gemm(&mut g[l.flat.clone()], c, false, gf, false, (1, *width, c.len()), 1.0, true);
            }
        }
    }
}
