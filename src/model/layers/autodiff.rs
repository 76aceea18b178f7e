//! The autodiff forward pass of a layer stack with dfdx: what training differentiates, and the
//! generic per-sample Jacobians that every structured kernel path is tested against.
//!
//! Each layer uses dfdx's own ops where they exist (matmul, relu, tanh, sigmoid, the erf GELU,
//! leaky ReLU, normalize, gather, sum) and [`crate::model::conv::conv2d`] for convolutions (dfdx's
//! `Conv2D` needs a nightly compiler). A tensor that two branches read (a residual's input,
//! `x·sigmoid(x)`) is shared with `retaped`, so both branches' gradients reach it.

use dfdx::prelude::*;

use super::contract::Layer;
use super::Node;
use crate::model::conv::Shape4;
use crate::model::tensors::ParamTensor;

pub(crate) use super::contract::Activations;

/// Winner (max) or all-window (avg) gather indices of a pooling layer for a batch.
pub(crate) fn pool_index(p: &super::pool::Pool, n: usize, values: Option<&[f64]>) -> Vec<usize> {
    let size = p.c * p.h * p.w;
    let mut idx = Vec::new();
    for s in 0..n {
        for c in 0..p.c {
            for oy in 0..p.ho {
                for ox in 0..p.wo {
                    match values {
                        Some(v) => {
                            let mut best = usize::MAX;
                            for q in p.window(c, oy, ox) {
                                if best == usize::MAX || v[s * size + q] > v[s * size + best] {
                                    best = q;
                                }
                            }
                            idx.push(s * size + best);
                        }
                        None => idx.extend(p.window(c, oy, ox).map(|q| s * size + q)),
                    }
                }
            }
        }
    }
    idx
}

/// The activations as a map (the stack was resolved, so a layer that needs one gets one).
pub(crate) fn map<D: Device<f64>, T>(a: Activations<D, T>) -> Tensor<Shape4, f64, D, T> {
    match a {
        Activations::Map(t) => t,
        _ => panic!("expected a map (the stack was resolved)"),
    }
}

/// The activations as flat rows.
pub(crate) fn flat<D: Device<f64>, T>(a: Activations<D, T>) -> Tensor<(usize, usize), f64, D, T> {
    match a {
        Activations::Flat(t) => t,
        _ => panic!("expected a flat input (the stack was resolved)"),
    }
}

/// The activations as a sequence `[n, T, d]`.
pub(crate) fn seq<D: Device<f64>, T>(a: Activations<D, T>) -> Tensor<(usize, usize, usize), f64, D, T> {
    match a {
        Activations::Seq(t) => t,
        _ => panic!("expected a sequence (the stack was resolved)"),
    }
}

/// The stack's layers applied to `x` with autodiff.
///
/// # Shapes
/// `p` in storage order; `x` as the stack's input.
pub(crate) fn forward_nodes<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(nodes: &[Node], p: &[ParamTensor<D>], mut x: Activations<D, T>) -> Activations<D, T> {
    for n in nodes {
        x = n.layer.autodiff(n.first, p, x);
    }
    x
}
