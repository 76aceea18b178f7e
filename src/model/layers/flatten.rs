//! `flatten`: PyTorch's `Flatten()`, a `[C, H, W]` map to `[C·H·W]` features (row-major, so the
//! numbers do not move).

use dfdx::prelude::*;

use super::autodiff::Activations;
use serde_json::{json, Value};

use super::contract::{KindSpec, At, Layer, Poly, Probe, Sweep};
use super::recorded::require;
use super::spec::no_options;
use super::{AnyLayer, Cache, Grad, Shape};
use crate::model::tensors::ParamTensor;

/// The flatten layer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Flatten;

impl Layer for Flatten {
    fn torch(&self) -> String {
        "Flatten()".into()
    }

    fn device(&self) -> Option<crate::device::program::Op> {
        Some(crate::device::program::Op::Reshape)
    }

    fn forward(&self, _first: usize, _at: &At, x: Vec<f64>, _keep: bool) -> (Vec<f64>, Cache) {
        (x, Cache::None)
    }

    fn tangent(&self, _first: usize, _at: &At, x: Vec<f64>, xd: Option<Vec<f64>>, _probe: Probe<'_>) -> (Vec<f64>, Option<Vec<f64>>) {
        (x, xd)
    }

    fn backward(&self, _first: usize, _at: &At, _cache: &Cache, dy: Vec<f64>, _k: usize, _want_dx: bool, _grads: &mut Vec<(usize, Grad)>) -> Vec<f64> {
        dy
    }

    fn sweep(&self, _first: usize, _w: &[Vec<f64>], _dw: &[Vec<f64>], p: Poly, _sw: &mut Sweep) -> Option<Poly> {
        Some(p)
    }

    fn autodiff<D: Device<f64>, T: Tape<f64, D> + Merge<T> + Merge<NoneTape>>(&self, _first: usize, _p: &[ParamTensor<D>], x: Activations<D, T>) -> Activations<D, T> {
        match x {
            Activations::Map(t) => {
                let (b, c, h, w) = *t.shape();
                Activations::Flat(t.reshape_like(&(b, c * h * w)))
            }
            Activations::Seq(t) => {
                let (b, n, d) = *t.shape();
                Activations::Flat(t.reshape_like(&(b, n * d)))
            }
            f => f,
        }
    }
}

/// `"flatten"`: `Flatten()`, a `[C, H, W]` map to `[C·H·W]` features.
#[derive(Clone, Debug, PartialEq)]
pub struct FlattenSpec;

impl KindSpec for FlattenSpec {
    const NAMES: &'static [&'static str] = &["flatten"];
    const TORCH: &'static [&'static str] = &["Flatten"];

    fn parse(name: &str, arg: Option<&Value>, at: &str) -> Result<Self, String> {
        no_options(arg, at, name)?;
        Ok(FlattenSpec)
    }

    fn to_value(&self) -> Value {
        json!("flatten")
    }

    fn label(&self) -> String {
        "flatten".into()
    }

    fn from_torch(_class: &str, m: &Value, at: &str) -> Result<Self, String> {
        require(m, "start_dim", Value::from(1), at, "only Flatten() from dim 1 (one sample's features) is supported")?;
        require(m, "end_dim", Value::from(-1), at, "only Flatten() to the last dim is supported")?;
        Ok(FlattenSpec)
    }

    fn resolve(&self, input: Shape, _at: &str, _prefix: &str, _tensors: &mut usize) -> Result<(AnyLayer, Shape), String> {
        Ok((AnyLayer::Flatten(Flatten), Shape::Flat(input.size())))
    }
}
