//! Networks: architectures, flat named parameters, and forward passes.
//!
//! Three kinds, all in `f64`:
//! - **layers**: any stack of dense, conv2d, max/avg pooling, flatten, activations (ReLU,
//!   leaky ReLU, tanh, sigmoid, softplus, GELU, SiLU), layer norm and residual blocks
//!   ([`layers`]; parameters named as an `nn.Sequential` of the same layers: `3.weight`);
//! - **MLP** of any depth and width with ReLU or tanh hidden activations;
//! - a **small CNN** for images: conv → activation → k×k max-pool → dense.
//!
//! Every network maps an input row `x` to `f(x) = out(α · (g_w(x) − [zero_output] g_{w_0}(x)))`
//! where `g_w` is the raw network, `out` is log-softmax (classification, as in the EPK paper where
//! `f` includes the log-softmax) or the identity (regression), `α` the output scale and
//! `zero_output` subtracts the frozen initial network (the NTK notebook's `ZeroOutput`).
//!
//! Parameters are a list of named tensors ([`Params`]); dense weights are stored `[out, in]`.
//! Names: MLP `layers.{l}.weight` `[n_{l+1}, n_l]`, `layers.{l}.bias` `[n_{l+1}]`;
//! CNN `conv.weight` `[Co, C, k, k]`, `conv.bias` `[Co]`, `dense.weight` `[K, Co·Hp·Wp]`,
//! `dense.bias` `[K]`.
//!
//! The autodiff forward (used for training and the generic gradient path) is in [`net`]; the
//! PyTorch names of the parameters (export, `init` from a `state_dict`) are in [`torch`];
//! [`Architecture::forward`] here is an independent plain-Rust forward pass.

mod config;
pub(crate) mod conv;
pub mod layers;
pub mod net;
pub(crate) mod param_spec;
mod tensors;
pub mod torch;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use config::ModelConfig;
pub use param_spec::{param_layers, ParamLayer, ParamSpec};

/// Hidden-layer nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    /// max(0, z)
    Relu,
    /// tanh(z)
    Tanh,
}

impl Activation {
    /// σ(z).
    #[inline]
    pub fn apply(self, z: f64) -> f64 {
        match self {
            Activation::Relu => z.max(0.0),
            Activation::Tanh => z.tanh(),
        }
    }
    /// σ'(z) (ReLU: 1 for z > 0, else 0).
    #[inline]
    pub(crate) fn derivative(self, z: f64) -> f64 {
        match self {
            Activation::Relu => {
                if z > 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Activation::Tanh => {
                let t = z.tanh();
                1.0 - t * t
            }
        }
    }
}

/// What is applied to the (scaled) network output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputKind {
    /// log-softmax over the K outputs (classification; the EPK paper's f).
    LogSoftmax,
    /// No output map (regression).
    Identity,
}

/// Network body, with all sizes resolved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Body {
    /// Layer widths `[d, h_1, …, K]`.
    Mlp {
        /// Widths including input and output.
        widths: Vec<usize>,
    },
    /// A stack of layers on inputs of shape `input`.
    Layers {
        /// One input's shape (`[d]`, or `[C, H, W]` for images).
        input: layers::Shape,
        /// The layers, as configured.
        layers: Vec<layers::LayerSpec>,
        /// Number of outputs K.
        outputs: usize,
    },
    /// Image CNN on `[C, H, W]` inputs.
    Cnn {
        /// Input image shape `[C, H, W]`.
        image: [usize; 3],
        /// Output channels.
        channels: usize,
        /// Kernel size.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Padding.
        padding: usize,
        /// Pool window.
        pool: usize,
        /// Number of outputs K.
        outputs: usize,
    },
}

/// A fully resolved network architecture (what the trajectory manifest records).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Architecture {
    /// Layer structure.
    pub body: Body,
    /// Hidden activation.
    pub activation: Activation,
    /// Whether layers have biases.
    pub bias: bool,
    /// Final layer initialised to zero.
    pub zero_last: bool,
    /// Output scale α.
    pub alpha: f64,
    /// Subtract the initial network.
    pub zero_output: bool,
    /// Output map.
    pub output: OutputKind,
}

/// All parameters of a network, as named row-major tensors in a fixed order.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// Names and shapes, in order.
    pub specs: Vec<ParamSpec>,
    /// Values, `data[j].len() == specs[j].numel()`.
    pub data: Vec<Vec<f64>>,
}

impl Params {
    /// Zero parameters with the given specs.
    pub fn zeros(specs: Vec<ParamSpec>) -> Self {
        let data = specs.iter().map(|s| vec![0.0; s.numel()]).collect();
        Params { specs, data }
    }
    /// Total number of scalar parameters W.
    pub fn numel(&self) -> usize {
        self.specs.iter().map(ParamSpec::numel).sum()
    }
    /// The flat view: all tensors concatenated in order.
    ///
    /// # Shapes
    /// returns `[W]`
    pub fn flat(&self) -> Vec<f64> {
        let mut v = Vec::with_capacity(self.numel());
        for d in &self.data {
            v.extend_from_slice(d);
        }
        v
    }
    /// Rebuilds from a flat vector with these specs.
    ///
    /// # Shapes
    /// `flat` is `[W]`.
    pub fn from_flat(specs: Vec<ParamSpec>, flat: &[f64]) -> Result<Self> {
        let w: usize = specs.iter().map(ParamSpec::numel).sum();
        if flat.len() != w {
            return Err(Error::ShapeMismatch {
                what: "flat parameter vector".into(),
                expected: vec![w],
                got: vec![flat.len()],
            });
        }
        let mut data = Vec::with_capacity(specs.len());
        let mut off = 0;
        for s in &specs {
            data.push(flat[off..off + s.numel()].to_vec());
            off += s.numel();
        }
        Ok(Params { specs, data })
    }
    /// The tensor called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&[f64]> {
        self.specs.iter().position(|s| s.name == name).map(|j| self.data[j].as_slice())
    }
    /// Euclidean norm of the flat vector.
    pub(crate) fn norm(&self) -> f64 {
        self.data.iter().flatten().map(|v| v * v).sum::<f64>().sqrt()
    }
    /// `self − other`, element-wise (same specs required).
    pub fn sub(&self, other: &Params) -> Result<Params> {
        if self.specs != other.specs {
            return Err(Error::Data("parameter sets with different names/shapes".into()));
        }
        let data = self
            .data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x - y).collect())
            .collect();
        Ok(Params { specs: self.specs.clone(), data })
    }
    /// Whether every value is finite; returns the first non-finite parameter name.
    pub(crate) fn first_non_finite(&self) -> Option<&str> {
        self.specs
            .iter()
            .zip(&self.data)
            .find(|(_, d)| d.iter().any(|v| !v.is_finite()))
            .map(|(s, _)| s.name.as_str())
    }
}

/// The shape of one row of `data` as a network's input: `[T]` token ids (`data.vocab`), a
/// `[C, H, W]` image (`data.image_shape`), or `[d]` features.
pub fn input_shape(data: &crate::data::Dataset) -> layers::Shape {
    match (data.vocab, data.image_shape) {
        (Some(v), _) => layers::Shape::Tokens(data.dim, v),
        (None, Some([c, h, w])) => layers::Shape::Map(c, h, w),
        (None, None) => layers::Shape::Flat(data.dim),
    }
}

/// Largest width, channel count or image side accepted from a manifest (keeps every size product
/// far from overflow).
const MAX_SIZE: usize = 1 << 20;

/// Largest parameter count accepted (2^34 f64 values = 128 GiB; anything larger is a typo).
const MAX_PARAMS: u64 = 1 << 34;

/// Spatial sizes of the CNN: `(Ho, Wo, Hp, Wp)` after convolution and pooling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CnnGeometry {
    /// Convolution output height.
    pub ho: usize,
    /// Convolution output width.
    pub wo: usize,
    /// Pooled height.
    pub hp: usize,
    /// Pooled width.
    pub wp: usize,
}

impl Architecture {
    /// Floats one input row occupies in a forward and backward pass (activations, the
    /// convolution's im2col patches, their gradients), for memory estimates.
    pub(crate) fn floats_per_row(&self) -> u64 {
        match &self.body {
            Body::Mlp { widths } => 3 * widths.iter().map(|&w| w as u64).sum::<u64>(),
            Body::Layers { .. } => self.stack().map_or(0, |s| 3 * s.floats_per_sample()),
            Body::Cnn { image, channels, kernel, outputs, .. } => {
                let (ho, wo, hp, wp) = self.cnn_geometry().map_or((0, 0, 0, 0), |g| (g.ho as u64, g.wo as u64, g.hp as u64, g.wp as u64));
                let patches = ho * wo * (image[0] * kernel * kernel) as u64;
                let maps = ho * wo * *channels as u64;
                let img = (image[0] * image[1] * image[2]) as u64;
                3 * (img + patches + 2 * maps + hp * wp * *channels as u64 + *outputs as u64)
            }
        }
    }

    /// Number of network outputs K.
    pub fn outputs(&self) -> usize {
        match &self.body {
            Body::Mlp { widths } => *widths.last().expect("widths has >= 2 entries"),
            Body::Layers { outputs, .. } => *outputs,
            Body::Cnn { outputs, .. } => *outputs,
        }
    }

    /// Input features per row.
    pub fn input_dim(&self) -> usize {
        match &self.body {
            Body::Mlp { widths } => widths[0],
            Body::Layers { input, .. } => input.size(),
            Body::Cnn { image, .. } => image.iter().product(),
        }
    }

    /// Checks an architecture read from outside (a manifest): at least an input and an output
    /// layer, every width, channel count, kernel, stride and pool ≥ 1, a CNN geometry that fits,
    /// a finite non-zero α. Everything else in this type assumes it holds.
    pub(crate) fn validate(&self) -> Result<()> {
        match &self.body {
            Body::Mlp { widths } => {
                if widths.len() < 2 {
                    return Err(Error::Config(format!("MLP widths {widths:?}: need at least an input and an output width")));
                }
                if let Some(i) = widths.iter().position(|&w| w == 0 || w > MAX_SIZE) {
                    return Err(Error::Config(format!("MLP widths {widths:?}: width {i} is 0 or above {MAX_SIZE}")));
                }
                if widths.len() > 1024 {
                    return Err(Error::Config(format!("MLP with {} layers: at most 1024", widths.len())));
                }
            }
            Body::Cnn { image, channels, kernel, stride, padding, pool, outputs } => {
                if *padding > MAX_SIZE
                    || image.iter().any(|&v| v == 0 || v > MAX_SIZE)
                    || [channels, kernel, stride, pool, outputs].iter().any(|&&v| v == 0 || v > MAX_SIZE)
                {
                    return Err(Error::Config(format!("CNN sizes must all be between 1 and {MAX_SIZE}")));
                }
                self.cnn_geometry()?;
            }
            Body::Layers { input, outputs, .. } => {
                let (s, o) = (input.size(), *outputs);
                if s == 0 || s > MAX_SIZE * 64 || o == 0 || o > MAX_SIZE {
                    return Err(Error::Config(format!("layer stack with input {input} and {o} outputs: sizes must be between 1 and {MAX_SIZE}")));
                }
                self.stack()?;
            }
        }
        if !self.alpha.is_finite() || self.alpha == 0.0 {
            return Err(Error::Config(format!("alpha = {}; it must be finite and non-zero", self.alpha)));
        }
        // Parameter counts, without overflow: at most MAX_PARAMS in all.
        let mut total: u128 = 0;
        let dims: Vec<Vec<u128>> = match &self.body {
            Body::Layers { .. } => self.stack()?.param_specs().iter().map(|s| s.shape.iter().map(|&v| v as u128).collect()).collect(),
            Body::Mlp { widths } => widths.windows(2).flat_map(|w| [vec![w[1] as u128, w[0] as u128], vec![w[1] as u128]]).collect(),
            Body::Cnn { image, channels, kernel, outputs, .. } => {
                let g = self.cnn_geometry()?;
                vec![
                    vec![*channels as u128, image[0] as u128, *kernel as u128, *kernel as u128],
                    vec![*outputs as u128, *channels as u128, g.hp as u128, g.wp as u128],
                ]
            }
        };
        for d in dims {
            total += d.iter().product::<u128>();
        }
        if total > MAX_PARAMS as u128 {
            return Err(Error::Config(format!("the network would have {total} parameters; at most {MAX_PARAMS}")));
        }
        Ok(())
    }

    /// The resolved layer stack of a `layers` body (shapes chained and checked).
    pub fn stack(&self) -> Result<layers::Stack> {
        let Body::Layers { input, layers, outputs } = &self.body else {
            return Err(Error::Config("not a layer stack".into()));
        };
        layers::Stack::resolve(*input, layers, *outputs).map_err(Error::Config)
    }

    /// The network lowered for a backend's GEMMs and kernels (`crate::device`): the ops of its
    /// stack ([`Architecture::as_stack`]) and its output map; one line naming the first layer
    /// the device program has no op for.
    pub(crate) fn device_program(&self) -> Result<crate::device::program::Program> {
        let stack = self.as_stack()?.stack()?;
        let ops = stack.device_ops().map_err(Error::Config)?;
        Ok(crate::device::program::Program { ops, input: stack.input.size(), k: self.outputs(), log_softmax: self.output == OutputKind::LogSoftmax, alpha: self.alpha })
    }

    /// The same network as a layer stack: an MLP as `dense, act, …, dense`, the CNN as
    /// `conv2d, act, max_pool2d, flatten, dense` (the activation, the biases, α, zero-output and
    /// the output map kept). Its parameters are the same tensors in the same storage order, under
    /// the stack's names (`0.weight` for `layers.0.weight`, `4.weight` for `dense.weight`): the
    /// MLP and the CNN are presets of the stack, and the stack engine computes their kernels
    /// too (the per-layer decomposition does; tests hold the presets' fast paths equal to it).
    pub fn as_stack(&self) -> Result<Architecture> {
        use layers::{Act, Conv2dSpec, DenseSpec, FlattenSpec, LayerSpec, MaxPool2dSpec};
        let act = LayerSpec::Act(match self.activation {
            Activation::Relu => Act::Relu,
            Activation::Tanh => Act::Tanh,
        });
        let (input, specs, outputs) = match &self.body {
            Body::Layers { .. } => return Ok(self.clone()),
            Body::Mlp { widths } => {
                let mut specs = Vec::new();
                for (l, &features) in widths[1..].iter().enumerate() {
                    if l > 0 {
                        specs.push(act.clone());
                    }
                    specs.push(LayerSpec::Dense(DenseSpec {
                        features,
                        bias: self.bias,
                    }));
                }
                (
                    layers::Shape::Flat(widths[0]),
                    specs,
                    *widths.last().expect("validated widths"),
                )
            }
            Body::Cnn {
                image,
                channels,
                kernel,
                stride,
                padding,
                pool,
                outputs,
            } => (
                layers::Shape::Map(image[0], image[1], image[2]),
                vec![
                    LayerSpec::Conv2d(Conv2dSpec {
                        channels: *channels,
                        kernel: *kernel,
                        stride: *stride,
                        padding: *padding,
                        bias: self.bias,
                    }),
                    act,
                    LayerSpec::MaxPool2d(MaxPool2dSpec {
                        kernel: *pool,
                        stride: *pool,
                    }),
                    LayerSpec::Flatten(FlattenSpec),
                    LayerSpec::Dense(DenseSpec {
                        features: *outputs,
                        bias: self.bias,
                    }),
                ],
                *outputs,
            ),
        };
        let arch = Architecture {
            body: Body::Layers {
                input,
                layers: specs,
                outputs,
            },
            ..self.clone()
        };
        arch.validate()?;
        Ok(arch)
    }

    /// `params` (of this architecture) under the names of [`Architecture::as_stack`].
    pub fn params_as_stack(&self, params: &Params) -> Result<Params> {
        let specs = self.as_stack()?.param_specs();
        if specs.len() != params.data.len()
            || specs
                .iter()
                .zip(&params.data)
                .any(|(s, d)| s.numel() != d.len())
        {
            return Err(Error::Data(
                "parameters do not match the architecture's layer stack".into(),
            ));
        }
        Ok(Params {
            specs,
            data: params.data.clone(),
        })
    }

    /// CNN spatial geometry; errors when the kernel does not fit or the pool does not divide.
    pub(crate) fn cnn_geometry(&self) -> Result<CnnGeometry> {
        let Body::Cnn { image, kernel, stride, padding, pool, .. } = &self.body else {
            return Err(Error::Config("not a CNN".into()));
        };
        let (h, w) = (image[1].saturating_add(padding.saturating_mul(2)), image[2].saturating_add(padding.saturating_mul(2)));
        if *kernel > h || *kernel > w {
            return Err(Error::Config(format!("model.kernel = {kernel} is larger than the padded image {h}x{w}")));
        }
        let ho = (h - kernel) / stride + 1;
        let wo = (w - kernel) / stride + 1;
        if ho % pool != 0 || wo % pool != 0 {
            return Err(Error::Config(format!(
                "model.pool = {pool} does not divide the convolution output {ho}x{wo}"
            )));
        }
        Ok(CnnGeometry { ho, wo, hp: ho / pool, wp: wo / pool })
    }
}

impl Architecture {
    /// Names and shapes of all parameters, in storage order.
    pub fn param_specs(&self) -> Vec<ParamSpec> {
        let mut specs = Vec::new();
        match &self.body {
            Body::Layers { .. } => return self.stack().expect("validated at resolve").param_specs(),
            Body::Mlp { widths } => {
                for l in 0..widths.len() - 1 {
                    specs.push(ParamSpec { name: format!("layers.{l}.weight"), shape: vec![widths[l + 1], widths[l]] });
                    if self.bias {
                        specs.push(ParamSpec { name: format!("layers.{l}.bias"), shape: vec![widths[l + 1]] });
                    }
                }
            }
            Body::Cnn { image, channels, kernel, outputs, .. } => {
                let g = self.cnn_geometry().expect("geometry validated at resolve");
                specs.push(ParamSpec { name: "conv.weight".into(), shape: vec![*channels, image[0], *kernel, *kernel] });
                if self.bias {
                    specs.push(ParamSpec { name: "conv.bias".into(), shape: vec![*channels] });
                }
                specs.push(ParamSpec { name: "dense.weight".into(), shape: vec![*outputs, channels * g.hp * g.wp] });
                if self.bias {
                    specs.push(ParamSpec { name: "dense.bias".into(), shape: vec![*outputs] });
                }
            }
        }
        specs
    }

    /// Seeded initialisation, PyTorch's default: weights and biases uniform in
    /// `[−1/√fan_in, 1/√fan_in]`; the final layer zero when `zero_last`.
    pub fn init(&self, seed: u64) -> Params {
        let specs = self.param_specs();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        if let Body::Layers { .. } = &self.body {
            let data = self.stack().expect("validated at resolve").init(&mut rng, self.zero_last);
            return Params { specs, data };
        }
        let n = specs.len();
        let last_layer_start = if self.bias { n - 2 } else { n - 1 };
        let mut data = Vec::with_capacity(n);
        let mut fan_in = 1usize;
        for (j, s) in specs.iter().enumerate() {
            if s.shape.len() >= 2 {
                fan_in = s.shape[1..].iter().product();
            }
            let bound = 1.0 / (fan_in as f64).sqrt();
            let v: Vec<f64> = if self.zero_last && j >= last_layer_start {
                vec![0.0; s.numel()]
            } else {
                (0..s.numel()).map(|_| rng.gen_range(-bound..bound)).collect()
            };
            data.push(v);
        }
        Params { specs, data }
    }

    /// Checks that `params` has exactly this architecture's names and shapes.
    pub(crate) fn check_params(&self, params: &Params) -> Result<()> {
        let specs = self.param_specs();
        if specs.len() != params.specs.len() {
            return Err(Error::Data(format!(
                "expected {} parameter tensors, got {}",
                specs.len(),
                params.specs.len()
            )));
        }
        for (a, b) in specs.iter().zip(&params.specs) {
            if a != b {
                return Err(Error::Data(format!(
                    "parameter mismatch: expected {} {:?}, got {} {:?}",
                    a.name, a.shape, b.name, b.shape
                )));
            }
        }
        for (s, d) in params.specs.iter().zip(&params.data) {
            if d.len() != s.numel() {
                return Err(Error::ShapeMismatch { what: s.name.clone(), expected: vec![s.numel()], got: vec![d.len()] });
            }
        }
        Ok(())
    }

    /// Raw network outputs `g_w(x)` (before α, zero-output and the output map), plain Rust.
    ///
    /// # Shapes
    /// `x` is `[n, d]`; returns `[n, K]`.
    pub fn raw_forward(&self, params: &Params, x: &[f64]) -> Vec<f64> {
        let d = self.input_dim();
        let n = x.len() / d;
        match &self.body {
            Body::Layers { .. } => self.stack().expect("validated").forward(&params.data, x),
            Body::Mlp { widths } => {
                let mut a = x.to_vec();
                let layers = widths.len() - 1;
                let mut j = 0;
                for l in 0..layers {
                    let (ni, no) = (widths[l], widths[l + 1]);
                    let w = &params.data[j];
                    j += 1;
                    let b = if self.bias {
                        j += 1;
                        Some(&params.data[j - 1])
                    } else {
                        None
                    };
                    // z = a Wᵀ (+ b) as one GEMM (a scalar loop here made the per-step test
                    // accuracy of training cost more than its gradient).
                    let mut z = vec![0.0; n * no];
                    crate::linalg::gemm_abt(&mut z, &a, w, n, no, ni, 1.0, false);
                    for zr in z.chunks_exact_mut(no) {
                        if let Some(b) = b {
                            zr.iter_mut().zip(b.iter()).for_each(|(v, bv)| *v += bv);
                        }
                        if l + 1 < layers {
                            zr.iter_mut().for_each(|v| *v = self.activation.apply(*v));
                        }
                    }
                    a = z;
                }
                a
            }
            Body::Cnn { image, channels, kernel, stride, padding, pool, outputs } => {
                let g = self.cnn_geometry().expect("validated");
                let cw = params.get("conv.weight").expect("checked params");
                let zero_b = vec![0.0; *channels];
                let cb = params.get("conv.bias").unwrap_or(&zero_b);
                let (c, _) = conv::conv2d_direct(
                    x,
                    [n, image[0], image[1], image[2]],
                    cw,
                    [*channels, image[0], *kernel, *kernel],
                    cb,
                    *stride,
                    *padding,
                );
                let c: Vec<f64> = c.into_iter().map(|v| self.activation.apply(v)).collect();
                let (p, _) = conv::max_pool2d_direct(&c, [n, *channels, g.ho, g.wo], *pool);
                let dw = params.get("dense.weight").expect("checked params");
                let zero_o = vec![0.0; *outputs];
                let db = params.get("dense.bias").unwrap_or(&zero_o);
                let fdim = channels * g.hp * g.wp;
                let mut out = vec![0.0; n * outputs];
                for r in 0..n {
                    for o in 0..*outputs {
                        let mut acc = db[o];
                        for i in 0..fdim {
                            acc += dw[o * fdim + i] * p[r * fdim + i];
                        }
                        out[r * outputs + o] = acc;
                    }
                }
                out
            }
        }
    }

    /// On token inputs, that every value of `x` is a token id of the input's vocabulary (a
    /// one-line [`Error::Data`] naming the first that is not).
    pub(crate) fn check_tokens(&self, x: &[f64]) -> Result<()> {
        if let Body::Layers { input: layers::Shape::Tokens(t, v), .. } = self.body {
            if let Some(i) = x.iter().position(|&a| !(a >= 0.0 && a < v as f64 && a.fract() == 0.0)) {
                return Err(Error::Data(format!("input row {}, position {}: {} is not a token id in 0..{v}", i / t, i % t, x[i])));
            }
        }
        Ok(())
    }

    /// The network function `f(x) = out(α (g_w(x) − [zero_output] g_{w_0}(x)))`, plain Rust.
    /// `init` (the step-0 parameters) is required when `zero_output` is set.
    ///
    /// # Shapes
    /// `x` is `[n, d]`; returns `[n, K]`.
    pub fn forward(&self, params: &Params, init: Option<&Params>, x: &[f64]) -> Result<Vec<f64>> {
        self.check_params(params)?;
        if x.len() % self.input_dim() != 0 {
            return Err(Error::ShapeMismatch {
                what: "input rows".into(),
                expected: vec![self.input_dim()],
                got: vec![x.len()],
            });
        }
        self.check_tokens(x)?;
        let mut z = self.raw_forward(params, x);
        if self.zero_output {
            let init = init.ok_or_else(|| Error::Data("zero_output needs the initial parameters".into()))?;
            let z0 = self.raw_forward(init, x);
            for (a, b) in z.iter_mut().zip(&z0) {
                *a -= b;
            }
        }
        for v in z.iter_mut() {
            *v *= self.alpha;
        }
        if self.output == OutputKind::LogSoftmax {
            log_softmax_rows(&mut z, self.outputs());
        }
        Ok(z)
    }
}

/// In-place row-wise log-softmax (max-shifted).
///
/// # Shapes
/// `z` is `[n, k]`.
pub fn log_softmax_rows(z: &mut [f64], k: usize) {
    for row in z.chunks_mut(k) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let lse = m + s.ln();
        for v in row.iter_mut() {
            *v -= lse;
        }
    }
}

/// Row-wise softmax of logits (max-shifted), `[N, K] → [N, K]`. Non-finite logits are an error.
///
/// # Shapes
/// `logits: [N, K]`; returns `[N, K]`.
pub fn softmax_rows(logits: &[f64], k: usize) -> Result<Vec<f64>> {
    if k == 0 || logits.len() % k != 0 {
        return Err(Error::ShapeMismatch {
            what: "logits [N, K]".into(),
            expected: vec![k],
            got: vec![logits.len()],
        });
    }
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return Err(Error::Data(format!(
            "non-finite logit [{}, {}] = {}",
            i / k,
            i % k,
            logits[i]
        )));
    }
    let mut out = logits.to_vec();
    for row in out.chunks_exact_mut(k) {
        softmax_in_place(row);
    }
    Ok(out)
}

/// Softmax of one finite row, in place.
pub(crate) fn softmax_in_place(row: &mut [f64]) {
    let m = row[crate::data::argmax(row)];
    let mut s = 0.0;
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    for v in row.iter_mut() {
        *v /= s;
    }
}

#[cfg(test)]
mod tests;
