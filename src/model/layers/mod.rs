//! Networks as a stack of layers: the layer kinds, how their shapes chain, and the walks over a
//! stack (forward, tangent along a parameter direction, per-sample backward, the kink sweep).
//!
//! Every layer kind implements the layer contract (`contract::Layer` for what it computes,
//! `contract::KindSpec` for how it is written and imported) in its own file: `dense`,
//! `conv2d`, `max_pool`, `avg_pool`, `flatten`, `activation`, `norm`, the sequence layers
//! `embedding`, `attention` (`self_attention`), `last_token` and `mean_tokens`, and the composite
//! `residual`. The kinds are listed once, in `layer_kinds!` below, which generates [`LayerSpec`]
//! (a layer as configured) and `AnyLayer` (as resolved) and their dispatch; nothing else
//! matches on a kind. The walks run each row of a batch at its own point `w_s + t_r·Δw` of a
//! step (`At`); the kernel engine consumes the per-sample gradients' forms (`Grad`: factored
//! `δ ⊗ a` for dense layers, formed for the others); `autodiff` is the same stack on dfdx
//! (training and the reference Jacobians).
//!
//! Data layout per sample is PyTorch's: `[C, H, W]` maps row-major, flat vectors `[F]`, token
//! ids `[T]` (integers stored as `f64`), sequences `[T, d]` row-major.
//! Parameter names are those of an `nn.Sequential` of the same layers (`3.weight`); a residual
//! block `i` holds `i.body.j.*` and, when it projects, `i.shortcut.*`.

pub(crate) mod activation;
pub(crate) mod attention;
pub(crate) mod autodiff;
pub(crate) mod avg_pool;
pub(crate) mod contract;
pub(crate) mod conv2d;
pub(crate) mod dense;
pub(crate) mod embedding;
pub(crate) mod flatten;
pub(crate) mod last_token;
pub(crate) mod max_pool;
pub(crate) mod mean_tokens;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod recorded;
pub(crate) mod residual;
pub mod spec;

pub use activation::Act;
pub use attention::{AttentionLayout, SelfAttentionSpec};
pub use avg_pool::AvgPool2dSpec;
pub use conv2d::Conv2dSpec;
pub use dense::DenseSpec;
pub use embedding::EmbeddingSpec;
pub use flatten::FlattenSpec;
pub use last_token::LastTokenSpec;
pub use max_pool::MaxPool2dSpec;
pub use mean_tokens::MeanTokensSpec;
pub use norm::LayerNormSpec;
pub use residual::ResidualSpec;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::ParamSpec;
use activation::Activation;
use attention::{Attention, AttentionCache};
use embedding::Embedding;
use last_token::LastToken;
use avg_pool::AvgPool;
pub(crate) use contract::{At, KindSpec, Layer};
use contract::{Poly, Probe, Sweep};
use conv2d::Conv;
use dense::Dense;
use flatten::Flatten;
use max_pool::MaxPool;
use mean_tokens::MeanTokens;
use norm::{Norm, NormCache};
use residual::Residual;

/// The shape of one sample's activations between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// A feature vector `[F]`.
    Flat(usize),
    /// A map `[C, H, W]`.
    Map(usize, usize, usize),
    /// A sequence of `T` token ids, each an integer in `0..vocab` stored as an `f64`: `(T, vocab)`.
    Tokens(usize, usize),
    /// A sequence of `T` positions of `d` features each, `[T, d]` row-major: `(T, d)`.
    Seq(usize, usize),
}

impl Shape {
    /// Numbers per sample.
    pub fn size(self) -> usize {
        match self {
            Shape::Flat(f) => f,
            Shape::Map(c, h, w) => c * h * w,
            Shape::Tokens(t, _) => t,
            Shape::Seq(t, d) => t * d,
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shape::Flat(n) => write!(f, "[{n}]"),
            Shape::Map(c, h, w) => write!(f, "[{c}, {h}, {w}]"),
            Shape::Tokens(t, v) => write!(f, "[{t}] tokens of a vocabulary of {v}"),
            Shape::Seq(t, d) => write!(f, "[{t}, {d}] (a sequence)"),
        }
    }
}

/// Why a layer that needs a flat vector cannot take `input`, and what to put before it (for
/// messages: `the map [4, 26, 26]: add "flatten" before it`).
pub(crate) fn not_flat(input: Shape) -> String {
    match input {
        Shape::Flat(_) => format!("{input}"),
        Shape::Map(..) => format!("the map {input}: add \"flatten\" before it"),
        Shape::Tokens(..) => format!("{input}: token ids are not features; start with an \"embedding\""),
        Shape::Seq(..) => format!("the sequence {input}: read it out with \"last_token\" (or \"flatten\") before it"),
    }
}

/// Generates [`LayerSpec`] and [`AnyLayer`], one variant per layer kind (its configuration and
/// its resolved layer), and their impls that hand every method to the kind: the one place that
/// lists the kinds.
macro_rules! layer_kinds {
    ($($kind:ident($ty:ty, $spec:ty)),* $(,)?) => {
        /// One layer as configured (sizes of its input are resolved later, by chaining): one of
        /// the kinds' specs (each in its kind's file, with its grammar and PyTorch import).
        #[derive(Clone, Debug, PartialEq)]
        pub enum LayerSpec {
            $(
                #[allow(missing_docs)]
                $kind($spec)
            ),*
        }

        impl LayerSpec {
            /// Every name a layer list accepts, in the kinds' order.
            pub(crate) fn names() -> Vec<&'static str> {
                let mut v = Vec::new();
                $(v.extend_from_slice(<$spec as KindSpec>::NAMES);)*
                v
            }

            /// Every PyTorch class a recording may name.
            pub(crate) fn torch_names() -> Vec<&'static str> {
                let mut v = Vec::new();
                $(v.extend_from_slice(<$spec as KindSpec>::TORCH);)*
                v
            }

            /// The kind written `name`, parsed (`None`: no kind has that name).
            pub(crate) fn parse_kind(name: &str, arg: Option<&serde_json::Value>, at: &str) -> Option<Result<LayerSpec, String>> {
                $(if <$spec as KindSpec>::NAMES.contains(&name) {
                    return Some(<$spec as KindSpec>::parse(name, arg, at).map(LayerSpec::$kind));
                })*
                None
            }

            /// The kind a recorded PyTorch class is, read (`None`: no kind has that class).
            pub(crate) fn from_torch_kind(class: &str, m: &serde_json::Value, at: &str) -> Option<Result<LayerSpec, String>> {
                $(if <$spec as KindSpec>::TORCH.contains(&class) {
                    return Some(<$spec as KindSpec>::from_torch(class, m, at).map(LayerSpec::$kind));
                })*
                None
            }

            /// The canonical written form (what the run manifest records; [`LayerSpec::parse`] reads it).
            pub fn to_value(&self) -> serde_json::Value {
                match self { $(LayerSpec::$kind(s) => KindSpec::to_value(s)),* }
            }

            /// A short label (`conv2d(6, k5, s1, p2)`, `relu`, `residual[…]`) for tables and messages.
            pub fn label(&self) -> String {
                match self { $(LayerSpec::$kind(s) => KindSpec::label(s)),* }
            }

            fn resolve_kind(&self, input: Shape, at: &str, prefix: &str, tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
                match self { $(LayerSpec::$kind(s) => KindSpec::resolve(s, input, at, prefix, tensors)),* }
            }
        }

        /// A resolved layer: one of the kinds, each implementing [`Layer`] in its own file.
        #[derive(Clone, Debug, PartialEq)]
        pub(crate) enum AnyLayer {
            $($kind($ty)),*
        }

        impl Layer for AnyLayer {
            fn torch(&self) -> String { match self { $(AnyLayer::$kind(l) => Layer::torch(l)),* } }
            fn tensors(&self) -> Vec<(&'static str, Vec<usize>)> { match self { $(AnyLayer::$kind(l) => Layer::tensors(l)),* } }
            fn param_specs(&self, prefix: &str, out: &mut Vec<ParamSpec>) { match self { $(AnyLayer::$kind(l) => Layer::param_specs(l, prefix, out)),* } }
            fn init(&self, rng: &mut dyn rand::RngCore, data: &mut Vec<Vec<f64>>) { match self { $(AnyLayer::$kind(l) => Layer::init(l, rng, data)),* } }
            fn along(&self) -> contract::Along { match self { $(AnyLayer::$kind(l) => Layer::along(l)),* } }
            fn reach(&self, smooth_seen: &mut bool) -> bool { match self { $(AnyLayer::$kind(l) => Layer::reach(l, smooth_seen)),* } }
            fn linear_in_params(&self) -> bool { match self { $(AnyLayer::$kind(l) => Layer::linear_in_params(l)),* } }
            fn forward(&self, first: usize, at: &At, x: Vec<f64>, keep: bool) -> (Vec<f64>, Cache) { match self { $(AnyLayer::$kind(l) => Layer::forward(l, first, at, x, keep)),* } }
            fn tangent(&self, first: usize, at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) { match self { $(AnyLayer::$kind(l) => Layer::tangent(l, first, at, x, xd, probe)),* } }
            fn backward(&self, first: usize, at: &At, cache: &Cache, dy: Vec<f64>, k: usize, want_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> { match self { $(AnyLayer::$kind(l) => Layer::backward(l, first, at, cache, dy, k, want_dx, grads)),* } }
            fn grads_behind_max_pool(&self, first: usize, cache: &Cache, dy: &[f64], arg: &[u32], k: usize, grads: &mut Vec<(usize, Grad)>) -> bool { match self { $(AnyLayer::$kind(l) => Layer::grads_behind_max_pool(l, first, cache, dy, arg, k, grads)),* } }
            fn max_pool_winners<'a>(&self, cache: &'a Cache) -> Option<&'a [u32]> { match self { $(AnyLayer::$kind(l) => Layer::max_pool_winners(l, cache)),* } }
            fn sweep(&self, first: usize, w: &[Vec<f64>], dw: &[Vec<f64>], p: Poly, sw: &mut Sweep) -> Option<Poly> { match self { $(AnyLayer::$kind(l) => Layer::sweep(l, first, w, dw, p, sw)),* } }
            fn autodiff<D: dfdx::prelude::Device<f64>, T: dfdx::prelude::Tape<f64, D> + dfdx::prelude::Merge<T> + dfdx::prelude::Merge<dfdx::prelude::NoneTape>>(&self, first: usize, p: &[crate::model::tensors::ParamTensor<D>], x: autodiff::Activations<D, T>) -> autodiff::Activations<D, T> { match self { $(AnyLayer::$kind(l) => Layer::autodiff(l, first, p, x)),* } }
            fn gradient_floats(&self, k: u64) -> u64 { match self { $(AnyLayer::$kind(l) => Layer::gradient_floats(l, k)),* } }
            fn scratch_floats(&self) -> u64 { match self { $(AnyLayer::$kind(l) => Layer::scratch_floats(l)),* } }
            fn torch_input(&self) -> Option<(&'static str, usize)> { match self { $(AnyLayer::$kind(l) => Layer::torch_input(l)),* } }
            fn is_recorded_projection(&self, m: &serde_json::Value) -> bool { match self { $(AnyLayer::$kind(l) => Layer::is_recorded_projection(l, m)),* } }
            fn branches(&self) -> Option<(&[Node], Option<&Node>)> { match self { $(AnyLayer::$kind(l) => Layer::branches(l)),* } }
            fn is_dense_with_bias(&self) -> bool { match self { $(AnyLayer::$kind(l) => Layer::is_dense_with_bias(l)),* } }
            fn device(&self) -> Option<crate::device::program::Op> { match self { $(AnyLayer::$kind(l) => Layer::device(l)),* } }
        }
    };
}

layer_kinds! {
    Dense(Dense, DenseSpec),
    Conv2d(Conv, Conv2dSpec),
    MaxPool2d(MaxPool, MaxPool2dSpec),
    AvgPool2d(AvgPool, AvgPool2dSpec),
    Flatten(Flatten, FlattenSpec),
    Act(Activation, Act),
    LayerNorm(Norm, LayerNormSpec),
    Residual(Residual, ResidualSpec),
    Embedding(Embedding, EmbeddingSpec),
    SelfAttention(Attention, SelfAttentionSpec),
    LastToken(LastToken, LastTokenSpec),
    MeanTokens(MeanTokens, MeanTokensSpec),
}

/// A resolved layer with its shapes and its parameter tensors `first..first + count`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    pub layer: AnyLayer,
    pub input: Shape,
    pub output: Shape,
    pub first: usize,
    pub count: usize,
    /// The parameter name prefix (`3.`, `2.body.0.`).
    pub prefix: String,
    /// A max-pool that runs ahead of the activation written just before it
    /// ([`pool_ahead_of_activations`]); printed in the written order.
    pub ahead: bool,
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
    Patches(conv2d::SharedPatches),
    /// Max pooling's winners.
    Arg(Vec<u32>),
    Norm(NormCache),
    Residual(Vec<Cache>, Box<Cache>),
    /// Self-attention's input and heads.
    Attention(Box<AttentionCache>),
}

impl Stack {
    /// Chains `specs` from `input`, checking every shape; the last layer must give `[outputs]`.
    pub fn resolve(input: Shape, specs: &[LayerSpec], outputs: usize) -> Result<Stack, String> {
        let mut tensors = 0;
        let nodes = resolve_list(input, specs, "model.layers", "", &mut tensors)?;
        if matches!(input, Shape::Tokens(..)) && !matches!(nodes[0].layer, AnyLayer::Embedding(_)) {
            return Err(format!("model.layers[0] {}: the data's rows are token ids {input}; the first layer must be an \"embedding\"", specs[0].label()));
        }
        if tensors == 0 {
            return Err("model.layers: the stack has no parameters (nothing to train, no kernel to take); add a dense or conv2d layer".into());
        }
        let out = nodes.last().map_or(input, |n| n.output);
        if out != Shape::Flat(outputs) {
            return Err(format!(
                "model.layers: the last layer gives {out} per sample; the data needs [{outputs}] (one output per class or target{})",
                match out {
                    Shape::Map(..) => "; add \"flatten\" and a dense layer",
                    Shape::Seq(..) => "; add \"last_token\" and a dense layer",
                    _ => "",
                }
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
        for n in &self.nodes {
            n.layer.param_specs(&n.prefix, &mut out);
        }
        out
    }

    /// Whether every kink along a step can be found by the polynomial sweep: no ReLU, leaky ReLU
    /// or max-pool behind a smooth non-polynomial layer (tanh, sigmoid, softplus, GELU, SiLU,
    /// layer norm), where the sweep stops.
    pub fn kinks_reachable(&self) -> bool {
        let mut smooth_seen = false;
        self.nodes.iter().all(|n| n.layer.reach(&mut smooth_seen))
    }

    /// Seeded initialisation in storage order, PyTorch's defaults: weights and biases uniform in
    /// `[−1/√fan_in, 1/√fan_in]` (fan_in = `in` or `C·k·k`), layer norm γ = 1, β = 0; with
    /// `zero_last` the last layer's parameters are 0 (a constant initial output).
    pub(crate) fn init(&self, rng: &mut impl Rng, zero_last: bool) -> Vec<Vec<f64>> {
        let mut data = Vec::with_capacity(self.tensors);
        for n in &self.nodes {
            n.layer.init(rng, &mut data);
        }
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
        forward_nodes(&self.nodes, &At::fixed(params), x.to_vec(), None)
    }

    #[cfg(test)]
    /// Forward pass keeping what [`Stack::backward`] needs.
    pub(crate) fn forward_cached(&self, params: &[Vec<f64>], x: &[f64]) -> (Vec<f64>, Vec<Cache>) {
        self.forward_cached_at(&At::fixed(params), x.to_vec())
    }

    /// Forward pass with each sample at its own point of a step ([`At`]), keeping what
    /// [`Stack::backward_at`] needs.
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `[n, K]`.
    pub(crate) fn forward_cached_at(&self, at: &At, x: Vec<f64>) -> (Vec<f64>, Vec<Cache>) {
        let mut caches = Vec::with_capacity(self.nodes.len());
        let y = forward_nodes(&self.nodes, at, x, Some(&mut caches));
        (y, caches)
    }

    #[cfg(test)]
    /// Output and its tangent along the parameter direction `dir` (same layout as `params`):
    /// `(g_w(x), d/dt g_{w + t·dir}(x) at t = 0)`.
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `[n, K]` twice.
    pub(crate) fn tangent(&self, params: &[Vec<f64>], dir: &[Vec<f64>], x: &[f64]) -> (Vec<f64>, Vec<f64>) {
        self.tangent_at(&At { w: params, dw: Some(dir), t: None }, x.to_vec())
    }

    /// Output and its t-derivative along `at.dw`, each sample at its own t.
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `[n, K]` twice.
    pub(crate) fn tangent_at(&self, at: &At, x: Vec<f64>) -> (Vec<f64>, Vec<f64>) {
        let (y, yd) = tangent_nodes(&self.nodes, at, x, None, None);
        let yd = yd.unwrap_or_else(|| vec![0.0; y.len()]);
        (y, yd)
    }

    /// The inputs of every piecewise-linear activation (ReLU, leaky ReLU) and every max-pool
    /// entry's margin over the rest of its window ([`pool::Pool::max_margins`]) with their
    /// t-derivatives `(z, dz/dt)` along `at.dw`, in walk order: each changes sign at a kink (what
    /// the adaptive rule's kink location reads behind smooth layers).
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `n ×` (the activations' sizes) pairs.
    pub(crate) fn kink_inputs(&self, at: &At, x: &[f64]) -> Vec<(f64, f64)> {
        let mut probe = Vec::new();
        tangent_nodes(&self.nodes, at, x.to_vec(), None, Some(&mut probe));
        probe
    }

    #[cfg(test)]
    /// Per-sample gradients of the K outputs: `dy` `[n, K, K_out]` are the output
    /// sensitivities of each class (for `f = out(α g)` the rows of `∂f^k/∂g`); returns each
    /// parameter layer's [`Grad`] with its first tensor index, in storage order.
    pub(crate) fn backward(&self, params: &[Vec<f64>], caches: &[Cache], dy: Vec<f64>, k: usize) -> Vec<(usize, Grad)> {
        self.backward_at(&At::fixed(params), caches, dy, k)
    }

    /// [`Stack::backward`] at the points of [`Stack::forward_cached_at`].
    pub(crate) fn backward_at(&self, at: &At, caches: &[Cache], dy: Vec<f64>, k: usize) -> Vec<(usize, Grad)> {
        let mut grads = Vec::new();
        backward_nodes(&self.nodes, at, caches, dy, k, false, &mut grads);
        grads.sort_by_key(|g| g.0);
        grads
    }

    /// The stack's ops on a backend (`crate::device`), each with its first tensor; the reason in
    /// one line where a layer has none yet.
    pub(crate) fn device_ops(&self) -> Result<Vec<(usize, crate::device::program::Op)>, String> {
        self.nodes
            .iter()
            .map(|n| n.layer.device().map(|op| (n.first, op)).ok_or_else(|| format!("{} (parameters {}*) does not run on a device yet", n.layer.torch(), n.prefix)))
            .collect()
    }

    /// The last layer's parameter name prefix (`11.`).
    pub(crate) fn last_prefix(&self) -> String {
        self.nodes.last().map_or_else(String::new, |n| n.prefix.clone())
    }

    /// Whether the last layer is dense with a bias (last-layer Laplace's requirement).
    pub(crate) fn ends_in_dense_with_bias(&self) -> bool {
        self.nodes.last().is_some_and(|n| n.layer.is_dense_with_bias())
    }

    /// Whether the last layer's output is linear in its own parameters (a scale α folds into
    /// them: dense, conv2d, layer norm).
    pub(crate) fn ends_linear_in_params(&self) -> bool {
        self.nodes.last().is_some_and(|n| n.layer.linear_in_params())
    }

    /// The last layer's inputs (every layer but the last applied).
    ///
    /// # Shapes
    /// `x` `[n, input]`; returns `[n, in_last]`.
    pub(crate) fn forward_penultimate(&self, params: &[Vec<f64>], x: &[f64]) -> Vec<f64> {
        let k = self.nodes.len().saturating_sub(1);
        forward_nodes(&self.nodes[..k], &At::fixed(params), x.to_vec(), None)
    }

    /// The module as PyTorch prints it, e.g. `Sequential(Conv2d(1, 6, 5, stride=1, padding=2), ReLU(), …)`.
    pub(crate) fn torch_description(&self) -> String {
        format!("Sequential({})", describe(&self.nodes))
    }

    /// Floats of one sample's per-sample gradient in the kernel engine's form for `k` outputs:
    /// dense layers as factors (`in + 1 + k·out`), the others formed (`k·width`).
    pub(crate) fn gradient_floats(&self, k: usize) -> u64 {
        self.nodes.iter().map(|n| n.layer.gradient_floats(k as u64)).sum()
    }

    /// Floats one sample occupies in a forward pass (every layer's output, and convolution
    /// patches), for memory estimates.
    pub(crate) fn floats_per_sample(&self) -> u64 {
        self.input.size() as u64 + self.nodes.iter().map(|n| n.output.size() as u64 + n.layer.scratch_floats()).sum::<u64>()
    }
}

/// Resolves `specs` from `input`; `at` names the list in errors, `prefix` the parameters.
pub(crate) fn resolve_list(input: Shape, specs: &[LayerSpec], at: &str, prefix: &str, tensors: &mut usize) -> Result<Vec<Node>, String> {
    let mut nodes = resolve_as_written(input, specs, at, prefix, tensors)?;
    pool_ahead_of_activations(&mut nodes);
    Ok(nodes)
}

/// [`resolve_list`] in the written order (the reference the reordered stack is tested against).
pub(crate) fn resolve_as_written(input: Shape, specs: &[LayerSpec], at: &str, prefix: &str, tensors: &mut usize) -> Result<Vec<Node>, String> {
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

/// Runs each max-pool ahead of the nondecreasing activation written just before it (ReLU, leaky
/// ReLU with slope ≥ 0, tanh, sigmoid, softplus; not GELU or SiLU, which dip): such an
/// activation commutes with the max (`max σ(z_i) = σ(max z_i)`: the same numbers bit for bit
/// for the piecewise-linear ones, and wherever the floating-point σ is nondecreasing for the
/// smooth ones — within an ulp anywhere), and after the swap the activation works on a quarter
/// of the numbers and the kink sweep finds the window's switches on the pool's input, a
/// polynomial in t where the layers before are, instead of stopping at the smooth activation
/// and leaving them to the adaptive rule's bisection. It no longer splits a step where an
/// entry that does not win its window crosses zero (a kink of the ReLU's input that the pool
/// discards), nor, behind a ReLU, where two negative entries cross
/// ([`max_pool::MaxPool::relu_after`]).
fn pool_ahead_of_activations(nodes: &mut [Node]) {
    let mut i = 0;
    while i + 1 < nodes.len() {
        let monotone = matches!(&nodes[i].layer, AnyLayer::Act(a) if a.act.nondecreasing());
        if monotone && matches!(nodes[i + 1].layer, AnyLayer::MaxPool2d(_)) {
            let AnyLayer::Act(a) = &nodes[i].layer else { unreachable!("checked above") };
            let pooled = nodes[i + 1].output;
            let act = Node { layer: AnyLayer::Act(activation::Activation { act: a.act, size: pooled.size() }), input: pooled, output: pooled, ..nodes[i].clone() };
            let mut pool = Node { input: nodes[i].input, ahead: true, ..nodes[i + 1].clone() };
            if let AnyLayer::MaxPool2d(m) = &mut pool.layer {
                m.relu_after = a.act == Act::Relu;
            }
            nodes[i] = pool;
            nodes[i + 1] = act;
            i += 2;
        } else {
            i += 1;
        }
    }
}

/// The modules as PyTorch prints them, in the written order (a max-pool run ahead of its
/// activation printed after it).
pub(crate) fn describe(nodes: &[Node]) -> String {
    let mut out: Vec<String> = nodes.iter().map(|n| n.layer.torch()).collect();
    for (i, n) in nodes.iter().enumerate() {
        if n.ahead {
            out.swap(i, i + 1);
        }
    }
    out.join(", ")
}

fn resolve_one(shape: Shape, spec: &LayerSpec, at: &str, prefix: String, tensors: &mut usize) -> Result<Node, String> {
    let first = *tensors;
    let (layer, output) = spec.resolve_kind(shape, at, &prefix, tensors)?;
    if *tensors == first {
        // A plain layer: its own tensors (a composite counted its children's).
        *tensors += layer.tensors().len();
    }
    if output.size() == 0 {
        return Err(format!("{at} {}: gives an empty output {output}", spec.label()));
    }
    Ok(Node { layer, input: shape, output, first, count: *tensors - first, prefix, ahead: false })
}

/// PyTorch's default uniform initialisation of an `n`-number tensor with fan-in `fan_in`.
pub(crate) fn uniform(rng: &mut dyn rand::RngCore, n: usize, fan_in: usize, data: &mut Vec<Vec<f64>>) {
    let bound = 1.0 / (fan_in as f64).sqrt();
    data.push((0..n).map(|_| rng.gen_range(-bound..bound)).collect());
}

/// The forward walk at `at`; with `caches`, one [`Cache`] per node is pushed.
pub(crate) fn forward_nodes(nodes: &[Node], at: &At, mut x: Vec<f64>, mut caches: Option<&mut Vec<Cache>>) -> Vec<f64> {
    for n in nodes {
        let (y, cache) = n.layer.forward(n.first, at, x, caches.is_some());
        if let Some(c) = caches.as_mut() {
            c.push(cache);
        }
        x = y;
    }
    x
}

/// The tangent walk: values and tangents (`None`: zero) along `at.dw`.
/// `probe` collects `(z, dz/dt)` at the inputs of the piecewise-linear activations and the
/// max-pool windows' margins ([`Stack::kink_inputs`]).
pub(crate) fn tangent_nodes(nodes: &[Node], at: &At, mut x: Vec<f64>, mut xd: Option<Vec<f64>>, mut probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
    for n in nodes {
        (x, xd) = n.layer.tangent(n.first, at, x, xd, probe.as_deref_mut());
    }
    (x, xd)
}

/// The backward walk from output sensitivities `dy` `[n, K, out]`; pushes each parameter
/// layer's gradient; returns the input sensitivities when `need_dx` (else possibly empty).
pub(crate) fn backward_nodes(nodes: &[Node], at: &At, caches: &[Cache], mut dy: Vec<f64>, k: usize, need_dx: bool, grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
    // Without `need_dx`, nothing before the first parameter layer needs a sensitivity.
    let first_param = nodes.iter().position(|n| n.count > 0).unwrap_or(nodes.len());
    for (j, (n, cache)) in nodes.iter().zip(caches).enumerate().rev() {
        if !need_dx && j < first_param {
            break;
        }
        // A max-pool right after the first parameter layer: that layer's gradients straight
        // from the pool's sensitivities and winners where it offers them (a convolution reads
        // the winners' patches only; on a max-pooled CNN's node rows this was the pool's
        // full-size scatter, its zeroing and a GEMM over every position).
        if !need_dx && j == first_param + 1 {
            if let Some(arg) = n.layer.max_pool_winners(cache) {
                let p = &nodes[first_param];
                if p.layer.grads_behind_max_pool(p.first, &caches[first_param], &dy, arg, k, grads) {
                    return Vec::new();
                }
            }
        }
        let want_dx = need_dx || j > first_param;
        dy = n.layer.backward(n.first, at, cache, dy, k, want_dx, grads);
    }
    dy
}

/// The kink sweep's polynomial walk through `nodes` along `w + tΔw`; `None` once a smooth
/// non-polynomial layer is reached.
pub(crate) fn sweep_nodes(nodes: &[Node], w: &[Vec<f64>], dw: &[Vec<f64>], mut p: Poly, sw: &mut Sweep) -> Option<Poly> {
    for n in nodes {
        p = n.layer.sweep(n.first, w, dw, p, sw)?;
    }
    Some(p)
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
