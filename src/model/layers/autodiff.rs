//! The autodiff forward pass of a layer stack with dfdx: what training differentiates, and the
//! generic per-sample Jacobians that every structured kernel path is tested against.
//!
//! Each layer uses dfdx's own ops where they exist (matmul, relu, tanh, sigmoid, the erf GELU,
//! leaky ReLU, normalize, gather, sum) and [`crate::model::conv::conv2d`] for convolutions (dfdx's
//! `Conv2D` needs a nightly compiler). A tensor that two branches read (a residual's input,
//! `x·sigmoid(x)`) is shared with `retaped`, so both branches' gradients reach it.

use dfdx::prelude::*;

use super::{Act, Node, Op};
use crate::model::conv::{self, Shape4};
use crate::model::tensors::ParamTensor;

/// Activations between layers: a flat `[n, F]` or a map `[n, C, H, W]`.
pub(crate) enum Activations<D: Device<f64>, T> {
    /// `[n, F]`.
    Flat(Tensor<(usize, usize), f64, D, T>),
    /// `[n, C, H, W]`.
    Map(Tensor<Shape4, f64, D, T>),
}

fn act_on<S: dfdx::shapes::Shape, D: Device<f64>, T: Tape<f64, D> + Merge<T>>(a: Act, x: Tensor<S, f64, D, T>) -> Tensor<S, f64, D, T> {
    match a {
        Act::Relu => x.relu(),
        Act::LeakyRelu(s) => dfdx::tensor_ops::leakyrelu(x, s),
        Act::Tanh => x.tanh(),
        Act::Sigmoid => x.sigmoid(),
        Act::Gelu => {
            // dfdx 0.13's `accurate_gelu` has the right value but a wrong derivative: its
            // `x·φ(x)` term is `x·e^{−x²/2}/√π` instead of `x·e^{−x²/2}/√(2π)`. The difference is
            // the derivative of `−c·e^{−x²/2}` with `c = 1/√π − 1/√(2π)`, so adding
            // `c·e^{−x²/2}` minus its own value (a constant: the output is unchanged bit for bit)
            // makes the derivative exact.
            let c = 1.0 / std::f64::consts::PI.sqrt() - 1.0 / (2.0 * std::f64::consts::PI).sqrt();
            let bump = (x.retaped::<T>().square() * -0.5).exp() * c;
            let frozen = bump.device().tensor_from_vec(bump.as_vec(), *bump.shape());
            x.accurate_gelu() + (bump - frozen)
        }
        Act::Softplus => {
            let r = x.retaped::<T>().relu();
            r + (x.abs().negate().exp() + 1.0).ln()
        }
        Act::Silu => x.retaped::<T>().sigmoid() * x,
    }
}

/// Winner (max) or all-window (avg) gather indices of a pooling layer for a batch.
fn pool_index(p: &super::pool::Pool, n: usize, values: Option<&[f64]>) -> Vec<usize> {
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

fn map<D: Device<f64>, T>(a: Activations<D, T>, at: &Node) -> Tensor<Shape4, f64, D, T> {
    match a {
        Activations::Map(t) => t,
        Activations::Flat(_) => panic!("{}: expected a map (the stack was resolved)", at.prefix),
    }
}

fn flat<D: Device<f64>, T>(a: Activations<D, T>, at: &Node) -> Tensor<(usize, usize), f64, D, T> {
    match a {
        Activations::Flat(t) => t,
        Activations::Map(_) => panic!("{}: expected a flat input (the stack was resolved)", at.prefix),
    }
}

/// The stack's layers applied to `x` with autodiff.
///
/// # Shapes
/// `p` in storage order; `x` as the stack's input.
pub(crate) fn forward_nodes<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(nodes: &[Node], p: &[ParamTensor<D>], mut x: Activations<D, T>) -> Activations<D, T> {
    for n in nodes {
        x = match &n.op {
            Op::Dense(d) => {
                let a = flat(x, n);
                let rows = a.shape().0;
                let mut z = a.matmul(p[n.first].r2().clone().permute::<(usize, usize), Axes2<1, 0>>());
                if d.bias {
                    z = z + p[n.first + 1].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&(rows, d.n_out));
                }
                Activations::Flat(z)
            }
            Op::Conv(c) => {
                let a = map(x, n);
                let zero: Tensor<(usize,), f64, D> = a.device().zeros_like(&(c.co,));
                let b = if c.bias { p[n.first + 1].r1().clone() } else { zero };
                Activations::Map(conv::conv2d(a, p[n.first].r4(), &b, c.stride, c.padding))
            }
            Op::MaxPool(pl) | Op::AvgPool(pl) => {
                let a = map(x, n);
                let rows = a.shape().0;
                let dev = a.device().clone();
                let is_max = matches!(n.op, Op::MaxPool(_));
                let values = if is_max { Some(a.as_vec()) } else { None };
                let idx = pool_index(pl, rows, values.as_deref());
                let len = idx.len();
                let idx = dev.tensor_from_vec(idx, (len,));
                let g = a.reshape_like(&(rows * pl.c * pl.h * pl.w,)).gather::<(usize,), (usize,)>(idx);
                let out = if is_max {
                    g.reshape_like(&(rows, pl.c, pl.ho, pl.wo))
                } else {
                    let kk = pl.k * pl.k;
                    let s: Tensor<(usize,), f64, D, T> = g.reshape_like(&(len / kk, kk)).sum::<(usize,), Axis<1>>();
                    (s * (1.0 / kk as f64)).reshape_like(&(rows, pl.c, pl.ho, pl.wo))
                };
                Activations::Map(out)
            }
            Op::Flatten => match x {
                Activations::Map(t) => {
                    let (b, c, h, w) = *t.shape();
                    Activations::Flat(t.reshape_like(&(b, c * h * w)))
                }
                f => f,
            },
            Op::Act(a) => match x {
                Activations::Flat(t) => Activations::Flat(act_on(*a, t)),
                Activations::Map(t) => Activations::Map(act_on(*a, t)),
            },
            Op::Norm(nm) => match x {
                Activations::Flat(t) => {
                    let shape = *t.shape();
                    let y = t.normalize::<Axis<1>>(nm.eps);
                    let g = p[n.first].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&shape);
                    let b = p[n.first + 1].r1().clone().broadcast_like::<(usize, usize), Axis<0>>(&shape);
                    Activations::Flat(y * g + b)
                }
                Activations::Map(t) => {
                    let shape = *t.shape();
                    let y = t.normalize::<Axis<1>>(nm.eps);
                    let g = p[n.first].r1().clone().broadcast_like::<Shape4, Axes3<0, 2, 3>>(&shape);
                    let b = p[n.first + 1].r1().clone().broadcast_like::<Shape4, Axes3<0, 2, 3>>(&shape);
                    Activations::Map(y * g + b)
                }
            },
            Op::Residual(r) => {
                let shared = match &x {
                    Activations::Flat(t) => Activations::Flat(t.retaped::<T>()),
                    Activations::Map(t) => Activations::Map(t.retaped::<T>()),
                };
                let body = forward_nodes(&r.body, p, x);
                let short = match &r.shortcut {
                    Some(sc) => forward_nodes(std::slice::from_ref(sc.as_ref()), p, shared),
                    None => shared,
                };
                match (body, short) {
                    (Activations::Flat(a), Activations::Flat(b)) => Activations::Flat(a + b),
                    (Activations::Map(a), Activations::Map(b)) => Activations::Map(a + b),
                    _ => panic!("{}: residual branches of different ranks (the stack was resolved)", n.prefix),
                }
            }
        };
    }
    x
}
