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
//! passes), and a step whose check fails is split where a point's ReLU changes sign
//! ([`StackStep::locate_kink`]) and then bisected until every piece passes.

use rayon::prelude::*;

use crate::api::Trained;
use crate::error::{Error, Result};
use crate::kernel::quadrature::gauss_legendre_01;
use crate::kernel::stack::step::StackStep;
use crate::model::layers::At;
use crate::model::{Architecture, Body, Params};

/// Gauss–Legendre nodes per piece.
const ORDER: usize = 4;
/// Bisections of a piece before its check is given up (the miss is then reported).
const MAX_DEPTH: usize = 40;

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

/// One step split by layer at `P` points.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSplit {
    /// Each layer's share `∫₀¹ ∇_g f·Δw_g dt`. # Shapes `[G, P, K]`.
    pub shares: Vec<f64>,
    /// The network's own change `f(w_{s+1}) − f(w_s)`. # Shapes `[P, K]`.
    pub change: Vec<f64>,
    /// `max |Σ_g share − change|` over the points and outputs.
    pub residual: f64,
    /// Quadrature nodes used (each costs one forward-mode pass per layer).
    pub nodes: usize,
    /// Pieces the step was integrated in (1 when no split was needed).
    pub pieces: usize,
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
    // f at a time t (raw forward, then the output map).
    let value = |t: f64| -> Vec<f64> {
        let wt = at_t(t);
        let g = step.stack.forward(&wt, x);
        step.map_outputs(g, &vec![0.0; p * k], off.as_deref()).0
    };
    // Σ_nodes weight · d/du f(w(t) + uΔw_g) for every group: [G, P, K].
    let integrate = |a: f64, b: f64| -> Vec<f64> {
        let mut acc = vec![0.0; groups.len() * p * k];
        for (t, wt) in gauss_legendre_01(ORDER, a, b) {
            let params = at_t(t);
            for (gi, dg) in masked.iter().enumerate() {
                let at = At { w: &params, dw: Some(dg), t: None };
                let (g, gd) = step.stack.tangent_at(&at, x.to_vec());
                let (_, fd) = step.map_outputs(g, &gd, off.as_deref());
                acc[gi * p * k..(gi + 1) * p * k].iter_mut().zip(&fd).for_each(|(s, v)| *s += wt * v);
            }
        }
        acc
    };
    let misfit = |shares: &[f64], fa: &[f64], fb: &[f64]| -> f64 {
        (0..p * k).map(|j| ((0..groups.len()).map(|gi| shares[gi * p * k + j]).sum::<f64>() - (fb[j] - fa[j])).abs()).fold(0.0, f64::max)
    };
    let (f0, f1) = (value(0.0), value(1.0));
    let change: Vec<f64> = f1.iter().zip(&f0).map(|(b, a)| b - a).collect();
    // Pieces: [0, 1] first; where it fails, the points' kinks, then bisection.
    let mut todo: Vec<(f64, f64, Vec<f64>, Vec<f64>, usize)> = vec![(0.0, 1.0, f0.clone(), f1.clone(), 0)];
    let mut split_at_kinks = false;
    let (mut shares, mut nodes, mut pieces, mut worst) = (vec![0.0; groups.len() * p * k], 0, 0, 0.0f64);
    while let Some((a, b, fa, fb, depth)) = todo.pop() {
        let part = integrate(a, b);
        nodes += ORDER;
        let miss = misfit(&part, &fa, &fb);
        if miss <= tol || depth >= MAX_DEPTH {
            worst = worst.max(miss);
            shares.iter_mut().zip(&part).for_each(|(s, v)| *s += v);
            pieces += 1;
            continue;
        }
        let mut cuts: Vec<f64> = Vec::new();
        if !split_at_kinks && a == 0.0 && b == 1.0 {
            split_at_kinks = true;
            for r in 0..p {
                let xp = &x[r * d..(r + 1) * d];
                let mut lo = 0.0;
                while let (Some(t), _) = step.locate_kink(xp, lo, 1.0) {
                    cuts.push(t);
                    lo = t;
                }
            }
            cuts.sort_by(f64::total_cmp);
            cuts.dedup_by(|u, v| (*u - *v).abs() <= 1e-12);
        }
        if cuts.is_empty() {
            cuts.push(0.5 * (a + b));
        }
        let mut bounds = vec![a];
        bounds.extend(cuts);
        bounds.push(b);
        let vals: Vec<Vec<f64>> = bounds.iter().enumerate().map(|(i, &t)| if i == 0 { fa.clone() } else if i + 1 == bounds.len() { fb.clone() } else { value(t) }).collect();
        for i in 0..bounds.len() - 1 {
            todo.push((bounds[i], bounds[i + 1], vals[i].clone(), vals[i + 1].clone(), depth + 1));
        }
    }
    let residual = misfit(&shares, &f0, &f1).max(worst);
    Ok(StepSplit { shares, change, residual, nodes, pieces })
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
