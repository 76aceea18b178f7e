//! The `[model] layers = [...]` list as written: one entry per layer, in PyTorch's words.
//!
//! ```toml
//! layers = [
//!   { conv2d = { channels = 6, kernel = 5, padding = 2 } }, "relu", { max_pool2d = 2 },
//!   "flatten", { dense = 120 }, "gelu", "layer_norm", { dense = 10 },
//!   { residual = [ { dense = 10 }, "relu", { dense = 10 } ] },
//! ]
//! ```
//!
//! A layer without options is a string (`"relu"`, `"flatten"`, `"layer_norm"`); one with options
//! is a one-key table whose value is the main option (`{ dense = 120 }`, `{ max_pool2d = 2 }`,
//! `{ leaky_relu = 0.2 }`, `{ residual = [...] }`) or a table of options
//! (`{ dense = { features = 120, bias = false } }`). Parsed by hand (not by serde's derive) so
//! that every refusal names the layer and says why.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::activation::Act;

/// One layer as configured (sizes of its input are resolved later, by chaining).
#[derive(Clone, Debug, PartialEq)]
pub enum LayerSpec {
    /// `Linear(in, features, bias)` on a flat input.
    Dense {
        /// Output features.
        features: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// `Conv2d(C, channels, kernel, stride, padding, bias)` on a `[C, H, W]` map.
    Conv2d {
        /// Output channels.
        channels: usize,
        /// Square kernel size.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Zero padding on every side.
        padding: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// `MaxPool2d(kernel, stride)` (stride defaults to the kernel).
    MaxPool2d {
        /// Window size.
        kernel: usize,
        /// Stride.
        stride: usize,
    },
    /// `AvgPool2d(kernel, stride)`.
    AvgPool2d {
        /// Window size.
        kernel: usize,
        /// Stride.
        stride: usize,
    },
    /// `Flatten()`: a `[C, H, W]` map to `[C·H·W]` features (row-major, as PyTorch).
    Flatten,
    /// An element-wise activation.
    Act(Act),
    /// Layer norm over the features (flat) or the channels at each position (map).
    LayerNorm {
        /// ε (PyTorch's default 1e-5).
        eps: f64,
    },
    /// `y = body(x) + shortcut(x)`: identity shortcut, or a projection (dense, or a 1×1
    /// convolution with the stride that matches the body's output size) when shapes differ.
    Residual {
        /// The body's layers.
        layers: Vec<LayerSpec>,
    },
}

fn err(at: &str, msg: impl std::fmt::Display) -> String {
    format!("{at}: {msg}")
}

fn as_size(v: &Value, at: &str, what: &str) -> Result<usize, String> {
    match v.as_u64() {
        Some(n) if n >= 1 && n <= 1 << 20 => Ok(n as usize),
        _ => Err(err(at, format!("{what} must be an integer between 1 and {}, got {v}", 1 << 20))),
    }
}

fn as_count(v: &Value, at: &str, what: &str) -> Result<usize, String> {
    match v.as_u64() {
        Some(n) if n <= 1 << 20 => Ok(n as usize),
        _ => Err(err(at, format!("{what} must be a non-negative integer, got {v}"))),
    }
}

fn as_bool(v: &Value, at: &str, what: &str) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| err(at, format!("{what} must be true or false, got {v}")))
}

/// The options of a table-valued layer, with every key checked against `allowed`.
fn options<'a>(v: &'a Value, at: &str, kind: &str, allowed: &[&str]) -> Result<&'a Map<String, Value>, String> {
    let m = v.as_object().ok_or_else(|| err(at, format!("{kind} takes a number or a table of options, got {v}")))?;
    if let Some(bad) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(err(at, format!("{kind} has no option `{bad}` (options: {})", allowed.join(", "))));
    }
    Ok(m)
}

const REFUSED_BATCH_NORM: &str = "batch norm is not supported: in training mode a point's output depends on the other points of its batch, so the network is not a function of one input and the per-point kernel decomposition does not exist; it would need a fixed-statistics (eval) mode, which is not implemented. Use layer_norm";
const REFUSED_DROPOUT: &str = "dropout is not supported: its random mask changes the network at every step, so the recorded path is not the gradient flow of one deterministic network; train without it";

const KINDS: &str = "dense, conv2d, max_pool2d, avg_pool2d, flatten, relu, leaky_relu, tanh, sigmoid, softplus, gelu, silu, layer_norm, residual";

impl LayerSpec {
    /// Parses one entry; `at` names it in errors (`model.layers[3]`).
    pub fn parse(v: &Value, at: &str) -> Result<LayerSpec, String> {
        let (kind, arg) = match v {
            Value::String(s) => (s.as_str(), None),
            Value::Object(m) if m.len() == 1 => {
                let (k, a) = m.iter().next().expect("one entry");
                (k.as_str(), Some(a))
            }
            _ => return Err(err(at, format!("a layer is a name (\"relu\") or a one-key table ({{ dense = 10 }}), got {v}"))),
        };
        fn need<'v>(a: Option<&'v Value>, at: &str, kind: &str) -> Result<&'v Value, String> {
            a.ok_or_else(|| err(at, format!("{kind} needs options, e.g. {{ {kind} = ... }}")))
        }
        let none = |a: Option<&Value>| match a {
            None => Ok(()),
            Some(Value::Object(m)) if m.is_empty() => Ok(()),
            Some(a) => Err(err(at, format!("{kind} takes no options, got {a}"))),
        };
        Ok(match kind {
            "dense" | "linear" => {
                let a = need(arg, at, kind)?;
                if a.is_number() {
                    LayerSpec::Dense { features: as_size(a, at, "dense")?, bias: true }
                } else {
                    let m = options(a, at, kind, &["features", "bias"])?;
                    let features = as_size(m.get("features").ok_or_else(|| err(at, "dense needs `features`"))?, at, "dense.features")?;
                    let bias = m.get("bias").map_or(Ok(true), |b| as_bool(b, at, "dense.bias"))?;
                    LayerSpec::Dense { features, bias }
                }
            }
            "conv2d" => {
                let m = options(need(arg, at, kind)?, at, kind, &["channels", "kernel", "stride", "padding", "bias"])?;
                let channels = as_size(m.get("channels").ok_or_else(|| err(at, "conv2d needs `channels`"))?, at, "conv2d.channels")?;
                let kernel = as_size(m.get("kernel").ok_or_else(|| err(at, "conv2d needs `kernel`"))?, at, "conv2d.kernel")?;
                let stride = m.get("stride").map_or(Ok(1), |v| as_size(v, at, "conv2d.stride"))?;
                let padding = m.get("padding").map_or(Ok(0), |v| as_count(v, at, "conv2d.padding"))?;
                let bias = m.get("bias").map_or(Ok(true), |b| as_bool(b, at, "conv2d.bias"))?;
                LayerSpec::Conv2d { channels, kernel, stride, padding, bias }
            }
            "max_pool2d" | "avg_pool2d" => {
                let a = need(arg, at, kind)?;
                let (kernel, stride) = if a.is_number() {
                    let k = as_size(a, at, kind)?;
                    (k, k)
                } else {
                    let m = options(a, at, kind, &["kernel", "stride"])?;
                    let k = as_size(m.get("kernel").ok_or_else(|| err(at, format!("{kind} needs `kernel`")))?, at, &format!("{kind}.kernel"))?;
                    (k, m.get("stride").map_or(Ok(k), |v| as_size(v, at, &format!("{kind}.stride")))?)
                };
                if kind == "max_pool2d" {
                    LayerSpec::MaxPool2d { kernel, stride }
                } else {
                    LayerSpec::AvgPool2d { kernel, stride }
                }
            }
            "flatten" => {
                none(arg)?;
                LayerSpec::Flatten
            }
            "relu" | "tanh" | "sigmoid" | "softplus" | "gelu" | "silu" => {
                none(arg)?;
                LayerSpec::Act(match kind {
                    "relu" => Act::Relu,
                    "tanh" => Act::Tanh,
                    "sigmoid" => Act::Sigmoid,
                    "softplus" => Act::Softplus,
                    "gelu" => Act::Gelu,
                    _ => Act::Silu,
                })
            }
            "leaky_relu" => {
                let slope = match arg {
                    None => 0.01,
                    Some(Value::Object(m)) => {
                        options(arg.expect("some"), at, kind, &["slope"])?;
                        m.get("slope").and_then(Value::as_f64).ok_or_else(|| err(at, "leaky_relu needs a number `slope`"))?
                    }
                    Some(a) => a.as_f64().ok_or_else(|| err(at, format!("leaky_relu's slope must be a number, got {a}")))?,
                };
                if !slope.is_finite() {
                    return Err(err(at, format!("leaky_relu's slope must be finite, got {slope}")));
                }
                LayerSpec::Act(Act::LeakyRelu(slope))
            }
            "layer_norm" => {
                let eps = match arg {
                    None => 1e-5,
                    Some(a) => {
                        let m = options(a, at, kind, &["eps"])?;
                        m.get("eps").map_or(Ok(1e-5), |e| e.as_f64().ok_or_else(|| err(at, format!("layer_norm.eps must be a number, got {e}"))))?
                    }
                };
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(err(at, format!("layer_norm.eps must be positive, got {eps}")));
                }
                LayerSpec::LayerNorm { eps }
            }
            "residual" => {
                let a = need(arg, at, kind)?;
                let list = match a {
                    Value::Array(l) => l,
                    Value::Object(_) => {
                        let m = options(a, at, kind, &["layers"])?;
                        m.get("layers").and_then(Value::as_array).ok_or_else(|| err(at, "residual needs `layers = [...]`"))?
                    }
                    _ => return Err(err(at, format!("residual takes a list of layers, got {a}"))),
                };
                if list.is_empty() {
                    return Err(err(at, "residual needs at least one layer"));
                }
                let layers = list.iter().enumerate().map(|(j, l)| LayerSpec::parse(l, &format!("{at}.residual[{j}]"))).collect::<Result<Vec<_>, _>>()?;
                LayerSpec::Residual { layers }
            }
            "batch_norm" | "batch_norm1d" | "batch_norm2d" | "batchnorm" => return Err(err(at, REFUSED_BATCH_NORM)),
            "dropout" | "dropout2d" => return Err(err(at, REFUSED_DROPOUT)),
            other => return Err(err(at, format!("unknown layer `{other}` (layers: {KINDS})"))),
        })
    }

    /// The canonical written form (what the run manifest records; [`LayerSpec::parse`] reads it).
    pub fn to_value(&self) -> Value {
        match self {
            LayerSpec::Dense { features, bias } => json!({ "dense": { "features": features, "bias": bias } }),
            LayerSpec::Conv2d { channels, kernel, stride, padding, bias } => {
                json!({ "conv2d": { "channels": channels, "kernel": kernel, "stride": stride, "padding": padding, "bias": bias } })
            }
            LayerSpec::MaxPool2d { kernel, stride } => json!({ "max_pool2d": { "kernel": kernel, "stride": stride } }),
            LayerSpec::AvgPool2d { kernel, stride } => json!({ "avg_pool2d": { "kernel": kernel, "stride": stride } }),
            LayerSpec::Flatten => json!("flatten"),
            LayerSpec::Act(Act::LeakyRelu(s)) => json!({ "leaky_relu": s }),
            LayerSpec::Act(a) => json!(a.name()),
            LayerSpec::LayerNorm { eps } => json!({ "layer_norm": { "eps": eps } }),
            LayerSpec::Residual { layers } => json!({ "residual": layers.iter().map(LayerSpec::to_value).collect::<Vec<_>>() }),
        }
    }

    /// A short label (`conv2d(6, k5, p2)`, `relu`, `residual[3]`) for tables and messages.
    pub fn label(&self) -> String {
        match self {
            LayerSpec::Dense { features, .. } => format!("dense({features})"),
            LayerSpec::Conv2d { channels, kernel, stride, padding, .. } => format!("conv2d({channels}, k{kernel}, s{stride}, p{padding})"),
            LayerSpec::MaxPool2d { kernel, stride } => format!("max_pool2d({kernel}, s{stride})"),
            LayerSpec::AvgPool2d { kernel, stride } => format!("avg_pool2d({kernel}, s{stride})"),
            LayerSpec::Flatten => "flatten".into(),
            LayerSpec::Act(Act::LeakyRelu(s)) => format!("leaky_relu({s})"),
            LayerSpec::Act(a) => a.name().into(),
            LayerSpec::LayerNorm { .. } => "layer_norm".into(),
            LayerSpec::Residual { layers } => format!("residual[{}]", layers.iter().map(LayerSpec::label).collect::<Vec<_>>().join(", ")),
        }
    }
}

impl Serialize for LayerSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for LayerSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        LayerSpec::parse(&v, "layer").map_err(serde::de::Error::custom)
    }
}

/// Parses a whole `layers` list, naming entries `model.layers[i]`.
pub fn parse_list(v: &[Value]) -> Result<Vec<LayerSpec>, String> {
    if v.is_empty() {
        return Err("model.layers is empty: list at least the output layer, e.g. [{ dense = 10 }]".into());
    }
    v.iter().enumerate().map(|(i, l)| LayerSpec::parse(l, &format!("model.layers[{i}]"))).collect()
}
