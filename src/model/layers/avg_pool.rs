//! `avg_pool2d`: PyTorch's `AvgPool2d(kernel, stride)` ([`Pool`] holds the windows). Linear:
//! polynomials in t stay polynomials of the same degree.

use dfdx::prelude::*;

use super::autodiff::{map, pool_index, Activations};
use serde_json::{json, Value};

use super::contract::{KindSpec, At, Layer, Poly, Probe, Sweep};
use super::pool::Pool;
use super::{pool, AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// A resolved average-pooling layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AvgPool(pub Pool);

impl Layer for AvgPool {
    fn torch(&self) -> String {
        format!("AvgPool2d({}, stride={})", self.0.k, self.0.stride)
    }

    fn device(&self) -> Option<crate::device::program::Op> {
        Some(crate::device::program::Op::AvgPool(self.0.device_window()))
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, _keep: bool) -> (Vec<f64>, Cache) {
        (self.0.avg_forward(&x), Cache::None)
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        (self.0.avg_forward(&x), xd.as_deref().map(|xd| self.0.avg_forward(xd)))
    }

    fn backward(&self, _first: usize, _at: &At, _cache: &Cache, dy: Vec<f64>, _k: usize, _want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        self.0.avg_backward(&dy)
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        let out = self.0.c * self.0.ho * self.0.wo;
        Some(Poly { c: self.0.avg_forward(&p.c), size: out })
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        let pl = &self.0;
        let a = map(x);
        let rows = a.shape().0;
        let dev = a.device().clone();
        let idx = pool_index(pl, rows, None);
        let len = idx.len();
        let idx = dev.tensor_from_vec(idx, (len,));
        let g = a.reshape_like(&(rows * pl.c * pl.h * pl.w,)).gather::<(usize,), (usize,)>(idx);
        let kk = pl.k * pl.k;
        let s: Tensor<(usize,), f64, D, T> = g.reshape_like(&(len / kk, kk)).sum::<(usize,), Axis<1>>();
        Activations::Map((s * (1.0 / kk as f64)).reshape_like(&(rows, pl.c, pl.ho, pl.wo)))
    }
}

/// `{ avg_pool2d = k }` or `{ avg_pool2d = { kernel, stride } }`: `AvgPool2d(kernel, stride)` (stride
/// defaults to the kernel).
#[derive(Clone, Debug, PartialEq)]
pub struct AvgPool2dSpec {
    /// Window size.
    pub kernel: usize,
    /// Stride.
    pub stride: usize,
}

impl KindSpec for AvgPool2dSpec {
    const NAMES: &'static [&'static str] = &["avg_pool2d"];
    const TORCH: &'static [&'static str] = &["AvgPool2d"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        let (kernel, stride) = pool::parse_window(name, arg, at)?;
        Ok(AvgPool2dSpec { kernel, stride })
    }

    fn to_value(&self) -> Value {
        json!({ "avg_pool2d": { "kernel": self.kernel, "stride": self.stride } })
    }

    fn label(&self) -> String {
        format!("avg_pool2d({}, s{})", self.kernel, self.stride)
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        let (kernel, stride) = pool::torch_window(m, at)?;
        super::recorded::require(m, "divisor_override", Value::Null, at, "a divisor override is not supported")?;
        Ok(AvgPool2dSpec { kernel, stride })
    }

    fn resolve(&self, input: Shape, at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        let p = pool::resolve(input, self.kernel, self.stride, at, &self.label())?;
        let out = Shape::Map(p.c, p.ho, p.wo);
        Ok((AnyLayer::AvgPool2d(AvgPool(p)), out))
    }
}
