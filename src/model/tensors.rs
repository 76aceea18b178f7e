//! Parameters as dfdx tensors in their natural ranks: what the autodiff forward passes
//! ([`super::net`], [`super::layers::autodiff`]) differentiate.

use dfdx::prelude::*;

use super::Params;

/// One parameter tensor on a dfdx device, in its natural rank.
#[derive(Clone, Debug)]
pub enum ParamTensor<D: Device<f64>> {
    /// Biases.
    R1(Tensor<(usize,), f64, D>),
    /// Dense weights `[out, in]`.
    R2(Tensor<(usize, usize), f64, D>),
    /// Convolution weights `[Co, C, k, k]`.
    R4(Tensor<(usize, usize, usize, usize), f64, D>),
}

impl<D: Device<f64>> ParamTensor<D> {
    pub(crate) fn r1(&self) -> &Tensor<(usize,), f64, D> {
        match self {
            ParamTensor::R1(t) => t,
            _ => panic!("expected a rank-1 parameter"),
        }
    }
    pub(crate) fn r2(&self) -> &Tensor<(usize, usize), f64, D> {
        match self {
            ParamTensor::R2(t) => t,
            _ => panic!("expected a rank-2 parameter"),
        }
    }
    pub(crate) fn r4(&self) -> &Tensor<(usize, usize, usize, usize), f64, D> {
        match self {
            ParamTensor::R4(t) => t,
            _ => panic!("expected a rank-4 parameter"),
        }
    }
    /// The gradient of this parameter, flattened row-major.
    pub(crate) fn grad(&self, g: &Gradients<f64, D>) -> Vec<f64> {
        match self {
            ParamTensor::R1(t) => g.get(t).as_vec(),
            ParamTensor::R2(t) => g.get(t).as_vec(),
            ParamTensor::R4(t) => g.get(t).as_vec(),
        }
    }
}

/// Uploads parameters to `dev` in their natural shapes.
pub(crate) fn upload<D: Device<f64>>(dev: &D, params: &Params) -> Vec<ParamTensor<D>> {
    params
        .specs
        .iter()
        .zip(&params.data)
        .map(|(s, d)| match s.shape.as_slice() {
            [a] => ParamTensor::R1(dev.tensor_from_vec(d.clone(), (*a,))),
            [a, b] => ParamTensor::R2(dev.tensor_from_vec(d.clone(), (*a, *b))),
            [a, b, c, e] => ParamTensor::R4(dev.tensor_from_vec(d.clone(), (*a, *b, *c, *e))),
            other => panic!("unsupported parameter rank {}", other.len()),
        })
        .collect()
}

