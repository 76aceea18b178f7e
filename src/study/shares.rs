//! Every step's change of a layer stack's outputs at some points, split by its top-level layers.
//!
//! Over step s the network moves along `w_s(t) = w_s + tΔw_s`, so at any input x
//!
//! ```text
//! f(x; w_{s+1}) − f(x; w_s) = ∫₀¹ ∇f(x; w_s(t))·Δw dt = Σ_g ∫₀¹ ∇_g f(x; w_s(t))·Δw_g dt,
//! ```
//!
//! g running over the top-level layers of the stack (`[model] layers`, a residual block being
//! one; its parameters are the tensors named `g.…`). Each share is the path integral of one
//! layer's gradient against that layer's own weight change: a forward-mode derivative along
//! `Δw_g` (the direction zero outside layer g) at quadrature nodes of the step, no training-side
//! gradient and no contraction. The shares sum to the network's own change over the step; that
//! sum is the exactness check (a fundamental-theorem-of-calculus check against two forward
//! passes), and a point whose check fails is integrated alone, split where its ReLUs change sign
//! (`StackStep::locate_kink`) and then bisected until every piece passes.

use rayon::prelude::*;

use crate::api::Trained;
use crate::error::{Error, Result};
use crate::kernel::quadrature::gauss_legendre_01;
use crate::kernel::stack::step::StackStep;
use crate::model::layers::At;
use crate::model::{Architecture, Body, OutputKind, Params};

/// Gauss–Legendre nodes per piece.
const ORDER: usize = 4;
/// The least tolerance a short piece is held to (the rounding of the outputs' differences).
const ROUNDING: f64 = 1e-14;
/// The rounding of a piece's check `|Σ_g share − (f(b) − f(a))|` in units of `ε·max(|f(a)|,
/// |f(b)|)`: `f(b) − f(a)` of log-probabilities of size |f| (tens, once the training points are
/// memorised) is only known to a few ulps of |f|, far above [`ROUNDING`].
pub(crate) const ROUNDING_ULPS: f64 = 32.0;
/// A piece that misses by less than `ROUNDING_ZONE·ε·max|f|` and whose halves together miss by
/// more than [`STALLED`] of its own miss is at rounding, not at a kink or a quadrature error
/// (those shrink per halving): it is kept (its miss is in the step's residual) instead of being
/// halved down to [`MAX_DEPTH`], which doubles the pieces at every level.
pub(crate) const ROUNDING_ZONE: f64 = 1024.0;
/// See [`ROUNDING_ZONE`].
const STALLED: f64 = 0.5;
/// Bisections of a piece before its check is given up (the miss is then reported).
pub(crate) const MAX_DEPTH: usize = 40;

/// The top-level layers of a stack that hold parameters: their labels and, for each, the
/// parameter tensors (indices in storage order) that belong to it.
///
/// Errors: a network that is not a layer stack.
pub fn layer_groups(arch: &Architecture, params: &Params) -> Result<Vec<(String, Vec<usize>)>> {
    let Body::Layers { layers, .. } = &arch.body else {
        return Err(Error::Config("layer shares split a layer stack (model.kind = \"layers\") by its layers".into()));
    };
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    for (j, spec) in params.specs.iter().enumerate() {
        let top: usize = spec
            .name
            .split('.')
            .next()
            .and_then(|h| h.parse().ok())
            .filter(|&i: &usize| i < layers.len())
            .ok_or_else(|| Error::Data(format!("parameter `{}` does not name a top-level layer of the stack", spec.name)))?;
        let label = format!("{top} {}", layers[top].label());
        match out.last_mut() {
            Some((l, idx)) if *l == label => idx.push(j),
            _ => out.push((label, vec![j])),
        }
    }
    Ok(out)
}

/// `f = out(α(g − off))` and its derivative `α(ġ − Σ_o p_o ġ_o)` (log-softmax) or `αġ`
/// (identity), in place on raw outputs `g` and their derivatives `gd` (`[R, K]`; one
/// exponential per output).
fn output_map(arch: &Architecture, g: &mut [f64], gd: Option<&mut [f64]>, off: Option<&[f64]>) {
    let (k, alpha) = (arch.outputs(), arch.alpha);
    if let Some(off) = off {
        g.iter_mut().zip(off).for_each(|(a, b)| *a -= b);
    }
    g.iter_mut().for_each(|v| *v *= alpha);
    let mut gd = gd;
    if let Some(gd) = gd.as_deref_mut() {
        gd.iter_mut().for_each(|v| *v *= alpha);
    }
    if arch.output == OutputKind::LogSoftmax {
        for r in 0..g.len() / k {
            let z = &mut g[r * k..(r + 1) * k];
            crate::model::log_softmax_rows(z, k);
            if let Some(gd) = gd.as_deref_mut() {
                let zd = &mut gd[r * k..(r + 1) * k];
                let mean: f64 = z.iter().zip(zd.iter()).map(|(l, d)| l.exp() * d).sum();
                zd.iter_mut().for_each(|d| *d -= mean);
            }
        }
    }
}

/// One step split by layer at `P` points.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSplit {
    /// Each layer's share `∫₀¹ ∇_g f·Δw_g dt`. # Shapes `[G, P, K]`.
    pub shares: Vec<f64>,
    /// The network's own change `f(w_{s+1}) − f(w_s)`. # Shapes `[P, K]`.
    pub change: Vec<f64>,
    /// `max |Σ_g share − change|` over the points and outputs.
    pub residual: f64,
    /// Quadrature nodes used: `ORDER` for all points together, then those of each point whose
    /// check failed and that was integrated alone (each node costs one forward-mode pass per
    /// layer).
    pub nodes: usize,
    /// Pieces integrated: 1 for all points together, plus each refined point's pieces.
    pub pieces: usize,
    /// Pieces kept at rounding: their miss was within `ROUNDING_ZONE` ulps of their outputs'
    /// size and halving them did not reduce it (their misses are in `residual`).
    pub at_rounding: usize,
    /// Pieces whose check still failed after `MAX_DEPTH` bisections (their misses are in
    /// `residual`): the split did not meet its rule.
    pub gave_up: usize,
    /// `max |f|` over the points and outputs at both ends of the step: the size the rounding
    /// of the check `f(w_{s+1}) − f(w_s)` is relative to.
    pub scale: f64,
}

/// The step from `w` to `next` of `arch` at the points `x` (`[P, d]`), split by the `groups` of
/// [`layer_groups`], each piece's check at absolute tolerance `tol` on the outputs.
///
/// # Shapes
/// `x` `[P, d]`; returns `[G, P, K]` shares and `[P, K]` changes.
pub fn split_step(arch: &Architecture, w0: &Params, w: &Params, next: &Params, x: &[f64], groups: &[(String, Vec<usize>)], tol: f64) -> Result<StepSplit> {
    let step = StackStep::new(arch, w, Some(next))?;
    let (k, d) = (arch.outputs(), arch.input_dim());
    if d == 0 || x.len() % d != 0 {
        return Err(Error::Config(format!("{} inputs are not rows of d = {d}", x.len())));
    }
    let p = x.len() / d;
    let dir = step.dir.as_ref().expect("a step with a next state");
    // Output offsets of a `zero_output` network: the initial network's raw outputs.
    let off = arch.zero_output.then(|| step.stack.forward(&w0.data, x));
    let masked: Vec<Vec<Vec<f64>>> = groups
        .iter()
        .map(|(_, idx)| dir.iter().enumerate().map(|(i, t)| if idx.contains(&i) { t.clone() } else { vec![0.0; t.len()] }).collect())
        .collect();
    let at_t = |t: f64| -> Vec<Vec<f64>> { w.data.iter().zip(dir).map(|(a, b)| a.iter().zip(b).map(|(x, y)| x + t * y).collect()).collect() };
    // f at time t at the rows `xs` (raw forward, then the output map).
    let value = |t: f64, xs: &[f64], off: Option<&[f64]>| -> Vec<f64> {
        let mut g = step.stack.forward(&at_t(t), xs);
        output_map(arch, &mut g, None, off);
        g
    };
    // Σ_nodes weight · d/du f(w(t) + uΔw_g) at the rows `xs` for every group: [G, R, K].
    let integrate = |a: f64, b: f64, xs: &[f64], off: Option<&[f64]>| -> Vec<f64> {
        let rk = xs.len() / d * k;
        let mut acc = vec![0.0; groups.len() * rk];
        for (t, wt) in gauss_legendre_01(ORDER, a, b) {
            let params = at_t(t);
            for (gi, dg) in masked.iter().enumerate() {
                let at = At { w: &params, dw: Some(dg), t: None };
                let (mut g, mut fd) = step.stack.tangent_at(&at, xs.to_vec());
                output_map(arch, &mut g, Some(&mut fd), off);
                acc[gi * rk..(gi + 1) * rk].iter_mut().zip(&fd).for_each(|(s, v)| *s += wt * v);
            }
        }
        acc
    };
    // max over a row's outputs of |Σ_g share − (f(b) − f(a))|, for each of the R rows.
    let misfits = |shares: &[f64], fa: &[f64], fb: &[f64]| -> Vec<f64> {
        let r = fa.len() / k;
        (0..r).map(|i| (0..k).map(|c| ((0..groups.len()).map(|gi| shares[gi * r * k + i * k + c]).sum::<f64>() - (fb[i * k + c] - fa[i * k + c])).abs()).fold(0.0, f64::max)).collect()
    };
    let (f0, f1) = (value(0.0, x, off.as_deref()), value(1.0, x, off.as_deref()));
    let change: Vec<f64> = f1.iter().zip(&f0).map(|(b, a)| b - a).collect();
    // All rows on [0, 1] together; a row that fails its check alone, split at its own kinks,
    // then bisected.
    let mut shares = integrate(0.0, 1.0, x, off.as_deref());
    let (mut nodes, mut pieces, mut at_rounding, mut gave_up) = (ORDER, 1, 0, 0);
    let first = misfits(&shares, &f0, &f1);
    for (r, &miss) in first.iter().enumerate() {
        if miss <= tol {
            continue;
        }
        let xr = &x[r * d..(r + 1) * d];
        let offr = off.as_ref().map(|o| &o[r * k..(r + 1) * k]);
        let mut bounds = vec![0.0];
        let mut lo = 0.0;
        while let (Some(t), _) = step.locate_kink(xr, lo, 1.0) {
            bounds.push(t);
            lo = t;
        }
        bounds.push(1.0);
        let vals: Vec<Vec<f64>> = bounds.iter().map(|&t| value(t, xr, offr)).collect();
        // A piece: its ends, f there, its depth and its integral (computed when it is made).
        type Piece = (f64, f64, Vec<f64>, Vec<f64>, usize, Vec<f64>);
        let make = |a: f64, b: f64, fa: Vec<f64>, fb: Vec<f64>, depth: usize| -> Piece {
            let part = integrate(a, b, xr, offr);
            (a, b, fa, fb, depth, part)
        };
        let mut todo: Vec<Piece> = (0..bounds.len() - 1).map(|i| make(bounds[i], bounds[i + 1], vals[i].clone(), vals[i + 1].clone(), 0)).collect();
        nodes += ORDER * todo.len();
        let mut own = vec![0.0; groups.len() * k];
        while let Some((a, b, fa, fb, depth, part)) = todo.pop() {
            // Each piece's share of the tolerance (by its length, above the rounding of the
            // check), so that the pieces' misses add up to `tol` at most.
            let miss = misfits(&part, &fa, &fb)[0];
            let scale = fa.iter().chain(&fb).fold(0.0f64, |m, v| m.max(v.abs()));
            let floor = (ROUNDING_ULPS * f64::EPSILON * scale).max(ROUNDING);
            let met = miss <= (tol * (b - a)).max(floor);
            let mut accept = met || depth >= MAX_DEPTH;
            gave_up += usize::from(!met && depth >= MAX_DEPTH);
            let mut halves = None;
            if !accept {
                let mid = 0.5 * (a + b);
                let fm = value(mid, xr, offr);
                let (l, r) = (make(a, mid, fa.clone(), fm.clone(), depth + 1), make(mid, b, fm, fb.clone(), depth + 1));
                nodes += 2 * ORDER;
                let split_miss = misfits(&l.5, &l.2, &l.3)[0] + misfits(&r.5, &r.2, &r.3)[0];
                // Halving that does not shrink a miss near rounding: the piece is at rounding;
                // the halves are kept where they miss less.
                accept = miss <= ROUNDING_ZONE * f64::EPSILON * scale && split_miss > STALLED * miss;
                at_rounding += usize::from(accept);
                halves = Some((l, r, split_miss < miss));
            }
            match (accept, halves) {
                (false, Some((l, r, _))) => {
                    todo.push(l);
                    todo.push(r);
                }
                (true, Some((l, r, true))) => {
                    own.iter_mut().zip(l.5.iter().zip(&r.5)).for_each(|(s, (u, v))| *s += u + v);
                    pieces += 2;
                }
                _ => {
                    own.iter_mut().zip(&part).for_each(|(s, v)| *s += v);
                    pieces += 1;
                }
            }
        }
        for gi in 0..groups.len() {
            shares[gi * p * k + r * k..gi * p * k + (r + 1) * k].copy_from_slice(&own[gi * k..(gi + 1) * k]);
        }
    }
    let residual = misfits(&shares, &f0, &f1).into_iter().fold(0.0, f64::max);
    let scale = f0.iter().chain(&f1).fold(0.0f64, |m, v| m.max(v.abs()));
    Ok(StepSplit { shares, change, residual, nodes, pieces, at_rounding, gave_up, scale })
}

/// Every step of a run split by layer at the points `x`, reduced step by step by `reduce`
/// (called with the step index and its split; steps run in parallel, results in step order).
///
/// # Shapes
/// `x` `[P, d]`.
pub fn run_shares<R: Send>(net: &Trained, x: &[f64], tol: f64, reduce: &(dyn Fn(usize, &StepSplit) -> R + Sync), progress: &(dyn Fn(usize) + Sync)) -> Result<(Vec<String>, Vec<R>)> {
    let states = net.states();
    let arch = &net.run().manifest.architecture;
    let groups = layer_groups(arch, &states[0])?;
    let n = states.len() - 1;
    let done = std::sync::atomic::AtomicUsize::new(0);
    let out: Result<Vec<R>> = (0..n)
        .into_par_iter()
        .map(|s| {
            let split = split_step(arch, &states[0], &states[s], &states[s + 1], x, &groups, tol)?;
            progress(done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
            Ok(reduce(s, &split))
        })
        .collect();
    Ok((groups.into_iter().map(|(l, _)| l).collect(), out?))
}
