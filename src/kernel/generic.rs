//! The generic path: full per-sample gradients by dfdx autodiff, for any architecture.
//!
//! Slow and memory-hungry (`O(M·K·W)`), it is the reference every fast path is tested against,
//! and the path for architectures without a structured implementation (the CNN).

use dfdx::tensor::Cpu;

use std::ops::Range;

use super::layout::{add_dense, GramSink, Layout};
use crate::linalg::{gemm_ab, gemm_abt};
use crate::error::{Error, Result};
use crate::model::{net, Architecture, Params};
use crate::kernel::gram::GramAccumulator;
use crate::kernel::step_model::{StepInput, StepModel, StepOutput};
use crate::kernel::types::NodeStats;

/// Largest Jacobian block the reference path materialises.
const MAX_JACOBIAN_BYTES: u64 = 4 << 30;

/// `w_s + t·(w_{s+1} − w_s)`.
pub fn interpolate(ws: &Params, next: Option<&Params>, t: f64) -> Params {
    match next {
        None => ws.clone(),
        Some(n) => Params {
            specs: ws.specs.clone(),
            data: ws.data.iter().zip(&n.data).map(|(a, b)| a.iter().zip(b).map(|(x, y)| x + t * (y - x)).collect()).collect(),
        },
    }
}

/// Jacobians `∇_w f^k(x_r)` for every row at one parameter state.
///
/// # Shapes
/// `x` `[R, d]`; returns `[R, K, W]`.
pub fn jacobians(arch: &Architecture, params: &Params, init: &Params, x: &[f64]) -> Result<Vec<f64>> {
    let dev = Cpu::default();
    let d = arch.input_dim();
    let (r, k, w) = (x.len() / d, arch.outputs(), params.numel());
    let bytes = (r * k * w) as u64 * 8;
    if bytes > MAX_JACOBIAN_BYTES {
        return Err(Error::OutOfMemoryBudget {
            what: format!("the reference Jacobian [{r}, {k}, {w}]"),
            needed_bytes: bytes,
            budget_bytes: MAX_JACOBIAN_BYTES,
            hint: "use fewer points".into(),
        });
    }
    let mut out = Vec::with_capacity(r * k * w);
    for row in x.chunks(d) {
        out.extend(net::jacobian(&dev, arch, params, Some(init), row)?);
    }
    Ok(out)
}

/// Adds one step's Gram `[P, M, K, K]` to `g` and the rows' self-kernel `[P, K, K]` to `diag`: row p's gradient averaged over `nodes`
/// (`(t, weight)` on `[0, 1]`, at `w_s(t)`), training gradients at `w_s`.
#[allow(clippy::too_many_arguments)]
pub fn step_gram(
    arch: &Architecture,
    ws: &Params,
    next: Option<&Params>,
    init: &Params,
    rows: &[f64],
    nodes: &[(f64, f64)],
    x_train: &[f64],
    g: &mut [f64],
    diag: &mut [f64],
) -> Result<()> {
    let d = arch.input_dim();
    let (p, m, k) = (rows.len() / d, x_train.len() / d, arch.outputs());
    let mut sink = GramSink::new(Layout::Full, p, m, k);
    step_into(arch, ws, next, init, rows, nodes, x_train, &mut sink, diag, &vec![0.0; m * k], None, false)?;
    g.iter_mut().zip(sink.finish()).for_each(|(a, b)| *a += b);
    Ok(())
}

/// One step into `sink` (any layout) and the rows' self-kernel into `diag`, as [`step_gram`];
/// returns the step's kernel-machine prediction `Σ_i Σ_k' a[i, k'] K_s[p, i, k, k']` (`[P, K]`),
/// contracted from the features so that no layout needs the off-diagonal blocks. `colw`
/// (`[M, K]`) scales the stored Gram's training gradients (Chen's kernel), not the prediction.
/// With `train_integrated` (the path kernel) the training side is integrated over `nodes` too
/// and the self-kernel is `⟨J̄(x), J̄(x)⟩`.
///
/// # Shapes
/// `rows` `[P, d]`, `x_train` `[M, d]`, `diag` `[P, K, K]`, `a` `[M, K]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_into(
    arch: &Architecture,
    ws: &Params,
    next: Option<&Params>,
    init: &Params,
    rows: &[f64],
    nodes: &[(f64, f64)],
    x_train: &[f64],
    sink: &mut GramSink,
    diag: &mut [f64],
    a: &[f64],
    colw: Option<&[f64]>,
    train_integrated: bool,
) -> Result<Vec<f64>> {
    let w = ws.numel();
    let (pred, _) = step_into_layers(arch, ws, next, init, rows, nodes, x_train, &[0..w], std::slice::from_mut(sink), diag, a, colw, train_integrated)?;
    Ok(pred)
}

/// The rows' node-weighted Jacobians `J̄` (`[P, K, W]`) and the training points' Jacobians at
/// `w_s` (`[M, K, W]`; node-weighted too with `train_integrated`); adds the rows' self-kernel to
/// `diag` (`[P, K, K]`: `∫⟨∇f(x), ∇f(x)⟩`, or `⟨J̄(x), J̄(x)⟩` with `train_integrated`).
#[allow(clippy::too_many_arguments)]
fn features(
    arch: &Architecture,
    ws: &Params,
    next: Option<&Params>,
    init: &Params,
    rows: &[f64],
    nodes: &[(f64, f64)],
    x_train: &[f64],
    diag: &mut [f64],
    train_integrated: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let d = arch.input_dim();
    let (p, k, w) = (rows.len() / d, arch.outputs(), ws.numel());
    let mut jt = if train_integrated { vec![0.0; x_train.len() / d * k * w] } else { jacobians(arch, ws, init, x_train)? };
    let mut jbar = vec![0.0; p * k * w];
    for &(t, wq) in nodes {
        let at = interpolate(ws, next, t);
        let j = jacobians(arch, &at, init, rows)?;
        for (a, b) in jbar.iter_mut().zip(&j) {
            *a += wq * b;
        }
        if train_integrated {
            let j = jacobians(arch, &at, init, x_train)?;
            jt.iter_mut().zip(&j).for_each(|(a, b)| *a += wq * b);
            continue;
        }
        // Self-kernel of each row at the same t: ∫⟨∇f^k(x), ∇f^k'(x)⟩ dt.
        for pi in 0..p {
            for kt in 0..k {
                for ks in 0..k {
                    let a = &j[(pi * k + kt) * w..(pi * k + kt + 1) * w];
                    let b = &j[(pi * k + ks) * w..(pi * k + ks + 1) * w];
                    diag[(pi * k + kt) * k + ks] += wq * a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
                }
            }
        }
    }
    if train_integrated {
        for pi in 0..p {
            for kt in 0..k {
                for ks in 0..k {
                    let a = &jbar[(pi * k + kt) * w..(pi * k + kt + 1) * w];
                    let b = &jbar[(pi * k + ks) * w..(pi * k + ks + 1) * w];
                    diag[(pi * k + kt) * k + ks] += a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
                }
            }
        }
    }
    Ok((jbar, jt))
}

/// [`step_into`] with the Gram split by parameter layer: layer l (its entries `ranges[l]` of
/// the flat `[W]`) contracts into `sinks[l]`; returns the step's prediction and each layer's
/// share of it (`[P, K]` each, summing to the prediction).
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_into_layers(
    arch: &Architecture,
    ws: &Params,
    next: Option<&Params>,
    init: &Params,
    rows: &[f64],
    nodes: &[(f64, f64)],
    x_train: &[f64],
    ranges: &[Range<usize>],
    sinks: &mut [GramSink],
    diag: &mut [f64],
    a: &[f64],
    colw: Option<&[f64]>,
    train_integrated: bool,
) -> Result<(Vec<f64>, Vec<Vec<f64>>)> {
    let d = arch.input_dim();
    let (p, m, k, w) = (rows.len() / d, x_train.len() / d, arch.outputs(), ws.numel());
    let (jbar, mut jt) = features(arch, ws, next, init, rows, nodes, x_train, diag, train_integrated)?;
    let mut v = vec![0.0; w];
    gemm_ab(&mut v, a, &jt, 1, w, m * k, 1.0, false);
    if let Some(cw) = colw {
        jt.chunks_mut(w).zip(cw).for_each(|(row, &c)| row.iter_mut().for_each(|x| *x *= c));
    }
    let mut pred = vec![0.0; p * k];
    let mut layer_pred = Vec::with_capacity(ranges.len());
    for (r, sink) in ranges.iter().zip(sinks) {
        let (jb, jl, dim) = (columns(&jbar, w, r), columns(&jt, w, r), r.len());
        let mut pl = vec![0.0; p * k];
        gemm_abt(&mut pl, &jb, &v[r.clone()], p * k, 1, dim, 1.0, false);
        pred.iter_mut().zip(&pl).for_each(|(x, y)| *x += y);
        layer_pred.push(pl);
        add_dense(sink.layout(), sink.rows_mut(0..p), &jb, &jl, p, m, k, dim, 1.0);
    }
    Ok((pred, layer_pred))
}

/// The columns `r` of a row-major `[rows, w]` array, `[rows, r.len()]` (borrowed when `r` is
/// every column).
fn columns<'a>(a: &'a [f64], w: usize, r: &Range<usize>) -> std::borrow::Cow<'a, [f64]> {
    if *r == (0..w) {
        return std::borrow::Cow::Borrowed(a);
    }
    std::borrow::Cow::Owned(a.chunks_exact(w).flat_map(|row| row[r.clone()].iter().copied()).collect())
}

/// Any architecture through dfdx per-sample Jacobians (fixed rules only).
pub(crate) struct GenericModel<'a> {
    pub arch: &'a Architecture,
    /// `w_0` (the frozen network of `zero_output`).
    pub init: &'a Params,
    /// With the per-layer decomposition: each parameter layer's entries of the flat `[W]`.
    pub layers: Option<Vec<std::ops::Range<usize>>>,
}

impl StepModel for GenericModel<'_> {
    fn add_step(&self, input: &StepInput<'_>, acc: &mut GramAccumulator, diag: &mut [f64]) -> Result<StepOutput> {
        let nodes = input.fixed.expect("the driver rejects the auto rule on the generic path");
        let p = input.rows.len();
        let split = match (self.layers.as_deref(), acc.layer_sinks()) {
            (Some(ranges), Some(sinks)) => Some((ranges, sinks)),
            _ => None,
        };
        let (pred, layer_pred) = match split {
            Some((ranges, sinks)) => step_into_layers(self.arch, input.state, input.next, self.init, &input.rows.x, nodes, input.x_train, ranges, sinks, diag, input.a, input.colw, input.train_integrated)?,
            None => (step_into(self.arch, input.state, input.next, self.init, &input.rows.x, nodes, input.x_train, acc.sink_mut(), diag, input.a, input.colw, input.train_integrated)?, Vec::new()),
        };
        Ok(StepOutput { pred, stats: NodeStats { evaluations: vec![nodes.len(); p], jvp_evaluations: vec![0; p], pieces: vec![1; p], unconverged: 0 }, cosine: f64::NAN, layer_pred })
    }
}
