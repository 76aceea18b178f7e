//! Networks as a stack of layers: the layer kinds, how their shapes chain, and the plain-Rust
//! forward pass, its tangent along a parameter direction and its per-sample backward pass.
//!
//! One file per layer kind (`dense`, `conv2d`, `pool`, `activation`, `norm`, and the
//! residual block in `residual`) holds its forward pass, its tangent (forward mode, for the
//! quadrature's search along a step), its backward pass with the form of its per-sample
//! parameter gradient (`Grad`: factored `δ ⊗ a` for dense layers, formed for the others) and
//! whether it is piecewise linear along a step (`Stack::kinks_reachable`). The walk over the
//! list is here; the autodiff forward of the same stack (training and the reference Jacobians)
//! is `autodiff`; the kernel engine consumes `Grad`s.
//!
//! Data layout per sample is PyTorch's: `[C, H, W]` maps row-major, flat vectors `[F]`.
//! Parameter names are those of an `nn.Sequential` of the same layers (`3.weight`); a residual
//! block `i` holds `i.body.j.*` and, when it projects, `i.shortcut.*`.

pub(crate) mod activation;
pub(crate) mod autodiff;
pub(crate) mod conv2d;
pub(crate) mod dense;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod residual;
pub mod spec;

pub use activation::Act;
pub use spec::LayerSpec;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::ParamSpec;
use conv2d::Conv;
use dense::Dense;
use norm::{Norm, NormCache};
use pool::Pool;
use residual::Residual;

/// The shape of one sample's activations between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// A feature vector `[F]`.
    Flat(usize),
    /// A map `[C, H, W]`.
    Map(usize, usize, usize),
}

impl Shape {
    /// Numbers per sample.
    pub fn size(self) -> usize {
        match self {
            Shape::Flat(f) => f,
            Shape::Map(c, h, w) => c * h * w,
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Flat(n) => write!(f, "[{n}]"),
            Shape::Map(c, h, w) => write!(f, "[{c}, {h}, {w}]"),
        }
    }
}

/// A resolved layer: what it computes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    Dense(Dense),
    Conv(Conv),
    MaxPool(Pool),
    AvgPool(Pool),
    Flatten,
    Act(Act),
    Norm(Norm),
    Residual(Residual),
}

/// A resolved layer with its shapes and its parameter tensors `first..first + count`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    pub op: Op,
    pub input: Shape,
    pub output: Shape,
    pub first: usize,
    pub count: usize,
    /// The parameter name prefix (`3.`, `2.body.0.`).
    pub prefix: String,
}

/// A resolved stack: the layers with their shapes, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Stack {
    pub(crate) input: Shape,
    pub(crate) nodes: Vec<Node>,
    pub(crate) tensors: usize,
}

/// One parameter layer's per-sample gradient for a batch of n samples and K output classes.
#[derive(Clone, Debug)]
pub(crate) enum Grad {
    /// `∇_W f^k = δ[k] ⊗ a`, `∇_b f^k = δ[k]`: `acts` `[n, in]`, `deltas` `[n, K, out]`.
    Factor { acts: Vec<f64>, deltas: Vec<f64>, n_in: usize, n_out: usize, bias: bool },
    /// The whole gradient of the layer's tensors, in parameter order: `[n, K, width]`.
    Formed { g: Vec<f64>, width: usize },
}

/// What one layer's backward pass needs from its forward pass.
#[derive(Debug)]
pub(crate) enum Cache {
    None,
    /// The input (activations: pre-activations; dense: its acts).
    Input(Vec<f64>),
    /// A convolution's patches `[n, P, C·k·k]`.
    Patches(Vec<f64>),
    /// Max pooling's winners.
    Arg(Vec<u32>),
    Norm(NormCache),
    Residual(Vec<Cache>, Box<Cache>),
}

fn resolve_err(at: &str, spec: &LayerSpec, msg: impl std::fmt::Display) -> String {
    format!("{at} {}: {msg}", spec.label())
}

impl Stack {
    /// Chains `specs` from `input`, checking every shape; the last layer must give `[outputs]`.
    pub fn resolve(input: Shape, specs: &[LayerSpec], outputs: usize) -> Result<Stack, String> {
        let mut tensors = 0;
        let nodes = resolve_list(input, specs, "model.layers", "", &mut tensors)?;
        if tensors == 0 {
            return Err("model.layers: the stack has no parameters (nothing to train, no kernel to take); add a dense or conv2d layer".into());
        }
        let out = nodes.last().map_or(input, |n| n.output);
        if out != Shape::Flat(outputs) {
            return Err(format!(
                "model.layers: the last layer gives {out} per sample; the data needs [{outputs}] (one output per class or target{})",
                if matches!(out, Shape::Map(..)) { "; add \"flatten\" and a dense layer" } else { "" }
            ));
        }
        Ok(Stack { input, nodes, tensors })
    }

    /// The output shape `[K]`.
    pub fn outputs(&self) -> usize {
        self.nodes.last().map_or(self.input.size(), |n| n.output.size())
    }

    /// Parameter names and shapes, in storage order.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let mut out = Vec::with_capacity(self.tensors);
        specs_of(&self.nodes, &mut out);
        out
    }

    /// Whether every kink along a step can be found by the polynomial sweep: no ReLU, leaky ReLU
    /// or max-pool behind a smooth non-polynomial layer (tanh, sigmoid, softplus, GELU, SiLU,
    /// layer norm), where the sweep stops.
    pub fn kinks_reachable(&self) -> bool {
        fn walk(nodes: &[Node], smooth_seen: &mut bool) -> bool {
            for n in nodes {
                match &n.op {
                    Op::Act(a) if a.piecewise_linear() && *smooth_seen => return false,
                    Op::MaxPool(_) if *smooth_seen => return false,
                    Op::Act(a) if !a.piecewise_linear() => *smooth_seen = true,
                    Op::Norm(_) => *smooth_seen = true,
                    Op::Residual(r) => {
                        let mut inner = *smooth_seen;
                        if !walk(&r.body, &mut inner) {
                            return false;
                        }
                        *smooth_seen |= inner;
                    }
                    _ => {}
                }
            }
            true
        }
        walk(&self.nodes, &mut false)
    }

    /// Seeded initialisation in storage order, PyTorch's defaults: weights and biases uniform in
    /// `[−1/√fan_in, 1/√fan_in]` (fan_in = `in` or `C·k·k`), layer norm γ = 1, β = 0; with
    /// `zero_last` the last layer's parameters are 0 (a constant initial output).
    pub(crate) fn init(&self, rng: &mut impl Rng, zero_last: bool) -> Vec<Vec<f64>> {
        let mut data = Vec::with_capacity(self.tensors);
        init_nodes(&self.nodes, rng, &mut data);
        if zero_last {
            if let Some(last) = self.nodes.last() {
                for d in &mut data[last.first..last.first + last.count] {
                    d.iter_mut().for_each(|v| *v = 0.0);
                }
            }
        }
        data
    }

    /// Plain forward pass `g_w(x)`.
    ///
    /// # Shapes
    /// `params` in storage order, `x` `[n, input]`; returns `[n, K]`.
    pub(crate) fn forward(&self, params: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
        forward_nodes(&self.nodes, params, x.to_vec(), None).0
    }

    /// Forward pass keeping what [`Stack::backward`] needs.
    pub(crate) fn forward_cached(&self, params: &[Vec<f64>], x: &[f64]) -> (Vec<f64>, Vec<Cache>) {
        let mut caches = Vec::with_capacity(self.nodes.len());
        let y = forward_nodes(&self.nodes, params, x.to_vec(), Some(&mut caches)).0;
        (y, caches)
    }

    /// Output and its tangent along the parameter direction `dir` (same layout as `params`):
    /// `(g_w(x), d/dt g_{w + t·dir}(x) at t = 0)`.
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `[n, K]` twice.
    pub(crate) fn tangent(&self, params: &[Vec<f64>], dir: &[Vec<f64>], x: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let (y, yd) = tangent_nodes(&self.nodes, params, dir, x.to_vec(), None, None);
        (y, yd.unwrap_or_default())
    }

    /// The inputs of every piecewise-linear activation (ReLU, leaky ReLU) and every max-pool
    /// entry's margin over the rest of its window ([`pool::Pool::max_margins`]) with their
    /// t-derivatives `(z, dz/dt)` along `dir`, in walk order: each changes sign at a kink (what
    /// the adaptive rule's kink location reads behind smooth layers).
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `n ×` (the activations' sizes) pairs.
    pub(crate) fn kink_inputs(&self, params: &[Vec<f64>], dir: &[Vec<f64>], x: &[f64]) -> Vec<(f64, f64)> {
        let mut probe = Vec::new();
        tangent_nodes(&self.nodes, params, dir, x.to_vec(), None, Some(&mut probe));
        probe
    }

    /// Per-sample gradients of the K outputs: `dy` `[n, K, K_out]` are the output
    /// sensitivities of each class (for `f = out(α g)` the rows of `∂f^k/∂g`); returns each
    /// parameter layer's [`Grad`] with its first tensor index, in storage order.
    pub(crate) fn backward(&self, params: &[Vec<f64>], caches: &[Cache], dy: Vec<f64>, k: usize) -> Vec<(usize, Grad)> {
        let mut grads = Vec::new();
        backward_nodes(&self.nodes, params, caches, dy, k, false, &mut grads);
        grads.sort_by_key(|g| g.0);
        grads
    }

    /// The last layer's parameter name prefix (`11.`).
    pub(crate) fn last_prefix(&self) -> String {
        self.nodes.last().map_or_else(String::new, |n| n.prefix.clone())
    }

    /// Whether the last layer is dense with a bias (last-layer Laplace's requirement).
    pub(crate) fn ends_in_dense_with_bias(&self) -> bool {
        matches!(self.nodes.last().map(|n| &n.op), Some(Op::Dense(Dense { bias: true, .. })))
    }

    /// The last layer's inputs (every layer but the last applied).
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `[n, in_last]`.
    pub(crate) fn forward_penultimate(&self, params: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
        let k = self.nodes.len().saturating_sub(1);
        forward_nodes(&self.nodes[..k], params, x.to_vec(), None).0
    }

    /// The module as PyTorch prints it, e.g. `Sequential(Conv2d(1, 6, 5, stride=1, padding=2), ReLU(), …)`.
    pub(crate) fn torch_description(&self) -> String {
        fn list(nodes: &[Node]) -> String {
            nodes.iter().map(describe).collect::<Vec<_>>().join(", ")
        }
        // PyTorch prints `eps` only when it is not its default 1e-5.
        fn eps_arg(eps: f64) -> String {
            if eps == 1e-5 { String::new() } else { format!(", eps={eps}") }
        }
        fn describe(n: &Node) -> String {
            let nb = |b: bool| if b { "" } else { ", bias=False" };
            match &n.op {
                Op::Dense(d) => format!("Linear({}, {}{})", d.n_in, d.n_out, nb(d.bias)),
                Op::Conv(c) => format!("Conv2d({}, {}, {}, stride={}, padding={}{})", c.c, c.co, c.k, c.stride, c.padding, nb(c.bias)),
                Op::MaxPool(p) => format!("MaxPool2d({}, stride={})", p.k, p.stride),
                Op::AvgPool(p) => format!("AvgPool2d({}, stride={})", p.k, p.stride),
                Op::Flatten => "Flatten()".into(),
                Op::Act(Act::Relu) => "ReLU()".into(),
                Op::Act(Act::LeakyRelu(s)) => format!("LeakyReLU({s})"),
                Op::Act(Act::Tanh) => "Tanh()".into(),
                Op::Act(Act::Sigmoid) => "Sigmoid()".into(),
                Op::Act(Act::Softplus) => "Softplus()".into(),
                Op::Act(Act::Gelu) => "GELU()".into(),
                Op::Act(Act::Silu) => "SiLU()".into(),
                Op::Norm(nm) if nm.positions == 1 => format!("LayerNorm({}{})", nm.g, eps_arg(nm.eps)),
                Op::Norm(nm) => format!("ChannelLayerNorm({}{})", nm.g, eps_arg(nm.eps)),
                Op::Residual(r) => match &r.shortcut {
                    Some(sc) => format!("Residual(Sequential({}), shortcut={})", list(&r.body), describe(sc)),
                    None => format!("Residual(Sequential({}))", list(&r.body)),
                },
            }
        }
        format!("Sequential({})", list(&self.nodes))
    }

    /// Floats of one sample's per-sample gradient in the kernel engine's form for `k` outputs:
    /// dense layers as factors (`in + 1 + k·out`), the others formed (`k·width`).
    pub(crate) fn gradient_floats(&self, k: usize) -> u64 {
        fn walk(nodes: &[Node], k: u64) -> u64 {
            nodes
                .iter()
                .map(|n| match &n.op {
                    Op::Dense(d) => (d.n_in + 1) as u64 + k * d.n_out as u64,
                    Op::Conv(c) => k * c.width() as u64,
                    Op::Norm(nm) => k * 2 * nm.g as u64,
                    Op::Residual(r) => walk(&r.body, k) + r.shortcut.as_deref().map_or(0, |s| walk(std::slice::from_ref(s), k)),
                    _ => 0,
                })
                .sum()
        }
        walk(&self.nodes, k as u64)
    }

    /// Floats one sample occupies in a forward pass (every layer's output, and convolution
    /// patches), for memory estimates.
    pub(crate) fn floats_per_sample(&self) -> u64 {
        fn walk(nodes: &[Node]) -> u64 {
            nodes
                .iter()
                .map(|n| {
                    n.output.size() as u64
                        + match &n.op {
                            Op::Conv(c) => (c.positions() * c.taps()) as u64,
                            Op::Residual(r) => walk(&r.body) + r.shortcut.as_deref().map_or(0, |s| walk(std::slice::from_ref(s))),
                            _ => 0,
                        }
                })
                .sum()
        }
        self.input.size() as u64 + walk(&self.nodes)
    }

}

/// Resolves `specs` from `input`; `at` names the list in errors, `prefix` the parameters.
pub(crate) fn resolve_list(input: Shape, specs: &[LayerSpec], at: &str, prefix: &str, tensors: &mut usize) -> Result<Vec<Node>, String> {
    let mut shape = input;
    let mut nodes = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let here = format!("{at}[{i}]");
        let pre = format!("{prefix}{i}.");
        let node = resolve_one(shape, spec, &here, pre, tensors)?;
        shape = node.output;
        nodes.push(node);
    }
    Ok(nodes)
}

fn resolve_one(shape: Shape, spec: &LayerSpec, at: &str, prefix: String, tensors: &mut usize) -> Result<Node, String> {
    let first = *tensors;
    let map_needed = |what: &str| resolve_err(at, spec, format!("needs a [C, H, W] map, got {shape}{what}"));
    let (op, output, count) = match spec {
        LayerSpec::Dense { features, bias } => {
            let Shape::Flat(n_in) = shape else {
                return Err(resolve_err(at, spec, format!("needs a flat input, got the map {shape}: add \"flatten\" before it")));
            };
            (Op::Dense(Dense { n_in, n_out: *features, bias: *bias }), Shape::Flat(*features), 1 + usize::from(*bias))
        }
        LayerSpec::Conv2d { channels, kernel, stride, padding, bias } => {
            let Shape::Map(c, h, w) = shape else { return Err(map_needed(" (image data, or a conv layer's output)")) };
            let (hp, wp) = (h + 2 * padding, w + 2 * padding);
            if *kernel > hp || *kernel > wp {
                return Err(resolve_err(at, spec, format!("the kernel {kernel} does not fit the input {shape} padded by {padding}")));
            }
            let (ho, wo) = ((hp - kernel) / stride + 1, (wp - kernel) / stride + 1);
            let conv = Conv { c, h, w, co: *channels, k: *kernel, stride: *stride, padding: *padding, ho, wo, bias: *bias };
            (Op::Conv(conv), Shape::Map(*channels, ho, wo), 1 + usize::from(*bias))
        }
        LayerSpec::MaxPool2d { kernel, stride } | LayerSpec::AvgPool2d { kernel, stride } => {
            let Shape::Map(c, h, w) = shape else { return Err(map_needed("")) };
            if *kernel > h || *kernel > w {
                return Err(resolve_err(at, spec, format!("the window {kernel} is larger than the input {shape}")));
            }
            let pool = Pool { c, h, w, k: *kernel, stride: *stride, ho: (h - kernel) / stride + 1, wo: (w - kernel) / stride + 1 };
            let out = Shape::Map(c, pool.ho, pool.wo);
            let op = if matches!(spec, LayerSpec::MaxPool2d { .. }) { Op::MaxPool(pool) } else { Op::AvgPool(pool) };
            (op, out, 0)
        }
        LayerSpec::Flatten => (Op::Flatten, Shape::Flat(shape.size()), 0),
        LayerSpec::Act(a) => (Op::Act(*a), shape, 0),
        LayerSpec::LayerNorm { eps } => {
            let norm = match shape {
                Shape::Flat(f) => Norm { g: f, positions: 1, eps: *eps },
                Shape::Map(c, h, w) => Norm { g: c, positions: h * w, eps: *eps },
            };
            if norm.g < 2 {
                return Err(resolve_err(at, spec, format!("normalises over 1 value of {shape}: its output would be constant")));
            }
            (Op::Norm(norm), shape, 2)
        }
        LayerSpec::Residual { layers } => {
            *tensors = first;
            let res = Residual::resolve(shape, layers, at, &prefix, tensors)?;
            let out = res.output(shape);
            let count = *tensors - first;
            return Ok(Node { op: Op::Residual(res), input: shape, output: out, first, count, prefix });
        }
    };
    if output.size() == 0 {
        return Err(resolve_err(at, spec, format!("gives an empty output {output}")));
    }
    *tensors += count;
    Ok(Node { op, input: shape, output, first, count, prefix })
}

fn specs_of(nodes: &[Node], out: &mut Vec<ParamSpec>) {
    for n in nodes {
        let p = &n.prefix;
        match &n.op {
            Op::Dense(d) => {
                out.push(ParamSpec { name: format!("{p}weight"), shape: vec![d.n_out, d.n_in] });
                if d.bias {
                    out.push(ParamSpec { name: format!("{p}bias"), shape: vec![d.n_out] });
                }
            }
            Op::Conv(c) => {
                out.push(ParamSpec { name: format!("{p}weight"), shape: vec![c.co, c.c, c.k, c.k] });
                if c.bias {
                    out.push(ParamSpec { name: format!("{p}bias"), shape: vec![c.co] });
                }
            }
            Op::Norm(nm) => {
                out.push(ParamSpec { name: format!("{p}weight"), shape: vec![nm.g] });
                out.push(ParamSpec { name: format!("{p}bias"), shape: vec![nm.g] });
            }
            Op::Residual(r) => {
                specs_of(&r.body, out);
                if let Some(sc) = &r.shortcut {
                    specs_of(std::slice::from_ref(sc.as_ref()), out);
                }
            }
            _ => {}
        }
    }
}

fn uniform(rng: &mut impl Rng, n: usize, fan_in: usize, data: &mut Vec<Vec<f64>>) {
    let bound = 1.0 / (fan_in as f64).sqrt();
    data.push((0..n).map(|_| rng.gen_range(-bound..bound)).collect());
}

fn init_nodes(nodes: &[Node], rng: &mut impl Rng, data: &mut Vec<Vec<f64>>) {
    for n in nodes {
        match &n.op {
            Op::Dense(d) => {
                uniform(rng, d.n_out * d.n_in, d.n_in, data);
                if d.bias {
                    uniform(rng, d.n_out, d.n_in, data);
                }
            }
            Op::Conv(c) => {
                uniform(rng, c.co * c.taps(), c.taps(), data);
                if c.bias {
                    uniform(rng, c.co, c.taps(), data);
                }
            }
            Op::Norm(nm) => {
                data.push(vec![1.0; nm.g]);
                data.push(vec![0.0; nm.g]);
            }
            Op::Residual(r) => {
                init_nodes(&r.body, rng, data);
                if let Some(sc) = &r.shortcut {
                    init_nodes(std::slice::from_ref(sc.as_ref()), rng, data);
                }
            }
            _ => {}
        }
    }
}

fn bias_of<'a>(params: &'a [Vec<f64>], n: &Node, has: bool) -> Option<&'a [f64]> {
    has.then(|| params[n.first + 1].as_slice())
}

/// The forward walk; with `caches`, one [`Cache`] per node is pushed.
pub(crate) fn forward_nodes(nodes: &[Node], params: &[Vec<f64>], mut x: Vec<f64>, mut caches: Option<&mut Vec<Cache>>) -> (Vec<f64>, ()) {
    for n in nodes {
        let (y, cache) = match &n.op {
            Op::Dense(d) => {
                let y = d.forward(&params[n.first], bias_of(params, n, d.bias), &x);
                (y, Cache::Input(x))
            }
            Op::Conv(c) => {
                let u = c.patches(&x);
                let y = c.apply(&u, &params[n.first], bias_of(params, n, c.bias));
                (y, Cache::Patches(u))
            }
            Op::MaxPool(p) => {
                let (y, arg) = p.max_forward(&x);
                (y, Cache::Arg(arg))
            }
            Op::AvgPool(p) => (p.avg_forward(&x), Cache::None),
            Op::Flatten => (x, Cache::None),
            Op::Act(a) => {
                let y = x.iter().map(|&z| a.apply(z)).collect();
                (y, Cache::Input(x))
            }
            Op::Norm(nm) => {
                let (y, c) = nm.forward(&params[n.first], &params[n.first + 1], &x);
                (y, Cache::Norm(c))
            }
            Op::Residual(r) => {
                let (y, inner, sc) = r.forward(params, x, caches.is_some());
                (y, Cache::Residual(inner, Box::new(sc)))
            }
        };
        if let Some(c) = caches.as_mut() {
            c.push(cache);
        }
        x = y;
    }
    (x, ())
}

/// The tangent walk: values and tangents (`None`: zero) along `dir`.
/// `probe` collects `(z, dz/dt)` at the inputs of the piecewise-linear activations and the
/// max-pool windows' margins ([`Stack::kink_inputs`]).
pub(crate) fn tangent_nodes(nodes: &[Node], params: &[Vec<f64>], dir: &[Vec<f64>], mut x: Vec<f64>, mut xd: Option<Vec<f64>>, mut probe: Option<&mut Vec<(f64, f64)>>) -> (Vec<f64>, Option<Vec<f64>>) {
    for n in nodes {
        let (y, yd) = match &n.op {
            Op::Dense(d) => {
                let y = d.forward(&params[n.first], bias_of(params, n, d.bias), &x);
                let yd = d.tangent(&params[n.first], &dir[n.first], bias_of(dir, n, d.bias), &x, xd.as_deref());
                (y, Some(yd))
            }
            Op::Conv(c) => {
                let u = c.patches(&x);
                let y = c.apply(&u, &params[n.first], bias_of(params, n, c.bias));
                let mut yd = c.apply(&u, &dir[n.first], bias_of(dir, n, c.bias));
                if let Some(xd) = xd.as_deref() {
                    let ud = c.patches(xd);
                    let t = c.apply(&ud, &params[n.first], None);
                    yd.iter_mut().zip(t).for_each(|(a, b)| *a += b);
                }
                (y, Some(yd))
            }
            Op::MaxPool(p) => {
                if let (Some(pr), Some(xd)) = (probe.as_deref_mut(), xd.as_deref()) {
                    p.max_margins(&x, xd, pr);
                }
                let (y, arg) = p.max_forward(&x);
                (y, xd.as_deref().map(|xd| p.max_gather(xd, &arg)))
            }
            Op::AvgPool(p) => (p.avg_forward(&x), xd.as_deref().map(|xd| p.avg_forward(xd))),
            Op::Flatten => (x, xd),
            Op::Act(a) => {
                if let (Some(pr), Some(xd)) = (probe.as_deref_mut(), xd.as_deref()) {
                    if a.piecewise_linear() {
                        pr.extend(x.iter().copied().zip(xd.iter().copied()));
                    }
                }
                let yd = xd.map(|xd| x.iter().zip(xd).map(|(&z, v)| a.derivative(z) * v).collect());
                (x.iter().map(|&z| a.apply(z)).collect(), yd)
            }
            Op::Norm(nm) => {
                let (y, c) = nm.forward(&params[n.first], &params[n.first + 1], &x);
                let yd = nm.tangent(&params[n.first], &dir[n.first], &dir[n.first + 1], &c, xd.as_deref());
                (y, Some(yd))
            }
            Op::Residual(r) => r.tangent(params, dir, x, xd, probe.as_deref_mut()),
        };
        x = y;
        xd = yd;
    }
    (x, xd)
}

/// The backward walk from output sensitivities `dy` `[n, K, out]`; pushes each parameter
/// layer's gradient; returns the input sensitivities when `need_dx` (else possibly empty).
pub(crate) fn backward_nodes(nodes: &[Node], params: &[Vec<f64>], caches: &[Cache], mut dy: Vec<f64>, k: usize, need_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
    // Without `need_dx`, nothing before the first parameter layer needs a sensitivity.
    let first_param = nodes.iter().position(|n| n.count > 0).unwrap_or(nodes.len());
    for (j, (n, cache)) in nodes.iter().zip(caches).enumerate().rev() {
        if !need_dx && j < first_param {
            break;
        }
        let want_dx = need_dx || j > first_param;
        dy = match (&n.op, cache) {
            (Op::Dense(d), Cache::Input(a)) => {
                let dx = if want_dx { d.input_grad(&params[n.first], &dy) } else { Vec::new() };
                grads.push((n.first, Grad::Factor { acts: a.clone(), deltas: dy, n_in: d.n_in, n_out: d.n_out, bias: d.bias }));
                dx
            }
            (Op::Conv(c), Cache::Patches(u)) => {
                grads.push((n.first, Grad::Formed { g: c.param_grads(u, &dy, k), width: c.width() }));
                if want_dx {
                    c.input_grad(&params[n.first], &dy)
                } else {
                    Vec::new()
                }
            }
            (Op::MaxPool(p), Cache::Arg(arg)) => p.max_backward(&dy, arg, k),
            (Op::AvgPool(p), _) => p.avg_backward(&dy),
            (Op::Flatten, _) => dy,
            (Op::Act(a), Cache::Input(z)) => {
                // The derivative once per sample, applied to its K rows.
                let size = n.input.size();
                let mut der = vec![0.0; size];
                for (s, rows) in dy.chunks_mut(k * size).enumerate() {
                    der.iter_mut().zip(&z[s * size..(s + 1) * size]).for_each(|(d, &zv)| *d = a.derivative(zv));
                    for row in rows.chunks_exact_mut(size) {
                        row.iter_mut().zip(&der).for_each(|(v, d)| *v *= d);
                    }
                }
                dy
            }
            (Op::Norm(nm), Cache::Norm(c)) => {
                let (g, dx) = nm.backward(&params[n.first], c, &dy, k, want_dx);
                grads.push((n.first, Grad::Formed { g, width: 2 * nm.g }));
                dx.unwrap_or_default()
            }
            (Op::Residual(r), Cache::Residual(inner, sc)) => r.backward(params, inner, sc, dy, k, want_dx, grads),
            _ => unreachable!("a cache of another layer kind"),
        };
    }
    dy
}

/// The full per-sample Jacobian `[n, K, W]` (W all parameters, storage order) assembled from
/// [`Stack::backward`]'s gradients: the obvious form every structured contraction must equal.
#[cfg(test)]
pub(crate) fn dense_jacobian(specs: &[ParamSpec], grads: &[(usize, Grad)], n: usize, k: usize) -> Vec<f64> {
    let offsets: Vec<usize> = specs.iter().scan(0, |o, s| {
        let here = *o;
        *o += s.numel();
        Some(here)
    }).collect();
    let w: usize = specs.iter().map(ParamSpec::numel).sum();
    let mut j = vec![0.0; n * k * w];
    for (first, g) in grads {
        let off = offsets[*first];
        match g {
            Grad::Factor { acts, deltas, n_in, n_out, bias } => {
                for s in 0..n {
                    for c in 0..k {
                        let row = &mut j[(s * k + c) * w + off..];
                        let d = &deltas[(s * k + c) * n_out..(s * k + c + 1) * n_out];
                        let a = &acts[s * n_in..(s + 1) * n_in];
                        for o in 0..*n_out {
                            for i in 0..*n_in {
                                row[o * n_in + i] = d[o] * a[i];
                            }
                            if *bias {
                                row[n_out * n_in + o] = d[o];
                            }
                        }
                    }
                }
            }
            Grad::Formed { g, width } => {
                for r in 0..n * k {
                    j[r * w + off..r * w + off + width].copy_from_slice(&g[r * width..(r + 1) * width]);
                }
            }
        }
    }
    j
}

#[cfg(test)]
mod tests;
