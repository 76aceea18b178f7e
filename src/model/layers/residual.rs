//! `residual`: `y = body(x) + shortcut(x)`, a ResNet basic block without batch norm.
//!
//! The shortcut is the identity when the body keeps the shape, else a projection: `dense`
//! (flat inputs) or a 1×1 `conv2d` whose stride gives the body's output size (maps), with a bias,
//! named `i.shortcut.*` (`scripts/torch_model.py`'s `Residual`). Its gradients are those of its
//! layers; the sum adds their sensitivities. A composite: every method walks its two branches.

use dfdx::prelude::*;

use super::autodiff::{self, Activations};
use serde_json::{json, Value};

use super::contract::{KindSpec, At, Layer, Poly, Probe, Sweep};
use super::conv2d::Conv;
use super::dense::Dense;
use super::recorded::refuse;
use super::spec::{err, need, options};
use super::{backward_nodes, forward_nodes, resolve_list, sweep_nodes, tangent_nodes, AnyLayer, Cache, Grad, LayerSpec, Node, Shape};
use crate::model::tensors::ParamTensor;
use crate::model::param_spec::ParamSpec;

/// A resolved residual block.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Residual {
    pub body: Vec<Node>,
    pub shortcut: Option<Box<Node>>,
}

impl Residual {
    /// Resolves the body from `input` and the shortcut that brings `input` to its output.
    pub(crate) fn resolve(input: Shape, layers: &[LayerSpec], at: &str, prefix: &str, tensors: &mut usize) -> Result<Residual, String> {
        let body = resolve_list(input, layers, &format!("{at}.residual"), &format!("{prefix}body."), tensors)?;
        let out = body.last().map_or(input, |n| n.output);
        if out == input {
            return Ok(Residual { body, shortcut: None });
        }
        let first = *tensors;
        let layer = match (input, out) {
            (Shape::Flat(a), Shape::Flat(b)) => AnyLayer::Dense(Dense { n_in: a, n_out: b, bias: true, positions: 1 }),
            (Shape::Seq(t, a), Shape::Seq(u, b)) if t == u => AnyLayer::Dense(Dense { n_in: a, n_out: b, bias: true, positions: t }),
            (Shape::Map(c, h, w), Shape::Map(co, ho, wo)) => {
                let stride = (1..=h.max(w)).find(|&s| (h - 1) / s + 1 == ho && (w - 1) / s + 1 == wo).ok_or_else(|| {
                    format!("{at} residual: no 1×1 projection with a stride maps the input {input} to the body's output {out}")
                })?;
                AnyLayer::Conv2d(Conv { c, h, w, co, k: 1, stride, padding: 0, ho, wo, bias: true })
            }
            _ => return Err(format!("{at} residual: the body turns the input {input} into {out}; a shortcut cannot project between a map and a flat vector")),
        };
        *tensors += 2;
        let shortcut = Node { layer, input, output: out, first, count: 2, prefix: format!("{prefix}shortcut."), ahead: false };
        Ok(Residual { body, shortcut: Some(Box::new(shortcut)) })
    }

    /// The block's output shape.
    pub(crate) fn output(&self, input: Shape) -> Shape {
        self.body.last().map_or(input, |n| n.output)
    }

    fn shortcut_slice(&self) -> &[Node] {
        self.shortcut.as_deref().map_or(&[], std::slice::from_ref)
    }
}

fn walk_specs(nodes: &[Node], out: &mut Vec<ParamSpec>) {
    for n in nodes {
        n.layer.param_specs(&n.prefix, out);
    }
}

impl Layer for Residual {
    fn torch(&self) -> String {
        let body = super::describe(&self.body);
        match &self.shortcut {
            Some(sc) => format!("Residual(Sequential({body}), shortcut={})", sc.layer.torch()),
            None => format!("Residual(Sequential({body}))"),
        }
    }

    /// Its body's ops and its shortcut's (`None` where one of them has none).
    fn device(&self) -> Option<crate::device::program::Op> {
        let body = self.body.iter().map(|n| n.layer.device().map(|op| (n.first, op))).collect::<Option<Vec<_>>>()?;
        let shortcut = match &self.shortcut {
            Some(sc) => Some((sc.first, Box::new(sc.layer.device()?))),
            None => None,
        };
        Some(crate::device::program::Op::Residual { body, shortcut })
    }

    fn param_specs(&self, _prefix: &str, out: &mut Vec<ParamSpec>) {
        walk_specs(&self.body, out);
        walk_specs(self.shortcut_slice(), out);
    }

    fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) {
        for n in self.body.iter().chain(self.shortcut_slice()) {
            n.layer.init(rng, data);
        }
    }

    fn reach(&self, smooth_seen: &mut bool) -> bool {
        let mut inner = *smooth_seen;
        if !self.body.iter().all(|n| n.layer.reach(&mut inner)) {
            return false;
        }
        *smooth_seen |= inner;
        true
    }

    fn forward(&self, _first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) {
        let mut inner = Vec::new();
        let mut y = forward_nodes(&self.body, at, x.clone(), keep.then_some(&mut inner));
        let mut sc_caches = Vec::new();
        let s = if self.shortcut.is_some() { forward_nodes(self.shortcut_slice(), at, x, keep.then_some(&mut sc_caches)) } else { x };
        y.iter_mut().zip(&s).for_each(|(a, b)| *a += b);
        (y, Cache::Residual(inner, Box::new(sc_caches.pop().unwrap_or(Cache::None))))
    }

    fn tangent(&self, _first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        let (mut y, yd) = tangent_nodes(&self.body, at, x.clone(), xd.clone(), probe);
        let (s, sd) = if self.shortcut.is_some() { tangent_nodes(self.shortcut_slice(), at, x, xd, None) } else { (x, xd) };
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

    /// Both branches' gradients, and their input sensitivities summed.
    fn backward(&self, _first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        let Cache::Residual(inner, sc) = cache else { unreachable!("a residual block's cache is its branches'") };
        let mut dx = backward_nodes(&self.body, at, inner, dy.clone(), k, want_dx, grads);
        let ds = if self.shortcut.is_some() { backward_nodes(self.shortcut_slice(), at, std::slice::from_ref(sc.as_ref()), dy, k, want_dx, grads) } else { dy };
        if want_dx {
            dx.iter_mut().zip(&ds).for_each(|(a, b)| *a += b);
        }
        dx
    }

    fn sweep(&self, _first: usize, w: &[Vec<f64>], dw: &[Vec<f64>], p: Poly, sw: &mut Sweep) -> Option<Poly> {
        let body = sweep_nodes(&self.body, w, dw, p.clone(), sw)?;
        let short = if self.shortcut.is_some() { sweep_nodes(self.shortcut_slice(), w, dw, p, sw)? } else { p };
        Some(body.add(&short))
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let shared = match &x {
            Activations::Flat(t) => Activations::Flat(t.retaped::<T>()),
            Activations::Map(t) => Activations::Map(t.retaped::<T>()),
            Activations::Seq(t) => Activations::Seq(t.retaped::<T>()),
        };
        let body = autodiff::forward_nodes(&self.body, p, x);
        let short = if self.shortcut.is_some() { autodiff::forward_nodes(self.shortcut_slice(), p, shared) } else { shared };
        match (body, short) {
            (Activations::Flat(a), Activations::Flat(b)) => Activations::Flat(a + b),
            (Activations::Map(a), Activations::Map(b)) => Activations::Map(a + b),
            (Activations::Seq(a), Activations::Seq(b)) => Activations::Seq(a + b),
            _ => panic!("residual branches of different ranks (the stack was resolved)"),
        }
    }

    fn gradient_floats(&self, k: u64) -> u64 {
        self.body.iter().chain(self.shortcut_slice()).map(|n| n.layer.gradient_floats(k)).sum()
    }

    fn scratch_floats(&self) -> u64 {
        self.body.iter().chain(self.shortcut_slice()).map(|n| n.output.size() as u64 + n.layer.scratch_floats()).sum()
    }

    fn branches(&self) -> Option<(&[Node], Option<&Node>)> {
        Some((&self.body, self.shortcut.as_deref()))
    }
}

/// `{ residual = [layers] }`: `y = body(x) + shortcut(x)`, identity shortcut, or a projection
/// (dense, or a 1×1 convolution with the stride that matches the body's output size) when shapes
/// differ.
#[derive(Clone, Debug, PartialEq)]
pub struct ResidualSpec {
    /// The body's layers.
    pub layers: Vec<LayerSpec>,
}

impl KindSpec for ResidualSpec {
    const NAMES: &'static [&'static str] = &["residual"];
    const TORCH: &'static [&'static str] = &["Residual"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let a = need(arg, at, name)?;
        let list = match a {
            Value::Array(l) => l,
            Value::Object(_) => {
                let m = options(a, at, name, &["layers"])?;
                m.get("layers").and_then(Value::as_array).ok_or_else(|| err(at, "residual needs `layers = [...]`"))?
            }
            _ => return Err(err(at, format!("residual takes a list of layers, got {a}"))),
        };
        if list.is_empty() {
            return Err(err(at, "residual needs at least one layer"));
        }
        let layers = list.iter().enumerate().map(|(j, l)| LayerSpec::parse(l, &format!("{at}.residual[{j}]"))).collect::<Result<Vec<_>, _>>()?;
        Ok(ResidualSpec { layers })
    }

    fn to_value(&self) -> Value {
        json!({ "residual": self.layers.iter().map(LayerSpec::to_value).collect::<Vec<_>>() })
    }

    fn label(&self) -> String {
        format!("residual[{}]", self.layers.iter().map(LayerSpec::label).collect::<Vec<_>>().join(", "))
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        let body = m.get("body").and_then(Value::as_array).ok_or_else(|| refuse(at, m, "a Residual needs its `body` modules"))?;
        if body.is_empty() {
            return Err(refuse(at, m, "an empty Residual body"));
        }
        Ok(ResidualSpec { layers: LayerSpec::from_torch_list(body, &format!("{at}.body"))? })
    }

    fn resolve(&self, input: Shape, at: &str, prefix: &str, tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let res = Residual::resolve(input, &self.layers, at, prefix, tensors)?;
        let out = res.output(input);
        Ok((AnyLayer::Residual(res), out))
    }
}
