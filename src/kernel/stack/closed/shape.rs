//! The two stack shapes with a closed form, read from a layer stack's layer list, and the
//! tensors they read by position (weight, then bias when the layers have one, layer by layer).
//! Below the closed forms themselves ([`super::dense_relu`], [`super::conv_relu_pool`]), which
//! read their shape from here.

use crate::error::{Error, Result};
use crate::model::layers::{Act, LayerSpec, Shape};
use crate::model::{Architecture, Body, OutputKind, Params};

/// `[flatten,] dense(h) → relu → dense(K)` on inputs of size `d`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DenseRelu {
    /// Input size d (flattened).
    pub d: usize,
    /// Hidden units h.
    pub h: usize,
    /// Outputs K.
    pub k: usize,
    /// Whether both dense layers have a bias.
    pub bias: bool,
    /// Output scale α.
    pub alpha: f64,
    /// Output map.
    pub output: OutputKind,
}

/// `conv2d → relu → max_pool2d(pool, stride pool) → flatten → dense(K)` on `[C, H, W]` images.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConvReluPool {
    /// Input image `[C, H, W]`.
    pub image: [usize; 3],
    /// Conv output channels, square kernel, stride, zero padding.
    pub channels: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    /// Pool window (= its stride).
    pub pool: usize,
    /// Conv output `Ho, Wo` (divisible by `pool`).
    pub ho: usize,
    pub wo: usize,
    /// Outputs K.
    pub k: usize,
    /// Whether both layers have a bias.
    pub bias: bool,
    /// Output scale α.
    pub alpha: f64,
    /// Output map.
    pub output: OutputKind,
}

/// A stack shape with a closed form.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ClosedForm {
    DenseRelu(DenseRelu),
    ConvReluPool(ConvReluPool),
}

impl ClosedForm {
    /// The closed-form shape of a layer stack's layer list, whatever the request (a preset is
    /// seen as its stack, [`Architecture::as_stack`]).
    pub(crate) fn shape(arch: &Architecture) -> Option<Self> {
        let stack;
        let arch = match arch.body {
            Body::Layers { .. } => arch,
            _ => {
                stack = arch.as_stack().ok()?;
                &stack
            }
        };
        let Body::Layers { input, layers, outputs } = &arch.body else { return None };
        let (alpha, output, k) = (arch.alpha, arch.output, *outputs);
        match (input, &layers[..]) {
            (Shape::Map(c, h, w), [LayerSpec::Conv2d(cv), LayerSpec::Act(Act::Relu), LayerSpec::MaxPool2d(mp), LayerSpec::Flatten(_), LayerSpec::Dense(o)]) => {
                let (hh, ww) = (h + 2 * cv.padding, w + 2 * cv.padding);
                if cv.bias != o.bias || mp.kernel != mp.stride || cv.kernel > hh || cv.kernel > ww || o.features != k {
                    return None;
                }
                let (ho, wo) = ((hh - cv.kernel) / cv.stride + 1, (ww - cv.kernel) / cv.stride + 1);
                if ho % mp.kernel != 0 || wo % mp.kernel != 0 {
                    return None;
                }
                Some(ClosedForm::ConvReluPool(ConvReluPool { image: [*c, *h, *w], channels: cv.channels, kernel: cv.kernel, stride: cv.stride, padding: cv.padding, pool: mp.kernel, ho, wo, k, bias: cv.bias, alpha, output }))
            }
            (_, [LayerSpec::Flatten(_), LayerSpec::Dense(h), LayerSpec::Act(Act::Relu), LayerSpec::Dense(o)]) | (_, [LayerSpec::Dense(h), LayerSpec::Act(Act::Relu), LayerSpec::Dense(o)]) => {
                if h.bias != o.bias || o.features != k || !matches!(input, Shape::Flat(_)) && !matches!(layers[0], LayerSpec::Flatten(_)) {
                    return None;
                }
                Some(ClosedForm::DenseRelu(DenseRelu { d: input.size(), h: h.features, k, bias: h.bias, alpha, output }))
            }
            _ => None,
        }
    }

    /// Whether its layers have biases (the Gram accumulator's bias column; a stack's
    /// `Architecture::bias` does not say, its layers do).
    pub(crate) fn bias(&self) -> bool {
        match self {
            ClosedForm::DenseRelu(s) => s.bias,
            ClosedForm::ConvReluPool(s) => s.bias,
        }
    }
}

/// The stack's tensors of one state, checked against the lengths the shape reads (`lens`, in
/// order).
///
/// # Errors
/// [`Error::Data`] if their number or sizes differ.
pub(crate) fn tensors<'a>(p: &'a Params, lens: &[usize]) -> Result<&'a [Vec<f64>]> {
    if p.data.len() != lens.len() || p.data.iter().zip(lens).any(|(v, &n)| v.len() != n) {
        let got: Vec<usize> = p.data.iter().map(Vec::len).collect();
        return Err(Error::Data(format!("parameters of sizes {got:?} do not match the layer stack's closed form ({lens:?})")));
    }
    Ok(&p.data)
}

#[cfg(test)]
impl DenseRelu {
    /// The shape of `arch` (a preset or a stack), which must be one.
    pub(crate) fn of(arch: &Architecture) -> Self {
        match ClosedForm::shape(arch) {
            Some(ClosedForm::DenseRelu(s)) => s,
            other => panic!("not a dense → relu → dense stack: {other:?}"),
        }
    }
}

#[cfg(test)]
impl ConvReluPool {
    /// The shape of `arch` (a preset or a stack), which must be one.
    pub(crate) fn of(arch: &Architecture) -> Self {
        match ClosedForm::shape(arch) {
            Some(ClosedForm::ConvReluPool(s)) => s,
            other => panic!("not a conv → relu → max-pool → dense stack: {other:?}"),
        }
    }
}

