//! The `[model]` section of a run configuration ([`ModelConfig`]): its kinds and defaults, and
//! the [`Architecture`] it resolves to on a dataset.

use serde::{Deserialize, Serialize};

use super::*;

fn default_true() -> bool {
    true
}
fn default_alpha() -> f64 {
    1.0
}
fn is_one(v: &f64) -> bool {
    *v == 1.0
}
fn default_relu() -> Activation {
    Activation::Relu
}
fn default_hidden() -> Vec<usize> {
    vec![64]
}
fn default_channels() -> usize {
    8
}
fn default_kernel() -> usize {
    5
}
fn default_pool() -> usize {
    2
}
fn default_stride() -> usize {
    1
}

/// The `[model]` section of a run configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ModelConfig {
    /// Fully connected network `d → hidden[0] → … → K`.
    Mlp {
        /// Hidden widths, one per hidden layer (may be empty: a linear model).
        #[serde(default = "default_hidden")]
        hidden: Vec<usize>,
        /// Hidden activation.
        #[serde(default = "default_relu")]
        activation: Activation,
        /// Whether layers have biases.
        #[serde(default = "default_true")]
        bias: bool,
        /// Initialise the final layer to zero (EPK paper Remark 1: constant initial output).
        #[serde(default = "default_true")]
        zero_last: bool,
        /// Output scale α.
        #[serde(default = "default_alpha")]
        alpha: f64,
        /// Subtract the frozen initial network from the output.
        #[serde(default)]
        zero_output: bool,
    },
    /// A stack of layers, as listed (see [`layers::spec`] for the syntax).
    Layers {
        /// The layers, in order; the last one gives the K outputs.
        #[serde(deserialize_with = "deserialize_layers")]
        layers: Vec<layers::LayerSpec>,
        /// Initialise the last layer to zero (a constant initial output, as the MLP's default).
        #[serde(default = "default_true")]
        zero_last: bool,
        /// Output scale α.
        #[serde(default = "default_alpha")]
        alpha: f64,
        /// Subtract the frozen initial network from the output.
        #[serde(default)]
        zero_output: bool,
        /// Every initial parameter times this factor (after `zero_last`; ExPLAIND's
        /// `scale_weights`: 0.1 keeps a transformer's attention from saturating at
        /// initialisation). Default 1 (PyTorch's initialisation as it is).
        #[serde(default = "default_alpha", skip_serializing_if = "is_one")]
        init_scale: f64,
    },
    /// conv(k×k, `channels`, stride, padding) → activation → max-pool(`pool`) → dense(K).
    Cnn {
        /// Output channels of the convolution.
        #[serde(default = "default_channels")]
        channels: usize,
        /// Square kernel size.
        #[serde(default = "default_kernel")]
        kernel: usize,
        /// Convolution stride.
        #[serde(default = "default_stride")]
        stride: usize,
        /// Zero padding.
        #[serde(default)]
        padding: usize,
        /// Max-pool window (non-overlapping).
        #[serde(default = "default_pool")]
        pool: usize,
        /// Activation after the convolution.
        #[serde(default = "default_relu")]
        activation: Activation,
        /// Whether layers have biases.
        #[serde(default = "default_true")]
        bias: bool,
        /// Initialise the final layer to zero.
        #[serde(default = "default_true")]
        zero_last: bool,
        /// Output scale α.
        #[serde(default = "default_alpha")]
        alpha: f64,
        /// Subtract the frozen initial network from the output.
        #[serde(default)]
        zero_output: bool,
    },
}

fn deserialize_layers<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<layers::LayerSpec>, D::Error> {
    let v = Vec::<serde_json::Value>::deserialize(d)?;
    layers::spec::parse_list(&v).map_err(serde::de::Error::custom)
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig::Mlp {
            hidden: default_hidden(),
            activation: Activation::Relu,
            bias: true,
            zero_last: true,
            alpha: 1.0,
            zero_output: false,
        }
    }
}

impl ModelConfig {
    /// The factor every initial parameter is multiplied by (`init_scale` of a layer stack; 1
    /// otherwise).
    pub fn init_scale(&self) -> f64 {
        match self {
            ModelConfig::Layers { init_scale, .. } => *init_scale,
            _ => 1.0,
        }
    }

    /// Checks the configuration values.
    pub(crate) fn validate(&self) -> Result<()> {
        let (alpha, activation_ok) = match self {
            ModelConfig::Mlp { hidden, alpha, .. } => {
                if let Some(i) = hidden.iter().position(|&h| h == 0) {
                    return Err(Error::Config(format!("model.hidden[{i}] is 0; widths must be >= 1")));
                }
                if let Some(i) = hidden.iter().position(|&h| h > MAX_SIZE) {
                    return Err(Error::Config(format!("model.hidden[{i}] = {} is above the limit {MAX_SIZE}", hidden[i])));
                }
                if hidden.len() > 1022 {
                    return Err(Error::Config(format!("model.hidden has {} layers; at most 1022", hidden.len())));
                }
                (*alpha, true)
            }
            ModelConfig::Layers { layers, alpha, init_scale, .. } => {
                if layers.is_empty() {
                    return Err(Error::Config("model.layers is empty: list at least the output layer, e.g. [{ dense = 10 }]".into()));
                }
                if !(init_scale.is_finite() && *init_scale > 0.0) {
                    return Err(Error::Config(format!("model.init_scale = {init_scale}: it must be a finite number > 0")));
                }
                (*alpha, true)
            }
            ModelConfig::Cnn { channels, kernel, stride, pool, alpha, .. } => {
                for (name, v) in [("channels", channels), ("kernel", kernel), ("stride", stride), ("pool", pool)] {
                    if *v == 0 {
                        return Err(Error::Config(format!("model.{name} is 0; it must be >= 1")));
                    }
                    if *v > MAX_SIZE {
                        return Err(Error::Config(format!("model.{name} = {v} is above the limit {MAX_SIZE}")));
                    }
                }
                if let ModelConfig::Cnn { padding, .. } = self {
                    if *padding > MAX_SIZE {
                        return Err(Error::Config(format!("model.padding = {padding} is above the limit {MAX_SIZE}")));
                    }
                }
                (*alpha, true)
            }
        };
        if !alpha.is_finite() || alpha == 0.0 {
            return Err(Error::Config(format!("model.alpha = {alpha}; it must be finite and non-zero")));
        }
        debug_assert!(activation_ok);
        Ok(())
    }

    /// Resolves the architecture for inputs of `dim` features (`image` when rows are images)
    /// and `outputs` network outputs K.
    pub fn resolve(&self, dim: usize, image: Option<[usize; 3]>, outputs: usize, output: OutputKind) -> Result<Architecture> {
        let input = match image {
            Some([c, h, w]) => layers::Shape::Map(c, h, w),
            None => layers::Shape::Flat(dim),
        };
        self.resolve_on(input, outputs, output)
    }

    /// Resolves the architecture for the rows of `data` (features, images, or token sequences:
    /// [`input_shape`]) and its K outputs.
    pub fn resolve_for(&self, data: &crate::data::Dataset, output: OutputKind) -> Result<Architecture> {
        self.resolve_on(input_shape(data), data.num_outputs, output)
    }

    /// Resolves the architecture for inputs of shape `input` and `outputs` network outputs K.
    /// Token sequences need a layer stack (that starts with an embedding).
    pub fn resolve_on(&self, input: layers::Shape, outputs: usize, output: OutputKind) -> Result<Architecture> {
        self.validate()?;
        let dim = input.size();
        if matches!(input, layers::Shape::Tokens(..)) && !matches!(self, ModelConfig::Layers { .. }) {
            return Err(Error::Config(format!("the data's rows are token sequences {input}: they need model.kind = \"layers\" starting with an \"embedding\"")));
        }
        let image = match input {
            layers::Shape::Map(c, h, w) => Some([c, h, w]),
            _ => None,
        };
        match self {
            ModelConfig::Mlp { hidden, activation, bias, zero_last, alpha, zero_output } => {
                let mut widths = vec![dim];
                widths.extend_from_slice(hidden);
                widths.push(outputs);
                let arch = Architecture {
                    body: Body::Mlp { widths },
                    activation: *activation,
                    bias: *bias,
                    zero_last: *zero_last,
                    alpha: *alpha,
                    zero_output: *zero_output,
                    output,
                };
                arch.validate()?;
                Ok(arch)
            }
            ModelConfig::Layers { layers, zero_last, alpha, zero_output, .. } => {
                let arch = Architecture {
                    body: Body::Layers { input, layers: layers.clone(), outputs },
                    activation: Activation::Relu,
                    bias: true,
                    zero_last: *zero_last,
                    alpha: *alpha,
                    zero_output: *zero_output,
                    output,
                };
                arch.validate()?;
                Ok(arch)
            }
            ModelConfig::Cnn { channels, kernel, stride, padding, pool, activation, bias, zero_last, alpha, zero_output } => {
                let image = image.ok_or_else(|| {
                    Error::Config("model.kind = \"cnn\" needs image data (e.g. data.kind = \"mnist\")".into())
                })?;
                let arch = Architecture {
                    body: Body::Cnn {
                        image,
                        channels: *channels,
                        kernel: *kernel,
                        stride: *stride,
                        padding: *padding,
                        pool: *pool,
                        outputs,
                    },
                    activation: *activation,
                    bias: *bias,
                    zero_last: *zero_last,
                    alpha: *alpha,
                    zero_output: *zero_output,
                    output,
                };
                arch.validate()?;
                Ok(arch)
            }
        }
    }
}
