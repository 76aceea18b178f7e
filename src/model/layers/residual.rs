//! `residual`: `y = body(x) + shortcut(x)`, a ResNet basic block without batch norm.
//!
//! The shortcut is the identity when the body keeps the shape, else a projection: `dense`
//! (flat inputs) or a 1×1 `conv2d` whose stride gives the body's output size (maps), with a bias,
//! named `i.shortcut.*` (`scripts/torch_model.py`'s `Residual`). Its gradients are those of its
//! layers; the sum adds their sensitivities.

use super::conv2d::Conv;
use super::dense::Dense;
use super::{backward_nodes, forward_nodes, resolve_list, tangent_nodes, Cache, Grad, Node, Op, Shape};

/// A resolved residual block.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Residual {
    pub body: Vec<Node>,
    pub shortcut: Option<Box<Node>>,
}

impl Residual {
    /// Resolves the body from `input` and the shortcut that brings `input` to its output.
    pub(crate) fn resolve(input: Shape, layers: &[super::LayerSpec], at: &str, prefix: &str, tensors: &mut usize) -> Result<Residual, String> {
        let body = resolve_list(input, layers, &format!("{at}.residual"), &format!("{prefix}body."), tensors)?;
        let out = body.last().map_or(input, |n| n.output);
        if out == input {
            return Ok(Residual { body, shortcut: None });
        }
        let first = *tensors;
        let op = match (input, out) {
            (Shape::Flat(a), Shape::Flat(b)) => Op::Dense(Dense { n_in: a, n_out: b, bias: true }),
            (Shape::Map(c, h, w), Shape::Map(co, ho, wo)) => {
                let stride = (1..=h.max(w)).find(|&s| (h - 1) / s + 1 == ho && (w - 1) / s + 1 == wo).ok_or_else(|| {
                    format!("{at} residual: no 1×1 projection with a stride maps the input {input} to the body's output {out}")
                })?;
                Op::Conv(Conv { c, h, w, co, k: 1, stride, padding: 0, ho, wo, bias: true })
            }
            _ => return Err(format!("{at} residual: the body turns the input {input} into {out}; a shortcut cannot project between a map and a flat vector")),
        };
        *tensors += 2;
        let shortcut = Node { op, input, output: out, first, count: 2, prefix: format!("{prefix}shortcut.") };
        Ok(Residual { body, shortcut: Some(Box::new(shortcut)) })
    }

    /// The block's output shape.
    pub(crate) fn output(&self, input: Shape) -> Shape {
        self.body.last().map_or(input, |n| n.output)
    }

    fn shortcut_slice(&self) -> &[Node] {
        self.shortcut.as_deref().map_or(&[], std::slice::from_ref)
    }

    /// Forward pass; the caches are kept when `keep`.
    pub(crate) fn forward(&self, params: &[Vec<f64>], x: Vec<f64>, keep: bool) -> (Vec<f64>, Vec<Cache>, Cache) {
        let mut inner = Vec::new();
        let (mut y, ()) = forward_nodes(&self.body, params, x.clone(), keep.then_some(&mut inner));
        let mut sc_caches = Vec::new();
        let s = if self.shortcut.is_some() { forward_nodes(self.shortcut_slice(), params, x, keep.then_some(&mut sc_caches)).0 } else { x };
        y.iter_mut().zip(&s).for_each(|(a, b)| *a += b);
        (y, inner, sc_caches.pop().unwrap_or(Cache::None))
    }

    /// Value and tangent.
    pub(crate) fn tangent(&self, params: &[Vec<f64>], dir: &[Vec<f64>], x: Vec<f64>, xd: Option<Vec<f64>>, probe: Option<&mut Vec<(f64, f64)>>) -> (Vec<f64>, Option<Vec<f64>>) {
        let (mut y, yd) = tangent_nodes(&self.body, params, dir, x.clone(), xd.clone(), probe);
        let (s, sd) = if self.shortcut.is_some() { tangent_nodes(self.shortcut_slice(), params, dir, x, xd, None) } else { (x, xd) };
        y.iter_mut().zip(&s).for_each(|(a, b)| *a += b);
        let yd = match (yd, sd) {
            (Some(mut a), Some(b)) => {
                a.iter_mut().zip(&b).for_each(|(u, v)| *u += v);
                Some(a)
            }
            (a, b) => a.or(b),
        };
        (y, yd)
    }

    /// Backward pass: both branches' gradients, and their input sensitivities summed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(&self, params: &[Vec<f64>], inner: &[Cache], sc: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let mut dx = backward_nodes(&self.body, params, inner, dy.clone(), k, want_dx, grads);
        let ds = if self.shortcut.is_some() { backward_nodes(self.shortcut_slice(), params, std::slice::from_ref(sc), dy, k, want_dx, grads) } else { dy };
        if want_dx {
            dx.iter_mut().zip(&ds).for_each(|(a, b)| *a += b);
        }
        dx
    }
}
